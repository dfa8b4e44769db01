/* SPDX-License-Identifier: MIT */
/*
 * cuda_loader_test.c - the CUDA backends without a usable driver (runs on
 * every machine, no GPU needed).  Each case runs in its own child, because
 * the driver is loaded once per process:
 *   nolib     - $WEX_CUDA_LIB names a file that does not exist;
 *   noproc    - a library without cuGetProcAddress (fake_cuda_noproc.so);
 *   missing   - a driver lacking cuMemCreate (fake_cuda.so);
 *   nodevice  - a complete driver whose cuInit says CUDA_ERROR_NO_DEVICE;
 *               optional entry points are asked for only at ABI versions
 *               the driver has (cuMemcpyBatchAsync at 12080, not 13000);
 *   noversion - the same, with a cuDriverGetVersion that fails: no
 *               optional entry point is asked for at all;
 *   later     - the driver loaded by someone else (PyTorch) after libwex
 *               found none: libwex sees it at its next call (its "none
 *               loaded" lasts only until a library is loaded).
 * In every case each backend op returns -WEX_ENOCUDA (or -EOPNOTSUPP for
 * a slot the backend never supports), as does wex_cuda_malloc (not an
 * out-of-memory error: wex_cuda_alloc's NULL says no more), fds handed
 * over are closed, no fd
 * leaks, and the probe's reason names the cause.  Also: wex_mem_backend
 * returns complete tables.
 */
#include <fcntl.h>
#include <sys/mman.h>

#include "gpu_util.h"

static int memfd(void)
{
	int fd = memfd_create("t", MFD_CLOEXEC);

	CHECK(fd >= 0);
	CHECK(ftruncate(fd, 1 << 20) == 0);
	return fd;
}

static void check_tables(void)
{
	for (int k = WEX_MEM_HOST; k < WEX_MEM_KINDS; k++) {
		const struct wex_mem_ops *o = wex_mem_backend(k);

		CHECK(o);
		CHECK(o->kind == k);
		CHECK(o->name && o->probe && o->alloc && o->wrap && o->import && o->release &&
		      o->reserve && o->map_fixed && o->unmap_fixed && o->unreserve && o->copy &&
		      o->wrap_chunks && o->import_chunks && o->sync_device && o->host_pin &&
		      o->host_unpin);
	}
	CHECK(wex_mem_backend(0) == NULL);
	CHECK(wex_mem_backend(WEX_MEM_KINDS) == NULL);
}

#define NOCUDA(expr) CHECK((expr) == -WEX_ENOCUDA)
#define NOCUDA_OR_UNSUP(expr)                                                              \
	do {                                                                               \
		int r_ = (expr);                                                           \
		CHECK(r_ == -WEX_ENOCUDA || r_ == -EOPNOTSUPP);                            \
	} while (0)

static void check_ops(const struct wex_mem_ops *o, int kind)
{
	struct wex_mem_desc d = { .kind = kind, .size = 1 << 20, .alloc_size = 1 << 20,
				  .handle_len = kind == WEX_MEM_CUDA_IPC ? 64 : 0 };
	struct wex_mem_seg seg = { .fd = -1 }, empty = { .ops = o, .fd = -1 };
	struct wex_mem_region r = { .ops = o, .size = 1 << 21, .fixed = 1 };
	struct wex_copy_op op = { .src = 0x1000, .dst = 0x2000, .len = 16 };
	char why[256] = "x";
	static char buf[4096];
	int before = fd_count();

	NOCUDA(o->probe(why, sizeof(why)));
	CHECK(why[0] != '\0' && strcmp(why, wex__cuda_why()) == 0);
	NOCUDA(o->alloc(1 << 20, 0, &seg));
	NOCUDA(o->wrap(buf, sizeof(buf), -1, &seg));
	/* import owns the fd: closed on this error too. */
	NOCUDA(o->import(&d, memfd(), -1, &seg));
	CHECK(o->release(&empty) == 0);
	NOCUDA_OR_UNSUP(o->reserve(1 << 20, 0, 0, &r));
	NOCUDA_OR_UNSUP(o->map_fixed(&r, &empty, 0));
	NOCUDA_OR_UNSUP(o->unmap_fixed(&r));
	r.fixed = 0;
	{
		int ret = o->unreserve(&r); /* nothing reserved: nothing to do */

		CHECK(ret == 0 || ret == -EOPNOTSUPP);
	}
	NOCUDA(o->copy(&op, 1, 1));
	NOCUDA(o->host_pin(buf, sizeof(buf), 0, 0));
	NOCUDA(o->host_unpin(buf, 0));
	CHECK_FDS(before);
}

