/* SPDX-License-Identifier: MIT */
/*
 * rank_takeover - a process started in place of one that died gets its
 * rank, even when wexd reads its hello before the dead one's hang-up
 * (nothing orders two connections).  Found by the chaos test: a consumer
 * restarted right after a SIGKILL was refused with EADDRINUSE, "rank 0 of
 * group 'solo' is held by pid N", N being the dead process.  The order is
 * forced here: with wexd stopped (SIGSTOP), the new connection sends its
 * hello, then the old one closes, then wexd goes on (epoll hands it the
 * hello first; io_uring's order may differ, and either must work).  For
 * a producer rank, a consumer rank, and a consumer that was
 * its model's last client (closing it frees the model under the hello).
 * A live holder is still refused (EADDRINUSE).  Likewise a hello that
 * resizes a world (producers, a consumer group) whose old ranks are all
 * dead but not yet seen closed.
 */
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

static void ok(int fd, const char *req, const char *what)
{
	json_t *r = t_raw_rpc(fd, req, NULL, 0);

	T_ASSERT(!strcmp(t_code(r), "OK"), "%s: %s: %s", what, t_code(r), t_msg(r));
	json_decref(r);
}

/* `old` (nold connections) holds the rank `hello` asks for, or the ranks
 * of a world the hello resizes, and hangs up once wexd has the new
 * connection's hello queued: the new connection gets the rank. */
static void take_over_n(struct t_wexd *d, const int *old, int nold, const char *hello,
			const char *what)
{
	int fd = t_raw_connect(d->sock), st;
	json_t *r;

	ok(fd, "{\"v\":1,\"op\":\"ping\"}", "ping"); /* accepted before wexd stops */
	T_ASSERT(kill(d->pid, SIGSTOP) == 0, "SIGSTOP wexd");
	T_ASSERT(waitpid(d->pid, &st, WUNTRACED) == d->pid && WIFSTOPPED(st), "wexd stopped");
	t_raw_send(fd, hello, strlen(hello), NULL, 0);
	for (int i = 0; i < nold; i++)
		close(old[i]);
	T_ASSERT(kill(d->pid, SIGCONT) == 0, "SIGCONT wexd");
	r = t_raw_recv(fd);
	T_ASSERT(!strcmp(t_code(r), "OK"), "%s: the rank of a connection already closed: %s: %s",
		 what, t_code(r), t_msg(r));
	json_decref(r);
	printf("%s: taken over\n", what);
	close(fd);
}

static void take_over(struct t_wexd *d, int old, const char *hello, const char *what)
{
	take_over_n(d, &old, 1, hello, what);
}

/* Connects nold ranks with hellos[i]; returns their fds in old. */
static void connect_ranks(struct t_wexd *d, const char *const *hellos, int n, int *old)
{
	for (int i = 0; i < n; i++) {
		old[i] = t_raw_connect(d->sock);
		ok(old[i], hellos[i], hellos[i]);
	}
}

int main(void)
{
	static const char prod_hello[] =
		"{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"rt\",\"rank\":0,\"world\":1}";
	static const char cons_hello[] =
		"{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"rt\",\"group\":\"g\"}";
	static const char lone_hello[] =
		"{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"lone\",\"group\":\"g\"}";
	struct t_wexd d;
	int prod, cons, other, before, after;
	json_t *r;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	before = t_wexd_fds_settle(&d, -1);

	prod = t_raw_connect(d.sock);
	ok(prod, prod_hello, "producer hello");
	cons = t_raw_connect(d.sock);
	ok(cons, cons_hello, "consumer hello");
	/* A live holder keeps its rank. */
	other = t_raw_connect(d.sock);
	r = t_raw_rpc(other, prod_hello, NULL, 0);
	T_ASSERT(!strcmp(t_code(r), "EADDRINUSE"), "a live producer rank: EADDRINUSE, got %s",
		 t_code(r));
	json_decref(r);
	close(other);

	take_over(&d, prod, prod_hello, "producer rank 0");
	take_over(&d, cons, cons_hello, "consumer rank 0 of group g");
	/* The dead holder is its model's last client: closing it frees the
	 * model while the hello is being served. */
	other = t_raw_connect(d.sock);
	ok(other, lone_hello, "lone consumer hello");
	take_over(&d, other, lone_hello, "the last client's consumer rank");

	/* An engine or trainer restarted with another world size right
	 * after its old ranks died: the resize is not refused for ranks of
	 * connections wexd has not yet seen close (it was, EINVAL "group 'g2'
	 * has 2 ranks, this consumer says 1", found by review on epoll). */
	{
		static const char *const prod2[] = {
			"{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"rs\",\"rank\":0,\"world\":2}",
			"{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"rs\",\"rank\":1,\"world\":2}",
		};
		static const char *const cons2[] = {
			"{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"rs\",\"group\":\"g2\",\"rank\":0,\"world\":2}",
			"{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"rs\",\"group\":\"g2\",\"rank\":1,\"world\":2}",
		};
		static const char *const cons1[] = {
			"{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"rs\",\"group\":\"g1\",\"rank\":0,\"world\":1}",
		};
		int old[2], keep;

		/* (A consumer keeps the model while the producers resize.) */
		keep = t_raw_connect(d.sock);
		ok(keep, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"rs\",\"group\":\"k\"}",
		   "keeper hello");
		connect_ranks(&d, prod2, 2, old);
		take_over_n(&d, old, 2,
			    "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"rs\",\"rank\":0,\"world\":1}",
			    "producers resized 2 -> 1");
		connect_ranks(&d, cons2, 2, old);
		take_over_n(&d, old, 2,
			    "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"rs\",\"group\":\"g2\",\"rank\":0,\"world\":1}",
			    "consumer group resized 2 -> 1");
		/* A rank new in a larger world (rank 1 of 2) says hello first. */
		connect_ranks(&d, cons1, 1, old);
		take_over_n(&d, old, 1,
			    "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"rs\",\"group\":\"g1\",\"rank\":1,\"world\":2}",
			    "consumer group resized 1 -> 2 by its new rank");
		close(keep);
	}

	after = t_wexd_fds_settle(&d, before);
	T_ASSERT(after == before, "wexd holds %d fds with every client gone, %d before", after,
		 before);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
