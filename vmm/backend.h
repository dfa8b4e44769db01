/* SPDX-License-Identifier: MIT */
/*
 * vmm/backend.h - memory backends behind one table of operations.
 *
 * A backend knows how to allocate exportable memory of one kind, how a
 * consumer imports and maps it, how to put it under a consumer's existing
 * addresses (same-address remap) and how to copy between mappings.  The
 * layers above see only this table; every slot is filled (an unsupported
 * operation returns -EOPNOTSUPP).  This header includes nothing from src/.
 */
#ifndef WEX_VMM_BACKEND_H
#define WEX_VMM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#define WEX_UUID_LEN 48    /* "GPU-" + 36-character UUID + NUL, with room */
#define WEX_HANDLE_MAX 64  /* cudaIpcMemHandle_t is 64 bytes; fabric 64 */

/* Segment kinds: the same numbers as enum wex_seg_kind in wex.h. */
#define WEX_MEM_HOST 1
#define WEX_MEM_CUDA_VMM 2
#define WEX_MEM_CUDA_IPC 3
#define WEX_MEM_KINDS 4

/* What crosses the process boundary for one segment (besides its fd). */
struct wex_mem_desc {
	int kind;
	uint64_t size;                  /* bytes usable from `base` */
	char device[WEX_UUID_LEN];      /* device UUID ("" for host memory) */
	unsigned char handle[WEX_HANDLE_MAX]; /* opaque handle (cuda_ipc, fabric) */
	uint32_t handle_len;
	uint64_t handle_offset;         /* cuda_ipc: offset from allocation base */
	uint64_t alloc_size;            /* size of the underlying allocation */
};

/* One segment as seen by one process (the exporter or an importer). */
struct wex_mem_seg {
	const struct wex_mem_ops *ops;
	struct wex_mem_desc desc;
	void *ptr;    /* host address, or device address cast to a pointer */
	int fd;       /* exported or imported fd owned by this struct, or -1 */
	int owner;    /* 1: this process allocated it (exporter) */
	int pinned;   /* host: 1 + the ordinal that pinned it (wex_mem_host_pin) */
	int rw;       /* import mapped read-write: the driver refused read-only */
	void *priv;   /* backend state */
};

/* A region a consumer reserved for same-address remap. */
struct wex_mem_region {
	const struct wex_mem_ops *ops;
	void *addr;
	uint64_t size;
	int device;
	int fixed;    /* 1 while a producer's memory is mapped there */
	/* 1 after a failure the backend could not undo left the region
	 * without writable memory of its own (its addresses held with no
	 * access, nothing mapped, or pieces of a producer's memory it could
	 * not unmap): writes there fault.  unmap_fixed tries again to give it
	 * fresh memory; map_fixed may still map a producer's memory there.
	 * 2 (host): not even the addresses could be held: unreserve leaves
	 * them, and the region maps there again only where nothing else was
	 * mapped meanwhile. */
	int lost;
	int rw;        /* while fixed: the producer's memory is mapped there
			* read-write (the driver refused read-only) */
	uint64_t lead; /* reserved bytes below addr (see the reserve slot) */
	void *priv;
};

/*
 * One resolved copy: `len` contiguous bytes, repeated over up to three outer
 * dimensions (count[i] times, strides in bytes).  Addresses are absolute in
 * this process (device addresses for the CUDA backends).
 */
struct wex_copy_op {
	uint64_t src;
	uint64_t dst;
	uint64_t len;
	uint32_t nouter;
	uint64_t count[3];
	int64_t src_stride[3];
	int64_t dst_stride[3];
};

