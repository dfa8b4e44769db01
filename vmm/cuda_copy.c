/* SPDX-License-Identifier: MIT */
/*
 * cuda_copy.c - the GPU copy executor shared by the CUDA backends, and the
 * ordering helpers (stream sync, interprocess events).
 *
 * A plan's operations are issued on one dedicated non-blocking stream per
 * device: contiguous ones (and strided ones whose rows happen to abut) are
 * gathered into cuMemcpyBatchAsync calls when the driver has it (12.8+),
 * one-level strided ones become cuMemcpy2DAsync, two-level ones with
 * compatible strides cuMemcpy3DAsync, and anything else is cut into 2D
 * slices or rows.  Then the stream is synchronised once.
 *
 * Nothing here orders one op (or row) against another: the copies of a
 * batch run in no particular order, and a 2D/3D copy is issued at once,
 * ahead of the batched copies gathered before it.  That is right because
 * the ops of a plan are independent (the planner writes every element
 * once, and sources are the producer's memory), as for the host executor,
 * which runs them on several threads.  Callers must keep it so.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wex.h"
#include "src/log.h"
#include "vmm/cudawrap.h"
#include "vmm/cuda_backend.h"

#define BATCH_MAX 4096
/* GPUs one copy slot call spreads over (vmm/cudawrap.c knows 64). */
#define COPY_MAX_DEVICES 64

struct batch {
	CUstream s;
	size_t n;
	CUdeviceptr dst[BATCH_MAX];
	CUdeviceptr src[BATCH_MAX];
	size_t len[BATCH_MAX];
	long op[BATCH_MAX]; /* the index in the caller's ops of each copy */
	long cur;           /* the op being issued */
};

/* The ops [lo, hi] a failed call was copying (wex__copy_fail), the first
 * failure's. */
static void fail_ops(long lo, long hi)
{
	if (wex__copy_fail.op_lo < 0) {
		wex__copy_fail.op_lo = lo;
		wex__copy_fail.op_hi = hi;
	}
}

/* Cleared when the driver says it does not support batches, so that it
 * costs one failed call per process, not one per sync. */
static int batch_usable = 1;
static int batch_warned;

/* Says once per process why copies go one call each (never silently). */
static void warn_per_copy(const char *why)
{
	if (!__atomic_exchange_n(&batch_warned, 1, __ATOMIC_RELAXED))
		wex_warn("cuda", "copies are issued one cuMemcpyAsync each, not batched: %s", why);
}

/* WEX_CUDA_BATCH=0 (or wex__cuda_copy_batch(0)): one cuMemcpyAsync per
 * copy, said once; -1 until the variable is read. */
static int batch_off = -1;

/* -1 -> what WEX_CUDA_BATCH says, unless a setter came first. */
static int batch_off_now(void)
{
	int off = __atomic_load_n(&batch_off, __ATOMIC_RELAXED);

	if (off < 0) {
		const char *env = getenv("WEX_CUDA_BATCH");
		int want = env && strcmp(env, "0") == 0, unset = -1;

		if (!__atomic_compare_exchange_n(&batch_off, &unset, want, 0, __ATOMIC_RELAXED,
						 __ATOMIC_RELAXED))
			want = unset;
		off = want;
	}
	return off;
}

int wex__cuda_copy_batch(int on)
{
	int was = !batch_off_now();

	__atomic_store_n(&batch_off, !on, __ATOMIC_RELAXED);
	return was;
}

static int batch_wanted(void)
{
	int off = batch_off_now();

	if (off)
		warn_per_copy("batching is off (WEX_CUDA_BATCH=0, or turned off by the program)");
	return !off;
}

