/* SPDX-License-Identifier: MIT */
/*
 * emul_cuda.c - a CPU emulation of the slice of the CUDA driver API that
 * wex's CUDA backends use, loaded through $WEX_CUDA_LIB so that the GPU
 * tests also run on machines without a GPU (ctest label "cuda", names
 * ending in _emul).  It checks the backends' logic, not CUDA itself:
 *
 *  - "device memory" is host memory: cuMemCreate makes a memfd, cuMemMap
 *    maps it MAP_SHARED into a PROT_NONE reservation with no access until
 *    cuMemSetAccess (as on a GPU); exports dup the memfd; imports map the
 *    received fd, so two processes really share the bytes;
 *  - the rules the reference manual states are enforced: granularity,
 *    mapping only reserved and unmapped ranges, cuMemMap offsets of zero
 *    ("currently must be zero"; WEX_EMUL_MAP_OFFSET=1 takes granularity
 *    multiples, as newer drivers do), unmapping whole mappings,
 *    freeing reservations only when nothing is mapped, one legacy IPC open
 *    per process and handle (a second one fails with
 *    CUDA_ERROR_ALREADY_MAPPED, as on older drivers; with
 *    WEX_EMUL_IPC_REFCOUNT=1 a second one in the same context returns the
 *    same pointer and counts, as cuda.h says of current drivers, and each
 *    needs its close; wex_emul_ipc_opens() counts opens not closed;
 *    wex_emul_ctx_retained(dev) says whether the process retained that
 *    device's primary context, which costs GPU memory on a real one), no
 *    open of one's own handle (CUDA_ERROR_INVALID_CONTEXT), 2D/3D pitches
 *    not below the row width plus its X offset and not above
 *    CU_DEVICE_ATTRIBUTE_MAX_PITCH (2^31 - 1, or WEX_EMUL_MAX_PITCH);
 *    memory and fds are freed only when the last
 *    handle and mapping go, so leaks in the backends show as fd counts;
 *  - legacy IPC allocations are memfds; a handle names the exporter's pid
 *    and fd, and an importer opens /proc/<pid>/fd/<fd>;
 *  - with WEX_EMUL_FABRIC=1, fabric handles (cuMemCreate with
 *    CU_MEM_HANDLE_TYPE_FABRIC, export and import of the 64-byte handle);
 *    WEX_EMUL_NO_FABRIC_IMPORT=1 (or an error name or number) refuses the
 *    import with CUDA_ERROR_NOT_PERMITTED (or that error), as for a
 *    process without access to an IMEX channel, creation and export
 *    still working;
 *  - two devices (ordinals 0 and 1, distinct UUIDs, one primary context
 *    each); memory belongs to the device it was created on (imports learn
 *    it from the memfd's name), and pointer queries answer that device's
 *    ordinal (CU_POINTER_ATTRIBUTE_MEMORY_TYPE too);
 *    pointer queries need no current context (as under unified
 *    addressing; WEX_EMUL_PTR_NEEDS_CTX=1 refuses them with
 *    CUDA_ERROR_INVALID_CONTEXT in a thread with none, as real drivers
 *    were seen to: Triton PR 5276), and memory the driver does not know (pageable host
 *    memory) answers CUDA_ERROR_INVALID_VALUE; so does a reservation with
 *    nothing mapped at the address, except for RANGE_START_ADDR and
 *    RANGE_SIZE (the reservation's, mapped or not, as cuda.h says) and
 *    MAPPED (0); WEX_EMUL_MAPPED_ZERO=1 answers MAPPED 0 with success for
 *    memory it does not know too (as cuPointerGetAttributes documents
 *    for the attributes it fills in for unknown pointers; what a driver's
 *    cuPointerGetAttribute answers there is not documented);
 *    WEX_EMUL_MAPPED_ERR=1 answers MAPPED with CUDA_ERROR_INVALID_VALUE
 *    everywhere (no answer: a driver without the attribute, or one that
 *    refuses it where nothing is mapped);
 *    WEX_EMUL_VISIBLE="1,0" numbers them the other way round in a process
 *    (as CUDA_VISIBLE_DEVICES does), so devices must travel by UUID, and
 *    WEX_EMUL_VISIBLE="1" shows device 1 alone, as ordinal 0 (a legacy
 *    IPC handle of device 0's memory still opens there, as the runtime's
 *    reference says cudaIpcOpenMemHandle does for devices the process
 *    cannot see);
 *  - every VMM mapping keeps the access each device was given
 *    (cuMemSetAccess, several devices in one call); a device other than
 *    the owner only with peer access, which the devices (2, or
 *    WEX_EMUL_DEVICES, up to 4) have unless WEX_EMUL_NO_P2P=1
 *    (cuDeviceCanAccessPeer says so); WEX_EMUL_REFUSE_ACCESS=<ordinal>
 *    makes cuMemSetAccess refuse (CUDA_ERROR_NOT_SUPPORTED) any call
 *    giving that device access to another device's memory, as a driver
 *    may refuse one peer of several (whether it does, and with which
 *    error, is undocumented); PROT_READ maps
 *    the host pages read-only, so a CPU store into a read-only mapping
 *    faults (WEX_EMUL_NO_PROT_READ=1: the driver refuses PROT_READ with
 *    CUDA_ERROR_NOT_SUPPORTED; an error name or number instead of 1, e.g.
 *    CUDA_ERROR_NOT_PERMITTED, refuses it with that error: how a driver
 *    refuses is undocumented); copies (cuMemcpy*, cuMemsetD8Async) fail
 *    with CUDA_ERROR_ILLEGAL_ADDRESS where the current context's device
 *    may not read a VMM-mapped source or write a VMM-mapped destination,
 *    or where they touch a reservation with nothing mapped (host memory,
 *    cuMemAlloc memory and IPC opens are reachable from both devices by
 *    copies; kernels (cuLaunchKernel, cuGraphLaunch) reach VMM mappings
 *    as copies do, and cuMemAlloc memory or IPC opens of another device's
 *    context only after cuCtxEnablePeerAccess to it, as on a GPU);
 *  - cuMemHostRegister needs a current context and a mapped range, pins
 *    a read-only mapping only with CU_MEMHOSTREGISTER_READ_ONLY (refused
 *    with CUDA_ERROR_NOT_SUPPORTED when WEX_EMUL_NO_RO_HOSTREG=1, which
 *    also clears READ_ONLY_HOST_REGISTER_SUPPORTED), never registers a
 *    page twice, and cuMemHostUnregister fails once the range was
 *    unmapped and drops work still queued on it, as unmapping does
 *    (wex_emul_host_regs() counts live registrations;
 *    wex_emul_pageable_copies() the copies so far that moved host memory
 *    not registered, which a GPU copies slowly through bounce buffers);
 *    cuMemHostAlloc is an anonymous mapping registered so, and
 *    cuMemAllocManaged and cuMemAllocAsync allocate as cuMemAlloc does
 *    (cuda_facts asks wex_released of each); a cuMemAlloc of the size
 *    the last cuMemFree freed gets that address again where it is free
 *    (as the driver's allocator reuses addresses), and
 *    CU_POINTER_ATTRIBUTE_BUFFER_ID answers an ID no other mapping,
 *    allocation, open or registration of the process had before;
 *  - events are created in the current context (none: error), are
 *    recorded only on a stream of that context, and an interprocess event
 *    needs CU_EVENT_DISABLE_TIMING (and is the only kind with a handle);
 *    an event handle cannot be opened in the process that exported it
 *    (CUDA_ERROR_INVALID_CONTEXT); waits on events order nothing (every
 *    queued copy runs in issue order anyway);
 *  - tests may count calls and make one fail: wex_emul_calls(name),
 *    wex_emul_copy_calls() and wex_emul_fail(name, nth, result), found
 *    with dlsym (see gpu_util.h);
 *  - as on a GPU, a process whose parent had initialised the driver before
 *    fork() gets CUDA_ERROR_NOT_INITIALIZED from every call, and cuInit
 *    and the first context keep fds open for the process's lifetime (so
 *    fd-leak baselines must be taken after them);
 *  - the driver says CUDA 13.0, or WEX_EMUL_DRIVER_VERSION (12080, 12040:
 *    an older driver; cuMemcpyBatchAsync only from 12080, with failIdx
 *    below 13000); cuGetProcAddress refuses a version above the driver's
 *    (CUDA_ERROR_INVALID_VALUE) and answers a symbol it lacks with
 *    CUDA_SUCCESS, a NULL pointer and the status saying why, as cuda.h
 *    says;
 *  - the copies of one cuMemcpyBatchAsync run last first (the reference
 *    promises no order within a batch, so copies that depend on each
 *    other show as wrong bytes);
 *  - copies are synchronous memcpy, except that with WEX_EMUL_DEFER=1
 *    cuMemcpyAsync, cuMemcpyBatchAsync, cuMemcpy2DAsync, cuMemcpy3DAsync
 *    and cuMemsetD8Async only queue their work, as a GPU does: it runs at
 *    the next cuCtxSynchronize or cuStreamSynchronize in the context it
 *    was queued in (each waits for its own context's work only), or
 *    cuEventSynchronize (or before a launch or unmap of this process, to
 *    keep the order); a synchronous cuMemcpyHtoD/DtoH runs on the legacy
 *    stream and waits for the work of its context's legacy and blocking
 *    streams only, not for CU_STREAM_NON_BLOCKING streams' (the driver
 *    API's stream synchronization behavior), so a test can tell whether the code
 *    under test waits for the GPU before it tells another process the
 *    bytes are there; queued work on memory that is unmapped or whose IPC
 *    open is closed before it ran is dropped, and the next
 *    synchronisation says CUDA_ERROR_ILLEGAL_ADDRESS (a kernel or copy
 *    engine faulting on a GPU), so a missing wait before an unmap shows;
 *    the one kernel the tests load (wex_copy_u32) runs on the CPU, and stream capture records launches
 *    into a graph that cuGraphLaunch replays;
 *  - stream capture modes (cuThreadExchangeStreamCaptureMode, per thread):
 *    a "potentially unsafe" call (cuCtxSynchronize, cuMemAlloc, ...) from
 *    a thread in GLOBAL mode while a GLOBAL capture is in progress in any
 *    thread fails and invalidates the capture (see unsafe());
 *    cuCtxSynchronize of a context one of whose streams captures fails
 *    and invalidates that capture in any mode (see ctx_sync_ok()).
 *  - a driver that loses copies, for the benchmarks' own tests:
 *    WEX_EMUL_LOSE_BYTES=<from>-<to> makes each cuMemcpyAsync or
 *    cuMemcpyBatchAsync copy that starts at byte [from, to) of all the
 *    bytes this process asked those calls to copy succeed without moving
 *    a byte (a benchmark must then fail its check, not post a figure);
 *  - a GPU still busy: WEX_EMUL_SYNC_MS=<ms> makes each cuCtxSynchronize
 *    take that long, signals handled meanwhile ending nothing.
 * What it cannot tell: real driver behaviour, performance, and anything
 * about the PTX itself.  Not thread-safe: the tests call it from one
 * thread at a time (a test with a capturing thread hands over between
 * them); the current context and the capture mode are per thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#define API __attribute__((visibility("default")))
#define GRAN (2ull << 20)
#define TOTAL (64ull << 30)

struct ealloc {
	int fd;
	uint64_t size;
	int refs;      /* handles + mappings */
	unsigned types;
	int counted;   /* created here: counts in cuMemGetInfo */
	int dev;       /* physical device; -1: an import not mapped yet */
};