struct wex_mem_ops {
	const char *name;
	int kind;
	/* 0 when usable here; else a negative code and a reason in `why`. */
	int (*probe)(char *why, size_t len);
	/* Exporter: allocate `size` exportable bytes on `device`; fills seg
	 * (ptr, fd, desc).  Blocks briefly. */
	int (*alloc)(uint64_t size, int device, struct wex_mem_seg *seg);
	/* Exporter: wrap memory the caller allocated (host: an fd; CUDA: an
	 * address of exportable memory).  Fills seg. */
	int (*wrap)(void *ptr, uint64_t size, int fd, struct wex_mem_seg *seg);
	/* Importer: map the segment described by desc; takes ownership of fd
	 * (closed on error too).  Fills seg.  `access_dev`: -1, or the ordinal
	 * (in this process) of a device that must reach the mapping besides
	 * the one owning the memory (the consumer's GPU, when it is another
	 * one): granted through peer access, or an error naming both devices
	 * when there is none.  Host memory ignores it.  Consumers' mappings
	 * are read-only where the memory kind allows it. */
	int (*import)(const struct wex_mem_desc *desc, int fd, int access_dev,
		      struct wex_mem_seg *seg);
	/* Either side: unmap/free, close fds, release handles.  Never fails
	 * silently: returns the first error but frees everything it can. */
	int (*release)(struct wex_mem_seg *seg);
	/* Consumer: reserve `size` bytes of same-address-capable memory at
	 * r->addr, for a producer segment that starts `lead` bytes into its
	 * first allocation (desc.handle_offset): the reservation also covers
	 * those bytes below addr, so that map_fixed maps every allocation
	 * from its start (cuMemMap's offset "must be zero").  Fills r. */
	int (*reserve)(uint64_t size, uint64_t lead, int device, struct wex_mem_region *r);
	/* Consumer: put `seg`'s bytes [off, off+r->size) under r->addr, where
	 * off is the segment's desc.handle_offset; an off other than the
	 * r->lead the region was reserved with is refused (-EINVAL) before
	 * anything changes.  The producer's memory is mapped read-only where
	 * the kind allows it.  Returns 0 (fixed = 1); -WEX_EDIRTY when the
	 * call failed after the region's contents were lost (it was showing
	 * another segment, or a swap failed half-way): the region holds its
	 * own memory again with undefined bytes (fixed = 0), so the caller
	 * must treat the weights there as dirty; any other negative errno:
	 * the region is as it was (fixed and bytes unchanged).  Success
	 * clears lost.  Blocks. */
	int (*map_fixed)(struct wex_mem_region *r, struct wex_mem_seg *seg, uint64_t off);
	/* Consumer: give r its own memory back, holding the bytes it showed.
	 * Returns 0 (fixed = 0); -WEX_EDIRTY when the bytes were lost on the
	 * way (own memory, fixed = 0, contents undefined: dirty); any other
	 * negative errno: still showing the producer's memory (fixed = 1).
	 * A region that is neither fixed nor lost: 0, nothing to do.  A lost
	 * one gets fresh memory: -WEX_EDIRTY, lost = 0; or the error while
	 * it still cannot (lost stays 1).  To drop a region without keeping
	 * its bytes (closing), call unreserve directly: it frees a fixed
	 * region without copying.  In both slots, where the driver refuses
	 * even fresh memory after a failure, the call returns -WEX_EDIRTY
	 * with lost = 1 (see lost above).  Blocks. */
	int (*unmap_fixed)(struct wex_mem_region *r);
	/* Consumer: free the region, fixed or not (a fixed one is unmapped
	 * without copying its bytes back: nothing is allocated). */
	int (*unreserve)(struct wex_mem_region *r);
	/* Run copies; returns once they completed.  `threads` is a hint. */
	int (*copy)(const struct wex_copy_op *ops, size_t n, int threads);
	/*
	 * Exporter: wrap [ptr, ptr+size) when it spans several allocations
	 * (PyTorch expandable segments map 2 MiB / 20 MiB chunks back to
	 * back): one seg per allocation, each wrapping the part of the range
	 * inside it, in address order; segs[0].desc.handle_offset says where
	 * the range starts in the first.  Fills up to `max` segs and the count
	 * needed in *n; -ENOSPC (nothing kept) when max is too small.  Blocks
	 * briefly.  -EOPNOTSUPP for kinds whose memory is one allocation.
	 */
	int (*wrap_chunks)(void *ptr, uint64_t size, struct wex_mem_seg *segs, size_t max,
			   size_t *n);
	/* Importer: map n segments that wrap_chunks made (descs[i], fds[i])
	 * back to back as one seg; takes ownership of every fd (closed on error
	 * too).  seg->ptr is where the exporter's range starts. */
	int (*import_chunks)(const struct wex_mem_desc *descs, const int *fds, size_t n,
			     int access_dev, struct wex_mem_seg *seg);
	/* Exporter: returns once every piece of work queued on the device
	 * holding seg (any stream of its context) has completed, so that a
	 * publish is visible only after the writes it announces.  Host memory:
	 * nothing to wait for.  Blocks. */
	int (*sync_device)(const struct wex_mem_seg *seg);
	/* Exporter, optional (NULL: the fd is the memory, keep it): a fresh
	 * fd sharing a wrapped segment's memory, as wrap made it.  Lets a
	 * producer close the fd once wexd holds a copy and make another only
	 * when a new wexd needs one: a model over thousands of allocations
	 * (expandable segments) holds no fd per allocation.  The calling
	 * thread's current device is kept.  Blocks briefly. */
	int (*export_fd)(const struct wex_mem_seg *seg, int *fd);
	/* Exporter, optional (NULL: the memory cannot change under the
	 * segment): 0 when the memory wrap found at seg->ptr is still there;
	 * -ESTALE when the owner freed it and allocated other memory at that
	 * address, or left nothing mapped (importers go on reading the old
	 * memory: VMM, wex still holds it; legacy IPC, their handles name it);
	 * else the driver's error.  Brief. */
	int (*same)(const struct wex_mem_seg *seg);
	/*
	 * A caller's own host buffer [p, p+size) (verification's gather
	 * buffers) page-locked for DMA by every context of this kind's
	 * devices, with device `device` current, so that the copy slot moves
	 * bytes between it and this kind's memory at link speed rather than
	 * through the driver's pageable bounce buffers; `readonly`: the
	 * mapping is PROT_READ.  0 when pinned; -EOPNOTSUPP where the kind
	 * has no such thing (host memory); else the driver's error (logged).
	 * p and size are best page-aligned (no other buffer may share a
	 * pinned page).  Blocks: every page is pinned.
	 */
	int (*host_pin)(void *p, uint64_t size, int device, int readonly);
	/* Undoes host_pin (the same p and device) after waiting for work
	 * queued in this kind's contexts, which may still use the pages;
	 * call before the buffer is freed.  Blocks. */
	int (*host_unpin)(void *p, int device);
};

