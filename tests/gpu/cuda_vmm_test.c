/* SPDX-License-Identifier: MIT */
/*
 * cuda_vmm_test.c - cuda_vmm segments on a GPU (label gpu; exits 77 with
 * the reason when there is no driver or device).  Two processes per case,
 * joined by a socketpair that carries the descriptor and the fd
 * (SCM_RIGHTS); no daemon.
 *   export_import  alloc, export, import elsewhere, read back, in-place copy
 *   leak_import    1000 import/release cycles: fd count and free memory steady
 *   leak_alloc     1000 alloc/export/release cycles, same checks
 *   killed         a consumer killed mid-copy leaves the producer healthy
 *   wrap_chunks    wrap of foreign exportable memory (wex_cuda_alloc, and a
 *                  two-chunk range like PyTorch expandable segments),
 *                  chunk enumeration (a range past the address space is
 *                  -EINVAL), multi-chunk import; fabric-only
 *                  memory imported from its handle, or, where the
 *                  importer may not import fabric handles (emulated with
 *                  WEX_EMUL_NO_FABRIC_IMPORT: no IMEX channel), refused
 *                  with -EPERM and an error naming IMEX (memory with an fd
 *                  as well imports through the fd: every other case)
 *   readonly       an import is read-only: a CPU store through it faults
 *                  (emulated driver; on a GPU a device address always does)
 *                  and, emulated, a copy into it fails; where the driver
 *                  refuses read-only mappings (emulated with
 *                  WEX_EMUL_NO_PROT_READ=1) the import is read-write and
 *                  wex__cuda_vmm_readonly() says 0, whatever the error
 *                  (NOT_SUPPORTED, NOT_PERMITTED, UNKNOWN); a sticky one
 *                  (ILLEGAL_ADDRESS) fails the import instead
 *   peer           access_dev: an import that device 1 must reach is
 *                  copied from on device 1, and (emulated) the consumer
 *                  has not retained the owner's primary context for it; a
 *                  copy into host memory (run on the owner's device)
 *                  reads it too; without it
 *                  (emulated) such a copy fails; without peer access the
 *                  import is refused (-EOPNOTSUPP), its fd closed
 *   event_context  wex__cuda_event_record makes its device's context
 *                  current: it works from a thread with no context or
 *                  another device's, on that device's stream (the emulated
 *                  driver refuses an event of one context recorded on a
 *                  stream of another, and one created without a context);
 *                  wex__cuda_event_wait in the recording process itself
 *                  works (the driver refuses to open one's own handle)
 *   fd_limit       more exportable allocations than the soft limit on
 *                  open files: the limit is raised to the hard one and
 *                  all are made; at the hard limit an allocation fails
 *                  with EMFILE, saying why
 *   oom_quiet      an allocation larger than the GPU: -ENOMEM, logged at
 *                  info, no error line (PyTorch frees its cache and asks
 *                  again)
 *   fork_child     a child forked after the driver was loaded gets
 *                  -WEX_ENOCUDA from every call, with a reason naming the
 *                  parent
 */
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "gpu_util.h"

enum { OP_SEG = 1, OP_DONE, OP_NEXT, OP_STARTED, OP_SEG2, OP_EVENT, OP_NONE };

static const struct wex_mem_ops *vmm;

#define SZ ((8u << 20) + 123u)

static void p_export(int sock)
{
	struct wex_mem_seg seg;
	int before;

	/* The driver keeps fds of its own from cuInit, the first context and
	 * the first interprocess event on: count after them. */
	CHECK_OK(wex__cuda_use_device(0));
	{
		struct wex_mem_desc ed = { 0 };
		void *ev;

		CHECK_OK(wex__cuda_event_record(0, NULL, &ev, ed.handle));
		CHECK_OK(wex__cuda_event_destroy(ev));
	}
	/* ... and from the first allocation, copy from host memory and
	 * release on (driver state made lazily): one round first. */
	CHECK_OK(vmm->alloc(SZ, 0, &seg));
	dev_fill((uint64_t)(uintptr_t)seg.ptr, SZ, 1);
	CHECK(dev_check((uint64_t)(uintptr_t)seg.ptr, SZ, 1, 0));
	CHECK_OK(vmm->release(&seg));
	before = fd_count();
	CHECK_OK(vmm->alloc(SZ, 0, &seg));
	CHECK(seg.desc.alloc_size >= SZ && seg.desc.size == SZ && seg.fd >= 0);
	CHECK(strlen(seg.desc.device) >= 36);
	printf("  device %s, allocation %llu bytes\n", seg.desc.device,
	       (unsigned long long)seg.desc.alloc_size);
	dev_fill((uint64_t)(uintptr_t)seg.ptr, SZ, 1);
	tsend(sock, OP_SEG, &seg.desc, 0, seg.fd);
	/* Ordering through an interprocess event (the alternative to a
	 * stream sync before publishing). */
	{
		struct wex_mem_desc ed = { 0 };
		void *ev;

		CHECK_OK(wex__cuda_event_record(0, NULL, &ev, ed.handle));
		tsend(sock, OP_EVENT, &ed, 0, -1);
		trecv(sock, OP_DONE, NULL);
		CHECK_OK(wex__cuda_event_destroy(ev));
	}
	/* Still ours and intact after the consumer let go. */
	CHECK(dev_check((uint64_t)(uintptr_t)seg.ptr, SZ, 1, 0));
	CHECK_OK(vmm->release(&seg));
	CHECK_FDS(before);
}

/* Imports the segment of `d` through fd (which import takes over), reads
 * it, copies it in place through the executor into a buffer of ours,
 * checks that, and lets it all go. */
