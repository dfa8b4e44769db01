/* SPDX-License-Identifier: MIT */
/*
 * cuda_vmm.c - CUDA virtual-memory-management segments: exportable
 * allocations (cuMemCreate with a POSIX fd handle type, plus FABRIC where
 * the device supports it), export of memory others created exportable
 * (PyTorch expandable_segments), import into a new address range, and
 * same-address remap: a consumer's reserved range whose physical memory is
 * swapped for the producer's under the same virtual addresses, so CUDA
 * graphs and captured pointers stay valid.
 *
 * Driver rules this file follows (CUDA Programming Guide, VMM section;
 * cuMemMap/cuMemUnmap/cuMemSetAccess/cuMemRelease reference):
 *  - sizes, offsets and addresses are multiples of the MINIMUM granularity;
 *  - a new mapping has no access until cuMemSetAccess;
 *  - cuMemUnmap covers exactly what one cuMemMap mapped (we unmap piece by
 *    piece, as mapped);
 *  - memory is freed when no mapping and no handle (nor exported fd)
 *    refers to it, so handles may be released while a mapping lives;
 *  - unmap/release do not synchronise: we synchronise the context first
 *    (PyTorch CUDACachingAllocator does the same);
 *  - cuMemMap's offset "currently must be zero": every allocation is mapped
 *    from its start, also under a same-address region (whose reservation
 *    reaches below r->addr for a segment that starts inside its first
 *    allocation); only the size may stop short of the allocation's end;
 *  - another device reaches a mapping only through cuMemSetAccess, and
 *    only where cuDeviceCanAccessPeer says it can.
 * Consumers map producers' memory read-only (PROT_READ), their own
 * memory read-write.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "wex.h"
#include "ipc/sock.h"
#include "src/log.h"
#include "vmm/cudawrap.h"
#include "vmm/cuda_backend.h"

struct vmm_chunk {
	CUmemGenericAllocationHandle h; /* 0 when released */
	uint64_t size;                  /* allocation size, mapped whole */
	int mapped;
};

/* State of one segment in this process. */
struct vmm_priv {
	int dev;          /* the device holding the memory */
	int peer;         /* another device given access (import), or -1 */
	CUdeviceptr va;   /* our reservation (alloc, import); 0 for wrap */
	uint64_t va_size;
	size_t n;
	struct vmm_chunk c[];
};

/* One producer allocation (or its first part) mapped under a region. */
struct piece {
	uint64_t off;  /* from the region's base */
	uint64_t size;
};

/* State of one same-address region: a reservation of `span` bytes at
 * `base`, r->addr = base + r->lead. */
struct region_priv {
	int dev;
	uint64_t gran;
	CUdeviceptr base;
	uint64_t span;
	CUmemGenericAllocationHandle own; /* our memory; 0 once released */
	int own_mapped;                   /* own is mapped over the span */
	size_t npieces;                   /* producer pieces mapped (fixed) */
	struct piece *piece;              /* in address order */
};

static void set_prop(CUmemAllocationProp *prop, int dev, unsigned types)
{
	*prop = (CUmemAllocationProp){
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.requestedHandleTypes = (CUmemAllocationHandleType)types,
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev },
	};
}

