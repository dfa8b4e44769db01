/* SPDX-License-Identifier: MIT */
/*
 * mass_disconnect - proves that wexd survives many clients dying at once
 * (crash safety, DESIGN 4.6, at scale): one process holds 500 consumer
 * connections of one group, each holding a copy lease on v1; 300 more of
 * another group, each waiting in an acquire for a version that does not
 * exist yet; and the 100 ranks of a third group, half of which took v1 (so
 * the group's round holds v1 for the other half).  It is SIGKILLed, so 900
 * sockets close in the same instant (more completions than the io_uring
 * backend's completion queue holds).  Then the producer's begin_write of v2 goes through within its
 * timeout, wexd lists no lease and no rank of the dead process, holds the
 * fds it held before they came, and a new consumer syncs v2.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "helpers.h"
#include "proto.h"
#include "wex.h"

#define MODEL "herd"
#define HOLDERS 500
#define WAITERS 300
#define PARTIAL 100 /* half of them take v1 */
#define ALL (HOLDERS + WAITERS + PARTIAL)

static void ok(int fd, const char *req, const int *fds, int nfds, const char *what)
{
	json_t *r = t_raw_rpc(fd, req, fds, nfds);

	T_ASSERT(!strcmp(t_code(r), "OK"), "%s: %s: %s", what, t_code(r), t_msg(r));
	json_decref(r);
}

/* Leases and connected consumer ranks of MODEL per `models`. */
static void census(int ctl, json_int_t *leases, int *ranks)
{
	json_t *r = t_raw_rpc(ctl, "{\"v\":1,\"op\":\"models\"}", NULL, 0), *m, *g, *k;
	size_t i, j, q;

	T_ASSERT(!strcmp(t_code(r), "OK"), "models: %s: %s", t_code(r), t_msg(r));
	*leases = -1;
	*ranks = 0;
	json_array_foreach(json_object_get(r, "models"), i, m) {
		if (strcmp(json_string_value(json_object_get(m, "name")) ?: "", MODEL))
			continue;
		*leases = json_integer_value(json_object_get(m, "leases"));
		json_array_foreach(json_object_get(m, "groups"), j, g)
			json_array_foreach(json_object_get(g, "ranks"), q, k)
				*ranks += json_integer_value(json_object_get(k, "pid")) != 0;
	}
	json_decref(r);
}

static void herd(int ready)
{
	static int fds[ALL];
	struct rlimit rl;
	char req[256];

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < ALL + 64) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	for (int i = 0; i < ALL; i++) {
		const char *group = i < HOLDERS ? "holders" : i < HOLDERS + WAITERS ? "waiters" : "partial";
		int rank = i < HOLDERS ? i : i < HOLDERS + WAITERS ? i - HOLDERS : i - HOLDERS - WAITERS;
		int world = i < HOLDERS ? HOLDERS : i < HOLDERS + WAITERS ? WAITERS : PARTIAL;

		fds[i] = t_raw_connect(getenv("WEX_SOCKET"));
		snprintf(req, sizeof(req),
			 "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"" MODEL "\","
			 "\"group\":\"%s\",\"rank\":%d,\"world\":%d}",
			 group, rank, world);
		ok(fds[i], req, NULL, 0, "consumer hello");
		if (i < HOLDERS || (i >= HOLDERS + WAITERS && rank < PARTIAL / 2)) {
			ok(fds[i], "{\"v\":1,\"op\":\"acquire\",\"mode\":1,\"timeout_ms\":10000}", NULL,
			   0, "acquire v1");
		} else if (i < HOLDERS + WAITERS) {
			const char *acq = "{\"v\":1,\"op\":\"acquire\",\"min_version\":99,"
					  "\"timeout_ms\":60000}";
			json_t *r;

			/* A second request while the first waits is refused at
			 * once: its reply says the acquire is deferred in wexd. */
			t_raw_send(fds[i], acq, strlen(acq), NULL, 0);
			r = t_raw_rpc(fds[i], "{\"v\":1,\"op\":\"ping\"}", NULL, 0);
			T_ASSERT(!strcmp(t_code(r), "EBUSY"), "ping behind a waiting acquire: %s",
				 t_code(r));
			json_decref(r);
		}
	}
	T_ASSERT(write(ready, "r", 1) == 1, "tell");
	for (;;)
		pause();
}

