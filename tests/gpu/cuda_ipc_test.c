/* SPDX-License-Identifier: MIT */
/*
 * cuda_ipc_test.c - legacy CUDA IPC segments (label gpu; 77 without a
 * device).
 *   same_process  importing our own handle uses our pointer (no open,
 *                 which the driver would refuse); a range past its
 *                 allocation (or past the address space) is -E2BIG
 *   open_once     another process imports the same handle twice: one open,
 *                 the same pointer, still readable after the first release,
 *                 reopened after the last; a sub-allocation travels as
 *                 base handle + offset; an import another device must
 *                 reach (access_dev) is refused without peer access
 *                 (emulated: WEX_EMUL_NO_P2P=1), naming both devices,
 *                 and one it may reach is read by a kernel there (peer
 *                 access enabled, which IPC memory needs for kernels); a
 *                 copy still queued on the memory when it is released is
 *                 waited for, on the memory's device and on the device
 *                 given access (emulated: queued work that outlives its
 *                 memory fails the next synchronisation)
 *   foreign_open  the handle is already open in the importing process
 *                 outside wex: where the driver counts repeated opens (a
 *                 GPU, per cuda.h; emulated with WEX_EMUL_IPC_REFCOUNT=1)
 *                 the import gets the same pointer and its release closes
 *                 only its own open (the other still reads); where it
 *                 refuses them (the emulation's default) the import fails
 *                 with -EEXIST; emulated, the driver's count of opens
 *                 shows each open paired with one close
 *   invisible_owner  the consumer cannot see the producer's GPU
 *                 (CUDA_VISIBLE_DEVICES): the handle opens in the context
 *                 of the device the import is for, where a copy and a
 *                 kernel read it; without such a device, -ENODEV
 *                 (emulated: WEX_EMUL_VISIBLE=1)
 *   vmm_refused   wrap of VMM memory fails loudly
 */
#include "gpu_util.h"

enum { OP_SEG = 1, OP_SUB, OP_DONE };

static const struct wex_mem_ops *ipc;

static void same_process(void)
{
	struct wex_mem_seg a, b, c;

	CHECK_OK(wex__cuda_use_device(0));
	CHECK_OK(ipc->alloc(1u << 20, 0, &a));
	CHECK(a.desc.handle_len == 64 && a.fd == -1);
	dev_fill((uint64_t)(uintptr_t)a.ptr, 1u << 20, 4);
	CHECK_OK(ipc->import(&a.desc, -1, -1, &b));
	CHECK(b.ptr == a.ptr);
	CHECK(dev_check((uint64_t)(uintptr_t)b.ptr, 1u << 20, 4, 0));
	CHECK_OK(ipc->release(&b));
	/* The exporter's memory is untouched by the importer's release. */
	CHECK(dev_check((uint64_t)(uintptr_t)a.ptr, 1u << 20, 4, 0));
	CHECK_OK(ipc->wrap((char *)a.ptr + 4096, 8192, -1, &c));
	CHECK(c.desc.handle_offset == 4096 && memcmp(c.desc.handle, a.desc.handle, 64) == 0);
	/* Past its allocation: -E2BIG (wex.h), as for a size whose sum with
	 * the address wraps (it was -EINVAL, and that one was exported). */
	CHECK(ipc->wrap((char *)a.ptr + 4096, 1u << 20, -1, &b) == -E2BIG);
	CHECK(ipc->wrap((char *)a.ptr + 4096, UINT64_MAX - 100, -1, &b) == -E2BIG);
	CHECK_OK(ipc->release(&c));
	CHECK_OK(ipc->release(&a));
}

static void producer(int sock)
{
	struct wex_mem_seg a, sub;

	CHECK_OK(wex__cuda_use_device(0));
	CHECK_OK(ipc->alloc(4u << 20, 0, &a));
	dev_fill((uint64_t)(uintptr_t)a.ptr, 4u << 20, 6);
	CHECK_OK(ipc->wrap((char *)a.ptr + (1u << 20), 1u << 20, -1, &sub));
	CHECK(sub.desc.handle_offset == (1u << 20));
	tsend(sock, OP_SEG, &a.desc, 0, -1);
	tsend(sock, OP_SUB, &sub.desc, 0, -1);
	trecv(sock, OP_DONE, NULL);
	CHECK_OK(ipc->release(&sub));
	CHECK_OK(ipc->release(&a));
}

/* Queues a copy of x's first 4 KiB on device `dev`, releases x, then
 * checks the copy completed with the producer's bytes. */
static void copy_then_release(struct wex_mem_seg *x, int dev)
{
	struct wex_copy_op op;
	CUdeviceptr d;

	CHECK_OK(wex__cuda_use_device(dev));
	CU_OK(wex__cu.cuMemAlloc(&d, 4096));
	op = (struct wex_copy_op){ .src = (uint64_t)(uintptr_t)x->ptr, .dst = d, .len = 4096 };
	CHECK_OK(wex__cuda_copy_async(&op, 1, dev));
	CHECK_OK(ipc->release(x));
	CHECK_OK(wex__cuda_copy_sync(dev));
	CHECK_OK(wex__cuda_use_device(dev));
	CHECK(dev_check(d, 4096, 6, 0));
	CU_OK(wex__cu.cuMemFree(d));
}

