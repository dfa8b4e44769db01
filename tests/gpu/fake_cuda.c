/* SPDX-License-Identifier: MIT */
/*
 * fake_cuda.c - a stand-in libcuda.so.1 for the loader's error paths (no
 * GPU needed).  Built twice: with FAKE_NO_PROC it exports no
 * cuGetProcAddress at all; otherwise cuGetProcAddress_v2 resolves every
 * name, except the one in $FAKE_CUDA_MISSING, and cuInit reports
 * CUDA_ERROR_NO_DEVICE, like a driver on a machine without a GPU.  With
 * FAKE_CUDA_NOVERSION=1 cuDriverGetVersion fails.  fake_cuda_asked(name)
 * says how often cuGetProcAddress was asked for a name (a test dlopen()s
 * this library itself to keep it loaded after the loader gives up).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#define FAKE_API __attribute__((visibility("default")))

#ifdef FAKE_NO_PROC
FAKE_API int fake_cuda_is_not_a_driver(void)
{
	return 1;
}
#else
static CUresult fake_init(unsigned int flags)
{
	return CUDA_ERROR_NO_DEVICE;
}

static CUresult fake_version(int *v)
{
	const char *e = getenv("FAKE_CUDA_NOVERSION");

	if (e && *e == '1')
		return CUDA_ERROR_NOT_INITIALIZED;
	*v = 12080;
	return CUDA_SUCCESS;
}

static struct {
	char name[64];
	unsigned n;
} asked[128];

FAKE_API unsigned fake_cuda_asked(const char *sym)
{
	for (size_t i = 0; i < sizeof(asked) / sizeof(asked[0]) && asked[i].name[0]; i++)
		if (strcmp(asked[i].name, sym) == 0)
			return asked[i].n;
	return 0;
}

static void count(const char *sym)
{
	for (size_t i = 0; i < sizeof(asked) / sizeof(asked[0]); i++) {
		if (!asked[i].name[0])
			snprintf(asked[i].name, sizeof(asked[i].name), "%s", sym);
		if (strcmp(asked[i].name, sym) == 0) {
			asked[i].n++;
			return;
		}
	}
}

static CUresult fake_errname(CUresult r, const char **s)
{
	*s = r == CUDA_ERROR_NO_DEVICE ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_FAKE";
	return CUDA_SUCCESS;
}

/* Every other entry point: never called, because cuInit fails first and
 * the loader then drops the whole table.  (Calling it through another
 * function type would be undefined; nothing does.) */
static CUresult fake_other(void)
{
	return CUDA_ERROR_NOT_SUPPORTED;
}

FAKE_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int ver, cuuint64_t flags,
				      CUdriverProcAddressQueryResult *st)
{
	const char *missing = getenv("FAKE_CUDA_MISSING");

	count(symbol);
	*pfn = NULL;
	if (missing && strcmp(missing, symbol) == 0) {
		if (st)
			*st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
		return CUDA_ERROR_NOT_FOUND;
	}
	if (strcmp(symbol, "cuInit") == 0)
		*pfn = (void *)fake_init;
	else if (strcmp(symbol, "cuDriverGetVersion") == 0)
		*pfn = (void *)fake_version;
	else if (strcmp(symbol, "cuGetErrorName") == 0 || strcmp(symbol, "cuGetErrorString") == 0)
		*pfn = (void *)fake_errname;
	else
		*pfn = (void *)fake_other;
	if (st)
		*st = CU_GET_PROC_ADDRESS_SUCCESS;
	return CUDA_SUCCESS;
}
#endif
