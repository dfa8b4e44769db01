/* SPDX-License-Identifier: MIT */
/*
 * cudawrap.c - loads libcuda.so.1 at run time and resolves every entry
 * point through cuGetProcAddress (NCCL src/misc/cudawrap.cc pattern).
 */
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "wex.h"
#include "src/log.h"
#include "vmm/backend.h"
#include "vmm/cudawrap.h"

#define WEX_CUDA_MAX_DEVICES 64

struct wex__cu_table wex__cu;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_result = -WEX_ENOCUDA;
static char load_why[512] = "CUDA driver not loaded yet";
static void *libcuda;
/* The process that loaded the driver: a child forked after that inherits
 * the table but not a usable driver (CUDA does not survive fork). */
static pid_t load_pid;

static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext dev_ctx[WEX_CUDA_MAX_DEVICES];
static CUstream dev_stream[WEX_CUDA_MAX_DEVICES];

typedef CUresult (*pfn_getproc_v2)(const char *, void **, int, cuuint64_t,
				   CUdriverProcAddressQueryResult *);
typedef CUresult (*pfn_getproc_v1)(const char *, void **, int, cuuint64_t);

/* Resolves one symbol at one ABI version with whichever cuGetProcAddress
 * the driver exports (v2 since CUDA 12.0, v1 since 11.3). */
static CUresult getproc(pfn_getproc_v2 gp2, pfn_getproc_v1 gp1, const char *sym, void **pfn,
			int ver)
{
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
	CUresult r;

	*pfn = NULL;
	if (gp2) {
		r = gp2(sym, pfn, ver, CU_GET_PROC_ADDRESS_DEFAULT, &st);
		if (r == CUDA_SUCCESS && st != CU_GET_PROC_ADDRESS_SUCCESS)
			r = CUDA_ERROR_NOT_FOUND;
	} else {
		r = gp1(sym, pfn, ver, CU_GET_PROC_ADDRESS_DEFAULT);
	}
	if (r == CUDA_SUCCESS && !*pfn)
		r = CUDA_ERROR_NOT_FOUND;
	if (r != CUDA_SUCCESS)
		*pfn = NULL;
	return r;
}

static const char *driver_path(void)
{
	const char *path = getenv("WEX_CUDA_LIB");

	return path && *path ? path : "libcuda.so.1";
}

static void load_driver(void)
{
	const char *path = driver_path();
	pfn_getproc_v2 gp2;
	pfn_getproc_v1 gp1 = NULL;
	void *pfn;
	CUresult r;
	int ver = 0;

	dlerror();
	libcuda = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!libcuda) {
		const char *e = dlerror();

		snprintf(load_why, sizeof(load_why), "%s not found: %s", path, e ? e : "dlopen failed");
		goto err;
	}
	/* The only symbols taken with dlsym: everything else comes through
	 * cuGetProcAddress at an explicit ABI version. */
	gp2 = (pfn_getproc_v2)(uintptr_t)dlsym(libcuda, "cuGetProcAddress_v2");
	if (!gp2)
		gp1 = (pfn_getproc_v1)(uintptr_t)dlsym(libcuda, "cuGetProcAddress");
	if (!gp2 && !gp1) {
		snprintf(load_why, sizeof(load_why),
			 "%s lacks cuGetProcAddress_v2/cuGetProcAddress (driver older than CUDA 11.3?)",
			 path);
		goto err_close;
	}
	r = getproc(gp2, gp1, "cuDriverGetVersion", &pfn, 2020);
	if (r != CUDA_SUCCESS) {
		snprintf(load_why, sizeof(load_why), "%s: missing driver entry point cuDriverGetVersion",
			 path);
		goto err_close;
	}
	wex__cu.cuDriverGetVersion = (PFN_cuDriverGetVersion_v2020)(uintptr_t)pfn;
	if (wex__cu.cuDriverGetVersion(&ver) != CUDA_SUCCESS)
		ver = 0;
	wex__cu.driver_version = ver;

	/* Optional entry points only from a driver that said its version:
	 * one that did not may be older than their ABI. */