#define NDEV_MAX 4 /* (WEX_EMUL_DEVICES at most) */

struct range {
	uint64_t va, size;
	struct ealloc *a; /* mappings */
	int kind;         /* 0 reservation, 1 mapping, 2 cuMemAlloc, 3 ipc open, 4 host reg */
	char name[64];    /* IPC handle text (kinds 2, 3) */
	int fd;
	int dev;          /* physical device (kinds 1, 2, 3) */
	unsigned char acc[NDEV_MAX]; /* mappings: CU_MEM_ACCESS_FLAGS_* per physical device */
	unsigned flags;       /* host registrations: CU_MEMHOSTREGISTER_* */
	int opens;            /* IPC opens: cuIpcOpenMemHandle calls not yet closed */
	unsigned long long id; /* CU_POINTER_ATTRIBUTE_BUFFER_ID: never reused */
};

static struct range *rs;
static size_t nrs, caprs;
static uint64_t used;
static unsigned seq;
static unsigned long long last_id;
/* The last cuMemAlloc freed: the next one of the same size is placed
 * there, as the driver's allocator reuses freed addresses. */
static uint64_t freed_va, freed_size;
/* The thread's current context: 0, or CTX(device) of the primary context. */
/* Devices: 2, or WEX_EMUL_DEVICES (1 to NDEV_MAX), all peers of each
 * other unless WEX_EMUL_NO_P2P=1. */
#define NDEV ndev()
#define CTX(d) (0x1000u + 0x100u * (unsigned)(d))
static __thread uintptr_t ctx_current;

static int ndev(void)
{
	const char *v = getenv("WEX_EMUL_DEVICES");

	if (!v)
		return 2;
	if (strlen(v) != 1 || v[0] < '1' || v[0] > '0' + NDEV_MAX) {
		fprintf(stderr, "emul_cuda: WEX_EMUL_DEVICES=%s: not 1 to %d\n", v, NDEV_MAX);
		abort();
	}
	return v[0] - '0';
}

/* The physical devices this process sees, in ordinal order, as
 * CUDA_VISIBLE_DEVICES lists them: WEX_EMUL_VISIBLE="1,0" swaps the first
 * two, "1" shows device 1 alone (as ordinal 0; device 0's memory is
 * another device's that this process cannot name).  Unset: all of them.
 * The count. */
static int visible(int list[NDEV_MAX])
{
	const char *v = getenv("WEX_EMUL_VISIBLE");
	int n = 0;

	if (!v) {
		for (; n < NDEV; n++)
			list[n] = n;
		return n;
	}
	for (const char *c = v;; c++) {
		int ph = *c - '0', dup = 0;

		for (int k = 0; k < n; k++)
			dup |= list[k] == ph;
		if (ph < 0 || ph >= NDEV || dup || n == NDEV_MAX ||
		    (c[1] != ',' && c[1] != '\0')) {
			fprintf(stderr, "emul_cuda: WEX_EMUL_VISIBLE=%s: not a list of distinct "
				"devices below %d\n", v, NDEV);
			abort();
		}
		list[n++] = ph;
		if (!*++c)
			return n;
	}
}

/* Devices this process sees (cuDeviceGetCount). */
static int nvis(void)
{
	int list[NDEV_MAX];

	return visible(list);
}

/* Ordinal -> physical device (-1: no such ordinal here). */
static int phys(int ord)
{
	int list[NDEV_MAX], n = visible(list);

	return ord >= 0 && ord < n ? list[ord] : -1;
}

/* Physical device -> ordinal (-1: not visible here). */
static int ord_of(int ph)
{
	for (int o = 0; o < nvis(); o++)
		if (phys(o) == ph)
			return o;
	return -1;
}

static int cur_ord(void)
{
	return ctx_current ? (int)((ctx_current - CTX(0)) / (CTX(1) - CTX(0))) : -1;
}

/* The device (0..NDEV-1) of a stream's context; 0 for none. */
static int ctx_ord(uintptr_t ctx)
{
	int d = ctx ? (int)((ctx - CTX(0)) / (CTX(1) - CTX(0))) : 0;

	return d >= 0 && d < NDEV ? d : 0;
}

static int env_on(const char *name)
{
	const char *e = getenv(name);

	return e && *e == '1';
}

/* Calls counted for the tests, and one failure they may ask for. */
static struct hook {
	const char *name;
	unsigned long calls, fail_at;
	CUresult fail_with;
} hooks[] = {
	{ "cuMemMap" }, { "cuMemUnmap" }, { "cuMemSetAccess" }, { "cuMemCreate" },
	{ "cuMemcpyAsync" }, { "cuMemcpy2DAsync" }, { "cuMemcpy3DAsync" }, { "cuMemcpyBatchAsync" },
	{ "cuMemAddressReserve" }, { "cuMemHostRegister" }, { "cuMemHostUnregister" },
	{ "cuDevicePrimaryCtxRetain" }, { "cuCtxSetCurrent" }, { "cuMemGetAllocationGranularity" },
	{ "cuPointerGetAttribute" }, { "cuMemGetAddressRange" },
};

static struct hook *hook_of(const char *name)
{
	for (size_t i = 0; i < sizeof(hooks) / sizeof(hooks[0]); i++)
		if (strcmp(hooks[i].name, name) == 0)
			return &hooks[i];
	return NULL;
}

/* Counts a call of `name`; the failure asked for, or CUDA_SUCCESS. */
static CUresult hook(const char *name)
{
	struct hook *h = hook_of(name);

	if (!h)
		abort();
	h->calls++;
	if (h->fail_at && h->calls == h->fail_at) {
		h->fail_at = 0;
		return h->fail_with;
	}
	return CUDA_SUCCESS;
}

#define HOOK(name)                                                                 \
	do {                                                                       \
		CUresult hook_r_ = hook(name);                                     \
		if (hook_r_ != CUDA_SUCCESS)                                       \
			return hook_r_;                                            \
	} while (0)

/* How often `name` was called in this process (0 for names not counted). */
API unsigned long wex_emul_calls(const char *name)
{
	struct hook *h = hook_of(name);

	return h ? h->calls : 0;
}

/* Copy calls so far: cuMemcpyAsync, cuMemcpy2DAsync, cuMemcpy3DAsync and
 * cuMemcpyBatchAsync together. */
API unsigned long long wex_emul_copy_calls(void)
{
	return (unsigned long long)wex_emul_calls("cuMemcpyAsync") +
	       wex_emul_calls("cuMemcpy2DAsync") + wex_emul_calls("cuMemcpy3DAsync") +
	       wex_emul_calls("cuMemcpyBatchAsync");
}

/* The nth call of `name` from now on (1: the next) returns r. */
API void wex_emul_fail(const char *name, unsigned long nth, CUresult r)
{
	struct hook *h = hook_of(name);

	if (!h) {
		/* A test asking for a failure the emulation cannot give would
		 * pass without testing anything. */
		fprintf(stderr, "emul_cuda: wex_emul_fail: %s is not a counted call\n", name);
		abort();
	}
	h->fail_at = nth ? h->calls + nth : 0;
	h->fail_with = r;
}

/* Work queued by WEX_EMUL_DEFER=1 (see above). */
struct pending {
	uint64_t dst, src, n;
	int set;           /* memset with `val` instead of a copy */
	unsigned char val;
	uintptr_t ctx;     /* the context of the stream it was queued on */
	int blocking;      /* queued on the legacy stream or a blocking one */
};

static struct pending *pend;
static size_t npend, cappend;
static int defer = -1;

static int deferring(void)
{
	if (defer < 0) {
		const char *e = getenv("WEX_EMUL_DEFER");

		defer = e && *e == '1';
	}
	return defer;
}

/* Runs the queued work of context `ctx` (0: all of it), in order. */
static void flush_ctx(uintptr_t ctx)
{
	size_t k = 0;

	for (size_t i = 0; i < npend; i++) {
		if (ctx && pend[i].ctx != ctx)
			pend[k++] = pend[i];
		else if (pend[i].set)
			memset((void *)(uintptr_t)pend[i].dst, pend[i].val, pend[i].n);
		else
			memcpy((void *)(uintptr_t)pend[i].dst, (const void *)(uintptr_t)pend[i].src,
			       pend[i].n);
	}
	npend = k;
}

static void flush(void)
{
	flush_ctx(0);
}

/* What a synchronous cuMemcpyHtoD/DtoH waits for: it runs on the legacy
 * stream, which "synchronizes with all other streams in the same CUcontext
 * except for non-blocking streams" (the driver API's stream
 * synchronization behavior).  Work of other contexts and of
 * CU_STREAM_NON_BLOCKING streams (wex's executor's) stays queued, so a
 * test reading results back this way sees a missing stream wait. */
static void flush_legacy(void)
{
	size_t k = 0;

	for (size_t i = 0; i < npend; i++) {
		if (pend[i].ctx != ctx_current || !pend[i].blocking)
			pend[k++] = pend[i];
		else if (pend[i].set)
			memset((void *)(uintptr_t)pend[i].dst, pend[i].val, pend[i].n);
		else
			memcpy((void *)(uintptr_t)pend[i].dst, (const void *)(uintptr_t)pend[i].src,
			       pend[i].n);
	}
	npend = k;
}

/* An illegal address met by queued work: reported by the next sync. */
static CUresult sticky = CUDA_SUCCESS;

static int overlaps(uint64_t a, uint64_t n, uint64_t b, uint64_t m)
{
	return a < b + m && b < a + n;
}

/* [va, va+size) goes away: queued work touching it can no longer run. */
static void drop_pending(uint64_t va, uint64_t size)
{
	size_t k = 0;

	for (size_t i = 0; i < npend; i++) {
		if (overlaps(pend[i].dst, pend[i].n, va, size) ||
		    (!pend[i].set && overlaps(pend[i].src, pend[i].n, va, size)))
			sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
		else
			pend[k++] = pend[i];
	}
	npend = k;
}

/* The error of queued work that faulted, once. */
static CUresult take_sticky(void)
{
	CUresult r = sticky;

	sticky = CUDA_SUCCESS;
	return r;
}

/*
 * Stream capture's rules for "potentially unsafe" calls (cuda.h,
 * cuThreadExchangeStreamCaptureMode): a thread in GLOBAL mode (the
 * default) may not make them while any thread captures in GLOBAL mode or
 * it captures itself (not RELAXED); THREAD_LOCAL only minds its own
 * captures; RELAXED never.  A refused call fails with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the captures in
 * progress (all non-relaxed ones here: the emulation does not tell whose
 * capture was at fault).  The unsafe calls modelled: cuCtxSynchronize,
 * cuMemAlloc, cuMemFree, cuMemHostRegister, cuMemHostUnregister,
 * cuMemcpyHtoD, cuMemcpyDtoH, and cuMemCreate (an allocation like
 * cuMemAlloc; cuda.h does not say whether the driver counts it: the
 * stricter choice).
 */
static int captures_global;          /* GLOBAL captures, all threads */
static unsigned long capture_breaks; /* refused unsafe calls so far */
static __thread int own_global, own_strict; /* this thread's: GLOBAL, not RELAXED */
static __thread CUstreamCaptureMode thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

