/* SPDX-License-Identifier: MIT */
/*
 * cuda_facts - driver behaviour that the CUDA backend relies on, checked
 * on the GPU at hand, plus facts it does not rely on, reported so that the
 * next change can (one JSON line at the end; also written to
 * $WEX_FACTS_OUT when set).
 *
 * Asserted (wex depends on them):
 *  - cuMemMap of the first part of an allocation (offset 0, size below
 *    the allocation's): map_fixed maps the last producer allocation of a
 *    region only as far as the region goes (and every one from offset 0:
 *    a region reserves the bytes before a segment's start too);
 *  - cuMemGetAddressRange on VMM memory gives the one allocation mapped
 *    at the address, not the whole reservation, for allocations mapped
 *    back to back (how wex finds expandable-segment chunks);
 *  - the driver keeps no fd per mapping: 100 map/unmap rounds leave the
 *    process's fd count where it was.
 * Reported only:
 *  - whether cuMemMap accepts a non-zero offset into an allocation (the
 *    reference manual says "currently must be zero"; wex no longer uses
 *    one);
 *  - whether cuMemSetAccess takes CU_MEM_ACCESS_FLAGS_PROT_READ, and the
 *    bytes read back through such a mapping (wex maps producers' memory
 *    read-only in consumers, read-write where the driver refuses);
 *  - whether a process can import the POSIX fd of its own allocation and
 *    read the right bytes through it (every GPU test imports in another
 *    process; a consumer in the producer's process would do this);
 *  - whether cuIpcGetMemHandle refuses VMM memory (the cuda_ipc backend
 *    tells the two kinds apart by that refusal);
 *  - cuPointerGetAttribute RANGE_START_ADDR/RANGE_SIZE/MAPPED in a
 *    reservation, mapped and not: the reservation's range per cuda.h,
 *    MAPPED 0 where nothing is mapped (asserted on the emulated driver,
 *    which models that); DEVICE_ORDINAL there, and what
 *    wex__cuda_ptr_on_gpu makes of it (an address of a lost same-address
 *    region: -1 emulated; wex copies into such a region only after giving
 *    it memory again);
 *  - what the released-memory check builds on: MAPPED (CUresult and the
 *    raw value) of pageable host memory and of cuMemAlloc memory, and
 *    wex_released of those and of the unmapped part (1, 0, 0 asserted on
 *    the emulated driver);
 *  - wex_released of page-locked memory from cuMemHostAlloc, managed
 *    memory (cuMemAllocManaged) and stream-ordered pool memory
 *    (cuMemAllocAsync, as PyTorch's cudaMallocAsync backend), and MAPPED
 *    there: asserted 0 (not released) where the driver has the call (a 1
 *    would refuse every sync of an engine keeping weights there); -2 in
 *    the JSON where it does not or the allocation fails (printed);
 *  - the extent cuMemGetAddressRange gives a mapping of the first part
 *    of an allocation, and wex_released over the whole allocation's
 *    bytes there (the released-memory check walks mapping by mapping by
 *    that extent; [granularity, 1] asserted emulated);
 *  - fds the driver opens for itself at cuInit + first context;
 *  - fabric handles, cuMemcpyBatchAsync, compute capability, driver.
 *
 * Needs a CUDA driver and device (exit 77 with the reason otherwise); CI
 * runs it against tests/gpu/emul_cuda.c (cuda_facts_emul).
 */
#include <stdio.h>
#include <stdlib.h>

#include "gpu_util.h"