#define WEX_CU_RESOLVE(field, sym, v, req)                                                 \
	do {                                                                               \
		if (!(req) && (!ver || ver < (v)))                                         \
			break; /* optional and newer than this driver */                  \
		r = getproc(gp2, gp1, #sym, &pfn, (v));                                    \
		if (r != CUDA_SUCCESS && (req)) {                                          \
			snprintf(load_why, sizeof(load_why),                               \
				 "%s: missing driver entry point %s (ABI %d, driver %d)", path,  \
				 #sym, (v), ver);                                          \
			goto err_close;                                                    \
		}                                                                          \
		wex__cu.field = (PFN_##sym##_v##v)(uintptr_t)pfn;                          \
	} while (0);
	WEX_CU_SYMBOLS(WEX_CU_RESOLVE)
#undef WEX_CU_RESOLVE

	r = wex__cu.cuInit(0);
	if (r != CUDA_SUCCESS) {
		snprintf(load_why, sizeof(load_why), "cuInit failed: %s (%s)", wex__cuda_errname(r),
			 r == CUDA_ERROR_NO_DEVICE ? "no CUDA-capable device" : "driver unusable");
		goto err_close;
	}
	load_why[0] = '\0';
	__atomic_store_n(&load_pid, getpid(), __ATOMIC_RELAXED);
	__atomic_store_n(&load_result, 0, __ATOMIC_RELEASE);
	wex_debug("cuda", "driver %s loaded, version %d", path, ver);
	return;
err_close:
	/* Keep no half-resolved table: every later call sees -WEX_ENOCUDA. */
	memset(&wex__cu, 0, sizeof(wex__cu));
	dlclose(libcuda);
	libcuda = NULL;
err:
	__atomic_store_n(&load_result, -WEX_ENOCUDA, __ATOMIC_RELEASE);
	wex_debug("cuda", "CUDA unavailable: %s", load_why);
}

/* A child forked after the driver was loaded here: its table points at a
 * driver that refuses every call (or, worse, hangs). */
static int forked_child(void)
{
	pid_t p = __atomic_load_n(&load_pid, __ATOMIC_RELAXED);

	return p && p != getpid();
}

/* The driver is loaded and usable in this process (no load attempted). */
static int driver_ready(void)
{
	return __atomic_load_n(&load_result, __ATOMIC_ACQUIRE) == 0 && !forked_child();
}

int wex__cuda_load(void)
{
	static pid_t why_pid;

	pthread_once(&load_once, load_driver);
	if (!forked_child())
		return load_result;
	/* Written once per child (the parent's reason is empty: it loaded). */
	if (__atomic_load_n(&why_pid, __ATOMIC_RELAXED) != getpid()) {
		snprintf(load_why, sizeof(load_why),
			 "the CUDA driver was initialised by parent pid %d before fork(); CUDA "
			 "cannot be used in a forked child (exec a new process or initialise "
			 "CUDA after fork)", (int)__atomic_load_n(&load_pid, __ATOMIC_RELAXED));
		__atomic_store_n(&why_pid, getpid(), __ATOMIC_RELAXED);
	}
	return -WEX_ENOCUDA;
}

const char *wex__cuda_why(void)
{
	wex__cuda_load();
	return load_why;
}

int wex__cuda_probe(char *why, size_t len)
{
	int ret = wex__cuda_load();

	if (why && len) {
		snprintf(why, len, "%s", load_why);
	}
	return ret;
}

const char *wex__cuda_errname(CUresult r)
{
	const char *s = NULL;

	if (wex__cu.cuGetErrorName && wex__cu.cuGetErrorName(r, &s) == CUDA_SUCCESS && s)
		return s;
	return r == CUDA_ERROR_NO_DEVICE ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN_CODE";
}

int wex__cuda_errno(CUresult r)
{
	switch (r) {
	case CUDA_SUCCESS:
		return 0;
	case CUDA_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case CUDA_ERROR_INVALID_VALUE:
	case CUDA_ERROR_INVALID_HANDLE:
		return -EINVAL;
	case CUDA_ERROR_NOT_SUPPORTED:
		return -EOPNOTSUPP;
	case CUDA_ERROR_NOT_PERMITTED:
		return -EPERM;
	case CUDA_ERROR_INVALID_DEVICE:
		return -ENODEV;
	case CUDA_ERROR_ALREADY_MAPPED:
		return -EEXIST;
	case CUDA_ERROR_NOT_FOUND:
		return -ENOENT;
	case CUDA_ERROR_NOT_READY:
		return -EAGAIN;
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_NOT_INITIALIZED:
	case CUDA_ERROR_DEINITIALIZED:
	case CUDA_ERROR_STUB_LIBRARY:
		return -WEX_ENOCUDA;
	default:
		return wex__cuda_sticky(r) ? -ENOTRECOVERABLE : -EIO;
	}
}

int wex__cuda_sticky(CUresult r)
{
	/* "This leaves the process in an inconsistent state and any further
	 * CUDA work will return the same error" (cuda.h, of each of these but
	 * the assert, whose context "cannot be used anymore"). */
	switch (r) {
	case CUDA_ERROR_CONTAINED:
	case CUDA_ERROR_ILLEGAL_ADDRESS:
	case CUDA_ERROR_LAUNCH_TIMEOUT:
	case CUDA_ERROR_ASSERT:
	case CUDA_ERROR_HARDWARE_STACK_ERROR:
	case CUDA_ERROR_ILLEGAL_INSTRUCTION:
	case CUDA_ERROR_MISALIGNED_ADDRESS:
	case CUDA_ERROR_INVALID_ADDRESS_SPACE:
	case CUDA_ERROR_INVALID_PC:
	case CUDA_ERROR_LAUNCH_FAILED:
	case CUDA_ERROR_EXTERNAL_DEVICE:
		return 1;
	default:
		return 0;
	}
}

int wex__cuda_err(CUresult r, const char *call)
{
	const char *desc = NULL, *name;

	if (r == CUDA_SUCCESS)
		return 0;
	if (!wex__cu.cuGetErrorString || wex__cu.cuGetErrorString(r, &desc) != CUDA_SUCCESS)
		desc = NULL;
	/* The call's name for a copy's error (WEX_CU passes its source text:
	 * "wex__cu.cuMemcpyAsync(...)"). */
	name = strncmp(call, "wex__cu.", 8) == 0 ? call + 8 : call;
	if (!wex__copy_fail.call[0]) /* the first failure: later ones follow from it */
		snprintf(wex__copy_fail.call, sizeof(wex__copy_fail.call), "%.*s: %s",
			 (int)strcspn(name, "("), name, wex__cuda_errname(r));
	wex_error("cuda", "%s: %s (%s)%s", call, wex__cuda_errname(r), desc ? desc : "no description",
		  wex__cuda_sticky(r) ? ": a sticky error (this call's or earlier GPU work's of this process): the process's CUDA context is unusable from now on; restart the process" : "");
	return wex__cuda_errno(r);
}

int wex__cuda_use_device(int dev)
{
	CUcontext ctx, cur = NULL;
	CUdevice d;
	int ret;

	ret = wex__cuda_load();
	if (ret)
		return ret;
	if (dev < 0 || dev >= WEX_CUDA_MAX_DEVICES)
		return -ENODEV;
	pthread_mutex_lock(&dev_lock);
	ctx = dev_ctx[dev];
	if (!ctx) {
		ret = WEX_CU(wex__cu.cuDeviceGet(&d, dev));
		if (!ret)
			ret = WEX_CU(wex__cu.cuDevicePrimaryCtxRetain(&ctx, d));
		if (!ret)
			dev_ctx[dev] = ctx;
	}
	pthread_mutex_unlock(&dev_lock);
	if (ret)
		return ret;
	/* Setting the same context again is cheap but not free: skip it. */
	if (wex__cu.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == ctx)
		return 0;
	return WEX_CU(wex__cu.cuCtxSetCurrent(ctx));
}

/* Whether wex retained dev's primary context. */
static int dev_retained(int dev)
{
	int on;

	pthread_mutex_lock(&dev_lock);
	on = dev_ctx[dev] != NULL;
	pthread_mutex_unlock(&dev_lock);
	return on;
}

/* Whether dev's primary context is active (someone retained it), asked
 * without retaining it; 0 where the driver cannot say. */
static int primary_active(int dev)
{
	unsigned int flags = 0;
	int active = 0;
	CUdevice d;

	return wex__cu.cuDevicePrimaryCtxGetState && wex__cu.cuDeviceGet(&d, dev) == CUDA_SUCCESS &&
	       wex__cu.cuDevicePrimaryCtxGetState(d, &flags, &active) == CUDA_SUCCESS && active;
}

int wex__cuda_device_active(int dev)
{
	if (dev < 0 || dev >= WEX_CUDA_MAX_DEVICES)
		return 0;
	return dev_retained(dev) || primary_active(dev);
}

/* dl_iterate_phdr's count of libraries loaded into this process so far
 * (dlpi_adds: it only grows); 0 where the C library does not give it. */
static int adds_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
	if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds))
		*(unsigned long long *)arg = info->dlpi_adds;
	return 1; /* the first library tells */
}

