/* SPDX-License-Identifier: MIT */
/*
 * abi_dump - prints what the Python binding's ctypes mirror must agree
 * with, as compiled against wex.h: each mirrored struct's size and
 * alignment, each field's offset and size (in declaration order), the
 * constants and enum values, and the dtype table.  Read by
 * abi_check_test.py (test py_abi).
 */
#include <stddef.h>
#include <stdio.h>

#include "wex.h"

#define STRUCT(T) printf("%s size %zu align %zu\n", #T, sizeof(struct T), _Alignof(struct T))
#define FIELD(T, F)                                                                   \
	printf("%s.%s off %zu size %zu\n", #T, #F, offsetof(struct T, F),             \
	       sizeof(((struct T *)0)->F))
#define CONST(name, v) printf("const %s %ld\n", name, (long)(v))

int main(void)
{
	STRUCT(wex_tensor);
	FIELD(wex_tensor, name);
	FIELD(wex_tensor, dtype);
	FIELD(wex_tensor, ndim);
	FIELD(wex_tensor, shape);
	FIELD(wex_tensor, start);
	FIELD(wex_tensor, extent);
	FIELD(wex_tensor, strides);
	FIELD(wex_tensor, segment);
	FIELD(wex_tensor, offset);
	FIELD(wex_tensor, ptr);

	STRUCT(wex_sync_result);
	FIELD(wex_sync_result, version);
	FIELD(wex_sync_result, bytes);
	FIELD(wex_sync_result, ops);
	FIELD(wex_sync_result, seconds);
	FIELD(wex_sync_result, changed);
	FIELD(wex_sync_result, waited);
	FIELD(wex_sync_result, verified);
	FIELD(wex_sync_result, verify_seconds);

	STRUCT(wex_layout_tensor);
	FIELD(wex_layout_tensor, name);
	FIELD(wex_layout_tensor, dtype);
	FIELD(wex_layout_tensor, ndim);
	FIELD(wex_layout_tensor, shape);
	FIELD(wex_layout_tensor, nbytes);
	FIELD(wex_layout_tensor, first);
	FIELD(wex_layout_tensor, npieces);

	STRUCT(wex_client_params);
	FIELD(wex_client_params, field_mask);
	FIELD(wex_client_params, socket);
	FIELD(wex_client_params, role);
	FIELD(wex_client_params, model);
	FIELD(wex_client_params, group);
	FIELD(wex_client_params, rank);
	FIELD(wex_client_params, world_size);
	FIELD(wex_client_params, timeout_ms);
	FIELD(wex_client_params, copy_threads);
	FIELD(wex_client_params, device);
	FIELD(wex_client_params, flags);

	CONST("NAME_MAX", WEX_NAME_MAX);
	CONST("MAX_DIMS", WEX_MAX_DIMS);
	CONST("ERRNO_BASE", WEX_ERRNO_BASE);
	CONST("EPROTO_VERSION", WEX_EPROTO_VERSION);
	CONST("ENOCUDA", WEX_ENOCUDA);
	CONST("ELAYOUT", WEX_ELAYOUT);
	CONST("EDIRTY", WEX_EDIRTY);
	CONST("ENOPUBLISHED", WEX_ENOPUBLISHED);
	CONST("EDAEMON", WEX_EDAEMON);
	CONST("ENOMODEL", WEX_ENOMODEL);
	CONST("EREMOTE", WEX_EREMOTE);
	CONST("EVERIFY", WEX_EVERIFY);
	CONST("ROLE_PRODUCER", WEX_ROLE_PRODUCER);
	CONST("ROLE_CONSUMER", WEX_ROLE_CONSUMER);
	CONST("ROLE_ADMIN", WEX_ROLE_ADMIN);
	CONST("SEG_HOST", WEX_SEG_HOST);
	CONST("SEG_CUDA_VMM", WEX_SEG_CUDA_VMM);
	CONST("SEG_CUDA_IPC", WEX_SEG_CUDA_IPC);
	CONST("SEG_HOST_PINNED", WEX_SEG_HOST_PINNED);
	CONST("SYNC_COPY", WEX_SYNC_COPY);
	CONST("SYNC_REMAP_VIEW", WEX_SYNC_REMAP_VIEW);
	CONST("SYNC_REMAP_FIXED", WEX_SYNC_REMAP_FIXED);
	CONST("SYNC_VERIFY", WEX_SYNC_VERIFY);
	CONST("CLIENT_NO_WATCH", WEX_CLIENT_NO_WATCH);
	CONST("CLIENT_EINTR", WEX_CLIENT_EINTR);
	CONST("_F_SOCKET", WEX_CLIENT_FIELD_SOCKET);
	CONST("_F_ROLE", WEX_CLIENT_FIELD_ROLE);
	CONST("_F_MODEL", WEX_CLIENT_FIELD_MODEL);
	CONST("_F_GROUP", WEX_CLIENT_FIELD_GROUP);
	CONST("_F_RANK", WEX_CLIENT_FIELD_RANK);
	CONST("_F_TIMEOUT", WEX_CLIENT_FIELD_TIMEOUT);
	CONST("_F_COPY_THREADS", WEX_CLIENT_FIELD_COPY_THREADS);
	CONST("_F_DEVICE", WEX_CLIENT_FIELD_DEVICE);
	CONST("_F_FLAGS", WEX_CLIENT_FIELD_FLAGS);
	for (int d = 0; d < WEX_DT_COUNT; d++)
		printf("dtype %d %s %zu\n", d, wex_dtype_name(d) ? wex_dtype_name(d) : "INVALID",
		       wex_dtype_size(d));
	return 0;
}
