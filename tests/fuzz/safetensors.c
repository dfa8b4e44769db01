/* SPDX-License-Identifier: MIT */
/*
 * safetensors.c - fuzzes the safetensors reader two ways with one input:
 *
 *  - wex__st_parse_header: the first 8 bytes (little-endian) are the data
 *    size, the rest is the header JSON;
 *  - wex__st_open: the whole input is a file (u64 header length, header,
 *    data), read through a memfd.
 *
 * A header it accepts must keep safetensors.h's promises: names
 * NUL-terminated and unique, known dtypes, at most WEX_MAX_DIMS sizes,
 * end - begin == elements * dtype size, and tensors sorted by offset tile
 * [0, data_size) exactly.  A refusal must say why.
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz.h"
#include "safetensors.h"

static void check_tensors(const struct wex_st_tensor *t, size_t n, uint64_t data_size)
{
	const struct wex_st_tensor **s = calloc(n + 1, sizeof(*s));
	uint64_t at = 0;

	FZ_ASSERT(s, "out of memory");
	for (size_t i = 0; i < n; i++) {
		uint64_t numel = 1, es = wex_dtype_size(t[i].dtype);

		FZ_ASSERT(memchr(t[i].name, 0, sizeof(t[i].name)), "tensor %zu: name not terminated", i);
		FZ_ASSERT(es, "tensor %s: dtype %d", t[i].name, t[i].dtype);
		FZ_ASSERT(t[i].ndim <= WEX_MAX_DIMS, "tensor %s: ndim %u", t[i].name, t[i].ndim);
		for (uint32_t d = 0; d < t[i].ndim; d++)
			FZ_ASSERT(!__builtin_mul_overflow(numel, t[i].shape[d], &numel),
				  "tensor %s: shape overflows", t[i].name);
		FZ_ASSERT(t[i].begin <= t[i].end && t[i].end <= data_size,
			  "tensor %s: [%llu, %llu) outside %llu bytes", t[i].name,
			  (unsigned long long)t[i].begin, (unsigned long long)t[i].end,
			  (unsigned long long)data_size);
		FZ_ASSERT(!__builtin_mul_overflow(numel, es, &numel) && t[i].end - t[i].begin == numel,
			  "tensor %s: %llu bytes for its shape", t[i].name,
			  (unsigned long long)(t[i].end - t[i].begin));
		for (size_t j = 0; j < i; j++)
			FZ_ASSERT(strcmp(t[i].name, t[j].name), "tensor %s twice", t[i].name);
		s[i] = &t[i];
	}
	qsort(s, n, sizeof(*s), wex__st_by_begin);
	for (size_t i = 0; i < n; i++) {
		FZ_ASSERT(s[i]->begin == at, "tensor %s starts at %llu, not %llu", s[i]->name,
			  (unsigned long long)s[i]->begin, (unsigned long long)at);
		at = s[i]->end;
	}
	FZ_ASSERT(at == data_size, "tensors end at %llu, data holds %llu", (unsigned long long)at,
		  (unsigned long long)data_size);
	free(s);
}

static void parse_header(const uint8_t *data, size_t size)
{
	struct wex_st_tensor *t = NULL;
	uint64_t data_size = 0;
	size_t n = 0;
	char err[256] = "";
	int ret;

	if (size < 8)
		return;
	for (int i = 7; i >= 0; i--)
		data_size = (data_size << 8) | data[i];
	ret = wex__st_parse_header((const char *)data + 8, size - 8, data_size, &t, &n, err,
				   sizeof(err));
	FZ_ASSERT(ret == 0 || ret == -EINVAL || ret == -ENOMEM, "returned %d", ret);
	if (ret < 0) {
		FZ_ASSERT(ret == -ENOMEM || err[0], "refused without a reason");
		return;
	}
	check_tensors(t, n, data_size);
	free(t);
}

static void open_file(const uint8_t *data, size_t size)
{
	struct wex_st_file f;
	char path[64], err[512] = "";
	int fd = memfd_create("fz-st", MFD_CLOEXEC), ret;

	FZ_ASSERT(fd >= 0, "memfd_create: %s", strerror(errno));
	FZ_ASSERT(size == 0 || write(fd, data, size) == (ssize_t)size, "write: %s",
		  strerror(errno));
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ret = wex__st_open(path, &f, err, sizeof(err));
	close(fd);
	if (ret < 0) {
		FZ_ASSERT(err[0], "refused without a reason (%d)", ret);
		return;
	}
	FZ_ASSERT(f.data_off >= 8 && f.data_off <= f.size && f.size == size,
		  "data at %llu of %llu bytes", (unsigned long long)f.data_off,
		  (unsigned long long)f.size);
	check_tensors(f.t, f.n, f.size - f.data_off);
	for (size_t i = 0; i < f.n; i++) {
		FZ_ASSERT(f.t[i].data == (const char *)f.map + f.data_off + f.t[i].begin,
			  "tensor %s: data pointer", f.t[i].name);
		FZ_ASSERT(wex__st_find(&f, f.t[i].name) == &f.t[i], "tensor %s: not found by name",
			  f.t[i].name);
	}
	wex__st_close(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	parse_header(data, size);
	open_file(data, size);
	return 0;
}