static void import_copy_release(const struct wex_mem_desc *d, int fd)
{
	struct wex_mem_seg seg;
	struct wex_copy_op op;
	CUdeviceptr dst;

	CHECK_OK(vmm->import(d, fd, -1, &seg));
	CHECK(dev_check((uint64_t)(uintptr_t)seg.ptr, SZ, 1, 0));
	CU_OK(wex__cu.cuMemAlloc(&dst, SZ));
	op = (struct wex_copy_op){ .src = (uint64_t)(uintptr_t)seg.ptr, .dst = dst, .len = SZ };
	CHECK_OK(vmm->copy(&op, 1, 1));
	CHECK(dev_check(dst, SZ, 1, 0));
	CU_OK(wex__cu.cuMemFree(dst));
	CHECK_OK(vmm->release(&seg));
}

static void c_import(int sock)
{
	int fd, fd2, before;
	struct tmsg m = trecv(sock, OP_SEG, &fd), me = trecv(sock, OP_EVENT, NULL);

	CHECK(fd >= 0);
	/* The producer's fill is complete once its event is: wait for it on
	 * the stream dev_check reads on (the legacy one).  The driver's own
	 * fds (cuInit, context, the event) are open by now; the segment's fd
	 * is counted and import takes it over. */
	CHECK_OK(wex__cuda_use_device(0));
	CHECK_OK(wex__cuda_event_wait(me.desc.handle, NULL, 0));
	CU_OK(wex__cu.cuCtxSynchronize());
	/* The driver may keep fds from the first import, executor copy and
	 * release on: one round first, on a second fd of the same memory. */
	fd2 = dup(fd);
	CHECK(fd2 >= 0);
	import_copy_release(&m.desc, fd2);
	before = fd_count() - 1;
	import_copy_release(&m.desc, fd);
	CHECK_FDS(before);
	tsend(sock, OP_DONE, NULL, 0, -1);
}

/* A tenth under compute-sanitizer (gpu_util.h). */
#define CYCLES cycles(1000)

static void p_leak(int sock)
{
	struct wex_mem_seg seg;

	CHECK_OK(wex__cuda_use_device(0));
	CHECK_OK(vmm->alloc(2u << 20, 0, &seg));
	dev_fill((uint64_t)(uintptr_t)seg.ptr, 4096, 3);
	for (int i = 0; i < CYCLES; i++) {
		trecv(sock, OP_NEXT, NULL);
		tsend(sock, OP_SEG, &seg.desc, 0, seg.fd);
	}
	trecv(sock, OP_DONE, NULL);
	CHECK_OK(vmm->release(&seg));
}

static void c_leak(int sock)
{
	uint64_t free0 = 0;
	int fds0 = 0;

	for (int i = 0; i < CYCLES; i++) {
		struct wex_mem_seg seg;
		struct tmsg m;
		int fd;

		tsend(sock, OP_NEXT, NULL, 0, -1);
		m = trecv(sock, OP_SEG, &fd);
		CHECK_OK(vmm->import(&m.desc, fd, -1, &seg));
		if (i % 100 == 0)
			CHECK(dev_check((uint64_t)(uintptr_t)seg.ptr, 4096, 3, 0));
		CHECK_OK(vmm->release(&seg));
		if (i == 0) {
			fds0 = fd_count();
			free0 = mem_free();
		}
	}
	printf("  consumer: fds %d -> %d, free %llu -> %llu MiB\n", fds0, fd_count(),
	       (unsigned long long)(free0 >> 20), (unsigned long long)(mem_free() >> 20));
	CHECK_FDS(fds0);
	/* Another process shares the GPU: allow its noise, not a leak of
	 * 1000 x 2 MiB. */
	CHECK(mem_free() + (64u << 20) >= free0);
	tsend(sock, OP_DONE, NULL, 0, -1);
}

static void leak_alloc(void)
{
	uint64_t free0 = 0;
	int fds0 = 0;

	CHECK_OK(wex__cuda_use_device(0));
	for (int i = 0; i < CYCLES; i++) {
		struct wex_mem_seg seg;

		CHECK_OK(vmm->alloc(2u << 20, 0, &seg));
		CHECK_OK(vmm->release(&seg));
		if (i == 0) {
			fds0 = fd_count();
			free0 = mem_free();
		}
	}
	printf("  fds %d -> %d, free %llu -> %llu MiB\n", fds0, fd_count(),
	       (unsigned long long)(free0 >> 20), (unsigned long long)(mem_free() >> 20));
	CHECK_FDS(fds0);
	CHECK(mem_free() + (64u << 20) >= free0);
}

/* More exportable allocations than the soft limit on open files (each
 * holds its exported fd while it lives: a trainer's memory pool of more
 * than ~1000 segments under the usual 1024): the limit is raised to the
 * hard one once hit, and every allocation is made; where the hard limit
 * is hit too, the allocation fails with EMFILE (not an out-of-memory
 * error that sends one hunting for GPU memory).  Each is tried twice, the
 * second time with one more fd open: a driver that holds an fd of its own
 * per allocation (the emulator) runs out at cuMemCreate in one parity and
 * at the export in the other. */
#define FD_ALLOCS 100

