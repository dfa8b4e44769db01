/* SPDX-License-Identifier: MIT */
/*
 * cuda_near - a copy sync reads the replica on the engine's own GPU.
 *
 * Producer ranks (data-parallel replicas: each holds every tensor)
 * register the same tensors through a real wexd: rank 0 in cuda_vmm
 * memory on device 0 (wex_cuda_alloc), rank 1 in a host segment and, with
 * a second device, rank 2 on device 1.  Their bytes differ on purpose
 * (rank r adds r to every element), so what a consumer reads tells where
 * it read it.  This process, the consumer:
 *  1. attaches a layout in host memory: no replica is on its device, so
 *     the plan spreads over all (bytes of each arrive; with rank 2, the
 *     copies from two GPUs each run on their source's GPU, the only one
 *     the import is mapped for);
 *  2. attaches a layout in device 0's memory: its attach names that GPU,
 *     wexd plans every element from rank 0 (on that GPU, a local copy)
 *     and none from the others; `plans` lists that plan with the GPU's
 *     UUID and one near rank;
 *  3. with a second device, a layout on device 1 reads rank 2 only.
 * Needs a CUDA driver and device (exit 77 with the reason otherwise); CI
 * runs it against tests/gpu/emul_cuda.c (cuda_near_emul).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "gpu_util.h"
#include "vmm/backend.h"
#include "wex.h"

#define NT 8
#define ROWS 512
#define COLS 1024 /* bf16: 1 MiB a tensor */

static uint16_t val(int t, uint64_t e, int rank)
{
	return (uint16_t)((e * 2654435761u ^ (uint32_t)t * 40503u) + (uint32_t)rank);
}

/* CUDA devices, counted in a child (a process that forks producers
 * later must not have initialised the driver). */
static int device_count(void)
{
	int st = 0, n = 0;
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		if (wex__cuda_load() != 0 || wex__cu.cuDeviceGetCount(&n) != CUDA_SUCCESS)
			_exit(0);
		_exit(n > 100 ? 100 : n);
	}
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st));
	return WEXITSTATUS(st);
}

static int world; /* 3 with a second device, else 2 */

/* One producer rank: 0 on device 0, 1 in host memory, 2 on device 1. */
static void rank_main(int rank, int go_fd, int done_fd)
{
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL | WEX_CLIENT_FIELD_RANK,
		.role = WEX_ROLE_PRODUCER, .model = "near", .rank = (uint32_t)rank,
		.world_size = (uint32_t)world,
	};
	struct wex_tensor t[NT];
	uint64_t total = gpu_bf16_tensors(t, NT, ROWS, COLS, 0);
	wex_client_t *c;
	uint16_t *h = malloc(total);
	uint32_t seg;
	void *mem;
	char ch = 'p';

	CHECK(h != NULL);
	for (int i = 0; i < NT; i++)
		for (uint64_t e = 0; e < (uint64_t)ROWS * COLS; e++)
			h[(size_t)i * ROWS * COLS + e] = val(i, e, rank);
	CHECK_OK(wex_client_open(&p, &c));
	if (rank != 1) {
		mem = wex_cuda_alloc((ssize_t)total, rank / 2, NULL);
		CHECK(mem != NULL);
		CHECK_OK(xfer(mem, h, total));
		CHECK_OK(wex_segment_register_ptr(c, WEX_SEG_CUDA_VMM, mem, total, &seg));
	} else {
		CHECK_OK(wex_segment_alloc(c, WEX_SEG_HOST, 0, total, &seg, &mem));
		memcpy(mem, h, total);
	}
	for (int i = 0; i < NT; i++)
		t[i].segment = seg;
	CHECK_OK(wex_register_tensors(c, t, NT));
	CHECK_OK(wex_begin_write(c, 1, 5000));
	CHECK_OK(wex_publish(c, 1));
	CHECK(write(done_fd, &ch, 1) == 1);
	/* Hold the memory until the test is done. */
	CHECK(read(go_fd, &ch, 1) >= 0);
	wex_client_close(c);
	if (rank != 1)
		wex_cuda_free(mem, (ssize_t)total, rank / 2, NULL);
	free(h);
}

/* Forks ranks 1 (and 2) before any CUDA call (no CUDA in a child forked
 * after the driver was initialised), then is rank 0; exits 0 only if all
 * did. */
