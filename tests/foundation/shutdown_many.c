/* SPDX-License-Identifier: MIT */
/*
 * shutdown_many - proves that wexd, stopped (SIGTERM) with thousands of
 * clients connected, takes every connection down before it exits: the
 * io_uring loop frees a connection only once its cancelled receive and
 * pidfd poll are back, four completions a client, at most WEX_LOOP_BATCH
 * (64) a turn, and wexd gave that 100 turns: past about 1600 clients the
 * rest were left allocated (the sanitizer build's leak check made wexd
 * exit 1 on SIGTERM).  Every client sees the end of its connection, and
 * wexd exits 0 (t_wexd_stop checks).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "helpers.h"

#define CLIENTS 2000

int main(void)
{
	static int fds[CLIENTS];
	struct t_wexd d;
	json_t *r;
	int ended = 0;

	t_nofile_at_least(CLIENTS + 128);
	setenv("WEX_MAX_CLIENTS", "10000", 1);
	t_wexd_start(&d);
	t_check_backend(d.sock);
	for (int i = 0; i < CLIENTS; i++)
		fds[i] = t_raw_connect(d.sock);
	/* Every one of them taken in (a ping on the last, answered after the
	 * accepts before it). */
	r = t_raw_rpc(fds[CLIENTS - 1], "{\"v\":1,\"op\":\"ping\"}", NULL, 0);
	T_ASSERT(!strcmp(t_code(r), "OK"), "ping: %s: %s", t_code(r), t_msg(r));
	json_decref(r);
	t_wexd_stop(&d);
	for (int i = 0; i < CLIENTS; i++) {
		struct pollfd p = { .fd = fds[i], .events = POLLIN };
		char b;

		if (poll(&p, 1, 0) == 1 && recv(fds[i], &b, 1, MSG_DONTWAIT) == 0)
			ended++;
		close(fds[i]);
	}
	T_ASSERT(ended == CLIENTS, "%d of %d clients saw their connection end", ended, CLIENTS);
	printf("shutdown_many: %d clients connected at SIGTERM, wexd exited 0, every one told: PASS\n",
	       CLIENTS);
	t_exit(T_EXIT_PASS);
}