static void fd_limit(void)
{
	struct rlimit rl;
	void *p[FD_ALLOCS];
	int i, n0, shift, extra = -1, ret = 0;

	CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
	if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 4 * FD_ALLOCS) {
		printf("  hard limit %llu on open files: not tried\n", (unsigned long long)rl.rlim_max);
		return;
	}
	for (shift = 0; shift < 2; shift++) {
		if (shift)
			CHECK((extra = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0);
		rl.rlim_cur = 64;
		CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
		n0 = fd_count();
		for (i = 0; i < FD_ALLOCS; i++)
			CHECK_OK(wex_cuda_malloc(2u << 20, 0, &p[i]));
		CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
		printf("  %d fds open, then %d allocations; soft limit now %llu\n", n0, FD_ALLOCS,
		       (unsigned long long)rl.rlim_cur);
		CHECK(rl.rlim_cur > 64);
		for (i = 0; i < FD_ALLOCS; i++)
			wex_cuda_free(p[i], 2u << 20, 0, NULL);
	}
	/* (A forked child's CUDA is refused: lowered here for good.) */
	rl.rlim_cur = rl.rlim_max = (rlim_t)fd_count() + 16;
	CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
	for (shift = 0; shift < 2; shift++) {
		if (shift)
			close(extra);
		n0 = fd_count();
		for (i = 0; i < FD_ALLOCS && (ret = wex_cuda_malloc(2u << 20, 0, &p[i])) == 0; i++)
			;
		printf("  hard limit %llu, %d fds open: %d allocations, then %s\n",
		       (unsigned long long)rl.rlim_max, n0, i, wex_strerror(ret));
		CHECK(ret == -EMFILE && i < FD_ALLOCS);
		while (i-- > 0)
			wex_cuda_free(p[i], 2u << 20, 0, NULL);
	}
}

/* An allocation larger than the GPU (1 TiB): -ENOMEM, logged at info
 * only, with no error line: PyTorch's allocator takes a NULL as its cue to
 * free its cache and ask again, and raises its own OutOfMemoryError if
 * that fails too, so an error line at each flush would cry wolf. */
static void oom_quiet(void)
{
	char path[] = "/tmp/wex-oom-XXXXXX", buf[4096];
	int fd = mkstemp(path), saved = dup(2);
	void *p = NULL;
	ssize_t n;

	CHECK(fd >= 0 && saved >= 0);
	unlink(path);
	CHECK(dup2(fd, 2) == 2);
	n = wex_cuda_malloc(1ull << 40, 0, &p);
	CHECK(dup2(saved, 2) == 2);
	close(saved);
	CHECK(n == -ENOMEM && p == NULL);
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	close(fd);
	CHECK(n > 0);
	buf[n] = '\0';
	printf("  logged: %s", buf);
	CHECK(strstr(buf, "cuda info: wex_cuda_alloc(1099511627776 bytes, device 0): out of GPU memory"));
	CHECK(!strstr(buf, " error: "));
}

#define BIG (64u << 20)

static int killed(void)
{
	int sv[2], fd, st;
	pid_t pc;

	printf("killed\n");
	fflush(stdout);
	if (under_sanitizer()) {
		/* A CUDA child SIGKILLed on purpose is one of the tool's targets. */
		printf("  not tried under compute-sanitizer\n");
		return 0;
	}
	pair(sv);
	pc = fork();
	CHECK(pc >= 0);
	if (pc == 0) {
		/* Consumer: import, queue many copies, report, and wait to die. */
		struct wex_mem_seg seg;
		struct tmsg m;
		CUdeviceptr dst;

		close(sv[0]);
		m = trecv(sv[1], OP_SEG, &fd);
		CHECK_OK(vmm->import(&m.desc, fd, -1, &seg));
		CU_OK(wex__cu.cuMemAlloc(&dst, BIG));
		for (int i = 0; i < 200; i++) {
			struct wex_copy_op op = { .src = (uint64_t)(uintptr_t)seg.ptr, .dst = dst,
						  .len = BIG };

			CHECK_OK(wex__cuda_copy_async(&op, 1, 0));
		}
		tsend(sv[1], OP_STARTED, NULL, (uint64_t)getpid(), -1);
		for (;;)
			pause();
	}
	close(sv[1]);
	pid_t pp = fork();

	CHECK(pp >= 0);
	if (pp == 0) {
		struct wex_mem_seg seg, seg2;
		char c;

		CHECK_OK(wex__cuda_use_device(0));
		CHECK_OK(vmm->alloc(BIG, 0, &seg));
		dev_fill((uint64_t)(uintptr_t)seg.ptr, BIG, 5);
		tsend(sv[0], OP_SEG, &seg.desc, 0, seg.fd);
		struct tmsg m = trecv(sv[0], OP_STARTED, NULL);

		CHECK(kill((pid_t)m.a, SIGKILL) == 0);
		/* EOF on the socket: the consumer is gone. */
		CHECK(read(sv[0], &c, 1) == 0);
		CU_OK(wex__cu.cuCtxSynchronize());
		CHECK(dev_check((uint64_t)(uintptr_t)seg.ptr, BIG, 5, 0));
		CHECK_OK(vmm->alloc(BIG, 0, &seg2));
		CHECK_OK(vmm->release(&seg2));
		CHECK_OK(vmm->release(&seg));
		fflush(NULL);
		_exit(0);
	}
	close(sv[0]);
	waitpid(pc, &st, 0);
	CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	int ret = wait_ok(pp, "producer");

	printf("killed: %s\n", ret ? "FAIL" : "ok");
	return ret;
}

