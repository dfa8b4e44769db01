/* SPDX-License-Identifier: MIT */
/*
 * cuda_stub.c - the public CUDA entry points of a build made without
 * cuda.h: wex.h declares them either way, so libwex.so defines them either
 * way; here they fail, saying why.
 */
#include <stddef.h>
#include <sys/types.h>

#include "wex.h"
#include "src/log.h"

WEX_API void *wex_cuda_alloc(ssize_t size, int device, void *stream)
{
	wex_error("cuda", "wex_cuda_alloc: this libwex was built without CUDA headers");
	return NULL;
}

WEX_API int wex_cuda_malloc(size_t size, int device, void **ptr)
{
	wex_error("cuda", "wex_cuda_alloc: this libwex was built without CUDA headers");
	return -WEX_ENOCUDA;
}

WEX_API void wex_cuda_free(void *ptr, ssize_t size, int device, void *stream)
{
	if (ptr)
		wex_error("cuda", "wex_cuda_free: this libwex was built without CUDA headers");
}
