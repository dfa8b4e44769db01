/* SPDX-License-Identifier: MIT */
/*
 * many_segments - proves that segments beyond one message's fd limit reach
 * the consumer: a producer registers 150 host segments (more than the 60
 * fds wexd sends per fetch reply, and than the 64 a message may carry), one
 * tensor in each; a consumer's REMAP_VIEW and then COPY syncs of v1 (the
 * copy keeping the view's lease) see every tensor with every byte right, and wexd's fd count returns to its start value
 * once both left.
 */
#include <string.h>
#include <unistd.h>

#include "fixture.h"

#define MODEL "segs"
#define NSEG 150
#define ELEMS 1024 /* bf16 elements per tensor */

int main(void)
{
	struct t_wexd d;
	struct wex_tensor t[NSEG], mine[NSEG];
	struct wex_sync_result r;
	wex_client_t *p, *k;
	void *base[NSEG];
	uint16_t *buf;
	int fds, n;

	/* Each segment is an fd in the producer and one in the consumer. */
	t_nofile_at_least(4 * NSEG + 64);
	t_wexd_start(&d);
	t_check_backend(d.sock);
	fds = t_wexd_fds_settle(&d, -1);
	p = t_open(WEX_ROLE_PRODUCER, MODEL, NULL, 0, 1);
	memset(t, 0, sizeof(t));
	for (int i = 0; i < NSEG; i++) {
		uint32_t id;

		T_WEX(p, wex_segment_alloc(p, WEX_SEG_HOST, 0, 4096, &id, &base[i]));
		snprintf(t[i].name, sizeof(t[i].name), "seg%d.weight", i);
		t[i].dtype = WEX_DT_BF16;
		t[i].ndim = 1;
		t[i].shape[0] = t[i].extent[0] = ELEMS;
		t[i].segment = id;
	}
	T_WEX(p, wex_register_tensors(p, t, NSEG));
	T_WEX(p, wex_begin_write(p, 1, 5000));
	for (int i = 0; i < NSEG; i++)
		ex_fill(base[i], &t[i], 1, 1, 1);
	T_WEX(p, wex_publish(p, 1));

	k = t_open(WEX_ROLE_CONSUMER, MODEL, "g", 0, 1);
	buf = calloc(NSEG, ELEMS * 2);
	T_ASSERT(buf, "calloc");
	for (int i = 0; i < NSEG; i++) {
		mine[i] = t[i];
		mine[i].segment = 0;
		mine[i].ptr = buf + (size_t)i * ELEMS;
	}
	T_WEX(k, wex_attach(k, mine, NSEG));
	T_WEX(k, wex_sync(k, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
	for (int i = 0; i < NSEG; i++) {
		struct wex_tensor v;
		void *ptr;

		T_WEX(k, wex_view(k, 0, t[i].name, &ptr, &v));
		T_ASSERT(ex_check(NULL, &v, 1, 1, 1) == 0, "view of tensor %d (segment %u) is exact", i,
			 t[i].segment);
	}
	T_WEX(k, wex_sync(k, WEX_SYNC_COPY, 1, 5000, &r));
	T_ASSERT(ex_check(NULL, mine, NSEG, 1, 1) == 0, "the copy of all %d tensors is exact", NSEG);
	wex_client_close(k);
	wex_client_close(p);
	free(buf);
	n = t_wexd_fds_settle(&d, fds);
	T_ASSERT(n == fds, "wexd holds %d fds after both left, %d before", n, fds);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
