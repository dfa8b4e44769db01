/* SPDX-License-Identifier: MIT */
/*
 * gpu_util.h - helpers for the CUDA backend tests: skip code 77 with a
 * reason, a device check run in a throw-away child (a process that has
 * initialised CUDA must not fork and use CUDA in the child, so the parent
 * stays CUDA-free until it has forked its workers), fd counting, and fd
 * passing with SCM_RIGHTS over a socketpair (no daemon involved).
 */
#ifndef WEX_TESTS_GPU_UTIL_H
#define WEX_TESTS_GPU_UTIL_H

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "wex.h"
#include "vmm/backend.h"
#include "vmm/cudawrap.h"
#include "vmm/cuda_backend.h"
#include "tests/wexd_dir.h"

#define T_EXIT_PASS 0
#define T_EXIT_FAIL 1
#define T_EXIT_SKIP 77

#define CHECK(cond)                                                                        \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
			exit(T_EXIT_FAIL);                                                 \
		}                                                                          \
	} while (0)

/* Checks a 0-or-negative-errno call, printing wex_strerror on failure. */
#define CHECK_OK(expr)                                                                     \
	do {                                                                               \
		int check_ret_ = (expr);                                                   \
		if (check_ret_ < 0) {                                                      \
			fprintf(stderr, "%s:%d: %s = %d (%s)\n", __FILE__, __LINE__, #expr,   \
				check_ret_, wex_strerror(check_ret_));                     \
			exit(T_EXIT_FAIL);                                                 \
		}                                                                          \
	} while (0)

/* Driver calls in tests: any error fails the test. */
#define CU_OK(call) CHECK_OK(WEX_CU(call))

static inline int fd_count(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1; /* the directory's own fd */
}

/*
 * 1 under compute-sanitizer (tests/gpu/device_run.sh's memcheck step sets
 * WEX_UNDER_SANITIZER=1): the tool opens fds of its own in each target
 * and instruments children forked to fault or be killed on purpose, and
 * allocates device memory of its own, so the fd counts, the fault probes
 * and cuda_remap's 2 MiB free-memory check are left to the plain runs, and
 * the leak loops run fewer cycles (memcheck looks for memory errors).
 */
static inline int under_sanitizer(void)
{
	const char *e = getenv("WEX_UNDER_SANITIZER");

	return e && *e && strcmp(e, "0") != 0;
}

/* Cycles of a leak loop: n, or a tenth of it under compute-sanitizer. */
static inline int cycles(int n)
{
	return under_sanitizer() ? (n / 10 > 0 ? n / 10 : 1) : n;
}

/* Prints this process's fds and what each is (to stderr), so that a count
 * that differs on a real driver tells the driver's own fds (/dev/nvidia*,
 * anon_inode) from a leak of the code under test in one unattended run. */
static inline void fd_list(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	char path[300], to[256];

	if (!d)
		return;
	while ((e = readdir(d))) {
		ssize_t n;

		if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d))
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		n = readlink(path, to, sizeof(to) - 1);
		to[n > 0 ? n : 0] = '\0';
		fprintf(stderr, "  fd %s -> %s\n", e->d_name, to);
	}
	closedir(d);
}

/* fd_count() must be `want` again; where it is not, the fds are listed
 * before the check fails.  Not checked under compute-sanitizer. */
#define CHECK_FDS(want)                                                                    \
	do {                                                                               \
		int fds_now_ = fd_count(), fds_want_ = (want);                             \
		if (under_sanitizer())                                                     \
			break;                                                             \
		if (fds_now_ != fds_want_) {                                               \
			fprintf(stderr, "%s:%d: %d fds open, %d expected:\n", __FILE__,      \
				__LINE__, fds_now_, fds_want_);                            \
			fd_list();                                                         \
		}                                                                          \
		CHECK(fds_now_ == fds_want_);                                              \
	} while (0)

/*
 * 0 when this machine has a usable CUDA driver and device, else -1 with
 * the reason in why.  The probe runs in a child so that the caller may
 * still fork CUDA workers afterwards.
 */
