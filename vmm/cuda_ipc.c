/* SPDX-License-Identifier: MIT */
/*
 * cuda_ipc.c - legacy CUDA IPC segments for plain cudaMalloc memory (which
 * cannot be exported as a VMM fd).  The handle of the allocation's base
 * travels in desc.handle, the offset of the segment inside the allocation
 * in desc.handle_offset; no fd is involved.
 *
 * Two driver rules shape the importer (platform-facts B):
 *  - a handle may be opened once per process and context (older drivers
 *    refuse a second open with CUDA_ERROR_ALREADY_MAPPED; current ones
 *    count it and return the same pointer, each open needing its close),
 *    so opens are cached by handle bytes and refcounted (PyTorch's
 *    shared_cache), and every open is paired with one close;
 *  - opening a handle in the process that exported it fails
 *    (CUDA_ERROR_INVALID_CONTEXT): every handle this process exports is
 *    recorded, and importing one of them uses the local pointer directly.
 *    This needs no pid in the descriptor and survives fork (a child that
 *    never exported the handle opens it normally).
 * Legacy IPC memory cannot be mapped at a chosen address: the
 * same-address slots return -EOPNOTSUPP.
 * wex does not hold wrapped memory: its owner may free it and get the
 * same address again from another allocation, which the engines' handle
 * does not name.  The allocation's CU_POINTER_ATTRIBUTE_BUFFER_ID, unique
 * over the process's lifetime (cuda.h), is recorded at export and asked
 * again by the `same` slot.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/types.h>
#include <unistd.h>

#include "wex.h"
#include "src/log.h"
#include "vmm/cudawrap.h"
#include "vmm/cuda_backend.h"

/* One handle known to this process: exported here (local) or opened. */
struct ipc_entry {
	struct ipc_entry *next;
	unsigned char h[CU_IPC_HANDLE_SIZE];
	CUdeviceptr base;
	int dev;
	int local;   /* 1: exported by this process; base is ours */
	int allocd;  /* local and allocated by ipc_alloc (cuMemFree at the end) */
	int refs;
	unsigned long long buf; /* local: base's BUFFER_ID at export; 0 unknown */
	pid_t pid;   /* the process the entry is valid in (fork copies it) */
	uint64_t peers; /* other devices imports gave access (bit = ordinal) */
};

static pthread_mutex_t ipc_lock = PTHREAD_MUTEX_INITIALIZER;
/* Held by an import from its look-up to its entry's insertion, around the
 * driver's open, and by a release until its close is done: a handle is
 * never opened by two threads at once nor while its last close is under
 * way, so a driver refusing a second open (CUDA_ERROR_ALREADY_MAPPED)
 * means an open from outside wex.  Taken before ipc_lock. */
static pthread_mutex_t ipc_open_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ipc_entry *ipc_list;

static struct ipc_entry *find(const unsigned char *h)
{
	pid_t me = getpid();

	/* Entries inherited through fork() belong to the parent: a child
	 * neither owns its exports nor shares its opens. */
	for (struct ipc_entry *e = ipc_list; e; e = e->next)
		if (e->pid == me && memcmp(e->h, h, CU_IPC_HANDLE_SIZE) == 0)
			return e;
	return NULL;
}

static void unlink_entry(struct ipc_entry *e)
{
	for (struct ipc_entry **pp = &ipc_list; *pp; pp = &(*pp)->next)
		if (*pp == e) {
			*pp = e->next;
			return;
		}
}

static int ipc_probe(char *why, size_t len)
{
	return wex__cuda_probe(why, len);
}

/* Records (or references again) an exported allocation and fills seg. */
static int export_base(CUdeviceptr base, uint64_t asize, uint64_t off, uint64_t size, int dev,
		       int allocd, struct wex_mem_seg *seg)
{
	unsigned long long buf = 0;
	CUipcMemHandle h;
	struct ipc_entry *e;
	int ret;

	ret = WEX_CU(wex__cu.cuIpcGetMemHandle(&h, base));
	if (ret) {
		if (ret == -EINVAL)
			wex_error("cuda", "no legacy IPC handle for %#llx: not cudaMalloc memory "
				  "(VMM memory needs cuda_vmm, cudaMallocAsync pools are unsupported)",
				  (unsigned long long)base);
		return ret;
	}
	/* No answer (a driver without the attribute): no check. */
	if (wex__cuda_ptr_attr(&buf, CU_POINTER_ATTRIBUTE_BUFFER_ID, base) != CUDA_SUCCESS)
		buf = 0;
	pthread_mutex_lock(&ipc_lock);
	e = find((const unsigned char *)h.reserved);
	if (e && e->local && e->buf == buf) {
		e->refs++;
	} else {
		e = calloc(1, sizeof(*e));
		if (!e) {
			pthread_mutex_unlock(&ipc_lock);
			return -ENOMEM;
		}
		memcpy(e->h, h.reserved, CU_IPC_HANDLE_SIZE);
		e->base = base;
		e->dev = dev;
		e->local = 1;
		e->allocd = allocd;
		e->refs = 1;
		e->buf = buf;
		e->pid = getpid();
		e->next = ipc_list;
		ipc_list = e;
	}
	pthread_mutex_unlock(&ipc_lock);
	memset(seg, 0, sizeof(*seg));
	seg->ops = &wex_mem_cuda_ipc_ops;
	seg->desc.kind = WEX_MEM_CUDA_IPC;
	seg->desc.size = size;
	seg->desc.alloc_size = asize;
	seg->desc.handle_offset = off;
	seg->desc.handle_len = CU_IPC_HANDLE_SIZE;
	memcpy(seg->desc.handle, h.reserved, CU_IPC_HANDLE_SIZE);
	wex__cuda_device_uuid(dev, seg->desc.device, sizeof(seg->desc.device));
	seg->ptr = (void *)(uintptr_t)(base + off);
	seg->fd = -1;
	seg->owner = allocd ? 1 : 0;
	seg->priv = e;
	return 0;
}