/* The last dlopen(RTLD_NOLOAD) that found no driver: dlpi_adds then (0:
 * none) and the path asked, getenv's string (a setenv of WEX_CUDA_LIB
 * makes a new one).  No lock: a fork()ed child may ask. */
static unsigned long long none_adds;
static const char *none_path;

/* dlopen(driver_path(), RTLD_NOLOAD): the driver library if this process
 * loaded it (dlclose the handle), else NULL.  glibc's RTLD_NOLOAD of a
 * name that matches no loaded library still looks for the file, maps
 * ld.so.cache and tries each library directory: 5 opens and an mmap a
 * call, and libwex asks at every call that may meet GPU memory (three
 * times per tensor of an attach: 60,000 failed dlopens, 4 s of system
 * time, for 20,000 tensors on a host without CUDA).  Its answer changes
 * only when a library is loaded: a "no" stands until dl_iterate_phdr
 * counts a new one (no system call).  Not a filter on the names loaded:
 * "libcuda" is also the start of libcudart.so.12, which PyTorch's CUDA
 * builds load at import, before anything loads the driver, and dlopen
 * finds the driver by its soname and by the file too, whatever name it
 * was loaded under. */
static void *driver_loaded(void)
{
	const char *p = driver_path();
	unsigned long long adds = 0;
	void *h;

	dl_iterate_phdr(adds_cb, &adds);
	if (adds && __atomic_load_n(&none_adds, __ATOMIC_ACQUIRE) == adds &&
	    __atomic_load_n(&none_path, __ATOMIC_RELAXED) == p)
		return NULL;
	h = dlopen(p, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
	/* adds was read before the dlopen: a driver loaded since counts more. */
	if (!h && adds) {
		__atomic_store_n(&none_path, p, __ATOMIC_RELAXED);
		__atomic_store_n(&none_adds, adds, __ATOMIC_RELEASE);
	}
	return h;
}

/* Entry points of a libcuda someone else in this process loaded (wex has
 * not), resolved once without loading or initialising anything: NULL while
 * there is none (asked again at the next call: driver_loaded).  The
 * library stays loaded by its user, so the pointers outlive our dlclose. */
static void *fgn_get, *fgn_xchg;

static void foreign_syms(void)
{
	void *h, *get = NULL, *xchg = NULL;
	pfn_getproc_v2 gp2;
	pfn_getproc_v1 gp1;

	if (__atomic_load_n(&fgn_get, __ATOMIC_ACQUIRE))
		return;
	h = driver_loaded();
	if (!h)
		return;
	/* v2 since CUDA 12.0, v1 before (as load_driver). */
	gp2 = (pfn_getproc_v2)(uintptr_t)dlsym(h, "cuGetProcAddress_v2");
	gp1 = gp2 ? NULL : (pfn_getproc_v1)(uintptr_t)dlsym(h, "cuGetProcAddress");
	if ((gp2 || gp1) && getproc(gp2, gp1, "cuCtxGetCurrent", &get, 4000) == CUDA_SUCCESS) {
		if (getproc(gp2, gp1, "cuThreadExchangeStreamCaptureMode", &xchg, 10010) !=
		    CUDA_SUCCESS)
			xchg = NULL;
		__atomic_store_n(&fgn_xchg, xchg, __ATOMIC_RELAXED);
		__atomic_store_n(&fgn_get, get, __ATOMIC_RELEASE);
	}
	dlclose(h);
}

/* The thread's stream capture mode becomes RELAXED until the restore:
 * in the default GLOBAL mode, the driver refuses "potentially unsafe"
 * calls (cuMemAlloc, cuMemHostRegister, ...) while any thread captures a
 * graph in GLOBAL mode, and invalidates that capture, so wex allocating
 * in one thread would break an engine capturing CUDA graphs in another
 * (NCCL wraps such calls the same way).  Synchronising a context in which
 * a stream captures is invalid whatever the mode (see backend.h). */
static void relax(struct wex_mem_thread_state *s, PFN_cuThreadExchangeStreamCaptureMode_v10010 xchg)
{
	CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;

	if (xchg && xchg(&m) == CUDA_SUCCESS) {
		s->mode = (int)m;
		s->relaxed = 1;
	}
}

/* wex__cuda_use_device switches contexts: the public calls save the
 * thread's context first and make it current again at their end.  When wex
 * has not loaded the driver, one loaded by someone else (PyTorch) is asked
 * without initialising it; with none loaded no thread has a context, and
 * the restore unbinds the one wex made current.  The capture mode is
 * relaxed in between (see relax): with no driver loaded yet nobody can be
 * capturing. */
void wex_mem_thread_save(struct wex_mem_thread_state *s)
{
	CUcontext ctx = NULL;

	s->ctx = NULL;
	s->valid = 1;
	s->relaxed = 0;
	if (forked_child())
		return; /* no CUDA here: no thread has a context */
	if (__atomic_load_n(&load_result, __ATOMIC_ACQUIRE) != 0) {
		/* wex has not loaded the driver.  If someone else in this
		 * process has, ask it for the thread's context without
		 * initialising anything (an uninitialised driver: none). */
		CUresult (*get)(CUcontext *);

		foreign_syms();
		get = (CUresult(*)(CUcontext *))(uintptr_t)__atomic_load_n(&fgn_get, __ATOMIC_ACQUIRE);
		if (!get)
			return; /* nobody here uses CUDA yet: no thread has a context */
		if (get(&ctx) == CUDA_SUCCESS)
			s->ctx = ctx;
		relax(s, (PFN_cuThreadExchangeStreamCaptureMode_v10010)(uintptr_t)__atomic_load_n(
				 &fgn_xchg, __ATOMIC_RELAXED));
		return;
	}
	if (wex__cu.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS)
		s->ctx = ctx;
	else
		s->valid = 0;
	relax(s, wex__cu.cuThreadExchangeStreamCaptureMode);
}

void wex_mem_thread_restore(const struct wex_mem_thread_state *s)
{
	CUcontext cur = NULL;

	if (s->relaxed) {
		PFN_cuThreadExchangeStreamCaptureMode_v10010 xchg =
			driver_ready() ? wex__cu.cuThreadExchangeStreamCaptureMode :
			(PFN_cuThreadExchangeStreamCaptureMode_v10010)(uintptr_t)__atomic_load_n(
				&fgn_xchg, __ATOMIC_RELAXED);
		CUstreamCaptureMode m = (CUstreamCaptureMode)s->mode;

		if (xchg)
			xchg(&m);
	}
	if (!s->valid || !driver_ready())
		return;
	if (wex__cu.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur != (CUcontext)s->ctx)
		wex__cu.cuCtxSetCurrent((CUcontext)s->ctx);
}

/* 1 when the driver is usable through wex__cu: wex loaded it, or someone
 * else in this process (PyTorch) did and wex now loads it too.  0 where
 * nobody loaded libcuda: no GPU memory or work can exist there, and wex
 * does not load the driver just to find that out. */
static int driver_in_process(void)
{
	void *h;

	if (driver_ready())
		return 1;
	h = driver_loaded();
	if (!h)
		return 0;
	dlclose(h);
	return wex__cuda_load() == 0;
}

int wex__cuda_in_process(void)
{
	return driver_in_process();
}

/* Waits for every piece of GPU work this process queued (any stream,
 * blocking or not) in the primary contexts wex retained (the devices wex
 * mapped or copied on), in every other primary context that is active
 * (the engine's, e.g. on the GPU owning memory a consumer imported from
 * another one) and in the calling thread's current context.
 * PyTorch works in the primary contexts, so this covers the engine's
 * kernels and a trainer's asynchronous device-to-host copies.  Where
 * nobody in the process loaded libcuda there is no GPU work: 0 at once.
 * The thread keeps its current context. */
int wex__cuda_settle(void)
{
	CUcontext prev = NULL, ctx[WEX_CUDA_MAX_DEVICES + 1];
	int ret = 0, n = 0, ndev = 0;

	if (!driver_in_process())
		return 0;
	if (wex__cu.cuCtxGetCurrent(&prev) != CUDA_SUCCESS)
		prev = NULL;
	/* The engine's own primary contexts too (PyTorch places a tensor
	 * over producer memory on the device owning it, where wex made no
	 * context): retaining one that is active costs nothing. */
	if (wex__cu.cuDevicePrimaryCtxGetState && wex__cu.cuDeviceGetCount(&ndev) == CUDA_SUCCESS)
		for (int d = 0; d < ndev && d < WEX_CUDA_MAX_DEVICES; d++)
			if (!dev_retained(d) && primary_active(d))
				wex__cuda_use_device(d);
	pthread_mutex_lock(&dev_lock);
	for (int d = 0; d < WEX_CUDA_MAX_DEVICES; d++)
		if (dev_ctx[d] && dev_ctx[d] != prev)
			ctx[n++] = dev_ctx[d];
	pthread_mutex_unlock(&dev_lock);
	if (prev)
		ctx[n++] = prev;
	for (int i = 0; i < n; i++) {
		int r = WEX_CU(wex__cu.cuCtxSetCurrent(ctx[i]));

		if (!r)
			r = WEX_CU(wex__cu.cuCtxSynchronize());
		if (r && !ret)
			ret = r;
	}
	wex__cu.cuCtxSetCurrent(prev);
	return ret;
}

/* Whether a pointer query that answered r may be asked again: refused for
 * want of a context (r CUDA_ERROR_INVALID_CONTEXT; real drivers answer
 * that to pointer queries and cuMemGetAddressRange in a thread with none),
 * in a thread with none, which now has a context of this process current.
 * Any context answers (unified addressing): one wex retained already, else
 * a primary context the engine made active.  Where the process has none,
 * none is made: no GPU memory of a primary context can exist then, and
 * retaining device 0's would cost hundreds of MiB of GPU 0 in a process
 * that may work on another GPU.  The driver answers
 * CUDA_ERROR_INVALID_VALUE for host memory it does not know (the usual
 * case): nothing is borrowed for that.  The caller unbinds it again
 * (unborrow), so that the thread's binding is what it was. */
static int borrowed_ctx(CUresult r)
{
	CUcontext cur = NULL;
	int ndev = 0, d;

	if (r != CUDA_ERROR_INVALID_CONTEXT ||
	    (wex__cu.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur))
		return 0;
	for (d = 0; d < WEX_CUDA_MAX_DEVICES; d++)
		if (dev_retained(d))
			return wex__cuda_use_device(d) == 0;
	if (wex__cu.cuDevicePrimaryCtxGetState && wex__cu.cuDeviceGetCount(&ndev) == CUDA_SUCCESS)
		for (d = 0; d < ndev && d < WEX_CUDA_MAX_DEVICES; d++)
			if (primary_active(d))
				return wex__cuda_use_device(d) == 0;
	return 0;
}

/* The thread had no context before borrowed_ctx: none again. */
static void unborrow(void)
{
	wex__cu.cuCtxSetCurrent(NULL);
}

/* cuPointerGetAttribute and cuMemGetAddressRange, asked again where the
 * thread had no context (borrowed_ctx). */
static CUresult ptr_attr(void *data, CUpointer_attribute a, uint64_t p)
{
	CUresult r = wex__cu.cuPointerGetAttribute(data, a, (CUdeviceptr)p);

	if (borrowed_ctx(r)) {
		r = wex__cu.cuPointerGetAttribute(data, a, (CUdeviceptr)p);
		unborrow();
	}
	return r;
}

CUresult wex__cuda_ptr_attr(void *data, CUpointer_attribute a, uint64_t p)
{
	return ptr_attr(data, a, p);
}

static CUresult addr_range(CUdeviceptr *base, size_t *size, uint64_t p)
{
	CUresult r = wex__cu.cuMemGetAddressRange(base, size, (CUdeviceptr)p);

	if (borrowed_ctx(r)) {
		r = wex__cu.cuMemGetAddressRange(base, size, (CUdeviceptr)p);
		unborrow();
	}
	return r;
}

/* The ordinal of the device holding ptr when it is GPU memory (device,
 * VMM-mapped or managed) according to a driver already loaded in this
 * process; -1 for host memory, unknown pointers, or a process where nobody
 * loaded libcuda (no GPU memory can exist there, and wex does not load the
 * driver just to ask). */
int wex__cuda_ptr_on_gpu(uint64_t ptr)
{
	unsigned int type = 0;
	int ord = -1;

	if (!driver_in_process())
		return -1;
	if (ptr_attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr) != CUDA_SUCCESS)
		return -1;
	if (type != CU_MEMORYTYPE_DEVICE && type != CU_MEMORYTYPE_UNIFIED)
		return -1;
	if (ptr_attr(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) != CUDA_SUCCESS || ord < 0)
		return -1;
	return ord;
}