static inline int gpu_probe(char *why, size_t len)
{
	int p[2], st = 0;
	ssize_t got;
	pid_t pid;

	if (pipe(p) < 0)
		exit(T_EXIT_FAIL);
	pid = fork();
	if (pid == 0) {
		char buf[512];
		int ret = wex__cuda_probe(buf, sizeof(buf));
		int n = 0;

		if (!ret && wex__cu.cuDeviceGetCount(&n) == CUDA_SUCCESS && n == 0) {
			snprintf(buf, sizeof(buf), "no CUDA device");
			ret = -WEX_ENOCUDA;
		}
		if (ret && write(p[1], buf, strlen(buf)) < 0)
			_exit(2);
		_exit(ret ? 1 : 0);
	}
	close(p[1]);
	got = read(p[0], why, len - 1);
	why[got > 0 ? got : 0] = '\0';
	close(p[0]);
	waitpid(pid, &st, 0);
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	if (!why[0])
		snprintf(why, len, "CUDA probe crashed");
	return -1;
}

/* Exits 77 with the reason when this machine has no usable CUDA driver or
 * device (gpu_probe). */
static inline void gpu_require(void)
{
	char why[512];

	if (gpu_probe(why, sizeof(why))) {
		printf("SKIP: %s\n", why);
		exit(T_EXIT_SKIP);
	}
}

/* Sends `len` bytes and, when fd >= 0, the fd (SCM_RIGHTS). */
static inline int send_msg(int sock, const void *buf, size_t len, int fd)
{
	char ctl[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };

	memset(ctl, 0, sizeof(ctl));
	if (fd >= 0) {
		struct cmsghdr *c;

		m.msg_control = ctl;
		m.msg_controllen = sizeof(ctl);
		c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	return sendmsg(sock, &m, 0) == (ssize_t)len ? 0 : -errno;
}

/* Receives exactly `len` bytes; *fd gets an attached fd or -1. */
static inline int recv_msg(int sock, void *buf, size_t len, int *fd)
{
	char ctl[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
			    .msg_controllen = sizeof(ctl) };
	struct cmsghdr *c;
	ssize_t n;

	if (fd)
		*fd = -1;
	n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
	if (n != (ssize_t)len)
		return n < 0 ? -errno : -EPROTO;
	for (c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && fd)
			memcpy(fd, CMSG_DATA(c), sizeof(int));
	return 0;
}

/* A socketpair for one producer/consumer pair (SOCK_SEQPACKET keeps
 * message boundaries). */
static inline void pair(int sv[2])
{
	CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
}

/* Waits for a child; returns 0 when it exited 0, else prints why. */
static inline int wait_ok(pid_t pid, const char *what)
{
	int st = 0;

	if (waitpid(pid, &st, 0) < 0)
		return -1;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	fprintf(stderr, "%s: %s %d\n", what, WIFEXITED(st) ? "exit" : "signal",
		WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	return -1;
}

/* Fills n bytes of device memory at d with a pattern derived from seed
 * (through a host buffer: tests favour obviousness over speed). */
static inline void dev_fill(uint64_t d, size_t n, unsigned seed)
{
	unsigned char *h = malloc(n);

	CHECK(h);
	for (size_t i = 0; i < n; i++)
		h[i] = (unsigned char)(i * 131u + seed * 7u + (i >> 12));
	CU_OK(wex__cu.cuMemcpyHtoD((CUdeviceptr)d, h, n));
	/* From pageable memory the call may return before the DMA reaches
	 * the device: other processes read these bytes next. */
	CU_OK(wex__cu.cuCtxSynchronize());
	free(h);
}

/* 1 when the n bytes at d hold the pattern of dev_fill(seed) starting at
 * pattern index `from`. */
static inline int dev_check(uint64_t d, size_t n, unsigned seed, size_t from)
{
	unsigned char *h = malloc(n);
	int ok = 1;

	CHECK(h);
	CU_OK(wex__cu.cuMemcpyDtoH(h, (CUdeviceptr)d, n));
	for (size_t i = 0; i < n && ok; i++) {
		size_t k = i + from;

		if (h[i] != (unsigned char)(k * 131u + seed * 7u + (k >> 12))) {
			fprintf(stderr, "byte %zu: %u != expected\n", i, h[i]);
			ok = 0;
		}
	}
	free(h);
	return ok;
}

/* Whether wexd's client list (asked through c) shows a client of `group`
 * (NULL: any) whose syncs reported the fallback `name` (pageable_staging,
 * rw_mapping, unpinned_verify). */
static inline int client_fallback(wex_client_t *c, const char *group, const char *name)
{
	char *js = NULL;
	json_t *j, *cl, *v;
	size_t i, k;
	int seen = 0;

	CHECK_OK(wex_request(c, "clients", NULL, &js));
	j = json_loads(js, 0, NULL);
	CHECK(j != NULL);
	json_array_foreach(json_object_get(j, "clients"), i, cl) {
		const char *g = json_string_value(json_object_get(cl, "group"));

		if (group && (!g || strcmp(g, group)))
			continue;
		json_array_foreach(json_object_get(cl, "fallbacks"), k, v)
			if (json_string_value(v) && !strcmp(json_string_value(v), name))
				seen = 1;
	}
	json_decref(j);
	wex_free(js);
	return seen;
}

/* One message between the two processes of a test. */
struct tmsg {
	int op;
	uint64_t a, b;
	struct wex_mem_desc desc;
};

static inline void tsend(int sock, int op, const struct wex_mem_desc *d, uint64_t a, int fd)
{
	struct tmsg m = { .op = op, .a = a };

	if (d)
		m.desc = *d;
	CHECK_OK(send_msg(sock, &m, sizeof(m), fd));
}

/* Receives a message, failing the test unless its op is `op`. */
static inline struct tmsg trecv(int sock, int op, int *fd)
{
	struct tmsg m;

	CHECK_OK(recv_msg(sock, &m, sizeof(m), fd));
	if (m.op != op) {
		fprintf(stderr, "expected message %d, got %d\n", op, m.op);
		exit(T_EXIT_FAIL);
	}
	return m;
}

/* Runs producer(sock) and consumer(sock) in two fresh children joined by a
 * socketpair; the parent never touches CUDA.  0 when both exit 0. */
static inline int run_pair(const char *name, void (*producer)(int), void (*consumer)(int))
{
	pid_t pp, pc;
	int sv[2], ret = 0;

	printf("%s\n", name);
	fflush(stdout);
	pair(sv);
	pp = fork();
	CHECK(pp >= 0);
	if (pp == 0) {
		close(sv[1]);
		producer(sv[0]);
		fflush(NULL);
		_exit(0);
	}
	pc = fork();
	CHECK(pc >= 0);
	if (pc == 0) {
		close(sv[0]);
		consumer(sv[1]);
		fflush(NULL);
		_exit(0);
	}
	close(sv[0]);
	close(sv[1]);
	ret |= wait_ok(pp, "producer");
	ret |= wait_ok(pc, "consumer");
	printf("%s: %s\n", name, ret ? "FAIL" : "ok");
	return ret;
}

/* Runs fn() in one fresh child. */
static inline int run_one(const char *name, void (*fn)(void))
{
	pid_t p;
	int ret;

	printf("%s\n", name);
	fflush(stdout);
	p = fork();
	CHECK(p >= 0);
	if (p == 0) {
		fn();
		fflush(NULL);
		_exit(0);
	}
	ret = wait_ok(p, name);
	printf("%s: %s\n", name, ret ? "FAIL" : "ok");
	return ret;
}

/* Pinned device memory on device 0 with handle types `types` (for tests
 * that call cuMemCreate themselves), and read-write access to it. */
static inline CUmemAllocationProp gpu_vmm_prop(unsigned types)
{
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.requestedHandleTypes = (CUmemAllocationHandleType)types,
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 },
	};

	return prop;
}

