/* SPDX-License-Identifier: MIT */
/*
 * vmm/cuda_backend.h - the CUDA backends' internal interface for the rest of
 * wex (the client library) and for tests: the ops tables, chunk enumeration
 * of exportable VMM memory, multi-chunk import, the GPU copy executor,
 * ordering helpers, pinned host staging and the allocator lookup.
 *
 * Every function returns 0 or a negative errno; -WEX_ENOCUDA when the
 * driver or a device is missing (wex__cuda_why() says which).  Device
 * addresses are carried as uint64_t or void * in this process.
 */
#ifndef WEX_VMM_CUDA_BACKEND_H
#define WEX_VMM_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "vmm/backend.h"

extern const struct wex_mem_ops wex_mem_cuda_vmm_ops;
extern const struct wex_mem_ops wex_mem_cuda_ipc_ops;

/* ---------------------------------------------------------------------- */
/* cuda_vmm                                                               */

/* One physical allocation under a range of device addresses. */
struct wex__cuda_chunk {
	uint64_t base;   /* start of the allocation's mapping */
	uint64_t size;   /* its size */
	uint64_t offset; /* where the caller's range starts inside it (0 for all
			  * chunks but the first) */
};

/*
 * Enumerates the allocations (cuMemGetAddressRange) covering
 * [ptr, ptr+size): PyTorch expandable segments map 2 MiB / 20 MiB chunks
 * back to back, so one tensor may span several.  Writes up to `max`
 * chunks and the total needed in *n; -ENOSPC when max is too small (*n is
 * still set).  Does not block.
 */
int wex__cuda_vmm_chunks(void *ptr, uint64_t size, struct wex__cuda_chunk *out, size_t max,
			 size_t *n);

/*
 * Importer: maps `n` exported chunks (descs[i], fds[i]: one cuda_vmm
 * segment per chunk, as wrap produced them for consecutive chunks) back to
 * back into one new address range and fills one seg; seg->ptr points at
 * descs[0].handle_offset inside it.  Takes ownership of every fd (closed on
 * error too; -1 entries use the fabric handle in desc).  The mapping is
 * read-only (see wex__cuda_vmm_readonly) for the device holding the memory
 * and, when access_dev >= 0 is another one, for access_dev too, through
 * peer access (-EOPNOTSUPP, both devices named in the log, without it).
 * Release with seg->ops->release.  Blocks briefly (driver mapping calls).
 */
int wex__cuda_vmm_import_chunks(const struct wex_mem_desc *descs, const int *fds, size_t n,
				int access_dev, struct wex_mem_seg *seg);

/*
 * Whether consumers' mappings of producer memory (imports, and producer
 * memory under a same-address region) are read-only in this process: 1
 * the driver took CU_MEM_ACCESS_FLAGS_PROT_READ, 0 it refused it and they
 * are read-write (warned once: a stray write by the engine would change
 * the trainer's weights), -1 not tried yet.  Does not block.
 */
int wex__cuda_vmm_readonly(void);

/* ---------------------------------------------------------------------- */
/* GPU copy executor (the copy slot of both CUDA tables).                 */

/*
 * Runs `ops` on the dedicated stream of device `dev` (-1: the GPU
 * holding ops[0].dst, else the one holding ops[0].src, else the device
 * the driver names for ops[0].dst, else device 0) without waiting.  The
 * ops must be independent (none writes what another reads or writes):
 * they run in no particular order.  Use
 * wex__cuda_copy_sync() or the copy slot (which waits).
 */
int wex__cuda_copy_async(const struct wex_copy_op *ops, size_t n, int dev);
/* The copy slot of both tables: issue on the device owning ops[0].dst;
 * when that is host memory, each op on the GPU its destination lies on,
 * else on its source's (a layout may mix host pieces with GPU ones, which
 * only their own GPU may reach); then wait.  Blocks. */
int wex__cuda_copy(const struct wex_copy_op *ops, size_t n, int threads);
/* Whether copies go in cuMemcpyBatchAsync batches (the default, where the
 * driver has it) or one cuMemcpyAsync each, for this process from now on;
 * WEX_CUDA_BATCH=0 in the environment starts with them off.  Returns the
 * setting before (1: batches). */
