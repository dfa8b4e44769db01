/* SPDX-License-Identifier: MIT */
/*
 * cuda_order - GPU ordering around leases and publishes, and host staging,
 * through a real wexd.
 *
 *  1. Releasing a remap lease waits for the engine's GPU work: the consumer
 *     queues an asynchronous copy that reads the producer's memory through
 *     a view, releases its lease, and the producer then writes a new
 *     version into that memory; the queued read must still see the old
 *     version's bytes (the release waited for it).
 *  2. Publishing a host segment waits for the trainer's asynchronous
 *     device-to-host copies into it (host staging, producer side): the
 *     consumer must see their bytes, not the segment's old ones.
 *     The segment is WEX_SEG_HOST_PINNED: the producer's mapping is
 *     page-locked (cuMemHostGetFlags answers, PORTABLE).
 *  3. A copy sync of that host segment into a layout in GPU memory (host
 *     staging, consumer side) runs on the GPU executor and every byte
 *     arrives; on the emulated driver the test also checks that the copy
 *     went through the driver (memcpy to a device address would crash a
 *     real GPU).  The consumer's read-only mapping of the segment is
 *     pinned by then (READ_ONLY, where the device takes it), and closing
 *     the client unpins it before unmapping (emulated driver: no
 *     registration left, and an unregister after the unmap fails).
 *  4. Emulated driver only: a device that cannot pin read-only memory
 *     (WEX_EMUL_NO_RO_HOSTREG=1), and WEX_HOST_PIN=0, leave the mapping
 *     pageable and the copy still delivers every byte.
 *  5. Closing: the consumer unpins before it unmaps; the producer, closing
 *     with a device-to-host copy into its pinned segment still queued,
 *     waits for it before unpinning (emulated: the copy would fault).
 *  6. A plan reading VMM memory and a host segment (the GPU executor runs
 *     it all) pins the host segment too, and every byte arrives.
 * On a GPU the queued copies are fast and cases 1 and 2 would usually pass
 * even without the waits; against the emulated driver with WEX_EMUL_DEFER=1
 * (asynchronous copies run only at a synchronisation) they fail unless wex
 * waits.  Needs a CUDA driver and device (exit 77 with the reason
 * otherwise); CI runs it against tests/gpu/emul_cuda.c (cuda_order_emul).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_util.h"
#include "vmm/backend.h"
#include "wex.h"

#define NT 2
#define ROWS 256
#define COLS 1024 /* bf16: 512 KiB a tensor */

static void say(int fd, char ch)
{
	CHECK(write(fd, &ch, 1) == 1);
}

static void expect(int fd, char want)
{
	char ch = 0;

	CHECK(read(fd, &ch, 1) == 1 && ch == want);
}

/* The pattern of dev_fill(seed) from index `from`, written by the CPU. */
static void host_fill(void *p, size_t n, unsigned seed, size_t from)
{
	unsigned char *b = p;

	for (size_t i = 0; i < n; i++) {
		size_t k = i + from;

		b[i] = (unsigned char)(k * 131u + seed * 7u + (k >> 12));
	}
}

