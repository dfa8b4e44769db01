/* SPDX-License-Identifier: MIT */
/*
 * cuda_realloc - a trainer whose registered VMM memory (PyTorch's
 * expandable segments) was freed and allocated again at the same address:
 * veRL's parameter offload (the buffer's storage resized to 0, then
 * torch.cuda.empty_cache(), later resized back) or FSDP2's model.cpu()
 * then .to("cuda").  wex still holds the allocation it registered, which
 * engines would go on reading while the trainer writes the new one, so:
 *  1. begin_write refuses (-ESTALE, naming the address), nothing begun;
 *  2. a swap between begin_write and publish: publish refuses;
 *  3. a chunk left unmapped: begin_write refuses;
 *  4. the new memory registered by a new client writes and publishes, and
 *     a consumer's view holds the new memory's bytes;
 *  5. the same for legacy IPC memory (cudaMalloc: PyTorch without
 *     expandable segments), which wex does not hold: a trainer's
 *     cudaFree and cudaMalloc can give the same address another
 *     allocation (emulated: it does, which is asserted) that the engines'
 *     handle does not name.  begin_write and publish refuse it (told
 *     apart by CU_POINTER_ATTRIBUTE_BUFFER_ID), and the memory freed with
 *     nothing allocated there; registered again, the new bytes reach a
 *     consumer; two segments in one allocation cost one query a call.
 * Needs a CUDA driver and device (exit 77 with the reason otherwise); CI
 * runs it against the emulated driver (tests/gpu/emul_cuda.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_util.h"
#include "wex.h"

static void idle_producer(int in, int out)
{
	char ch;

	(void)out;
	while (read(in, &ch, 1) > 0)
		;
}

static wex_client_t *open_role(int role, const char *model)
{
	struct wex_client_params p = { .field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL,
				       .role = role, .model = model };
	wex_client_t *c;

	CHECK_OK(wex_client_open(&p, &c));
	return c;
}

/* A producer client over [va, va + 2 * gran): one bf16 tensor. */
static wex_client_t *producer_over(CUdeviceptr va, uint64_t gran)
{
	wex_client_t *c = open_role(WEX_ROLE_PRODUCER, "realloc");
	struct wex_tensor t;
	uint32_t seg;
	int ret;

	ret = wex_segment_register_ptr(c, WEX_SEG_CUDA_VMM, (void *)(uintptr_t)va, 2 * gran, &seg);
	if (ret < 0)
		fprintf(stderr, "register_ptr: %s\n", wex_last_error(c));
	CHECK_OK(ret);
	gpu_bf16_tensors(&t, 1, 2 * gran / 2 / 1024, 1024, seg);
	CHECK_OK(wex_register_tensors(c, &t, 1));
	return c;
}

/* Chunk 1 of the range freed and another allocation mapped there. */
static void swap_chunk(CUdeviceptr va, uint64_t gran, CUmemGenericAllocationHandle *h)
{
	CUmemAllocationProp prop;
	CUmemAccessDesc acc;

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	CU_OK(wex__cu.cuMemUnmap(va + gran, gran));
	CU_OK(wex__cu.cuMemRelease(*h));
	CU_OK(wex__cu.cuMemCreate(h, gran, &prop, 0));
	CU_OK(wex__cu.cuMemMap(va + gran, gran, 0, *h, 0));
	memset(&acc, 0, sizeof(acc));
	acc.location = prop.location;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CU_OK(wex__cu.cuMemSetAccess(va + gran, gran, &acc, 1));
}

static void refused(wex_client_t *c, int ret, const char *what)
{
	printf("%s: %d: %s\n", what, ret, wex_last_error(c));
	CHECK(ret == -ESTALE);
	CHECK(strstr(wex_last_error(c), "not there any more") != NULL);
	CHECK(strstr(wex_last_error(c), "register the parameters again") != NULL);
}

/* A producer client over [p + 4096, p + size): one bf16 tensor in a
 * sub-range of a cudaMalloc allocation (it travels as base + offset), and
 * a second segment in the same allocation when two. */