int wex__cuda_copy_batch(int on);
/* Waits for everything the executor queued on device `dev`. */
int wex__cuda_copy_sync(int dev);

/* cuStreamSynchronize(stream) (a CUstream, NULL: the legacy default
 * stream) in the current context.  Blocks. */
int wex__cuda_stream_sync(void *stream);

/* The sync_device slot of both tables: cuCtxSynchronize in the primary
 * context of the device holding seg.  Blocks. */
int wex__cuda_sync_device(const struct wex_mem_seg *seg);

/*
 * Interprocess ordering.  The producer records an interprocess event on
 * `stream` (NULL: the legacy default stream), a stream of device `dev`'s
 * primary context, after its writes, and sends the 64 handle bytes; the
 * consumer makes its stream (NULL: the executor's) wait for it, without
 * blocking the CPU.  Both make their device's context current.  *ev
 * belongs to the producer (wex__cuda_event_destroy) and must outlive the
 * consumer's wait.  A wait in the process that recorded the event waits on
 * the event itself (the driver refuses to open one's own handle).
 */
int wex__cuda_event_record(int dev, void *stream, void **ev, unsigned char handle[64]);
int wex__cuda_event_wait(const unsigned char handle[64], void *stream, int dev);
int wex__cuda_event_destroy(void *ev);

/* ---------------------------------------------------------------------- */
/* Pinned host staging (split card without P2P).                          */

/*
 * Page-locks [p, p+size) for DMA from every context (cuMemHostRegister,
 * PORTABLE|DEVICEMAP) with device `device`'s context current, so that
 * copies between it and GPU memory run at link speed instead of through
 * the driver's pageable bounce buffers.  `readonly`: the mapping is
 * PROT_READ (a consumer's import), registered with READ_ONLY; -EOPNOTSUPP
 * (the reason logged) when the device cannot do that
 * (CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED is 0 and it does
 * not use the host's page tables).  Blocks (the driver pins every page).
 */
int wex__cuda_host_pin(void *p, uint64_t size, int device, int readonly);
/* Undoes wex__cuda_host_pin, after waiting for every context's queued work
 * (wex__cuda_settle: copies may still use the pages); call before the
 * range is unmapped.  Blocks. */
int wex__cuda_host_unpin(void *p, int device);

struct wex__cuda_staging {
	void *host;     /* mapping of the memfd in this process */
	uint64_t size;
	int fd;         /* memfd, owned */
	int device;
	int registered; /* cuMemHostRegister done */
};

/* Creates a memfd of `size` bytes, maps it shared and pins it
 * (PORTABLE|DEVICEMAP).  Share st->fd with other processes. */
int wex__cuda_staging_create(uint64_t size, int device, struct wex__cuda_staging *st);
/* Maps and pins another process's staging memfd; takes ownership of fd
 * (closed on error too). */
int wex__cuda_staging_import(int fd, uint64_t size, int device, struct wex__cuda_staging *st);
/* One device-to-host copy into [off, off+len) of the staging buffer;
 * blocks until done. */
int wex__cuda_staging_d2h(struct wex__cuda_staging *st, uint64_t off, uint64_t src, uint64_t len);
/* One host-to-device copy out of [off, off+len); blocks until done. */
int wex__cuda_staging_h2d(struct wex__cuda_staging *st, uint64_t off, uint64_t dst, uint64_t len);
/* Unpins, unmaps, closes; returns the first error. */
int wex__cuda_staging_destroy(struct wex__cuda_staging *st);

/* ---------------------------------------------------------------------- */
/* Memory from wex_cuda_alloc (PyTorch pluggable allocator).              */

/*
 * Finds the wex_cuda_alloc allocation holding `ptr`: *base, *size (the
 * allocation) and, when desc != NULL, its cuda_vmm description.  When
 * fd != NULL, *fd receives a new duplicate of its exported fd (the caller
 * closes it).  -ENOENT when ptr is not from wex_cuda_alloc.  Does not
 * block.
 */
int wex__cuda_alloc_lookup(const void *ptr, uint64_t *base, uint64_t *size,
			   struct wex_mem_desc *desc, int *fd);

#endif