static int ipc_alloc(uint64_t size, int device, struct wex_mem_seg *seg)
{
	CUdeviceptr p = 0;
	int ret;

	ret = wex__cuda_use_device(device);
	if (ret)
		return ret;
	if (size == 0)
		return -EINVAL;
	ret = WEX_CU(wex__cu.cuMemAlloc(&p, (size_t)size));
	if (ret)
		return ret;
	ret = export_base(p, size, 0, size, device, 1, seg);
	if (ret)
		wex__cu.cuMemFree(p);
	return ret;
}

static int ipc_wrap(void *ptr, uint64_t size, int fd, struct wex_mem_seg *seg)
{
	CUdeviceptr base = 0, a = (CUdeviceptr)(uintptr_t)ptr;
	size_t asize = 0;
	int dev, ret;

	ret = wex__cuda_load();
	if (ret)
		return ret;
	if (!ptr || size == 0)
		return -EINVAL;
	ret = wex__cuda_ptr_device(a, &dev);
	if (ret)
		return ret;
	ret = wex__cuda_use_device(dev);
	if (ret)
		return ret;
	/* The handle must name the allocation's base; sub-allocations (the
	 * caching allocator's blocks) travel as base + offset. */
	ret = WEX_CU(wex__cu.cuMemGetAddressRange(&base, &asize, a));
	if (ret)
		return ret;
	/* (a lies in [base, base + asize): no sum that could wrap.) */
	if (size > base + asize - a)
		return -E2BIG; /* past its allocation */
	return export_base(base, asize, a - base, size, dev, 0, seg);
}

/* The bit of access_dev in ipc_entry.peers when it is another device than
 * the memory's. */
static uint64_t peer_bit(int access_dev, int dev)
{
	return access_dev >= 0 && access_dev < 64 && access_dev != dev ? 1ull << access_dev : 0;
}

/* The handle is opened in the context of the device holding the memory,
 * where CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS has nothing to enable: kernels
 * of another device (access_dev) reach it only once that device's context
 * has peer access to the owner's (cuCtxEnablePeerAccess; copies work
 * without it, kernels fault).  Whether it can is checked first, so that
 * the error names both devices. */
static int ipc_open(const struct wex_mem_desc *desc, int dev, int access_dev,
		    struct ipc_entry **out);

/* Whether this process sees the device named by uuid (either text form),
 * asked without the error wex__cuda_device_by_uuid logs. */
static int uuid_visible(const char *uuid)
{
	const char *want = strncmp(uuid, "GPU-", 4) == 0 ? uuid + 4 : uuid;
	char mine[WEX_UUID_LEN];
	int n = 0;

	if (wex__cu.cuDeviceGetCount(&n) != CUDA_SUCCESS)
		return 0;
	for (int i = 0; i < n; i++)
		if (wex__cuda_device_uuid(i, mine, sizeof(mine)) == 0 &&
		    strcasecmp(strncmp(mine, "GPU-", 4) == 0 ? mine + 4 : mine, want) == 0)
			return 1;
	return 0;
}

/* The device in whose context the handle is opened: the one holding the
 * memory; where this process cannot see that one (CUDA_VISIBLE_DEVICES
 * naming the engine's GPU alone), the device the import is for, as the
 * driver opens handles of devices a process cannot see too ("can open
 * handles to devices that may not be visible", cudaIpcOpenMemHandle),
 * mapped for the current one with peer access enabled
 * (CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS). */
