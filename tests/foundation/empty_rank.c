/* SPDX-License-Identifier: MIT */
/*
 * empty_rank - proves that a producer rank holding no bytes at all (an
 * FSDP2 rank past the last chunk of every parameter: 5 rows over 8 ranks
 * leave ranks 5-7 empty) takes part like any other: it registers an empty
 * table and no segment, begins and publishes each version, and a consumer
 * copies the whole model from the ranks that hold it.  Before it
 * registers, its begin_write is refused and wexd's status says it is not
 * registered; then registered, with 0 tensors.  After wexd is killed and restarted, its client re-registers the
 * empty table by itself (the producer's watch restores v1 with every rank),
 * and the next version is written and copied exactly.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

#define MODEL "empty-rank"

/* Producer rank `rank` of 3 whose bytes are half `rank` of "tiny". */
static void open_half(struct t_prod *p, uint32_t rank)
{
	struct ex_cfg cfg;
	uint32_t seg;

	memset(p, 0, sizeof(*p));
	T_ASSERT(ex_cfg_preset(&cfg, "tiny") == 0, "preset tiny");
	p->n = ex_shards(&cfg, rank, 2, &p->t, &p->seg_bytes);
	T_ASSERT(p->n > 0, "ex_shards(tiny, %u/2)", rank);
	p->c = t_open(WEX_ROLE_PRODUCER, MODEL, NULL, rank, 3);
	T_WEX(p->c, wex_segment_alloc(p->c, WEX_SEG_HOST, 0, p->seg_bytes, &seg, &p->base));
	for (int i = 0; i < p->n; i++)
		p->t[i].segment = seg;
	T_WEX(p->c, wex_register_tensors(p->c, p->t, (size_t)p->n));
}

static json_t *rank_status(const char *sock, uint32_t rank, json_t **st)
{
	json_t *m;

	*st = t_status(sock);
	m = t_status_model(*st, MODEL);
	T_ASSERT(m, "status knows model %s", MODEL);
	return json_array_get(json_object_get(m, "producers"), rank);
}

static json_int_t published(const char *sock)
{
	json_t *st = t_status(sock), *m = t_status_model(st, MODEL);
	json_int_t v = m ? json_integer_value(json_object_get(m, "published")) : -1;

	json_decref(st);
	return v;
}

static void write_all(struct t_prod *p, wex_client_t *e, uint64_t v)
{
	for (int i = 0; i < 2; i++)
		T_WEX(p[i].c, wex_begin_write(p[i].c, v, 10000));
	T_WEX(e, wex_begin_write(e, v, 10000));
	for (int i = 0; i < 2; i++)
		ex_fill(p[i].base, p[i].t, (size_t)p[i].n, v, 1);
	for (int i = 0; i < 2; i++)
		T_WEX(p[i].c, wex_publish(p[i].c, v));
	T_WEX(e, wex_publish(e, v));
}

int main(void)
{
	struct t_wexd d;
	struct t_prod p[2];
	struct t_cons k;
	struct wex_sync_result r;
	wex_client_t *e;
	json_t *st, *pr;
	int ret;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	for (uint32_t i = 0; i < 2; i++)
		open_half(&p[i], i);
	e = t_open(WEX_ROLE_PRODUCER, MODEL, NULL, 2, 3);
	ret = wex_begin_write(e, 1, 200);
	T_ASSERT(ret == -EINVAL && strstr(wex_last_error(e), "register tensors first"),
		 "begin_write before any table is refused: %s (%s)", wex_strerror(ret),
		 wex_last_error(e));
	pr = rank_status(d.sock, 2, &st);
	T_ASSERT(json_is_false(json_object_get(pr, "registered")),
		 "status: the rank is not registered before its table");
	json_decref(st);
	T_WEX(e, wex_register_tensors(e, NULL, 0));
	pr = rank_status(d.sock, 2, &st);
	T_ASSERT(json_is_true(json_object_get(pr, "registered")) &&
			 json_integer_value(json_object_get(pr, "tensors")) == 0 &&
			 json_integer_value(json_object_get(pr, "segments")) == 0,
		 "status: the empty rank is registered, with 0 tensors in 0 segments");
	json_decref(st);

	write_all(p, e, 1);
	T_ASSERT(published(d.sock) == 1, "v1 published with the empty rank");
	t_cons_open(&k, MODEL, "whole", "tiny", 0, 1);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 1, 5000, &r));
	T_ASSERT(r.version == 1 && t_own_bad(&k, 1) == 0, "the consumer holds v1 exactly");

	t_wexd_kill(&d);
	t_wexd_restart(&d);
	t_check_backend(d.sock);
	/* The producers' watches bring their memory and v1 back, the empty
	 * rank's table too (30 s at most: a loaded machine). */
	for (double t0 = t_now(); published(d.sock) != 1; usleep(10000))
		T_ASSERT(t_now() - t0 < 30.0,
			 "the producers' watches did not bring v1 back to the new wexd (at v%lld)",
			 (long long)published(d.sock));
	pr = rank_status(d.sock, 2, &st);
	T_ASSERT(json_integer_value(json_object_get(pr, "published")) == 1,
		 "the empty rank holds v1 again on the new wexd");
	json_decref(st);

	write_all(p, e, 2);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 2, 5000, &r));
	T_ASSERT(r.version == 2 && t_own_bad(&k, 2) == 0,
		 "the consumer holds v2 exactly, written after the restart");

	t_cons_close(&k);
	wex_client_close(e);
	for (int i = 0; i < 2; i++)
		t_prod_close(&p[i]);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
