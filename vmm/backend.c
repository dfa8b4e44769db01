/* SPDX-License-Identifier: MIT */
/* backend.c - the table of memory backends by kind. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vmm/backend.h"

#ifdef WEX_HAVE_CUDA_BACKEND
/* Present whenever cuda.h was found at build time; whether a driver and a
 * device exist is only known at run time: each table's probe slot says
 * (-WEX_ENOCUDA and the reason), and every other slot fails the same way. */
#include "vmm/cuda_backend.h"
#include "vmm/cudawrap.h"
#endif

__thread struct wex_copy_fail wex__copy_fail = { "", -1, -1 };

const struct wex_mem_ops *wex_mem_backend(int kind)
{
	switch (kind) {
	case WEX_MEM_HOST:
		return &wex_mem_host_ops;
#ifdef WEX_HAVE_CUDA_BACKEND
	case WEX_MEM_CUDA_VMM:
		return &wex_mem_cuda_vmm_ops;
	case WEX_MEM_CUDA_IPC:
		return &wex_mem_cuda_ipc_ops;
#endif
	default:
		return NULL;
	}
}

int wex_mem_enotsup_reserve(uint64_t size, uint64_t lead, int device, struct wex_mem_region *r)
{
	return -EOPNOTSUPP;
}

int wex_mem_enotsup_wrap_chunks(void *ptr, uint64_t size, struct wex_mem_seg *segs, size_t max,
				size_t *n)
{
	return -EOPNOTSUPP;
}

int wex_mem_enotsup_import_chunks(const struct wex_mem_desc *descs, const int *fds, size_t n,
				  int access_dev, struct wex_mem_seg *seg)
{
	for (size_t i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	return -EOPNOTSUPP;
}

int wex_mem_nop_sync_device(const struct wex_mem_seg *seg)
{
	return 0;
}

int wex_mem_enotsup_host_pin(void *p, uint64_t size, int device, int readonly)
{
	return -EOPNOTSUPP;
}

int wex_mem_enotsup_host_unpin(void *p, int device)
{
	return -EOPNOTSUPP;
}

int wex_mem_device_of(const struct wex_mem_desc *desc, int *dev)
{
	if (desc->kind == WEX_MEM_HOST) {
		*dev = 0;
		return 0;
	}
#ifdef WEX_HAVE_CUDA_BACKEND
	return wex__cuda_device_by_uuid(desc->device, dev);
#else
	return -ENODEV; /* no CUDA backend in this build */
#endif
}

int wex_mem_settle(void)
{
#ifdef WEX_HAVE_CUDA_BACKEND
	return wex__cuda_settle();
#else
	return 0;
#endif
}

int wex_mem_gpu_in_process(void)
{
#ifdef WEX_HAVE_CUDA_BACKEND
	return wex__cuda_in_process();
#else
	return 0;
#endif
}

int wex_mem_ptr_on_gpu(uint64_t addr)
{
#ifdef WEX_HAVE_CUDA_BACKEND
	return wex__cuda_ptr_on_gpu(addr);
#else
	(void)addr;
	return -1;
#endif
}

int wex_mem_ptr_released(uint64_t addr, uint64_t len, uint64_t *at, struct wex_mem_span *known)
{
#ifdef WEX_HAVE_CUDA_BACKEND
	return wex__cuda_ptr_released(addr, len, at, known);
#else
	(void)addr;
	(void)len;
	(void)at;
	(void)known;
	return 0;
#endif
}

int wex_mem_device_uuid(int dev, char *out, size_t len)
{
#ifdef WEX_HAVE_CUDA_BACKEND
	return wex__cuda_device_uuid(dev, out, len);
#else
	(void)dev;
	(void)out;
	(void)len;
	return -ENODEV;
#endif
}

int wex_mem_host_pin(struct wex_mem_seg *seg, int device)
{
	int ret;

	if (seg->desc.kind != WEX_MEM_HOST || !seg->ptr || device < 0)
		return -EINVAL;
	if (seg->pinned)
		return 0;
#ifdef WEX_HAVE_CUDA_BACKEND
	/* An importer's mapping is PROT_READ (host_import). */
	ret = wex__cuda_host_pin(seg->ptr, seg->desc.size, device, seg->owner == 2);

	if (ret == 0)
		seg->pinned = device + 1;
	return ret;
#else
	(void)ret;
	return -EOPNOTSUPP;
#endif
}

int wex_mem_host_unpin(struct wex_mem_seg *seg)
{
	int ret = 0;

	if (!seg->pinned)
		return 0;
#ifdef WEX_HAVE_CUDA_BACKEND
	ret = wex__cuda_host_unpin(seg->ptr, seg->pinned - 1);
#endif
	seg->pinned = 0;
	return ret;
}

#ifndef WEX_HAVE_CUDA_BACKEND
/* No CUDA backend: no device binding to keep (vmm/cudawrap.c otherwise). */
void wex_mem_thread_save(struct wex_mem_thread_state *s)
{
	s->ctx = NULL;
	s->valid = 0;
	s->relaxed = 0;
}

void wex_mem_thread_restore(const struct wex_mem_thread_state *s)
{
	(void)s;
}
#endif

#define HUGE_PAGE (UINT64_C(2) << 20)

void *wex_mem_map_anon(uint64_t size, int flags)
{
	char *m, *a;

	if (size < HUGE_PAGE)
		return mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | flags,
			    -1, 0);
	/* No address space is that large; the sums below would wrap, and
	 * the trim would unmap what the small mapping lies next to. */
	if (size > SIZE_MAX - HUGE_PAGE) {
		errno = ENOMEM;
		return MAP_FAILED;
	}
	/* Over-allocate by one huge page, then unmap the unaligned ends. */
	m = mmap(NULL, size + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | flags,
		 -1, 0);
	if (m == MAP_FAILED)
		return m;
	a = (char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
	if (a > m)
		munmap(m, (size_t)(a - m));
	munmap(a + size, (size_t)(m + size + HUGE_PAGE - (a + size)));
#ifdef MADV_HUGEPAGE
	(void)madvise(a, size, MADV_HUGEPAGE);
#endif
	return a;
}

int wex_mem_populate(void *p, uint64_t size, int write)
{
#if defined(MADV_POPULATE_WRITE) && defined(MADV_POPULATE_READ)
	long pg = sysconf(_SC_PAGESIZE);
	uintptr_t a = ((uintptr_t)p + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
	uintptr_t b = ((uintptr_t)p + size) & ~(uintptr_t)(pg - 1);

	if (b <= a)
		return 0;
	return madvise((void *)a, b - a, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
#else
	(void)p;
	(void)size;
	(void)write;
	return -1;
#endif
}
