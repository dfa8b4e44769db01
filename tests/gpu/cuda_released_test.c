/* SPDX-License-Identifier: MIT */
/*
 * cuda_released - copy syncs into GPU memory the engine released while
 * keeping its addresses, as vLLM's sleep mode and torch_memory_saver do
 * (cuMemUnmap and cuMemRelease under a kept cuMemAddressReserve; waking
 * maps new allocations at the same addresses).
 *
 * A producer child holds NT tensors in a VMM range and writes version v
 * as bytes of vbyte(v).  This process, the consumer, holds its own copy
 * of them in a range of two allocations it mapped itself (not wex's
 * regions: the engine's memory), and checks:
 *  1. a copy sync of v1 fills every byte;
 *  2. both allocations released ("asleep"), v2 published: the copy sync
 *     fails with -EFAULT before anything is acquired or copied, naming a
 *     tensor and saying that nothing is mapped there; not dirty; a
 *     re-attach is refused the same way; wexd still hands v2 to another
 *     consumer, and the producer can write v3 (no lease was taken);
 *  3. only the second allocation released: refused, naming a tensor of
 *     the second half (w.2);
 *  4. new allocations mapped ("awake"): the copy sync copies the newest
 *     version into every byte, and this process's CUDA context still
 *     works (no sticky error from a copy into unmapped memory);
 *  5. same-address syncs of a consumer whose layout keeps w.0 and w.1 in
 *     its reserved region and w.2 and w.3 in the engine's range, the
 *     second allocation released: a plain one maps the region (nothing
 *     outside it is touched); one with WEX_SYNC_VERIFY is refused
 *     (-EFAULT naming w.2) before anything is acquired, the regions
 *     untouched; a plain one that `wexctl verify` asked to verify
 *     (wexd's ask comes with the acquire, after the sync's own check)
 *     goes on, and wexd hears "failed" saying that nothing is mapped at
 *     w.2, with nothing compared (without that check the comparison
 *     reads there: emulated, the process dies of SIGSEGV);
 *  6. a layout of 1024 pieces of the producer's tensors spread over an
 *     engine range of 8 allocations, listed round-robin over them (the
 *     middle one's from its end), plus 7 pieces across the boundaries
 *     listed last: attached and copied whole, the driver asked about each
 *     allocation twice, not about each piece (emulated: at most 2
 *     queries per allocation, 5 where MAPPED has no answer, plus 8, for
 *     the attach and for the sync; 2066 in the layout's order, 32 where
 *     a piece across a boundary made the next ones ask again); the middle
 *     allocation released: refused, naming the piece across its start
 *     (the lowest address reaching it) and saying that nothing is mapped
 *     at its first address;
 * and wex_released says where nothing is mapped (the first address of
 * the second allocation in step 3; the middle one of three, also from a
 * thread with no CUDA context current), 0 for mapped memory (VMM,
 * cuMemAlloc), page-locked and pageable host memory, -EINVAL for NULL or
 * a length that overflows.  Also run with the driver answering MAPPED 0
 * for memory it does not know (cuda_released_mapped_zero_emul) and with
 * an error everywhere (cuda_released_mapped_err_emul).
 * Needs a CUDA driver and device (exit 77 with the reason otherwise); CI
 * runs it against tests/gpu/emul_cuda.c (cuda_released_emul), where a
 * copy into a reservation with nothing mapped fails with
 * CUDA_ERROR_ILLEGAL_ADDRESS, the driver's sticky error.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "gpu_util.h"
#include "wex.h"

#define NT 4

static uint64_t tbytes; /* half an allocation: two tensors in each */

static unsigned char vbyte(uint64_t v)
{
	return (unsigned char)(v * 37 + 11);
}

static void make_tensors(struct wex_tensor *t, uint32_t seg, uint64_t base)
{
	memset(t, 0, sizeof(*t) * NT);
	for (int i = 0; i < NT; i++) {
		snprintf(t[i].name, sizeof(t[i].name), "w.%d", i);
		t[i].dtype = WEX_DT_U8;
		t[i].ndim = 1;
		t[i].shape[0] = t[i].extent[0] = tbytes;
		t[i].segment = seg;
		t[i].offset = (uint64_t)i * tbytes;
		if (base)
			t[i].ptr = (void *)(uintptr_t)(base + t[i].offset);
	}
}