/* Captures in progress per context (any mode, any thread), and refused
 * synchronisations of a context while one was: the programming guide
 * makes synchronising "a device or context handle when any associated
 * stream is in capture mode" invalid whatever the capture mode, and it
 * invalidates those captures. */
static int ctx_captures[NDEV_MAX];
static unsigned long ctx_breaks[NDEV_MAX];

static CUresult ctx_sync_ok(void)
{
	int d = cur_ord();

	if (d < 0 || d >= NDEV || __atomic_load_n(&ctx_captures[d], __ATOMIC_RELAXED) == 0)
		return CUDA_SUCCESS;
	__atomic_fetch_add(&ctx_breaks[d], 1, __ATOMIC_RELAXED);
	return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

static CUresult unsafe(void)
{
	int others = __atomic_load_n(&captures_global, __ATOMIC_RELAXED) - own_global;

	if (thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
		return CUDA_SUCCESS;
	if (own_strict > 0 || (thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && others > 0)) {
		__atomic_fetch_add(&capture_breaks, 1, __ATOMIC_RELAXED);
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	}
	return CUDA_SUCCESS;
}

#define UNSAFE()                                                                   \
	do {                                                                       \
		CUresult unsafe_r_ = unsafe();                                     \
		if (unsafe_r_ != CUDA_SUCCESS)                                     \
			return unsafe_r_;                                          \
	} while (0)

static int stream_blocking(CUstream s);

static void queue_s(uint64_t dst, uint64_t src, uint64_t n, int set, unsigned char val,
		    uintptr_t ctx, int blocking)
{
	if (npend == cappend) {
		cappend = cappend ? cappend * 2 : 64;
		pend = realloc(pend, cappend * sizeof(*pend));
		if (!pend)
			abort();
	}
	pend[npend++] = (struct pending){ .dst = dst, .src = src, .n = n, .set = set, .val = val,
					  .ctx = ctx, .blocking = blocking };
}

#define queue(d, s, n, set, val, st) queue_s(d, s, n, set, val, stream_ctx(st), stream_blocking(st))

static struct range *add_range(void)
{
	if (nrs == caprs) {
		caprs = caprs ? caprs * 2 : 64;
		rs = realloc(rs, caprs * sizeof(*rs));
		if (!rs)
			abort();
	}
	memset(&rs[nrs], 0, sizeof(rs[0]));
	rs[nrs].fd = -1;
	rs[nrs].id = ++last_id;
	return &rs[nrs++];
}

static void del_range(struct range *r)
{
	*r = rs[--nrs];
}

static struct range *find_kind(uint64_t p, int kind)
{
	for (size_t i = 0; i < nrs; i++)
		if (rs[i].kind == kind && p >= rs[i].va && p < rs[i].va + rs[i].size)
			return &rs[i];
	return NULL;
}

static struct range *find_any(uint64_t p)
{
	for (size_t i = 0; i < nrs; i++)
		if (rs[i].kind != 0 && p >= rs[i].va && p < rs[i].va + rs[i].size)
			return &rs[i];
	return NULL;
}

static void unref(struct ealloc *a)
{
	if (--a->refs > 0)
		return;
	close(a->fd);
	if (a->counted)
		used -= a->size;
	free(a);
}

/* WEX_EMUL_FABRIC=1: fabric handles work (a node with IMEX), as 64 bytes
 * naming the exporter's pid and the allocation's fd. */
static int fabric(void)
{
	const char *e = getenv("WEX_EMUL_FABRIC");

	return e && *e == '1';
}

/* CUDA does not survive fork: a child of a process that initialised the
 * driver gets errors from every call (a test that forks a CUDA worker
 * after using CUDA itself would fail or hang on a GPU). */
static pid_t init_pid;

#define FORKED()                                                                   \
	do {                                                                       \
		if (!init_pid || init_pid != getpid())                             \
			return CUDA_ERROR_NOT_INITIALIZED;                         \
	} while (0)

static CUresult e_init(unsigned f)
{
	if (init_pid && init_pid != getpid())
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!init_pid) {
		/* The driver keeps control-device fds open from here on. */
		init_pid = getpid();
		for (int i = 0; i < 2; i++)
			if (open("/dev/null", O_RDONLY | O_CLOEXEC) < 0)
				return CUDA_ERROR_OPERATING_SYSTEM;
	}
	return CUDA_SUCCESS;
}

/* The driver's CUDA version: 13000, or WEX_EMUL_DRIVER_VERSION (12080: a
 * 12.8 driver, whose cuMemcpyBatchAsync takes failIdx; 12040: one without
 * it), as a lent GPU's driver may be older than the headers. */
static int drv_version(void)
{
	const char *e = getenv("WEX_EMUL_DRIVER_VERSION");
	int v;

	if (e && sscanf(e, "%d", &v) == 1 && v >= 11040 && v < 13000)
		return v;
	return 13000;
}

static CUresult e_version(int *v)
{
	if (init_pid && init_pid != getpid())
		return CUDA_ERROR_NOT_INITIALIZED; /* callable before cuInit */
	*v = drv_version();
	return CUDA_SUCCESS;
}

/* The errors the emulation returns, or that a knob may ask for, by name:
 * logs read as on a GPU, and knobs take the names the reference uses. */
#define ERR(e) { e, #e }
static const struct {
	CUresult r;
	const char *name;
} errs[] = {
	ERR(CUDA_SUCCESS), ERR(CUDA_ERROR_INVALID_VALUE), ERR(CUDA_ERROR_OUT_OF_MEMORY),
	ERR(CUDA_ERROR_NOT_INITIALIZED), ERR(CUDA_ERROR_INVALID_DEVICE),
	ERR(CUDA_ERROR_INVALID_CONTEXT), ERR(CUDA_ERROR_MAP_FAILED), ERR(CUDA_ERROR_ALREADY_MAPPED),
	ERR(CUDA_ERROR_INVALID_PTX), ERR(CUDA_ERROR_INVALID_HANDLE), ERR(CUDA_ERROR_NOT_FOUND),
	ERR(CUDA_ERROR_ILLEGAL_ADDRESS), ERR(CUDA_ERROR_LAUNCH_FAILED),
	ERR(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED), ERR(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED),
	ERR(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED), ERR(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
	ERR(CUDA_ERROR_NOT_PERMITTED), ERR(CUDA_ERROR_NOT_SUPPORTED), ERR(CUDA_ERROR_ILLEGAL_STATE),
	ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
	ERR(CUDA_ERROR_OPERATING_SYSTEM), ERR(CUDA_ERROR_UNKNOWN),
};
#undef ERR

static CUresult e_errname(CUresult r, const char **s)
{
	static char buf[32];

	for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++)
		if (errs[i].r == r) {
			*s = errs[i].name;
			return CUDA_SUCCESS;
		}
	snprintf(buf, sizeof(buf), "CUDA_ERROR_EMUL_%d", (int)r);
	*s = buf;
	return CUDA_SUCCESS;
}

/*
 * The error a knob asks the emulation to return: unset or "0", none
 * (CUDA_SUCCESS); "1", `one` (the knob's original meaning); a name from
 * errs[] ("CUDA_ERROR_NOT_PERMITTED") or a number ("800").  An unknown
 * name aborts: a test asking for an error it cannot get would test nothing.
 */
static CUresult env_err(const char *knob, CUresult one)
{
	const char *e = getenv(knob);
	char *end;
	long v;

	if (!e || !*e || strcmp(e, "0") == 0)
		return CUDA_SUCCESS;
	if (strcmp(e, "1") == 0)
		return one;
	for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++)
		if (strcmp(errs[i].name, e) == 0)
			return errs[i].r;
	v = strtol(e, &end, 10);
	if (*end || v <= 0) {
		fprintf(stderr, "emul_cuda: %s=%s: not an error name or number\n", knob, e);
		abort();
	}
	return (CUresult)v;
}

static CUresult e_dev_get(CUdevice *d, int ord)
{
	FORKED();
	if (ord < 0 || ord >= nvis())
		return CUDA_ERROR_INVALID_DEVICE;
	*d = ord;
	return CUDA_SUCCESS;
}

static CUresult e_dev_count(int *n)
{
	FORKED();
	*n = nvis();
	return CUDA_SUCCESS;
}

static CUresult e_uuid(CUuuid *u, CUdevice d)
{
	FORKED();
	if (d < 0 || d >= nvis())
		return CUDA_ERROR_INVALID_DEVICE;
	for (int i = 0; i < 16; i++)
		u->bytes[i] = (char)(0xa0 + i + 0x10 * phys(d));
	return CUDA_SUCCESS;
}

/* CU_DEVICE_ATTRIBUTE_MAX_PITCH: 2^31 - 1 as GPUs report it (deviceQuery's
 * "Maximum memory pitch: 2147483647 bytes"); WEX_EMUL_MAX_PITCH=<bytes>
 * lowers it, so that a test needs no 2 GiB buffers to go past it. */
static uint64_t max_pitch(void)
{
	const char *e = getenv("WEX_EMUL_MAX_PITCH");
	unsigned long long v;

	if (e && sscanf(e, "%llu", &v) == 1 && v > 0 && v < 2147483647ull)
		return v;
	return 2147483647ull;
}

static CUresult e_attr(int *v, CUdevice_attribute a, CUdevice d)
{
	FORKED();
	if (a == CU_DEVICE_ATTRIBUTE_MAX_PITCH) {
		*v = (int)max_pitch();
		return CUDA_SUCCESS;
	}
	*v = a == CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED ||
	     a == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED ||
	     (a == CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED && fabric()) ||
	     (a == CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED &&
	      !env_on("WEX_EMUL_NO_RO_HOSTREG"));
	return CUDA_SUCCESS;
}

/* Devices (this process's ordinals) whose primary context was retained:
 * wex_emul_ctx_retained(). */
static unsigned char retained[NDEV_MAX];

API int wex_emul_ctx_retained(int dev)
{
	return dev >= 0 && dev < nvis() && retained[dev];
}

static CUresult e_retain(CUcontext *c, CUdevice d)
{
	static int opened;

	FORKED();
	HOOK("cuDevicePrimaryCtxRetain");
	/* A context opens the device's fds and keeps them. */
	for (; opened < 2; opened++)
		if (open("/dev/null", O_RDONLY | O_CLOEXEC) < 0)
			return CUDA_ERROR_OPERATING_SYSTEM;
	if (d < 0 || d >= nvis())
		return CUDA_ERROR_INVALID_DEVICE;
	retained[d] = 1;
	*c = (CUcontext)(uintptr_t)CTX(d);
	return CUDA_SUCCESS;
}

/* Active: retained in this process (by wex or by the test standing in
 * for the engine). */
static CUresult e_ctx_state(CUdevice d, unsigned int *flags, int *active)
{
	FORKED();
	if (d < 0 || d >= nvis() || !flags || !active)
		return CUDA_ERROR_INVALID_VALUE;
	*flags = 0;
	*active = retained[d];
	return CUDA_SUCCESS;
}

static CUresult e_set_cur(CUcontext c)
{
	FORKED();
	HOOK("cuCtxSetCurrent");
	ctx_current = (uintptr_t)c;
	return CUDA_SUCCESS;
}

static CUresult e_get_cur(CUcontext *c)
{
	FORKED();
	*c = (CUcontext)ctx_current;
	return CUDA_SUCCESS;
}

