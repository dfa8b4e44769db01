/* SPDX-License-Identifier: MIT */
/*
 * vmm/cudawrap.h - the CUDA driver, reached through pointers (NCCL
 * cudawrap style).  libcuda.so.1 is dlopen()ed on first use ($WEX_CUDA_LIB
 * overrides the path) and every entry point is resolved with
 * cuGetProcAddress at the ABI version whose PFN typedef we call through, so
 * a newer driver never hands us a function with another signature.  Nothing
 * links against libcuda or libcudart.
 *
 * Without a driver (or without a device) wex__cuda_load() returns
 * -WEX_ENOCUDA and wex__cuda_why() says why; the host backend is unaffected.
 * Only vmm/ and tests include this header.
 */
#ifndef WEX_VMM_CUDAWRAP_H
#define WEX_VMM_CUDAWRAP_H

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "vmm/backend.h"

/*
 * X(field, symbol, abi_version, required).  `field` is the member name in
 * struct wex__cu_table; the type is PFN_<symbol>_v<abi_version>.  Optional
 * entries may stay NULL (older drivers); their callers check.
 */
#define WEX_CU_SYMBOLS(X)                                                              \
	X(cuInit, cuInit, 2000, 1)                                                     \
	X(cuDriverGetVersion, cuDriverGetVersion, 2020, 1)                             \
	X(cuGetErrorString, cuGetErrorString, 6000, 1)                                 \
	X(cuGetErrorName, cuGetErrorName, 6000, 1)                                     \
	X(cuDeviceGet, cuDeviceGet, 2000, 1)                                           \
	X(cuDeviceGetCount, cuDeviceGetCount, 2000, 1)                                 \
	X(cuDeviceGetUuid, cuDeviceGetUuid, 11040, 1)                                  \
	X(cuDeviceGetAttribute, cuDeviceGetAttribute, 2000, 1)                         \
	X(cuDeviceCanAccessPeer, cuDeviceCanAccessPeer, 4000, 1)                       \
	X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, 1)                 \
	X(cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxGetState, 7000, 0)             \
	X(cuCtxSetCurrent, cuCtxSetCurrent, 4000, 1)                                   \
	X(cuCtxEnablePeerAccess, cuCtxEnablePeerAccess, 4000, 1)                       \
	X(cuCtxGetCurrent, cuCtxGetCurrent, 4000, 1)                                   \
	X(cuCtxGetDevice, cuCtxGetDevice, 2000, 1)                                     \
	X(cuCtxSynchronize, cuCtxSynchronize, 2000, 1)                                 \
	X(cuMemCreate, cuMemCreate, 10020, 1)                                          \
	X(cuMemRelease, cuMemRelease, 10020, 1)                                        \
	X(cuMemMap, cuMemMap, 10020, 1)                                                \
	X(cuMemUnmap, cuMemUnmap, 10020, 1)                                            \
	X(cuMemSetAccess, cuMemSetAccess, 10020, 1)                                    \
	X(cuMemAddressReserve, cuMemAddressReserve, 10020, 1)                          \
	X(cuMemAddressFree, cuMemAddressFree, 10020, 1)                                \
	X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity, 10020, 1)      \
	X(cuMemExportToShareableHandle, cuMemExportToShareableHandle, 10020, 1)        \
	X(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle, 10020, 1)    \
	X(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle, 11000, 1)          \
	X(cuMemGetAllocationPropertiesFromHandle, cuMemGetAllocationPropertiesFromHandle, 10020, 1) \
	X(cuMemGetAddressRange, cuMemGetAddressRange, 3020, 1)                         \
	X(cuMemGetInfo, cuMemGetInfo, 3020, 1)                                         \
	X(cuMemAlloc, cuMemAlloc, 3020, 1)                                             \
	X(cuMemFree, cuMemFree, 3020, 1)                                               \
	X(cuPointerGetAttribute, cuPointerGetAttribute, 4000, 1)                       \
	X(cuIpcGetMemHandle, cuIpcGetMemHandle, 4010, 1)                               \
	X(cuIpcOpenMemHandle, cuIpcOpenMemHandle, 11000, 1)                            \
	X(cuIpcCloseMemHandle, cuIpcCloseMemHandle, 4010, 1)                           \
	X(cuIpcGetEventHandle, cuIpcGetEventHandle, 4010, 1)                           \
	X(cuIpcOpenEventHandle, cuIpcOpenEventHandle, 4010, 1)                         \
	X(cuMemcpyAsync, cuMemcpyAsync, 4000, 1)                                       \
	X(cuMemcpy2DAsync, cuMemcpy2DAsync, 3020, 1)                                   \
	X(cuMemcpy3DAsync, cuMemcpy3DAsync, 3020, 1)                                   \
	X(cuMemcpyHtoD, cuMemcpyHtoD, 3020, 1)                                         \
	X(cuMemcpyDtoH, cuMemcpyDtoH, 3020, 1)                                         \
	X(cuMemsetD8Async, cuMemsetD8Async, 3020, 1)                                   \
	X(cuMemHostRegister, cuMemHostRegister, 6050, 1)                               \
	X(cuMemHostUnregister, cuMemHostUnregister, 4000, 1)                           \
	X(cuMemHostGetDevicePointer, cuMemHostGetDevicePointer, 3020, 1)               \
	X(cuMemHostGetFlags, cuMemHostGetFlags, 2030, 0)                               \
	X(cuStreamCreate, cuStreamCreate, 2000, 1)                                     \
	X(cuStreamDestroy, cuStreamDestroy, 4000, 1)                                   \
	X(cuStreamSynchronize, cuStreamSynchronize, 2000, 1)                           \
	X(cuStreamWaitEvent, cuStreamWaitEvent, 3020, 1)                               \
	X(cuEventCreate, cuEventCreate, 2000, 1)                                       \
	X(cuEventRecord, cuEventRecord, 2000, 1)                                       \
	X(cuEventSynchronize, cuEventSynchronize, 2000, 1)                             \
	X(cuEventElapsedTime, cuEventElapsedTime, 2000, 1)                             \
	X(cuEventDestroy, cuEventDestroy, 4000, 1)                                     \
	X(cuModuleLoadData, cuModuleLoadData, 2000, 0)                                 \
	X(cuModuleGetFunction, cuModuleGetFunction, 2000, 0)                           \
	X(cuModuleUnload, cuModuleUnload, 2000, 0)                                     \
	X(cuLaunchKernel, cuLaunchKernel, 4000, 0)                                     \
	X(cuStreamBeginCapture, cuStreamBeginCapture, 10010, 0)                        \
	X(cuStreamEndCapture, cuStreamEndCapture, 10000, 0)                            \
	X(cuThreadExchangeStreamCaptureMode, cuThreadExchangeStreamCaptureMode, 10010, 0) \
	X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, 11040, 0)          \
	X(cuGraphLaunch, cuGraphLaunch, 10000, 0)                                      \
	X(cuGraphDestroy, cuGraphDestroy, 10000, 0)                                    \
	X(cuGraphExecDestroy, cuGraphExecDestroy, 10000, 0)                            \
	X(cuMemHostAlloc, cuMemHostAlloc, 2020, 0)                                     \
	X(cuMemFreeHost, cuMemFreeHost, 2000, 0)                                       \
	X(cuMemAllocManaged, cuMemAllocManaged, 6000, 0)                               \
	X(cuMemAllocAsync, cuMemAllocAsync, 11020, 0)                                  \
	X(cuMemFreeAsync, cuMemFreeAsync, 11020, 0)                                    \
	X(cuMemcpyBatchAsync13, cuMemcpyBatchAsync, 13000, 0)                          \
	X(cuMemcpyBatchAsync12, cuMemcpyBatchAsync, 12080, 0)