static void producer(int in, int out)
{
	struct wex_client_params p = { .field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL,
				       .role = WEX_ROLE_PRODUCER, .model = "gpu" };
	struct wex_tensor t[NT];
	wex_client_t *c, *hc, *mc;
	uint64_t total;
	uint32_t seg;
	void *dev, *stage, *host;
	CUstream s;

	total = gpu_bf16_tensors(t, NT, ROWS, COLS, 0);
	/* Model "gpu": VMM memory, v1 = pattern 1.  The test's own driver
	 * calls need a current context (wex calls give the thread its
	 * binding back). */
	dev = wex_cuda_alloc((ssize_t)total, 0, NULL);
	CHECK(dev != NULL);
	CHECK_OK(wex__cuda_use_device(0));
	dev_fill((uint64_t)(uintptr_t)dev, total, 1);
	CHECK_OK(wex_client_open(&p, &c));
	CHECK_OK(wex_segment_register_ptr(c, WEX_SEG_CUDA_VMM, dev, total, &seg));
	for (int i = 0; i < NT; i++)
		t[i].segment = seg;
	CHECK_OK(wex_register_tensors(c, t, NT));
	CHECK_OK(wex_begin_write(c, 1, 5000));
	CHECK_OK(wex_publish(c, 1));
	say(out, '1');

	/* Case 1: once the consumer released v1, v2 (pattern 2) overwrites
	 * the same memory. */
	expect(in, 'g');
	CHECK_OK(wex_begin_write(c, 2, 5000));
	CHECK_OK(wex__cuda_use_device(0));
	dev_fill((uint64_t)(uintptr_t)dev, total, 2);
	CHECK_OK(wex_publish(c, 2));
	say(out, '2');

	/* Case 2: model "host", a host segment filled by an asynchronous
	 * device-to-host copy that is still queued when publish is called. */
	p.model = "host";
	CHECK_OK(wex_client_open(&p, &hc));
	CHECK_OK(wex_segment_alloc(hc, WEX_SEG_HOST_PINNED, 0, total, &seg, &host));
	{
		unsigned f;

		CHECK_OK(wex__cuda_use_device(0));
		CHECK(host_registered(host, &f));
		CHECK(!f || (f & CU_MEMHOSTREGISTER_PORTABLE));
	}
	for (int i = 0; i < NT; i++)
		t[i].segment = seg;
	CHECK_OK(wex_register_tensors(hc, t, NT));
	stage = wex_cuda_alloc((ssize_t)total, 0, NULL);
	CHECK(stage != NULL);
	CHECK_OK(wex__cuda_use_device(0));
	dev_fill((uint64_t)(uintptr_t)stage, total, 3);
	CHECK_OK(wex_begin_write(hc, 1, 5000));
	CHECK_OK(wex__cuda_use_device(0));
	CU_OK(wex__cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CU_OK(wex__cu.cuMemcpyAsync((CUdeviceptr)(uintptr_t)host, (CUdeviceptr)(uintptr_t)stage,
				    (size_t)total, s));
	CHECK_OK(wex_publish(hc, 1)); /* must wait for the copy above */
	say(out, '3');

	/* Case 6: model "mixed", tensor 0 in VMM memory and tensor 1 in a
	 * pinned host segment, both pattern 5 as one range. */
	{
		uint64_t tlen = total / NT;
		struct wex_tensor mt[NT];
		uint32_t sv, sh;
		void *va, *hb;

		memcpy(mt, t, sizeof(mt));
		p.model = "mixed";
		CHECK_OK(wex_client_open(&p, &mc));
		CHECK_OK(wex_segment_alloc(mc, WEX_SEG_CUDA_VMM, 0, tlen, &sv, &va));
		CHECK_OK(wex_segment_alloc(mc, WEX_SEG_HOST_PINNED, 0, tlen, &sh, &hb));
		CHECK_OK(wex__cuda_use_device(0));
		dev_fill((uint64_t)(uintptr_t)va, tlen, 5);
		host_fill(hb, tlen, 5, tlen);
		mt[0].segment = sv;
		mt[1].segment = sh;
		mt[1].offset = 0;
		CHECK_OK(wex_register_tensors(mc, mt, 2));
		CHECK_OK(wex_begin_write(mc, 1, 5000));
		CHECK_OK(wex_publish(mc, 1));
		say(out, '4');
	}

	/* Closing a client unpins its pinned segment only after the DMA
	 * still queued into it completed (here: a copy never published). */
	expect(in, 'q');
	CHECK_OK(wex__cuda_use_device(0));
	CU_OK(wex__cu.cuMemcpyAsync((CUdeviceptr)(uintptr_t)host, (CUdeviceptr)(uintptr_t)stage,
				    (size_t)total, s));
	wex_client_close(hc);
	CU_OK(wex__cu.cuStreamSynchronize(s));
	CU_OK(wex__cu.cuStreamDestroy(s));
	wex_client_close(mc);
	CHECK(emul_host_regs() <= 0); /* unpinned before unmapped */
	wex_client_close(c);
	wex_cuda_free(stage, (ssize_t)total, 0, NULL);
	wex_cuda_free(dev, (ssize_t)total, 0, NULL);
	_exit(0);
}

/* Copy calls the emulated driver made, or -1 on a real driver. */
static long long emul_copies(void)
{
	const char *lib = getenv("WEX_CUDA_LIB");
	unsigned long long (*fn)(void);
	long long n = -1;
	void *h;

	if (!lib || !(h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD)))
		return -1;
	fn = (unsigned long long (*)(void))(uintptr_t)dlsym(h, "wex_emul_copy_calls");
	if (fn)
		n = (long long)fn();
	dlclose(h);
	return n;
}

