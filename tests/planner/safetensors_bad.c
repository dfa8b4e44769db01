/* SPDX-License-Identifier: MIT */
/*
 * safetensors_bad.c - proves the safetensors reader accepts what the writer
 * produces (names, dtypes, shapes, bytes, 8-byte padded header, aligned
 * tensors) and rejects malformed files with -EINVAL and a reason: too
 * short, header length over the limit or past the file, invalid JSON,
 * not an object, duplicate keys, unknown dtype, size/shape mismatch,
 * holes, overlaps, trailing bytes, missing bytes, non-string metadata;
 * that a failed write names its cause; and that a file shrunk while
 * mapped reads as zeros under wex__st_guard and is named as changed.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"
#include "ptest.h"

static char dir[] = "/tmp/wex-st-XXXXXX";

static void put(const char *name, const char *hdr, uint64_t hlen_field, size_t data)
{
	char path[256];
	FILE *f;
	unsigned char l8[8];

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	CHECK(f, "fopen %s", path);
	for (int i = 0; i < 8; i++)
		l8[i] = (unsigned char)(hlen_field >> (8 * i));
	fwrite(l8, 1, 8, f);
	fwrite(hdr, 1, strlen(hdr), f);
	for (size_t i = 0; i < data; i++)
		fputc(i & 0xff, f);
	fclose(f);
}

/* Refused, the reason saying `why` (NULL: any reason). */
static void reject_why(const char *name, const char *hdr, size_t data, const char *why)
{
	struct wex_st_file f;
	char path[256], err[512] = "";

	put(name, hdr, strlen(hdr), data);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	int ret = wex__st_open(path, &f, err, sizeof(err));
	CHECK(ret == -EINVAL, "%s accepted (%d)", name, ret);
	CHECK(err[0], "%s: no reason given", name);
	CHECK(!why || strstr(err, why), "%s: '%s' does not say '%s'", name, err, why);
	printf("%-14s %s\n", name, strstr(err, name) ? strstr(err, name) : err);
	unlink(path);
}

static void reject(const char *name, const char *hdr, size_t data)
{
	reject_why(name, hdr, data, NULL);
}

