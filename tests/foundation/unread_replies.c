/* SPDX-License-Identifier: MIT */
/*
 * unread_replies - proves that a client that sends requests and never
 * reads their replies holds at most one reply that carries fds.  Such a
 * reply pins what it passes for as long as the client leaves it in its
 * socket, even after wexd dropped the client: a status too large for a
 * message goes in a sealed memfd made for that reply (shared memory
 * charged to wexd: before, 278 unread statuses of 810 KiB per connection,
 * 225 MiB, and the client was never dropped), and a fetch passes the
 * producer's segment fds (167 unread replies with fds, each fd counted,
 * while in flight, against the file limit of wexd's user: past it, every
 * client's fetch failed, ETOOMANYREFS).  wexd now
 * sends a reply with fds only to a client that has read its earlier
 * replies, and drops the others as not reading; other clients are served.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"
#include "ipc/sock.h"

#define MODEL "unread"
#define PRESET "small"

/* Sends `req` up to `max` times without reading, until the socket is full
 * or wexd closes it, and waits for wexd to close it. */
static void flood(const char *what, int fd, const char *req, int max)
{
	struct pollfd p = { .fd = fd, .events = POLLRDHUP };
	int sent = 0;

	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	for (; sent < max; sent++)
		if (wex_sock_send(fd, req, strlen(req), NULL, 0, MSG_DONTWAIT) < 0)
			break;
	T_ASSERT(poll(&p, 1, 20000) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)),
		 "%s: wexd dropped the client that does not read (after %d requests)", what, sent);
	printf("%-44s -> %d requests sent\n", what, sent);
}

/* Reads what is left in fd, closes it; returns the messages left that
 * carried fds. */
static int left_with_fds(const char *what, int fd)
{
	int msgs = 0, with_fds = 0, resets = 0;
	char buf[4096];

	for (;;) {
		int fds[WEX_SOCK_MAX_FDS], nfds = 0, mflags = 0;
		ssize_t n = wex_sock_recv(fd, buf, sizeof(buf), fds, WEX_SOCK_MAX_FDS, &nfds,
					  &mflags, MSG_DONTWAIT);

		/* (The error wexd's close left is reported once, before
		 * the messages still queued.) */
		if (n == -ECONNRESET && !resets++)
			continue;
		if (n < 0 && n != -EAGAIN)
			T_FAIL("%s: reading what was left: %s", what, strerror((int)-n));
		if (n <= 0)
			break;
		msgs++;
		if (nfds)
			with_fds++;
		wex_sock_close_fds(fds, nfds);
	}
	close(fd);
	printf("%-44s -> %d replies left unread, %d with fds\n", what, msgs, with_fds);
	return with_fds;
}

/* A consumer syncs through libwex, reading its replies as it should. */
static void sync_one(void)
{
	struct t_cons k;
	struct wex_sync_result res;

	t_cons_open(&k, MODEL, "g2", PRESET, 0, 1);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 1, 5000, &res));
	t_cons_close(&k);
}

int main(void)
{
	struct t_wexd d;
	struct t_prod p;
	int big[8], fd, with_fds, fds0;
	char req[256];
	json_t *r;

	/* Low enough that fds left in flight by a client show (for a wexd
	 * whose user is not root: root is not held to it). */
	setenv("WEX_MAX_OPEN_FILES", "256", 1);
	t_wexd_start(&d);
	t_check_backend(d.sock);
	t_prod_open(&p, MODEL, PRESET, 0, 1);
	t_prod_write(&p, 1);
	/* (Its tables and plan are made once, and kept.) */
	sync_one();
	fds0 = t_wexd_fds_settle(&d, -1);

	/* 1. A status too large for one message, asked again and again:
	 * eight producers claim worlds of 1024 ranks (810 KiB). */
	for (int i = 0; i < 8; i++) {
		snprintf(req, sizeof(req), "big%d", i);
		big[i] = t_raw_producer(d.sock, req, 1024);
	}
	fd = t_raw_connect(d.sock);
	flood("status in a memfd, never read", fd, "{\"v\":1,\"op\":\"status\"}", 2000);
	with_fds = left_with_fds("status in a memfd, never read", fd);
	T_ASSERT(with_fds <= 1, "status in a memfd: %d unread memfds held by one client "
		 "(expected at most 1)", with_fds);
	/* Read as a client should, it still comes whole, again and again. */
	fd = t_raw_connect(d.sock);
	for (int i = 0; i < 3; i++) {
		int rfd = -1, nr = 0, mfl = 0;
		const void *data;
		size_t dlen = 0;
		char small[256];
		ssize_t n;
		json_t *s;

		t_raw_send(fd, "{\"v\":1,\"op\":\"status\"}", 21, NULL, 0);
		n = wex_sock_recv(fd, small, sizeof(small) - 1, &rfd, 1, &nr, &mfl, 0);
		small[n > 0 ? n : 0] = '\0';
		T_ASSERT(n > 0 && nr == 1 && strstr(small, "\"reply_in_fd\":true"),
			 "status %d in a memfd for a client that reads it: %s", i, small);
		T_ASSERT(wex_table_map(rfd, 1u << 30, &data, &dlen) == 0, "a sealed memfd");
		s = json_loadb(data, dlen, 0, NULL);
		T_ASSERT(json_array_size(json_object_get(t_status_model(s, "big0"), "producers")) ==
				 1024, "the memfd holds the whole status (%zu bytes)", dlen);
		json_decref(s);
		wex_table_unmap(data, dlen);
		close(rfd);
	}
	close(fd);
	for (int i = 0; i < 8; i++)
		close(big[i]);

	/* 2. A consumer's fetch (the producer's segment fds), never read. */
	fd = t_raw_connect(d.sock);
	r = t_raw_rpc(fd, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"" MODEL
			  "\",\"group\":\"g\",\"rank\":0,\"world\":1}",
		      NULL, 0);
	T_ASSERT(!strcmp(t_code(r), "OK"), "consumer hello: %s", t_msg(r));
	json_decref(r);
	flood("fetch (segment fds), never read", fd, "{\"v\":1,\"op\":\"fetch\"}", 2000);
	/* Others are served while it holds what is left (a wexd whose user
	 * is not root failed their fetches: ETOOMANYREFS once the fds in
	 * flight passed its file limit). */
	sync_one();
	with_fds = left_with_fds("fetch (segment fds), never read", fd);
	T_ASSERT(with_fds <= 1, "fetch: %d unread replies with fds held by one client "
		 "(expected at most 1)", with_fds);

	/* No fd of wexd's leaked. */
	T_ASSERT(t_wexd_fds_settle(&d, fds0) == fds0, "wexd's fds back to %d", fds0);
	t_prod_close(&p);
	t_wexd_stop(&d);
	printf("unread_replies: OK\n");
	return 0;
}
