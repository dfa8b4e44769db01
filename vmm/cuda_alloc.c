/* SPDX-License-Identifier: MIT */
/*
 * cuda_alloc.c - allocator entry points for trainers: exportable CUDA VMM
 * memory with PyTorch CUDAPluggableAllocator signatures.
 *
 * Two ways for a PyTorch trainer to get weights wex can export:
 *
 *  1. Zero code: start the trainer with
 *         PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
 *     (PyTorch >= 2.5; also set the newer PYTORCH_ALLOC_CONF, which alone
 *     is ignored for expandable_segments by torch 2.9.1, pytorch#183387).
 *     Every caching-allocator segment is then created
 *     by cuMemCreate with a POSIX fd (or fabric) handle type, so wex can
 *     export any parameter in place: the cuda_vmm backend's wrap slot
 *     (cuMemRetainAllocationHandle + cuMemExportToShareableHandle).  A
 *     tensor may span several 2 MiB / 20 MiB chunks: enumerate them with
 *     wex__cuda_vmm_chunks, export each, and the consumer maps them back to
 *     back with wex__cuda_vmm_import_chunks.  Caveat: it affects every
 *     allocation of the process.
 *
 *  2. A memory pool for the weights only (PyTorch >= 2.6 recommended):
 *         alloc = torch.cuda.memory.CUDAPluggableAllocator(
 *                     "libwex.so", "wex_cuda_alloc", "wex_cuda_free")
 *         pool = torch.cuda.MemPool(alloc.allocator())
 *         with torch.cuda.use_mem_pool(pool):
 *             model = build_model()   # parameters land in wex memory
 *     Each segment the pool asks for is one exportable allocation here;
 *     wex__cuda_alloc_lookup finds it again for registration.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

#include "wex.h"
#include "src/log.h"
#include "vmm/cudawrap.h"
#include "vmm/cuda_backend.h"

struct alloc_entry {
	struct alloc_entry *next;
	struct wex_mem_seg seg;
};

static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static struct alloc_entry *alloc_list;

WEX_API int wex_cuda_malloc(size_t size, int device, void **ptr)
{
	struct wex_mem_thread_state saved;
	struct alloc_entry *e;
	int ret;

	if (!ptr || size == 0 || size > (size_t)SSIZE_MAX)
		return -EINVAL;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	/* Fresh memory needs no ordering against a stream.  The caller's
	 * thread stays on its own device. */
	wex_mem_thread_save(&saved);
	ret = wex_mem_cuda_vmm_ops.alloc((uint64_t)size, device, &e->seg);
	wex_mem_thread_restore(&saved);
	if (ret == -ENOMEM) {
		/* (PyTorch frees its cache and asks again: see vmm_alloc.) */
		wex_info("cuda", "wex_cuda_alloc(%zu bytes, device %d): out of GPU memory", size,
			 device);
		free(e);
		return ret;
	}
	if (ret) {
		wex_error("cuda", "wex_cuda_alloc(%zu bytes, device %d): %s%s%s", size, device,
			  wex_strerror(ret), ret == -WEX_ENOCUDA ? ": " : "",
			  ret == -WEX_ENOCUDA ? wex__cuda_why() : "");
		free(e);
		return ret;
	}
	pthread_mutex_lock(&alloc_lock);
	e->next = alloc_list;
	alloc_list = e;
	pthread_mutex_unlock(&alloc_lock);
	*ptr = e->seg.ptr;
	return 0;
}

WEX_API void *wex_cuda_alloc(ssize_t size, int device, void *stream)
{
	void *p = NULL;

	if (size <= 0 || wex_cuda_malloc((size_t)size, device, &p) < 0)
		return NULL;
	return p;
}

WEX_API void wex_cuda_free(void *ptr, ssize_t size, int device, void *stream)
{
	struct wex_mem_thread_state saved;
	struct alloc_entry *e = NULL;
	int ret;

	if (!ptr)
		return;
	pthread_mutex_lock(&alloc_lock);
	for (struct alloc_entry **pp = &alloc_list; *pp; pp = &(*pp)->next)
		if ((*pp)->seg.ptr == ptr) {
			e = *pp;
			*pp = e->next;
			break;
		}
	pthread_mutex_unlock(&alloc_lock);
	if (!e) {
		wex_error("cuda", "wex_cuda_free: pointer not from wex_cuda_alloc");
		return;
	}
	/* Unmap does not wait for the stream's kernels (PyTorch syncs too). */
	wex_mem_thread_save(&saved);
	if (wex__cuda_use_device(device) == 0)
		wex__cuda_stream_sync(stream);
	ret = e->seg.ops->release(&e->seg);
	wex_mem_thread_restore(&saved);
	if (ret)
		wex_error("cuda", "wex_cuda_free: %s", wex_strerror(ret));
	free(e);
}

int wex__cuda_alloc_lookup(const void *ptr, uint64_t *base, uint64_t *size,
			   struct wex_mem_desc *desc, int *fd)
{
	uint64_t a = (uint64_t)(uintptr_t)ptr;
	int ret = -ENOENT;

	pthread_mutex_lock(&alloc_lock);
	for (struct alloc_entry *e = alloc_list; e; e = e->next) {
		uint64_t b = (uint64_t)(uintptr_t)e->seg.ptr;

		if (a < b || a >= b + e->seg.desc.alloc_size)
			continue;
		if (fd) {
			int d = fcntl(e->seg.fd, F_DUPFD_CLOEXEC, 0);

			if (d < 0) {
				ret = -errno;
				break;
			}
			*fd = d;
		}
		*base = b;
		*size = e->seg.desc.alloc_size;
		if (desc)
			*desc = e->seg.desc;
		ret = 0;
		break;
	}
	pthread_mutex_unlock(&alloc_lock);
	return ret;
}