int main(void)
{
	struct t_wexd d;
	struct wex_tensor t;
	int ctl, prod, fd, pp[2], before, after, ranks, ret;
	json_int_t leases;
	pid_t pid;
	double t0;
	char ch;
	json_t *r;
	struct rlimit rl;

	/* wexd holds two fds per client (its socket and the pidfd its
	 * process is watched by), raised to the hard limit at most; the herd
	 * holds one each.  Below that the test proves nothing: a skip. */
	T_ASSERT(getrlimit(RLIMIT_NOFILE, &rl) == 0, "getrlimit");
	if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 2 * ALL + 128)
		T_SKIP("RLIMIT_NOFILE hard limit %llu < %d (wexd holds 2 fds per client)",
		       (unsigned long long)rl.rlim_max, 2 * ALL + 128);
	t_wexd_start(&d);
	t_check_backend(d.sock);
	ctl = t_raw_connect(d.sock);
	prod = t_raw_connect(d.sock);
	ok(prod, "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"" MODEL "\"}", NULL, 0,
	   "producer hello");
	fd = memfd_create("t-herd", MFD_CLOEXEC);
	T_ASSERT(fd >= 0 && ftruncate(fd, 4096) == 0, "memfd");
	ok(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":4096}", &fd, 1,
	   "segment");
	close(fd);
	t_u8_tensor(&t, "w", 4096, 0, 0);
	fd = wex__table_pack(&t, NULL, 1);
	ok(prod, "{\"v\":1,\"op\":\"register_tensors\"}", &fd, 1, "tensors");
	close(fd);
	ok(prod, "{\"v\":1,\"op\":\"begin_write\",\"version\":1}", NULL, 0, "begin_write v1");
	ok(prod, "{\"v\":1,\"op\":\"publish\",\"version\":1}", NULL, 0, "publish v1");
	before = t_wexd_fds_settle(&d, -1);

	T_ASSERT(pipe(pp) == 0, "pipe");
	pid = t_fork();
	if (pid == 0) {
		close(pp[0]);
		herd(pp[1]);
	}
	close(pp[1]);
	T_ASSERT(read(pp[0], &ch, 1) == 1, "the herd connected");
	close(pp[0]);
	census(ctl, &leases, &ranks);
	printf("herd up: %lld lease(s), %d consumer rank(s) connected\n", (long long)leases, ranks);
	/* Each holder's lease, each half-group taker's, and the partial
	 * group's open round. */
	T_ASSERT(leases == HOLDERS + PARTIAL / 2 + 1 && ranks == ALL, "census before the kill");
	r = t_raw_rpc(prod, "{\"v\":1,\"op\":\"begin_write\",\"version\":2,\"timeout_ms\":50}", NULL, 0);
	T_ASSERT(!strcmp(t_code(r), "EBUSY"), "begin_write under %lld leases: %s", (long long)leases,
		 t_code(r));
	json_decref(r);

	kill(pid, SIGKILL);
	ret = t_wait(pid);
	T_ASSERT(ret == 128 + SIGKILL, "herd killed (got %d)", ret);
	t0 = t_now();
	ok(prod, "{\"v\":1,\"op\":\"begin_write\",\"version\":2,\"timeout_ms\":10000}", NULL, 0,
	   "begin_write v2 after the herd died");
	printf("begin_write v2 went through %.1f ms after the kill\n", (t_now() - t0) * 1e3);
	ok(prod, "{\"v\":1,\"op\":\"publish\",\"version\":2}", NULL, 0, "publish v2");
	census(ctl, &leases, &ranks);
	T_ASSERT(leases == 0 && ranks == 0, "after the kill: %lld lease(s), %d rank(s) of the dead "
		 "process still listed", (long long)leases, ranks);
	after = t_wexd_fds_settle(&d, before);
	T_ASSERT(after == before, "wexd holds %d fds after the herd died, %d before", after, before);

	/* A new engine of one rank in the holders' group syncs v2. */
	fd = t_raw_connect(d.sock);
	ok(fd, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"" MODEL "\","
	   "\"group\":\"holders\"}", NULL, 0, "new consumer hello (the group re-formed with 1 rank)");
	r = t_raw_rpc(fd, "{\"v\":1,\"op\":\"acquire\",\"timeout_ms\":5000}", NULL, 0);
	T_ASSERT(!strcmp(t_code(r), "OK") &&
			 json_integer_value(json_object_get(r, "version")) == 2,
		 "new consumer acquires v2: %s %s", t_code(r), t_msg(r));
	json_decref(r);
	close(fd);
	close(prod);
	close(ctl);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
