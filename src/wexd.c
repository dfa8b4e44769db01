/* SPDX-License-Identifier: MIT */
/*
 * wexd.c - the weight-exchange daemon: one per node, single-threaded, on
 * io_uring (epoll fallback).  It holds metadata, fds, versions and leases;
 * it never touches weight bytes and needs no GPU.
 *
 * Every message is validated before it reaches a handler: size (MSG_TRUNC),
 * control data (MSG_CTRUNC), JSON syntax, protocol version, op, and the
 * number of fds the op takes.  A bad message gets a clear error; the
 * connection stays usable; fds it carried are closed.
 */
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ipc/sock.h"
#include "log.h"
#include "proto.h"
#include "wexd.h"
#ifdef WEX_HAVE_OPS
#include "config.h"
#include "metrics.h"
#include "sdnotify.h"
#endif

const char *wexd_io_backend(struct wexd *d)
{
	return d->loop.ops ? d->loop.ops->name : "none";
}

int wexd_send(struct wexd *d, struct conn *c, json_t *reply, const int *fds, int nfds)
{
	size_t len;
	char *s;
	ssize_t n;

	if (c->dead)
		return -EPIPE;
	s = wex__json_dump(reply, &len);
	if (!s)
		return -ENOMEM;
	n = wex_sock_send(c->io.fd, s, len, fds, nfds, MSG_DONTWAIT);
	free(s);
	if (n < 0) {
		/* A client that does not read its replies is dropped rather than
		 * allowed to stall the loop. */
		wex_warn("conn", "client %llu (pid %d): send failed: %s: dropping",
			 (unsigned long long)c->id, (int)c->pid, strerror((int)-n));
		return (int)n;
	}
	return 0;
}

static void conn_close(struct wexd *d, struct conn *c)
{
	if (c->dead)
		return;
	wexd_conn_drop(d, c);
	c->dead = 1;
	d->loop.ops->close(&d->loop, &c->io);
}

static void on_accept(void *arg, int fd)
{
	struct wexd *d = arg;
	struct conn *c;

	if (d->draining) {
		close(fd);
		return;
	}
	c = calloc(1, sizeof(*c));
	if (!c || wex__loop_io_init(&d->loop, &c->io, fd, c) < 0) {
		wex_error("conn", "out of memory accepting a client");
		free(c);
		close(fd);
		return;
	}
	c->d = d;
	c->id = ++d->next_conn_id;
	c->connected_ns = wex__now_ns();
	if (wex_sock_peercred(fd, &c->pid, &c->uid, &c->gid) < 0) {
		wex_warn("conn", "SO_PEERCRED: %m: refusing client");
		free(c->io.buf);
		free(c);
		close(fd);
		return;
	}
	if (d->loop.ops->add(&d->loop, &c->io) < 0) {
		free(c->io.buf);
		free(c);
		close(fd);
		return;
	}
	c->next = d->conns;
	d->conns = c;
	d->nconns++;
	wex_debug("conn", "client %llu connected: pid %d uid %d gid %d", (unsigned long long)c->id,
		  (int)c->pid, (int)c->uid, (int)c->gid);
}