/* The producer: writes version after version on request ('w' in, 'k' out). */
static void producer(int cmd, int ack)
{
	struct wex_client_params p = { .field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL,
				       .role = WEX_ROLE_PRODUCER, .model = "released" };
	uint64_t total, v = 0;
	CUmemGenericAllocationHandle h[2];
	struct wex_tensor t[NT];
	wex_client_t *c;
	CUdeviceptr va;
	uint32_t seg;
	char ch;

	/* Forked before the test touched CUDA, it asks the driver itself. */
	tbytes = gpu_granularity() / 2;
	total = NT * tbytes;
	va = gpu_expandable(2, total / 2, h);
	CHECK_OK(wex_client_open(&p, &c));
	CHECK_OK(wex_segment_register_ptr(c, WEX_SEG_CUDA_VMM, (void *)(uintptr_t)va, total, &seg));
	make_tensors(t, seg, 0);
	CHECK_OK(wex_register_tensors(c, t, NT));
	while (read(cmd, &ch, 1) == 1 && ch == 'w') {
		v++;
		CHECK_OK(wex_begin_write(c, v, 10000));
		CU_OK(wex__cu.cuMemsetD8Async(va, vbyte(v), total, 0));
		CHECK_OK(wex_publish(c, v));
		CHECK(write(ack, "k", 1) == 1);
	}
	wex_client_close(c);
	gpu_expandable_free(va, 2, total / 2, h);
	_exit(0);
}

static void next_version(struct gpu_world *w)
{
	char ch;

	CHECK(write(w->to_prod, "w", 1) == 1);
	CHECK(read(w->from_prod, &ch, 1) == 1 && ch == 'k');
}

/* Bytes of the engine's weights at va that do not hold version v. */
static uint64_t bad_bytes(CUdeviceptr va, uint64_t v)
{
	unsigned char *h = calloc(1, NT * tbytes);
	uint64_t bad = 0;

	CHECK(h != NULL);
	CHECK_OK(xfer(h, (void *)(uintptr_t)va, NT * tbytes));
	for (uint64_t b = 0; b < NT * tbytes; b++)
		bad += h[b] != vbyte(v);
	free(h);
	return bad;
}

/* The engine's allocation i of the range at va: released, or mapped anew
 * (as vLLM's CuMemAllocator and torch_memory_saver do). */
static void release(CUdeviceptr va, CUmemGenericAllocationHandle *h, int i)
{
	CU_OK(wex__cu.cuMemUnmap(va + i * 2 * tbytes, 2 * tbytes));
	CU_OK(wex__cu.cuMemRelease(h[i]));
}

static void map_new(CUdeviceptr va, CUmemGenericAllocationHandle *h, int i)
{
	CUmemAllocationProp prop = gpu_vmm_prop(CU_MEM_HANDLE_TYPE_NONE);
	CUmemAccessDesc acc = gpu_rw_access();

	CU_OK(wex__cu.cuMemCreate(&h[i], 2 * tbytes, &prop, 0));
	CU_OK(wex__cu.cuMemMap(va + i * 2 * tbytes, 2 * tbytes, 0, h[i], 0));
	CU_OK(wex__cu.cuMemSetAccess(va + i * 2 * tbytes, 2 * tbytes, &acc, 1));
}

/* wex_released from a thread of its own: no CUDA context current there. */
struct probe {
	CUdeviceptr va;
	uint64_t len, at;
	int ret;
};

static void *probe_thread(void *arg)
{
	struct probe *pr = arg;

	pr->ret = wex_released((void *)(uintptr_t)pr->va, pr->len, &pr->at);
	return NULL;
}

