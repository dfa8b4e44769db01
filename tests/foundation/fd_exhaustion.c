/* SPDX-License-Identifier: MIT */
/*
 * fd_exhaustion - proves that wexd raises its soft fd limit to the hard
 * limit at start (it holds one fd per exported allocation), shown in status;
 * and that a wexd out of file descriptors stays in service: wexd starts
 * with max_open_files 64, one producer registers host segments until wexd
 * cannot take another fd (the message carrying it is refused, EMFILE, naming
 * the limit); connections already open are still served; a new client
 * is refused at once (its connection ends) instead of waiting unaccepted;
 * wexd does not spin meanwhile; and once the producer leaves, new clients
 * are served again and wexd's fd count is back to its start value.
 *
 * Found while fuzzing the protocol (proto_fuzz): out of fds, the epoll
 * backend's listener stayed readable and io_uring failed every accept at
 * once, so wexd spun at full CPU logging "accept: Too many open files"
 * millions of times, and the new client waited for good.
 */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "helpers.h"
#include "ipc/sock.h"

#define LIMIT 64

static long cpu_ticks(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long ut = 0, stt = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	T_ASSERT(f && fgets(buf, sizeof(buf), f), "read %s", path);
	fclose(f);
	/* Fields 14 and 15, after the parenthesised command name. */
	p = strrchr(buf, ')');
	T_ASSERT(p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut,
			     &stt) == 2,
		 "parse %s", path);
	return (long)(ut + stt);
}

/* 1 if wexd ends the connection within 5 s, 0 if it answers. */
static int refused(int fd)
{
	static const char ping[] = "{\"v\":1,\"op\":\"ping\"}";
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char buf[256];
	ssize_t n;

	if (wex_sock_send(fd, ping, sizeof(ping) - 1, NULL, 0, 0) < 0)
		return 1; /* refused before the send */
	T_ASSERT(poll(&p, 1, 5000) == 1, "a new client waits unanswered and unrefused");
	n = recv(fd, buf, sizeof(buf), 0);
	return n <= 0;
}

/*
 * wexd with max_open_files 64 filled up by one producer's segments.  With
 * its reserve fd, a new client is refused at once; without one
 * (no_reserve: WEX_LOOP_NO_RESERVE=1, as when another fd took the
 * reserve's slot), accepts pause and are retried, the client waits and is
 * served once fds are free.  Either way wexd does not spin.
 */