static int flush(struct batch *b)
{
	CUmemcpyAttributes attr = { .srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM };
	size_t idx = 0;
	CUresult r = CUDA_ERROR_NOT_SUPPORTED;
	int ret = 0;

	if (b->n == 0)
		return 0;
	if (b->n > 1 && __atomic_load_n(&batch_usable, __ATOMIC_RELAXED) && batch_wanted()) {
		if (wex__cu.cuMemcpyBatchAsync13) {
			r = wex__cu.cuMemcpyBatchAsync13(b->dst, b->src, b->len, b->n, &attr, &idx, 1,
							 b->s);
		} else if (wex__cu.cuMemcpyBatchAsync12) {
			size_t fail = 0;

			r = wex__cu.cuMemcpyBatchAsync12(b->dst, b->src, b->len, b->n, &attr, &idx, 1,
							 &fail, b->s);
		}
		if (r == CUDA_SUCCESS) {
			b->n = 0;
			return 0;
		}
		if (!wex__cu.cuMemcpyBatchAsync13 && !wex__cu.cuMemcpyBatchAsync12) {
			char why[96];

			snprintf(why, sizeof(why), "driver %d has no cuMemcpyBatchAsync (12.8 and later)",
				 wex__cu.driver_version);
			warn_per_copy(why);
		} else if (r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_INVALID_VALUE) {
			char why[96];

			/* Copies of a refused batch may have been queued:
			 * issuing them again writes the same bytes.  Only an
			 * unsupported API stops batching for good; a refused
			 * batch (INVALID_VALUE: this mix of memories) goes one
			 * by one this time. */
			snprintf(why, sizeof(why), "cuMemcpyBatchAsync returned %s", wex__cuda_errname(r));
			warn_per_copy(why);
			if (r == CUDA_ERROR_NOT_SUPPORTED)
				__atomic_store_n(&batch_usable, 0, __ATOMIC_RELAXED);
		} else {
			fail_ops(b->op[0], b->op[b->n - 1]);
			b->n = 0;
			return wex__cuda_err(r, "cuMemcpyBatchAsync");
		}
	}
	for (size_t i = 0; i < b->n && !ret; i++) {
		ret = WEX_CU(wex__cu.cuMemcpyAsync(b->dst[i], b->src[i], b->len[i], b->s));
		if (ret)
			fail_ops(b->op[i], b->op[i]);
	}
	b->n = 0;
	return ret;
}

static int add1d(struct batch *b, uint64_t dst, uint64_t src, uint64_t len)
{
	if (len == 0)
		return 0;
	if (b->n == BATCH_MAX) {
		int ret = flush(b);

		if (ret)
			return ret;
	}
	b->dst[b->n] = (CUdeviceptr)dst;
	b->src[b->n] = (CUdeviceptr)src;
	b->len[b->n] = (size_t)len;
	b->op[b->n] = b->cur;
	b->n++;
	return 0;
}

/* 2D: `height` rows of `len` bytes, pitches > 0 and >= len (the driver's
 * rule); -EINVAL when the shape does not fit, so the caller cuts rows. */
static int copy2d(struct batch *b, uint64_t dst, int64_t dpitch, uint64_t src, int64_t spitch,
		  uint64_t len, uint64_t height)
{
	CUDA_MEMCPY2D c = {
		.srcMemoryType = CU_MEMORYTYPE_UNIFIED,
		.srcDevice = (CUdeviceptr)src,
		.srcPitch = (size_t)spitch,
		.dstMemoryType = CU_MEMORYTYPE_UNIFIED,
		.dstDevice = (CUdeviceptr)dst,
		.dstPitch = (size_t)dpitch,
		.WidthInBytes = (size_t)len,
		.Height = (size_t)height,
	};
	CUresult r;

	if (spitch <= 0 || dpitch <= 0 || (uint64_t)spitch < len || (uint64_t)dpitch < len)
		return -EINVAL;
	r = wex__cu.cuMemcpy2DAsync(&c, b->s);
	/* A pitch above the device limit, or one the driver does not take
	 * for this pair of memories ("may fail for pitches not computed by
	 * cuMemAllocPitch"): the caller cuts the copy into rows, and says so
	 * once (a slow path is never silent). */
	if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_NOT_SUPPORTED) {
		static int warned;

		if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
			wex_warn("cuda", "cuMemcpy2DAsync refused a strided copy (%s; pitches %lld/%lld, "
				 "%llu-byte rows): such copies go one row per call",
				 wex__cuda_errname(r), (long long)spitch, (long long)dpitch,
				 (unsigned long long)len);
		return -EINVAL;
	}
	return wex__cuda_err(r, "cuMemcpy2DAsync");
}

