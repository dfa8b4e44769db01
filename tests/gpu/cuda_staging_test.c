/* SPDX-License-Identifier: MIT */
/*
 * cuda_staging_test.c - pinned host staging (label gpu; 77 without a
 * device): the producer copies device memory once into a pinned memfd and
 * passes the fd; the consumer pins its own mapping of it and copies into
 * its device memory.  fds do not leak on either side.
 *   import_checks  a memfd not sealed against shrinking (its owner could
 *                  cut it under our mapping), or shorter than the size
 *                  asked, is refused with -EINVAL; the fd is closed
 */
#include <sys/mman.h>

#include "gpu_util.h"

enum { OP_STAGED = 1, OP_DONE };

#define SSZ ((32u << 20) + 17u)

/* One round of what a side does, on scratch memory, before its fds are
 * counted: the driver may keep fds of its own from the first allocation,
 * copy, pinning and stream on. */
static void warm_up(void)
{
	struct wex__cuda_staging st, in;
	CUdeviceptr d;
	int fd;

	CU_OK(wex__cu.cuMemAlloc(&d, 1 << 20));
	dev_fill(d, 1 << 20, 3);
	CHECK_OK(wex__cuda_staging_create(1 << 20, 0, &st));
	CHECK_OK(wex__cuda_staging_d2h(&st, 0, d, 1 << 20));
	/* One pinned mapping of the memfd at a time, as in the test. */
	fd = dup(st.fd);
	CHECK(fd >= 0);
	CHECK_OK(wex__cuda_staging_destroy(&st));
	CHECK_OK(wex__cuda_staging_import(fd, 1 << 20, 0, &in));
	CU_OK(wex__cu.cuMemsetD8Async(d, 0, 1 << 20, NULL));
	CU_OK(wex__cu.cuCtxSynchronize());
	CHECK_OK(wex__cuda_staging_h2d(&in, 0, d, 1 << 20));
	CHECK(dev_check(d, 1 << 20, 3, 0));
	CHECK_OK(wex__cuda_staging_destroy(&in));
	CU_OK(wex__cu.cuMemFree(d));
}

static void producer(int sock)
{
	struct wex__cuda_staging st;
	CUdeviceptr d;
	int before;

	CHECK_OK(wex__cuda_use_device(0));
	warm_up();
	before = fd_count(); /* after the driver's own fds */
	CU_OK(wex__cu.cuMemAlloc(&d, SSZ));
	dev_fill(d, SSZ, 8);
	CHECK_OK(wex__cuda_staging_create(SSZ + 100, 0, &st));
	CHECK_OK(wex__cuda_staging_d2h(&st, 100, d, SSZ));
	CHECK(wex__cuda_staging_d2h(&st, 101, d, SSZ) == -EINVAL);
	tsend(sock, OP_STAGED, NULL, SSZ + 100, st.fd);
	trecv(sock, OP_DONE, NULL);
	CHECK_OK(wex__cuda_staging_destroy(&st));
	CU_OK(wex__cu.cuMemFree(d));
	CHECK_FDS(before);
}

static void consumer(int sock)
{
	struct wex__cuda_staging st;
	CUdeviceptr d;
	int fd, before;
	struct tmsg m;

	CHECK_OK(wex__cuda_use_device(0));
	warm_up();
	before = fd_count(); /* after the driver's own fds */
	m = trecv(sock, OP_STAGED, &fd);
	CHECK(fd >= 0);
	CHECK_OK(wex__cuda_staging_import(fd, m.a, 0, &st));
	CU_OK(wex__cu.cuMemAlloc(&d, SSZ));
	CHECK_OK(wex__cuda_staging_h2d(&st, 100, d, SSZ));
	CHECK(dev_check(d, SSZ, 8, 0));
	CU_OK(wex__cu.cuMemFree(d));
	CHECK_OK(wex__cuda_staging_destroy(&st));
	CHECK_FDS(before);
	tsend(sock, OP_DONE, NULL, 0, -1);
}

static int staging_memfd(uint64_t size, unsigned seals)
{
	int fd = memfd_create("t-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	CHECK(fd >= 0 && ftruncate(fd, (off_t)size) == 0);
	if (seals)
		CHECK(fcntl(fd, F_ADD_SEALS, seals) == 0);
	return fd;
}

static void import_checks(void)
{
	struct wex__cuda_staging st;
	int before;

	CHECK_OK(wex__cuda_use_device(0));
	warm_up();
	before = fd_count(); /* after the driver's own fds */
	/* Unsealed, and sealed only against growing: refused. */
	CHECK(wex__cuda_staging_import(staging_memfd(1 << 20, 0), 1 << 20, 0, &st) == -EINVAL);
	CHECK(wex__cuda_staging_import(staging_memfd(1 << 20, F_SEAL_GROW), 1 << 20, 0, &st) ==
	      -EINVAL);
	/* Sealed but shorter than asked: refused. */
	CHECK(wex__cuda_staging_import(staging_memfd(1 << 20, F_SEAL_SHRINK), 2 << 20, 0, &st) ==
	      -EINVAL);
	/* Not a memfd at all (no seals to ask for): refused. */
	CHECK(wex__cuda_staging_import(dup(STDERR_FILENO), 1 << 20, 0, &st) == -EINVAL);
	CHECK_FDS(before);
	/* Sealed against shrinking, long enough: taken. */
	CHECK_OK(wex__cuda_staging_import(staging_memfd(2 << 20, F_SEAL_SHRINK), 1 << 20, 0, &st));
	CHECK_OK(wex__cuda_staging_destroy(&st));
	CHECK_FDS(before);
}

int main(void)
{
	int ret;

	gpu_require();
	ret = run_pair("staging", producer, consumer);
	ret |= run_one("import_checks", import_checks);
	printf("%s\n", ret ? "FAIL" : "PASS");
	return ret ? T_EXIT_FAIL : T_EXIT_PASS;
}