static wex_client_t *consumer(const char *group)
{
	struct wex_client_params p = { .field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL |
						     WEX_CLIENT_FIELD_GROUP,
				       .role = WEX_ROLE_CONSUMER, .model = "released", .group = group };
	wex_client_t *c;

	CHECK_OK(wex_client_open(&p, &c));
	return c;
}

/* A copy sync refused for released memory: -EFAULT before anything was
 * acquired, naming `tensor`, not dirty. */
static void refused(wex_client_t *c, const char *tensor)
{
	struct wex_sync_result r;
	int ret = wex_sync(c, WEX_SYNC_COPY, 0, 3000, &r);
	const char *err = wex_last_error(c);

	printf("refused: %s\n", err);
	CHECK(ret == -EFAULT);
	CHECK(strstr(err, tensor) != NULL);
	CHECK(strstr(err, "nothing is mapped") != NULL);
	CHECK(strstr(err, "nothing was acquired or copied") != NULL);
	CHECK(wex_is_dirty(c) == 0);
}

/* Asks group `group` to verify its next sync, as `wexctl verify` does:
 * returns the ticket. */
static long ask_verify(wex_client_t *c, const char *group)
{
	char args[160], *reply = NULL;
	json_t *j;
	long ticket;

	snprintf(args, sizeof(args), "{\"model\":\"released\",\"group\":\"%s\",\"stand_ms\":60000}",
		 group);
	CHECK_OK(wex_request(c, "verify", args, &reply));
	j = json_loads(reply, 0, NULL);
	CHECK(j != NULL);
	ticket = (long)json_integer_value(json_object_get(j, "ticket"));
	CHECK(ticket > 0);
	json_decref(j);
	wex_free(reply);
	return ticket;
}

/* wexd's record of rank 0 of `group`'s answer to `ticket`: its result
 * and why, in result and why ("" where there is none). */
static void ticket_answer(wex_client_t *c, const char *group, long ticket, char *result,
			  char *why, size_t whylen)
{
	char args[160], *reply = NULL;
	json_t *j, *v;

	snprintf(args, sizeof(args), "{\"model\":\"released\",\"group\":\"%s\",\"ticket\":%ld}",
		 group, ticket);
	CHECK_OK(wex_request(c, "verify", args, &reply));
	j = json_loads(reply, 0, NULL);
	CHECK(j != NULL);
	v = json_object_get(json_array_get(json_object_get(json_array_get(json_object_get(j, "groups"), 0),
							   "ranks"),
					   0),
			    "verify");
	snprintf(result, 32, "%s", json_string_value(json_object_get(v, "result")) ?: "");
	snprintf(why, whylen, "%s", json_string_value(json_object_get(v, "why")) ?: "");
	json_decref(j);
	wex_free(reply);
}

/* 5. Same-address syncs with a layout partly outside the regions, in the
 * engine's range at va, whose second allocation (w.2, w.3) is released
 * here and mapped anew before returning.  wexd serves v3. */
