/* SPDX-License-Identifier: MIT */
/*
 * writer_priority - proves README's "while a producer rank writes or waits
 * to write, no new lease is granted, so writers are not starved": consumer
 * group "a" holds a lease on v1 and the producer's begin_write of v2 waits
 * for it; a consumer of group "b" that then asks for the newest version
 * (at least v1) gets no lease on v1, which would hold the writer back once
 * more, but waits beside it.  Once group a releases, the writer goes
 * first, and group b is served v2, every byte checked.
 */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

#define MODEL "wprio"

struct job {
	wex_client_t *c;
	struct t_prod *p;
	struct wex_sync_result r;
	int ret;
};

static void *writer(void *arg)
{
	struct job *j = arg;

	j->ret = wex_begin_write(j->p->c, 2, 10000);
	if (j->ret == 0) {
		ex_fill(j->p->base, j->p->t, (size_t)j->p->n, 2, 1);
		j->ret = wex_publish(j->p->c, 2);
	}
	return NULL;
}

static void *reader(void *arg)
{
	struct job *j = arg;

	j->ret = wex_sync(j->c, WEX_SYNC_REMAP_VIEW, 1, 10000, &j->r);
	return NULL;
}

/* Clients of MODEL that wexd shows waiting in `what` (begin_write,
 * acquire). */
static int waiting(const char *sock, const char *what)
{
	json_t *s = t_status(sock), *c;
	size_t i;
	int n = 0;

	json_array_foreach(json_object_get(s, "clients"), i, c)
		n += !strcmp(json_string_value(json_object_get(c, "model")) ?: "", MODEL) &&
		     !strcmp(json_string_value(json_object_get(c, "waiting")) ?: "", what);
	json_decref(s);
	return n;
}

/* Polls (bounded) until `what` has `n` waiters. */
static void await_waiting(const char *sock, const char *what, int n)
{
	for (int i = 0; waiting(sock, what) != n; i++) {
		T_ASSERT(i < 500, "no %d client(s) waiting in %s after 5 s", n, what);
		usleep(10000);
	}
}

int main(void)
{
	struct t_wexd d;
	struct t_prod p;
	struct t_cons a, b;
	struct wex_sync_result r;
	struct job w = { .p = &p }, rb;
	pthread_t tw, tb;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	t_prod_open(&p, MODEL, "tiny", 0, 1);
	t_cons_open(&a, MODEL, "a", "tiny", 0, 1);
	t_cons_open(&b, MODEL, "b", "tiny", 0, 1);
	t_prod_write(&p, 1);
	T_WEX(a.c, wex_sync(a.c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
	T_ASSERT(r.version == 1 && t_view_bad(&a, 0, 1) == 0, "group a reads v1");

	T_ASSERT(pthread_create(&tw, NULL, writer, &w) == 0, "writer thread");
	await_waiting(d.sock, "begin_write", 1);
	rb = (struct job){ .c = b.c };
	T_ASSERT(pthread_create(&tb, NULL, reader, &rb) == 0, "reader thread");
	/* Group b waits beside the writer: no lease on v1 for it. */
	await_waiting(d.sock, "acquire", 1);
	T_ASSERT(waiting(d.sock, "begin_write") == 1, "the writer still waits");
	T_ASSERT(t_leases(d.sock, MODEL) == 1, "only group a's lease: %d", t_leases(d.sock, MODEL));
	usleep(200000);
	T_ASSERT(waiting(d.sock, "acquire") == 1 && t_leases(d.sock, MODEL) == 1,
		 "group b was given a lease on v1 while the writer waited");

	T_WEX(a.c, wex_release(a.c));
	pthread_join(tw, NULL);
	T_ASSERT(w.ret == 0, "the writer went first once group a released: %s",
		 wex_strerror(w.ret));
	pthread_join(tb, NULL);
	T_ASSERT(rb.ret == 0 && rb.r.version == 2, "group b is served v2: %s (v%llu)",
		 wex_strerror(rb.ret), (unsigned long long)rb.r.version);
	T_ASSERT(t_view_bad(&b, 0, 2) == 0, "group b reads v2");
	T_WEX(b.c, wex_release(b.c));
	t_cons_close(&a);
	t_cons_close(&b);
	t_prod_close(&p);
	t_wexd_stop(&d);
	printf("writer_priority: PASS\n");
	t_exit(T_EXIT_PASS);
}
