/* SPDX-License-Identifier: MIT */
/*
 * client_count - a client that hung up, once wexd took that in, is no
 * longer counted: status's daemon.clients agrees with its clients list
 * in every answer, and under max_clients a client that connects right
 * after another left is served, not told "max_clients N are connected".
 * Under io_uring a closed connection stayed in the count (daemon.clients,
 * wex_clients, STATUS=, max_clients) until the ring gave back its
 * cancelled pidfd poll, a turn or more later: status said 3 clients while
 * listing 2, and a test that filled max_clients right after wexctl's
 * connections left was refused one (CI, svc_max_clients_admin).
 */
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "ipc/sock.h"

#define ROUNDS 500

/* A ping on a new connection: "OK", or the code of the refusal wexd
 * sends a connection it does not take (then it closes it: the refusal
 * may be lost with the ping unread, "ECONNRESET"). */
static const char *connect_ping(const char *sock, int *fd)
{
	static const char ping[] = "{\"v\":1,\"op\":\"ping\"}";
	static char code[32], buf[4096];
	struct pollfd p;
	int fds[WEX_SOCK_MAX_FDS], nfds = 0, mflags = 0;
	json_t *r;
	ssize_t n;

	*fd = t_raw_connect(sock);
	p = (struct pollfd){ .fd = *fd, .events = POLLIN };
	(void)wex_sock_send(*fd, ping, strlen(ping), NULL, 0, 0);
	T_ASSERT(poll(&p, 1, 10000) == 1, "no answer to a ping within 10 s");
	n = wex_sock_recv(*fd, buf, sizeof(buf) - 1, fds, WEX_SOCK_MAX_FDS, &nfds, &mflags, 0);
	wex_sock_close_fds(fds, nfds);
	if (n <= 0)
		return n < 0 ? "ECONNRESET" : "EOF";
	buf[n] = '\0';
	r = json_loads(buf, 0, NULL);
	snprintf(code, sizeof(code), "%s", t_code(r));
	json_decref(r);
	return code;
}

/* Whether status (asked on ctl) lists the client of connection id. */
static int listed(int ctl, json_int_t id)
{
	json_t *st = t_raw_rpc(ctl, "{\"v\":1,\"op\":\"status\"}", NULL, 0), *c;
	size_t i;
	int found = 0;

	json_array_foreach(json_object_get(st, "clients"), i, c)
		found |= json_integer_value(json_object_get(c, "id")) == id;
	json_decref(st);
	return found;
}

/* The id wexd gave the newest client. */
static json_int_t newest(int ctl)
{
	json_t *st = t_raw_rpc(ctl, "{\"v\":1,\"op\":\"status\"}", NULL, 0), *c;
	json_int_t id = 0;
	size_t i;

	json_array_foreach(json_object_get(st, "clients"), i, c)
		if (json_integer_value(json_object_get(c, "id")) > id)
			id = json_integer_value(json_object_get(c, "id"));
	json_decref(st);
	return id;
}

int main(void)
{
	struct t_wexd d;
	int ctl, fd, held[4];
	const char *code;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	ctl = t_raw_connect(d.sock);
	for (int i = 0; i < ROUNDS; i++) {
		json_t *st;
		json_int_t n = -1;
		size_t listed;

		code = connect_ping(d.sock, &fd);
		T_ASSERT(!strcmp(code, "OK"), "round %d: ping: %s", i, code);
		close(fd);
		st = t_raw_rpc(ctl, "{\"v\":1,\"op\":\"status\"}", NULL, 0);
		json_unpack(st, "{s:{s:I}}", "daemon", "clients", &n);
		listed = json_array_size(json_object_get(st, "clients"));
		T_ASSERT(n == (json_int_t)listed,
			 "round %d: status counts %lld clients and lists %zu (a client that left "
			 "still counted)", i, (long long)n, listed);
		json_decref(st);
	}
	close(ctl);
	t_wexd_stop(&d);
	printf("status's client count agreed with its list after %d hang-ups\n", ROUNDS);

	/* max_clients 1, and the 4 connections past it that wexd's own user
	 * (this test's) may hold: 4 held (one asks status), the 5th connects
	 * and leaves, again and again; once status no longer lists it (wexd
	 * read its hang-up), the next is served. */
	setenv("WEX_MAX_CLIENTS", "1", 1);
	t_wexd_start(&d);
	unsetenv("WEX_MAX_CLIENTS");
	for (int i = 0; i < 4; i++) {
		code = connect_ping(d.sock, &held[i]);
		T_ASSERT(!strcmp(code, "OK"), "held connection %d: %s", i, code);
	}
	ctl = held[0];
	for (int i = 0; i < ROUNDS; i++) {
		json_int_t id;

		code = connect_ping(d.sock, &fd);
		T_ASSERT(!strcmp(code, "OK"),
			 "round %d: the 5th connection, once wexd read the last one's hang-up: %s "
			 "(a client that left still counted against max_clients)", i, code);
		id = newest(ctl);
		close(fd);
		for (double t0 = t_now(); listed(ctl, id);)
			T_ASSERT(t_now() - t0 < 10.0, "round %d: a closed client listed for 10 s", i);
	}
	for (int i = 0; i < 4; i++)
		close(held[i]);
	t_wexd_stop(&d);
	printf("max_clients: %d connections, each after the last left, all served\n", ROUNDS);
	return T_EXIT_PASS;
}