static void on_free(void *arg, struct wex_loop_io *io)
{
	struct wexd *d = arg;
	struct conn *c = io->owner, **pp;

	for (pp = &d->conns; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	d->nconns--;
	free(c);
}

/* How many fds each op takes: {min, max}. */
static const struct {
	const char *op;
	int min_fds, max_fds;
	int needs_hello;
} ops[] = {
	{ "hello", 0, 0, 0 },          { "status", 0, 0, 0 },       { "models", 0, 0, 0 },
	{ "clients", 0, 0, 0 },        { "plans", 0, 0, 0 },        { "register_segment", 0, 1, 1 },
	{ "register_tensors", 1, 1, 1 }, { "begin_write", 0, 0, 1 }, { "publish", 0, 0, 1 },
	{ "attach", 0, 1, 1 },         { "acquire", 0, 0, 1 },      { "fetch", 0, 0, 1 },
	{ "release", 0, 0, 1 },        { "ping", 0, 0, 0 },
};

static json_t *dispatch(struct wexd *d, struct conn *c, json_t *req, const char *op, int *fds,
			int nfds)
{
	if (!strcmp(op, "hello"))
		return wexd_hello(d, c, req);
	if (!strcmp(op, "ping"))
		return wex__reply_ok();
	if (!strcmp(op, "status"))
		return wexd_status(d, c, req);
	if (!strcmp(op, "models")) {
		json_t *r = wex__reply_ok();

		json_object_set_new(r, "models", wexd_models_json(d));
		return r;
	}
	if (!strcmp(op, "clients")) {
		json_t *r = wex__reply_ok();

		json_object_set_new(r, "clients", wexd_clients_json(d));
		return r;
	}
	if (!strcmp(op, "plans")) {
		json_t *r = wex__reply_ok();

		json_object_set_new(r, "plans", wexd_plans_json(d));
		return r;
	}
	if (!c->role)
		return wex__reply_error(-EPROTO, "%s: say hello first", op);
	if (!strcmp(op, "register_segment"))
		return wexd_register_segment(d, c, req, fds, nfds);
	if (!strcmp(op, "register_tensors"))
		return wexd_register_tensors(d, c, req, fds, nfds);
	if (!strcmp(op, "begin_write"))
		return wexd_begin_write(d, c, req);
	if (!strcmp(op, "publish"))
		return wexd_publish(d, c, req);
	if (!strcmp(op, "attach"))
		return wexd_attach(d, c, req, fds, nfds);
	if (!strcmp(op, "acquire"))
		return wexd_acquire(d, c, req);
	if (!strcmp(op, "fetch"))
		return wexd_fetch(d, c, req);
	if (!strcmp(op, "release"))
		return wexd_release(d, c, req);
	return wex__reply_error(-EOPNOTSUPP, "unknown request '%s'", op);
}

static json_t *validate_and_run(struct wexd *d, struct conn *c, const char *buf, size_t len,
				int *fds, int nfds, int mflags)
{
	json_error_t je;
	json_int_t v;
	json_t *req, *reply;
	const char *op;
	size_t i;

	if (mflags & MSG_TRUNC)
		return wex__reply_error(-EMSGSIZE, "message larger than %zu bytes: send tables as a sealed memfd",
					d->msg_max);
	if (mflags & MSG_CTRUNC)
		return wex__reply_error(-EINVAL, "control data truncated: at most %d fds per message",
					WEX_SOCK_MAX_FDS);
	req = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
	if (!req)
		return wex__reply_error(-EBADMSG, "malformed JSON at line %d column %d: %s", je.line,
					je.column, je.text);
	if (!json_is_object(req)) {
		json_decref(req);
		return wex__reply_error(-EBADMSG, "a request must be a JSON object");
	}
	if (json_unpack_ex(req, &je, 0, "{s:I, s:s}", "v", &v, "op", &op) < 0) {
		json_decref(req);
		return wex__reply_error(-EBADMSG, "request needs integer 'v' and string 'op': %s",
					je.text);
	}
	if (v != WEX_PROTO_VERSION) {
		json_decref(req);
		return wex__reply_error(-WEX_EPROTO_VERSION,
					"protocol version %lld not supported (this wexd speaks %d)",
					(long long)v, WEX_PROTO_VERSION);
	}
	for (i = 0; i < WEX_ARRAY_SIZE(ops); i++)
		if (!strcmp(ops[i].op, op))
			break;
	if (i == WEX_ARRAY_SIZE(ops)) {
		reply = wex__reply_error(-EOPNOTSUPP, "unknown request '%.64s'", op);
		json_decref(req);
		return reply;
	}
	if (nfds < ops[i].min_fds || nfds > ops[i].max_fds) {
		reply = wex__reply_error(-EINVAL, "%s takes %d..%d fds, got %d", op, ops[i].min_fds,
					 ops[i].max_fds, nfds);
		json_decref(req);
		return reply;
	}
	if (d->draining && strcmp(op, "release") && strcmp(op, "publish") && strcmp(op, "status")) {
		json_decref(req);
		return wex__reply_error(-ESHUTDOWN, "wexd is shutting down");
	}
	reply = dispatch(d, c, req, op, fds, nfds);
	json_decref(req);
	return reply;
}

static void on_msg(void *arg, struct wex_loop_io *io, ssize_t len, int *fds, int nfds, int mflags)
{
	struct wexd *d = arg;
	struct conn *c = io->owner;
	json_t *reply;

	if (len <= 0) {
		if (len < 0)
			wex_debug("conn", "client %llu: receive: %s", (unsigned long long)c->id,
				  strerror((int)-len));
		wex_debug("conn", "client %llu (pid %d) disconnected", (unsigned long long)c->id,
			  (int)c->pid);
		wex_sock_close_fds(fds, nfds);
		conn_close(d, c);
		return;
	}
	if (c->waiting) {
		/* One request at a time: a client that sends while waiting is
		 * broken; answer and keep its first request. */
		reply = wex__reply_error(-EBUSY, "a request is already in flight on this connection");
	} else {
		reply = validate_and_run(d, c, io->buf, (size_t)len, fds, nfds, mflags);
	}
	/* Handlers that kept an fd set its slot to -1. */
	wex_sock_close_fds(fds, nfds);
	if (reply) {
		if (wexd_send(d, c, reply, NULL, 0) < 0)
			conn_close(d, c);
		json_decref(reply);
	}
	wexd_service_waiters(d);
}

static void on_signal(void *arg, int fd, int res)
{
	struct wexd *d = arg;
	struct signalfd_siginfo si;

	while (read(fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
		if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
			if (!d->draining) {
				wex_info("wexd", "signal %u: draining (no new requests; in-flight copies finish)",
					 si.ssi_signo);
				d->draining = 1;
				d->drain_deadline_ns = wex__now_ns() + 10ull * 1000000000ull;
				wexd_fail_waiters(d, -ESHUTDOWN, "wexd is shutting down");
#ifdef WEX_HAVE_OPS
				wex__sd_stopping();
#endif
			} else {
				d->stop = 1;
			}
		} else if (si.ssi_signo == SIGHUP) {
			wex_info("wexd", "SIGHUP: reloading configuration");
#ifdef WEX_HAVE_OPS
			wexd_reload(d);
#endif
		}
	}
}

static int drained(struct wexd *d)
{
	for (struct model *m = d->models; m; m = m->next)
		for (struct cgroup *g = m->groups; g; g = g->next)
			for (uint32_t i = 0; i < g->world; i++)
				if (g->ranks[i] && g->ranks[i]->has_lease &&
				    g->ranks[i]->lease_mode == WEX_SYNC_COPY)
					return 0;
	return 1;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: wexd [--socket PATH] [--io auto|io_uring|epoll] [--config FILE]\n"
		   "            [--log-level error|warn|info|debug]\n"
		   "Runs the wex weight-exchange daemon in the foreground.\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, 's' }, { "io", required_argument, NULL, 'i' },
		{ "config", required_argument, NULL, 'c' }, { "log-level", required_argument, NULL, 'l' },
		{ "help", no_argument, NULL, 'h' },          { 0 }
	};
	struct wexd d = { .listen_fd = -1, .sig_fd = -1, .msg_max = WEX_MSG_MAX_DEFAULT,
			  .begin_write_timeout_ms = 30000 };
	const char *io = getenv("WEX_IO"), *sock = NULL, *cfg = NULL, *s;
	char err[512] = "", buf[PATH_MAX];
	sigset_t mask;
	int opt, ret;

	wex__log_init();
	while ((opt = getopt_long(argc, argv, "s:i:c:l:h", lo, NULL)) != -1) {
		switch (opt) {
		case 's':
			sock = optarg;
			break;
		case 'i':
			io = optarg;
			break;
		case 'c':
			cfg = optarg;
			break;
		case 'l':
			if ((ret = wex__log_level_from_name(optarg)) < 0) {
				fprintf(stderr, "wexd: --log-level '%s' unknown\n", optarg);
				return 2;
			}
			wex__log_level = ret;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "wexd: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if ((s = getenv("WEX_BEGIN_WRITE_TIMEOUT_MS")))
		d.begin_write_timeout_ms = (uint32_t)strtoul(s, NULL, 10);
	snprintf(d.config_source, sizeof(d.config_source), "defaults+env");
#ifdef WEX_HAVE_OPS
	if (wexd_config_init(&d, cfg, sock, io, err, sizeof(err)) < 0) {
		fprintf(stderr, "wexd: %s\n", err);
		return 2;
	}
	io = wexd_config_io(&d);
	sock = d.socket_path;
#else
	if (cfg) {
		fprintf(stderr, "wexd: --config needs a build with the configuration module\n");
		return 2;
	}
	if (!sock)
		sock = wex__default_socket(buf, sizeof(buf));
	snprintf(d.socket_path, sizeof(d.socket_path), "%s", sock);
#endif
	(void)buf;
	d.start_ns = wex__now_ns();
	ret = wex__loop_init(&d.loop, io, d.msg_max, err, sizeof(err));
	if (ret < 0) {
		wex_error("wexd", "event loop: %s", err);
		return 1;
	}
	d.loop.cbs.on_accept = on_accept;
	d.loop.cbs.on_msg = on_msg;
	d.loop.cbs.on_free = on_free;
	d.loop.arg = &d;

#ifdef WEX_HAVE_OPS
	d.listen_fd = wex__sd_listen_fd();
#endif
	if (d.listen_fd >= 0) {
		wex_info("wexd", "using the socket passed by systemd (fd %d)", d.listen_fd);
	} else {
		int mode = 0660;
		gid_t gid = (gid_t)-1;

#ifdef WEX_HAVE_OPS
		wexd_config_socket(&d, &mode, &gid);
#endif
		d.listen_fd = wex_sock_listen(d.socket_path, mode, gid);
		if (d.listen_fd < 0) {
			wex_error("wexd", "cannot listen on %s: %s", d.socket_path,
				  strerror(-d.listen_fd));
			return 1;
		}
		d.socket_owned = 1;
	}
	d.listener.fd = d.listen_fd;
	if ((ret = d.loop.ops->listen(&d.loop, &d.listener)) < 0) {
		wex_error("wexd", "listen: %s", strerror(-ret));
		return 1;
	}
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	d.sig_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	d.sigw.fd = d.sig_fd;
	d.sigw.cb = on_signal;
	d.sigw.arg = &d;
	if (d.sig_fd < 0 || d.loop.ops->watch(&d.loop, &d.sigw) < 0) {
		wex_error("wexd", "signalfd: %m");
		return 1;
	}
	wex_info("wexd", "listening on %s (event loop: %s%s%s)", d.socket_path, wexd_io_backend(&d),
		 d.loop.why_fallback[0] ? ", " : "", d.loop.why_fallback);
#ifdef WEX_HAVE_OPS
	wex__sd_ready();
#endif
	/* Tests and scripts wait for this line rather than sleeping. */
	if ((s = getenv("WEXD_READY_FD"))) {
		int fd = atoi(s);

		(void)!write(fd, "ready\n", 6);
		close(fd);
	}
	while (!d.stop) {
		int timeout = wexd_service_waiters(&d);

		if (timeout < 0 || timeout > 1000)
			timeout = 1000;
#ifdef WEX_HAVE_OPS
		wexd_tick(&d);
#endif
		if (d.draining) {
			if (drained(&d) || wex__now_ns() >= d.drain_deadline_ns)
				break;
			if (timeout > 100)
				timeout = 100;
		}
		ret = d.loop.ops->run_once(&d.loop, timeout);
		if (ret < 0) {
			wex_error("wexd", "event loop: %s", strerror(-ret));
			d.exit_code = 1;
			break;
		}
	}
	wex_info("wexd", "stopping: %u client(s) told by disconnect", d.nconns);
	for (struct conn *c = d.conns; c; c = c->next)
		conn_close(&d, c);
	/* io_uring frees a connection only once its cancelled receive is back. */
	for (int i = 0; i < 100 && d.nconns; i++)
		d.loop.ops->run_once(&d.loop, 10);
	if (d.socket_owned)
		unlink(d.socket_path);
	close(d.listen_fd);
	close(d.sig_fd);
	d.loop.ops->fini(&d.loop);
	return d.exit_code;
}