static void p_wrap(int sock)
{
	CUmemAllocationProp prop = gpu_vmm_prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CUmemAccessDesc acc = gpu_rw_access();
	CUmemGenericAllocationHandle h[2];
	struct wex__cuda_chunk ch[4];
	struct wex_mem_seg w, w0, w1, tmp;
	struct wex_mem_desc d;
	uint64_t base, size;
	CUdeviceptr va;
	size_t g, n = 0;
	char *p;
	int fd;

	CHECK_OK(wex__cuda_use_device(0));
	/* 1. Memory from the pluggable-allocator entry point. */
	p = wex_cuda_alloc((4u << 20) + 5, 0, NULL);
	CHECK(p);
	CHECK_OK(wex__cuda_alloc_lookup(p + 100, &base, &size, &d, &fd));
	CHECK(base == (uint64_t)(uintptr_t)p && size >= (4u << 20) + 5 && fd >= 0);
	close(fd);
	dev_fill((uint64_t)(uintptr_t)p, 4u << 20, 7);
	CHECK_OK(vmm->wrap(p + 4096, 1u << 20, -1, &w));
	CHECK(w.desc.handle_offset == 4096 && w.fd >= 0 && w.owner == 0);
	tsend(sock, OP_SEG, &w.desc, 0, w.fd);
	trecv(sock, OP_DONE, NULL);
	CHECK_OK(vmm->release(&w));
	wex_cuda_free(p, (4u << 20) + 5, 0, NULL);

	/* 2. Two allocations mapped back to back, as expandable segments do. */
	CU_OK(wex__cu.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	CU_OK(wex__cu.cuMemAddressReserve(&va, 2 * g, g, 0, 0));
	for (int i = 0; i < 2; i++) {
		CU_OK(wex__cu.cuMemCreate(&h[i], g, &prop, 0));
		CU_OK(wex__cu.cuMemMap(va + i * g, g, 0, h[i], 0));
	}
	CU_OK(wex__cu.cuMemSetAccess(va, 2 * g, &acc, 1));
	dev_fill(va, 2 * g, 9);
	CHECK_OK(wex__cuda_vmm_chunks((void *)(uintptr_t)(va + 100), 2 * g - 200, ch, 4, &n));
	printf("  chunks: %zu (%#llx+%llu@%llu, ...)\n", n, (unsigned long long)ch[0].base,
	       (unsigned long long)ch[0].size, (unsigned long long)ch[0].offset);
	CHECK(n == 2 && ch[0].base == va && ch[0].offset == 100 && ch[1].base == va + g &&
	      ch[1].offset == 0);
	CHECK(vmm->wrap((void *)(uintptr_t)(va + 100), 2 * g - 200, -1, &tmp) == -E2BIG);
	/* A range past the end of the address space: its end wrapped below
	 * its start, no chunk was found and an unwritten one was wrapped. */
	CHECK(wex__cuda_vmm_chunks((void *)(uintptr_t)va, UINT64_MAX - 100, ch, 4, &n) == -EINVAL);
	CHECK(vmm->wrap((void *)(uintptr_t)va, UINT64_MAX - 100, -1, &tmp) == -EINVAL);
	CHECK_OK(vmm->wrap((void *)(uintptr_t)(va + 100), g - 100, -1, &w0));
	CHECK_OK(vmm->wrap((void *)(uintptr_t)(va + g), g - 100, -1, &w1));
	tsend(sock, OP_SEG, &w0.desc, 0, w0.fd);
	tsend(sock, OP_SEG2, &w1.desc, 0, w1.fd);
	trecv(sock, OP_DONE, NULL);
	CHECK_OK(vmm->release(&w0));
	CHECK_OK(vmm->release(&w1));
	CU_OK(wex__cu.cuMemUnmap(va, g));
	CU_OK(wex__cu.cuMemUnmap(va + g, g));
	CU_OK(wex__cu.cuMemRelease(h[0]));
	CU_OK(wex__cu.cuMemRelease(h[1]));
	CU_OK(wex__cu.cuMemAddressFree(va, 2 * g));
}

static void c_wrap(int sock)
{
	struct wex_mem_desc ds[2];
	struct wex_mem_seg seg;
	struct tmsg m;
	int fds[2];

	m = trecv(sock, OP_SEG, &fds[0]);
	CHECK_OK(vmm->import(&m.desc, fds[0], -1, &seg));
	CHECK(dev_check((uint64_t)(uintptr_t)seg.ptr, 1u << 20, 7, 4096));
	CHECK_OK(vmm->release(&seg));
	tsend(sock, OP_DONE, NULL, 0, -1);

	m = trecv(sock, OP_SEG, &fds[0]);
	ds[0] = m.desc;
	m = trecv(sock, OP_SEG2, &fds[1]);
	ds[1] = m.desc;
	CHECK_OK(wex__cuda_vmm_import_chunks(ds, fds, 2, -1, &seg));
	CHECK(seg.desc.size == ds[0].alloc_size + ds[1].alloc_size - 100);
	CHECK(dev_check((uint64_t)(uintptr_t)seg.ptr, seg.desc.size - 100, 9, 100));
	CHECK_OK(vmm->release(&seg));
	tsend(sock, OP_DONE, NULL, 0, -1);
}

/* Memory made with fabric handles only (what PyTorch's expandable
 * segments are where IMEX works): wrapped with no fd, imported from the
 * 64-byte handle alone.  Where the driver refuses fabric-only memory
 * (no IMEX channel, the usual single node) this pair says so and checks
 * nothing more. */
static void p_fabric(int sock)
{
	CUmemAllocationProp prop = gpu_vmm_prop(CU_MEM_HANDLE_TYPE_FABRIC);
	CUmemAccessDesc acc = gpu_rw_access();
	CUmemGenericAllocationHandle h;
	CUmemFabricHandle fh;
	struct wex_mem_seg w;
	CUdeviceptr va;
	size_t g;
	CUresult r;
	int ret;

	CHECK_OK(wex__cuda_use_device(0));
	/* A driver without fabric support may refuse the property already
	 * (CUDA_ERROR_NOT_SUPPORTED): the same as a refused cuMemCreate. */
	r = wex__cu.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r == CUDA_SUCCESS)
		r = wex__cu.cuMemCreate(&h, 2 * g, &prop, 0);
	if (r != CUDA_SUCCESS) {
		printf("  fabric-only memory refused here (%s): not tried\n", wex__cuda_errname(r));
		tsend(sock, OP_NONE, NULL, 0, -1);
		return;
	}
	CU_OK(wex__cu.cuMemAddressReserve(&va, 2 * g, g, 0, 0));
	CU_OK(wex__cu.cuMemMap(va, 2 * g, 0, h, 0));
	CU_OK(wex__cu.cuMemSetAccess(va, 2 * g, &acc, 1));
	dev_fill(va, 2 * g, 11);
	ret = vmm->wrap((void *)(uintptr_t)(va + 4096), g, -1, &w);
	r = wex__cu.cuMemExportToShareableHandle(&fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0);
	if (r != CUDA_SUCCESS) {
		/* Created, but its handle does not export (a driver that takes
		 * the type where fabric does not work): refused, as it must. */
		printf("  fabric-only memory created but not exportable here (%s): wrap refuses it\n",
		       wex__cuda_errname(r));
		CHECK(ret == -EOPNOTSUPP);
		tsend(sock, OP_NONE, NULL, 0, -1);
	} else {
		CHECK_OK(ret);
		CHECK(w.fd < 0 && w.desc.handle_len == 64 && w.desc.handle_offset == 4096);
		tsend(sock, OP_SEG, &w.desc, 0, -1);
		trecv(sock, OP_DONE, NULL);
		CHECK_OK(vmm->release(&w));
	}
	CU_OK(wex__cu.cuMemUnmap(va, 2 * g));
	CU_OK(wex__cu.cuMemRelease(h));
	CU_OK(wex__cu.cuMemAddressFree(va, 2 * g));
}