static void check_all(const char *want_in_why)
{
	struct wex_mem_desc ds[2] = {
		{ .kind = WEX_MEM_CUDA_VMM, .size = 1 << 20, .alloc_size = 1 << 20 },
		{ .kind = WEX_MEM_CUDA_VMM, .size = 1 << 20, .alloc_size = 1 << 20 },
	};
	struct wex__cuda_staging st;
	struct wex__cuda_chunk ch[2];
	struct wex_mem_seg seg;
	unsigned char h[64];
	uint64_t base, size;
	char buf[64];
	void *ev = NULL;
	size_t n = 0;
	int before = fd_count(), fds[2];

	NOCUDA(wex__cuda_load());
	if (!strstr(wex__cuda_why(), want_in_why)) {
		fprintf(stderr, "reason \"%s\" lacks \"%s\"\n", wex__cuda_why(), want_in_why);
		exit(T_EXIT_FAIL);
	}
	printf("  reason: %s\n", wex__cuda_why());
	check_ops(wex_mem_backend(WEX_MEM_CUDA_VMM), WEX_MEM_CUDA_VMM);
	check_ops(wex_mem_backend(WEX_MEM_CUDA_IPC), WEX_MEM_CUDA_IPC);
	/* The host backend is unaffected. */
	CHECK(wex_mem_backend(WEX_MEM_HOST)->probe(NULL, 0) == 0);
	CHECK(wex_mem_backend(WEX_MEM_HOST)->alloc(4096, -1, &seg) == 0);
	/* Pinning a host segment needs the driver; the segment stays usable. */
	NOCUDA(wex_mem_host_pin(&seg, 0));
	CHECK(seg.pinned == 0);
	CHECK(wex_mem_backend(WEX_MEM_HOST)->release(&seg) == 0);

	NOCUDA(wex__cuda_vmm_chunks(buf, sizeof(buf), ch, 2, &n));
	fds[0] = memfd();
	fds[1] = memfd();
	NOCUDA(wex__cuda_vmm_import_chunks(ds, fds, 2, -1, &seg));
	NOCUDA(wex__cuda_copy_async(NULL, 0, -1));
	NOCUDA(wex__cuda_copy_sync(0));
	NOCUDA(wex__cuda_stream_sync(NULL));
	NOCUDA(wex__cuda_event_record(0, NULL, &ev, h));
	NOCUDA(wex__cuda_event_wait(h, NULL, 0));
	NOCUDA(wex__cuda_use_device(0));
	NOCUDA(wex__cuda_staging_create(1 << 20, 0, &st));
	NOCUDA(wex__cuda_staging_import(memfd(), 1 << 20, 0, &st));
	CHECK(wex_cuda_alloc(1 << 20, 0, NULL) == NULL);
	{
		void *p = buf; /* written only on success */

		NOCUDA(wex_cuda_malloc(1 << 20, 0, &p));
		CHECK(p == buf);
	}
	wex_cuda_free(NULL, 0, 0, NULL);
	CHECK(wex__cuda_alloc_lookup(buf, &base, &size, NULL, NULL) == -ENOENT);
	CHECK_FDS(before);
}

/* With the fake driver: which ABI versions of the optional
 * cuMemcpyBatchAsync the loader asked for (it asks by name, once per
 * entry of its table: 12080 and 13000). */
static void check_optional(void *fake, int version_known)
{
	unsigned (*asked)(const char *);

	if (!fake)
		return;
	asked = (unsigned (*)(const char *))(uintptr_t)dlsym(fake, "fake_cuda_asked");
	CHECK(asked != NULL);
	CHECK(asked("cuMemCreate") == 1);
	printf("  cuMemcpyBatchAsync asked %u time(s)\n", asked("cuMemcpyBatchAsync"));
	/* Known 12080: the 12080 entry only; unknown: none. */
	CHECK(asked("cuMemcpyBatchAsync") == (version_known ? 1u : 0u));
}

