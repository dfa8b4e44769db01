/* SPDX-License-Identifier: MIT */
/*
 * empty_message - SOCK_SEQPACKET carries empty messages, fds and all, and
 * wexd handles them as what they are:
 *  - an empty message on an open connection is answered EBADMSG and the
 *    connection goes on (it was taken for the client's hang-up: its ranks
 *    and leases were dropped);
 *  - an empty message carrying 20 fds that arrives while wexd closes the
 *    connection (the client's process exited, a child kept the socket and
 *    sent it) leaves wexd no fd: wexd is stopped (SIGSTOP) while the child
 *    sends a ping and the empty message and the parent exits, so that on
 *    SIGCONT the exit and the receive land in one batch.  The io_uring
 *    loop closed only the fds of non-empty messages there: 20 fds leaked
 *    per round, until wexd ran out.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "ipc/sock.h"

#define NFDS 20
#define ROUNDS 3

static void empty_answered(const char *sock)
{
	int fd = t_raw_connect(sock);
	json_t *r;

	r = t_raw_rpc(fd, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"m\"}", NULL, 0);
	T_ASSERT(!strcmp(t_code(r), "OK"), "hello: %s", t_msg(r));
	json_decref(r);
	t_raw_send(fd, "", 0, NULL, 0);
	r = t_raw_recv(fd);
	T_ASSERT(!strcmp(t_code(r), "EBADMSG"), "an empty message: %s (%s), not EBADMSG", t_code(r),
		 t_msg(r));
	json_decref(r);
	r = t_raw_rpc(fd, "{\"v\":1,\"op\":\"ping\"}", NULL, 0);
	T_ASSERT(!strcmp(t_code(r), "OK"), "the connection goes on: ping %s (%s)", t_code(r),
		 t_msg(r));
	json_decref(r);
	close(fd);
	printf("an empty message is answered EBADMSG; the connection goes on\n");
}

/* A client that sends, then shuts its sending side down (SHUT_WR, as
 * socat does), still gets its answer: wexd drops the requests only of a
 * client that closed (SHUT_RDWR or close, as libwex gives an answer up). */
static void half_close_answered(const char *sock)
{
	int fd = t_raw_connect(sock);
	json_t *r;

	r = t_raw_rpc(fd, "{\"v\":1,\"op\":\"hello\",\"role\":\"admin\"}", NULL, 0);
	T_ASSERT(!strcmp(t_code(r), "OK"), "hello: %s", t_msg(r));
	json_decref(r);
	t_raw_send(fd, "{\"v\":1,\"op\":\"ping\"}", 19, NULL, 0);
	T_ASSERT(shutdown(fd, SHUT_WR) == 0, "shutdown: %s", strerror(errno));
	r = t_raw_recv(fd);
	T_ASSERT(!strcmp(t_code(r), "OK"), "ping, then SHUT_WR: %s (%s)", t_code(r), t_msg(r));
	json_decref(r);
	close(fd);
	printf("a request followed by SHUT_WR is answered\n");
}

/* X connects and pings; its child Z, holding X's socket, sends a ping and
 * the empty message with fds while wexd is stopped, and X exits.  Z holds
 * the write end of z_gone until it exits. */
static void race_round(struct t_wexd *d)
{
	int go_z[2], z_done[2], go_x[2], x_ready[2], z_gone[2];
	char b;
	pid_t x;

	T_ASSERT(pipe(go_z) == 0 && pipe(z_done) == 0 && pipe(go_x) == 0 && pipe(x_ready) == 0 &&
		 pipe(z_gone) == 0, "pipes");
	x = t_fork();
	if (x == 0) {
		int s = t_raw_connect(d->sock);
		json_t *r = t_raw_rpc(s, "{\"v\":1,\"op\":\"ping\"}", NULL, 0);

		json_decref(r);
		(void)!write(x_ready[1], "x", 1);
		if (fork() == 0) {
			int dn[NFDS];

			(void)!read(go_z[0], &b, 1);
			t_raw_send(s, "{\"v\":1,\"op\":\"ping\"}", 19, NULL, 0);
			for (int i = 0; i < NFDS; i++)
				dn[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
			t_raw_send(s, "", 0, dn, NFDS);
			(void)!write(z_done[1], "d", 1);
			usleep(500000);
			_exit(0);
		}
		close(z_gone[1]);
		(void)!read(go_x[0], &b, 1);
		_exit(0);
	}
	close(x_ready[1]);
	close(z_gone[1]);
	/* X's ping answered; one round trip more on a connection of our own,
	 * and wexd has armed X's next receive (conditions, not a sleep: a
	 * loaded machine may take its time). */
	T_ASSERT(read(x_ready[0], &b, 1) == 1, "X connected and pinged");
	t_wexd_fds_settle(d, -1);
	T_ASSERT(kill(d->pid, SIGSTOP) == 0, "SIGSTOP wexd");
	(void)!write(go_z[1], "g", 1);
	(void)!read(z_done[0], &b, 1);
	(void)!write(go_x[1], "g", 1);
	t_wait(x);
	T_ASSERT(kill(d->pid, SIGCONT) == 0, "SIGCONT wexd");
	/* And Z is gone (end of file once it exited). */
	T_ASSERT(read(z_gone[0], &b, 1) == 0, "Z exits");
	for (int i = 0; i < 2; i++) {
		close(go_z[i]);
		close(z_done[i]);
		close(go_x[i]);
	}
	close(x_ready[0]);
	close(z_gone[0]);
}

int main(void)
{
	struct t_wexd d;
	int before, after;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	empty_answered(d.sock);
	half_close_answered(d.sock);
	before = t_wexd_fds_settle(&d, -1);
	for (int i = 0; i < ROUNDS; i++)
		race_round(&d);
	after = t_wexd_fds_settle(&d, before);
	printf("%d rounds of an empty message with %d fds racing the client's exit: wexd fds %d -> %d\n",
	       ROUNDS, NFDS, before, after);
	T_ASSERT(after == before, "wexd kept %d fds of empty messages that raced a closing connection",
		 after - before);
	t_wexd_stop(&d);
	printf("empty_message: PASS\n");
	return T_EXIT_PASS;
}