/* What the driver says of address p: 0 mapped; 1 in an address range it
 * knows (RANGE_START_ADDR and RANGE_SIZE answer, and hold p: a VMM
 * reservation) with nothing mapped at p; -1 no such range (memory it does
 * not know: host memory).  Nothing mapped: MAPPED 0, or, where MAPPED has
 * no answer there (undocumented for this call), cuMemGetAddressRange
 * finding no allocation at p.  A MAPPED of 0 alone is not taken for
 * released: cuPointerGetAttributes fills 0 in for unknown pointers. */
static int released_at(uint64_t p)
{
	uint64_t m = 0, start = 0; /* MAPPED is "a boolean": read zeroed */
	CUdeviceptr base;
	size_t size = 0;
	CUresult mr;

	mr = ptr_attr(&m, CU_POINTER_ATTRIBUTE_MAPPED, p);
	if (mr == CUDA_SUCCESS && m)
		return 0;
	if (ptr_attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p) != CUDA_SUCCESS ||
	    ptr_attr(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p) != CUDA_SUCCESS || !size ||
	    p < start || p - start >= size)
		return -1;
	if (mr == CUDA_SUCCESS)
		return 1;
	return addr_range(&base, &size, p) == CUDA_SUCCESS ? 0 : 1;
}

int wex__cuda_ptr_released(uint64_t addr, uint64_t len, uint64_t *at, struct wex_mem_span *known)
{
	uint64_t p = addr, end = addr + len;
	CUdeviceptr base;
	size_t size;
	int first = 0;

	if (end < addr)
		return -EINVAL;
	if (!len || (known && addr >= known->lo && end <= known->hi))
		return 0;
	if (known && !known->asked)
		known->asked = driver_in_process() ? 1 : -1;
	if (known ? known->asked < 0 : !driver_in_process())
		return 0;
	if (known && addr >= known->lo && addr < known->hi) {
		/* It starts in the mapping known mapped: from the next one. */
		p = known->hi;
		known->unknown = 0;
	} else {
		first = released_at(p);
		if (known)
			known->unknown = first < 0;
	}
	/* Mapping by mapping (a VMM range maps several allocations back to
	 * back, and cuMemGetAddressRange gives one mapping's extent), as far
	 * as the driver gives extents; then the last byte. */
	while (p < end) {
		if ((p == addr ? first : released_at(p)) == 1) {
			*at = p;
			return 1;
		}
		if (addr_range(&base, &size, p) != CUDA_SUCCESS || !size || base > p ||
		    base + size <= p)
			break;
		if (known && base + size >= end) {
			known->lo = base; /* the mapping holding the end, mapped */
			known->hi = base + size;
		}
		p = base + size;
	}
	if (p < end && end - 1 != p && released_at(end - 1) == 1) {
		*at = end - 1;
		return 1;
	}
	return 0;
}