static void same_address(CUdeviceptr va, CUmemGenericAllocationHandle *h)
{
	struct wex_tensor ft[NT];
	struct wex_sync_result r;
	char result[32], why[512];
	wex_client_t *f = consumer("fixed");
	const struct wex_tensor *pt;
	unsigned char *hb;
	void *region;
	long ticket;
	size_t n;
	int ret;

	/* The producer's segment id, from a view sync. */
	CHECK_OK(wex_sync(f, WEX_SYNC_REMAP_VIEW, 3, 10000, &r));
	CHECK(wex_producer_tensors(f, 0, &pt, &n) == 1 && n == NT);
	CHECK_OK(wex_reserve(f, 0, pt[0].segment, NT * tbytes, &region));
	CHECK_OK(wex_release(f));
	make_tensors(ft, 0, (uint64_t)(uintptr_t)region);
	ft[2].ptr = (void *)(uintptr_t)(va + 2 * tbytes);
	ft[3].ptr = (void *)(uintptr_t)(va + 3 * tbytes);
	CHECK_OK(wex_attach(f, ft, NT));
	/* Awake, holding v3 (step 4): equal where the layout says. */
	CHECK_OK(wex_sync(f, WEX_SYNC_REMAP_FIXED | WEX_SYNC_VERIFY, 3, 10000, &r));
	CHECK(r.version == 3 && r.verified == NT * tbytes);
	CHECK_OK(wex_release(f));

	release(va, h, 1);
	/* Plain: only the region is written, and it shows v3. */
	CHECK_OK(wex_sync(f, WEX_SYNC_REMAP_FIXED, 3, 10000, &r));
	CHECK(r.version == 3 && !wex_is_dirty(f));
	hb = malloc(NT * tbytes);
	CHECK(hb != NULL);
	CHECK_OK(xfer(hb, region, NT * tbytes));
	for (uint64_t b = 0; b < NT * tbytes; b++)
		CHECK(hb[b] == vbyte(3));
	free(hb);
	CHECK_OK(wex_release(f));
	/* Verified by the caller: refused before the acquire. */
	ret = wex_sync(f, WEX_SYNC_REMAP_FIXED | WEX_SYNC_VERIFY, 3, 3000, &r);
	printf("verified same-address sync refused: %s\n", wex_last_error(f));
	CHECK(ret == -EFAULT);
	CHECK(strstr(wex_last_error(f), "verified same-address sync: tensor 'w.2'") != NULL);
	CHECK(strstr(wex_last_error(f), "nothing was acquired or copied") != NULL);
	CHECK(!wex_is_dirty(f));
	/* Asked by wexd: the sync goes on, the verification fails saying why. */
	ticket = ask_verify(f, "fixed");
	CHECK_OK(wex_sync(f, WEX_SYNC_REMAP_FIXED, 3, 10000, &r));
	CHECK(r.version == 3 && !wex_is_dirty(f));
	ticket_answer(f, "fixed", ticket, result, why, sizeof(why));
	printf("wexctl verify's answer: %s: %s\n", result, why);
	CHECK(!strcmp(result, "failed"));
	CHECK(strstr(why, "verify: tensor 'w.2'") != NULL && strstr(why, "nothing is mapped") &&
	      strstr(why, "nothing was compared"));
	CHECK_OK(wex_release(f));
	wex_client_close(f);
	map_new(va, h, 1);
}

/* Driver queries so far (emulated; 0 on a GPU). */
static unsigned long queries(void)
{
	return emul_calls("cuPointerGetAttribute") + emul_calls("cuMemGetAddressRange");
}

#define NMAP 8
#define NPIECE 1024
#define NSPAN (NMAP - 1)

/* 6. Many pieces over many allocations, in an order that jumps between
 * them, and pieces across each boundary.  wexd serves v3. */