/* vmm->import(d) with this process's stderr in a memfd: its result, and
 * what wex logged in `log` (echoed to stderr too). */
static int import_logged(const struct wex_mem_desc *d, struct wex_mem_seg *seg, char *log,
			 size_t len)
{
	int mfd = memfd_create("wex-log", MFD_CLOEXEC), saved = dup(2), ret;
	ssize_t got;

	CHECK(mfd >= 0 && saved >= 0 && dup2(mfd, 2) == 2);
	ret = vmm->import(d, -1, -1, seg);
	CHECK(dup2(saved, 2) == 2);
	close(saved);
	got = pread(mfd, log, len - 1, 0);
	log[got > 0 ? got : 0] = '\0';
	close(mfd);
	fputs(log, stderr);
	return ret;
}

static void c_fabric(int sock)
{
	struct wex_mem_seg seg;
	struct tmsg m;
	int fd;

	CHECK_OK(wex__cuda_load());
	CHECK_OK(recv_msg(sock, &m, sizeof(m), &fd));
	if (m.op == OP_NONE)
		return;
	CHECK(m.op == OP_SEG && fd < 0);
	if (emulated() && getenv("WEX_EMUL_NO_FABRIC_IMPORT")) {
		/* No IMEX channel here: the import fails, saying so, and
		 * leaves nothing behind. */
		char log[4096];
		int before;

		/* The driver's own fds (first context) are not the import's. */
		CHECK_OK(wex__cuda_use_device(0));
		before = fd_count();

		CHECK(import_logged(&m.desc, &seg, log, sizeof(log)) == -EPERM);
		CHECK(strstr(log, "IMEX") && strstr(log, "CUDA_ERROR_NOT_PERMITTED"));
		CHECK_FDS(before);
		printf("  fabric-only memory, fabric import refused: -EPERM naming IMEX\n");
		tsend(sock, OP_DONE, NULL, 0, -1);
		return;
	}
	CHECK_OK(vmm->import(&m.desc, -1, -1, &seg));
	CHECK(dev_check((uint64_t)(uintptr_t)seg.ptr, 1u << 20, 11, 4096));
	CHECK_OK(vmm->release(&seg));
	/* Neither an fd nor a fabric handle: refused. */
	m.desc.handle_len = 0;
	CHECK(vmm->import(&m.desc, -1, -1, &seg) == -EINVAL);
	printf("  fabric-only memory: wrapped without an fd, imported from its handle\n");
	tsend(sock, OP_DONE, NULL, 0, -1);
}

#define RO_SZ (2u << 20)

/* Producer side of the consumer cases below: `size` bytes of pattern
 * `seed` on device 0, exported `times` times; returns once the consumer is
 * done. */
static void serve_filled(struct wex_mem_seg *seg, int sock, uint64_t size, unsigned seed,
			 int times)
{
	CHECK_OK(wex__cuda_use_device(0));
	CHECK_OK(vmm->alloc(size, 0, seg));
	dev_fill((uint64_t)(uintptr_t)seg->ptr, size, seed);
	for (int i = 0; i < times; i++)
		tsend(sock, OP_SEG, &seg->desc, 0, seg->fd);
	trecv(sock, OP_DONE, NULL);
}

static void p_ro(int sock)
{
	struct wex_mem_seg seg;

	serve_filled(&seg, sock, RO_SZ, 12, 2);
	/* Nothing the consumer tried reached our bytes. */
	CHECK(dev_check((uint64_t)(uintptr_t)seg.ptr, RO_SZ, 12, 0));
	CHECK_OK(vmm->release(&seg));
}