static int granularity(const CUmemAllocationProp *prop, uint64_t *g)
{
	size_t v = 0;
	int ret;

	ret = WEX_CU(wex__cu.cuMemGetAllocationGranularity(&v, prop,
							  CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	if (ret)
		return ret;
	*g = v ? v : 1;
	return 0;
}

static uint64_t round_up(uint64_t v, uint64_t g)
{
	return (v + g - 1) / g * g;
}

int wex__cuda_dev_attr(int dev, CUdevice_attribute a)
{
	CUdevice d;
	int v = 0;

	if (wex__cu.cuDeviceGet(&d, dev) != CUDA_SUCCESS ||
	    wex__cu.cuDeviceGetAttribute(&v, a, d) != CUDA_SUCCESS)
		return 0;
	return v;
}

/* -1 not tried yet, 1 the driver takes read-only access, 0 it refused. */
static int ro_state = -1;

int wex__cuda_vmm_readonly(void)
{
	return __atomic_load_n(&ro_state, __ATOMIC_RELAXED);
}

/*
 * Access to [va, va+size) for the n (at most 2) devices in dev, in one
 * call: read-write for memory of our own (rw), else read-only, so that a
 * stray write by the engine into the producer's weights faults instead of
 * changing them.  A driver that refuses read-only mappings gets read-write
 * ones and a warning naming its error, once; a refusal after read-only
 * mappings worked, or one for two devices (peer access may be the cause),
 * makes only that mapping read-write (and says so).  Which error a driver
 * refuses PROT_READ with is undocumented, so any but a sticky one is tried
 * again read-write; an error that is not about read-only comes back from
 * that try.  A sticky error is never retried: the context is gone and a
 * retry would only hide which call lost it.  0 when mapped as asked, 1
 * when read-write in place of read-only (the caller marks the mapping, and
 * the client reports it to wexd), or a negative errno.
 */
static int set_access(CUdeviceptr va, uint64_t size, const int *dev, int n, int rw)
{
	int ro = !rw && __atomic_load_n(&ro_state, __ATOMIC_RELAXED) != 0;
	CUmemAccessDesc a[2];
	CUresult r;

	memset(a, 0, sizeof(a));
	if (n < 1 || n > 2)
		return -EINVAL;
	for (int i = 0; i < n; i++)
		a[i] = (CUmemAccessDesc){
			.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev[i] },
			.flags = ro ? CU_MEM_ACCESS_FLAGS_PROT_READ :
				      CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
		};
	r = wex__cu.cuMemSetAccess(va, (size_t)size, a, (size_t)n);
	if (ro && r == CUDA_SUCCESS) {
		int unknown = -1;

		__atomic_compare_exchange_n(&ro_state, &unknown, 1, 0, __ATOMIC_RELAXED,
					    __ATOMIC_RELAXED);
	} else if (ro && r != CUDA_SUCCESS && !wex__cuda_sticky(r)) {
		CUresult r2;

		for (int i = 0; i < n && i < 2; i++)
			a[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		r2 = wex__cu.cuMemSetAccess(va, (size_t)size, a, (size_t)n);
		if (r2 == CUDA_SUCCESS) {
			int unknown = -1;

			/* Given up for good only by a one-device refusal
			 * before any read-only mapping worked. */
			if (n == 1 && __atomic_compare_exchange_n(&ro_state, &unknown, 0, 0,
								  __ATOMIC_RELAXED, __ATOMIC_RELAXED))
				wex_warn("cuda", "the driver refuses read-only mappings "
					 "(cuMemSetAccess with CU_MEM_ACCESS_FLAGS_PROT_READ: "
					 "%s): consumers map the producers' memory read-write, "
					 "so a stray write by the engine would change the "
					 "trainer's weights", wex__cuda_errname(r));
			else if (__atomic_load_n(&ro_state, __ATOMIC_RELAXED) != 0)
				wex_warn("cuda", "a read-only mapping of %llu bytes for %d device(s) "
					 "was refused (%s): this one is read-write",
					 (unsigned long long)size, n, wex__cuda_errname(r));
			return 1;
		}
		r = r2; /* not about read-only: the error of the read-write try */
	}
	if (r == CUDA_SUCCESS)
		return !rw && !ro; /* read-only given up for good: read-write */
	return wex__cuda_err(r, "cuMemSetAccess");
}

static int set_access_rw(CUdeviceptr va, uint64_t size, int dev)
{
	return set_access(va, size, &dev, 1, 1);
}

/*
 * Memory wex allocates for a trainer (wex_cuda_alloc, which stands in for
 * cudaMalloc under PyTorch's CUDAPluggableAllocator, and segments) is
 * reached by another GPU of the process as cudaMalloc memory is once peer
 * access is on: VMM memory only through cuMemSetAccess for that device,
 * which cudaDeviceEnablePeerAccess does not do (a copy to another GPU, or
 * a kernel there, would fault and lose the context).  So every device
 * with peer access to `dev` gets read-write access too, as NCCL's
 * ncclMemAlloc gives its cuMem memory.  A refusal that is not a sticky
 * error is taken device by device, so that one peer the driver refuses
 * does not cost the others their access; it is said once, naming the
 * devices left out, which the memory is not reached from.
 */
static int grant_peers(CUdeviceptr va, uint64_t size, int dev)
{
	static int warned;
	CUmemAccessDesc a[64];
	CUdevice o, d;
	int count = 0, n = 0, can;
	CUresult r;

	if (wex__cu.cuDeviceGetCount(&count) != CUDA_SUCCESS || count < 2 ||
	    wex__cu.cuDeviceGet(&o, dev) != CUDA_SUCCESS)
		return 0;
	for (int i = 0; i < count && n < (int)(sizeof(a) / sizeof(a[0])); i++) {
		can = 0;
		if (i == dev || wex__cu.cuDeviceGet(&d, i) != CUDA_SUCCESS ||
		    wex__cu.cuDeviceCanAccessPeer(&can, d, o) != CUDA_SUCCESS || !can)
			continue;
		memset(&a[n], 0, sizeof(a[n]));
		a[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		a[n].location.id = i;
		a[n].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		n++;
	}
	if (n == 0)
		return 0;
	r = wex__cu.cuMemSetAccess(va, (size_t)size, a, (size_t)n);
	if (r == CUDA_SUCCESS)
		return 0;
	if (wex__cuda_sticky(r))
		return wex__cuda_err(r, "cuMemSetAccess");
	if (n > 1) {
		int k = 0;

		for (int i = 0; i < n; i++) {
			CUresult ri = wex__cu.cuMemSetAccess(va, (size_t)size, &a[i], 1);

			if (ri == CUDA_SUCCESS)
				continue;
			if (wex__cuda_sticky(ri))
				return wex__cuda_err(ri, "cuMemSetAccess");
			r = ri;
			a[k++] = a[i]; /* the refused ones, for the warning */
		}
		if (k == 0) /* (each alone was taken) */
			return 0;
		n = k;
	}
	if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED)) {
		char ids[64 * 4] = "";
		size_t len = 0;

		for (int i = 0; i < n && len < sizeof(ids); i++)
			len += (size_t)snprintf(ids + len, sizeof(ids) - len, "%s%d", i ? "," : "",
						a[i].location.id);
		wex_warn("cuda", "giving device(s) %s, with peer access to device %d, access to "
			 "memory allocated there was refused (cuMemSetAccess: %s): they do not "
			 "reach it (a copy or a kernel there would fault)",
			 ids, dev, wex__cuda_errname(r));
	}
	return 0;
}

/* The device in whose context this process maps producer memory held by
 * `owner`: `other` when that is another device with peer access, else
 * the owner; the owner's context is not made for it (a consumer on
 * another GPU would otherwise make a primary context on the trainer's GPU,
 * hundreds of MiB there).  Both devices get access (access_devs): work
 * that reads the mapping on the owner's device, a copy into host memory
 * or a kernel on a tensor PyTorch placed by the pointer's device, still
 * can.  The device, or a negative errno (logged, naming both devices). */
static int reach(int owner, int other, const char *what)
{
	int ret;

	if (other < 0 || other == owner)
		return owner;
	ret = wex__cuda_peer_check(other, owner, what);
	return ret ? ret : other;
}

/* The devices given access: the owner, and adev when it is another. */
static int access_devs(int owner, int adev, int dev[2])
{
	dev[0] = owner;
	dev[1] = adev;
	return adev != owner ? 2 : 1;
}

/* Raises the soft limit on open files to the hard one, once it was hit:
 * every exportable allocation holds an fd while it lives, and a trainer's
 * memory pool can hold more allocations than the usual soft limit of
 * 1024 (the allocation failed otherwise).  Only when hit: a process that
 * never needs more keeps its limit (select() cannot watch fds past 1023).
 * 1 if raised. */
static int raise_fd_limit(void)
{
	struct rlimit rl;
	rlim_t was;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= rl.rlim_max)
		return 0;
	was = rl.rlim_cur;
	/* (Over fs.nr_open, 1048576 by default, setrlimit fails.) */
	rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > (1u << 20) ? (1u << 20) : rl.rlim_max;
	if (rl.rlim_cur <= was || setrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 0;
	wex_info("cuda", "raised this process's limit on open files from %llu to %llu: each exportable allocation holds an fd while it lives",
		 (unsigned long long)was, (unsigned long long)rl.rlim_cur);
	return 1;
}

/* -EMFILE for a driver call that failed (r) in a process out of file
 * descriptors even after raise_fd_limit, saying why; 0 otherwise.  The
 * driver may report it as anything, out of memory included. */
static int fds_out(CUresult r, const char *call)
{
	struct rlimit rl = { 0 };

	if (r == CUDA_SUCCESS || !wex_fd_exhausted())
		return 0;
	getrlimit(RLIMIT_NOFILE, &rl);
	wex_error("cuda", "%s: %s: this process is out of file descriptors (limit %llu, its hard limit too): each exportable allocation holds one while it lives; raise the hard limit (ulimit -Hn, LimitNOFILE=)",
		  call, wex__cuda_errname(r), (unsigned long long)rl.rlim_cur);
	return -EMFILE;
}

/* Exports h as a close-on-exec fd (the driver's fd is inheritable). */
static int export_fd(CUmemGenericAllocationHandle h, int *fd)
{
	CUresult r;
	int f = -1, ret;

	r = wex__cu.cuMemExportToShareableHandle(&f, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	if (r != CUDA_SUCCESS && wex_fd_exhausted() && raise_fd_limit())
		r = wex__cu.cuMemExportToShareableHandle(&f, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
							 0);
	ret = fds_out(r, "cuMemExportToShareableHandle");
	if (ret)
		return ret;
	ret = wex__cuda_err(r, "cuMemExportToShareableHandle(POSIX fd)");
	if (ret)
		return ret;
	if (fcntl(f, F_SETFD, FD_CLOEXEC) < 0)
		wex_warn("cuda", "FD_CLOEXEC on exported fd %d: %m", f);
	*fd = f;
	return 0;
}

/* Puts the 64-byte fabric handle in desc when the allocation has one:
 * multi-node NVLink peers import it without fd passing. */
static void export_fabric(CUmemGenericAllocationHandle h, unsigned types, struct wex_mem_desc *d)
{
	CUmemFabricHandle fh;

	if (!(types & CU_MEM_HANDLE_TYPE_FABRIC))
		return;
	if (wex__cu.cuMemExportToShareableHandle(&fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0) != CUDA_SUCCESS)
		return; /* the POSIX fd still works on this node */
	memcpy(d->handle, fh.data, sizeof(fh.data));
	d->handle_len = sizeof(fh.data);
}

static struct vmm_priv *priv_new(size_t n, int dev)
{
	struct vmm_priv *p = calloc(1, sizeof(*p) + n * sizeof(p->c[0]));

	if (p) {
		p->n = n;
		p->dev = dev;
		p->peer = -1;
	}
	return p;
}

static int cu_probe(char *why, size_t len)
{
	return wex__cuda_probe(why, len);
}

/* Devices whose cuMemCreate refused fabric handles (no IMEX channel). */
static uint64_t fabric_refused;

/* Fabric handles refused (`why`): this allocation asks for POSIX fds alone. */
static void drop_fabric(CUmemAllocationProp *prop, unsigned *types, CUresult why)
{
	wex_debug("cuda", "fabric handles unavailable (%s): POSIX fd only", wex__cuda_errname(why));
	*types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop->requestedHandleTypes = (CUmemAllocationHandleType)*types;
}

/* Fabric is not asked for again on this device. */
static void fabric_off(int device)
{
	if (device < 64)
		__atomic_fetch_or(&fabric_refused, 1ull << device, __ATOMIC_RELAXED);
}

static int vmm_alloc(uint64_t size, int device, struct wex_mem_seg *seg)
{
	unsigned types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	CUmemGenericAllocationHandle h = 0;
	CUmemAllocationProp prop;
	struct vmm_priv *p;
	CUdeviceptr va = 0;
	uint64_t g, asize;
	CUresult r;
	int fd = -1, ret;

	ret = wex__cuda_use_device(device);
	if (ret)
		return ret;
	if (size == 0)
		return -EINVAL;
	if (!wex__cuda_dev_attr(device, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)) {
		wex_error("cuda", "device %d cannot export VMM memory as a POSIX fd", device);
		return -EOPNOTSUPP;
	}
	if (wex__cuda_dev_attr(device, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED) &&
	    !(device < 64 && (__atomic_load_n(&fabric_refused, __ATOMIC_RELAXED) >> device) & 1))
		types |= CU_MEM_HANDLE_TYPE_FABRIC;
	set_prop(&prop, device, types);
	if (wex__cuda_dev_attr(device, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED))
		prop.allocFlags.gpuDirectRDMACapable = 1;
	if (types & CU_MEM_HANDLE_TYPE_FABRIC) {
		size_t v = 0;

		/* A device that says it supports fabric handles may still
		 * refuse them here (no IMEX channel): POSIX fds alone, as for
		 * a refused cuMemCreate below. */
		r = wex__cu.cuMemGetAllocationGranularity(&v, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
		if (r != CUDA_SUCCESS) {
			drop_fabric(&prop, &types, r);
			fabric_off(device);
		}
	}
	ret = granularity(&prop, &g);
	if (ret)
		return ret;
	if (size > UINT64_MAX - (g - 1)) /* rounded up, it would wrap */
		return -ENOMEM;
	asize = round_up(size, g);
	r = wex__cu.cuMemCreate(&h, (size_t)asize, &prop, 0);
	/* A driver that holds an fd per allocation (the emulator's memfd)
	 * runs out of them here rather than at the export below: the same
	 * raise, and EMFILE rather than out of memory past the hard limit. */
	if (r != CUDA_SUCCESS && wex_fd_exhausted() && raise_fd_limit())
		r = wex__cu.cuMemCreate(&h, (size_t)asize, &prop, 0);
	ret = fds_out(r, "cuMemCreate");
	if (ret)
		return ret;
	if (r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY && (types & CU_MEM_HANDLE_TYPE_FABRIC)) {
		/* No IMEX channel or fabric manager: PyTorch treats any non-OOM
		 * failure the same way and falls back to POSIX fds. */
		drop_fabric(&prop, &types, r);
		r = wex__cu.cuMemCreate(&h, (size_t)asize, &prop, 0);
		/* Fabric was the cause: not asked again on this device (one
		 * failing cuMemCreate per allocation otherwise). */
		if (r == CUDA_SUCCESS)
			fabric_off(device);
	}
	/* Out of memory is the caller's to report: PyTorch's allocator
	 * frees its cached blocks and asks again, and raises its own
	 * OutOfMemoryError only if that fails too (an error line per flush
	 * of its cache would cry wolf). */
	if (r == CUDA_ERROR_OUT_OF_MEMORY) {
		wex_debug("cuda", "cuMemCreate(%llu bytes, device %d): out of memory",
			  (unsigned long long)asize, device);
		return -ENOMEM;
	}
	ret = wex__cuda_err(r, "cuMemCreate");
	if (ret)
		return ret;
	ret = WEX_CU(wex__cu.cuMemAddressReserve(&va, (size_t)asize, (size_t)g, 0, 0));
	if (ret)
		goto err_release;
	ret = WEX_CU(wex__cu.cuMemMap(va, (size_t)asize, 0, h, 0));
	if (ret)
		goto err_free_va;
	ret = set_access_rw(va, asize, device);
	if (!ret)
		ret = grant_peers(va, asize, device);
	if (ret)
		goto err_unmap;
	ret = export_fd(h, &fd);
	if (ret)
		goto err_unmap;
	p = priv_new(1, device);
	if (!p) {
		ret = -ENOMEM;
		goto err_close;
	}
	p->va = va;
	p->va_size = asize;
	p->c[0] = (struct vmm_chunk){ .h = h, .size = asize, .mapped = 1 };
	memset(seg, 0, sizeof(*seg));
	seg->ops = &wex_mem_cuda_vmm_ops;
	seg->desc.kind = WEX_MEM_CUDA_VMM;
	seg->desc.size = size;
	seg->desc.alloc_size = asize;
	wex__cuda_device_uuid(device, seg->desc.device, sizeof(seg->desc.device));
	export_fabric(h, types, &seg->desc);
	seg->ptr = (void *)(uintptr_t)va;
	seg->fd = fd;
	seg->owner = 1;
	seg->priv = p;
	return 0;
err_close:
	close(fd);
err_unmap:
	wex__cu.cuMemUnmap(va, (size_t)asize);
err_free_va:
	wex__cu.cuMemAddressFree(va, (size_t)asize);
err_release:
	wex__cu.cuMemRelease(h);
	return ret;
}

int wex__cuda_vmm_chunks(void *ptr, uint64_t size, struct wex__cuda_chunk *out, size_t max,
			 size_t *n)
{
	uint64_t cur = (uint64_t)(uintptr_t)ptr, end = cur + size;
	size_t k = 0;
	int dev, ret;

	ret = wex__cuda_load();
	if (ret)
		return ret;
	/* (A range past the end of the address space would wrap end below
	 * cur: no chunk, and *out unwritten.) */
	if (size == 0 || size > UINT64_MAX - cur)
		return -EINVAL;
	if (wex__cuda_ptr_device(cur, &dev) == 0) {
		ret = wex__cuda_use_device(dev);
		if (ret)
			return ret;
	}
	while (cur < end) {
		CUdeviceptr base = 0;
		size_t sz = 0;

		/* For VMM memory the range is the one allocation mapped at
		 * cur (one expandable-segment chunk), not the reservation:
		 * libfabric relies on the same (ofiwg/libfabric PR #12473,
		 * "cuMemGetAddressRange() only returns the size of the
		 * individual segment containing the pointer"). */
		ret = WEX_CU(wex__cu.cuMemGetAddressRange(&base, &sz, (CUdeviceptr)cur));
		if (ret)
			return ret;
		if (sz == 0 || base + sz <= cur)
			return -EINVAL;
		if (k < max)
			out[k] = (struct wex__cuda_chunk){
				.base = base, .size = sz, .offset = cur - base,
			};
		k++;
		cur = base + sz;
	}
	*n = k;
	return k > max ? -ENOSPC : 0;
}

static int said_types; /* vmm_wrap logged the handle types */

static int vmm_wrap(void *ptr, uint64_t size, int fd, struct wex_mem_seg *seg)
{
	CUmemGenericAllocationHandle h = 0;
	struct wex__cuda_chunk ch;
	CUmemAllocationProp prop;
	struct vmm_priv *p;
	size_t n = 0;
	int efd = -1, dev, ret;

	ret = wex__cuda_load();
	if (ret)
		return ret;
	if (!ptr || size == 0)
		return -EINVAL;
	ret = wex__cuda_vmm_chunks(ptr, size, &ch, 1, &n);
	if (ret == -ENOSPC) {
		/* The caller chains the allocations (wrap_chunks). */
		wex_debug("cuda", "a range of %llu bytes spans %zu allocations",
			  (unsigned long long)size, n);
		return -E2BIG;
	}
	if (ret)
		return ret;
	ret = WEX_CU(wex__cu.cuMemRetainAllocationHandle(&h, ptr));
	if (ret)
		return ret == -EINVAL ? -EOPNOTSUPP : ret; /* not VMM memory */
	ret = WEX_CU(wex__cu.cuMemGetAllocationPropertiesFromHandle(&prop, h));
	if (ret)
		goto err_release;
	if (!(prop.requestedHandleTypes &
	      (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC))) {
		/* vLLM's CuMemAllocator and torch_memory_saver create memory
		 * like this, and so does PyTorch's expandable segments with
		 * TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC=0 (its default in Meta's
		 * internal builds): it can never be exported. */
		wex_error("cuda", "memory of %llu bytes was created without a POSIX fd or fabric "
			  "handle type (handle types %#x): not exportable (use "
			  "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True without "
			  "TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC=0, or wex_cuda_alloc)",
			  (unsigned long long)size, (unsigned)prop.requestedHandleTypes);
		ret = -EOPNOTSUPP;
		goto err_release;
	}
	dev = prop.location.id;
	/* Which handles the allocator asked for (PyTorch's expandable
	 * segments try FABRIC first): said once per process. */
	if (!__atomic_exchange_n(&said_types, 1, __ATOMIC_RELAXED))
		wex_info("cuda", "wrapping memory created with handle types:%s%s (device %d)",
			 prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ?
				 " posix_fd" : "",
			 prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC ? " fabric" : "", dev);
	if (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
		ret = export_fd(h, &efd);
		if (ret)
			goto err_release;
	}
	p = priv_new(1, dev);
	if (!p) {
		ret = -ENOMEM;
		goto err_close;
	}
	/* The retained handle is released by release(): retain and release
	 * come in pairs. */
	p->c[0] = (struct vmm_chunk){ .h = h, .size = ch.size };
	memset(seg, 0, sizeof(*seg));
	seg->ops = &wex_mem_cuda_vmm_ops;
	seg->desc.kind = WEX_MEM_CUDA_VMM;
	seg->desc.size = size;
	seg->desc.alloc_size = ch.size;
	seg->desc.handle_offset = ch.offset;
	wex__cuda_device_uuid(dev, seg->desc.device, sizeof(seg->desc.device));
	export_fabric(h, prop.requestedHandleTypes, &seg->desc);
	if (efd < 0 && !seg->desc.handle_len) {
		/* Fabric only (PyTorch's expandable segments where IMEX
		 * works), and the export failed: nothing can import it. */
		wex_error("cuda", "memory of %llu bytes has fabric handles only, and exporting its "
			  "fabric handle failed (no IMEX channel?)", (unsigned long long)size);
		free(p);
		ret = -EOPNOTSUPP;
		goto err_release;
	}
	seg->ptr = ptr;
	seg->fd = efd;
	seg->owner = 0;
	seg->priv = p;
	return 0;
err_close:
	close(efd);
err_release:
	wex__cu.cuMemRelease(h);
	return ret;
}

static int vmm_release(struct wex_mem_seg *seg);

static int vmm_wrap_chunks(void *ptr, uint64_t size, struct wex_mem_seg *segs, size_t max,
			   size_t *n)
{
	uint64_t start = (uint64_t)(uintptr_t)ptr, end = start + size;
	struct wex__cuda_chunk *ch;
	size_t k = 0, done = 0;
	int ret;

	ret = wex__cuda_load();
	if (ret)
		return ret;
	if (!ptr || size == 0 || end < start)
		return -EINVAL;
	/* Count first, then enumerate into an array of the right size. */
	ret = wex__cuda_vmm_chunks(ptr, size, NULL, 0, &k);
	if (ret && ret != -ENOSPC)
		return ret;
	*n = k;
	if (k > max)
		return -ENOSPC;
	ch = calloc(k, sizeof(*ch));
	if (!ch)
		return -ENOMEM;
	ret = wex__cuda_vmm_chunks(ptr, size, ch, k, &k);
	if (ret)
		goto out;
	for (; done < k; done++) {
		uint64_t ps = ch[done].base + ch[done].offset;
		uint64_t pe = ch[done].base + ch[done].size < end ? ch[done].base + ch[done].size : end;

		ret = vmm_wrap((void *)(uintptr_t)ps, pe - ps, -1, &segs[done]);
		if (ret) {
			wex_error("cuda", "wrapping allocation %zu of %zu (at 0x%llx, %llu bytes): %s",
				  done, k, (unsigned long long)ch[done].base,
				  (unsigned long long)ch[done].size, wex_strerror(ret));
			goto out;
		}
		/* The driver enumerated this piece as one allocation; wrap
		 * agreeing keeps the parts and the chunk list in step.  Parts
		 * on one device only: one mapping on the importer's side. */
		if (segs[done].desc.alloc_size != ch[done].size ||
		    segs[done].desc.handle_offset != ch[done].offset)
			ret = -EIO;
		else if (strcmp(segs[done].desc.device, segs[0].desc.device))
			ret = -EINVAL;
		if (ret) {
			wex_error("cuda", "allocation %zu of %zu: %s", done, k,
				  ret == -EIO ? "the driver's ranges disagree" : "on another device");
			vmm_release(&segs[done]);
			goto out;
		}
	}
	*n = k;
out:
	if (ret)
		while (done-- > 0)
			vmm_release(&segs[done]);
	free(ch);
	return ret;
}

static int vmm_export_fd(const struct wex_mem_seg *seg, int *fd)
{
	const struct vmm_priv *p = seg->priv;
	struct wex_mem_thread_state saved;
	int ret;

	ret = wex__cuda_load();
	if (ret)
		return ret;
	/* One allocation wrap exported a POSIX fd of. */
	if (!p || p->n != 1 || !p->c[0].h || p->va)
		return -EINVAL;
	wex_mem_thread_save(&saved);
	ret = wex__cuda_use_device(p->dev);
	if (!ret)
		ret = export_fd(p->c[0].h, fd);
	wex_mem_thread_restore(&saved);
	return ret;
}

/* Wrapped memory: whether the allocation wrap retained is still the one
 * mapped at seg->ptr.  A handle wex retains is never reused while held, so
 * another value there is another allocation (a trainer that freed its
 * parameters, torch.cuda.empty_cache(), and allocated them again at the
 * same address: veRL's parameter offload, FSDP2's model.cpu() then
 * .to("cuda")). */
static int vmm_same(const struct wex_mem_seg *seg)
{
	const struct vmm_priv *p = seg->priv;
	CUmemGenericAllocationHandle h = 0;
	CUresult r;
	int ret;

	if (!p || p->va || p->n != 1 || !p->c[0].h)
		return 0; /* wex's own memory (alloc, import): it stays */
	ret = wex__cuda_load();
	if (ret)
		return ret;
	r = wex__cu.cuMemRetainAllocationHandle(&h, seg->ptr);
	if (r == CUDA_ERROR_INVALID_VALUE)
		return -ESTALE; /* nothing mapped there now */
	if (r != CUDA_SUCCESS)
		return WEX_CU(r);
	wex__cu.cuMemRelease(h);
	return h == p->c[0].h ? 0 : -ESTALE;
}

static void close_fds(const int *fds, size_t n, size_t from)
{
	for (size_t i = from; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

/* Imports part i of n from its fabric handle (the segment has no fd:
 * fabric-only memory, or a producer on another node).  A refusal is
 * logged naming IMEX, the usual cause. */
static int import_fabric(CUmemGenericAllocationHandle *h, const void *fh, size_t i, size_t n)
{
	CUresult r;

	r = wex__cu.cuMemImportFromShareableHandle(h, (void *)fh, CU_MEM_HANDLE_TYPE_FABRIC);

	if (r == CUDA_SUCCESS)
		return 0;
	if (wex__cuda_sticky(r))
		return wex__cuda_err(r, "cuMemImportFromShareableHandle(FABRIC)");
	wex_error("cuda", "import: the producer's memory (part %zu of %zu) has a fabric handle "
		  "and no POSIX fd, and importing the fabric handle failed: %s: this process "
		  "needs access to an IMEX channel (/dev/nvidia-caps-imex-channels/channelN, "
		  "and the IMEX daemon on the node) where the producer has one; or the producer "
		  "must export memory with a POSIX fd (PyTorch expandable segments allocate "
		  "fabric-only memory where fabric works)", i, n, wex__cuda_errname(r));
	return wex__cuda_errno(r);
}

int wex__cuda_vmm_import_chunks(const struct wex_mem_desc *descs, const int *fds, size_t n,
				int access_dev, struct wex_mem_seg *seg)
{
	CUmemAllocationProp prop;
	struct vmm_priv *p = NULL;
	CUdeviceptr va = 0;
	uint64_t g, total = 0, off;
	size_t i = 0;
	int dev, adev, devs[2], ret;

	ret = wex__cuda_load();
	if (ret)
		goto err_fds;
	if (n == 0) {
		ret = -EINVAL;
		goto err_fds;
	}
	for (size_t k = 0; k < n; k++) {
		if (descs[k].kind != WEX_MEM_CUDA_VMM || descs[k].alloc_size == 0 ||
		    (fds[k] < 0 && descs[k].handle_len != sizeof(CUmemFabricHandle))) {
			ret = -EINVAL;
			goto err_fds;
		}
		total += descs[k].alloc_size;
	}
	if (descs[0].handle_offset + (n == 1 ? descs[0].size : 0) > total) {
		ret = -EINVAL;
		goto err_fds;
	}
	ret = wex__cuda_device_by_uuid(descs[0].device, &dev);
	if (ret)
		goto err_fds;
	adev = reach(dev, access_dev, "import");
	if (adev < 0) {
		ret = adev;
		goto err_fds;
	}
	ret = wex__cuda_use_device(adev);
	if (ret)
		goto err_fds;
	set_prop(&prop, dev, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	ret = granularity(&prop, &g);
	if (ret)
		goto err_fds;
	p = priv_new(n, dev);
	if (!p) {
		ret = -ENOMEM;
		goto err_fds;
	}
	ret = WEX_CU(wex__cu.cuMemAddressReserve(&va, (size_t)total, (size_t)g, 0, 0));
	if (ret)
		goto err_free;
	p->va = va;
	p->va_size = total;
	p->peer = adev != dev ? adev : -1;
	for (i = 0, off = 0; i < n; off += descs[i].alloc_size, i++) {
		CUmemGenericAllocationHandle h = 0;

		/* The fd when the segment has one: a fabric handle needs IMEX
		 * channel access here, which a node may give the producer and
		 * not the consumer. */
		if (fds[i] >= 0)
			ret = WEX_CU(wex__cu.cuMemImportFromShareableHandle(
				&h, (void *)(uintptr_t)fds[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		else if (descs[i].handle_len == sizeof(CUmemFabricHandle))
			ret = import_fabric(&h, descs[i].handle, i, n);
		else
			ret = -EINVAL; /* neither an fd nor a fabric handle */
		/* The handle holds the memory now; the fd is one more reference
		 * we need not keep (memMapIPCDrv closes it at once too). */
		if (fds[i] >= 0)
			close(fds[i]);
		if (ret) {
			i++;
			goto err_unmap;
		}
		p->c[i].h = h;
		p->c[i].size = descs[i].alloc_size;
		if (off % g || descs[i].alloc_size % g) {
			ret = -EINVAL;
			i++;
			goto err_unmap;
		}
		ret = WEX_CU(wex__cu.cuMemMap(va + off, (size_t)descs[i].alloc_size, 0, h, 0));
		if (ret) {
			i++;
			goto err_unmap;
		}
		p->c[i].mapped = 1;
	}
	/* One cuMemSetAccess over the whole range and both devices: it is
	 * the expensive call.  Read-only: the producer's weights. */
	ret = set_access(va, total, devs, access_devs(dev, adev, devs), 0);
	if (ret < 0)
		goto err_unmap;
	memset(seg, 0, sizeof(*seg));
	seg->rw = ret;
	seg->ops = &wex_mem_cuda_vmm_ops;
	seg->desc = descs[0];
	seg->desc.alloc_size = total;
	if (n > 1)
		seg->desc.size = total - descs[0].handle_offset;
	seg->ptr = (void *)(uintptr_t)(va + descs[0].handle_offset);
	seg->fd = -1;
	seg->owner = 2;
	seg->priv = p;
	return 0;
err_unmap:
	close_fds(fds, n, i);
	off = 0;
	for (size_t k = 0; k < n; off += descs[k].alloc_size, k++) {
		if (p->c[k].mapped)
			wex__cu.cuMemUnmap(va + off, (size_t)p->c[k].size);
		if (p->c[k].h)
			wex__cu.cuMemRelease(p->c[k].h);
	}
	wex__cu.cuMemAddressFree(va, (size_t)total);
	free(p);
	return ret;
err_free:
	free(p);
err_fds:
	close_fds(fds, n, 0);
	return ret;
}

static int vmm_import(const struct wex_mem_desc *desc, int fd, int access_dev,
		      struct wex_mem_seg *seg)
{
	return wex__cuda_vmm_import_chunks(desc, &fd, 1, access_dev, seg);
}

static int keep_first(int ret, int r)
{
	return ret ? ret : r;
}

static int vmm_release(struct wex_mem_seg *seg)
{
	struct vmm_priv *p = seg->priv;
	int ret = 0;

	if (p && wex__cuda_load() == 0) {
		/* An import reached from another device was mapped in that
		 * one's context (see reach).  Unmap does not wait for work
		 * still reading: the owner's context's too where the process
		 * has one (a copy into host memory, the engine's kernels), but
		 * none is made for it here. */
		int cdev = p->va && p->peer >= 0 ? p->peer : p->dev;

		if (cdev != p->dev && wex__cuda_device_active(p->dev)) {
			ret = wex__cuda_use_device(p->dev);
			if (!ret)
				ret = WEX_CU(wex__cu.cuCtxSynchronize());
		}
		ret = keep_first(ret, wex__cuda_use_device(cdev));
		if (p->va) {
			ret = keep_first(ret, WEX_CU(wex__cu.cuCtxSynchronize()));
			uint64_t off = 0;

			for (size_t i = 0; i < p->n; off += p->c[i].size, i++)
				if (p->c[i].mapped)
					ret = keep_first(ret, WEX_CU(wex__cu.cuMemUnmap(
						p->va + off, (size_t)p->c[i].size)));
			ret = keep_first(ret, WEX_CU(wex__cu.cuMemAddressFree(p->va, (size_t)p->va_size)));
		}
		for (size_t i = 0; i < p->n; i++)
			if (p->c[i].h)
				ret = keep_first(ret, WEX_CU(wex__cu.cuMemRelease(p->c[i].h)));
	}
	free(p);
	if (seg->fd >= 0 && close(seg->fd) < 0 && !ret)
		ret = -errno;
	seg->fd = -1;
	seg->ptr = NULL;
	seg->priv = NULL;
	return ret;
}

/* ---------------------------------------------------------------------- */
/* Same-address remap.                                                    */

static int own_create(int dev, uint64_t size, CUmemGenericAllocationHandle *h)
{
	CUmemAllocationProp prop;

	/* The consumer's own memory is never exported: no handle types. */
	set_prop(&prop, dev, CU_MEM_HANDLE_TYPE_NONE);
	return WEX_CU(wex__cu.cuMemCreate(h, (size_t)size, &prop, 0));
}

/* The reservation starts `lead` bytes below r->addr, so that map_fixed
 * can map the producer's first allocation from its start and still show
 * the segment's first byte at r->addr; the region's own memory covers the
 * whole reservation. */
static int vmm_reserve(uint64_t size, uint64_t lead, int device, struct wex_mem_region *r)
{
	CUmemGenericAllocationHandle h = 0;
	CUmemAllocationProp prop;
	struct region_priv *p;
	CUdeviceptr va = 0;
	uint64_t g, span;
	int ret;

	ret = wex__cuda_use_device(device);
	if (ret)
		return ret;
	if (size == 0 || lead + size < size)
		return -EINVAL;
	/* The producer's exportable allocations dictate the alignment. */
	set_prop(&prop, device, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	ret = granularity(&prop, &g);
	if (ret)
		return ret;
	if (lead + size > UINT64_MAX - (g - 1)) /* rounded up, it would wrap */
		return -ENOMEM;
	span = round_up(lead + size, g);
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	ret = WEX_CU(wex__cu.cuMemAddressReserve(&va, (size_t)span, (size_t)g, 0, 0));
	if (ret)
		goto err_free;
	ret = own_create(device, span, &h);
	if (ret)
		goto err_free_va;
	ret = WEX_CU(wex__cu.cuMemMap(va, (size_t)span, 0, h, 0));
	if (ret)
		goto err_release;
	ret = set_access_rw(va, span, device);
	if (ret)
		goto err_unmap;
	p->dev = device;
	p->gran = g;
	p->base = va;
	p->span = span;
	p->own = h;
	p->own_mapped = 1;
	memset(r, 0, sizeof(*r));
	r->ops = &wex_mem_cuda_vmm_ops;
	r->addr = (void *)(uintptr_t)(va + lead);
	r->size = span - lead;
	r->lead = lead;
	r->device = device;
	r->priv = p;
	return 0;
err_unmap:
	wex__cu.cuMemUnmap(va, (size_t)span);
err_release:
	wex__cu.cuMemRelease(h);
err_free_va:
	wex__cu.cuMemAddressFree(va, (size_t)span);
err_free:
	free(p);
	return ret;
}

/* Unmaps the producer's pieces from the region.  A piece the driver
 * refuses to unmap stays listed (unreserve tries it again). */
static int unmap_pieces(struct region_priv *p)
{
	size_t k = 0;
	int ret = 0;

	for (size_t i = 0; i < p->npieces; i++) {
		int r = WEX_CU(wex__cu.cuMemUnmap(p->base + p->piece[i].off,
						  (size_t)p->piece[i].size));

		if (r)
			p->piece[k++] = p->piece[i];
		ret = keep_first(ret, r);
	}
	p->npieces = k;
	if (!k) {
		free(p->piece);
		p->piece = NULL;
	}
	return ret;
}

static int unmap_own(struct region_priv *p)
{
	int ret;

	if (!p->own_mapped)
		return 0;
	ret = WEX_CU(wex__cu.cuMemUnmap(p->base, (size_t)p->span));
	if (!ret)
		p->own_mapped = 0;
	return ret;
}

/*
 * After a swap failed half-way: the region shows its own memory again,
 * with fixed = 0.  0 when that memory still held the region's bytes;
 * -WEX_EDIRTY when they are lost: fresh memory (the region had given its
 * own back while it showed a producer's, or was lost already: memory
 * created by an earlier attempt holds nothing either), or, where the driver refuses
 * even that, no writable memory at r->addr (lost = 1, the driver's error
 * in *err when err is not NULL) until a later call succeeds.
 */
static int restore_own(struct wex_mem_region *r, struct region_priv *p, int *err)
{
	int fresh = r->lost, ret; /* a lost region's own memory holds nothing */

	r->fixed = 0;
	r->rw = 0;
	r->lost = 1; /* until own memory is mapped and writable again */
	ret = unmap_pieces(p);
	if (!ret && !p->own_mapped) {
		if (!p->own) {
			fresh = 1;
			ret = own_create(p->dev, p->span, &p->own);
			if (ret)
				p->own = 0;
		}
		if (!ret)
			ret = WEX_CU(wex__cu.cuMemMap(p->base, (size_t)p->span, 0, p->own, 0));
		if (!ret)
			p->own_mapped = 1;
	}
	if (!ret)
		ret = set_access_rw(p->base, p->span, p->dev);
	if (err)
		*err = ret;
	if (ret)
		return -WEX_EDIRTY;
	r->lost = 0;
	return fresh ? -WEX_EDIRTY : 0;
}

static int vmm_map_fixed(struct wex_mem_region *r, struct wex_mem_seg *seg, uint64_t off)
{
	struct region_priv *p = r->priv;
	struct vmm_priv *s = seg->priv;
	struct piece *piece;
	uint64_t coff = 0, total = 0;
	size_t np = 0;
	int adev, ret, rret;

	ret = wex__cuda_load();
	if (ret)
		return ret;
	if (!p || !s || seg->ops != &wex_mem_cuda_vmm_ops || r->ops != &wex_mem_cuda_vmm_ops)
		return -EINVAL;
	if (off != r->lead) {
		wex_error("cuda", "map_fixed: the segment starts %llu bytes into its first "
			  "allocation, but the region was reserved for %llu (reserve with the "
			  "segment's handle_offset as lead)", (unsigned long long)off,
			  (unsigned long long)r->lead);
		return -EINVAL;
	}
	for (size_t i = 0; i < s->n; i++) {
		if (!s->c[i].h)
			return -EINVAL; /* released: nothing to map */
		total += s->c[i].size;
	}
	if (p->span > total) {
		wex_error("cuda", "map_fixed: the region spans %llu bytes from the segment's first "
			  "allocation, its allocations only %llu", (unsigned long long)p->span,
			  (unsigned long long)total);
		return -EINVAL;
	}
	/* The producer's memory, seen by the region's device only: the
	 * engine's tensors there were placed on it before any swap, and the
	 * unmaps sync only its context. */
	adev = reach(s->dev, r->device, "map_fixed");
	if (adev < 0)
		return adev;
	piece = calloc(s->n, sizeof(*piece));
	if (!piece)
		return -ENOMEM;
	ret = wex__cuda_use_device(r->device);
	if (ret)
		goto err_free;
	/* No kernel of ours may read the old pages while they go away. */
	ret = WEX_CU(wex__cu.cuCtxSynchronize());
	if (ret)
		goto err_free;
	if (r->fixed) {
		ret = unmap_pieces(p);
		if (ret) {
			/* Part of the producer's memory is gone and our own
			 * was given back: the bytes are lost. */
			free(piece);
			restore_own(r, p, NULL);
			return -WEX_EDIRTY;
		}
	} else {
		/* Pieces left by a failure the driver could not undo go first;
		 * the region is unchanged when either fails. */
		ret = unmap_pieces(p);
		if (!ret)
			ret = unmap_own(p);
		if (ret)
			goto err_free;
	}
	/* Every allocation from offset 0 (the driver's rule), the last one
	 * cut where the reservation ends. */
	for (size_t i = 0; i < s->n && coff < p->span; coff += s->c[i].size, i++) {
		uint64_t len = p->span - coff < s->c[i].size ? p->span - coff : s->c[i].size;

		ret = WEX_CU(wex__cu.cuMemMap(p->base + coff, (size_t)len, 0, s->c[i].h, 0));
		if (ret)
			goto err_restore;
		piece[np++] = (struct piece){ .off = coff, .size = len };
	}
	ret = set_access(p->base, p->span, &adev, 1, 0);
	if (ret < 0)
		goto err_restore;
	r->rw = ret;
	/* The swap is done: our own physical memory is not needed while the
	 * producer's is shown (zero extra memory). */
	if (p->own) {
		wex__cu.cuMemRelease(p->own);
		p->own = 0;
	}
	p->piece = piece;
	p->npieces = np;
	r->fixed = 1;
	r->lost = 0;
	return 0;
err_restore:
	/* Take down what this call mapped and show our memory again. */
	p->piece = piece;
	p->npieces = np;
	rret = restore_own(r, p, NULL);
	return rret ? rret : ret;
err_free:
	free(piece);
	return ret;
}

static int vmm_unmap_fixed(struct wex_mem_region *r)
{
	struct region_priv *p = r->priv;
	CUmemGenericAllocationHandle h = 0;
	CUdeviceptr tmp = 0;
	CUstream s;
	int ret;

	if (!r->fixed && !r->lost)
		return 0;
	ret = wex__cuda_use_device(r->device);
	if (ret)
		return ret;
	if (!r->fixed) {
		/* Lost in an earlier failure: try again to give it memory
		 * (after our queued work, which may still read pieces left
		 * mapped there). */
		int err = 0;

		ret = WEX_CU(wex__cu.cuCtxSynchronize());
		if (ret)
			return ret;
		ret = restore_own(r, p, &err);
		return r->lost ? err : ret;
	}
	ret = wex__cuda_stream(r->device, &s);
	if (ret)
		return ret;
	/* New own memory at a temporary address first: the region keeps
	 * showing the producer's bytes until the copy is complete, and an
	 * error up to there leaves it as it was. */
	ret = own_create(r->device, p->span, &h);
	if (ret)
		return ret;
	ret = WEX_CU(wex__cu.cuMemAddressReserve(&tmp, (size_t)p->span, (size_t)p->gran, 0, 0));
	if (ret)
		goto err_release;
	ret = WEX_CU(wex__cu.cuMemMap(tmp, (size_t)p->span, 0, h, 0));
	if (ret)
		goto err_free_tmp;
	ret = set_access_rw(tmp, p->span, r->device);
	if (ret)
		goto err_unmap_tmp;
	ret = WEX_CU(wex__cu.cuMemcpyAsync(tmp, p->base, (size_t)p->span, s));
	if (!ret)
		ret = WEX_CU(wex__cu.cuStreamSynchronize(s));
	/* Nothing reads the old pages any more (they go away next). */
	if (!ret)
		ret = WEX_CU(wex__cu.cuCtxSynchronize());
	if (ret)
		goto err_unmap_tmp;
	if (wex__cu.cuMemUnmap(tmp, (size_t)p->span) == CUDA_SUCCESS)
		wex__cu.cuMemAddressFree(tmp, (size_t)p->span);
	/* The swap.  From here a failure leaves the region with its own
	 * memory (holding the bytes, when it can be mapped at all). */
	p->own = h;
	r->fixed = 0;
	r->rw = 0;
	ret = unmap_pieces(p);
	if (!ret) {
		ret = WEX_CU(wex__cu.cuMemMap(p->base, (size_t)p->span, 0, h, 0));
		if (!ret)
			p->own_mapped = 1;
	}
	if (!ret)
		ret = set_access_rw(p->base, p->span, r->device);
	/* Tried again once; holding the bytes after all is a success. */
	return ret && restore_own(r, p, NULL) ? -WEX_EDIRTY : 0;
err_unmap_tmp:
	wex__cu.cuMemUnmap(tmp, (size_t)p->span);
err_free_tmp:
	wex__cu.cuMemAddressFree(tmp, (size_t)p->span);
err_release:
	wex__cu.cuMemRelease(h);
	return ret;
}

/* Frees the region whatever it shows: a producer's pieces are unmapped
 * (no copy of their bytes is made), its own memory released. */
static int vmm_unreserve(struct wex_mem_region *r)
{
	struct region_priv *p = r->priv;
	int ret;

	if (!p)
		return 0;
	ret = wex__cuda_use_device(r->device);
	if (!ret) {
		ret = WEX_CU(wex__cu.cuCtxSynchronize());
		ret = keep_first(ret, unmap_pieces(p));
		ret = keep_first(ret, unmap_own(p));
		ret = keep_first(ret, WEX_CU(wex__cu.cuMemAddressFree(p->base, (size_t)p->span)));
		if (p->own)
			ret = keep_first(ret, WEX_CU(wex__cu.cuMemRelease(p->own)));
	}
	free(p->piece);
	free(p);
	r->priv = NULL;
	r->addr = NULL;
	r->fixed = 0;
	r->rw = 0;
	r->lead = 0;
	return ret;
}

const struct wex_mem_ops wex_mem_cuda_vmm_ops = {
	.name = "cuda_vmm",
	.kind = WEX_MEM_CUDA_VMM,
	.probe = cu_probe,
	.alloc = vmm_alloc,
	.wrap = vmm_wrap,
	.import = vmm_import,
	.release = vmm_release,
	.reserve = vmm_reserve,
	.map_fixed = vmm_map_fixed,
	.unmap_fixed = vmm_unmap_fixed,
	.unreserve = vmm_unreserve,
	.copy = wex__cuda_copy,
	.wrap_chunks = vmm_wrap_chunks,
	.import_chunks = wex__cuda_vmm_import_chunks,
	.sync_device = wex__cuda_sync_device,
	.host_pin = wex__cuda_host_pin,
	.host_unpin = wex__cuda_host_unpin,
	.export_fd = vmm_export_fd,
	.same = vmm_same,
};
