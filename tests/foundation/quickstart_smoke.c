/* SPDX-License-Identifier: MIT */
/*
 * quickstart_smoke - proves the quickstart works end to end with the real
 * example programs: against a private wexd, 2 wex-producer ranks (preset
 * tiny, 2 versions, waiting for the group after each publish, holding
 * their memory) and 2 wex-consumer ranks of one group sync every version
 * in every mode (view, fixed, copy) and verify every byte; both consumers
 * exit 0, and the producers exit 0 on SIGTERM.
 *
 *   quickstart_smoke PATH/wex-producer PATH/wex-consumer
 */
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"

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
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