static void exhausted(int no_reserve)
{
	struct t_wexd d;
	int ctl, prod, fd = -1, before, after, nseg = 0, full = 0;
	long t0;
	json_t *r;

	/* max_open_files sets it. */
	setenv("WEX_MAX_OPEN_FILES", "64", 1);
	if (no_reserve)
		setenv("WEX_LOOP_NO_RESERVE", "1", 1);
	t_wexd_start(&d);
	unsetenv("WEX_MAX_OPEN_FILES");
	unsetenv("WEX_LOOP_NO_RESERVE");
	t_check_backend(d.sock);
	ctl = t_raw_connect(d.sock);
	before = t_wexd_fds_settle(&d, -1);

	prod = t_raw_connect(d.sock);
	r = t_raw_rpc(prod, "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"fds\"}", NULL,
		      0);
	T_ASSERT(!strcmp(t_code(r), "OK"), "hello: %s", t_msg(r));
	json_decref(r);
	while (!full && nseg < 2 * LIMIT) {
		int mfd = memfd_create("t-seg", MFD_CLOEXEC);

		T_ASSERT(mfd >= 0 && ftruncate(mfd, 4096) == 0, "memfd");
		r = t_raw_rpc(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":4096}",
			      &mfd, 1);
		close(mfd);
		if (!strcmp(t_code(r), "OK"))
			nseg++;
		else
			full = !strcmp(t_code(r), "EMFILE") && strstr(t_msg(r), "limit 64");
		T_ASSERT(full || !strcmp(t_code(r), "OK"), "register_segment: %s: %s", t_code(r),
			 t_msg(r));
		json_decref(r);
	}
	T_ASSERT(full, "wexd took %d segment fds under a limit of %d", nseg, LIMIT);
	printf("wexd full after %d segments: %d fds\n", nseg, t_fd_count(d.pid));

	r = t_raw_rpc(ctl, "{\"v\":1,\"op\":\"ping\"}", NULL, 0);
	T_ASSERT(!strcmp(t_code(r), "OK"), "an open connection is served: %s", t_code(r));
	json_decref(r);
	for (int i = 0; i < 3 && !no_reserve; i++) {
		fd = t_raw_connect(d.sock);
		T_ASSERT(refused(fd), "a new client of a wexd out of fds is refused");
		close(fd);
		fd = -1;
	}
	if (no_reserve) {
		/* Nothing to refuse it with: it waits, unaccepted. */
		struct pollfd p;

		fd = t_raw_connect(d.sock);
		T_ASSERT(wex_sock_send(fd, "{\"v\":1,\"op\":\"ping\"}", 19, NULL, 0, 0) == 19,
			 "send");
		p = (struct pollfd){ .fd = fd, .events = POLLIN };
		T_ASSERT(poll(&p, 1, 300) == 0, "a client of a wexd out of fds, without a reserve, "
			 "waits");
	}
	/* Nothing waits: wexd must be idle, not retrying accepts.  (CPU
	 * ticks over half a second; a spinning wexd takes most of them.) */
	t0 = cpu_ticks(d.pid);
	poll(NULL, 0, 500);
	T_ASSERT(cpu_ticks(d.pid) - t0 <= 15, "wexd used %ld ticks of CPU in 0.5 s idle",
		 cpu_ticks(d.pid) - t0);

	close(prod);
	/* Plus the waiting client's connection, accepted now: its socket and
	 * the pidfd its process is watched by. */
	after = t_wexd_fds_settle(&d, before + 2 * (fd >= 0));
	T_ASSERT(after == before + 2 * (fd >= 0), "wexd holds %d fds after the producer left, %d "
		 "before", after, before);
	if (fd >= 0) {
		/* Its accept is retried within the pause: now it is served. */
		struct pollfd p = { .fd = fd, .events = POLLIN };
		char buf[256];

		T_ASSERT(poll(&p, 1, 5000) == 1 && recv(fd, buf, sizeof(buf), 0) > 0,
			 "the waiting client is served once fds are free");
		close(fd);
	}
	r = t_status(d.sock);
	json_decref(r);
	close(ctl);
	t_wexd_stop(&d);
}

int main(void)
{
	struct rlimit old, lim;
	struct t_wexd d;
	json_int_t fds_open = 0, fds_limit = 0;
	json_t *r;

	T_ASSERT(getrlimit(RLIMIT_NOFILE, &old) == 0, "getrlimit");
	if (old.rlim_max < LIMIT)
		T_SKIP("RLIMIT_NOFILE hard limit %llu < %d", (unsigned long long)old.rlim_max, LIMIT);
	/* wexd inherits a low soft limit and raises it to the hard limit
	 * (capped at 2^20); this process takes its own back. */
	lim = old;
	lim.rlim_cur = LIMIT;
	T_ASSERT(setrlimit(RLIMIT_NOFILE, &lim) == 0, "setrlimit");
	t_wexd_start(&d);
	T_ASSERT(setrlimit(RLIMIT_NOFILE, &old) == 0, "setrlimit");
	r = t_status(d.sock);
	T_ASSERT(json_unpack(r, "{s:{s:{s:I, s:I}}}", "daemon", "fds", "open", &fds_open, "limit",
			     &fds_limit) == 0,
		 "status has daemon.fds {open, limit}");
	T_ASSERT((rlim_t)fds_limit == (old.rlim_max < (1u << 20) ? old.rlim_max : (1u << 20)),
		 "wexd's fd limit is %lld, the hard limit %llu", (long long)fds_limit,
		 (unsigned long long)old.rlim_max);
	T_ASSERT(fds_open > 3 && fds_open < 64, "status: %lld fds open", (long long)fds_open);
	json_decref(r);
	t_wexd_stop(&d);

	exhausted(0);
	exhausted(1);
	return T_EXIT_PASS;
}