static int copy_rows(struct batch *b, uint64_t dst, int64_t dstride, uint64_t src, int64_t sstride,
		     uint64_t len, uint64_t rows)
{
	int ret = 0;

	for (uint64_t i = 0; i < rows && !ret; i++)
		ret = add1d(b, dst + (uint64_t)((int64_t)i * dstride),
			    src + (uint64_t)((int64_t)i * sstride), len);
	return ret;
}

/* Innermost strided level: 2D when the driver takes it, else rows. */
static int copy_level0(struct batch *b, const struct wex_copy_op *op, uint64_t dst, uint64_t src)
{
	int ret;

	if (op->count[0] == 1)
		return add1d(b, dst, src, op->len);
	ret = copy2d(b, dst, op->dst_stride[0], src, op->src_stride[0], op->len, op->count[0]);
	if (ret != -EINVAL)
		return ret;
	return copy_rows(b, dst, op->dst_stride[0], src, op->src_stride[0], op->len, op->count[0]);
}

/* 3D when both outer strides are whole multiples of the pitch (the driver
 * expresses a slice stride as pitch * height). */
static int copy3d(struct batch *b, const struct wex_copy_op *op)
{
	int64_t sp = op->src_stride[0], dp = op->dst_stride[0];
	int64_t ss = op->src_stride[1], ds = op->dst_stride[1];
	CUresult r;

	if (sp <= 0 || dp <= 0 || (uint64_t)sp < op->len || (uint64_t)dp < op->len ||
	    ss <= 0 || ds <= 0 || ss % sp || ds % dp || (uint64_t)(ss / sp) < op->count[0] ||
	    (uint64_t)(ds / dp) < op->count[0])
		return -EINVAL;
	CUDA_MEMCPY3D c = {
		.srcMemoryType = CU_MEMORYTYPE_UNIFIED,
		.srcDevice = (CUdeviceptr)op->src,
		.srcPitch = (size_t)sp,
		.srcHeight = (size_t)(ss / sp),
		.dstMemoryType = CU_MEMORYTYPE_UNIFIED,
		.dstDevice = (CUdeviceptr)op->dst,
		.dstPitch = (size_t)dp,
		.dstHeight = (size_t)(ds / dp),
		.WidthInBytes = (size_t)op->len,
		.Height = (size_t)op->count[0],
		.Depth = (size_t)op->count[1],
	};
	r = wex__cu.cuMemcpy3DAsync(&c, b->s);
	if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_NOT_SUPPORTED)
		return -EINVAL; /* as for 2D: the caller cuts it smaller */
	return wex__cuda_err(r, "cuMemcpy3DAsync");
}

/* True when every level's stride equals the bytes of the levels inside it
 * on both sides: the op is one contiguous run. */
static int contiguous(const struct wex_copy_op *op, uint64_t *total)
{
	uint64_t inner = op->len;

	for (uint32_t i = 0; i < op->nouter; i++) {
		if (op->count[i] > 1 && (op->src_stride[i] != (int64_t)inner ||
					 op->dst_stride[i] != (int64_t)inner))
			return 0;
		inner *= op->count[i];
	}
	*total = inner;
	return 1;
}

