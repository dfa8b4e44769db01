/* SPDX-License-Identifier: MIT */
/*
 * verify.h - proves a consumer's weights bit-exact (DESIGN section 4,
 * guarantee 4): every byte a plan wrote is compared with the producer's
 * memory it came from, while the lease keeps the producer out.
 *
 * This compares the bytes themselves rather than checksums: in colocated
 * modes both sides are mapped in the consumer, so an exact comparison
 * costs one read of each side and cannot miss a difference.
 */
#ifndef WEX_VERIFY_H
#define WEX_VERIFY_H

#include <stddef.h>
#include <stdint.h>

struct wex_copy_op;
struct wex_mem_ops;

struct wex_verify_diff {
	size_t op;          /* the first op (in order) holding a difference */
	uint64_t dst_off;   /* its first different byte, from op.dst */
	uint64_t src_off;   /* ... the same byte, from op.src */
	uint64_t bytes;     /* different bytes over all ops */
	/* Set whatever the result: 1 when runs were gathered through buffers
	 * host_pin refused (pageable, slower: a fallback the sync reports). */
	int unpinned;
};

/*
 * Compares the `len`-byte rows of every op at dst with those at src (the
 * op's strides, as a copy would walk them).  With `gather` NULL both sides
 * are host memory this process reads, compared in place over `threads`
 * threads.  Otherwise (GPU memory on either side) `gather`'s copy slot
 * brings each side in GPU memory into a host buffer, 64 MiB at a time
 * (sides in host memory are copied there with memcpy, and ops with both
 * sides in host memory compared in place), and they are compared there:
 * two pairs of buffers pinned with gather's host_pin slot (pageable,
 * warned once per process, where it refuses), one run gathered on the
 * calling thread while up to `threads` threads compare the run before,
 * each a slice of its bytes (one thread per MiB at most).  Every
 * call to `gather` is made on the calling thread.  Returns 0 when every
 * byte is equal, 1 when some differ (*diff says where the first in op
 * order is, as address differences from the op's dst and src, and how
 * many differ), or a negative errno (the gather's error, which ends the
 * comparison; -ENOMEM; else host_unpin's).  Blocks.
 */
int wex__verify_ops(const struct wex_copy_op *ops, size_t n, const struct wex_mem_ops *gather,
		    int threads, struct wex_verify_diff *diff);

/* The size of a unit (and of each gather buffer), 64 MiB, for tests that
 * want ops cut at small sizes; returns the previous one.  Not for use
 * while a comparison runs. */
uint64_t wex__verify_unit(uint64_t bytes);

/* Tests: how the gather path tells GPU memory (>= 0: a device), in place
 * of wex_mem_ptr_on_gpu (NULL: that again), so that host memory can take
 * the path GPU memory takes. */
void wex__verify_where(int (*fn)(uint64_t addr));

/* Bytes the ops span (the sum of len times their rows). */
uint64_t wex__ops_bytes(const struct wex_copy_op *ops, size_t n);

#endif