/* A kernel on device `dev` reads x's first 4 KiB (as an engine's kernels
 * read a view): legacy IPC memory another device opened needs peer access
 * for that, which copies do not. */
static void kernel_read(struct wex_mem_seg *x, int dev)
{
	unsigned n = 4096 / 4;
	uint64_t src = (uint64_t)(uintptr_t)x->ptr;
	CUdeviceptr d;
	CUfunction fn;
	CUmodule mod;
	void *args[3] = { &src, &d, &n };

	CHECK(wex__cu.cuModuleLoadData && wex__cu.cuLaunchKernel);
	CHECK_OK(wex__cuda_use_device(dev));
	CU_OK(wex__cu.cuMemAlloc(&d, 4096));
	CU_OK(wex__cu.cuModuleLoadData(&mod, test_copy_ptx()));
	CU_OK(wex__cu.cuModuleGetFunction(&fn, mod, "wex_copy_u32"));
	CU_OK(wex__cu.cuLaunchKernel(fn, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
	CU_OK(wex__cu.cuCtxSynchronize());
	CHECK(dev_check(d, 4096, 6, 0));
	CU_OK(wex__cu.cuModuleUnload(mod));
	CU_OK(wex__cu.cuMemFree(d));
}

static void consumer(int sock)
{
	struct wex_mem_seg x, y, z;
	struct tmsg m = trecv(sock, OP_SEG, NULL);
	struct tmsg ms = trecv(sock, OP_SUB, NULL);
	int before;

	CHECK_OK(ipc->import(&m.desc, -1, -1, &x));
	CHECK_OK(ipc->import(&m.desc, -1, -1, &y));
	CHECK(x.ptr == y.ptr);
	CHECK_OK(ipc->import(&ms.desc, -1, -1, &z));
	CHECK((char *)z.ptr == (char *)x.ptr + (1u << 20));
	CHECK(dev_check((uint64_t)(uintptr_t)z.ptr, 1u << 20, 6, 1u << 20));
	CHECK_OK(ipc->release(&x));
	CHECK(dev_check((uint64_t)(uintptr_t)y.ptr, 4u << 20, 6, 0));
	CHECK_OK(ipc->release(&y));
	CHECK_OK(ipc->release(&z));
	/* Fully closed; a new import opens again, and a whole open/close
	 * leaves no fd behind (counted from here: the driver keeps fds of its
	 * own from the first context and IPC open on). */
	before = fd_count();
	CHECK_OK(ipc->import(&m.desc, -1, -1, &x));
	CHECK(dev_check((uint64_t)(uintptr_t)x.ptr, 4096, 6, 0));
	CHECK_OK(ipc->release(&x));
	CHECK_FDS(before);
	/* A copy from the memory still queued at release: the release waits
	 * for it before closing (a closed handle under a running copy is a
	 * fault on a GPU; the emulation reports it at the next sync). */
	CHECK_OK(ipc->import(&m.desc, -1, -1, &x));
	copy_then_release(&x, 0);
	if (gpu_count() > 1) {
		int ret = ipc->import(&m.desc, -1, 1, &x);

		if (gpu_can_peer(1, 0)) {
			CHECK_OK(ret);
			kernel_read(&x, 1);
			/* A copy on device 1 still reading it at release: the
			 * release waits for device 1's work too. */
			copy_then_release(&x, 1);
		} else {
			CHECK(ret == -EOPNOTSUPP);
		}
		if (emulated()) {
			setenv("WEX_EMUL_NO_P2P", "1", 1);
			CHECK(ipc->import(&m.desc, -1, 1, &x) == -EOPNOTSUPP);
			unsetenv("WEX_EMUL_NO_P2P");
		}
	}
	if (emulated()) {
		/* The memory's context cannot be made current at release: the
		 * close did not run, and release says so instead of 0 (last: the
		 * handle stays open in this process). */
		CHECK_OK(ipc->import(&m.desc, -1, -1, &x));
		CU_OK(wex__cu.cuCtxSetCurrent(NULL));
		emul_fail("cuCtxSetCurrent", 1, CUDA_ERROR_UNKNOWN);
		CHECK(ipc->release(&x) < 0);
	}
	tsend(sock, OP_DONE, NULL, 0, -1);
}

/* The handle is already open in this process outside wex (PyTorch
 * rebuilding a tensor sent through torch.multiprocessing).  A driver that
 * counts repeated opens (cuda.h; emulated with WEX_EMUL_IPC_REFCOUNT=1)
 * gives wex the same pointer, and wex's release closes only its own open:
 * the other one still reads.  One that refuses a second open (the
 * emulation's default) fails the import with -EEXIST, opening nothing. */
static void foreign_consumer(int sock)
{
	struct tmsg m = trecv(sock, OP_SEG, NULL);
	struct wex_mem_seg x;
	CUipcMemHandle h;
	CUdeviceptr mine;
	int refcount, ret;

	trecv(sock, OP_SUB, NULL);
	CHECK_OK(wex__cuda_use_device(0));
	refcount = !emulated() || getenv("WEX_EMUL_IPC_REFCOUNT");
	memcpy(h.reserved, m.desc.handle, sizeof(h.reserved));
	CU_OK(wex__cu.cuIpcOpenMemHandle(&mine, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
	CHECK(emul_ipc_opens() == -1 || emul_ipc_opens() == 1);
	ret = ipc->import(&m.desc, -1, -1, &x);
	if (refcount) {
		CHECK_OK(ret);
		CHECK((uintptr_t)x.ptr == (uintptr_t)mine);
		CHECK(emul_ipc_opens() == -1 || emul_ipc_opens() == 2);
		CHECK_OK(ipc->release(&x));
		CHECK(emul_ipc_opens() == -1 || emul_ipc_opens() == 1);
		CHECK(dev_check(mine, 4u << 20, 6, 0));
		printf("  repeated open counted: same pointer, one close each\n");
	} else {
		CHECK(ret == -EEXIST);
		CHECK(emul_ipc_opens() == 1);
		printf("  repeated open refused: -EEXIST, nothing opened\n");
	}
	CU_OK(wex__cu.cuIpcCloseMemHandle(mine));
	CHECK(emul_ipc_opens() == -1 || emul_ipc_opens() == 0);
	/* Opened by wex alone again: one open, closed at the last release. */
	CHECK_OK(ipc->import(&m.desc, -1, -1, &x));
	CHECK(emul_ipc_opens() == -1 || emul_ipc_opens() == 1);
	CHECK_OK(ipc->release(&x));
	CHECK(emul_ipc_opens() == -1 || emul_ipc_opens() == 0);
	tsend(sock, OP_DONE, NULL, 0, -1);
}

/* The consumer sees one GPU, not the producer's (CUDA_VISIBLE_DEVICES
 * naming its own alone, as Ray gives each vLLM worker): a legacy IPC
 * handle of a device the process cannot see still opens ("can open
 * handles to devices that may not be visible", cudaIpcOpenMemHandle), in
 * the context of the device the engine works on (access_dev), and a copy
 * and a kernel there read it.  Emulated only: WEX_EMUL_VISIBLE shows
 * physical device 1 alone; on a GPU machine run with the consumer's
 * CUDA_VISIBLE_DEVICES set to another GPU than the producer's. */
static void invisible_consumer(int sock)
{
	struct tmsg m = trecv(sock, OP_SEG, NULL);
	struct wex_mem_seg x;
	int dev = -1;

	trecv(sock, OP_SUB, NULL);
	setenv("WEX_EMUL_VISIBLE", "1", 1); /* (a GPU's driver ignores it) */
	CHECK_OK(wex__cuda_load());
	if (emulated())
		CHECK(gpu_count() == 1);
	if (wex_mem_device_of(&m.desc, &dev) == 0) {
		printf("  the producer's device is visible here: not tried\n");
		tsend(sock, OP_DONE, NULL, 0, -1);
		return;
	}
	CHECK_OK(ipc->import(&m.desc, -1, 0, &x));
	CHECK(dev_check((uint64_t)(uintptr_t)x.ptr, 4u << 20, 6, 0));
	kernel_read(&x, 0);
	copy_then_release(&x, 0);
	/* No device to open it in: refused, naming the device. */
	CHECK(ipc->import(&m.desc, -1, -1, &x) == -ENODEV);
	tsend(sock, OP_DONE, NULL, 0, -1);
}

static void vmm_refused(void)
{
	const struct wex_mem_ops *vmm = wex_mem_backend(WEX_MEM_CUDA_VMM);
	struct wex_mem_seg v, s;

	CHECK_OK(vmm->alloc(2u << 20, 0, &v));
	CHECK(ipc->wrap(v.ptr, 2u << 20, -1, &s) < 0);
	CHECK_OK(vmm->release(&v));
}

int main(void)
{
	int ret = 0;

	gpu_require();
	ipc = wex_mem_backend(WEX_MEM_CUDA_IPC);
	CHECK(ipc);
	ret |= run_one("same_process", same_process);
	ret |= run_pair("open_once", producer, consumer);
	ret |= run_pair("foreign_open", producer, foreign_consumer);
	ret |= run_pair("invisible_owner", producer, invisible_consumer);
	ret |= run_one("vmm_refused", vmm_refused);
	printf("%s\n", ret ? "FAIL" : "PASS");
	return ret ? T_EXIT_FAIL : T_EXIT_PASS;
}