static int issue(struct batch *b, const struct wex_copy_op *op)
{
	uint64_t total, c1, c2;
	int ret;

	if (op->nouter > 3)
		return -EINVAL;
	for (uint32_t i = 0; i < op->nouter; i++)
		if (op->count[i] == 0)
			return 0;
	if (op->len == 0)
		return 0;
	if (contiguous(op, &total))
		return add1d(b, op->dst, op->src, total);
	if (op->nouter == 1)
		return copy_level0(b, op, op->dst, op->src);
	if (op->nouter == 2) {
		ret = copy3d(b, op);
		if (ret != -EINVAL)
			return ret;
	}
	/* General case: one 2D slice (or its rows) per outer index. */
	c1 = op->count[1];
	c2 = op->nouter > 2 ? op->count[2] : 1;
	for (uint64_t k = 0; k < c2; k++) {
		for (uint64_t j = 0; j < c1; j++) {
			int64_t so = (int64_t)j * op->src_stride[1], d = (int64_t)j * op->dst_stride[1];

			if (op->nouter > 2) {
				so += (int64_t)k * op->src_stride[2];
				d += (int64_t)k * op->dst_stride[2];
			}
			ret = copy_level0(b, op, op->dst + (uint64_t)d, op->src + (uint64_t)so);
			if (ret)
				return ret;
		}
	}
	return 0;
}

/* The device whose context runs the copies: the destination's when it is
 * GPU memory (the engine's weights), else the source's (a GPU producer into
 * host memory), else the thread's current one. */
static int pick_device(const struct wex_copy_op *ops, size_t n, int dev, int *out)
{
	if (dev >= 0) {
		*out = dev;
		return 0;
	}
	if (n > 0 && (dev = wex__cuda_ptr_on_gpu(ops[0].dst)) >= 0) {
		*out = dev;
		return 0;
	}
	if (n > 0 && (dev = wex__cuda_ptr_on_gpu(ops[0].src)) >= 0) {
		*out = dev;
		return 0;
	}
	if (n > 0 && wex__cuda_ptr_device(ops[0].dst, out) == 0)
		return 0;
	*out = 0;
	return 0;
}

int wex__cuda_copy_async(const struct wex_copy_op *ops, size_t n, int dev)
{
	struct batch *b;
	int ret;

	ret = wex__cuda_load();
	if (ret)
		return ret;
	pick_device(ops, n, dev, &dev);
	ret = wex__cuda_use_device(dev);
	if (ret)
		return ret;
	/* ~100 KiB: too large for a thread's stack frame. */
	b = malloc(sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->n = 0;
	ret = wex__cuda_stream(dev, &b->s);
	for (size_t i = 0; i < n && !ret; i++) {
		/* Folded first, as the host executor does: an older wexd
		 * sends ops as planned (levels of one index, listed outermost
		 * first), which issue() would cut into a copy per index of
		 * their last level rather than one 3D copy. */
		struct wex_copy_op f = ops[i];

		wex_mem_fold_op(&f);
		b->cur = (long)i;
		ret = issue(b, &f);
		if (ret)
			fail_ops((long)i, (long)i);
	}
	if (!ret)
		ret = flush(b);
	free(b);
	return ret;
}

int wex__cuda_copy_sync(int dev)
{
	CUstream s;
	int ret;

	ret = wex__cuda_use_device(dev);
	if (ret)
		return ret;
	ret = wex__cuda_stream(dev, &s);
	if (ret)
		return ret;
	return WEX_CU(wex__cu.cuStreamSynchronize(s));
}

/* Copies whose first one writes host memory: each runs on the GPU its
 * destination lies on, else on its source's (a consumer whose layout is
 * host memory maps an import for its owner only, so another GPU cannot
 * read it; a layout mixing host pieces with GPU ones has imports mapped
 * for its GPU too, but the GPU pieces are reached by that GPU alone when
 * they are VMM memory, as PyTorch's expandable segments are), the ops of
 * one GPU in one go, those touching no GPU with the first GPU's; then
 * waits for every GPU used, after an error too.  1 when they span at most
 * one GPU (nothing done: the caller's single-device path serves, on
 * *single, or where it picks when that is -1). */
static int copy_by_device(const struct wex_copy_op *ops, size_t n, int *single)
{
	int devs[COPY_MAX_DEVICES], ndev = 0, ret = 0;
	struct wex_copy_op *sub;
	int *of;

	of = malloc(n * sizeof(*of));
	if (!of)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		int d = wex__cuda_ptr_on_gpu(ops[i].dst), k = 0;

		if (d < 0)
			d = wex__cuda_ptr_on_gpu(ops[i].src);

		of[i] = d;
		while (d >= 0 && k < ndev && devs[k] != d)
			k++;
		if (d >= 0 && k == ndev && ndev < COPY_MAX_DEVICES)
			devs[ndev++] = d;
	}
	if (ndev < 2) {
		*single = ndev ? devs[0] : -1;
		free(of);
		return 1;
	}
	sub = malloc(n * sizeof(*sub));
	if (!sub) {
		free(of);
		return -ENOMEM;
	}
	for (int k = 0; k < ndev && !ret; k++) {
		size_t m = 0;
		long lo, hi;

		for (size_t i = 0; i < n; i++)
			if (of[i] == devs[k] || (k == 0 && of[i] < 0))
				sub[m++] = ops[i];
		ret = wex__cuda_copy_async(sub, m, devs[k]);
		/* wex__copy_fail's ops: back to indexes in ops. */
		lo = wex__copy_fail.op_lo;
		hi = wex__copy_fail.op_hi;
		for (size_t i = 0, j = 0; ret && i < n; i++)
			if (of[i] == devs[k] || (k == 0 && of[i] < 0)) {
				if ((long)j == lo)
					wex__copy_fail.op_lo = (long)i;
				if ((long)j == hi)
					wex__copy_fail.op_hi = (long)i;
				j++;
			}
	}
	for (int k = 0; k < ndev; k++) {
		int sret = wex__cuda_copy_sync(devs[k]);

		if (!ret)
			ret = sret;
	}
	free(sub);
	free(of);
	return ret;
}