static wex_client_t *ipc_producer(CUdeviceptr p, uint64_t size, int two)
{
	wex_client_t *c = open_role(WEX_ROLE_PRODUCER, "realloc_ipc");
	uint64_t len = size - 4096 - (two ? 4096 : 0);
	struct wex_tensor t;
	uint32_t seg, seg2;
	int ret;

	ret = wex_segment_register_ptr(c, WEX_SEG_CUDA_IPC, (void *)(uintptr_t)(p + 4096), len,
				       &seg);
	if (ret < 0)
		fprintf(stderr, "register_ptr: %s\n", wex_last_error(c));
	CHECK_OK(ret);
	if (two)
		CHECK_OK(wex_segment_register_ptr(c, WEX_SEG_CUDA_IPC,
						  (void *)(uintptr_t)(p + size - 4096), 4096, &seg2));
	gpu_bf16_tensors(&t, 1, len / 2 / 1024, 1024, seg);
	CHECK_OK(wex_register_tensors(c, &t, 1));
	return c;
}

/* The allocation at *p freed and another one of its size allocated (the
 * address it got in *p); emulated, at the same address. */
static void ipc_realloc(CUdeviceptr *p, uint64_t size)
{
	CUdeviceptr was = *p;

	CU_OK(wex__cu.cuMemFree(*p));
	CU_OK(wex__cu.cuMemAlloc(p, size));
	printf("freed 0x%llx, allocated again at 0x%llx\n", (unsigned long long)was,
	       (unsigned long long)*p);
	if (emulated())
		CHECK(*p == was);
}

static void legacy_ipc(void)
{
	const uint64_t size = 4u << 20;
	unsigned long before;
	struct wex_sync_result r;
	wex_client_t *c, *cons;
	unsigned char *host, *back;
	CUdeviceptr p;
	void *view;

	host = malloc(size);
	back = malloc(size);
	CHECK(host && back);
	CU_OK(wex__cu.cuMemAlloc(&p, size));
	memset(host, 0x22, size);
	CHECK_OK(xfer((void *)(uintptr_t)p, host, size));
	c = ipc_producer(p, size, 0);
	CHECK_OK(wex_begin_write(c, 1, 5000));
	CHECK_OK(wex_publish(c, 1));

	/* Freed and allocated again at the same address; asked from a thread
	 * with no context, where the driver refuses pointer queries
	 * (emulated: WEX_EMUL_PTR_NEEDS_CTX=1): asked with one of the
	 * process's, the thread left without one. */
	ipc_realloc(&p, size);
	if (emulated()) {
		setenv("WEX_EMUL_PTR_NEEDS_CTX", "1", 1);
		CU_OK(wex__cu.cuCtxSetCurrent(NULL));
	}
	refused(c, wex_begin_write(c, 2, 5000), "legacy IPC: begin_write after a reload");
	if (emulated()) {
		CUcontext cur = (CUcontext)1;

		CU_OK(wex__cu.cuCtxGetCurrent(&cur));
		CHECK(cur == NULL);
		unsetenv("WEX_EMUL_PTR_NEEDS_CTX");
		CHECK_OK(wex__cuda_use_device(0));
	}

	/* The same between begin_write and publish. */
	wex_client_close(c);
	c = ipc_producer(p, size, 0);
	CHECK_OK(wex_begin_write(c, 3, 5000));
	ipc_realloc(&p, size);
	refused(c, wex_publish(c, 3), "legacy IPC: publish after a reload");

	/* Freed, nothing allocated there. */
	wex_client_close(c);
	c = ipc_producer(p, size, 0);
	CU_OK(wex__cu.cuMemFree(p));
	refused(c, wex_begin_write(c, 4, 5000), "legacy IPC: begin_write after a free");
	wex_client_close(c);
	CU_OK(wex__cu.cuMemAlloc(&p, size));

	/* Registered again (two segments in the allocation, asked about
	 * once): the new memory's bytes reach a consumer. */
	c = ipc_producer(p, size, 1);
	before = emul_calls("cuPointerGetAttribute");
	CHECK_OK(wex_begin_write(c, 5, 5000));
	if (emulated())
		CHECK(emul_calls("cuPointerGetAttribute") - before == 1);
	memset(host, 0x66, size);
	CHECK_OK(xfer((void *)(uintptr_t)p, host, size));
	CHECK_OK(wex_publish(c, 5));
	cons = open_role(WEX_ROLE_CONSUMER, "realloc_ipc");
	CHECK_OK(wex_sync(cons, WEX_SYNC_REMAP_VIEW, 5, 5000, &r));
	CHECK(r.version == 5);
	CHECK_OK(wex_view(cons, 0, "layers.0.weight", &view, NULL));
	CHECK_OK(xfer(back, view, size - 8192));
	CHECK(memcmp(back, host, size - 8192) == 0);
	printf("legacy IPC: the new memory's bytes reached the consumer\n");
	CHECK_OK(wex_release(cons));
	wex_client_close(cons);
	wex_client_close(c);
	CU_OK(wex__cu.cuMemFree(p));
	free(host);
	free(back);
}

