/* SPDX-License-Identifier: MIT */
/* backend.c - the table of memory backends by kind. */
#include <errno.h>
#include <stddef.h>

#include "vmm/backend.h"

#ifdef WEX_HAVE_CUDA_BACKEND
/* Present whenever cuda.h was found at build time; whether a driver and a
 * device exist is only known at run time: each table's probe slot says
 * (-WEX_ENOCUDA and the reason), and every other slot fails the same way. */
#include "vmm/cuda_backend.h"
#endif

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

int wex_mem_enotsup_reserve(uint64_t size, int device, struct wex_mem_region *r)
{
	return -EOPNOTSUPP;
}