/* The copy slot: issue, then wait, so that the caller may release its
 * lease (guarantee 3: a lease ends only after the copies completed). */
int wex__cuda_copy(const struct wex_copy_op *ops, size_t n, int threads)
{
	int dev, ret, sret;

	ret = wex__cuda_load();
	if (ret)
		return ret;
	if (n == 0)
		return 0;
	dev = -1;
	if (n > 1 && wex__cuda_ptr_on_gpu(ops[0].dst) < 0 &&
	    (ret = copy_by_device(ops, n, &dev)) != 1)
		return ret;
	if (dev < 0)
		pick_device(ops, n, -1, &dev);
	ret = wex__cuda_copy_async(ops, n, dev);
	/* Wait even after an error: queued copies must not outlive the call. */
	sret = wex__cuda_copy_sync(dev);
	return ret ? ret : sret;
}

int wex__cuda_stream_sync(void *stream)
{
	int ret = wex__cuda_load();

	if (ret)
		return ret;
	return WEX_CU(wex__cu.cuStreamSynchronize((CUstream)stream));
}

int wex__cuda_sync_device(const struct wex_mem_seg *seg)
{
	CUcontext prev = NULL;
	int dev, ret = wex__cuda_load();

	if (ret)
		return ret;
	/* The caller's thread keeps its current context (PyTorch derives
	 * its current device from it). */
	if (wex__cu.cuCtxGetCurrent(&prev) != CUDA_SUCCESS)
		prev = NULL;
	/* By address first: it names the device of the memory itself. */
	if (wex__cuda_ptr_device((uint64_t)(uintptr_t)seg->ptr, &dev) < 0 &&
	    wex__cuda_device_by_uuid(seg->desc.device, &dev) < 0)
		return -ENODEV;
	ret = wex__cuda_use_device(dev);
	/* Every stream of the context, blocking or not: PyTorch's side
	 * streams are created non-blocking, so the legacy default stream
	 * alone would not cover them. */
	if (!ret)
		ret = WEX_CU(wex__cu.cuCtxSynchronize());
	/* (Also after a failed switch, which may have left another.) */
	if (prev)
		wex__cu.cuCtxSetCurrent(prev);
	return ret;
}