struct wex__cu_table {
#define WEX_CU_FIELD(field, sym, ver, req) PFN_##sym##_v##ver field;
	WEX_CU_SYMBOLS(WEX_CU_FIELD)
#undef WEX_CU_FIELD
	int driver_version; /* cuDriverGetVersion, e.g. 12080 */
};

/* Filled by wex__cuda_load(); read-only afterwards. */
extern struct wex__cu_table wex__cu;

/*
 * Loads the driver and calls cuInit once per process (thread-safe).  0, or
 * -WEX_ENOCUDA with the reason in wex__cuda_why().  Cheap after the first
 * call.  Blocks (dlopen, cuInit) the first time only.  In a child forked
 * after the driver was loaded (CUDA does not survive fork) every call
 * returns -WEX_ENOCUDA, and wex__cuda_why() names the parent.
 */
int wex__cuda_load(void);

/* Why the driver is unusable ("" when it is usable).  Static storage. */
const char *wex__cuda_why(void);

/* Copies the reason into why/len (when why != NULL) and returns the load
 * result: the body of every CUDA backend's probe slot. */
int wex__cuda_probe(char *why, size_t len);

/*
 * Maps a CUresult to a negative errno (0 for CUDA_SUCCESS) and logs
 * "<call>: <CUDA_ERROR_NAME> (<description>)" once, at error level.
 * Not-initialised/no-device codes map to -WEX_ENOCUDA, out of memory to
 * -ENOMEM, invalid value to -EINVAL, not supported to -EOPNOTSUPP.
 */