static void c_ro(int sock)
{
	struct wex_mem_seg seg;
	CUdeviceptr mine;
	struct tmsg m;
	int fd;

	CHECK(wex__cuda_vmm_readonly() == -1);
	m = trecv(sock, OP_SEG, &fd);
	CHECK_OK(vmm->import(&m.desc, fd, -1, &seg));
	CHECK(dev_check((uint64_t)(uintptr_t)seg.ptr, RO_SZ, 12, 0));
	printf("  read-only imports: %d\n", wex__cuda_vmm_readonly());
	CHECK(wex__cuda_vmm_readonly() >= 0);
	/* Marked read-write (the client reports rw_mapping) only when the
	 * driver refused read-only. */
	CHECK(seg.rw == !wex__cuda_vmm_readonly());
	CHECK_STORE(seg.ptr, 1);
	if (emulated()) {
		struct wex_copy_op op;

		CHECK(wex__cuda_vmm_readonly() == 1);
		/* A copy into the producer's weights is an illegal address
		 * (on a GPU it would poison the context: not tried there). */
		CHECK_OK(wex__cuda_use_device(0));
		CU_OK(wex__cu.cuMemAlloc(&mine, 4096));
		op = (struct wex_copy_op){ .src = mine, .dst = (uint64_t)(uintptr_t)seg.ptr,
					   .len = 4096 };
		CHECK(vmm->copy(&op, 1, 1) < 0);
		CU_OK(wex__cu.cuMemFree(mine));
	}
	CHECK_OK(vmm->release(&seg));
	m = trecv(sock, OP_SEG, &fd);
	/* Emulated: one refusal after read-only worked makes that mapping
	 * read-write, not the later ones. */
	if (emulated())
		emul_fail("cuMemSetAccess", 1, CUDA_ERROR_NOT_PERMITTED);
	CHECK_OK(vmm->import(&m.desc, fd, -1, &seg));
	if (emulated()) {
		/* Emulated mappings are host pages: the store lands in the
		 * producer's memory, which it checks after, so put it back. */
		unsigned char was = *(volatile unsigned char *)seg.ptr;

		CHECK_STORE(seg.ptr, 0);
		*(volatile unsigned char *)seg.ptr = was;
		CHECK(wex__cuda_vmm_readonly() == 1);
		CHECK(seg.rw == 1);
	}
	CHECK_OK(vmm->release(&seg));
	tsend(sock, OP_DONE, NULL, 0, -1);
}

/* How the emulated driver refuses read-only access in c_ro_refused
 * (WEX_EMUL_NO_PROT_READ): set before run_pair forks the consumer. */
static const char *ro_refusal = "1";

/* A driver that refuses read-only mappings, with whatever error:
 * read-write, said so. */
static void c_ro_refused(int sock)
{
	struct wex_mem_seg seg;
	struct tmsg m;
	int fd;

	setenv("WEX_EMUL_NO_PROT_READ", ro_refusal, 1); /* the emulated driver only */
	printf("  WEX_EMUL_NO_PROT_READ=%s\n", ro_refusal);
	m = trecv(sock, OP_SEG, &fd);
	CHECK_OK(vmm->import(&m.desc, fd, -1, &seg));
	CHECK(dev_check((uint64_t)(uintptr_t)seg.ptr, RO_SZ, 12, 0));
	if (emulated()) {
		CHECK(wex__cuda_vmm_readonly() == 0);
		CHECK(seg.rw == 1);
		printf("  read-only refused: read-write import, marked so, readonly() = 0\n");
	}
	CHECK_OK(vmm->release(&seg));
	m = trecv(sock, OP_SEG, &fd);
	close(fd);
	unsetenv("WEX_EMUL_NO_PROT_READ");
	tsend(sock, OP_DONE, NULL, 0, -1);
}

/* A sticky error from the read-only try is not a refusal: the import
 * fails with it (-ENOTRECOVERABLE) instead of retrying read-write, which
 * the emulated driver, whose context survives, would grant. */
static void c_ro_sticky(int sock)
{
	struct wex_mem_seg seg;
	struct tmsg m;
	int fd;

	CHECK_OK(wex__cuda_load());
	m = trecv(sock, OP_SEG, &fd);
	if (emulated()) {
		setenv("WEX_EMUL_NO_PROT_READ", "CUDA_ERROR_ILLEGAL_ADDRESS", 1);
		CHECK(vmm->import(&m.desc, fd, -1, &seg) == -ENOTRECOVERABLE);
		CHECK(wex__cuda_vmm_readonly() == -1);
		unsetenv("WEX_EMUL_NO_PROT_READ");
		printf("  sticky error: import failed, not retried read-write\n");
	} else {
		close(fd);
		printf("  not tried: needs the emulated driver\n");
	}
	m = trecv(sock, OP_SEG, &fd);
	close(fd);
	tsend(sock, OP_DONE, NULL, 0, -1);
}

#define PEER_SZ (4u << 20)

static void p_peer(int sock)
{
	struct wex_mem_seg seg;

	serve_filled(&seg, sock, PEER_SZ, 13, 4);
	CHECK_OK(vmm->release(&seg));
}