static CUresult e_ctx_dev(CUdevice *d)
{
	FORKED();
	if (!ctx_current)
		return CUDA_ERROR_INVALID_CONTEXT;
	*d = (CUdevice)cur_ord();
	return CUDA_SUCCESS;
}

static CUresult e_ok(void)
{
	FORKED();
	return ctx_current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

static CUresult e_gran(size_t *g, const CUmemAllocationProp *p, CUmemAllocationGranularity_flags f)
{
	FORKED();
	HOOK("cuMemGetAllocationGranularity");
	*g = GRAN;
	return CUDA_SUCCESS;
}

static CUresult e_create(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *p,
			 unsigned long long flags)
{
	FORKED();
	HOOK("cuMemCreate");
	UNSAFE();
	struct ealloc *a;
	int fd;

	if (!size || size % GRAN || p->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
	    p->location.type != CU_MEM_LOCATION_TYPE_DEVICE || phys(p->location.id) < 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (p->requestedHandleTypes &
	    ~(unsigned)(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | (fabric() ? CU_MEM_HANDLE_TYPE_FABRIC : 0)))
		return CUDA_ERROR_NOT_SUPPORTED;
	if (used + size > TOTAL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	{
		/* The name carries the device, for importers (as a real
		 * handle carries its allocation's location). */
		char name[32];

		snprintf(name, sizeof(name), "emul-vmm-d%d", phys(p->location.id));
		fd = memfd_create(name, MFD_CLOEXEC);
	}
	if (fd < 0 || ftruncate(fd, (off_t)size) < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	a = calloc(1, sizeof(*a));
	a->fd = fd;
	a->size = size;
	a->refs = 1;
	a->types = p->requestedHandleTypes;
	a->counted = 1;
	a->dev = phys(p->location.id);
	used += size;
	*h = (CUmemGenericAllocationHandle)(uintptr_t)a;
	return CUDA_SUCCESS;
}

static CUresult e_release(CUmemGenericAllocationHandle h)
{
	FORKED();
	flush();
	if (!h)
		return CUDA_ERROR_INVALID_VALUE;
	unref((struct ealloc *)(uintptr_t)h);
	return CUDA_SUCCESS;
}

static CUresult e_reserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr hint,
			  unsigned long long flags)
{
	FORKED();
	HOOK("cuMemAddressReserve");
	uint64_t al = align ? align : GRAN, a;
	char *m;
	struct range *r;

	if (!size || size % GRAN)
		return CUDA_ERROR_INVALID_VALUE;
	m = mmap(NULL, size + al, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	a = ((uint64_t)(uintptr_t)m + al - 1) / al * al;
	if (a > (uint64_t)(uintptr_t)m)
		munmap(m, a - (uint64_t)(uintptr_t)m);
	munmap((char *)(uintptr_t)(a + size), (uint64_t)(uintptr_t)m + size + al - (a + size));
	r = add_range();
	r->va = a;
	r->size = size;
	r->kind = 0;
	*p = a;
	return CUDA_SUCCESS;
}

static CUresult e_addr_free(CUdeviceptr p, size_t size)
{
	FORKED();
	flush();
	for (size_t i = 0; i < nrs; i++)
		if (rs[i].kind == 0 && rs[i].va == p && rs[i].size == size) {
			for (size_t k = 0; k < nrs; k++)
				if (rs[k].kind == 1 && rs[k].va >= p && rs[k].va < p + size)
					return CUDA_ERROR_INVALID_VALUE; /* still mapped */
			munmap((void *)(uintptr_t)p, size);
			del_range(&rs[i]);
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_INVALID_VALUE;
}

static CUresult e_map(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h,
		      unsigned long long flags)
{
	FORKED();
	HOOK("cuMemMap");
	struct ealloc *a = (struct ealloc *)(uintptr_t)h;
	struct range *res = find_kind(p, 0), *r;

	if (!a || !res || p % GRAN || size % GRAN || off % GRAN || off + size > a->size ||
	    p + size > res->va + res->size || flags)
		return CUDA_ERROR_INVALID_VALUE;
	/* The reference: offset "currently must be zero". */
	if (off && !env_on("WEX_EMUL_MAP_OFFSET"))
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < nrs; i++)
		if (rs[i].kind == 1 && rs[i].va < p + size && p < rs[i].va + rs[i].size)
			return CUDA_ERROR_ALREADY_MAPPED;
	if (mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, (off_t)off) ==
	    MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	r = add_range();
	r->va = p;
	r->size = size;
	r->kind = 1;
	r->dev = a->dev;
	r->a = a;
	a->refs++;
	return CUDA_SUCCESS;
}

/* The whole range must consist of whole mappings. */
static CUresult e_unmap(CUdeviceptr p, size_t size)
{
	FORKED();
	HOOK("cuMemUnmap");
	uint64_t cur = p;

	drop_pending(p, size);
	flush();
	while (cur < p + size) {
		struct range *r = find_kind(cur, 1);

		if (!r || r->va != cur || r->va + r->size > p + size)
			return CUDA_ERROR_INVALID_VALUE;
		cur += r->size;
	}
	cur = p;
	while (cur < p + size) {
		struct range *r = find_kind(cur, 1);
		struct ealloc *a = r->a;

		cur += r->size;
		del_range(r);
		unref(a);
	}
	mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
	     -1, 0);
	return CUDA_SUCCESS;
}

/* Devices 0 and 1 reach each other's memory unless WEX_EMUL_NO_P2P=1. */
static int peer_ok(int ph_dev, int ph_owner)
{
	return ph_dev == ph_owner || !env_on("WEX_EMUL_NO_P2P");
}

static CUresult e_can_peer(int *can, CUdevice dev, CUdevice peer)
{
	FORKED();
	if (phys(dev) < 0 || phys(peer) < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*can = dev != peer && peer_ok(phys(dev), phys(peer));
	return CUDA_SUCCESS;
}

static CUresult e_access(CUdeviceptr p, size_t size, const CUmemAccessDesc *d, size_t count)
{
	FORKED();
	HOOK("cuMemSetAccess");
	CUresult no_ro = env_err("WEX_EMUL_NO_PROT_READ", CUDA_ERROR_NOT_SUPPORTED);
	uint64_t cur;

	if (!d || count < 1 || count > (size_t)NDEV)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < count; i++) {
		if (d[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
		    phys(d[i].location.id) < 0 ||
		    (d[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
		     d[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
		     d[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
			return CUDA_ERROR_INVALID_VALUE;
		for (size_t k = 0; k < i; k++)
			if (d[k].location.id == d[i].location.id)
				return CUDA_ERROR_INVALID_VALUE;
		if (d[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ && no_ro != CUDA_SUCCESS)
			return no_ro;
	}
	for (cur = p; cur < p + size;) {
		struct range *r = find_kind(cur, 1);

		if (!r)
			return CUDA_ERROR_INVALID_VALUE; /* not fully mapped */
		/* A device other than the one holding the memory needs peer
		 * access (an ordinal mix-up shows here too, with WEX_EMUL_NO_P2P
		 * or at the first copy). */
		for (size_t i = 0; i < count; i++) {
			const char *refuse = getenv("WEX_EMUL_REFUSE_ACCESS");

			if (r->a->dev >= 0 && !peer_ok(phys(d[i].location.id), r->a->dev))
				return CUDA_ERROR_INVALID_DEVICE;
			if (refuse && *refuse && atoi(refuse) == d[i].location.id &&
			    phys(d[i].location.id) != r->a->dev &&
			    d[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE)
				return CUDA_ERROR_NOT_SUPPORTED;
		}
		cur = r->va + r->size;
	}
	for (cur = p; cur < p + size;) {
		struct range *r = find_kind(cur, 1);
		unsigned all = 0;
		int prot;

		if (r->a->dev < 0) /* an import whose memfd named no device */
			r->a->dev = phys(d[0].location.id);
		r->dev = r->a->dev;
		for (size_t i = 0; i < count; i++) {
			int ph = phys(d[i].location.id);

			/* (Checked above; said again because phys() reads the
			 * environment anew: an index of -1 wrote before acc.) */
			if (ph < 0)
				return CUDA_ERROR_INVALID_VALUE;
			r->acc[ph] = (unsigned char)d[i].flags;
		}
		for (int k = 0; k < NDEV; k++)
			all |= r->acc[k];
		/* The host pages stand for what the most trusted device may do. */
		prot = all == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE :
		       all ? PROT_READ : PROT_NONE;
		if (mprotect((void *)(uintptr_t)r->va, r->size, prot))
			return CUDA_ERROR_INVALID_VALUE;
		cur = r->va + r->size;
	}
	return CUDA_SUCCESS;
}

/* CUDA_SUCCESS when the current context's device may read (and, with
 * `write`, write) [a, a+n) wherever it is VMM-mapped; a reservation with
 * nothing mapped is an illegal address too.  Other memory (host, cuMemAlloc,
 * IPC opens) is reachable from every device. */
static CUresult reach(uint64_t a, uint64_t n, int write)
{
	unsigned need = write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
	uint64_t cur = a, end = a + n;
	int dev;

	if (!ctx_current)
		return CUDA_ERROR_INVALID_CONTEXT;
	dev = phys(cur_ord());
	while (cur < end) {
		struct range *m = find_kind(cur, 1);
		uint64_t next = end;

		if (m) {
			if ((m->acc[dev] & need) != need)
				return CUDA_ERROR_ILLEGAL_ADDRESS;
			cur = m->va + m->size;
			continue;
		}
		if (find_kind(cur, 0))
			return CUDA_ERROR_ILLEGAL_ADDRESS;
		for (size_t i = 0; i < nrs; i++)
			if ((rs[i].kind == 0 || rs[i].kind == 1) && rs[i].va > cur &&
			    rs[i].va < next)
				next = rs[i].va;
		cur = next;
	}
	return CUDA_SUCCESS;
}

#define REACH(a, n, w)                                                             \
	do {                                                                       \
		CUresult reach_r_ = reach((a), (n), (w));                         \
		if (reach_r_ != CUDA_SUCCESS)                                      \
			return reach_r_;                                           \
	} while (0)

static CUresult e_export(void *out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType t,
			 unsigned long long flags)
{
	FORKED();
	struct ealloc *a = (struct ealloc *)(uintptr_t)h;
	int fd;

	if (t == CU_MEM_HANDLE_TYPE_FABRIC) {
		/* The exporter's pid and the allocation's fd (importers open
		 * /proc/<pid>/fd/<fd>, as for legacy IPC handles). */
		CUmemFabricHandle *fh = out;

		if (!fabric() || !(a->types & CU_MEM_HANDLE_TYPE_FABRIC))
			return CUDA_ERROR_INVALID_VALUE;
		memset(fh, 0, sizeof(*fh));
		snprintf((char *)fh->data, sizeof(fh->data), "emulfab %d %d", (int)getpid(), a->fd);
		return CUDA_SUCCESS;
	}
	if (t != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (!(a->types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
		return CUDA_ERROR_INVALID_VALUE;
	fd = dup(a->fd); /* not close-on-exec, like the driver's */
	if (fd < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*(int *)out = fd;
	return CUDA_SUCCESS;
}

static CUresult e_import(CUmemGenericAllocationHandle *h, void *os, CUmemAllocationHandleType t)
{
	FORKED();
	int fd = (int)(uintptr_t)os, pfd = -1, pid = 0, efd = -1;
	struct ealloc *a;
	struct stat st;

	if (t == CU_MEM_HANDLE_TYPE_FABRIC) {
		const CUmemFabricHandle *fh = os;
		char path[64];

		CUresult no = env_err("WEX_EMUL_NO_FABRIC_IMPORT", CUDA_ERROR_NOT_PERMITTED);

		if (!fabric() || sscanf((const char *)fh->data, "emulfab %d %d", &pid, &efd) != 2)
			return CUDA_ERROR_INVALID_VALUE;
		if (no != CUDA_SUCCESS)
			return no; /* an importer without IMEX channel access */
		snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, efd);
		pfd = open(path, O_RDWR | O_CLOEXEC);
		if (pfd < 0)
			return CUDA_ERROR_INVALID_VALUE;
		fd = pfd;
	} else if (t != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	if (fstat(fd, &st) < 0) {
		if (pfd >= 0)
			close(pfd);
		return CUDA_ERROR_INVALID_VALUE;
	}
	a = calloc(1, sizeof(*a));
	a->fd = pfd >= 0 ? pfd : fcntl(fd, F_DUPFD_CLOEXEC, 0);
	a->size = (uint64_t)st.st_size;
	a->refs = 1;
	a->types = (unsigned)t;
	a->dev = -1; /* unless the memfd's name says (else: the first cuMemSetAccess) */
	{
		char path[64], link[128];
		ssize_t n;
		int d;

		snprintf(path, sizeof(path), "/proc/self/fd/%d", a->fd);
		n = readlink(path, link, sizeof(link) - 1);
		if (n > 0) {
			link[n] = '\0';
			if (sscanf(link, "/memfd:emul-vmm-d%d", &d) == 1 && d >= 0 && d < NDEV)
				a->dev = d;
		}
	}
	*h = (CUmemGenericAllocationHandle)(uintptr_t)a;
	return CUDA_SUCCESS;
}

static CUresult e_retain_handle(CUmemGenericAllocationHandle *h, void *addr)
{
	FORKED();
	struct range *r = find_kind((uint64_t)(uintptr_t)addr, 1);

	if (!r)
		return CUDA_ERROR_INVALID_VALUE;
	r->a->refs++;
	*h = (CUmemGenericAllocationHandle)(uintptr_t)r->a;
	return CUDA_SUCCESS;
}

static CUresult e_props(CUmemAllocationProp *p, CUmemGenericAllocationHandle h)
{
	FORKED();
	struct ealloc *a = (struct ealloc *)(uintptr_t)h;

	*p = (CUmemAllocationProp){
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.requestedHandleTypes = (CUmemAllocationHandleType)a->types,
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = a->dev < 0 ? 0 : ord_of(a->dev) },
	};
	return CUDA_SUCCESS;
}

/* VMM: the mapping holding p (one allocation); others: the allocation. */
static CUresult e_addr_range(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
	FORKED();
	struct range *r = find_any(p);

	HOOK("cuMemGetAddressRange");
	if (!ctx_current)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!r || r->kind == 4)
		return CUDA_ERROR_NOT_FOUND;
	if (base)
		*base = r->va;
	if (size)
		*size = r->size;
	return CUDA_SUCCESS;
}

static CUresult e_info(size_t *f, size_t *t)
{
	FORKED();
	*f = TOTAL - used;
	*t = TOTAL;
	return CUDA_SUCCESS;
}

static CUresult e_alloc(CUdeviceptr *p, size_t size)
{
	FORKED();
	UNSAFE();
	struct range *r;
	void *m;
	int fd;

	if (!ctx_current)
		return CUDA_ERROR_INVALID_CONTEXT;
	/* A memfd, so that nothing outlives a killed process; importers open
	 * it through /proc/<pid>/fd (same user, as CUDA IPC requires). */
	fd = memfd_create("emul-ipc", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)size) < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	/* (A hint: where something else took that address, anywhere.) */
	m = mmap(size == freed_size ? (void *)(uintptr_t)freed_va : NULL, size,
		 PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	freed_size = 0;
	r = add_range();
	r->va = (uint64_t)(uintptr_t)m;
	r->size = size;
	r->kind = 2;
	r->fd = fd;
	r->dev = phys(cur_ord());
	snprintf(r->name, sizeof(r->name), "wexemul:%d:%d:%u", (int)getpid(), fd, seq++);
	used += size;
	*p = r->va;
	return CUDA_SUCCESS;
}

static CUresult e_free(CUdeviceptr p)
{
	FORKED();
	UNSAFE();
	struct range *r = find_kind(p, 2);

	flush();
	if (!r || r->va != p)
		return CUDA_ERROR_INVALID_VALUE;
	munmap((void *)(uintptr_t)p, r->size);
	close(r->fd);
	used -= r->size;
	freed_va = p;
	freed_size = r->size;
	del_range(r);
	return CUDA_SUCCESS;
}

static CUresult e_ptr_attr(void *data, CUpointer_attribute a, CUdeviceptr p)
{
	FORKED();
	struct range *r = find_any(p), *res = find_kind(p, 0);
	struct range *span = res ? res : r && r->kind != 4 ? r : NULL;

	HOOK("cuPointerGetAttribute");
	/* WEX_EMUL_PTR_NEEDS_CTX=1: a thread with no current context is
	 * refused (CUDA_ERROR_INVALID_CONTEXT), as real drivers do (Triton
	 * PR 5276, Open MPI PR 783). */
	if (!ctx_current && env_on("WEX_EMUL_PTR_NEEDS_CTX"))
		return CUDA_ERROR_INVALID_CONTEXT;
	/* The range is the reservation's, mapped or not ("not necessarily
	 * the address of the mapped region, but the address of the mappable
	 * address range ptr references (e.g. from cuMemAddressReserve)";
	 * NVIDIA DALI's cu_vm_test reads it, MAPPED 0, on a reservation with
	 * nothing mapped).  Host registrations' ranges are not modelled. */
	switch (a) {
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		if (!span)
			return CUDA_ERROR_INVALID_VALUE;
		*(CUdeviceptr *)data = span->va;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		if (!span)
			return CUDA_ERROR_INVALID_VALUE;
		*(size_t *)data = span->size;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MAPPED:
		if (env_on("WEX_EMUL_MAPPED_ERR"))
			return CUDA_ERROR_INVALID_VALUE; /* see the header */
		if (!span && env_on("WEX_EMUL_MAPPED_ZERO")) {
			*(unsigned char *)data = 0; /* see the header */
			return CUDA_SUCCESS;
		}
		if (!span)
			return CUDA_ERROR_INVALID_VALUE;
		/* "A boolean": one byte, which a bool or a zeroed int reads. */
		*(unsigned char *)data = r != NULL;
		return CUDA_SUCCESS;
	default:
		break;
	}
	if (!r)
		return CUDA_ERROR_INVALID_VALUE; /* not memory the driver knows */
	switch (a) {
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = r->kind == 1 || r->kind == 2 || r->kind == 3 ? ord_of(r->dev) : 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned *)data = r->kind == 4 ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_BUFFER_ID:
		/* "unique ... over a process lifetime. Subsequent allocations do
		 * not reuse IDs from previous freed allocations" (cuda.h). */
		*(unsigned long long *)data = r->id;
		return CUDA_SUCCESS;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
}

static CUresult e_ipc_get(CUipcMemHandle *h, CUdeviceptr p)
{
	FORKED();
	struct range *r = find_kind(p, 2);

	if (!r || r->va != p)
		return CUDA_ERROR_INVALID_VALUE; /* not the base of a cuMemAlloc */
	memset(h, 0, sizeof(*h));
	snprintf(h->reserved, sizeof(h->reserved), "%s", r->name);
	return CUDA_SUCCESS;
}

static CUresult e_ipc_open(CUdeviceptr *p, CUipcMemHandle h, unsigned flags)
{
	FORKED();
	char name[65];
	struct range *r;
	struct stat st;
	void *m;
	int fd;

	memcpy(name, h.reserved, 64);
	name[64] = '\0';
	if (!ctx_current || flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < nrs; i++) {
		if (rs[i].kind == 2 && strcmp(rs[i].name, name) == 0)
			return CUDA_ERROR_INVALID_CONTEXT; /* our own handle */
		if (rs[i].kind != 3 || strcmp(rs[i].name, name) != 0)
			continue;
		/* "If the memory handle has already been opened by the current
		 * context, the reference count on the handle is incremented by
		 * 1 and the existing device pointer is returned" (cuda.h);
		 * older drivers refuse, and so does another context. */
		if (!env_on("WEX_EMUL_IPC_REFCOUNT") || rs[i].dev != phys(cur_ord()))
			return CUDA_ERROR_ALREADY_MAPPED;
		rs[i].opens++;
		*p = rs[i].va;
		return CUDA_SUCCESS;
	}
	{
		char path[64];
		int pid, rfd;

		if (sscanf(name, "wexemul:%d:%d:", &pid, &rfd) != 2)
			return CUDA_ERROR_INVALID_HANDLE;
		snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, rfd);
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd < 0)
			return CUDA_ERROR_INVALID_HANDLE;
	}
	if (fstat(fd, &st) < 0)
		return CUDA_ERROR_INVALID_HANDLE;
	m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	r = add_range();
	r->va = (uint64_t)(uintptr_t)m;
	r->size = (uint64_t)st.st_size;
	r->kind = 3;
	r->opens = 1;
	r->dev = phys(cur_ord());
	snprintf(r->name, sizeof(r->name), "%.63s", name);
	*p = r->va;
	return CUDA_SUCCESS;
}

static CUresult e_ipc_close(CUdeviceptr p)
{
	FORKED();
	struct range *r = find_kind(p, 3);

	if (!ctx_current)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!r || r->va != p)
		return CUDA_ERROR_INVALID_VALUE;
	if (--r->opens > 0)
		return CUDA_SUCCESS; /* an open of the same handle remains */
	drop_pending(r->va, r->size);
	flush();
	munmap((void *)(uintptr_t)p, r->size);
	del_range(r);
	return CUDA_SUCCESS;
}

/* cuIpcOpenMemHandle calls of this process not yet closed. */
API int wex_emul_ipc_opens(void)
{
	int n = 0;

	for (size_t i = 0; i < nrs; i++)
		if (rs[i].kind == 3)
			n += rs[i].opens;
	return n;
}

/* An event belongs to the context current at its creation. */
struct eevent {
	uintptr_t ctx;
	unsigned flags;
};

static struct eevent *ev_new(uintptr_t ctx, unsigned flags)
{
	struct eevent *e = calloc(1, sizeof(*e));

	if (!e)
		abort();
	e->ctx = ctx;
	e->flags = flags;
	return e;
}

/* A handle names the exporting process (as the driver's does). */
static CUresult e_ev_handle(CUipcEventHandle *h, CUevent e)
{
	FORKED();
	if (!e || !(((struct eevent *)e)->flags & CU_EVENT_INTERPROCESS))
		return CUDA_ERROR_INVALID_VALUE;
	memset(h, 0, sizeof(*h));
	snprintf(h->reserved, sizeof(h->reserved), "wexemulev:%d:%p", (int)getpid(), (void *)e);
	return CUDA_SUCCESS;
}

/* The driver refuses to open a handle in the process that exported it
 * (CUDA_ERROR_INVALID_CONTEXT, as for memory handles: PyTorch PR 15974,
 * HIP's test of hipIpcOpenEventHandle against CUDA). */
static CUresult e_ev_open(CUevent *e, CUipcEventHandle h)
{
	FORKED();
	char name[65];
	int pid;

	memcpy(name, h.reserved, 64);
	name[64] = '\0';
	if (!ctx_current)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (sscanf(name, "wexemulev:%d:", &pid) != 1)
		return CUDA_ERROR_INVALID_HANDLE;
	if (pid == (int)getpid())
		return CUDA_ERROR_INVALID_CONTEXT; /* our own event */
	*e = (CUevent)ev_new(ctx_current, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING);
	return CUDA_SUCCESS;
}

static CUresult e_ev_create(CUevent *e, unsigned flags)
{
	FORKED();
	if (!ctx_current)
		return CUDA_ERROR_INVALID_CONTEXT;
	/* "CU_EVENT_INTERPROCESS must be specified along with
	 * CU_EVENT_DISABLE_TIMING." */
	if ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING))
		return CUDA_ERROR_INVALID_VALUE;
	*e = (CUevent)ev_new(ctx_current, flags);
	return CUDA_SUCCESS;
}

static CUresult e_ev_destroy(CUevent e)
{
	FORKED();
	free(e);
	return CUDA_SUCCESS;
}

static uintptr_t stream_ctx(CUstream s);

static CUresult e_ev_record(CUevent e, CUstream s)
{
	FORKED();
	uintptr_t sc = stream_ctx(s);

	if (!sc)
		return CUDA_ERROR_INVALID_CONTEXT;
	/* The event and the stream must be of the same context. */
	if (!e || ((struct eevent *)e)->ctx != sc)
		return CUDA_ERROR_INVALID_HANDLE;
	return CUDA_SUCCESS;
}

static CUresult e_ev_sync(CUevent e)
{
	FORKED();
	flush();
	return take_sticky();
}

static CUresult e_ev_elapsed(float *ms, CUevent a, CUevent b)
{
	FORKED();
	if (!a || !b || ((((struct eevent *)a)->flags | ((struct eevent *)b)->flags) &
			 CU_EVENT_DISABLE_TIMING))
		return CUDA_ERROR_INVALID_HANDLE;
	*ms = 0;
	return CUDA_SUCCESS;
}

static CUresult e_wait_event(CUstream s, CUevent e, unsigned f)
{
	FORKED();
	return CUDA_SUCCESS;
}

/* WEX_EMUL_LOSE_BYTES (see above): whether the next n-byte copy is lost. */
static int lose(size_t n)
{
	static unsigned long long from, to, issued;
	static int parsed;
	unsigned long long at = issued;

	if (!parsed) {
		const char *e = getenv("WEX_EMUL_LOSE_BYTES");

		parsed = 1;
		if (e && sscanf(e, "%llu-%llu", &from, &to) != 2)
			from = to = 0;
	}
	issued += n;
	return at >= from && at < to;
}

/* Copies so far (each cuMemcpy* call, each copy of a batch) that read or
 * wrote host memory not registered with cuMemHostRegister: pageable
 * memory, which a GPU moves through the driver's bounce buffers at a
 * fraction of the link's speed (here it is copied alike; tests count). */
static unsigned long pageable;

/* Whether [a, a+n) is host memory not wholly inside one registration. */
static int pageable_range(uint64_t a, uint64_t n)
{
	struct range *r = find_any(a);

	if (n == 0 || (r && r->kind >= 1 && r->kind <= 3))
		return 0; /* device memory (or nothing copied) */
	r = find_kind(a, 4);
	return !r || a + n > r->va + r->size;
}

static void count_pageable(uint64_t d, uint64_t s, uint64_t n)
{
	if (pageable_range(d, n) || pageable_range(s, n))
		pageable++;
}

/* Copies that moved pageable host memory so far (see above). */
API unsigned long wex_emul_pageable_copies(void)
{
	return pageable;
}

static CUresult e_memcpy(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st)
{
	FORKED();
	HOOK("cuMemcpyAsync");
	REACH(s, n, 0);
	REACH(d, n, 1);
	count_pageable(d, s, n);
	if (lose(n))
		return CUDA_SUCCESS;
	if (deferring()) {
		queue(d, s, n, 0, 0, st);
		return CUDA_SUCCESS;
	}
	memcpy((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n);
	return CUDA_SUCCESS;
}

static CUresult e_htod(CUdeviceptr d, const void *s, size_t n)
{
	FORKED();
	UNSAFE();
	REACH(d, n, 1);
	count_pageable(d, (uint64_t)(uintptr_t)s, n);
	flush_legacy();
	memcpy((void *)(uintptr_t)d, s, n);
	return CUDA_SUCCESS;
}

static CUresult e_dtoh(void *d, CUdeviceptr s, size_t n)
{
	FORKED();
	UNSAFE();
	REACH(s, n, 0);
	count_pageable((uint64_t)(uintptr_t)d, s, n);
	flush_legacy();
	memcpy(d, (const void *)(uintptr_t)s, n);
	return CUDA_SUCCESS;
}

static CUresult e_memset(CUdeviceptr d, unsigned char v, size_t n, CUstream s)
{
	FORKED();
	REACH(d, n, 1);
	if (deferring()) {
		queue(d, 0, n, 1, v, s);
		return CUDA_SUCCESS;
	}
	memset((void *)(uintptr_t)d, v, n);
	return CUDA_SUCCESS;
}

/* WEX_EMUL_SYNC_MS=<ms>: cuCtxSynchronize takes that long, as a GPU
 * still busy with queued work would; signals handled meanwhile end
 * nothing (a driver's wait goes on after them). */
static void slow_sync(void)
{
	const char *e = getenv("WEX_EMUL_SYNC_MS");
	struct timespec end;
	long ms = e ? strtol(e, NULL, 10) : 0;

	if (ms <= 0)
		return;
	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += ms / 1000;
	end.tv_nsec += (ms % 1000) * 1000000L;
	if (end.tv_nsec >= 1000000000L) {
		end.tv_sec++;
		end.tv_nsec -= 1000000000L;
	}
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &end, NULL) == EINTR)
		;
}

/* Waits for the current context's work only, as on a GPU. */
static CUresult e_sync(void)
{
	FORKED();
	UNSAFE();
	CUresult r = ctx_sync_ok();

	slow_sync();
	if (r != CUDA_SUCCESS)
		return r;
	r = e_ok();

	if (r != CUDA_SUCCESS)
		return r;
	flush_ctx(ctx_current);
	return r != CUDA_SUCCESS ? r : take_sticky();
}

/* A 2D/3D copy's base address: host pointer or device (unified) address;
 * arrays are not emulated. */
static int addr_of(CUmemorytype t, const void *host, CUdeviceptr dev, uint64_t *out)
{
	switch (t) {
	case CU_MEMORYTYPE_HOST:
		*out = (uint64_t)(uintptr_t)host;
		return 0;
	case CU_MEMORYTYPE_DEVICE:
	case CU_MEMORYTYPE_UNIFIED:
		*out = dev;
		return 0;
	default:
		return -1;
	}
}

/* Copies `depth` slices of `height` rows of `width` bytes; a row starts at
 * base + ((z0 + z) * slice_rows + y0 + y) * pitch + x0 on either side.
 * Every row is checked for access before any byte moves. */
static CUresult copy3d(uint64_t db, uint64_t dx, uint64_t dy, uint64_t dz, uint64_t dpitch,
		       uint64_t drows, uint64_t sb, uint64_t sx, uint64_t sy, uint64_t sz,
		       uint64_t spitch, uint64_t srows, uint64_t width, uint64_t height,
		       uint64_t depth, CUstream st)
{
	int slow = 0;

	for (int pass = 0; pass < 2; pass++)
		for (uint64_t z = 0; z < depth; z++)
			for (uint64_t y = 0; y < height; y++) {
				uint64_t d = db + ((dz + z) * drows + dy + y) * dpitch + dx;
				uint64_t s = sb + ((sz + z) * srows + sy + y) * spitch + sx;

				if (pass == 0) {
					REACH(s, width, 0);
					REACH(d, width, 1);
					slow |= pageable_range(d, width) || pageable_range(s, width);
					if (z == depth - 1 && y == height - 1)
						pageable += (unsigned long)slow;
				} else if (deferring()) {
					queue(d, s, width, 0, 0, st);
				} else {
					memcpy((void *)(uintptr_t)d, (const void *)(uintptr_t)s,
					       width);
				}
			}
	return CUDA_SUCCESS;
}

/* A pitch must hold the row from its X offset on ("greater than or equal
 * to WidthInBytes + srcXInBytes"), and a copy "returns an error if any
 * pitch is greater than the maximum allowed". */
static int pitch_ok(uint64_t pitch, uint64_t x, uint64_t width)
{
	return pitch >= width + x && pitch <= max_pitch();
}

static CUresult e_memcpy2d(const CUDA_MEMCPY2D *c, CUstream s)
{
	FORKED();
	HOOK("cuMemcpy2DAsync");
	uint64_t sb, db;

	if (addr_of(c->srcMemoryType, c->srcHost, c->srcDevice, &sb) ||
	    addr_of(c->dstMemoryType, c->dstHost, c->dstDevice, &db) ||
	    !pitch_ok(c->srcPitch, c->srcXInBytes, c->WidthInBytes) ||
	    !pitch_ok(c->dstPitch, c->dstXInBytes, c->WidthInBytes))
		return CUDA_ERROR_INVALID_VALUE;
	return copy3d(db, c->dstXInBytes, c->dstY, 0, c->dstPitch, 0, sb, c->srcXInBytes, c->srcY,
		      0, c->srcPitch, 0, c->WidthInBytes, c->Height, 1, s);
}

static CUresult e_memcpy3d(const CUDA_MEMCPY3D *c, CUstream s)
{
	FORKED();
	HOOK("cuMemcpy3DAsync");
	uint64_t sb, db;

	if (addr_of(c->srcMemoryType, c->srcHost, c->srcDevice, &sb) ||
	    addr_of(c->dstMemoryType, c->dstHost, c->dstDevice, &db) ||
	    !pitch_ok(c->srcPitch, c->srcXInBytes, c->WidthInBytes) ||
	    !pitch_ok(c->dstPitch, c->dstXInBytes, c->WidthInBytes) ||
	    (c->Depth > 1 && (c->srcHeight < c->srcY + c->Height ||
			      c->dstHeight < c->dstY + c->Height)) ||
	    c->srcLOD || c->dstLOD || c->reserved0 || c->reserved1)
		return CUDA_ERROR_INVALID_VALUE;
	return copy3d(db, c->dstXInBytes, c->dstY, c->dstZ, c->dstPitch, c->dstHeight, sb,
		      c->srcXInBytes, c->srcY, c->srcZ, c->srcPitch, c->srcHeight, c->WidthInBytes,
		      c->Height, c->Depth, s);
}

static CUresult batch(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count, CUmemcpyAttributes *a,
		      size_t *idx, size_t na, CUstream st)
{
	CUresult r = hook("cuMemcpyBatchAsync");

	if (r != CUDA_SUCCESS)
		return r;
	if (!st || na < 1 || na > count || idx[0] != 0)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < na; i++)
		if (a[i].srcAccessOrder == CU_MEMCPY_SRC_ACCESS_ORDER_INVALID)
			return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < count; i++) {
		REACH(s[i], n[i], 0);
		REACH(d[i], n[i], 1);
	}
	for (size_t i = 0; i < count; i++)
		count_pageable(d[i], s[i], n[i]);
	/* "Copies within a batch are not guaranteed to execute in any
	 * specific order": last first, so that a caller whose copies depend
	 * on each other (one writing what another reads or writes) gets other
	 * bytes than in issue order.  Queued under WEX_EMUL_DEFER=1, as
	 * cuMemcpyAsync is (a batch is asynchronous too). */
	for (size_t i = count; i-- > 0;) {
		if (lose(n[i]))
			continue;
		if (deferring())
			queue(d[i], s[i], n[i], 0, 0, st);
		else
			memcpy((void *)(uintptr_t)d[i], (const void *)(uintptr_t)s[i], n[i]);
	}
	return CUDA_SUCCESS;
}

static CUresult e_batch13(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count,
			  CUmemcpyAttributes *a, size_t *idx, size_t na, CUstream st)
{
	FORKED();
	return batch(d, s, n, count, a, idx, na, st);
}

static CUresult e_batch12(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count,
			  CUmemcpyAttributes *a, size_t *idx, size_t na, size_t *fail, CUstream st)
{
	FORKED();
	return batch(d, s, n, count, a, idx, na, st);
}

/*
 * Whether [va, va+size) is mapped in this process, every page of it, and
 * (when want_write) writable: what the driver's page pinning needs.
 */
static int host_mapped(uint64_t va, uint64_t size, int want_write)
{
	FILE *f = fopen("/proc/self/maps", "r");
	uint64_t at = va, end = va + size;
	char line[512];

	if (!f)
		return 0;
	while (at < end && fgets(line, sizeof(line), f)) {
		unsigned long long lo, hi;
		char perm[8];

		if (sscanf(line, "%llx-%llx %7s", &lo, &hi, perm) != 3)
			continue;
		if (lo > at)
			break; /* a hole (the file is sorted by address) */
		if (hi <= at)
			continue;
		if (perm[0] != 'r' || (want_write && perm[1] != 'w'))
			break;
		at = hi;
	}
	fclose(f);
	return at >= end;
}

/* Pinning: needs a current context; a read-only mapping only with
 * CU_MEMHOSTREGISTER_READ_ONLY, which a device without
 * READ_ONLY_HOST_REGISTER_SUPPORTED (WEX_EMUL_NO_RO_HOSTREG=1) refuses;
 * no page may be registered twice. */
static CUresult e_host_reg(void *p, size_t size, unsigned flags)
{
	FORKED();
	HOOK("cuMemHostRegister");
	UNSAFE();
	uint64_t va = (uint64_t)(uintptr_t)p;
	struct range *r;

	if (!ctx_current)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!p || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if ((flags & CU_MEMHOSTREGISTER_READ_ONLY) && env_on("WEX_EMUL_NO_RO_HOSTREG"))
		return CUDA_ERROR_NOT_SUPPORTED;
	for (size_t i = 0; i < nrs; i++)
		if (rs[i].kind == 4 && va < rs[i].va + rs[i].size && rs[i].va < va + size)
			return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
	if (!host_mapped(va, size, !(flags & CU_MEMHOSTREGISTER_READ_ONLY)))
		return CUDA_ERROR_INVALID_VALUE;
	r = add_range();
	r->va = va;
	r->size = size;
	r->kind = 4;
	r->flags = flags;
	return CUDA_SUCCESS;
}

/* Takes the registered base only; the range must still be mapped (an
 * unmap before the unregister is a bug in the caller). */
static CUresult e_host_unreg(void *p)
{
	FORKED();
	HOOK("cuMemHostUnregister");
	UNSAFE();
	struct range *r = find_kind((uint64_t)(uintptr_t)p, 4);

	if (!r || r->va != (uint64_t)(uintptr_t)p)
		return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
	/* DMA still queued on the pages when they stop being pinned: the
	 * copy faults (reported by the next synchronisation). */
	drop_pending(r->va, r->size);
	flush();
	if (!host_mapped(r->va, r->size, 0)) {
		fprintf(stderr, "emul_cuda: cuMemHostUnregister(%p) after the range was unmapped\n", p);
		return CUDA_ERROR_INVALID_VALUE;
	}
	del_range(r);
	return CUDA_SUCCESS;
}

/* cuMemHostAlloc: page-locked host memory, modelled as an anonymous
 * mapping registered as cuMemHostRegister does (kind 4). */
static CUresult e_host_alloc(void **pp, size_t size, unsigned flags)
{
	void *m;
	CUresult r;

	(void)flags;
	if (!pp || !size)
		return CUDA_ERROR_INVALID_VALUE;
	m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	r = e_host_reg(m, size, 0);
	if (r != CUDA_SUCCESS) {
		munmap(m, size);
		return r;
	}
	*pp = m;
	return CUDA_SUCCESS;
}

static CUresult e_host_free(void *p)
{
	struct range *r = find_kind((uint64_t)(uintptr_t)p, 4);
	size_t size = r ? r->size : 0;
	CUresult res;

	if (!r || r->va != (uint64_t)(uintptr_t)p)
		return CUDA_ERROR_INVALID_VALUE;
	res = e_host_unreg(p);
	if (res == CUDA_SUCCESS)
		munmap(p, size);
	return res;
}

/* Managed and stream-ordered pool memory: modelled as cuMemAlloc's (the
 * pool's allocation is complete at once; cuMemFree and cuMemFreeAsync
 * free either). */
static CUresult e_alloc_managed(CUdeviceptr *p, size_t size, unsigned flags)
{
	(void)flags;
	return e_alloc(p, size);
}

static CUresult e_alloc_async(CUdeviceptr *p, size_t size, CUstream s)
{
	(void)s;
	return e_alloc(p, size);
}

static CUresult e_free_async(CUdeviceptr p, CUstream s)
{
	(void)s;
	return e_free(p);
}

static CUresult e_host_flags(unsigned *flags, void *p)
{
	FORKED();
	struct range *r = find_kind((uint64_t)(uintptr_t)p, 4);

	if (!r)
		return CUDA_ERROR_INVALID_VALUE;
	*flags = r->flags;
	return CUDA_SUCCESS;
}

/* Host ranges registered now (cuMemHostRegister not yet undone). */
API int wex_emul_host_regs(void)
{
	int n = 0;

	for (size_t i = 0; i < nrs; i++)
		n += rs[i].kind == 4;
	return n;
}

static CUresult e_host_devptr(CUdeviceptr *d, void *p, unsigned flags)
{
	FORKED();
	*d = (CUdeviceptr)(uintptr_t)p;
	return CUDA_SUCCESS;
}

/* Streams, the test kernel and graphs. */
struct launch {
	uint64_t src, dst;
	unsigned n, threads;
};

struct estream {
	uintptr_t ctx; /* the context current at creation */
	unsigned flags; /* CU_STREAM_NON_BLOCKING or 0 */
	int capturing;
	CUstreamCaptureMode mode;  /* of the capture in progress */
	unsigned long breaks;      /* capture_breaks when it began */
	unsigned long cbreaks;     /* its context's ctx_breaks then */
	struct launch l[16];
	int nl;
};

/* NULL: the current context's legacy stream. */
static uintptr_t stream_ctx(CUstream s)
{
	return s ? ((struct estream *)s)->ctx : ctx_current;
}

static CUresult e_stream_create(CUstream *s, unsigned flags)
{
	FORKED();
	struct estream *es;

	if (!ctx_current)
		return CUDA_ERROR_INVALID_CONTEXT;
	es = calloc(1, sizeof(*es));
	if (!es)
		abort();
	es->ctx = ctx_current;
	es->flags = flags;
	*s = (CUstream)es;
	return CUDA_SUCCESS;
}

static void capture_done(struct estream *es);

static int stream_blocking(CUstream s)
{
	return !s || !(((struct estream *)s)->flags & CU_STREAM_NON_BLOCKING);
}

static CUresult e_stream_destroy(CUstream s)
{
	FORKED();
	/* A capture in progress ends with its stream. */
	if (s && ((struct estream *)s)->capturing)
		capture_done((struct estream *)s);
	free(s);
	return CUDA_SUCCESS;
}

static CUresult e_stream_sync(CUstream s)
{
	FORKED();
	if (!stream_ctx(s))
		return CUDA_ERROR_INVALID_CONTEXT; /* the legacy stream of no context */
	flush_ctx(stream_ctx(s));
	return take_sticky();
}

static const char kernel_name[] = "wex_copy_u32";

static CUresult e_mod_load(CUmodule *m, const void *image)
{
	FORKED();
	if (!strstr(image, ".entry wex_copy_u32"))
		return CUDA_ERROR_INVALID_PTX;
	*m = (CUmodule)(uintptr_t)0x2000;
	return CUDA_SUCCESS;
}

static CUresult e_mod_func(CUfunction *f, CUmodule m, const char *name)
{
	FORKED();
	if (strcmp(name, kernel_name))
		return CUDA_ERROR_NOT_FOUND;
	*f = (CUfunction)(uintptr_t)kernel_name;
	return CUDA_SUCCESS;
}

static CUresult e_mod_unload(CUmodule m)
{
	FORKED();
	return CUDA_SUCCESS;
}

static void run(const struct launch *l)
{
	for (unsigned i = 0; i < l->n && i < l->threads; i++)
		((uint32_t *)(uintptr_t)l->dst)[i] = ((const uint32_t *)(uintptr_t)l->src)[i];
}

/* Contexts given peer access (cuCtxEnablePeerAccess): peer_on[a][b], a's
 * context reaches memory b's context allocated or opened.  Physical
 * devices. */
static unsigned char peer_on[NDEV_MAX][NDEV_MAX];

static CUresult e_enable_peer(CUcontext peer, unsigned flags)
{
	FORKED();
	uintptr_t pc = (uintptr_t)peer;
	int me, other;

	if (!ctx_current)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (flags || pc < CTX(0) || pc > CTX(nvis() - 1) || (pc - CTX(0)) % (CTX(1) - CTX(0)))
		return CUDA_ERROR_INVALID_VALUE;
	me = phys(cur_ord());
	other = phys((int)((pc - CTX(0)) / (CTX(1) - CTX(0))));
	if (me == other)
		return CUDA_ERROR_INVALID_DEVICE;
	if (!peer_ok(me, other))
		return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
	if (peer_on[me][other])
		return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
	peer_on[me][other] = 1;
	return CUDA_SUCCESS;
}

/* What a kernel of the current context may touch: VMM mappings as for
 * copies (reach), and cuMemAlloc memory and IPC opens of another device's
 * context only with peer access to it.  (Copies need no peer access: the
 * driver stages them.) */
static CUresult kernel_reach(uint64_t a, uint64_t n, int write)
{
	CUresult r = reach(a, n, write);
	int dev;

	if (r != CUDA_SUCCESS)
		return r;
	dev = phys(cur_ord());
	for (size_t i = 0; i < nrs; i++)
		if ((rs[i].kind == 2 || rs[i].kind == 3) && rs[i].va < a + n &&
		    a < rs[i].va + rs[i].size && rs[i].dev != dev && !peer_on[dev][rs[i].dev])
			return CUDA_ERROR_ILLEGAL_ADDRESS;
	return CUDA_SUCCESS;
}

static CUresult kernel_check(const struct launch *l)
{
	uint64_t n = (uint64_t)(l->n < l->threads ? l->n : l->threads) * 4;
	CUresult r;

	if (!n)
		return CUDA_SUCCESS;
	r = kernel_reach(l->src, n, 0);
	return r != CUDA_SUCCESS ? r : kernel_reach(l->dst, n, 1);
}

static CUresult e_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
			 unsigned by, unsigned bz, unsigned shm, CUstream s, void **params, void **extra)
{
	FORKED();
	struct estream *es = (struct estream *)s;
	struct launch l;

	flush();
	if ((const char *)f != kernel_name || !params)
		return CUDA_ERROR_INVALID_VALUE;
	l = (struct launch){ .src = *(uint64_t *)params[0], .dst = *(uint64_t *)params[1],
			     .n = *(unsigned *)params[2], .threads = gx * bx };
	{
		CUresult kr = kernel_check(&l);

		if (kr != CUDA_SUCCESS)
			return kr;
	}
	if (es && es->capturing) {
		if (es->nl == 16)
			return CUDA_ERROR_INVALID_VALUE;
		es->l[es->nl++] = l;
		return CUDA_SUCCESS;
	}
	run(&l);
	return CUDA_SUCCESS;
}

static CUresult e_begin_capture(CUstream s, CUstreamCaptureMode mode)
{
	FORKED();
	struct estream *es = (struct estream *)s;

	if (!es)
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	if (es->capturing || (mode != CU_STREAM_CAPTURE_MODE_GLOBAL &&
			      mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
			      mode != CU_STREAM_CAPTURE_MODE_RELAXED))
		return CUDA_ERROR_INVALID_VALUE;
	es->capturing = 1;
	es->nl = 0;
	es->mode = mode;
	es->breaks = __atomic_load_n(&capture_breaks, __ATOMIC_RELAXED);
	es->cbreaks = __atomic_load_n(&ctx_breaks[ctx_ord(es->ctx)], __ATOMIC_RELAXED);
	__atomic_fetch_add(&ctx_captures[ctx_ord(es->ctx)], 1, __ATOMIC_RELAXED);
	if (mode != CU_STREAM_CAPTURE_MODE_RELAXED)
		own_strict++;
	if (mode == CU_STREAM_CAPTURE_MODE_GLOBAL) {
		own_global++;
		__atomic_fetch_add(&captures_global, 1, __ATOMIC_RELAXED);
	}
	return CUDA_SUCCESS;
}

/* Ends in the thread that began it (the tests do; CUDA requires it for
 * GLOBAL and THREAD_LOCAL captures). */
static void capture_done(struct estream *es)
{
	__atomic_fetch_sub(&ctx_captures[ctx_ord(es->ctx)], 1, __ATOMIC_RELAXED);
	if (es->mode != CU_STREAM_CAPTURE_MODE_RELAXED)
		own_strict--;
	if (es->mode == CU_STREAM_CAPTURE_MODE_GLOBAL) {
		own_global--;
		__atomic_fetch_sub(&captures_global, 1, __ATOMIC_RELAXED);
	}
	es->capturing = 0;
}

static CUresult e_xchg_mode(CUstreamCaptureMode *mode)
{
	FORKED();
	CUstreamCaptureMode old = thread_mode;

	if (!mode || (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL &&
		      *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
		      *mode != CU_STREAM_CAPTURE_MODE_RELAXED))
		return CUDA_ERROR_INVALID_VALUE;
	thread_mode = *mode;
	*mode = old;
	return CUDA_SUCCESS;
}

static CUresult e_end_capture(CUstream s, CUgraph *g)
{
	FORKED();
	struct estream *es = (struct estream *)s, *copy;

	if (!es || !es->capturing)
		return CUDA_ERROR_ILLEGAL_STATE;
	capture_done(es);
	if ((es->mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
	     __atomic_load_n(&capture_breaks, __ATOMIC_RELAXED) != es->breaks) ||
	    __atomic_load_n(&ctx_breaks[ctx_ord(es->ctx)], __ATOMIC_RELAXED) != es->cbreaks) {
		*g = NULL;
		return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	}
	copy = malloc(sizeof(*copy));
	*copy = *es;
	*g = (CUgraph)copy;
	return CUDA_SUCCESS;
}

static CUresult e_instantiate(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
	FORKED();
	struct estream *copy = malloc(sizeof(*copy));

	*copy = *(struct estream *)g;
	*e = (CUgraphExec)copy;
	return CUDA_SUCCESS;
}

static CUresult e_graph_launch(CUgraphExec e, CUstream s)
{
	FORKED();
	struct estream *g = (struct estream *)e;

	flush();
	for (int i = 0; i < g->nl; i++) {
		CUresult kr = kernel_check(&g->l[i]);

		if (kr != CUDA_SUCCESS)
			return kr;
	}
	for (int i = 0; i < g->nl; i++)
		run(&g->l[i]);
	return CUDA_SUCCESS;
}

static CUresult e_graph_free(void *g)
{
	FORKED();
	free(g);
	return CUDA_SUCCESS;
}

static const struct {
	const char *name;
	void *fn;
} table[] = {
	{ "cuInit", (void *)e_init },
	{ "cuDriverGetVersion", (void *)e_version },
	{ "cuGetErrorString", (void *)e_errname },
	{ "cuGetErrorName", (void *)e_errname },
	{ "cuDeviceGet", (void *)e_dev_get },
	{ "cuDeviceGetCount", (void *)e_dev_count },
	{ "cuDeviceGetUuid", (void *)e_uuid },
	{ "cuDeviceGetAttribute", (void *)e_attr },
	{ "cuDeviceCanAccessPeer", (void *)e_can_peer },
	{ "cuDevicePrimaryCtxRetain", (void *)e_retain },
	{ "cuDevicePrimaryCtxGetState", (void *)e_ctx_state },
	{ "cuCtxSetCurrent", (void *)e_set_cur },
	{ "cuCtxEnablePeerAccess", (void *)e_enable_peer },
	{ "cuCtxGetCurrent", (void *)e_get_cur },
	{ "cuCtxGetDevice", (void *)e_ctx_dev },
	{ "cuCtxSynchronize", (void *)e_sync },
	{ "cuMemCreate", (void *)e_create },
	{ "cuMemRelease", (void *)e_release },
	{ "cuMemMap", (void *)e_map },
	{ "cuMemUnmap", (void *)e_unmap },
	{ "cuMemSetAccess", (void *)e_access },
	{ "cuMemAddressReserve", (void *)e_reserve },
	{ "cuMemAddressFree", (void *)e_addr_free },
	{ "cuMemGetAllocationGranularity", (void *)e_gran },
	{ "cuMemExportToShareableHandle", (void *)e_export },
	{ "cuMemImportFromShareableHandle", (void *)e_import },
	{ "cuMemRetainAllocationHandle", (void *)e_retain_handle },
	{ "cuMemGetAllocationPropertiesFromHandle", (void *)e_props },
	{ "cuMemGetAddressRange", (void *)e_addr_range },
	{ "cuMemGetInfo", (void *)e_info },
	{ "cuMemAlloc", (void *)e_alloc },
	{ "cuMemFree", (void *)e_free },
	{ "cuPointerGetAttribute", (void *)e_ptr_attr },
	{ "cuIpcGetMemHandle", (void *)e_ipc_get },
	{ "cuIpcOpenMemHandle", (void *)e_ipc_open },
	{ "cuIpcCloseMemHandle", (void *)e_ipc_close },
	{ "cuIpcGetEventHandle", (void *)e_ev_handle },
	{ "cuIpcOpenEventHandle", (void *)e_ev_open },
	{ "cuMemcpyAsync", (void *)e_memcpy },
	{ "cuMemcpy2DAsync", (void *)e_memcpy2d },
	{ "cuMemcpy3DAsync", (void *)e_memcpy3d },
	{ "cuMemcpyHtoD", (void *)e_htod },
	{ "cuMemcpyDtoH", (void *)e_dtoh },
	{ "cuMemsetD8Async", (void *)e_memset },
	{ "cuMemHostRegister", (void *)e_host_reg },
	{ "cuMemHostUnregister", (void *)e_host_unreg },
	{ "cuMemHostGetFlags", (void *)e_host_flags },
	{ "cuMemHostAlloc", (void *)e_host_alloc },
	{ "cuMemFreeHost", (void *)e_host_free },
	{ "cuMemAllocManaged", (void *)e_alloc_managed },
	{ "cuMemAllocAsync", (void *)e_alloc_async },
	{ "cuMemFreeAsync", (void *)e_free_async },
	{ "cuMemHostGetDevicePointer", (void *)e_host_devptr },
	{ "cuStreamCreate", (void *)e_stream_create },
	{ "cuStreamDestroy", (void *)e_stream_destroy },
	{ "cuStreamSynchronize", (void *)e_stream_sync },
	{ "cuStreamWaitEvent", (void *)e_wait_event },
	{ "cuEventCreate", (void *)e_ev_create },
	{ "cuEventRecord", (void *)e_ev_record },
	{ "cuEventSynchronize", (void *)e_ev_sync },
	{ "cuEventElapsedTime", (void *)e_ev_elapsed },
	{ "cuEventDestroy", (void *)e_ev_destroy },
	{ "cuModuleLoadData", (void *)e_mod_load },
	{ "cuModuleGetFunction", (void *)e_mod_func },
	{ "cuModuleUnload", (void *)e_mod_unload },
	{ "cuLaunchKernel", (void *)e_launch },
	{ "cuStreamBeginCapture", (void *)e_begin_capture },
	{ "cuStreamEndCapture", (void *)e_end_capture },
	{ "cuThreadExchangeStreamCaptureMode", (void *)e_xchg_mode },
	{ "cuGraphInstantiateWithFlags", (void *)e_instantiate },
	{ "cuGraphLaunch", (void *)e_graph_launch },
	{ "cuGraphDestroy", (void *)e_graph_free },
	{ "cuGraphExecDestroy", (void *)e_graph_free },
};

API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int ver, cuuint64_t flags,
				 CUdriverProcAddressQueryResult *st)
{
	int drv = drv_version();

	*pfn = NULL;
	/* "If the specified CUDA version is greater than the driver version,
	 * the API will return CUDA_ERROR_INVALID_VALUE"; a symbol this
	 * driver lacks, or one newer than `ver`, is CUDA_SUCCESS with pfn
	 * NULL and the status saying which (cuda.h). */
	if (ver > drv)
		return CUDA_ERROR_INVALID_VALUE;
	if (strcmp(symbol, "cuMemcpyBatchAsync") == 0) {
		if (drv >= 12080 && ver >= 12080)
			*pfn = ver >= 13000 ? (void *)e_batch13 : (void *)e_batch12;
		if (st)
			*st = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS :
			      drv >= 12080 ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT :
					     CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
		return CUDA_SUCCESS;
	}
	for (size_t i = 0; !*pfn && i < sizeof(table) / sizeof(table[0]); i++)
		if (strcmp(table[i].name, symbol) == 0)
			*pfn = table[i].fn;
	if (st)
		*st = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	return CUDA_SUCCESS;
}