int main(void)
{
	CUmemGenericAllocationHandle h[2];
	struct wex_sync_result r;
	struct gpu_world w;
	wex_client_t *c, *cons;
	uint64_t gran;
	unsigned char *host, *back;
	CUdeviceptr va;
	void *view;

	gpu_require();
	gpu_world_start(&w, idle_producer);
	gran = gpu_granularity();
	va = gpu_expandable(2, gran, h);
	printf("range at 0x%llx, two allocations of %llu bytes\n", (unsigned long long)va,
	       (unsigned long long)gran);
	host = malloc(2 * gran);
	back = malloc(2 * gran);
	CHECK(host && back);
	memset(host, 0x11, 2 * gran);
	CHECK_OK(xfer((void *)(uintptr_t)va, host, 2 * gran));

	c = producer_over(va, gran);
	CHECK_OK(wex_begin_write(c, 1, 5000));
	CHECK_OK(wex_publish(c, 1));

	/* 1. Offloaded and reloaded at the same address. */
	swap_chunk(va, gran, &h[1]);
	refused(c, wex_begin_write(c, 2, 5000), "begin_write after a reload");

	/* 2. The reload between begin_write and publish. */
	wex_client_close(c);
	c = producer_over(va, gran);
	CHECK_OK(wex_begin_write(c, 3, 5000));
	swap_chunk(va, gran, &h[1]);
	refused(c, wex_publish(c, 3), "publish after a reload");

	/* 3. Offloaded, nothing mapped there yet. */
	wex_client_close(c);
	c = producer_over(va, gran);
	CU_OK(wex__cu.cuMemUnmap(va + gran, gran));
	refused(c, wex_begin_write(c, 4, 5000), "begin_write with a chunk unmapped");
	wex_client_close(c);
	CU_OK(wex__cu.cuMemMap(va + gran, gran, 0, h[1], 0));
	{
		CUmemAccessDesc acc;

		memset(&acc, 0, sizeof(acc));
		acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		acc.location.id = 0;
		acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		CU_OK(wex__cu.cuMemSetAccess(va + gran, gran, &acc, 1));
	}

	/* 4. Registered again: the new memory's bytes reach a consumer. */
	c = producer_over(va, gran);
	CHECK_OK(wex_begin_write(c, 5, 5000));
	memset(host, 0x55, 2 * gran);
	CHECK_OK(xfer((void *)(uintptr_t)va, host, 2 * gran));
	CHECK_OK(wex_publish(c, 5));
	cons = open_role(WEX_ROLE_CONSUMER, "realloc");
	CHECK_OK(wex_sync(cons, WEX_SYNC_REMAP_VIEW, 5, 5000, &r));
	CHECK(r.version == 5);
	CHECK_OK(wex_view(cons, 0, "layers.0.weight", &view, NULL));
	CHECK_OK(xfer(back, view, 2 * gran));
	CHECK(memcmp(back, host, 2 * gran) == 0);
	printf("the new memory's bytes reached the consumer\n");
	CHECK_OK(wex_release(cons));
	wex_client_close(cons);
	wex_client_close(c);

	gpu_expandable_free(va, 2, gran, h);
	free(host);
	free(back);

	/* 5. Legacy IPC memory. */
	legacy_ipc();
	gpu_world_stop(&w);
	printf("PASS\n");
	return 0;
}