static void many_pieces(void)
{
	uint64_t gran = 2 * tbytes, bs = NT * tbytes / NPIECE, per = NPIECE / NT, q0;
	uint64_t slots = NPIECE / NMAP;
	/* Two queries an allocation (five where MAPPED has no answer), plus
	 * a few of the call's own (attach: the layout's device; sync: the
	 * copies' devices): 2 and 6 now. */
	unsigned long most = (getenv("WEX_EMUL_MAPPED_ERR") ? 5 : 2) * NMAP + 8;
	CUmemGenericAllocationHandle h[NMAP];
	struct wex_tensor *t = calloc(NPIECE + NSPAN, sizeof(*t));
	unsigned char *hb = malloc(gran);
	struct wex_sync_result r;
	wex_client_t *c = consumer("pieces");
	char want[64];
	CUdeviceptr va;
	int ret;

	CHECK(t != NULL && hb != NULL && (slots + 1) * bs <= gran - bs / 2);
	va = gpu_expandable(NMAP, gran, h);
	/* Piece k: bytes [k % per * bs, +bs) of w.(k / per), in allocation
	 * k % NMAP at slot k / NMAP (from the end in the middle allocation:
	 * its first piece listed is its last in address order), slot s at
	 * offset (s + 1) * bs. */
	for (int k = 0; k < NPIECE; k++) {
		uint64_t m = (uint64_t)k % NMAP, kk = (uint64_t)k / NMAP;
		uint64_t slot = m == NMAP / 2 ? slots - 1 - kk : kk;

		snprintf(t[k].name, sizeof(t[k].name), "w.%d", (int)(k / per));
		t[k].dtype = WEX_DT_U8;
		t[k].ndim = 1;
		t[k].shape[0] = tbytes;
		t[k].start[0] = k % per * bs;
		t[k].extent[0] = bs;
		t[k].ptr = (void *)(uintptr_t)(va + m * gran + (slot + 1) * bs);
	}
	/* Listed last: piece j across the boundary of allocations j and
	 * j + 1 (bytes [0, bs) of w.0 again). */
	for (int j = 0; j < NSPAN; j++) {
		struct wex_tensor *x = &t[NPIECE + j];

		*x = t[0];
		x->ptr = (void *)(uintptr_t)(va + (j + 1) * gran - bs / 2);
	}
	q0 = queries();
	CHECK_OK(wex_attach(c, t, NPIECE + NSPAN));
	printf("%d pieces over %d allocations (%d across boundaries): %lu driver queries to "
	       "attach", NPIECE + NSPAN, NMAP, NSPAN, queries() - q0);
	CHECK(queries() - q0 <= most);
	q0 = queries();
	CHECK_OK(wex_sync(c, WEX_SYNC_COPY, 3, 10000, &r));
	printf(", %lu to sync (at most %lu)\n", queries() - q0, most);
	CHECK(queries() - q0 <= most);
	CHECK(r.version == 3 && r.changed && r.bytes == NT * tbytes + NSPAN * bs);
	for (int m = 0; m < NMAP; m++) {
		CHECK_OK(xfer(hb, (void *)(uintptr_t)(va + m * gran), gran));
		for (uint64_t b = bs; b < (slots + 1) * bs; b++)
			CHECK(hb[b] == vbyte(3));
		for (uint64_t b = 0; b < bs / 2; b++) /* the pieces across */
			CHECK((m == 0 || hb[b] == vbyte(3)) &&
			      (m == NMAP - 1 || hb[gran - 1 - b] == vbyte(3)));
	}

	/* The middle allocation released: refused, naming the piece at the
	 * lowest address that reaches it (the one across its start). */
	release(va, h, NMAP / 2); /* (allocations of 2 * tbytes, as release() takes) */
	ret = wex_sync(c, WEX_SYNC_COPY, 3, 3000, &r);
	printf("refused: %s\n", wex_last_error(c));
	snprintf(want, sizeof(want), "bytes at 0x%llx)",
		 (unsigned long long)(va + NMAP / 2 * gran - bs / 2));
	CHECK(ret == -EFAULT && strstr(wex_last_error(c), want) != NULL);
	snprintf(want, sizeof(want), "nothing is mapped at 0x%llx,",
		 (unsigned long long)(va + NMAP / 2 * gran));
	CHECK(strstr(wex_last_error(c), want) != NULL);
	map_new(va, h, NMAP / 2);
	wex_client_close(c);
	gpu_expandable_free(va, NMAP, gran, h);
	free(hb);
	free(t);
}