static void producer(int go_fd, int done_fd)
{
	pid_t pid[3];
	int st;

	for (int r = 1; r < world; r++) {
		pid[r] = fork();
		CHECK(pid[r] >= 0);
		if (pid[r] == 0) {
			rank_main(r, go_fd, done_fd);
			_exit(0);
		}
	}
	rank_main(0, go_fd, done_fd);
	for (int r = 1; r < world; r++)
		CHECK(waitpid(pid[r], &st, 0) == pid[r] && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	_exit(0);
}

/* Syncs a copy into buf (host or device memory) and counts the elements
 * that came from each rank, printed after `what`; any other value fails. */
static void copy_from(wex_client_t *c, const char *what, void *buf, int on_gpu, uint64_t total,
		      uint64_t from[3])
{
	struct wex_tensor t[NT];
	struct wex_sync_result r;
	uint16_t *h = malloc(total);

	CHECK(h != NULL);
	gpu_bf16_tensors(t, NT, ROWS, COLS, 0);
	for (int i = 0; i < NT; i++)
		t[i].ptr = (char *)buf + t[i].offset;
	CHECK_OK(wex_attach(c, t, NT));
	CHECK_OK(wex_sync(c, WEX_SYNC_COPY, 1, 10000, &r));
	CHECK(r.version == 1 && r.bytes == total);
	if (on_gpu)
		CHECK_OK(xfer(h, buf, total));
	else
		memcpy(h, buf, total);
	from[0] = from[1] = from[2] = 0;
	for (int i = 0; i < NT; i++)
		for (uint64_t e = 0; e < (uint64_t)ROWS * COLS; e++) {
			uint16_t v = h[(size_t)i * ROWS * COLS + e];
			int k = 0;

			while (k < world && v != val(i, e, k))
				k++;
			CHECK(k < world); /* else no replica's value */
			from[k]++;
		}
	printf("%s: %llu elements from rank 0 (device 0), %llu from rank 1 (host), %llu from "
	       "rank 2 (device 1)\n", what, (unsigned long long)from[0], (unsigned long long)from[1],
	       (unsigned long long)from[2]);
	free(h);
}

int main(void)
{
	struct wex_client_params p = { .field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL,
				       .role = WEX_ROLE_CONSUMER, .model = "near" };
	struct wex_tensor t[NT];
	uint64_t total = gpu_bf16_tensors(t, NT, ROWS, COLS, 0), from[3];
	struct gpu_world w;
	wex_client_t *c;
	void *hbuf, *dbuf;
	char ch;

	gpu_require();
	world = device_count() > 1 ? 3 : 2;
	if (world == 2)
		printf("one device: rank 2 on device 1 not tried\n");
	gpu_world_start(&w, producer);
	for (int r = 0; r < world; r++)
		CHECK(read(w.from_prod, &ch, 1) == 1);
	CHECK_OK(wex_client_open(&p, &c));

	/* 1. A layout in host memory: every replica serves. */
	hbuf = malloc(total);
	CHECK(hbuf != NULL);
	copy_from(c, "host layout", hbuf, 0, total, from);
	CHECK(from[0] > 0 && from[1] > 0 && (world == 2 || from[2] > 0));

	/* 2. A layout on device 0: only the replica there. */
	dbuf = wex_cuda_alloc((ssize_t)total, 0, NULL);
	CHECK(dbuf != NULL);
	copy_from(c, "device 0 layout", dbuf, 1, total, from);
	CHECK(from[1] == 0 && from[2] == 0 && from[0] == total / 2);
	{
		/* wexd lists the plan with the GPU and its one near rank. */
		char uuid[48], *js = NULL;
		json_t *j, *pl;
		size_t i;
		int seen = 0;

		CHECK_OK(wex__cuda_device_uuid(0, uuid, sizeof(uuid)));
		CHECK_OK(wex_request(c, "plans", NULL, &js));
		j = json_loads(js, 0, NULL);
		CHECK(j != NULL);
		json_array_foreach(json_object_get(j, "plans"), i, pl)
			if (!strcmp(json_string_value(json_object_get(pl, "device")), uuid) &&
			    json_integer_value(json_object_get(pl, "near_ranks")) == 1)
				seen = 1;
		printf("plans: %s\n", js);
		CHECK(seen);
		json_decref(j);
		wex_free(js);
	}

	/* 3. A layout on device 1: only the replica there. */
	if (world == 3) {
		void *d1 = wex_cuda_alloc((ssize_t)total, 1, NULL);

		CHECK(d1 != NULL);
		copy_from(c, "device 1 layout", d1, 1, total, from);
		CHECK(from[0] == 0 && from[1] == 0 && from[2] == total / 2);
		wex_cuda_free(d1, (ssize_t)total, 1, NULL);
	}

	wex_client_close(c);
	wex_cuda_free(dbuf, (ssize_t)total, 0, NULL);
	free(hbuf);
	gpu_world_stop(&w);
	printf("PASS: copies read the replica on the engine's GPU\n");
	return 0;
}