static int run_case(const char *name, const char *lib, const char *missing, const char *want)
{
	pid_t pid;

	if (!lib) {
		printf("case %s: SKIP (fake library path not set)\n", name);
		return 0;
	}
	printf("case %s: WEX_CUDA_LIB=%s%s%s\n", name, *lib ? lib : "(unset)", missing ? " FAKE_CUDA_MISSING=" : "",
	       missing ? missing : "");
	fflush(stdout);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		if (!*lib) {
			/* The real default path: meaningful only without a driver. */
			unsetenv("WEX_CUDA_LIB");
			if (wex__cuda_load() == 0 || !strstr(wex__cuda_why(), "libcuda.so.1")) {
				printf("  a driver is installed here: nothing to check\n");
				exit(T_EXIT_PASS);
			}
		}
		void *fake = NULL;

		setenv("WEX_CUDA_LIB", lib, 1);
		if (missing)
			setenv("FAKE_CUDA_MISSING", missing, 1);
		/* Held open, so that its counters outlive the loader's dlclose. */
		if (!strcmp(name, "nodevice") || !strcmp(name, "noversion"))
			fake = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
		check_all(want);
		check_optional(fake, strcmp(name, "noversion") != 0);
		if (fake)
			dlclose(fake);
		/* exit, not _exit: LeakSanitizer checks the child too. */
		exit(T_EXIT_PASS);
	}
	return wait_ok(pid, name);
}

/* libwex asks whether a driver is loaded (none), then the process loads
 * one, as an engine importing PyTorch after connecting: the next ask must
 * find it and load it through wex (its cuInit says no device here). */
static int run_later(const char *lib)
{
	pid_t pid;

	if (!lib) {
		printf("case later: SKIP (fake library path not set)\n");
		return 0;
	}
	printf("case later: WEX_CUDA_LIB=%s loaded after libwex looked\n", lib);
	fflush(stdout);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		unsigned (*asked)(const char *);
		void *fake;

		setenv("WEX_CUDA_LIB", lib, 1);
		CHECK(wex__cuda_in_process() == 0);
		CHECK(wex__cuda_in_process() == 0);
		fake = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
		CHECK(fake != NULL);
		asked = (unsigned (*)(const char *))(uintptr_t)dlsym(fake, "fake_cuda_asked");
		CHECK(asked != NULL);
		CHECK(asked("cuMemCreate") == 0);
		CHECK(wex__cuda_in_process() == 0); /* found, loaded: no device */
		printf("  cuMemCreate asked %u time(s) once the driver was loaded\n",
		       asked("cuMemCreate"));
		CHECK(asked("cuMemCreate") == 1);
		dlclose(fake);
		exit(T_EXIT_PASS);
	}
	return wait_ok(pid, "later");
}

int main(void)
{
	const char *fake = getenv("WEX_FAKE_CUDA");
	const char *noproc = getenv("WEX_FAKE_CUDA_NOPROC");
	int fails = 0;

	check_tables();
	fails += run_case("default", "", NULL, "libcuda.so.1 not found") != 0;
	fails += run_case("nolib", "/nonexistent/libcuda.so.1", NULL, "not found") != 0;
	fails += run_case("noproc", noproc, NULL, "cuGetProcAddress") != 0;
	fails += run_case("missing", fake, "cuMemCreate", "cuMemCreate") != 0;
	fails += run_case("nodevice", fake, NULL, "CUDA_ERROR_NO_DEVICE") != 0;
	setenv("FAKE_CUDA_NOVERSION", "1", 1);
	fails += run_case("noversion", fake, NULL, "CUDA_ERROR_NO_DEVICE") != 0;
	unsetenv("FAKE_CUDA_NOVERSION");
	fails += run_later(fake) != 0;
	if (fails) {
		printf("FAIL: %d case(s)\n", fails);
		return T_EXIT_FAIL;
	}
	printf("PASS\n");
	return T_EXIT_PASS;
}