int wex__cuda_ptr_device(uint64_t ptr, int *dev)
{
	CUcontext cur = NULL;
	CUdevice d;
	int ord = -1;
	int ret;

	ret = wex__cuda_load();
	if (ret)
		return ret;
	if (ptr_attr(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) == CUDA_SUCCESS && ord >= 0) {
		*dev = ord;
		return 0;
	}
	/* Host memory or an unknown pointer: the current context's device. */
	if (wex__cu.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur &&
	    wex__cu.cuCtxGetDevice(&d) == CUDA_SUCCESS) {
		*dev = (int)d;
		return 0;
	}
	return -ENODEV;
}

int wex__cuda_enable_peer(int dev, int owner)
{
	CUcontext octx;
	CUresult r;
	int ret;

	if (dev == owner)
		return 0;
	/* Retains owner's primary context (dev_ctx) if nobody did yet. */
	ret = wex__cuda_use_device(owner);
	if (!ret)
		ret = wex__cuda_use_device(dev);
	if (ret)
		return ret;
	pthread_mutex_lock(&dev_lock);
	octx = dev_ctx[owner];
	pthread_mutex_unlock(&dev_lock);
	r = wex__cu.cuCtxEnablePeerAccess(octx, 0);
	/* PyTorch (or an earlier import) may have enabled it: fine. */
	if (r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
		return 0;
	return wex__cuda_err(r, "cuCtxEnablePeerAccess");
}

static void uuid_text(const CUuuid *u, char *out, size_t len)
{
	const unsigned char *b = (const unsigned char *)u->bytes;

	snprintf(out, len,
		 "%s%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		 len >= 41 ? "GPU-" : "", b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8],
		 b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

int wex__cuda_device_uuid(int dev, char *out, size_t len)
{
	CUdevice d;
	CUuuid u;
	int ret;

	ret = wex__cuda_load();
	if (ret)
		return ret;
	if (len < 37)
		return -EINVAL;
	ret = WEX_CU(wex__cu.cuDeviceGet(&d, dev));
	if (ret)
		return ret;
	ret = WEX_CU(wex__cu.cuDeviceGetUuid(&u, d));
	if (ret)
		return ret;
	uuid_text(&u, out, len);
	return 0;
}

int wex__cuda_device_by_uuid(const char *uuid, int *dev)
{
	char mine[48];
	const char *want = uuid;
	int n = 0, ret;

	ret = wex__cuda_load();
	if (ret)
		return ret;
	/* Compare the bare form so that either spelling matches. */
	if (strncmp(want, "GPU-", 4) == 0)
		want += 4;
	ret = WEX_CU(wex__cu.cuDeviceGetCount(&n));
	if (ret)
		return ret;
	for (int i = 0; i < n; i++) {
		CUdevice d;
		CUuuid u;

		if (wex__cu.cuDeviceGet(&d, i) != CUDA_SUCCESS ||
		    wex__cu.cuDeviceGetUuid(&u, d) != CUDA_SUCCESS)
			continue;
		uuid_text(&u, mine, 37);
		if (strcasecmp(mine, want) == 0) {
			*dev = i;
			return 0;
		}
	}
	wex_error("cuda", "device %s is not visible to this process (%d devices; CUDA_VISIBLE_DEVICES?)",
		  uuid, n);
	return -ENODEV;
}

int wex__cuda_peer_check(int dev, int owner, const char *what)
{
	char ud[WEX_UUID_LEN] = "?", uo[WEX_UUID_LEN] = "?";
	CUdevice d, o;
	int can = 0, ret;

	if (dev == owner)
		return 0;
	ret = wex__cuda_load();
	if (ret)
		return ret;
	ret = WEX_CU(wex__cu.cuDeviceGet(&d, dev));
	if (!ret)
		ret = WEX_CU(wex__cu.cuDeviceGet(&o, owner));
	if (!ret)
		ret = WEX_CU(wex__cu.cuDeviceCanAccessPeer(&can, d, o));
	if (ret)
		return ret;
	if (can)
		return 0;
	wex__cuda_device_uuid(dev, ud, sizeof(ud));
	wex__cuda_device_uuid(owner, uo, sizeof(uo));
	wex_error("cuda", "%s: device %d (%s) cannot access memory of device %d (%s): no peer "
		  "access between them (cuDeviceCanAccessPeer); use the device holding the "
		  "memory, or copy through host staging", what, dev, ud, owner, uo);
	return -EOPNOTSUPP;
}

int wex__cuda_stream(int dev, CUstream *out)
{
	CUstream s;
	int ret = 0;

	if (dev < 0 || dev >= WEX_CUDA_MAX_DEVICES)
		return -ENODEV;
	pthread_mutex_lock(&dev_lock);
	s = dev_stream[dev];
	if (!s) {
		/* Non-blocking: the executor must not serialise with the
		 * engine's legacy default stream. */
		ret = WEX_CU(wex__cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
		if (!ret)
			dev_stream[dev] = s;
	}
	pthread_mutex_unlock(&dev_lock);
	if (!ret)
		*out = s;
	return ret;
}