static int open_device(const struct wex_mem_desc *desc, int access_dev, int *dev)
{
	const char *uuid = desc->device;
	struct ipc_entry *e;

	if (access_dev >= 0 && !uuid_visible(uuid)) {
		/* Opened here already: in that one's context (peer access
		 * from access_dev is to be had to it). */
		pthread_mutex_lock(&ipc_lock);
		e = find(desc->handle);
		*dev = e ? e->dev : access_dev;
		pthread_mutex_unlock(&ipc_lock);
		if (e)
			return 0;
		wex_debug("cuda", "import: device %s is not visible here: its legacy IPC handle "
			  "opens on device %d", uuid, access_dev);
		*dev = access_dev;
		return 0;
	}
	return wex__cuda_device_by_uuid(uuid, dev);
}

static int ipc_import(const struct wex_mem_desc *desc, int fd, int access_dev,
		      struct wex_mem_seg *seg)
{
	struct ipc_entry *e = NULL;
	int dev, ret;

	/* Legacy IPC needs no fd; one given to us is ours to close. */
	if (fd >= 0)
		close(fd);
	ret = wex__cuda_load();
	if (ret)
		return ret;
	if (desc->kind != WEX_MEM_CUDA_IPC || desc->handle_len != CU_IPC_HANDLE_SIZE ||
	    desc->size == 0 || desc->handle_offset + desc->size > desc->alloc_size)
		return -EINVAL;
	ret = open_device(desc, access_dev, &dev);
	if (ret)
		return ret;
	if (access_dev >= 0 && (ret = wex__cuda_peer_check(access_dev, dev, "import")) != 0)
		return ret;
	if (peer_bit(access_dev, dev) && (ret = wex__cuda_enable_peer(access_dev, dev)) != 0)
		return ret;
	pthread_mutex_lock(&ipc_open_lock);
	ret = ipc_open(desc, dev, access_dev, &e);
	pthread_mutex_unlock(&ipc_open_lock);
	if (ret)
		return ret;
	memset(seg, 0, sizeof(*seg));
	seg->ops = &wex_mem_cuda_ipc_ops;
	seg->desc = *desc;
	seg->ptr = (void *)(uintptr_t)(e->base + desc->handle_offset);
	seg->fd = -1;
	seg->owner = 2;
	seg->priv = e;
	return 0;
}

/* ipc_import's look-up or open and insertion, under ipc_open_lock: the
 * entry, with a reference taken for the caller, in *out. */
static int ipc_open(const struct wex_mem_desc *desc, int dev, int access_dev,
		    struct ipc_entry **out)
{
	struct ipc_entry *e;
	CUipcMemHandle h;
	CUdeviceptr p = 0;
	CUresult r;
	int ret;

	pthread_mutex_lock(&ipc_lock);
	e = find(desc->handle);
	if (e) {
		/* Same process (local) or already open: one open per process. */
		e->refs++;
		e->peers |= peer_bit(access_dev, dev);
		pthread_mutex_unlock(&ipc_lock);
		goto out;
	}
	pthread_mutex_unlock(&ipc_lock);
	ret = wex__cuda_use_device(dev);
	if (ret)
		return ret;
	memcpy(h.reserved, desc->handle, CU_IPC_HANDLE_SIZE);
	r = wex__cu.cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	pthread_mutex_lock(&ipc_lock);
	e = find(desc->handle);
	if (r == CUDA_ERROR_ALREADY_MAPPED && e) {
		/* A driver that refuses a second open, and another thread
		 * opened it meanwhile: share theirs. */
		e->refs++;
		e->peers |= peer_bit(access_dev, dev);
		pthread_mutex_unlock(&ipc_lock);
		goto out;
	}
	if (r != CUDA_SUCCESS) {
		pthread_mutex_unlock(&ipc_lock);
		if (r == CUDA_ERROR_ALREADY_MAPPED) {
			/* Not by wex: only the opener knows the pointer. */
			wex_error("cuda", "import: the legacy IPC handle is already open in this "
				  "process outside wex (e.g. a tensor received through "
				  "torch.multiprocessing), and this driver refuses a second open "
				  "(CUDA_ERROR_ALREADY_MAPPED; drivers that count repeated opens "
				  "do not)");
			return -EEXIST;
		}
		return wex__cuda_err(r, "cuIpcOpenMemHandle");
	}
	if (e) {
		/* Another thread opened it meanwhile: newer drivers refcount a
		 * repeated open, so close ours once and share theirs. */
		e->refs++;
		e->peers |= peer_bit(access_dev, dev);
		pthread_mutex_unlock(&ipc_lock);
		wex__cu.cuIpcCloseMemHandle(p);
		goto out;
	}
	e = calloc(1, sizeof(*e));
	if (!e) {
		pthread_mutex_unlock(&ipc_lock);
		wex__cu.cuIpcCloseMemHandle(p);
		return -ENOMEM;
	}
	memcpy(e->h, desc->handle, CU_IPC_HANDLE_SIZE);
	e->base = p;
	e->dev = dev;
	e->refs = 1;
	e->peers = peer_bit(access_dev, dev);
	e->pid = getpid();
	e->next = ipc_list;
	ipc_list = e;
	pthread_mutex_unlock(&ipc_lock);
out:
	*out = e;
	return 0;
}