static inline CUmemAccessDesc gpu_rw_access(void)
{
	CUmemAccessDesc acc = {
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 },
		.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
	};

	return acc;
}

static inline uint64_t mem_free(void)
{
	size_t f = 0, t = 0;

	CU_OK(wex__cu.cuMemGetInfo(&f, &t));
	return f;
}

/* n bf16 tensors "layers.<i>.weight" of [rows, cols], back to back from
 * offset 0 of segment seg; returns their total size in bytes. */
static inline uint64_t gpu_bf16_tensors(struct wex_tensor *t, int n, uint64_t rows, uint64_t cols,
					uint32_t seg)
{
	memset(t, 0, sizeof(*t) * (size_t)n);
	for (int i = 0; i < n; i++) {
		snprintf(t[i].name, sizeof(t[i].name), "layers.%d.weight", i);
		t[i].dtype = WEX_DT_BF16;
		t[i].ndim = 2;
		t[i].shape[0] = t[i].extent[0] = rows;
		t[i].shape[1] = t[i].extent[1] = cols;
		t[i].segment = seg;
		t[i].offset = (uint64_t)i * rows * cols * 2;
	}
	return (uint64_t)n * rows * cols * 2;
}

/* The ordinal of the device holding p, or -1 for memory the driver does
 * not know as device memory (host memory). */