/* The backend for a kind, or NULL when this build lacks it. */
const struct wex_mem_ops *wex_mem_backend(int kind);

/* The ordinal in this process of the device a desc names (by UUID; 0 for
 * host memory); -ENODEV when it is not visible here. */
int wex_mem_device_of(const struct wex_mem_desc *desc, int *dev);

/* The calling thread's device binding (its current CUDA context), saved
 * when a public call that may reach a GPU backend starts and given back
 * when it ends, so that wex never moves an engine's thread to another
 * device.  In between the thread's stream capture mode is RELAXED, so
 * that wex's allocations and host registrations neither fail nor
 * invalidate a CUDA graph another thread of the engine is capturing (NCCL
 * does the same); the end gives the thread its mode back.  Synchronising a
 * context while one of its streams captures stays invalid in any mode (the
 * programming guide's stream-capture rules): calls that synchronise
 * (publish, a sync's lease release, same-address remap, freeing wex
 * memory) must not overlap a capture in the same context.  Never fail;
 * no-ops without a CUDA backend. */
struct wex_mem_thread_state {
	void *ctx;
	int valid;
	int mode;    /* the thread's CUstreamCaptureMode before */
	int relaxed; /* 1: save set RELAXED, restore gives `mode` back */
};
void wex_mem_thread_save(struct wex_mem_thread_state *s);
void wex_mem_thread_restore(const struct wex_mem_thread_state *s);

/* Returns once all GPU work this process queued on the devices wex uses
 * (every stream of their primary contexts, the engine's kernels included)
 * has completed: before a lease whose memory the engine may still be
 * reading ends, and before a copy overwrites the engine's weights.  0 at
 * once where wex never loaded a CUDA driver.  Blocks. */
int wex_mem_settle(void);

/* 1 where a CUDA driver is loaded in this process (GPU work may exist:
 * wex_mem_settle has something to wait for), else 0. */
int wex_mem_gpu_in_process(void);

/* The CUDA ordinal of the device holding addr when it is GPU memory per a
 * CUDA driver already loaded in this process (nothing is loaded to ask);
 * -1 otherwise, and always -1 in a build without the CUDA backend. */
int wex_mem_ptr_on_gpu(uint64_t addr);

/*
 * Whether [addr, addr + len) lies partly where the CUDA driver knows a
 * virtual address range with nothing mapped: memory an engine released
 * while keeping its addresses (vLLM's sleep mode, torch_memory_saver's
 * pause: cuMemUnmap under a kept cuMemAddressReserve).  A copy there
 * faults: on the GPU a sticky error (the process's CUDA context is lost),
 * and where the driver no longer counts the address as device memory, on
 * the CPU.  1 with *at the first such address found; 0 otherwise (mapped,
 * host memory, memory the driver does not know, no driver loaded in this
 * process, or a build without the CUDA backend: nothing is loaded to
 * ask).  `known` (may be NULL; zeroed before the first call, then
 * passed to calls in address order) caches whether a driver is loaded and
 * the mapping found mapped that holds the end of the last range walked: a
 * range inside it costs no query, one starting in it is walked from the
 * next mapping on, each other mapping costs two queries (MAPPED and
 * cuMemGetAddressRange; five where MAPPED has no answer: GPU memory;
 * memory the driver does not know costs two to four); `unknown`, set by
 * each call that asks the driver (not by one answered from `known`), says
 * whether the driver knew the range's first address (host memory: not).
 * A MAPPED of 0 counts only where RANGE_START_ADDR and RANGE_SIZE answer
 * with a range holding the address.  -EINVAL when addr + len overflows.
 * Asks the driver (pointer attributes, cuMemGetAddressRange); may make
 * device 0's primary context current in a thread with none (wrap it in
 * wex_mem_thread_save/restore).
 */
