/* SPDX-License-Identifier: MIT */
/*
 * fetch_pages - proves that a consumer can fetch every segment of a
 * producer however many of them travel without an fd: a producer
 * registers 1500 legacy CUDA IPC segments (a 64-byte handle each, no fd:
 * one per cudaMalloc block of a PyTorch caching allocator), one tensor in
 * the first; a consumer's fetch pages through them ("more") and receives
 * each segment once, every page a reply that fits one message.
 *
 * Found by review: wexd cut fetch replies into pages by fd count alone,
 * so fd-less segments all went into the first page, whose reply grew past
 * what one message can carry (the socket's send buffer, about 208 KiB):
 * every fetch failed with EMSGSIZE and no consumer could ever sync.
 */
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "proto.h"
#include "wex.h"

#define MODEL "pages"
#define NSEGS 1500

int main(void)
{
	struct t_wexd d;
	struct wex_tensor t;
	char req[512], handle[129];
	uint8_t *seen;
	json_int_t start = 0;
	int prod, cons, fd, pages = 0, got = 0;
	json_t *r;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	prod = t_raw_connect(d.sock);
	r = t_raw_rpc(prod, "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"" MODEL "\"}",
		      NULL, 0);
	T_ASSERT(!strcmp(t_code(r), "OK"), "producer hello: %s", t_msg(r));
	json_decref(r);
	for (int i = 0; i < NSEGS; i++) {
		for (int b = 0; b < 64; b++)
			sprintf(handle + 2 * b, "%02x", (unsigned)(i * 7 + b) & 0xff);
		snprintf(req, sizeof(req),
			 "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"cuda_ipc\","
			 "\"device\":\"GPU-3f0c2b7e-55aa-4c1d-9e2f-0123456789ab\",\"size\":2097152,"
			 "\"handle\":\"%s\",\"handle_offset\":0,\"alloc_size\":2097152}",
			 handle);
		r = t_raw_rpc(prod, req, NULL, 0);
		T_ASSERT(!strcmp(t_code(r), "OK"), "segment %d: %s: %s", i, t_code(r), t_msg(r));
		json_decref(r);
	}
	t_u8_tensor(&t, "w", 4096, 0, 0);
	fd = wex__table_pack(&t, NULL, 1);
	T_ASSERT(fd >= 0, "pack");
	r = t_raw_rpc(prod, "{\"v\":1,\"op\":\"register_tensors\"}", &fd, 1);
	T_ASSERT(!strcmp(t_code(r), "OK"), "tensors: %s", t_msg(r));
	json_decref(r);
	close(fd);

	cons = t_raw_connect(d.sock);
	r = t_raw_rpc(cons, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"" MODEL "\"}",
		      NULL, 0);
	T_ASSERT(!strcmp(t_code(r), "OK"), "consumer hello: %s", t_msg(r));
	json_decref(r);
	seen = calloc(NSEGS, 1);
	T_ASSERT(seen, "calloc");
	while (start >= 0) {
		json_t *segs, *s;
		json_int_t more = -1;
		size_t i;

		snprintf(req, sizeof(req), "{\"v\":1,\"op\":\"fetch\",\"start\":%lld}",
			 (long long)start);
		r = t_raw_rpc(cons, req, NULL, 0);
		T_ASSERT(!strcmp(t_code(r), "OK"), "fetch from segment %lld: %s: %s", (long long)start,
			 t_code(r), t_msg(r));
		segs = json_object_get(r, "segments");
		T_ASSERT(json_array_size(segs) > 0, "page from %lld holds no segment", (long long)start);
		json_array_foreach(segs, i, s) {
			json_int_t id = json_integer_value(json_object_get(s, "id"));

			T_ASSERT(id >= 0 && id < NSEGS && !seen[id], "segment %lld out of range or "
				 "received twice", (long long)id);
			seen[id] = 1;
			got++;
		}
		json_unpack(r, "{s?I}", "more", &more);
		T_ASSERT(more < 0 || more > start, "page from %lld says more from %lld",
			 (long long)start, (long long)more);
		json_decref(r);
		start = more;
		pages++;
	}
	printf("fetched %d fd-less segments in %d page(s)\n", got, pages);
	T_ASSERT(got == NSEGS, "fetched %d of %d segments", got, NSEGS);
	free(seen);
	close(cons);
	close(prod);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