int wex__cuda_err(CUresult r, const char *call);
/* The same mapping, without logging (for expected failures).  Sticky
 * errors (wex__cuda_sticky) map to -ENOTRECOVERABLE. */
int wex__cuda_errno(CUresult r);
/* 1 for the errors after which the process's CUDA context is unusable
 * (illegal address, launch failure, ...): every later call fails too. */
int wex__cuda_sticky(CUresult r);
/* "CUDA_ERROR_..." for r (never NULL). */
const char *wex__cuda_errname(CUresult r);

/* Evaluates a driver call and maps its result; logs failures. */
#define WEX_CU(call) wex__cuda_err((call), #call)

/*
 * Makes device `dev`'s primary context current on the calling thread
 * (retained once per process, never released: the runtime and PyTorch
 * share it).  0 or negative errno.
 */
int wex__cuda_use_device(int dev);
/* 1 when dev's primary context is in use in this process, wex's or one
 * the engine (PyTorch) made; never makes one. */
int wex__cuda_device_active(int dev);

/* Device attribute `a` of ordinal `dev`; 0 when the driver does not know
 * it (older drivers) or the device is missing. */
int wex__cuda_dev_attr(int dev, CUdevice_attribute a);

/* cuPointerGetAttribute(data, a, p), asked again with a context of this
 * process current where the thread had none and the driver wants one
 * (the thread's binding is left as it was).  The driver's result. */
CUresult wex__cuda_ptr_attr(void *data, CUpointer_attribute a, uint64_t p);

/* Device ordinal owning `ptr` (device memory, VMM mappings or registered
 * host memory); falls back to the current context's device. */
int wex__cuda_ptr_device(uint64_t ptr, int *dev);

/* cuCtxSynchronize in every primary context wex retained; 0 when wex never
 * loaded the driver.  Blocks. */
int wex__cuda_settle(void);

/* 1 where a CUDA driver is loaded in this process (by wex or by someone
 * else: then wex loads it too), else 0 (no GPU work can exist). */
int wex__cuda_in_process(void);

/* The device ordinal of ptr when it is GPU memory per a libcuda already
 * loaded in this process (wex does not load it to ask); else -1. */
int wex__cuda_ptr_on_gpu(uint64_t ptr);

/* wex_mem_ptr_released (backend.h) on the CUDA driver. */
int wex__cuda_ptr_released(uint64_t addr, uint64_t len, uint64_t *at, struct wex_mem_span *known);

/*
 * Whether device `dev` can reach memory that device `owner` holds (both
 * ordinals in this process): 0 when dev == owner or cuDeviceCanAccessPeer
 * says so; else -EOPNOTSUPP, with an error naming both devices (ordinal
 * and UUID) and `what` logged.  Other negative errno on driver errors.
 */
int wex__cuda_peer_check(int dev, int owner, const char *what);

/*
 * Lets kernels in device `dev`'s primary context reach memory that
 * `owner`'s primary context allocated or opened (cuMemAlloc, legacy IPC
 * opens): cuCtxEnablePeerAccess, which such memory needs and VMM memory
 * does not (cuMemSetAccess grants VMM access per device).  0 when already
 * enabled or dev == owner.  Leaves dev's context current.
 */
int wex__cuda_enable_peer(int dev, int owner);

/* Writes device `dev`'s UUID as text into out (at least WEX_UUID_LEN):
 * "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" when WEX_UUID_LEN allows
 * (>= 41), else the bare 36-character form.  0 or negative errno. */
int wex__cuda_device_uuid(int dev, char *out, size_t len);

/* Local ordinal of the device named by `uuid` (either text form);
 * -ENODEV when this process cannot see it. */
int wex__cuda_device_by_uuid(const char *uuid, int *dev);

/* The executor's dedicated stream on device `dev` (created once,
 * non-blocking).  The device's context must be current. */
int wex__cuda_stream(int dev, CUstream *out);

#endif