int main(void)
{
	char path[256], err[512];
	struct wex_st_file f;

	CHECK(mkdtemp(dir), "mkdtemp");
	/* Round trip through the writer. */
	{
		uint16_t a[6] = { 1, 2, 3, 4, 5, 6 };
		float b[3] = { 1.5f, 2.5f, -1.0f };
		struct wex_st_tensor t[3] = { { .name = "a", .dtype = WEX_DT_BF16, .ndim = 2, .shape = { 2, 3 }, .data = a },
					      { .name = "b", .dtype = WEX_DT_F32, .ndim = 1, .shape = { 3 }, .data = b },
					      { .name = "empty", .dtype = WEX_DT_F32, .ndim = 2, .shape = { 0, 4 }, .data = NULL } };

		snprintf(path, sizeof(path), "%s/ok.safetensors", dir);
		CHECK(wex__st_write(path, t, 3, err, sizeof(err)) == 0, "%s", err);
		CHECK(wex__st_open(path, &f, err, sizeof(err)) == 0, "%s", err);
		CHECK(f.n == 3 && f.data_off % 8 == 0, "n %zu data_off %llu", f.n, (unsigned long long)f.data_off);
		const struct wex_st_tensor *x = wex__st_find(&f, "a"), *y = wex__st_find(&f, "b");
		CHECK(x && y && x->dtype == WEX_DT_BF16 && x->ndim == 2 && x->shape[1] == 3, "a");
		CHECK(!memcmp(x->data, a, sizeof(a)) && !memcmp(y->data, b, sizeof(b)), "bytes");
		/* Larger elements first: b (F32) is at offset 0, aligned. */
		CHECK(y->begin == 0 && ((uintptr_t)y->data % 4) == 0, "alignment");
		wex__st_close(&f);
		unlink(path);
		/* A write that fails (disk full; here the file size limit) says
		 * why, and leaves neither the file nor its temporary. */
		struct rlimit old_lim, lim;
		int ret;

		CHECK(getrlimit(RLIMIT_FSIZE, &old_lim) == 0, "getrlimit");
		lim = old_lim;
		lim.rlim_cur = 16;
		signal(SIGXFSZ, SIG_IGN);
		CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit");
		ret = wex__st_write(path, t, 3, err, sizeof(err));
		CHECK(setrlimit(RLIMIT_FSIZE, &old_lim) == 0, "setrlimit");
		signal(SIGXFSZ, SIG_DFL);
		printf("%-14s %s\n", "fsize", err);
		CHECK(ret == -EFBIG && strstr(err, strerror(EFBIG)), "write past the size limit: %d %s", ret, err);
		CHECK(access(path, F_OK) != 0, "failed write left %s", path);
	}
	/* A file shrunk while mapped (rewritten in place under its name, as
	 * safetensors' save_file does: it truncates first) reads as zeros
	 * past its new end under the guard, and is said to have changed,
	 * naming it: a read there was a SIGBUS and a core dump. */
	{
		static float big[3 * 1024];
		struct wex_st_tensor t = { .name = "big", .dtype = WEX_DT_F32, .ndim = 1,
					   .shape = { 3 * 1024 }, .data = big };
		const volatile unsigned char *p;

		for (size_t i = 0; i < 3 * 1024; i++)
			big[i] = 1.0f;
		snprintf(path, sizeof(path), "%s/shrunk.safetensors", dir);
		CHECK(wex__st_write(path, &t, 1, err, sizeof(err)) == 0, "%s", err);
		CHECK(wex__st_open(path, &f, err, sizeof(err)) == 0, "%s", err);
		CHECK(wex__st_changed(&f, path, err, sizeof(err)) == 0, "unchanged file: %s", err);
		CHECK(wex__st_guard() == 0, "wex__st_guard");
		CHECK(truncate(path, (off_t)f.data_off + 100) == 0, "truncate");
		p = (const volatile unsigned char *)f.t[0].data;
		CHECK(p[3 * 4096 - 1] == 0 && p[50] == 0x80, "past the new end: %#x", p[3 * 4096 - 1]);
		CHECK(wex__st_changed(&f, path, err, sizeof(err)) == -EIO && strstr(err, path) &&
			      strstr(err, "changed while being read"),
		      "a shrunk file not said to have changed: '%s'", err);
		printf("%-14s %s\n", "shrunk", err);
		/* A faulted read is said even where size and mtime are back
		 * (a SIGBUS is also how an I/O error on a mapped page shows):
		 * never zeros taken for the tensor's bytes. */
		{
			struct timespec ts[2] = { f.mtime, f.mtime };

			CHECK(truncate(path, (off_t)f.size) == 0 && utimensat(AT_FDCWD, path, ts, 0) == 0,
			      "restoring %s", path);
			CHECK(wex__st_changed(&f, path, err, sizeof(err)) == -EIO && strstr(err, path) &&
				      strstr(err, "SIGBUS"),
			      "a faulted read of a file back to its size not said: '%s'", err);
			printf("%-14s %s\n", "faulted", err);
		}
		wex__st_close(&f);
		unlink(path);
	}
	/* A directory or a FIFO under a .safetensors name (an index naming
	 * one, a process substitution): refused as not a file, never
	 * "mmap: No such device", "0 bytes" or a wait for a writer. */
	{
		snprintf(path, sizeof(path), "%s/dir.safetensors", dir);
		CHECK(mkdir(path, 0755) == 0, "mkdir %s", path);
		CHECK(wex__st_open(path, &f, err, sizeof(err)) == -EINVAL &&
			      strstr(err, "not a regular file (a directory)"),
		      "a directory: '%s'", err);
		printf("%-14s %s\n", "directory", err);
		rmdir(path);
		snprintf(path, sizeof(path), "%s/fifo.safetensors", dir);
		CHECK(mkfifo(path, 0644) == 0, "mkfifo %s", path);
		alarm(10);
		CHECK(wex__st_open(path, &f, err, sizeof(err)) == -EINVAL &&
			      strstr(err, "not a regular file (a pipe"),
		      "a FIFO: '%s'", err);
		alarm(0);
		printf("%-14s %s\n", "fifo", err);
		unlink(path);
	}
	reject("emptyheader", "", 0);
	{
		/* Shorter than the 8-byte length field. */
		FILE *sf;

		snprintf(path, sizeof(path), "%s/short", dir);
		sf = fopen(path, "wb");
		CHECK(sf, "fopen");
		fwrite("abc", 1, 3, sf);
		fclose(sf);
		CHECK(wex__st_open(path, &f, err, sizeof(err)) == -EINVAL, "3-byte file accepted");
		printf("%-14s %s\n", "short", err);
		unlink(path);
	}
	{
		/* Header length beyond the limit and beyond the file. */
		put("hugelen", "{}", 200000000ull, 0);
		snprintf(path, sizeof(path), "%s/hugelen", dir);
		CHECK(wex__st_open(path, &f, err, sizeof(err)) == -EINVAL, "huge header accepted");
		printf("%-14s %s\n", "hugelen", err);
		put("pastend", "{}", 4096, 0);
		snprintf(path, sizeof(path), "%s/pastend", dir);
		CHECK(wex__st_open(path, &f, err, sizeof(err)) == -EINVAL, "header past EOF accepted");
		printf("%-14s %s\n", "pastend", err);
	}
	reject("badjson", "{\"a\":", 0);
	reject("notobject", "[1,2]", 0);
	reject("dupkey", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
			 "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2);
	reject("baddtype", "{\"a\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
	reject("badsize", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4);
	reject("hole", "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
		       "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}", 5);
	reject("overlap", "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
			  "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}", 3);
	reject("trailing", "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 3);
	reject("missing", "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 2);
	reject("negshape", "{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0);
	reject("badoffsets", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,0]}}", 1);
	reject("metadata", "{\"__metadata__\":{\"k\":1}}", 0);
	/* 2^61 elements of 8 bytes: the size wraps to 0, which the offsets
	 * claim; named as an overflow, not "0 bytes for ... (0 expected)". */
	reject_why("overflow", "{\"a\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],"
			       "\"data_offsets\":[0,0]}}", 0, "a: shape overflows");
	/* A reference dtype wex does not read: said so, and that the file
	 * goes whole. */
	reject_why("c64", "{\"a\":{\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
		   "unsupported dtype C64 (a safetensors dtype wex does not read");
	reject("extrafield", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 1);
	snprintf(path, sizeof(path), "%s/hugelen", dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/pastend", dir);
	unlink(path);
	rmdir(dir);
	return T_PASS;
}
