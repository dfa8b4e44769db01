/* SPDX-License-Identifier: MIT */
/* util.c - error strings, dtypes, tensor sizes (public helpers). */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "wex.h"

static const char *wex_err_str[] = {
	[WEX_EPROTO_VERSION - WEX_ERRNO_BASE] = "peer speaks another wex protocol version",
	[WEX_ENOCUDA - WEX_ERRNO_BASE] = "no CUDA driver or device",
	[WEX_ELAYOUT - WEX_ERRNO_BASE] = "layouts differ or cannot exist",
	[WEX_EDIRTY - WEX_ERRNO_BASE] = "weights are half-written (interrupted copy): sync again before serving",
	[WEX_ENOPUBLISHED - WEX_ERRNO_BASE] = "no producer has registered the model yet",
	[WEX_EDAEMON - WEX_ERRNO_BASE] = "wexd closed the connection",
	[WEX_ENOMODEL - WEX_ERRNO_BASE] = "unknown model",
	[WEX_EREMOTE - WEX_ERRNO_BASE] = "wexd reported an unknown error",
	[WEX_EVERIFY - WEX_ERRNO_BASE] = "weights differ from the published version (verify): sync again before serving",
};

WEX_API const char *wex_strerror(int err)
{
	if (err < 0 && err != INT_MIN) /* (INT_MIN has no negation) */
		err = -err;
	if (err >= WEX_ERRNO_BASE && err < WEX_ERRNO_END)
		return wex_err_str[err - WEX_ERRNO_BASE];
	if (err == 0)
		return "success";
	return strerror(err);
}

WEX_API void wex_free(void *p)
{
	free(p);
}

static const struct {
	const char *name;
	size_t size;
} dtypes[WEX_DT_COUNT] = {
	[WEX_DT_BOOL] = { "BOOL", 1 }, [WEX_DT_U8] = { "U8", 1 },     [WEX_DT_I8] = { "I8", 1 },
	[WEX_DT_I16] = { "I16", 2 },   [WEX_DT_U16] = { "U16", 2 },   [WEX_DT_F16] = { "F16", 2 },
	[WEX_DT_BF16] = { "BF16", 2 }, [WEX_DT_I32] = { "I32", 4 },   [WEX_DT_U32] = { "U32", 4 },
	[WEX_DT_F32] = { "F32", 4 },   [WEX_DT_I64] = { "I64", 8 },   [WEX_DT_U64] = { "U64", 8 },
	[WEX_DT_F64] = { "F64", 8 },   [WEX_DT_F8_E4M3] = { "F8_E4M3", 1 },
	[WEX_DT_F8_E5M2] = { "F8_E5M2", 1 },  [WEX_DT_F8_E8M0] = { "F8_E8M0", 1 },
};

WEX_API size_t wex_dtype_size(int dtype)
{
	if (dtype <= WEX_DT_INVALID || dtype >= WEX_DT_COUNT)
		return 0;
	return dtypes[dtype].size;
}

WEX_API const char *wex_dtype_name(int dtype)
{
	if (dtype <= WEX_DT_INVALID || dtype >= WEX_DT_COUNT)
		return NULL;
	return dtypes[dtype].name;
}

WEX_API int wex_dtype_from_name(const char *name)
{
	for (int i = 1; i < WEX_DT_COUNT; i++)
		if (name && !strcmp(name, dtypes[i].name))
			return i;
	return WEX_DT_INVALID;
}

WEX_API uint64_t wex_tensor_nbytes(const struct wex_tensor *t)
{
	uint64_t n;
	int over = 0;

	if (!t)
		return 0;
	n = wex_dtype_size(t->dtype);
	/* Saturates (a box no memory holds) rather than wrap to a small
	 * size a caller would allocate; an empty box is 0 whatever else. */
	for (uint32_t i = 0; i < t->ndim && i < WEX_MAX_DIMS; i++) {
		if (t->extent[i] == 0)
			return 0;
		if (n > UINT64_MAX / t->extent[i])
			over = 1;
		else
			n *= t->extent[i];
	}
	return over ? UINT64_MAX : n;
}