static inline int gpu_ptr_device(const void *p)
{
	unsigned type = 0;
	int ord = -1;

	if (wex__cuda_load() != 0 ||
	    wex__cu.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
					  (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS ||
	    type != CU_MEMORYTYPE_DEVICE ||
	    wex__cu.cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
					  (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
		return -1;
	return ord;
}

/* Host <-> device through the VMM backend's executor (unified
 * addressing), on the device holding the device side (the destination's
 * when both are): a device reaches another's VMM memory only where it was
 * given access.  Blocks until done. */
static inline int xfer(void *dst, const void *src, uint64_t len)
{
	struct wex_copy_op op = { .src = (uint64_t)(uintptr_t)src, .dst = (uint64_t)(uintptr_t)dst,
				  .len = len };
	int dev = gpu_ptr_device(dst), ret;

	if (dev < 0)
		dev = gpu_ptr_device(src);
	if (dev < 0)
		return wex_mem_backend(WEX_MEM_CUDA_VMM)->copy(&op, 1, 1);
	ret = wex__cuda_copy_async(&op, 1, dev);
	/* Wait after an error too: nothing queued may outlive the call. */
	return ret ? (wex__cuda_copy_sync(dev), ret) : wex__cuda_copy_sync(dev);
}

/* Starts $WEXD_BIN (a test's environment sets it and WEX_SOCKET) and
 * returns its pid once it is ready (WEXD_READY_FD). */
static inline pid_t gpu_start_wexd(void)
{
	const char *bin = getenv("WEXD_BIN");
	int p[2];
	char b[8], fds[16];
	pid_t pid, parent = getpid();

	CHECK(bin != NULL);
	CHECK(pipe(p) == 0);
	pid = fork();
	if (pid == 0) {
		/* A failed test must not leave wexd behind: it would keep the
		 * exported allocations (and so device memory) alive.  Nor one
		 * killed before the request below took: its wexd would be
		 * reparented and live on (holding the test runner's output
		 * open: bench_json.py's term runs, SIGTERM right after the
		 * first line, waited for it until ctest's timeout). */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		close(p[0]);
		snprintf(fds, sizeof(fds), "%d", p[1]);
		setenv("WEXD_READY_FD", fds, 1);
		execl(bin, bin, (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	CHECK(read(p[0], b, sizeof(b)) > 0);
	close(p[0]);
	return pid;
}

/* A wexd of the test's own in a fresh directory (WEX_SOCKET points at it)
 * and a producer child that talks with the test over two pipes. */
struct gpu_world {
	char dir[64];
	pid_t wexd, prod;
	int to_prod, from_prod; /* the test's ends of the pipes */
};

static inline void gpu_world_start(struct gpu_world *w, void (*producer)(int in, int out))
{
	char sock[128];
	int a[2], b[2];
	const char *tmp = getenv("TMPDIR");
	pid_t parent = getpid();

	/* Under $TMPDIR where one is set (a test that kills a benchmark
	 * removes what its wexd left there) and short enough for a socket. */
	if (!tmp || !*tmp || strlen(tmp) > 40)
		tmp = "/tmp";
	snprintf(w->dir, sizeof(w->dir), "%s/wex-gpu-XXXXXX", tmp);
	CHECK(mkdtemp(w->dir) != NULL);
	snprintf(sock, sizeof(sock), "%s/wexd.sock", w->dir);
	setenv("WEX_SOCKET", sock, 1);
	w->wexd = gpu_start_wexd();
	/* Close-on-exec: a wexd started later (a restart) must not hold the
	 * producer's input open. */
	CHECK(pipe2(a, O_CLOEXEC) == 0 && pipe2(b, O_CLOEXEC) == 0);
	w->prod = fork();
	CHECK(w->prod >= 0);
	if (w->prod == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent) /* (killed before that took) */
			_exit(1);
		close(a[1]);
		close(b[0]);
		producer(a[0], b[1]);
		_exit(0);
	}
	close(a[0]);
	close(b[1]);
	w->to_prod = a[1];
	w->from_prod = b[0];
}

/* Closes the producer's input (it exits), then stops wexd: both must exit
 * with status 0. */
static inline void gpu_world_stop(struct gpu_world *w)
{
	int st;

	close(w->to_prod);
	CHECK(waitpid(w->prod, &st, 0) == w->prod && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	close(w->from_prod);
	kill(w->wexd, SIGTERM);
	CHECK(waitpid(w->wexd, &st, 0) == w->wexd && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	rm_wexd_dir(w->dir, 0);
}

/*
 * What PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True builds on device
 * 0: one reservation with n allocations of `chunk` bytes (cuMemCreate,
 * POSIX fd handle type) mapped back to back, readable and writable.  h
 * receives the n handles; free with gpu_expandable_free.
 */
static inline CUdeviceptr gpu_expandable(int n, uint64_t chunk, CUmemGenericAllocationHandle *h)
{
	CUmemAllocationProp prop;
	CUmemAccessDesc acc;
	CUdeviceptr va;

	CHECK_OK(wex__cuda_use_device(0));
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	CU_OK(wex__cu.cuMemAddressReserve(&va, n * chunk, 0, 0, 0));
	for (int i = 0; i < n; i++) {
		CU_OK(wex__cu.cuMemCreate(&h[i], chunk, &prop, 0));
		CU_OK(wex__cu.cuMemMap(va + i * chunk, chunk, 0, h[i], 0));
	}
	memset(&acc, 0, sizeof(acc));
	acc.location = prop.location;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CU_OK(wex__cu.cuMemSetAccess(va, n * chunk, &acc, 1));
	return va;
}

static inline void gpu_expandable_free(CUdeviceptr va, int n, uint64_t chunk,
				       const CUmemGenericAllocationHandle *h)
{
	for (int i = 0; i < n; i++) {
		CU_OK(wex__cu.cuMemUnmap(va + i * chunk, chunk));
		CU_OK(wex__cu.cuMemRelease(h[i]));
	}
	CU_OK(wex__cu.cuMemAddressFree(va, n * chunk));
}

/*
 * The emulated driver (tests/gpu/emul_cuda.c) exports a few test hooks;
 * a real driver has none of them.  NULL when absent.
 */
static inline void *emul_sym(const char *name)
{
	const char *lib = getenv("WEX_CUDA_LIB");
	void *h, *sym;

	if (!lib || !*lib || !(h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD)))
		return NULL;
	sym = dlsym(h, name);
	dlclose(h);
	return sym;
}

/* 1 when the driver loaded here is the emulation (load it first). */
static inline int emulated(void)
{
	return emul_sym("wex_emul_calls") != NULL;
}

/* How often the emulated driver ran `name` (0 on a GPU). */
static inline unsigned long emul_calls(const char *name)
{
	unsigned long (*f)(const char *) =
		(unsigned long (*)(const char *))(uintptr_t)emul_sym("wex_emul_calls");

	return f ? f(name) : 0;
}

/* Host ranges the emulated driver holds registered now; -1 on a GPU. */
static inline int emul_host_regs(void)
{
	int (*f)(void) = (int (*)(void))(uintptr_t)emul_sym("wex_emul_host_regs");

	return f ? f() : -1;
}

/* Copies the emulated driver made so far that moved host memory not
 * registered with cuMemHostRegister (pageable); -1 on a GPU. */
static inline long emul_pageable_copies(void)
{
	unsigned long (*f)(void) =
		(unsigned long (*)(void))(uintptr_t)emul_sym("wex_emul_pageable_copies");

	return f ? (long)f() : -1;
}

/* Whether this process retained device dev's primary context (emulated
 * driver); -1 on a GPU. */
static inline int emul_ctx_retained(int dev)
{
	int (*f)(int) = (int (*)(int))(uintptr_t)emul_sym("wex_emul_ctx_retained");

	return f ? f(dev) : -1;
}

/* Legacy IPC opens the emulated driver holds now (each open of a handle
 * counts, also a repeated one); -1 on a GPU. */
static inline int emul_ipc_opens(void)
{
	int (*f)(void) = (int (*)(void))(uintptr_t)emul_sym("wex_emul_ipc_opens");

	return f ? f() : -1;
}

/*
 * Whether the host range at p is registered with the driver (pinned).
 * *flags (when not NULL): its CU_MEMHOSTREGISTER_* flags where
 * cuMemHostGetFlags answers (the emulated driver does; the reference
 * manual documents it for cuMemHostAlloc memory only), else 0, and a real
 * driver is asked for p's device pointer instead.
 */
static inline int host_registered(void *p, unsigned *flags)
{
	unsigned f = 0;
	CUdeviceptr d = 0;

	if (flags)
		*flags = 0;
	if (wex__cu.cuMemHostGetFlags && wex__cu.cuMemHostGetFlags(&f, p) == CUDA_SUCCESS) {
		if (flags)
			*flags = f;
		return 1;
	}
	/* Not the pointer's memory type: a driver with HMM may call pageable
	 * memory "host" too.  A device pointer exists only for page-locked
	 * memory (wex registers with DEVICEMAP). */
	return !emulated() && wex__cu.cuMemHostGetDevicePointer(&d, p, 0) == CUDA_SUCCESS;
}

/* Emulated driver only: the nth call of `name` from now returns r. */
static inline void emul_fail(const char *name, unsigned long nth, CUresult r)
{
	typedef void (*fail_fn)(const char *, unsigned long, CUresult);
	fail_fn f = (fail_fn)(uintptr_t)emul_sym("wex_emul_fail");

	CHECK(f != NULL);
	f(name, nth, r);
}

static inline void store_fault_exit(int sig)
{
	_exit(99);
}

/*
 * 1 when a plain CPU store to p faults.  The store runs in a forked child
 * that makes no CUDA call (CUDA does not survive fork; a store does).  On
 * the emulated driver device memory is host memory, so this tells a
 * read-only mapping from a writable one; on a GPU a device address always
 * faults on the CPU, and this shows nothing.
 */
static inline int store_faults(void *p)
{
	int st = 0;
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		struct sigaction sa;

		/* Our handler, not a sanitizer's report: exit 99 on a fault. */
		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = store_fault_exit;
		sigaction(SIGSEGV, &sa, NULL);
		sigaction(SIGBUS, &sa, NULL);
		*(volatile unsigned char *)p = 0xa5;
		_exit(0);
	}
	CHECK(waitpid(pid, &st, 0) == pid);
	return (WIFEXITED(st) && WEXITSTATUS(st) == 99) ||
	       (WIFSIGNALED(st) && (WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS));
}

/* store_faults(p) must be `want`; not tried under compute-sanitizer (the
 * forked child that faults on purpose would be one of its targets). */
#define CHECK_STORE(p, want)                                                               \
	do {                                                                               \
		if (under_sanitizer())                                                     \
			printf("  %s:%d: store probe not tried under compute-sanitizer\n", \
			       __FILE__, __LINE__);                                        \
		else                                                                       \
			CHECK(store_faults(p) == (want));                                  \
	} while (0)

/* The number of CUDA devices (the driver must be loaded). */
static inline int gpu_count(void)
{
	int n = 0;

	CU_OK(wex__cu.cuDeviceGetCount(&n));
	return n;
}

/* 1 when device `dev` may reach memory on device `owner`. */
static inline int gpu_can_peer(int dev, int owner)
{
	int can = 0;

	CU_OK(wex__cu.cuDeviceCanAccessPeer(&can, dev, owner));
	return can;
}

/* The minimum VMM granularity of device 0. */
static inline uint64_t gpu_granularity(void)
{
	CUmemAllocationProp prop;
	size_t g = 0;

	CHECK_OK(wex__cuda_use_device(0));
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	CU_OK(wex__cu.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	return g;
}

/* PTX of wex_copy_u32(src, dst, n): dst[i] = src[i] for i < n (32-bit
 * words, one per thread); the one kernel the emulation runs. */
static inline const char *test_copy_ptx(void)
{
	return
		".version 7.0\n"
		".target sm_80\n"
		".address_size 64\n"
		"\n"
		".visible .entry wex_copy_u32(\n"
		"	.param .u64 p_src,\n"
		"	.param .u64 p_dst,\n"
		"	.param .u32 p_n\n"
		")\n"
		"{\n"
		"	.reg .pred %p<2>;\n"
		"	.reg .b32 %r<7>;\n"
		"	.reg .b64 %rd<8>;\n"
		"\n"
		"	ld.param.u64 %rd1, [p_src];\n"
		"	ld.param.u64 %rd2, [p_dst];\n"
		"	ld.param.u32 %r1, [p_n];\n"
		"	mov.u32 %r2, %ctaid.x;\n"
		"	mov.u32 %r3, %ntid.x;\n"
		"	mov.u32 %r4, %tid.x;\n"
		"	mad.lo.s32 %r5, %r2, %r3, %r4;\n"
		"	setp.ge.u32 %p1, %r5, %r1;\n"
		"	@%p1 bra DONE;\n"
		"	cvta.to.global.u64 %rd3, %rd1;\n"
		"	cvta.to.global.u64 %rd4, %rd2;\n"
		"	mul.wide.u32 %rd5, %r5, 4;\n"
		"	add.s64 %rd6, %rd3, %rd5;\n"
		"	add.s64 %rd7, %rd4, %rd5;\n"
		"	ld.global.u32 %r6, [%rd6];\n"
		"	st.global.u32 [%rd7], %r6;\n"
		"DONE:\n"
		"	ret;\n"
		"}\n";
}

#endif
