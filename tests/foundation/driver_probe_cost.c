/* SPDX-License-Identifier: MIT */
/*
 * driver_probe_cost - on a host with no CUDA driver loaded, libwex's
 * checks for GPU memory do not look for the driver library on disk at
 * every call.  libwex asks whether someone in the process (PyTorch) loaded
 * libcuda at each call that may meet GPU memory; it asked with
 * dlopen(RTLD_NOLOAD), which for a library not loaded still searches the
 * library path (ld.so.cache mapped, each directory tried): three searches
 * per tensor of an attach, 60,000 for 20,000 tensors, 4 of the 5.8 s a
 * restart's reconnect took in reconnect_short on the dev VM.  Counted
 * with glibc's LD_DEBUG=libs, which logs each search ("find
 * library=libcuda.so.1"): the test runs itself again under it, attaches
 * and syncs 2000 host tensors, and allows a handful of searches (the
 * driver's one real load, where something asks for it) rather than
 * thousands.  With WEX_T_CUDART (tests/foundation/cudart_stub.c, built as
 * libcudart.so.12) loaded first, as a process that imported PyTorch's
 * CUDA build has the CUDA runtime loaded and no driver yet: a library
 * whose name starts with "libcuda" is no reason to search again.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

#define N 2000
#define ELEMS 4 /* f32 per tensor */

static struct wex_tensor *tensors(uint64_t *bytes)
{
	struct wex_tensor *t = calloc(N, sizeof(*t));

	T_ASSERT(t, "calloc");
	for (int i = 0; i < N; i++) {
		snprintf(t[i].name, sizeof(t[i].name), "model.layers.%d.weight", i);
		t[i].dtype = WEX_DT_F32;
		t[i].ndim = 1;
		t[i].shape[0] = ELEMS;
		t[i].extent[0] = ELEMS;
		t[i].offset = (uint64_t)i * ELEMS * 4;
	}
	*bytes = (uint64_t)N * ELEMS * 4;
	return t;
}

/* Lines of the loader's log (LD_DEBUG_OUTPUT's file for this process)
 * that search for the driver library. */
static int searches(const char *log, const char *lib)
{
	char line[1024], want[300];
	FILE *f = fopen(log, "r");
	int n = 0;

	if (!f)
		return -1;
	snprintf(want, sizeof(want), "find library=%s ", lib);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, want) != NULL;
	fclose(f);
	return n;
}

/* Removes the loader's logs (this process's and wexd's) and their
 * directory. */
static void logs_remove(const char *out)
{
	char tmp[512], dir[512], path[1024];
	struct dirent *e;
	DIR *dp;

	snprintf(tmp, sizeof(tmp), "%s", out);
	snprintf(dir, sizeof(dir), "%s", dirname(tmp));
	if (!(dp = opendir(dir)))
		return;
	while ((e = readdir(dp)))
		if (e->d_name[0] != '.') {
			snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
			unlink(path);
		}
	closedir(dp);
	rmdir(dir);
}

int main(int argc, char **argv)
{
	const char *lib = getenv("WEX_CUDA_LIB"), *out = getenv("WEX_T_LD_DEBUG");
	const char *cudart = getenv("WEX_T_CUDART");
	void *rt = NULL;
	struct wex_tensor *pt, *kt;
	struct wex_sync_result r;
	struct t_wexd d;
	char log[512];
	uint64_t bytes;
	uint32_t seg;
	void *base, *region;
	wex_client_t *p, *k;
	int n;

	(void)argc;
	if (lib && *lib)
		T_SKIP("WEX_CUDA_LIB is set (%s): this test counts searches for libcuda.so.1", lib);
	if (!out) {
		/* The loader reads LD_DEBUG at start: run again under it. */
		static char dir[] = "/tmp/wex-ldd-XXXXXX";
		char path[300];

		T_ASSERT(mkdtemp(dir), "mkdtemp");
		snprintf(path, sizeof(path), "%s/ld", dir);
		setenv("LD_DEBUG", "libs", 1);
		setenv("LD_DEBUG_OUTPUT", path, 1);
		setenv("WEX_T_LD_DEBUG", path, 1);
		execv("/proc/self/exe", argv);
		T_FAIL("execv /proc/self/exe: %s", strerror(errno));
	}
	snprintf(log, sizeof(log), "%s.%d", out, (int)getpid());
	if (cudart && *cudart)
		T_ASSERT((rt = dlopen(cudart, RTLD_NOW | RTLD_LOCAL)), "dlopen %s: %s", cudart, dlerror());
	/* (wexd, a child, must not write its searches into ours.) */
	t_wexd_start(&d);
	pt = tensors(&bytes);
	kt = tensors(&bytes);
	p = t_open(WEX_ROLE_PRODUCER, "probe", NULL, 0, 1);
	T_WEX(p, wex_segment_alloc(p, WEX_SEG_HOST, 0, bytes, &seg, &base));
	for (int i = 0; i < N; i++)
		pt[i].segment = seg;
	T_WEX(p, wex_register_tensors(p, pt, N));
	k = t_open(WEX_ROLE_CONSUMER, "probe", "g", 0, 1);
	T_WEX(k, wex_reserve(k, 0, 0, bytes, &region));
	for (int i = 0; i < N; i++)
		kt[i].ptr = (char *)region + kt[i].offset;
	T_WEX(k, wex_attach(k, kt, N));
	for (uint64_t v = 1; v <= 2; v++) {
		T_WEX(p, wex_begin_write(p, v, 5000));
		memset(base, (int)v, bytes);
		T_WEX(p, wex_publish(p, v));
		T_WEX(k, wex_sync(k, WEX_SYNC_COPY, v, 5000, &r));
		T_ASSERT(r.version == v, "synced v%llu, not v%llu", (unsigned long long)r.version,
			 (unsigned long long)v);
	}
	wex_client_close(k);
	wex_client_close(p);
	n = searches(log, "libcuda.so.1");
	t_wexd_stop(&d);
	logs_remove(out);
	if (n < 0)
		T_SKIP("the loader wrote no LD_DEBUG log at %s (a secure-execution process?)", log);
	printf("%d tensors attached, 2 copy syncs, %s loaded: %d searches for libcuda.so.1\n", N,
	       rt ? cudart : "no libcudart", n);
	T_ASSERT(n <= 4, "%d searches for libcuda.so.1 (LD_DEBUG=libs) for %d tensors: libwex looks "
		 "for the driver on disk at every call", n, N);
	free(pt);
	free(kt);
	if (rt)
		dlclose(rt);
	return T_EXIT_PASS;
}