/*
 * Interprocess events this process recorded.  The driver refuses to open
 * a handle in the process that exported it (cuIpcOpenEventHandle:
 * CUDA_ERROR_INVALID_CONTEXT, as for memory handles; platform-facts B), so
 * a wait in the same process (producer and consumer in one process, or
 * the tests) waits on the event itself.  Entries go with
 * wex__cuda_event_destroy; a child forked after a record does not share
 * them (pid).
 */
struct local_event {
	struct local_event *next;
	unsigned char h[64];
	CUevent e;
	pid_t pid;
};

static pthread_mutex_t ev_lock = PTHREAD_MUTEX_INITIALIZER;
static struct local_event *ev_list;

int wex__cuda_event_record(int dev, void *stream, void **ev, unsigned char handle[64])
{
	struct local_event *le;
	CUipcEventHandle h;
	CUevent e;
	int ret;

	/* The event must belong to the stream's context (driver rule), and
	 * cuEventCreate needs one current. */
	ret = wex__cuda_use_device(dev);
	if (ret)
		return ret;
	/* Interprocess events must not time (driver rule). */
	ret = WEX_CU(wex__cu.cuEventCreate(&e, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
	if (ret)
		return ret;
	ret = WEX_CU(wex__cu.cuEventRecord(e, (CUstream)stream));
	if (ret)
		goto err_destroy;
	ret = WEX_CU(wex__cu.cuIpcGetEventHandle(&h, e));
	if (ret)
		goto err_destroy;
	le = calloc(1, sizeof(*le));
	if (!le) {
		ret = -ENOMEM;
		goto err_destroy;
	}
	memcpy(le->h, h.reserved, 64);
	le->e = e;
	le->pid = getpid();
	pthread_mutex_lock(&ev_lock);
	le->next = ev_list;
	ev_list = le;
	pthread_mutex_unlock(&ev_lock);
	memcpy(handle, h.reserved, 64);
	*ev = e;
	return 0;
err_destroy:
	wex__cu.cuEventDestroy(e);
	return ret;
}

int wex__cuda_event_wait(const unsigned char handle[64], void *stream, int dev)
{
	CUipcEventHandle h;
	CUstream s = (CUstream)stream;
	CUevent e;
	int ret;

	ret = wex__cuda_use_device(dev);
	if (ret)
		return ret;
	if (!s) {
		ret = wex__cuda_stream(dev, &s);
		if (ret)
			return ret;
	}
	/* Recorded here: wait on the event itself (a stream may wait for an
	 * event of another context).  Under the lock, so that no destroy
	 * runs meanwhile. */
	pthread_mutex_lock(&ev_lock);
	for (struct local_event *le = ev_list; le; le = le->next)
		if (le->pid == getpid() && memcmp(le->h, handle, 64) == 0) {
			ret = WEX_CU(wex__cu.cuStreamWaitEvent(s, le->e, 0));
			pthread_mutex_unlock(&ev_lock);
			return ret;
		}
	pthread_mutex_unlock(&ev_lock);
	memcpy(h.reserved, handle, 64);
	ret = WEX_CU(wex__cu.cuIpcOpenEventHandle(&e, h));
	if (ret)
		return ret;
	ret = WEX_CU(wex__cu.cuStreamWaitEvent(s, e, 0));
	/* The wait is enqueued; destroying our reference is allowed at once
	 * (the driver keeps the event until the wait resolves). */
	wex__cu.cuEventDestroy(e);
	return ret;
}

int wex__cuda_event_destroy(void *ev)
{
	struct local_event *gone = NULL;
	int ret = wex__cuda_load();

	if (ret)
		return ret;
	pthread_mutex_lock(&ev_lock);
	for (struct local_event **pp = &ev_list; *pp; pp = &(*pp)->next)
		if ((*pp)->e == (CUevent)ev && (*pp)->pid == getpid()) {
			gone = *pp;
			*pp = gone->next;
			break;
		}
	pthread_mutex_unlock(&ev_lock);
	free(gone);
	return WEX_CU(wex__cu.cuEventDestroy((CUevent)ev));
}
