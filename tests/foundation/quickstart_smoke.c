/* SPDX-License-Identifier: MIT */
/*
 * quickstart_smoke - proves the quickstart works end to end with the real
 * example programs: against a private wexd, 2 wex-producer ranks (preset
 * tiny, 2 versions, waiting for the group after each publish, holding
 * their memory) and 2 wex-consumer ranks of one group sync every version
 * in every mode (view, fixed, copy) and verify every byte; both consumers
 * exit 0, and the producers exit 0 on SIGTERM.
 *
 * Then a producer whose begin_write waits for a lease (a consumer of the
 * group it waits for holds v1 in view mode): SIGINT (Ctrl-C) ends it at
 * once, exit 0 (it went on waiting for the lease until begin_write timed
 * out, 60 s, and then exited 1 with EBUSY).
 *
 *   quickstart_smoke PATH/wex-producer PATH/wex-consumer
 */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "wex.h"

static pid_t spawn(char *const argv[])
{
	pid_t pid = t_fork();

	if (pid == 0) {
		execv(argv[0], argv);
		fprintf(stderr, "exec %s failed\n", argv[0]);
		_exit(127);
	}
	return pid;
}

int main(int argc, char **argv)
{
	struct t_wexd d;
	pid_t prod[2], cons[2];
	char rank[2][4] = { "0", "1" };

	if (argc < 3)
		T_SKIP("usage: quickstart_smoke PATH/wex-producer PATH/wex-consumer");
	t_wexd_start(&d);
	t_check_backend(d.sock);
	for (int r = 0; r < 2; r++) {
		char *pa[] = { argv[1], "--rank", rank[r], "--world", "2", "--preset", "tiny",
			       "--versions", "2", "--wait-group", "engine", "--hold", "--socket",
			       d.sock, NULL };

		prod[r] = spawn(pa);
	}
	for (int r = 0; r < 2; r++) {
		char *ca[] = { argv[2], "--rank", rank[r], "--world", "2", "--preset", "tiny",
			       "--versions", "2", "--modes", "view,fixed,copy", "--group", "engine",
			       "--timeout-ms", "20000", "--socket", d.sock, NULL };

		cons[r] = spawn(ca);
	}
	for (int r = 0; r < 2; r++) {
		int rc = t_wait(cons[r]);

		T_ASSERT(rc == 0, "wex-consumer rank %d exited with %d", r, rc);
	}
	for (int r = 0; r < 2; r++) {
		int rc;

		kill(prod[r], SIGTERM);
		rc = t_wait(prod[r]);
		T_ASSERT(rc == 0, "wex-producer rank %d exited with %d on SIGTERM", r, rc);
	}
	{
		char *pa[] = { argv[1], "--model", "held", "--preset", "tiny", "--versions", "2",
			       "--wait-group", "hold", "--socket", d.sock, NULL };
		struct wex_client_params cp = {
			.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL |
				      WEX_CLIENT_FIELD_GROUP,
			.role = WEX_ROLE_CONSUMER, .model = "held", .group = "hold",
		};
		struct wex_sync_result res;
		wex_client_t *c;
		pid_t p = spawn(pa);
		double t0;
		int st = 0, ret;

		T_WEX(NULL, wex_client_open(&cp, &c));
		/* v1 held in view mode: the producer's begin_write of v2 waits. */
		T_WEX(c, wex_sync(c, WEX_SYNC_REMAP_VIEW, 1, 20000, &res));
		usleep(300 * 1000);
		kill(p, SIGINT);
		t0 = t_now();
		while ((ret = waitpid(p, &st, WNOHANG)) == 0 && t_now() - t0 < 10)
			usleep(10 * 1000);
		if (ret == 0) {
			kill(p, SIGKILL);
			waitpid(p, &st, 0);
		}
		t_untrack_child(p);
		T_ASSERT(ret == p, "wex-producer still waiting in begin_write %.0f s after SIGINT",
			 t_now() - t0);
		T_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0,
			 "wex-producer stopped in begin_write exited with status 0x%x", st);
		wex_client_close(c);
	}
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