int main(void)
{
	struct wex_client_params p = { .field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL,
				       .role = WEX_ROLE_CONSUMER, .model = "gpu" };
	struct wex_tensor t[NT];
	struct wex_sync_result r;
	struct gpu_world w;
	wex_client_t *c, *hc;
	uint64_t total, tlen;
	long long before, after;
	int ro, refuse;
	void *v, *hv, *mine;
	CUstream s;

	gpu_require();
	gpu_world_start(&w, producer);
	expect(w.from_prod, '1');
	total = gpu_bf16_tensors(t, NT, ROWS, COLS, 0);
	tlen = (uint64_t)ROWS * COLS * 2;
	mine = wex_cuda_alloc((ssize_t)total, 0, NULL);
	CHECK(mine != NULL);

	/* 1. A queued read of the view, then release: the producer writes
	 * v2 right after; the read must have seen v1. */
	CHECK_OK(wex_client_open(&p, &c));
	CHECK_OK(wex_sync(c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
	CHECK(r.version == 1);
	CHECK_OK(wex_view(c, 0, t[0].name, &v, NULL));
	CHECK_OK(wex__cuda_use_device(0));
	CU_OK(wex__cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CU_OK(wex__cu.cuMemcpyAsync((CUdeviceptr)(uintptr_t)mine, (CUdeviceptr)(uintptr_t)v,
				    (size_t)tlen, s));
	CHECK_OK(wex_release(c));
	say(w.to_prod, 'g');
	expect(w.from_prod, '2');
	CU_OK(wex__cu.cuStreamSynchronize(s));
	CHECK(dev_check((uint64_t)(uintptr_t)mine, tlen, 1, 0));
	printf("1. a read queued before wex_release saw v1, not the v2 written after it\n");

	/* 2. The host segment shows the device-to-host copy's bytes. */
	expect(w.from_prod, '3');
	p.model = "host";
	CHECK_OK(wex_client_open(&p, &hc));
	CHECK_OK(wex_sync(hc, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
	CHECK_OK(wex_view(hc, 0, t[0].name, &v, NULL)); /* the segment's start */
	hv = v; /* the mapping stays while hc lives */
	{
		const unsigned char *b = v;
		uint64_t bad = 0;

		for (uint64_t i = 0; i < total; i++)
			bad += b[i] != (unsigned char)(i * 131u + 3u * 7u + (i >> 12));
		if (bad)
			fprintf(stderr, "%llu of %llu bytes are not the staged ones\n",
				(unsigned long long)bad, (unsigned long long)total);
		CHECK(bad == 0);
	}
	CHECK_OK(wex_release(hc));
	printf("2. publish of a host segment waited for the device-to-host copy into it\n");

	/* 3. Host segment into GPU weights: the GPU executor. */
	CU_OK(wex__cu.cuMemsetD8Async((CUdeviceptr)(uintptr_t)mine, 0, (size_t)total, s));
	CU_OK(wex__cu.cuStreamSynchronize(s));
	for (int i = 0; i < NT; i++)
		t[i].ptr = (char *)mine + t[i].offset;
	CHECK_OK(wex_attach(hc, t, NT));
	ro = wex__cuda_dev_attr(0, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED);
	/* Where the GPU walks the host's page tables, registering needs no
	 * read-only flag and succeeds. */
	refuse = !ro && !wex__cuda_dev_attr(0, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES);
	if (refuse) {
		/* A device that cannot pin the read-only mapping: refused
		 * (no unexpected slow path) until WEX_HOST_PIN=try allows it. */
		CHECK(wex_sync(hc, WEX_SYNC_COPY, 1, 5000, &r) < 0);
		printf("   device 0 cannot pin read-only host memory: %s\n", wex_last_error(hc));
		CHECK(strstr(wex_last_error(hc), "WEX_HOST_PIN=try") != NULL);
		setenv("WEX_HOST_PIN", "try", 1);
	}
	before = emul_copies();
	CHECK_OK(wex_sync(hc, WEX_SYNC_COPY, 1, 5000, &r));
	after = emul_copies();
	CHECK(r.bytes == total);
	CHECK(dev_check((uint64_t)(uintptr_t)mine, total, 3, 0));
	if (before >= 0) {
		printf("   the emulated driver made %lld copy calls for it\n", after - before);
		CHECK(after > before);
	}
	{
		unsigned f = 0;

		if (!refuse) {
			/* READ_ONLY where the device takes it; where it walks
			 * the host's page tables, registered without it. */
			CHECK(host_registered(hv, &f));
			CHECK(!f || ((!ro || (f & CU_MEMHOSTREGISTER_READ_ONLY)) &&
				     (f & CU_MEMHOSTREGISTER_PORTABLE)));
			printf("   its read-only mapping of the segment is pinned (flags %#x)\n", f);
		} else {
			printf("   device 0 cannot pin read-only host memory: copied from pageable memory (WEX_HOST_PIN=try)\n");
		}
		/* A second copy does not pin again. */
		before = (long long)emul_calls("cuMemHostRegister");
		CHECK_OK(wex_sync(hc, WEX_SYNC_COPY, 1, 5000, &r));
		CHECK((long long)emul_calls("cuMemHostRegister") == before);
		unsetenv("WEX_HOST_PIN");
	}
	printf("3. a host segment copied into GPU weights through the GPU executor\n");
	if (emulated() && ro) {
		/* Each fresh client imports the segment anew.  A device that
		 * cannot pin read-only memory: refused by default, copied
		 * from pageable memory with WEX_HOST_PIN=try; WEX_HOST_PIN=0
		 * never pins; a value it does not know is refused.  The
		 * pageable copies are reported to wexd (status). */
		static const struct {
			const char *group, *no_ro, *pin;
			int ok;
		} cases[] = {
			{ "no-ro-pin", "1", NULL, 0 },
			{ "no-ro-try", "1", "try", 1 },
			{ "no-pin", NULL, "0", 1 },
			{ "bad-pin", NULL, "yes", 0 },
		};

		for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
			struct wex_client_params p2 = p;
			wex_client_t *h2;
			unsigned long regs;
			unsigned char *back;
			int ret;

			/* Another group: hc still holds rank 0 of the default one. */
			p2.field_mask |= WEX_CLIENT_FIELD_GROUP;
			p2.group = cases[k].group;
			if (cases[k].no_ro)
				setenv("WEX_EMUL_NO_RO_HOSTREG", cases[k].no_ro, 1);
			if (cases[k].pin)
				setenv("WEX_HOST_PIN", cases[k].pin, 1);
			CU_OK(wex__cu.cuMemsetD8Async((CUdeviceptr)(uintptr_t)mine, 0, (size_t)total, s));
			CU_OK(wex__cu.cuStreamSynchronize(s));
			CHECK_OK(wex_client_open(&p2, &h2));
			CHECK_OK(wex_attach(h2, t, NT));
			regs = emul_calls("cuMemHostRegister");
			ret = wex_sync(h2, WEX_SYNC_COPY, 1, 5000, &r);
			printf("   %s: sync %d (%s)\n", cases[k].group, ret,
			       ret ? wex_last_error(h2) : "ok");
			if (cases[k].ok) {
				CHECK(ret == 0 && r.bytes == total);
				CHECK(dev_check((uint64_t)(uintptr_t)mine, total, 3, 0));
				CHECK(client_fallback(hc, cases[k].group, "pageable_staging"));
			} else {
				CHECK(ret < 0 && strstr(wex_last_error(h2), "WEX_HOST_PIN"));
				/* Refused before a byte moved: not dirty. */
				CHECK(wex_is_dirty(h2) == 0);
				back = malloc(total);
				CHECK(back);
				CU_OK(wex__cu.cuMemcpyDtoH(back, (CUdeviceptr)(uintptr_t)mine, total));
				for (uint64_t i = 0; i < total; i++)
					CHECK(back[i] == 0);
				free(back);
				CHECK(!client_fallback(hc, cases[k].group, "pageable_staging"));
			}
			/* Refused up front (the device attribute), or not
			 * tried at all. */
			CHECK(emul_calls("cuMemHostRegister") == regs);
			CHECK(emul_host_regs() == 1); /* hc's only */
			wex_client_close(h2);
			unsetenv("WEX_EMUL_NO_RO_HOSTREG");
			unsetenv("WEX_HOST_PIN");
		}
		/* Pinned host staging reports nothing. */
		CHECK(!client_fallback(hc, NULL, "pageable_staging"));
		{
			/* wexd counted the two pageable syncs (try and 0). */
			static const char series[] = "wex_sync_fallbacks_total{fallback=\"pageable_staging\"} ";
			char *js = NULL;
			json_t *j;
			const char *text, *at;

			CHECK_OK(wex_request(hc, "metrics", NULL, &js));
			j = json_loads(js, 0, NULL);
			CHECK(j != NULL);
			text = json_string_value(json_object_get(j, "text"));
			at = text ? strstr(text, series) : NULL;
			CHECK(at != NULL && strtod(at + sizeof(series) - 1, NULL) == 2);
			json_decref(j);
			wex_free(js);
		}
		printf("4. without read-only pinning the copy is refused, naming WEX_HOST_PIN; with WEX_HOST_PIN=try or 0 it runs from pageable memory, reported to wexd\n");
	}

	/* 6. A plan reading VMM memory and a host segment runs on the GPU
	 * executor, and the host segment is pinned all the same. */
	expect(w.from_prod, '4');
	{
		struct wex_client_params pm = p;
		wex_client_t *mc;
		unsigned f;
		void *mv;

		pm.model = "mixed";
		CHECK_OK(wex_client_open(&pm, &mc));
		CHECK_OK(wex_sync(mc, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
		CHECK_OK(wex_view(mc, 0, t[1].name, &mv, NULL)); /* the host segment's start */
		CU_OK(wex__cu.cuMemsetD8Async((CUdeviceptr)(uintptr_t)mine, 0, (size_t)total, s));
		CU_OK(wex__cu.cuStreamSynchronize(s));
		CHECK_OK(wex_attach(mc, t, NT));
		if (refuse) /* refused otherwise, as in 3 */
			setenv("WEX_HOST_PIN", "try", 1);
		CHECK_OK(wex_sync(mc, WEX_SYNC_COPY, 1, 5000, &r));
		unsetenv("WEX_HOST_PIN");
		CHECK(r.bytes == total);
		CHECK(dev_check((uint64_t)(uintptr_t)mine, total, 5, 0));
		if (!refuse)
			CHECK(host_registered(mv, &f));
		wex_client_close(mc);
	}
	printf("6. a plan from VMM memory and a host segment: every byte, the host segment pinned\n");

	CU_OK(wex__cu.cuStreamDestroy(s));
	wex_client_close(hc);
	if (emulated()) {
		/* The emulated driver refuses an unregister after the unmap. */
		CHECK(emul_host_regs() == 0);
		printf("5. closing the client unpinned its mapping before unmapping it\n");
	}
	wex_client_close(c);
	say(w.to_prod, 'q');
	gpu_world_stop(&w);
	wex_cuda_free(mine, (ssize_t)total, 0, NULL);
	printf("PASS: cuda_order\n");
	return 0;
}