static void c_peer(int sock)
{
	struct wex_mem_seg seg;
	struct wex_copy_op op;
	CUdeviceptr dst;
	unsigned char *host;
	CUdeviceptr edst;
	CUcontext ectx;
	CUstream es;
	int fd, before, owner = -1, other, ret;
	struct tmsg m[4];

	for (int i = 0; i < 4; i++)
		m[i] = trecv(sock, OP_SEG, &fd), m[i].a = (uint64_t)fd;
	CHECK_OK(wex__cuda_device_by_uuid(m[0].desc.device, &owner));
	if (gpu_count() < 2) {
		printf("  one device: access_dev not tried\n");
		for (int i = 0; i < 4; i++)
			close((int)m[i].a);
		tsend(sock, OP_DONE, NULL, 0, -1);
		return;
	}
	other = owner == 0 ? 1 : 0;
	/* 1. Reached from the other device, through peer access. */
	ret = vmm->import(&m[0].desc, (int)m[0].a, other, &seg);
	if (!gpu_can_peer(other, owner)) {
		printf("  devices %d and %d have no peer access: import refused\n", other, owner);
		CHECK(ret == -EOPNOTSUPP);
		close((int)m[3].a);
	} else {
		CHECK_OK(ret);
		CHECK_OK(wex__cuda_use_device(other));
		CU_OK(wex__cu.cuMemAlloc(&dst, PEER_SZ));
		op = (struct wex_copy_op){ .src = (uint64_t)(uintptr_t)seg.ptr, .dst = dst,
					   .len = PEER_SZ };
		CHECK_OK(wex__cuda_copy_async(&op, 1, other));
		CHECK_OK(wex__cuda_copy_sync(other));
		CHECK(dev_check(dst, PEER_SZ, 13, 0));
		/* Imported and read with no context on the producer's GPU
		 * (it would cost memory there). */
		CHECK(emul_ctx_retained(owner) != 1);
		/* The engine reads it on the owner's device too (PyTorch puts
		 * a tensor there by the pointer's device), in a context it
		 * made itself: the release waits for that work before
		 * unmapping (emulated: work queued on unmapped memory faults
		 * at the next sync). */
		CU_OK(wex__cu.cuDevicePrimaryCtxRetain(&ectx, owner));
		CU_OK(wex__cu.cuCtxSetCurrent(ectx));
		CU_OK(wex__cu.cuStreamCreate(&es, CU_STREAM_NON_BLOCKING));
		CU_OK(wex__cu.cuMemAlloc(&edst, PEER_SZ));
		CU_OK(wex__cu.cuMemcpyAsync(edst, (CUdeviceptr)(uintptr_t)seg.ptr, PEER_SZ, es));
		CHECK_OK(vmm->release(&seg));
		CU_OK(wex__cu.cuCtxSetCurrent(ectx));
		CU_OK(wex__cu.cuCtxSynchronize());
		CHECK(dev_check(edst, PEER_SZ, 13, 0));
		CU_OK(wex__cu.cuMemFree(edst));
		CU_OK(wex__cu.cuStreamDestroy(es));
		/* The owner's device reaches it: a copy into host memory runs
		 * there (the source's device). */
		CHECK_OK(vmm->import(&m[3].desc, (int)m[3].a, other, &seg));
		host = malloc(PEER_SZ);
		CHECK(host != NULL);
		op.src = (uint64_t)(uintptr_t)seg.ptr;
		op.dst = (uint64_t)(uintptr_t)host;
		CHECK_OK(vmm->copy(&op, 1, 1));
		for (size_t i = 0; i < PEER_SZ; i++)
			CHECK(host[i] == (unsigned char)(i * 131u + 13 * 7u + (i >> 12)));
		free(host);
		op.dst = dst;
		CHECK_OK(vmm->release(&seg));
		/* 2. Emulated: without access_dev the other device cannot
		 * read it (on a GPU the fault would poison the context). */
		if (emulated()) {
			CHECK_OK(vmm->import(&m[1].desc, (int)m[1].a, -1, &seg));
			op.src = (uint64_t)(uintptr_t)seg.ptr;
			CHECK(wex__cuda_copy_async(&op, 1, other) < 0);
			wex__cuda_copy_sync(other);
			CHECK_OK(vmm->release(&seg));
			m[1].a = (uint64_t)-1;
		}
		CHECK_OK(wex__cuda_use_device(other));
		CU_OK(wex__cu.cuMemFree(dst));
	}
	if ((int)m[1].a >= 0)
		close((int)m[1].a);
	/* 3. No peer access (emulated): refused before anything is mapped,
	 * naming both devices; the fd is closed. */
	if (emulated()) {
		setenv("WEX_EMUL_NO_P2P", "1", 1);
		before = fd_count();
		CHECK(vmm->import(&m[2].desc, (int)m[2].a, other, &seg) == -EOPNOTSUPP);
		CHECK_FDS(before - 1);
		unsetenv("WEX_EMUL_NO_P2P");
		printf("  access_dev: copied on device %d; refused without peer access\n", other);
	} else {
		close((int)m[2].a);
	}
	tsend(sock, OP_DONE, NULL, 0, -1);
}

static void event_context(void)
{
	unsigned char h[64];
	CUstream s;
	void *ev;

	CHECK_OK(wex__cuda_use_device(0));
	CHECK_OK(wex__cuda_stream(0, &s));
	/* No context current.  A wait in the process that recorded the event
	 * works too (the driver refuses to open one's own handle), and the
	 * event lives until the wait is queued (using an opened handle after
	 * its event is destroyed is undefined). */
	CU_OK(wex__cu.cuCtxSetCurrent(NULL));
	CHECK_OK(wex__cuda_event_record(0, NULL, &ev, h));
	CHECK_OK(wex__cuda_event_wait(h, NULL, 0));
	CHECK_OK(wex__cuda_copy_sync(0));
	CHECK_OK(wex__cuda_event_destroy(ev));
	/* Another device's context current, device 0's stream; device 1's
	 * executor stream waits for it. */
	if (gpu_count() > 1) {
		CHECK_OK(wex__cuda_use_device(1));
		CHECK_OK(wex__cuda_event_record(0, s, &ev, h));
		CHECK_OK(wex__cuda_use_device(1));
		CHECK_OK(wex__cuda_event_wait(h, NULL, 1));
		CHECK_OK(wex__cuda_copy_sync(1));
		CHECK_OK(wex__cuda_event_destroy(ev));
	}
	if (emulated()) {
		CUevent e;

		/* What the driver refuses (the emulation enforces it). */
		CU_OK(wex__cu.cuCtxSetCurrent(NULL));
		CHECK(wex__cu.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) ==
		      CUDA_ERROR_INVALID_CONTEXT);
		CHECK_OK(wex__cuda_use_device(0));
		CHECK(wex__cu.cuEventCreate(&e, CU_EVENT_INTERPROCESS) == CUDA_ERROR_INVALID_VALUE);
		if (gpu_count() > 1) {
			/* Device 1's event on device 0's stream. */
			CHECK_OK(wex__cuda_use_device(1));
			CU_OK(wex__cu.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
			CHECK(wex__cu.cuEventRecord(e, s) == CUDA_ERROR_INVALID_HANDLE);
			CU_OK(wex__cu.cuEventDestroy(e));
		}
	}
}

