/* SPDX-License-Identifier: MIT */
/*
 * cuda_staging.c - pinned host staging for split cards without P2P: the
 * producer copies once device-to-host into a memfd that it pins with
 * cuMemHostRegister(PORTABLE|DEVICEMAP); every consumer maps the same memfd,
 * pins its own mapping and copies host-to-device.  The memfd is sealed
 * against shrinking so that no importer can be made to fault.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wex.h"
#include "src/log.h"
#include "vmm/cudawrap.h"
#include "vmm/cuda_backend.h"

int wex__cuda_host_pin(void *p, uint64_t size, int device, int readonly)
{
	/* PORTABLE: pinned for every context; DEVICEMAP: also reachable by
	 * kernels. */
	unsigned flags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP;
	int ret;

	if (!p || size == 0)
		return -EINVAL;
	ret = wex__cuda_use_device(device);
	if (ret)
		return ret;
	/* The driver pins a PROT_READ mapping only when told it is
	 * read-only for the device too, which not every device takes; where
	 * the GPU walks the host's page tables, registering needs no pinning
	 * and no flag. */
	if (readonly) {
		if (wex__cuda_dev_attr(device, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED))
			flags |= CU_MEMHOSTREGISTER_READ_ONLY;
		else if (!wex__cuda_dev_attr(device,
					     CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES)) {
			wex_warn("cuda", "device %d cannot pin read-only host memory "
				 "(CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED is 0)", device);
			return -EOPNOTSUPP;
		}
	}
	return WEX_CU(wex__cu.cuMemHostRegister(p, (size_t)size, flags));
}

int wex__cuda_host_unpin(void *p, int device)
{
	/* Copies into or out of the pages may still run (the trainer's
	 * device-to-host copies are asynchronous into pinned memory), in any
	 * context (the registration is portable): let them finish before
	 * the pages are unregistered and unmapped. */
	int ret = wex__cuda_settle();
	int r = wex__cuda_use_device(device);

	if (!r)
		r = WEX_CU(wex__cu.cuMemHostUnregister(p));
	return ret ? ret : r;
}

/* Maps fd, pins the mapping; on error closes fd (ownership passes). */
static int map_and_pin(int fd, uint64_t size, int device, struct wex__cuda_staging *st)
{
	void *p;
	int ret;

	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		ret = -errno;
		wex_error("cuda", "staging mmap of %llu bytes: %m", (unsigned long long)size);
		goto err_close;
	}
	/* Pinning is what makes the copies run at PCIe speed. */
	ret = wex__cuda_host_pin(p, size, device, 0);
	if (ret)
		goto err_unmap;
	*st = (struct wex__cuda_staging){
		.host = p, .size = size, .fd = fd, .device = device, .registered = 1,
	};
	return 0;
err_unmap:
	munmap(p, size);
err_close:
	close(fd);
	return ret;
}

int wex__cuda_staging_create(uint64_t size, int device, struct wex__cuda_staging *st)
{
	int fd, ret;

	ret = wex__cuda_load();
	if (ret)
		return ret;
	if (size == 0)
		return -EINVAL;
	fd = memfd_create("wex-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) {
		ret = -errno;
		close(fd);
		return ret;
	}
	return map_and_pin(fd, size, device, st);
}

/* Another process's memfd: sealed against shrinking (else it could cut
 * the file under our mapping, and a copy would fault) and at least `size`
 * bytes long. */
int wex__cuda_staging_import(int fd, uint64_t size, int device, struct wex__cuda_staging *st)
{
	struct stat sb;
	int seals, ret;

	ret = wex__cuda_load();
	if (ret)
		goto err_close;
	if (fd < 0 || size == 0) {
		ret = -EINVAL;
		goto err_close;
	}
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
		ret = -EINVAL;
		if (seals < 0)
			wex_error("cuda", "staging import: fd %d has no seals (F_GET_SEALS: "
				  "%m): not a sealed memfd", fd);
		else
			wex_error("cuda", "staging import: fd %d is not sealed against shrinking "
				  "(seals %#x lack F_SEAL_SHRINK)", fd, (unsigned)seals);
		goto err_close;
	}
	if (fstat(fd, &sb) < 0) {
		ret = -errno;
		wex_error("cuda", "staging import: fstat of fd %d: %m", fd);
		goto err_close;
	}
	if ((uint64_t)sb.st_size < size) {
		ret = -EINVAL;
		wex_error("cuda", "staging import: fd %d holds %lld bytes, %llu asked", fd,
			  (long long)sb.st_size, (unsigned long long)size);
		goto err_close;
	}
	return map_and_pin(fd, size, device, st);
err_close:
	if (fd >= 0)
		close(fd);
	return ret;
}

static int staging_copy(struct wex__cuda_staging *st, uint64_t dst, uint64_t src, uint64_t len)
{
	struct wex_copy_op op = { .src = src, .dst = dst, .len = len };
	int ret;

	ret = wex__cuda_copy_async(&op, 1, st->device);
	if (ret)
		return ret;
	return wex__cuda_copy_sync(st->device);
}

int wex__cuda_staging_d2h(struct wex__cuda_staging *st, uint64_t off, uint64_t src, uint64_t len)
{
	if (!st->host || off + len > st->size || off + len < off)
		return -EINVAL;
	return staging_copy(st, (uint64_t)(uintptr_t)st->host + off, src, len);
}

int wex__cuda_staging_h2d(struct wex__cuda_staging *st, uint64_t off, uint64_t dst, uint64_t len)
{
	if (!st->host || off + len > st->size || off + len < off)
		return -EINVAL;
	return staging_copy(st, dst, (uint64_t)(uintptr_t)st->host + off, len);
}

int wex__cuda_staging_destroy(struct wex__cuda_staging *st)
{
	int ret = 0;

	if (st->registered)
		ret = wex__cuda_host_unpin(st->host, st->device);
	if (st->host && munmap(st->host, st->size) < 0 && !ret)
		ret = -errno;
	if (st->fd >= 0 && close(st->fd) < 0 && !ret)
		ret = -errno;
	*st = (struct wex__cuda_staging){ .fd = -1 };
	return ret;
}
