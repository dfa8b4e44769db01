/* SPDX-License-Identifier: MIT */
/*
 * proto_tables.c - fuzzes the decoding of what wexd and libwex take from
 * each other's sockets besides the JSON itself (proto.h): the first byte
 * picks
 *
 *  0: a tensor table (wex__table_unpack, as wexd reads register_tensors
 *     and attach, and libwex the tables fetch returns), the rest of the
 *     input sealed in a memfd;
 *  1: a plan table (wex__plan_unpack, as libwex reads fetch's plan);
 *  2: text a reply quotes (wex__utf8_scrub and wex__reply_error, as wexd
 *     quotes a client's names and bytes in its errors).
 *
 * A table it accepts must be as long as its count says, every tensor must
 * pass wex__tensor_check, and packing the tensors again gives a table that
 * unpacks to the same; every op of a plan must be readable.  Scrubbed text
 * must be valid UTF-8 to jansson, and an error reply must serialise and
 * read back with the scrubbed message.
 */
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "ipc/sock.h"
#include "proto.h"

static int same_tensor(const struct wex_tensor *a, const struct wex_tensor *b)
{
	return !strcmp(a->name, b->name) &&
	       !memcmp(&a->dtype, &b->dtype, offsetof(struct wex_tensor, ptr) -
						      offsetof(struct wex_tensor, dtype));
}

/* An accepted table is its header and n whole entries of esize bytes. */
static void whole_entries(size_t size, size_t esize, size_t n, const char *what)
{
	size_t hdr = sizeof(struct wex_table_hdr);

	FZ_ASSERT(size >= hdr && n == (size - hdr) / esize && (size - hdr) % esize == 0,
		  "%zu %s in %zu bytes", n, what, size);
}

static void tensor_table(const uint8_t *data, size_t size)
{
	struct wex_tensor *t = NULL, *t2 = NULL;
	uint32_t *r = NULL, *r2 = NULL;
	size_t n = 0, n2 = 0;
	char err[512] = "";
	int fd = wex_table_seal(data, size, "fz-table"), fd2, ret;

	FZ_ASSERT(fd >= 0, "sealing: %s", strerror(-fd));
	ret = wex__table_unpack(fd, &t, &r, &n, err, sizeof(err));
	close(fd);
	if (ret < 0) {
		FZ_ASSERT(err[0] || ret == -ENOMEM, "refused without a reason (%d)", ret);
		return;
	}
	whole_entries(size, sizeof(struct wex_wire_tensor), n, "tensors");
	for (size_t i = 0; i < n; i++)
		FZ_ASSERT(wex__tensor_check(&t[i], err, sizeof(err)) == 0, "entry %zu: %s", i, err);
	fd2 = wex__table_pack(t, r, n);
	FZ_ASSERT(fd2 >= 0, "packing: %s", strerror(-fd2));
	ret = wex__table_unpack(fd2, &t2, &r2, &n2, err, sizeof(err));
	close(fd2);
	FZ_ASSERT(ret == 0, "a packed table refused: %s", err);
	FZ_ASSERT(n2 == n, "%zu tensors packed, %zu unpacked", n, n2);
	for (size_t i = 0; i < n; i++)
		FZ_ASSERT(same_tensor(&t[i], &t2[i]) && r[i] == r2[i], "entry %zu changed", i);
	free(t);
	free(r);
	free(t2);
	free(r2);
}

static void plan_table(const uint8_t *data, size_t size)
{
	struct wex_plan_op *ops = NULL;
	uint64_t sum = 0;
	size_t n = 0;
	char err[512] = "";
	int fd = wex_table_seal(data, size, "fz-plan"), ret;

	FZ_ASSERT(fd >= 0, "sealing: %s", strerror(-fd));
	ret = wex__plan_unpack(fd, &ops, &n, err, sizeof(err));
	close(fd);
	if (ret < 0) {
		FZ_ASSERT(err[0] || ret == -ENOMEM, "refused without a reason (%d)", ret);
		return;
	}
	whole_entries(size, sizeof(struct wex_plan_op), n, "ops");
	/* What libwex does with them: read every one. */
	for (size_t i = 0; i < n; i++)
		sum += ops[i].len + ops[i].src_off + ops[i].dst_off;
	FZ_ASSERT(n || !sum, "no ops");
	free(ops);
}

static void reply_text(const uint8_t *data, size_t size)
{
	char *s = fz_strdup(data, size), cut[512];
	json_t *j, *r, *back;
	json_error_t je;
	size_t len = strlen(s);
	char *txt;

	/* wex__reply_error formats into 512 bytes, then scrubs. */
	snprintf(cut, sizeof(cut), "%s", s);
	wex__utf8_scrub(s);
	FZ_ASSERT(strlen(s) == len, "scrubbing changed the length");
	j = json_string(s);
	FZ_ASSERT(j, "scrubbed text is not UTF-8 to jansson: %s", s);
	json_decref(j);
	wex__utf8_scrub(cut);
	r = wex__reply_error(-EINVAL, "%s", s);
	FZ_ASSERT(r, "no error reply");
	txt = wex__json_dump(r, NULL);
	FZ_ASSERT(txt, "the error reply does not serialise");
	back = json_loads(txt, 0, &je);
	FZ_ASSERT(back, "the error reply does not read back: %s", je.text);
	FZ_ASSERT(json_is_false(json_object_get(back, "ok")), "ok is not false");
	FZ_ASSERT(!strcmp(json_string_value(json_object_get(json_object_get(back, "error"), "code")) ?: "",
			  "EINVAL"),
		  "the code is not EINVAL");
	FZ_ASSERT(!strcmp(json_string_value(json_object_get(json_object_get(back, "error"),
							    "message")) ?: "?",
			  cut),
		  "the message is not the text");
	json_decref(back);
	free(txt);
	json_decref(r);
	free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size == 0)
		return 0;
	switch (data[0] % 3) {
	case 0:
		tensor_table(data + 1, size - 1);
		break;
	case 1:
		plan_table(data + 1, size - 1);
		break;
	default:
		reply_text(data + 1, size - 1);
		break;
	}
	return 0;
}