int main(void)
{
	CUmemAllocationProp prop = gpu_vmm_prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CUmemAccessDesc acc = gpu_rw_access();
	CUmemGenericAllocationHandle h[2];
	CUdeviceptr va, base = 0;
	size_t g = 0, sz = 0;
	int fds0, fds1, fds2, major = 0, minor = 0, fabric = 0, off_ok, ro_ok, fd_steady;
	int pageable = 0;
	int self_ok = 0, range_q, unmapped_gpu, rel[3];
	static char host_buf[64];
	uint64_t host_m = 7, dev_m = 7, kind_m[3] = { 7, 7, 7 };
	int kind_rel[3] = { -2, -2, -2 }, part_rel;
	long long part_size;
	CUresult part_r;
	CUdeviceptr dm = 0;
	CUresult host_r, dev_r;
	CUresult r, self_r, ipc_r, unmapped_ord_r;
	const char *out = getenv("WEX_FACTS_OUT");
	char json[2048];
	CUdevice dev;

	gpu_require();
	fds0 = fd_count();
	CHECK_OK(wex__cuda_use_device(0));
	fds1 = fd_count();
	CU_OK(wex__cu.cuDeviceGet(&dev, 0));
	CU_OK(wex__cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
	CU_OK(wex__cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
	CU_OK(wex__cu.cuDeviceGetAttribute(&fabric, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
					   dev));
	/* HMM: the device reaches pageable memory itself (host_staging's
	 * "pinned" test and the pageable baselines read differently there). */
	CU_OK(wex__cu.cuDeviceGetAttribute(&pageable, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
					   dev));
	CU_OK(wex__cu.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	CU_OK(wex__cu.cuMemAddressReserve(&va, 4 * g, g, 0, 0));
	CU_OK(wex__cu.cuMemCreate(&h[0], 2 * g, &prop, 0));
	CU_OK(wex__cu.cuMemCreate(&h[1], 2 * g, &prop, 0));

	/* Two allocations back to back: one range each. */
	CU_OK(wex__cu.cuMemMap(va, 2 * g, 0, h[0], 0));
	CU_OK(wex__cu.cuMemMap(va + 2 * g, 2 * g, 0, h[1], 0));
	CU_OK(wex__cu.cuMemSetAccess(va, 4 * g, &acc, 1));
	CU_OK(wex__cu.cuMemGetAddressRange(&base, &sz, va + 3 * g + 17));
	printf("address range of an address in the second allocation: +%llu, %zu bytes\n",
	       (unsigned long long)(base - va), sz);
	CHECK(base == va + 2 * g && sz == 2 * g);
	dev_fill(va, 4 * g, 3);
	CU_OK(wex__cu.cuMemUnmap(va + 2 * g, 2 * g));

	/* Pointer queries in a reservation, at a mapped address and at one
	 * with nothing mapped (a lost same-address region looks like that). */
	{
		CUdeviceptr start[2] = { 0, 0 };
		size_t size[2] = { 0, 0 };
		int mapped[2] = { 0, 0 }, ord = -1;
		CUresult rr[2];

		for (int k = 0; k < 2; k++) {
			CUdeviceptr at = k ? va + 3 * g + 17 : va + 17;

			rr[k] = wex__cu.cuPointerGetAttribute(
				&start[k], CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, at);
			if (rr[k] == CUDA_SUCCESS)
				rr[k] = wex__cu.cuPointerGetAttribute(
					&size[k], CU_POINTER_ATTRIBUTE_RANGE_SIZE, at);
			if (rr[k] == CUDA_SUCCESS)
				rr[k] = wex__cu.cuPointerGetAttribute(
					&mapped[k], CU_POINTER_ATTRIBUTE_MAPPED, at);
		}
		range_q = rr[0] == CUDA_SUCCESS && rr[1] == CUDA_SUCCESS && start[0] == va &&
			  start[1] == va && size[0] == 4 * g && size[1] == 4 * g && mapped[0] &&
			  !mapped[1];
		unmapped_ord_r = wex__cu.cuPointerGetAttribute(
			&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, va + 3 * g + 17);
		unmapped_gpu = wex__cuda_ptr_on_gpu(va + 3 * g + 17);
		printf("RANGE_START_ADDR/RANGE_SIZE/MAPPED in a reservation: mapped part %d: "
		       "+%lld, %zu bytes, mapped %d; unmapped part %d: +%lld, %zu bytes, "
		       "mapped %d (reservation: %zu bytes)\n", (int)rr[0],
		       (long long)(start[0] - va), size[0], mapped[0], (int)rr[1],
		       (long long)(start[1] - va), size[1], mapped[1], 4 * g);
		printf("unmapped part of a reservation: DEVICE_ORDINAL CUresult %d (%d), "
		       "wex__cuda_ptr_on_gpu %d\n", (int)unmapped_ord_r, ord, unmapped_gpu);
		/* The emulation models the reference's words (cuda.h). */
		if (emulated())
			CHECK(range_q && unmapped_ord_r == CUDA_ERROR_INVALID_VALUE &&
			      unmapped_gpu == -1);

		/* What the released-memory check (wex_released) builds on: MAPPED
		 * of pageable host memory and of cuMemAlloc memory, raw (the
		 * value starts at 7, to show what the driver wrote), and the
		 * check's answer for those and for the unmapped part. */
		CU_OK(wex__cu.cuMemAlloc(&dm, g));
		host_r = wex__cu.cuPointerGetAttribute(&host_m, CU_POINTER_ATTRIBUTE_MAPPED,
						       (CUdeviceptr)(uintptr_t)host_buf);
		dev_r = wex__cu.cuPointerGetAttribute(&dev_m, CU_POINTER_ATTRIBUTE_MAPPED, dm);
		rel[0] = wex_released((void *)(uintptr_t)(va + 3 * g + 17), 16, NULL);
		rel[1] = wex_released(host_buf, sizeof(host_buf), NULL);
		rel[2] = wex_released((void *)(uintptr_t)dm, g, NULL);
		CU_OK(wex__cu.cuMemFree(dm));
		printf("MAPPED of pageable host memory: CUresult %d, value %#llx; of cuMemAlloc "
		       "memory: CUresult %d, value %#llx; wex_released: unmapped part %d, host %d, "
		       "cuMemAlloc %d\n", (int)host_r, (unsigned long long)host_m, (int)dev_r,
		       (unsigned long long)dev_m, rel[0], rel[1], rel[2]);
		if (emulated())
			CHECK(rel[0] == 1 && rel[1] == 0 && rel[2] == 0);
	}
	CU_OK(wex__cu.cuMemUnmap(va, 2 * g));

	/* Memory of other kinds an engine may keep weights in: not released. */
	if (wex__cu.cuMemHostAlloc && wex__cu.cuMemFreeHost) {
		void *ph = NULL;

		r = wex__cu.cuMemHostAlloc(&ph, g, 0);
		if (r == CUDA_SUCCESS) {
			(void)wex__cu.cuPointerGetAttribute(&kind_m[0], CU_POINTER_ATTRIBUTE_MAPPED,
							    (CUdeviceptr)(uintptr_t)ph);
			kind_rel[0] = wex_released(ph, g, NULL);
			CU_OK(wex__cu.cuMemFreeHost(ph));
		} else {
			printf("cuMemHostAlloc: CUresult %d\n", (int)r);
		}
	}
	if (wex__cu.cuMemAllocManaged) {
		CUdeviceptr mm;

		r = wex__cu.cuMemAllocManaged(&mm, g, CU_MEM_ATTACH_GLOBAL);
		if (r == CUDA_SUCCESS) {
			(void)wex__cu.cuPointerGetAttribute(&kind_m[1], CU_POINTER_ATTRIBUTE_MAPPED,
							    mm);
			kind_rel[1] = wex_released((void *)(uintptr_t)mm, g, NULL);
			CU_OK(wex__cu.cuMemFree(mm));
		} else {
			printf("cuMemAllocManaged: CUresult %d (no managed memory here?)\n", (int)r);
		}
	}
	if (wex__cu.cuMemAllocAsync && wex__cu.cuMemFreeAsync) {
		CUdeviceptr pm;

		r = wex__cu.cuMemAllocAsync(&pm, g, 0);
		if (r == CUDA_SUCCESS) {
			CU_OK(wex__cu.cuStreamSynchronize(0));
			(void)wex__cu.cuPointerGetAttribute(&kind_m[2], CU_POINTER_ATTRIBUTE_MAPPED,
							    pm);
			kind_rel[2] = wex_released((void *)(uintptr_t)pm, g, NULL);
			CU_OK(wex__cu.cuMemFreeAsync(pm, 0));
			CU_OK(wex__cu.cuStreamSynchronize(0));
		} else {
			printf("cuMemAllocAsync: CUresult %d (no memory pools on this device?)\n",
			       (int)r);
		}
	}
	printf("wex_released of cuMemHostAlloc, managed and pool memory: %d %d %d (-2: not "
	       "tried); MAPPED there: %#llx %#llx %#llx\n", kind_rel[0], kind_rel[1], kind_rel[2],
	       (unsigned long long)kind_m[0], (unsigned long long)kind_m[1],
	       (unsigned long long)kind_m[2]);
	/* The first part of an allocation: what map_fixed does at a region's
	 * end.  The bytes are the allocation's own. */
	CU_OK(wex__cu.cuMemMap(va, g, 0, h[1], 0));
	CU_OK(wex__cu.cuMemSetAccess(va, g, &acc, 1));
	CHECK(dev_check(va, g, 3, 2 * g));
	/* Reported: the extent cuMemGetAddressRange gives such a mapping (the
	 * released-memory check walks by it: the allocation's whole size
	 * would hide an unmapped tail), and what wex_released answers. */
	part_r = wex__cu.cuMemGetAddressRange(&base, &sz, va);
	part_size = part_r == CUDA_SUCCESS ? (long long)sz : -1;
	part_rel = wex_released((void *)(uintptr_t)va, 2 * g, NULL);
	printf("the first %zu bytes of an allocation of %zu mapped: cuMemGetAddressRange %d, "
	       "%lld bytes; wex_released over %zu bytes: %d\n", g, 2 * g, (int)part_r, part_size,
	       2 * g, part_rel);
	if (emulated())
		CHECK(part_size == (long long)g && part_rel == 1);
	CU_OK(wex__cu.cuMemUnmap(va, g));
	printf("mapping the first %zu of %zu bytes of an allocation: ok\n", g, 2 * g);

	/* A non-zero offset into an allocation: reported. */
	r = wex__cu.cuMemMap(va, g, g, h[1], 0);
	off_ok = r == CUDA_SUCCESS;
	if (off_ok) {
		CU_OK(wex__cu.cuMemSetAccess(va, g, &acc, 1));
		off_ok = dev_check(va, g, 3, 3 * g) ? 1 : -1;
		CU_OK(wex__cu.cuMemUnmap(va, g));
	}
	printf("cuMemMap at offset %zu into an allocation: %s (CUresult %d)\n", g,
	       off_ok > 0 ? "accepted, right bytes" : off_ok < 0 ? "accepted, WRONG bytes" :
							   "refused", (int)r);

	/* A read-only mapping: reported. */
	CU_OK(wex__cu.cuMemMap(va, 2 * g, 0, h[1], 0));
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
	r = wex__cu.cuMemSetAccess(va, 2 * g, &acc, 1);
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	ro_ok = r == CUDA_SUCCESS ? (dev_check(va, 2 * g, 3, 2 * g) ? 1 : -1) : 0;
	CU_OK(wex__cu.cuMemUnmap(va, 2 * g));
	printf("cuMemSetAccess with PROT_READ: %s (CUresult %d)\n",
	       ro_ok > 0 ? "accepted, right bytes" :
	       ro_ok < 0 ? "accepted, WRONG bytes" : "refused", (int)r);

	/* A process importing its own allocation's fd: reported. */
	{
		CUmemGenericAllocationHandle hi = 0;
		int efd = -1;

		CU_OK(wex__cu.cuMemExportToShareableHandle(&efd, h[1],
							   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		r = wex__cu.cuMemImportFromShareableHandle(&hi, (void *)(uintptr_t)efd,
							   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		close(efd);
		self_r = r;
		if (r == CUDA_SUCCESS) {
			CU_OK(wex__cu.cuMemMap(va, 2 * g, 0, hi, 0));
			CU_OK(wex__cu.cuMemSetAccess(va, 2 * g, &acc, 1));
			self_ok = dev_check(va, 2 * g, 3, 2 * g) ? 1 : -1;
			CU_OK(wex__cu.cuMemUnmap(va, 2 * g));
			CU_OK(wex__cu.cuMemRelease(hi));
		}
		printf("importing its own allocation's fd: %s (CUresult %d)\n",
		       self_ok > 0 ? "accepted, right bytes" :
		       self_ok < 0 ? "accepted, WRONG bytes" : "refused", (int)self_r);
	}
	/* Legacy IPC on VMM memory: reported. */
	{
		CUipcMemHandle ih;

		CU_OK(wex__cu.cuMemMap(va, 2 * g, 0, h[0], 0));
		CU_OK(wex__cu.cuMemSetAccess(va, 2 * g, &acc, 1));
		ipc_r = wex__cu.cuIpcGetMemHandle(&ih, va);
		CU_OK(wex__cu.cuMemUnmap(va, 2 * g));
		printf("cuIpcGetMemHandle on VMM memory: %s (CUresult %d)\n",
		       ipc_r == CUDA_SUCCESS ? "ACCEPTED" : "refused", (int)ipc_r);
	}

	/* No fd per mapping. */
	fds2 = fd_count();
	for (int i = 0; i < 100; i++) {
		CU_OK(wex__cu.cuMemMap(va, 2 * g, 0, h[i & 1], 0));
		CU_OK(wex__cu.cuMemSetAccess(va, 2 * g, &acc, 1));
		CU_OK(wex__cu.cuMemUnmap(va, 2 * g));
	}
	fd_steady = fd_count() == fds2;
	CU_OK(wex__cu.cuMemRelease(h[0]));
	CU_OK(wex__cu.cuMemRelease(h[1]));
	CU_OK(wex__cu.cuMemAddressFree(va, 4 * g));
	printf("fds: %d before cuInit, %d after cuInit + context; 100 map/unmap rounds: %s\n", fds0,
	       fds1, fd_steady ? "steady" : "CHANGED");

	snprintf(json, sizeof(json),
		 "{\"driver_version\": %d, \"compute_capability\": \"%d.%d\", \"granularity\": %zu, "
		 "\"fabric_handles\": %d, \"memcpy_batch\": %s, \"partial_map\": true, "
		 "\"per_allocation_range\": true, \"map_nonzero_offset\": \"%s\", "
		 "\"prot_read\": \"%s\", \"self_import\": \"%s\", \"ipc_handle_on_vmm\": %s, "
		 "\"driver_fds\": %d, \"fds_steady_over_maps\": %s, "
		 "\"reservation_range_query\": %s, \"unmapped_ordinal_result\": %d, "
		 "\"unmapped_ptr_on_gpu\": %d, \"pageable_memory_access\": %d, "
		 "\"mapped_host\": [%d, %llu], \"mapped_devmem\": [%d, %llu], "
		 "\"released_unmapped_host_devmem\": [%d, %d, %d], "
		 "\"released_pinned_managed_pool\": [%d, %d, %d], "
		 "\"mapped_pinned_managed_pool\": [%llu, %llu, %llu], "
		 "\"partial_map_range_released\": [%lld, %d]}",
		 wex__cu.driver_version, major, minor, g, fabric,
		 wex__cu.cuMemcpyBatchAsync13 || wex__cu.cuMemcpyBatchAsync12 ? "true" : "false",
		 off_ok > 0 ? "ok" : off_ok < 0 ? "wrong-bytes" : "refused",
		 ro_ok > 0 ? "ok" : ro_ok < 0 ? "wrong-bytes" : "refused",
		 self_ok > 0 ? "ok" : self_ok < 0 ? "wrong-bytes" : "refused",
		 ipc_r == CUDA_SUCCESS ? "\"accepted\"" : "\"refused\"", fds1 - fds0,
		 fd_steady ? "true" : "false", range_q ? "true" : "false", (int)unmapped_ord_r,
		 unmapped_gpu, pageable, (int)host_r, (unsigned long long)host_m, (int)dev_r,
		 (unsigned long long)dev_m, rel[0], rel[1], rel[2], kind_rel[0], kind_rel[1],
		 kind_rel[2], (unsigned long long)kind_m[0], (unsigned long long)kind_m[1],
		 (unsigned long long)kind_m[2], part_size, part_rel);
	if (out) {
		FILE *f = fopen(out, "w");

		CHECK(f && fprintf(f, "%s\n", json) > 0 && fclose(f) == 0);
	}
	CHECK(fd_steady);
	CHECK(off_ok >= 0 && ro_ok >= 0 && self_ok >= 0); /* accepted means right bytes */
	for (int k = 0; k < 3; k++) /* (after the JSON: a 1 is a fact to keep) */
		CHECK(kind_rel[k] == 0 || kind_rel[k] == -2);
	printf("%s\n", json);
	return T_EXIT_PASS;
}