static int ipc_release(struct wex_mem_seg *seg)
{
	struct ipc_entry *e = seg->priv;
	CUdeviceptr base = 0;
	uint64_t peers = 0;
	int dev = 0, local = 0, allocd = 0, last = 0, ret = 0;

	/* Until the last close is done: an import meanwhile would find no
	 * entry while the driver still holds the open. */
	pthread_mutex_lock(&ipc_open_lock);
	if (e) {
		pthread_mutex_lock(&ipc_lock);
		if (--e->refs == 0) {
			unlink_entry(e);
			last = 1;
			base = e->base;
			dev = e->dev;
			local = e->local;
			allocd = e->allocd;
			peers = e->peers;
			free(e);
		}
		pthread_mutex_unlock(&ipc_lock);
	}
	/* Closing does not wait for kernels still reading the memory, those
	 * of the other devices imports gave access included (as cuMemUnmap;
	 * vmm_release syncs the same way). */
	for (int d = 0; last && !local && d < 64; d++)
		if ((peers >> d & 1) && wex__cuda_use_device(d) == 0) {
			int r = WEX_CU(wex__cu.cuCtxSynchronize());

			if (!ret)
				ret = r;
		}
	if (last && (allocd || !local)) {
		/* Without the memory's context neither free nor close can run:
		 * say so (the handle stays open) rather than report it closed. */
		int r = wex__cuda_use_device(dev);

		if (r) {
			if (!ret)
				ret = r;
		} else if (allocd) {
			/* cudaFree while an importer still has it open is UB: the
			 * caller ends every lease first (wexd enforces it). */
			r = WEX_CU(wex__cu.cuCtxSynchronize());
			if (!ret)
				ret = r;
			r = WEX_CU(wex__cu.cuMemFree(base));
			if (!ret)
				ret = r;
		} else {
			r = WEX_CU(wex__cu.cuCtxSynchronize());
			if (!ret)
				ret = r;
			r = WEX_CU(wex__cu.cuIpcCloseMemHandle(base));
			if (!ret)
				ret = r;
		}
	}
	pthread_mutex_unlock(&ipc_open_lock);
	if (seg->fd >= 0)
		close(seg->fd);
	seg->fd = -1;
	seg->ptr = NULL;
	seg->priv = NULL;
	return ret;
}

/* Wrapped memory: whether the allocation exported is still the one at its
 * base.  One attribute query; nothing there (freed) answers
 * CUDA_ERROR_INVALID_VALUE. */
static int ipc_same(const struct wex_mem_seg *seg)
{
	const struct ipc_entry *e = seg->priv;
	unsigned long long buf = 0;
	CUresult r;
	int ret;

	if (!e || !e->local || e->allocd || !e->buf)
		return 0; /* wex's own memory, an import, or no ID to compare */
	ret = wex__cuda_load();
	if (ret)
		return ret;
	r = wex__cuda_ptr_attr(&buf, CU_POINTER_ATTRIBUTE_BUFFER_ID, e->base);
	if (r == CUDA_ERROR_INVALID_VALUE)
		return -ESTALE; /* no allocation there now */
	if (r != CUDA_SUCCESS)
		return WEX_CU(r);
	return buf == e->buf ? 0 : -ESTALE;
}

static int ipc_map_fixed(struct wex_mem_region *r, struct wex_mem_seg *seg, uint64_t off)
{
	return -EOPNOTSUPP;
}

static int ipc_region(struct wex_mem_region *r)
{
	return -EOPNOTSUPP;
}

const struct wex_mem_ops wex_mem_cuda_ipc_ops = {
	.name = "cuda_ipc",
	.kind = WEX_MEM_CUDA_IPC,
	.probe = ipc_probe,
	.alloc = ipc_alloc,
	.wrap = ipc_wrap,
	.import = ipc_import,
	.release = ipc_release,
	.reserve = wex_mem_enotsup_reserve,
	.map_fixed = ipc_map_fixed,
	.unmap_fixed = ipc_region,
	.unreserve = ipc_region,
	.copy = wex__cuda_copy,
	/* A cudaMalloc allocation is one allocation: nothing to chain. */
	.wrap_chunks = wex_mem_enotsup_wrap_chunks,
	.import_chunks = wex_mem_enotsup_import_chunks,
	.sync_device = wex__cuda_sync_device,
	.host_pin = wex__cuda_host_pin,
	.host_unpin = wex__cuda_host_unpin,
	.same = ipc_same,
};