/* A device that reports fabric support may still refuse the fabric handle
 * type in the granularity query (an H100 without an IMEX channel): the
 * allocation goes on with POSIX fds alone, as for a refused cuMemCreate,
 * and fabric is not asked for again on that device. */
static void fabric_refused_early(void)
{
	struct wex_mem_seg seg;
	unsigned long before;

	CHECK_OK(wex__cuda_use_device(0));
	if (!emulated() || !wex__cuda_dev_attr(0, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED)) {
		printf("  not tried: needs the emulated driver with fabric support\n");
		return;
	}
	emul_fail("cuMemGetAllocationGranularity", 1, CUDA_ERROR_NOT_SUPPORTED);
	CHECK_OK(vmm->alloc(2u << 20, 0, &seg));
	CHECK(seg.desc.handle_len == 0);
	dev_fill((uint64_t)(uintptr_t)seg.ptr, 2u << 20, 3);
	CHECK(dev_check((uint64_t)(uintptr_t)seg.ptr, 2u << 20, 3, 0));
	CHECK_OK(vmm->release(&seg));
	before = emul_calls("cuMemGetAllocationGranularity");
	CHECK_OK(vmm->alloc(2u << 20, 0, &seg));
	CHECK(emul_calls("cuMemGetAllocationGranularity") == before + 1);
	CHECK_OK(vmm->release(&seg));
}

static void fork_child(void)
{
	struct wex_mem_seg seg;
	char want[64];
	pid_t parent = getpid(), pid;

	CHECK_OK(wex__cuda_use_device(0));
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		/* No CUDA call may reach the driver here. */
		CHECK(wex__cuda_load() == -WEX_ENOCUDA);
		snprintf(want, sizeof(want), "parent pid %d before fork()", (int)parent);
		printf("  child: %s\n", wex__cuda_why());
		CHECK(strstr(wex__cuda_why(), want) != NULL);
		CHECK(vmm->alloc(2u << 20, 0, &seg) == -WEX_ENOCUDA);
		CHECK(wex__cuda_use_device(0) == -WEX_ENOCUDA);
		CHECK(wex_cuda_alloc(1 << 20, 0, NULL) == NULL);
		fflush(NULL);
		_exit(0);
	}
	CHECK(wait_ok(pid, "forked child") == 0);
	/* The parent is unaffected. */
	CHECK_OK(wex__cuda_load());
	CHECK_OK(vmm->alloc(2u << 20, 0, &seg));
	CHECK_OK(vmm->release(&seg));
}

/* Sizes whose rounding up to the granularity would wrap past 2^64 (to
 * a small allocation or reservation that then "succeeds"): refused. */
static void huge_sizes(void)
{
	struct wex_mem_region r;
	struct wex_mem_seg seg;

	for (uint64_t back = 1; back <= (2u << 20); back <<= 4) {
		memset(&seg, 0, sizeof(seg));
		memset(&r, 0, sizeof(r));
		CHECK(vmm->alloc(UINT64_MAX - back + 1, 0, &seg) == -ENOMEM);
		CHECK(vmm->reserve(UINT64_MAX - back + 1, 0, 0, &r) == -ENOMEM);
		CHECK(vmm->reserve(1, UINT64_MAX - back, 0, &r) == -ENOMEM);
	}
}

int main(void)
{
	int ret = 0;

	gpu_require();
	vmm = wex_mem_backend(WEX_MEM_CUDA_VMM);
	CHECK(vmm);
	ret |= run_pair("export_import", p_export, c_import);
	ret |= run_pair("leak_import", p_leak, c_leak);
	ret |= run_one("leak_alloc", leak_alloc);
	ret |= run_one("fd_limit", fd_limit);
	ret |= run_one("oom_quiet", oom_quiet);
	ret |= killed();
	ret |= run_pair("wrap_chunks", p_wrap, c_wrap);
	ret |= run_pair("wrap_fabric", p_fabric, c_fabric);
	ret |= run_pair("readonly", p_ro, c_ro);
	ret |= run_pair("readonly_refused", p_ro, c_ro_refused);
	/* Refused with errors other than NOT_SUPPORTED: named and numbered. */
	ro_refusal = "CUDA_ERROR_NOT_PERMITTED";
	ret |= run_pair("readonly_refused_not_permitted", p_ro, c_ro_refused);
	ro_refusal = "999"; /* CUDA_ERROR_UNKNOWN */
	ret |= run_pair("readonly_refused_unknown", p_ro, c_ro_refused);
	ret |= run_pair("readonly_sticky", p_ro, c_ro_sticky);
	ret |= run_pair("peer", p_peer, c_peer);
	ret |= run_one("event_context", event_context);
	ret |= run_one("fabric_refused_early", fabric_refused_early);
	ret |= run_one("fork_child", fork_child);
	ret |= run_one("huge_sizes", huge_sizes);
	printf("%s\n", ret ? "FAIL" : "PASS");
	return ret ? T_EXIT_FAIL : T_EXIT_PASS;
}