struct wex_mem_span {
	uint64_t lo, hi;
	int asked;   /* 1: a driver is loaded to ask, -1: none, 0: not yet known */
	int unknown; /* out: the driver did not know the range's first address */
};
int wex_mem_ptr_released(uint64_t addr, uint64_t len, uint64_t *at, struct wex_mem_span *known);

/* The UUID text of CUDA device `dev` ("GPU-..."; the name segments carry
 * in desc.device) into out (at least 37 bytes); -ENODEV in a build without
 * the CUDA backend, the driver's error otherwise. */
int wex_mem_device_uuid(int dev, char *out, size_t len);

/*
 * Host staging: page-locks a host segment's mapping (an exporter's, or an
 * importer's read-only one) for DMA by every GPU context, with device
 * `device` current, so that copies between it and GPU memory run at link
 * speed; the host backend's release slot unpins it before unmapping.
 * 0 when pinned (or already); -EOPNOTSUPP when the device cannot pin a
 * read-only mapping or this build has no CUDA backend; the driver's error
 * otherwise (logged).  Blocks: the driver pins every page.
 */
int wex_mem_host_pin(struct wex_mem_seg *seg, int device);
/* Undoes wex_mem_host_pin (no-op on an unpinned seg). */
int wex_mem_host_unpin(struct wex_mem_seg *seg);

/* The host backend (always present). */
extern const struct wex_mem_ops wex_mem_host_ops;

/* Host copy executor: runs ops with memcpy over `threads` threads, large
 * ranges split evenly.  Blocks until done. */
int wex_mem_host_copy(const struct wex_copy_op *ops, size_t n, int threads);

/* Puts op's outer dims innermost first (count[0] the one with the smallest
 * destination stride: the one executors walk fastest), drops dims of one
 * index, and folds rows that follow each other in both source and
 * destination into one longer row, so that each row is as long as it can
 * be.  The bytes copied are the same. */
void wex_mem_fold_op(struct wex_copy_op *op);

/*
 * New private memory that is about to be written whole (a consumer's
 * reserved weights, the copy a same-address region gets back, a planner
 * call's ops).  On the dev VM, writing 208 MB of new memory took 0.95 s in
 * 4 KiB pages, 0.38 s prefaulted and 0.02 s in transparent huge pages.
 *
 * wex_mem_map_anon: `size` bytes (a page multiple) of private anonymous
 * memory (mmap `flags` added), at a 2 MiB boundary when 2 MiB or more and
 * then asked for in transparent huge pages, so that huge pages back all of
 * it and stay whole when it is moved to another such boundary.  The ask is
 * a hint: without THP it is ordinary pages.  MAP_FAILED (errno set) when
 * out of memory.
 *
 * wex_mem_populate: faults in the pages wholly inside [p, p+size), for
 * writing (write = 1) or reading, with one call.  A hint too: -1 where the
 * kernel refuses it (before 5.14), and the pages then fault one by one.
 */
void *wex_mem_map_anon(uint64_t size, int flags);
int wex_mem_populate(void *p, uint64_t size, int write);

/*
 * Why the calling thread's last copy slot call failed, where the backend
 * can say: the driver call and its error ("cuMemcpyAsync:
 * CUDA_ERROR_ILLEGAL_ADDRESS"; empty: none known), and the ops
 * [op_lo, op_hi] of that call's `ops` it was copying (-1: not known, as for
 * a fault the wait reports).  The caller clears it before each copy slot
 * call (client.c run_copy): a backend that says nothing leaves it so.
 */
struct wex_copy_fail {
	char call[128];
	long op_lo, op_hi;
};
extern __thread struct wex_copy_fail wex__copy_fail;

/* Shared stubs for unsupported slots. */
int wex_mem_enotsup_reserve(uint64_t size, uint64_t lead, int device, struct wex_mem_region *r);
int wex_mem_enotsup_wrap_chunks(void *ptr, uint64_t size, struct wex_mem_seg *segs, size_t max,
				size_t *n);
int wex_mem_enotsup_import_chunks(const struct wex_mem_desc *descs, const int *fds, size_t n,
				  int access_dev, struct wex_mem_seg *seg);
int wex_mem_nop_sync_device(const struct wex_mem_seg *seg);
int wex_mem_enotsup_host_pin(void *p, uint64_t size, int device, int readonly);
int wex_mem_enotsup_host_unpin(void *p, int device);

#endif