int main(void)
{
	CUmemGenericAllocationHandle h[2];
	struct wex_sync_result r;
	struct wex_tensor t[NT];
	struct gpu_world w;
	wex_client_t *c, *other;
	CUdeviceptr va;
	uint64_t at;
	int ret;

	gpu_require();
	gpu_world_start(&w, producer);
	tbytes = gpu_granularity() / 2;
	next_version(&w);

	/* 1. The engine's weights in its own VMM range; a copy sync of v1. */
	va = gpu_expandable(2, 2 * tbytes, h);
	c = consumer("engine");
	make_tensors(t, 0, va);
	CHECK_OK(wex_attach(c, t, NT));
	CHECK_OK(wex_sync(c, WEX_SYNC_COPY, 1, 10000, &r));
	CHECK(r.version == 1 && r.changed && bad_bytes(va, 1) == 0);

	/* 2. Asleep: both allocations released, the addresses kept. */
	release(va, h, 0);
	release(va, h, 1);
	next_version(&w);
	CHECK(wex_released((void *)(uintptr_t)va, NT * tbytes, &at) == 1 && at == va);
	refused(c, "'w.0'");
	ret = wex_attach(c, t, NT);
	printf("attach refused: %s\n", wex_last_error(c));
	CHECK(ret == -EFAULT && strstr(wex_last_error(c), "nothing was attached") != NULL);
	/* No lease was taken: wexd serves v2 to another group, and the
	 * producer writes v3. */
	other = consumer("other");
	CHECK_OK(wex_sync(other, WEX_SYNC_REMAP_VIEW, 2, 10000, &r));
	CHECK(r.version == 2);
	CHECK_OK(wex_release(other));
	wex_client_close(other);
	next_version(&w);

	/* 3. Half asleep: the first allocation back, the second released. */
	map_new(va, h, 0);
	CHECK(wex_released((void *)(uintptr_t)va, 2 * tbytes, &at) == 0);
	CHECK(wex_released((void *)(uintptr_t)va, NT * tbytes, &at) == 1 && at == va + 2 * tbytes);
	refused(c, "'w.2'");

	/* 4. Awake: the newest version copied into every byte, and CUDA in
	 * this process still works. */
	map_new(va, h, 1);
	CHECK_OK(wex_sync(c, WEX_SYNC_COPY, 3, 10000, &r));
	CHECK(r.version == 3 && r.changed && !wex_is_dirty(c));
	CHECK(bad_bytes(va, 3) == 0); /* a device-to-host copy: the context works */
	CHECK(wex_released((void *)(uintptr_t)va, NT * tbytes, &at) == 0);

	same_address(va, h);
	many_pieces();
	CHECK(wex_released(&at, sizeof(at), NULL) == 0); /* host memory */
	CHECK(wex_released(NULL, 1, NULL) == -EINVAL);
	CHECK(wex_released((void *)(uintptr_t)va, UINT64_MAX, NULL) == -EINVAL);

	/* Three allocations, the middle one released: found walking mapping
	 * by mapping, here and in a thread with no context current; memory
	 * from cuMemAlloc is not released. */
	{
		CUmemGenericAllocationHandle h3[3];
		CUdeviceptr v3 = gpu_expandable(3, 2 * tbytes, h3), plain;
		struct probe pr = { v3, 6 * tbytes, 0, 0 };
		void *pinned;
		pthread_t th;

		release(v3, h3, 1);
		CHECK(wex_released((void *)(uintptr_t)v3, 6 * tbytes, &at) == 1 &&
		      at == v3 + 2 * tbytes);
		CHECK(pthread_create(&th, NULL, probe_thread, &pr) == 0);
		CHECK(pthread_join(th, NULL) == 0);
		CHECK(pr.ret == 1 && pr.at == v3 + 2 * tbytes);
		map_new(v3, h3, 1);
		CHECK(wex_released((void *)(uintptr_t)v3, 6 * tbytes, &at) == 0);
		gpu_expandable_free(v3, 3, 2 * tbytes, h3);
		CU_OK(wex__cu.cuMemAlloc(&plain, 2 * tbytes));
		CHECK(wex_released((void *)(uintptr_t)plain, 2 * tbytes, &at) == 0);
		CU_OK(wex__cu.cuMemFree(plain));
		/* Page-locked host memory (a layout a CPU-offloading engine
		 * keeps there) is not released either. */
		pinned = aligned_alloc(4096, 16 * 4096);
		CHECK(pinned != NULL);
		CU_OK(wex__cu.cuMemHostRegister(pinned, 16 * 4096, 0));
		CHECK(wex_released(pinned, 16 * 4096, &at) == 0);
		CU_OK(wex__cu.cuMemHostUnregister(pinned));
		free(pinned);
	}
	printf("released memory: copy and attach refused (-EFAULT), nothing acquired; "
	       "mapped again: v3 copied whole\n");

	wex_client_close(c);
	gpu_expandable_free(va, 2, 2 * tbytes, h);
	gpu_world_stop(&w);
	printf("PASS\n");
	return 0;
}
