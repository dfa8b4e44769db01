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
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <linux/sockios.h>

#include "ipc/sock.h"
#include "log.h"
#include "proto.h"
#include "wexd.h"
#include "config.h"
#include "metrics.h"
#include "sdnotify.h"

static void wexd_take_report(struct conn *c, json_t *r);
static json_t *wexd_metrics(struct wexd *d);
static json_t *wexd_config_req(struct wexd *d, struct conn *c, json_t *req, const char *op);
static int wexd_reload(struct wexd *d, json_t **report, char *err, size_t errlen);
static void wexd_tick(struct wexd *d);
static void wexd_watchdog(struct wexd *d);

const char *wexd_io_backend(struct wexd *d)
{
	return d->loop.ops ? d->loop.ops->name : "none";
}

/* Bytes of earlier messages to c that its client has not read yet (0 if
 * the kernel cannot say). */
static int conn_unread(const struct conn *c)
{
	int n = 0;

	return ioctl(c->io.fd, SIOCOUTQ, &n) < 0 ? 0 : n;
}

int wexd_send(struct wexd *d, struct conn *c, json_t *reply, const int *fds, int nfds)
{
	size_t len;
	char *s;
	ssize_t n;
	int unread = 0;

	if (c->dead || c->dropping)
		return -EPIPE;
	if (json_is_false(json_object_get(reply, "ok")))
		wex__metrics_count(WEX_M_ERRORS,
				   json_string_value(json_object_get(json_object_get(reply, "error"), "code")),
				   NULL, 1);
	if (c->role == WEX_ROLE_PRODUCER && json_object_get(reply, "waited_ms"))
		wex__metrics_observe(WEX_M_BEGIN_WRITE_WAIT, NULL,
				     json_real_value(json_object_get(reply, "waited_ms")) / 1e3);
	s = wex__json_dump(reply, &len);
	if (!s)
		return -ENOMEM;
	/* A reply that passes fds goes only to a client that has read its
	 * earlier replies (as every client of this protocol does before its
	 * next request): each unread one pins what it passes, in the
	 * client's socket, for as long as the client keeps it, even once
	 * dropped (a sealed memfd of a whole status made for it, hundreds
	 * per connection; a fetch's segment fds, counted against the file
	 * limit of wexd's user while in flight). */
	if (nfds && (unread = conn_unread(c)) > 0)
		n = -EAGAIN;
	else
		n = wex_sock_send(c->io.fd, s, len, fds, nfds, MSG_DONTWAIT);
	if (n == -EMSGSIZE && !nfds && len <= WEX_REPLY_MAX) {
		/* Larger than one message on this socket can be (its send
		 * buffer, about 208 KiB by default): a status listing of a few
		 * hundred clients.  It goes whole in a sealed memfd, and the
		 * message says so: a reply that passes an fd, as above. */
		int mfd = (unread = conn_unread(c)) > 0 ? -1 : wex_table_seal(s, len, "wex-reply");

		if (unread > 0) {
			n = -EAGAIN;
		} else if (mfd >= 0) {
			static const char note[] = "{\"ok\":true,\"reply_in_fd\":true}";

			n = wex_sock_send(c->io.fd, note, sizeof(note) - 1, &mfd, 1, MSG_DONTWAIT);
			close(mfd);
		}
	}
	free(s);
	if (n == -EMSGSIZE) {
		/* Not even so (a reply with fds of its own, or no memfd): the
		 * client gets a clear error and keeps its connection. */
		json_t *e = wex__reply_error(-EMSGSIZE,
					     "reply of %zu bytes is larger than one message can carry",
					     len);

		wex__metrics_count(WEX_M_ERRORS, "EMSGSIZE", NULL, 1);
		s = e ? wex__json_dump(e, &len) : NULL;
		json_decref(e);
		if (!s)
			return -ENOMEM;
		n = wex_sock_send(c->io.fd, s, len, NULL, 0, MSG_DONTWAIT);
		free(s);
	}
	if (n < 0) {
		/* A client that does not read its replies is dropped rather than
		 * allowed to stall the loop, and a reply that cannot go out must
		 * not leave its client waiting for it: shutting the socket down
		 * ends the client's wait at once (EOF), and the loop's receive
		 * sees the same EOF and closes the connection, wherever the
		 * reply came from (a request, a deferred wait, a fetch). */
		/* A client gone before its reply (killed, or a script that
		 * does not wait) is no news at warn level: thousands a second
		 * under a flood. */
		if (n == -EPIPE || n == -ECONNRESET)
			wex_debug("conn", "client %llu (pid %d): gone before its reply: %s",
				  (unsigned long long)c->id, (int)c->pid, strerror((int)-n));
		else if (n == -EAGAIN)
			wex_warn("conn", "client %llu (pid %d): does not read its replies (%d bytes "
				 "of them unread): dropping", (unsigned long long)c->id, (int)c->pid,
				 unread ? unread : conn_unread(c));
		else
			wex_warn("conn", "client %llu (pid %d): send failed: %s: dropping",
				 (unsigned long long)c->id, (int)c->pid, strerror((int)-n));
		shutdown(c->io.fd, SHUT_RDWR);
		c->dropping = 1;
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
	d->nclosed++;
	d->loop.ops->close(&d->loop, &c->io);
}

/*
 * The client's process exited.  Its socket closes with it unless another
 * process holds it too: a child made with clone() without fork's handlers
 * (libwex closes its connections in a fork()ed child), or an fd passed on.
 * Either way the process that connected, whose leases and ranks these
 * are, is gone: they go now, not when the last holder of the socket does.
 */
static void on_peer_exit(void *arg, struct wex_loop_io *io)
{
	struct wexd *d = arg;
	struct conn *c = io->owner;
	struct pollfd p = { .fd = c->io.fd, .events = POLLRDHUP };

	if (c->dead)
		return;
	if (poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR)))
		wex_debug("conn", "client %llu (pid %d) exited", (unsigned long long)c->id,
			  (int)c->pid);
	else
		wex_warn("conn", "client %llu: its process (pid %d) exited but another process "
			 "still holds its connection (a child made with clone(), an fd passed "
			 "on): closed, its ranks and leases released", (unsigned long long)c->id,
			 (int)c->pid);
	conn_close(d, c);
}

/*
 * Closes c if its client has already hung up or its process exited (or a
 * reply to it could not go out) and wexd has not yet taken that in.  A
 * process restarted right after its predecessor died says hello on a new
 * connection, and nothing orders that message after the old connection's
 * end of file or its process's exit: without this the new process was
 * refused its rank (EADDRINUSE, "held by pid N") by a connection whose
 * process was already gone.  Returns 1 if it closed c (whose model may
 * then be gone too), else 0.
 */
int wexd_conn_close_if_gone(struct wexd *d, struct conn *c)
{
	/* A pidfd of -1 (not watched) is left out by poll. */
	struct pollfd p[2] = { { .fd = c->io.fd, .events = POLLRDHUP },
			       { .fd = c->io.pid.fd, .events = POLLIN } };

	if (c->dead)
		return 0;
	if (!c->dropping && poll(p, 2, 0) > 0 && (p[1].revents & POLLIN)) {
		on_peer_exit(d, &c->io);
		return 1;
	}
	if (!c->dropping && !(p[0].revents & (POLLHUP | POLLRDHUP | POLLERR)))
		return 0;
	wex_debug("conn", "client %llu (pid %d) hung up before wexd saw it: closed",
		  (unsigned long long)c->id, (int)c->pid);
	conn_close(d, c);
	return 1;
}

/* Closes a connection wexd does not take, first leaving it one message
 * that says why (never waiting): the client reads it as its hello's
 * answer, instead of guessing from the hang-up. */
static void refuse_conn(int fd, json_t *reply)
{
	size_t len;
	char *s;

	/* (Marked: libwex words it as a refusal whichever way it reads it.) */
	if (reply)
		json_object_set_new(reply, "refused", json_true());
	s = reply ? wex__json_dump(reply, &len) : NULL;

	if (s)
		(void)wex_sock_send(fd, s, len, NULL, 0, MSG_DONTWAIT);
	free(s);
	json_decref(reply);
	close(fd);
}

/* Connections of user uid open now (max_clients_per_uid). */
static uint64_t clients_of(const struct wexd *d, uid_t uid)
{
	uint64_t n = 0;

	for (const struct conn *c = d->conns; c; c = c->next)
		n += !c->dead && c->uid == uid;
	return n;
}

static void on_accept(void *arg, int fd)
{
	struct wexd *d = arg;
	const char *how;
	struct conn *c;
	pid_t pid = 0;
	uid_t uid;
	gid_t gid;
	int pfd;

	if (d->draining) {
		wex__metrics_count(WEX_M_REFUSED, "draining", NULL, 1);
		refuse_conn(fd, wex__reply_error(-ESHUTDOWN, "wexd is shutting down (SIGTERM): it takes "
						 "no new client"));
		return;
	}
	if (wex_sock_peercred(fd, &pid, &uid, &gid) < 0) {
		wex_warn("conn", "SO_PEERCRED: %m: refusing client");
		close(fd);
		return;
	}
	/* Root and wexd's own user get a few connections past the limit:
	 * wexctl (status, config reload: systemd's ExecReload) must reach
	 * wexd when max_clients is reached, to raise it. */
	if (d->cfg.max_clients > 0 &&
	    wexd_clients(d) >= (uint64_t)d->cfg.max_clients +
				  (uid == 0 || uid == geteuid() ? WEXD_ADMIN_RESERVE : 0)) {
		wex__metrics_count(WEX_M_REFUSED, "max_clients", NULL, 1);
		/* Once per 1000: a connection flood cannot flood the log. */
		if (d->max_clients_refused++ % 1000 == 0)
			wex_warn("conn", "refusing a client: max_clients %lld reached (%llu refused so "
				 "far, logged once per 1000)", (long long)d->cfg.max_clients,
				 (unsigned long long)d->max_clients_refused);
		refuse_conn(fd, wex__reply_error(-EBUSY, "wexd refuses new clients: max_clients %lld "
						 "are connected (raise max_clients, or close idle ones)",
						 (long long)d->cfg.max_clients));
		return;
	}
	if (d->cfg.max_clients_per_uid > 0 && uid != 0 && uid != geteuid() &&
	    clients_of(d, uid) >= (uint64_t)d->cfg.max_clients_per_uid) {
		wex__metrics_count(WEX_M_REFUSED, "max_clients_per_uid", NULL, 1);
		if (d->per_uid_refused++ % 1000 == 0)
			wex_warn("conn", "refusing a client of uid %u (pid %d): it holds "
				 "max_clients_per_uid %lld connections (%llu refused so far, logged "
				 "once per 1000)", (unsigned)uid, (int)pid,
				 (long long)d->cfg.max_clients_per_uid,
				 (unsigned long long)d->per_uid_refused);
		refuse_conn(fd, wex__reply_error(-EBUSY, "wexd refuses new clients of uid %u: it "
						 "holds max_clients_per_uid %lld connections (raise "
						 "max_clients_per_uid, or close idle ones)",
						 (unsigned)uid, (long long)d->cfg.max_clients_per_uid));
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
	c->lease_fd = -1;
	c->id = ++d->next_conn_id;
	c->connected_ns = wex__now_ns();
	c->pid = pid;
	c->uid = uid;
	c->gid = gid;
	c->ngroups = wex_sock_peergroups(fd, &c->groups);
	if (c->ngroups < 0)
		c->ngroups = -1;
	pfd = wex_sock_peer_pidfd(fd, c->pid, &how);
	if (pfd == -EMFILE || pfd == -ENFILE) {
		/* As for the socket itself: no fd for it, no client. */
		wex__metrics_count(WEX_M_REFUSED, "fds", NULL, 1);
		if (d->pidfd_refused++ % 1000 == 0)
			wex_warn("conn", "refusing a client: no file descriptor left for its pidfd "
				 "(%s; %llu refused so far, logged once per 1000): raise "
				 "max_open_files or LimitNOFILE=", strerror(-pfd),
				 (unsigned long long)d->pidfd_refused);
		free(c->io.buf);
		free(c->groups);
		free(c);
		refuse_conn(fd, wex__reply_error(-EMFILE, "wexd is out of file descriptors: raise "
						 "max_open_files or LimitNOFILE="));
		return;
	}
	if (d->loop.ops->add(&d->loop, &c->io) < 0) {
		if (pfd >= 0)
			close(pfd);
		free(c->io.buf);
		free(c->groups);
		free(c);
		close(fd);
		return;
	}
	c->next = d->conns;
	d->conns = c;
	d->nconns++;
	wex_debug("conn", "client %llu connected: pid %d uid %d gid %d", (unsigned long long)c->id,
		  (int)c->pid, (int)c->uid, (int)c->gid);
	if (pfd >= 0 && (pfd = d->loop.ops->watch_pid(&d->loop, &c->io, pfd)) < 0)
		wex_warn("conn", "client %llu (pid %d): cannot watch its process (%s): its ranks and "
			 "leases go when its socket closes", (unsigned long long)c->id, (int)c->pid,
			 strerror(-pfd));
	else if (pfd == -ESRCH)
		/* Exited before wexd took its connection in. */
		on_peer_exit(d, &c->io);
	else if (pfd < 0)
		/* Shown in status (clients' exit_watched); wexd warned at
		 * start if no client can be watched. */
		wex_debug("conn", "client %llu (pid %d): its process is not watched (%s: %s)",
			  (unsigned long long)c->id, (int)c->pid, how, strerror(-pfd));
}

/* The probe at start: how clients' processes will be watched (a
 * socketpair's peer is wexd itself). */
static void probe_exit_watch(struct wexd *d)
{
	const char *how = "socketpair";
	int sv[2], pfd;

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		pfd = -errno;
	} else {
		pfd = wex_sock_peer_pidfd(sv[0], getpid(), &how);
		close(sv[0]);
		close(sv[1]);
	}
	if (pfd >= 0) {
		close(pfd);
		snprintf(d->exit_watch, sizeof(d->exit_watch), "%s", how);
		return;
	}
	snprintf(d->exit_watch, sizeof(d->exit_watch), "none: %s: %s", how, strerror(-pfd));
	wex_warn("wexd", "cannot watch clients' processes (%s: %s): a client whose socket "
		 "outlives its process (a child made with clone() without fork, an fd passed "
		 "on) keeps its ranks and leases until that socket closes", how, strerror(-pfd));
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
	if (c->dead)
		d->nclosed--;
	free(c->groups);
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
	{ "release", 0, 0, 1 },        { "ping", 0, 0, 0 },         { "metrics", 0, 0, 0 },
	{ "config_get", 0, 0, 0 },     { "config_set", 0, 0, 0 },   { "verify", 0, 0, 0 },
	{ "cancel", 0, 0, 0 },         { "config_reload", 0, 0, 0 },
};

static json_t *dispatch(struct wexd *d, struct conn *c, json_t *req, const char *op, int *fds,
			int nfds)
{
	if (!strcmp(op, "hello")) {
		const char *role = "", *model = "";

		/* Access control: SO_PEERCRED's uid/gid against the model's
		 * allow lists, before anything is registered. */
		json_unpack(req, "{s?s, s?s}", "role", &role, "model", &model);
		if (!c->role && model && (!strcmp(role, "producer") || !strcmp(role, "consumer")) &&
		    !wexd_allowed(d, c, model,
				  !strcmp(role, "producer") ? WEX_ROLE_PRODUCER : WEX_ROLE_CONSUMER))
			return wex__reply_error(-EACCES, "uid %d may not be a %s of model '%s'",
						(int)c->uid, role, model);
		return wexd_hello(d, c, req);
	}
	if (!strcmp(op, "cancel"))
		return NULL; /* nothing waits (wexd_cancel): no reply */
	if (!strcmp(op, "ping"))
		return wex__reply_ok();
	/* What they show of leases from before this wexd is current. */
	if (!strcmp(op, "status") || !strcmp(op, "models") || !strcmp(op, "metrics")) {
		wexd_held_check(d);
		wexd_journal_check(d);
	}
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
	if (!strcmp(op, "metrics"))
		return wexd_metrics(d);
	if (!strcmp(op, "verify"))
		return wexd_verify(d, c, req);
	if (!strcmp(op, "config_get") || !strcmp(op, "config_set") || !strcmp(op, "config_reload"))
		return wexd_config_req(d, c, req, op);
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

	/* The buffer holds one byte more than the limit, so a message of
	 * exactly limit + 1 bytes arrives whole: check the length too. */
	if ((mflags & MSG_TRUNC) || len > d->msg_max)
		return wex__reply_error(-EMSGSIZE, "message larger than %zu bytes: send tables as a sealed memfd",
					d->msg_max);
	if (mflags & MSG_CTRUNC) {
		/* The kernel drops the fds it cannot install: wexd is out of
		 * them (or the message carried too many). */
		long open = wexd_fds_open();

		if (open >= 0 && (uint64_t)open + 8 >= d->fd_limit)
			return wex__reply_error(-EMFILE,
						"wexd is out of file descriptors (%ld open, limit %llu): "
						"the fds of this message were dropped; raise "
						"max_open_files or LimitNOFILE=",
						open, (unsigned long long)d->fd_limit);
		return wex__reply_error(-EINVAL, "control data truncated: at most %d fds per message",
					WEX_SOCK_MAX_FDS);
	}
	req = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
	if (!req && je.line < 1) /* (jansson's -1: no position to give) */
		return wex__reply_error(-EBADMSG, "malformed JSON: %s", je.text);
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
	/* Received, whatever its answer: a request refused below (its fds, a
	 * drain) counts here as its error does in wex_errors_total. */
	wex__metrics_count(WEX_M_REQUESTS, op, NULL, 1);
	if (nfds < ops[i].min_fds || nfds > ops[i].max_fds) {
		reply = wex__reply_error(-EINVAL, "%s takes %d..%d fds, got %d", op, ops[i].min_fds,
					 ops[i].max_fds, nfds);
		json_decref(req);
		return reply;
	}
	/* acquire refuses itself while draining, saying whether a held lease
	 * stands (wexd_acquire).  A copy in flight still fetches (its acquire
	 * was answered: the drain waits for it).  A producer's begin_write is
	 * taken as ever, answered or left waiting: at wexd's exit libwex
	 * sends it again to the next wexd (as after a crash), and a trainer
	 * rides through a restart. */
	if (d->draining && strcmp(op, "release") && strcmp(op, "publish") && strcmp(op, "status") &&
	    strcmp(op, "acquire") && strcmp(op, "cancel") && strcmp(op, "fetch") &&
	    strcmp(op, "begin_write")) {
		json_decref(req);
		return wex__reply_error(-ESHUTDOWN, "wexd is shutting down");
	}
	/* Clients report their finished syncs on their next request. */
	wexd_take_report(c, json_object_get(req, "report"));
	reply = dispatch(d, c, req, op, fds, nfds);
	json_decref(req);
	return reply;
}

/* The client hung up (its end of the connection is closed). */
static int peer_hung_up(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLRDHUP };

	return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* The client closed its end (or shut both directions down, as libwex does
 * before it closes): not a half-close (SHUT_WR), after which a client
 * (socat, say) still reads the answer. */
static int peer_closed(int fd)
{
	struct pollfd p = { .fd = fd, .events = 0 };

	return poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR));
}

/* A well-formed {"v":WEX_PROTO_VERSION, "op":"cancel"}, without fds. */
static int is_cancel(const char *buf, size_t len, int nfds, int mflags)
{
	json_int_t v = 0;
	const char *op = NULL;
	json_t *req;
	int yes;

	if (nfds || (mflags & (MSG_TRUNC | MSG_CTRUNC)))
		return 0;
	req = json_loadb(buf, len, JSON_REJECT_DUPLICATES, NULL);
	yes = req && !json_unpack(req, "{s:I, s:s}", "v", &v, "op", &op) &&
	      v == WEX_PROTO_VERSION && !strcmp(op, "cancel");
	json_decref(req);
	return yes;
}

static void on_msg(void *arg, struct wex_loop_io *io, ssize_t len, int *fds, int nfds, int mflags)
{
	struct wexd *d = arg;
	struct conn *c = io->owner;
	json_t *reply;

	wexd_watchdog(d);
	/* SOCK_SEQPACKET carries empty messages: 0 is the end only when the
	 * client hung up (an empty one is answered, as any bad message).
	 * A request from a client that closed since it sent it is not run:
	 * libwex closes a connection with a request in flight only where it
	 * gave the answer up (none past the request's timeout, or past the
	 * grace after a signal or wex_cancel), and running it would do what
	 * the caller was told failed, once per abandoned connection when a
	 * stalled wexd goes on. */
	if (len == 0 && !c->dropping && !peer_hung_up(c->io.fd)) {
		reply = wex__reply_error(-EBADMSG, "empty message");
	} else if (len <= 0 || c->dropping || peer_closed(c->io.fd)) {
		if (len > 0)
			wex_debug("conn", "client %llu (pid %d) hung up: its last request is not run",
				  (unsigned long long)c->id, (int)c->pid);
		if (len < 0)
			wex_debug("conn", "client %llu: receive: %s", (unsigned long long)c->id,
				  strerror((int)-len));
		wex_debug("conn", "client %llu (pid %d) disconnected", (unsigned long long)c->id,
			  (int)c->pid);
		wex_sock_close_fds_nowait(fds, nfds);
		conn_close(d, c);
		return;
	} else if (c->waiting && is_cancel(io->buf, (size_t)len, nfds, mflags)) {
		/* Its answer is the waiting request's. */
		wex__metrics_count(WEX_M_REQUESTS, "cancel", NULL, 1);
		reply = wexd_cancel(d, c);
	} else if (c->waiting) {
		/* One request at a time: a client that sends while waiting is
		 * broken; answer and keep its first request. */
		reply = wex__reply_error(-EBUSY, "a request is already in flight on this connection");
	} else {
		reply = validate_and_run(d, c, io->buf, (size_t)len, fds, nfds, mflags);
	}
	/* Handlers that kept an fd set its slot to -1. */
	wex_sock_close_fds_nowait(fds, nfds);
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
				/* Under socket activation the socket outlives
				 * us: clients that connect now wait in its
				 * backlog for the next wexd instead of being
				 * refused. */
				if (!d->socket_owned)
					d->loop.ops->unlisten(&d->loop, &d->listener);
				d->drain_deadline_ns =
					wex__now_ns() + (uint64_t)d->cfg.drain_timeout_ms * 1000000ull;
				/* (Consumers' syncs; producers' begin_writes wait on.) */
				wexd_fail_waiters(d, -ESHUTDOWN, "wexd is shutting down");
				wex__sd_stopping();
			} else {
				d->stop = 1;
			}
		} else if (si.ssi_signo == SIGHUP && d->draining) {
			/* As wexctl config reload is refused then: systemd
			 * ignores a RELOADING= of a unit that is stopping. */
			wex_info("wexd", "SIGHUP while draining: configuration not reloaded (wexd is stopping)");
		} else if (si.ssi_signo == SIGHUP) {
			char err[512];

			wex_info("wexd", "SIGHUP: reloading configuration");
			wexd_reload(d, NULL, err, sizeof(err));
		}
	}
}

/* Copy leases still held: the copies a drain waits for. */
static unsigned copies_in_flight(struct wexd *d)
{
	unsigned n = 0;

	for (struct model *m = d->models; m; m = m->next)
		for (struct cgroup *g = m->groups; g; g = g->next)
			for (uint32_t i = 0; i < g->world; i++)
				n += g->ranks[i] && g->ranks[i]->has_lease &&
				     g->ranks[i]->lease_mode == WEX_SYNC_COPY;
	return n;
}

static int drained(struct wexd *d)
{
	return !copies_in_flight(d);
}

#ifndef WEX_VERSION_STRING
#define WEX_VERSION_STRING "0.1.0"
#endif

int wexd_allowed(struct wexd *d, struct conn *c, const char *model, int role)
{
	if (wex__config_allowed(&d->cfg, model, role, c->uid, c->gid, c->groups, c->ngroups))
		return 1;
	wex__metrics_count(WEX_M_REFUSED, "access", NULL, 1);
	/* Logged once per connection: a refused peer cannot flood the log. */
	if (!c->refused_logged)
		wex_warn("access", "refused uid %d gid %d pid %d as %s of model '%s'", (int)c->uid,
			 (int)c->gid, (int)c->pid, role == WEX_ROLE_PRODUCER ? "producer" : "consumer",
			 model);
	c->refused_logged = 1;
	return 0;
}

static int one_of(const char *s, const char *const *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(s, v[i]))
			return 1;
	return 0;
}

/* The weaker paths (WEX_FB_*) a consumer's sync ran on: counted, kept for
 * status, and logged the first time each is seen on a connection. */
static void wexd_take_fallbacks(struct conn *c, const char *mode, unsigned fb)
{
	for (int i = 0; i < WEX_FB_COUNT; i++) {
		if (!(fb & (1u << i)))
			continue;
		wex__metrics_count(WEX_M_FALLBACKS, wex__fallback_name(i), NULL, 1);
		if (!(c->fallbacks & (1u << i)))
			wex_warn("wexd", "client %llu (pid %d, model '%s', group '%s', rank %u): a %s sync ran on a fallback: %s (wexctl status lists it)",
				 (unsigned long long)c->id, (int)c->pid, c->model->name,
				 c->group ? c->group->name : "", c->rank, mode,
				 wex__fallback_name(i));
	}
	c->fallbacks |= fb;
}

/* A consumer's report of its last finished sync, counted in the sync
 * metrics.  Only consumers sync: anything else, an unknown mode or backend
 * (labels are a closed set, so no client can add series) or more bytes
 * than its model ever exported is dropped.  The bound is the model's peak,
 * not what it exports now: the report comes with the consumer's next
 * request, which may find its producer gone. */
static void wexd_take_report(struct conn *c, json_t *r)
{
	static const char *const modes[] = { "copy", "remap-view", "remap-fixed" };
	static const char *const backends[] = { "host", "cuda_vmm", "cuda_ipc" };
	const char *mode = NULL, *backend = "host";
	json_int_t bytes = 0;
	double secs = 0;

	if (!r || c->role != WEX_ROLE_CONSUMER || !c->model ||
	    json_unpack(r, "{s:s, s?s, s:I, s:F}", "mode", &mode, "backend", &backend, "bytes",
			&bytes, "seconds", &secs) < 0 || !one_of(mode, modes, WEX_ARRAY_SIZE(modes)))
		return;
	/* A verification (wexctl verify) answered with this sync. */
	wexd_verify_take(c, mode, json_object_get(r, "verify"));
	if (!one_of(backend, backends, WEX_ARRAY_SIZE(backends)) || bytes < 0 ||
	    (uint64_t)bytes > c->model->bytes_peak || !(secs >= 0 && secs <= 86400))
		return;
	wex__metrics_sync(mode, backend, (uint64_t)bytes, secs);
	wexd_take_fallbacks(c, mode, wex__fallbacks_parse(json_object_get(r, "fallbacks")));
}

static json_t *wexd_metrics(struct wexd *d)
{
	uint64_t leases = 0, segs = 0, bytes = 0, models = 0;
	json_t *r;
	char *text;

	for (struct model *m = d->models; m; m = m->next, models++) {
		leases += m->leases;
		for (uint32_t i = 0; i < m->world; i++) {
			segs += m->ranks[i].nsegs;
			bytes += m->ranks[i].bytes;
		}
	}
	wex__metrics_set(WEX_M_CLIENTS, (double)wexd_clients(d));
	wex__metrics_set(WEX_M_LEASES, (double)leases);
	wex__metrics_set(WEX_M_SEGMENTS, (double)segs);
	wex__metrics_set(WEX_M_EXPORTED, (double)bytes);
	wex__metrics_set(WEX_M_MODELS, (double)models);
	text = wex__metrics_render();
	if (!text)
		return wex__reply_error(-ENOMEM, "metrics: out of memory");
	r = json_pack("{s:b, s:s}", "ok", 1, "text", text);
	free(text);
	return r;
}

/* The label values an operator alerts on, exposed at 0 from the start: a
 * series born at 1 (the first refused reload, the first EBADR) is one that
 * increase() and rate() never see rise, so the alert would miss it. */
static void metrics_declare(void)
{
	static const struct {
		enum wex_counter c;
		const char *label;
	} known[] = {
		{ WEX_M_RELOADS, "ok" },         { WEX_M_RELOADS, "refused" },
		{ WEX_M_REFUSED, "access" },     { WEX_M_REFUSED, "max_clients" },
		{ WEX_M_REFUSED, "max_clients_per_uid" },
		{ WEX_M_REFUSED, "draining" },   { WEX_M_REFUSED, "fds" },
		{ WEX_M_REFUSED, "config" },     { WEX_M_REFUSED, "verify" },
		{ WEX_M_LOOP_RETRIES, "EAGAIN" }, { WEX_M_LOOP_RETRIES, "EBUSY" },
		{ WEX_M_LOOP_RETRIES, "EBADR" }, { WEX_M_LOOP_RETRIES, "no_sqe" },
		{ WEX_M_VERIFIES, "equal" },     { WEX_M_VERIFIES, "differ" },
		{ WEX_M_VERIFIES, "unverifiable" }, { WEX_M_VERIFIES, "failed" },
	};

	for (size_t i = 0; i < WEX_ARRAY_SIZE(known); i++)
		wex__metrics_count(known[i].c, known[i].label, NULL, 0);
}

/* What status says the configuration came from (the file may come or go
 * between reloads). */
static void set_config_source(struct wexd *d)
{
	if (d->cfg.path && access(d->cfg.path, R_OK) == 0)
		snprintf(d->config_source, sizeof(d->config_source), "%s", d->cfg.path);
	else
		snprintf(d->config_source, sizeof(d->config_source), "defaults (no %s)",
			 d->cfg.path ? d->cfg.path : "file");
}

static void apply_config(struct wexd *d)
{
	wex__log_level = d->cfg.log_level;
	d->begin_write_timeout_ms = (uint32_t)d->cfg.begin_write_timeout_ms;
	d->sync_timeout_ms = (uint32_t)d->cfg.sync_timeout_ms;
	wexd_plan_config(d);
}

static json_t *wexd_config_req(struct wexd *d, struct conn *c, json_t *req, const char *op)
{
	const char *name = NULL, *value = NULL;
	char err[512] = "";
	json_t *all, *r, *fields;
	json_error_t je;
	const char *k;
	json_t *v;
	int ret;

	/* (A name of another type read as none: config get answered every
	 * field, config set said a value given as a number was missing.) */
	if (json_unpack_ex(req, &je, 0, "{s?s, s?s}", "name", &name, "value", &value) < 0)
		return wex__reply_error(-EINVAL, "%s: %s (name and value are strings)", op,
					je.text);
	if (!strcmp(op, "config_reload")) {
		json_t *report = NULL;

		/* As SIGHUP, answered: wexctl config reload (systemd's
		 * ExecReload) fails when the file is refused. */
		if (c->uid != 0 && c->uid != geteuid()) {
			wex__metrics_count(WEX_M_REFUSED, "config", NULL, 1);
			return wex__reply_error(-EACCES, "config reload: uid %d may not change wexd's configuration",
						(int)c->uid);
		}
		wex_info("wexd", "reloading configuration, asked by uid %d pid %d", (int)c->uid,
			 (int)c->pid);
		ret = wexd_reload(d, &report, err, sizeof(err));
		if (ret < 0)
			return wex__reply_error(ret, "reload refused, keeping the running configuration: %s",
						err);
		r = wex__reply_ok();
		/* "": no file there (defaults and environment), as status says. */
		json_object_set_new(r, "file", json_string(d->cfg.path && d->cfg.file_found ?
								   d->cfg.path : ""));
		json_object_update(r, report);
		json_decref(report);
		return r;
	}
	if (!strcmp(op, "config_set")) {
		/* Changing the daemon is for its owner and root only. */
		if (c->uid != 0 && c->uid != geteuid()) {
			wex__metrics_count(WEX_M_REFUSED, "config", NULL, 1);
			return wex__reply_error(-EACCES, "config set: uid %d may not change wexd's configuration",
						(int)c->uid);
		}
		if (!name || !value)
			return wex__reply_error(-EINVAL, "config set needs 'name' and 'value'");
		ret = wex__config_set(&d->cfg, name, value, err, sizeof(err));
		if (ret < 0)
			return wex__reply_error(ret, "%s", err);
		apply_config(d);
		wex_info("config", "'%s' set to %s at run time by uid %d", name, value, (int)c->uid);
	}
	all = wex__config_to_json(&d->cfg);
	if (!all)
		return wex__reply_error(-ENOMEM, "config: out of memory");
	if (name && !json_object_get(all, name)) {
		json_decref(all);
		wex__config_unknown_field(name, err, sizeof(err));
		return wex__reply_error(-ENOENT, "config get: field '%s': %s", name, err);
	}
	/* "": no file there (defaults and environment), as status says. */
	r = json_pack("{s:b, s:s}", "ok", 1, "file",
		      d->cfg.path && d->cfg.file_found ? d->cfg.path : "");
	fields = json_array();
	json_object_foreach(all, k, v) {
		if (name && strcmp(k, name))
			continue;
		json_object_set_new(v, "name", json_string(k));
		json_array_append(fields, v);
	}
	json_object_set_new(r, "fields", fields);
	json_decref(all);
	return r;
}

/* A reload may take access away: a producer or consumer admitted under the
 * old allow lists that the new ones refuse is disconnected (its leases and
 * registrations go as for any client that leaves) and logged; connecting
 * again, it is refused with EACCES. */
static void recheck_access(struct wexd *d)
{
	for (struct conn *c = d->conns; c; c = c->next) {
		if (c->dead || !c->model ||
		    (c->role != WEX_ROLE_PRODUCER && c->role != WEX_ROLE_CONSUMER) ||
		    wex__config_allowed(&d->cfg, c->model->name, c->role, c->uid, c->gid, c->groups,
					c->ngroups))
			continue;
		wex_warn("access", "reload: uid %d gid %d pid %d may no longer be a %s of model '%s': "
			 "disconnected", (int)c->uid, (int)c->gid, (int)c->pid,
			 c->role == WEX_ROLE_PRODUCER ? "producer" : "consumer", c->model->name);
		wex__metrics_count(WEX_M_REFUSED, "access", NULL, 1);
		conn_close(d, c);
	}
}

/* Re-reads the configuration (SIGHUP, wexctl config reload).  0 with
 * *report (if asked for) {"changed":[..], "restart_needed":[..], ...}, or a
 * negative errno with err saying why and the running one kept. */
static int wexd_reload(struct wexd *d, json_t **report_out, char *err, size_t errlen)
{
	json_t *report = NULL;
	int ret;

	err[0] = 0;
	wex__sd_reloading();
	ret = wex__config_reload(&d->cfg, &report, err, errlen);
	wex__metrics_count(WEX_M_RELOADS, ret < 0 ? "refused" : "ok", NULL, 1);
	if (ret < 0) {
		wex_error("config", "reload refused, keeping the running configuration: %s", err);
	} else {
		char *s = json_dumps(report, JSON_COMPACT);

		apply_config(d);
		set_config_source(d);
		wex_info("config", "reloaded: %s", s ? s : "");
		free(s);
		recheck_access(d);
	}
	if (report_out && ret == 0)
		*report_out = report;
	else
		json_decref(report);
	wex__sd_ready();
	return ret;
}

/*
 * STATUS= for systemctl status: clients, models (the one model's name and
 * visible version), leases, and whether wexd drains.  Sent when it
 * changes; a no-op outside a unit.
 */
static void wexd_sd_status(struct wexd *d)
{
	char text[sizeof(d->sd_status)], what[160] = "";
	uint32_t models = 0, leases = 0;
	const struct model *one = NULL;

	for (const struct model *m = d->models; m; m = m->next, models++) {
		leases += m->leases;
		one = m;
	}
	if (models == 1 && one->published)
		snprintf(what, sizeof(what), "model '%.64s' v%llu visible", one->name,
			 (unsigned long long)one->published);
	else if (models == 1)
		snprintf(what, sizeof(what), "model '%.64s', nothing published", one->name);
	else
		snprintf(what, sizeof(what), "%u models", models);
	snprintf(text, sizeof(text), "%s%u client%s, %s, %u lease%s", d->draining ? "draining: " : "",
		 wexd_clients(d), wexd_clients(d) == 1 ? "" : "s", what, leases, leases == 1 ? "" : "s");
	/* One line of printable UTF-8 text: a name never breaks the
	 * datagram, and one cut inside a character (at 64 bytes) does not
	 * make systemd drop the line as not UTF-8 clean. */
	wex__text_scrub(text);
	if (!strcmp(text, d->sd_status))
		return;
	snprintf(d->sd_status, sizeof(d->sd_status), "%s", text);
	/* Not taken (the manager's queue is full): sent again on a later
	 * tick, once it reads. */
	if (wex__sd_status(text) < 0)
		d->sd_status[0] = '\0';
}

/* Pings the watchdog at half of WatchdogSec: from the loop's tick, and
 * from each request, so that a long batch of costly requests (a status of
 * thousands of clients, asked by each) is not taken for a hung wexd. */
static void wexd_watchdog(struct wexd *d)
{
	uint64_t now;

	if (!d->watchdog_usec)
		return;
	now = wex__now_ns();
	/* A ping the manager's full queue refused is tried again at the next
	 * tick (a second, or a quarter of WatchdogSec, at most), not half an
	 * interval on: counted as sent, one short stall of the notify socket
	 * left a whole WatchdogSec without a ping, and systemd killed a
	 * healthy wexd. */
	if (now - d->last_watchdog_ns >= d->watchdog_usec * 500ull && wex__sd_watchdog() != -EAGAIN)
		d->last_watchdog_ns = now;
}

/* From inside a plan being built (wex__plan_tick_set): a plan of millions
 * of cells holds the loop for seconds. */
static void wexd_plan_tick(void *arg)
{
	wexd_watchdog(arg);
}

static void wexd_tick(struct wexd *d)
{
	wexd_held_check(d);
	wexd_journal_check(d);
	wex__sd_flush();
	wexd_watchdog(d);
	if (d->notify)
		wexd_sd_status(d);
}

int wexd_table_room(struct wexd *d, uint64_t drop, uint64_t add, uint64_t *limit)
{
	uint64_t held = d->table_bytes - (drop < d->table_bytes ? drop : d->table_bytes);
	long pages = sysconf(_SC_PHYS_PAGES), pg = sysconf(_SC_PAGESIZE);

	/* Tables are copied into wexd's memory and kept, whatever the memfd
	 * they came in: one sealed memfd sent on many connections (it costs
	 * its sender once) would otherwise take all memory, and wexd with
	 * it (the OOM killer picks the largest process). */
	*limit = d->cfg.max_table_bytes > 0 ? (uint64_t)d->cfg.max_table_bytes :
	         pages > 0 && pg > 0 ? (uint64_t)pages * (uint64_t)pg / 4 : UINT64_MAX;
	return add > *limit || held > *limit - add ? -ENOMEM : 0;
}

long wexd_fds_open(void)
{
	DIR *dir = opendir("/proc/self/fd");
	struct dirent *e;
	struct rlimit rl;
	long n = 0;

	if (!dir && (errno == EMFILE || errno == ENFILE) && getrlimit(RLIMIT_NOFILE, &rl) == 0)
		return (long)rl.rlim_cur; /* all taken: even this one */
	if (!dir)
		return -1;
	while ((e = readdir(dir)))
		n += e->d_name[0] != '.';
	closedir(dir);
	return n - 1; /* the directory's own fd */
}

/*
 * wexd holds a duplicate of every exported allocation's fd, and a trainer
 * on expandable segments exports one per 20 MiB: thousands per GPU, past
 * the usual soft limit of 1024.  Sets the soft limit to max_open_files, or
 * to the hard limit when that is 0 (systemd/wexd.service sets both).
 */
static void set_fd_limit(struct wexd *d)
{
	struct rlimit rl;
	rlim_t was, want;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
		wex_warn("wexd", "getrlimit(RLIMIT_NOFILE): %m");
		return;
	}
	was = rl.rlim_cur;
	want = d->cfg.max_open_files > 0 ? (rlim_t)d->cfg.max_open_files : rl.rlim_max;
	/* Containers may allow 2^30; an fd table that large wastes memory. */
	if (!d->cfg.max_open_files && want > 1 << 20)
		want = 1 << 20;
	if (want < 64) { /* the listener, the loop, the logs need some */
		wex_warn("wexd", "max_open_files %lld is too low: using 64",
			 (long long)d->cfg.max_open_files);
		want = 64;
	}
	if (want > rl.rlim_max) {
		wex_warn("wexd", "max_open_files %lld is above the hard limit %llu: using that",
			 (long long)d->cfg.max_open_files, (unsigned long long)rl.rlim_max);
		want = rl.rlim_max;
	}
	rl.rlim_cur = want;
	if (want != was && setrlimit(RLIMIT_NOFILE, &rl) < 0) {
		wex_warn("wexd", "cannot set the file-descriptor limit to %llu: %m; keeping %llu",
			 (unsigned long long)want, (unsigned long long)was);
		rl.rlim_cur = was;
	}
	d->fd_limit = rl.rlim_cur;
	if (d->fd_limit < 16384)
		wex_warn("wexd", "file descriptors: limit %llu%s; wexd holds one per exported "
			 "allocation (an expandable-segments trainer exports one per 20 MiB): %s "
			 "for large models",
			 (unsigned long long)d->fd_limit,
			 was < d->fd_limit   ? " (raised)"
			 : was > d->fd_limit ? " (lowered by max_open_files)"
					     : "",
			 /* The setting, where it chose a limit below the hard one. */
			 d->cfg.max_open_files > 0 && d->fd_limit < rl.rlim_max
				 ? "raise max_open_files (0: the hard limit)"
				 : "raise the hard limit (LimitNOFILE=, ulimit -Hn)");
	else
		wex_info("wexd", "file descriptors: limit %llu%s", (unsigned long long)d->fd_limit,
			 was < d->fd_limit   ? " (raised from the soft limit)"
			 : was > d->fd_limit ? " (lowered by max_open_files)"
					     : "");
}

/*
 * Closes every fd wexd inherited but its standard streams, the socket
 * systemd passed (listen_fd) and WEXD_READY_FD's: a pipe a launcher left
 * open would otherwise not end while wexd runs (a reader waiting for its
 * end waits as long), and a file, lock or socket held so stays held for
 * the daemon's life.  Says which it closed.  Before wexd opens its own.
 */
static void close_inherited(const struct wexd *d)
{
	const char *s = getenv("WEXD_READY_FD");
	int ready = s && *s ? atoi(s) : -1, *fds = NULL, n = 0, cap = 0, left = 0;
	char names[128] = "";
	size_t len = 0;
	struct dirent *e;
	DIR *dir;

	/* (Before the directory takes an fd number.) */
	if (ready >= 0 && (ready == d->listen_fd || fcntl(ready, F_GETFD) < 0)) {
		/* (A variable left for another wexd: "ready" would go into a
		 * file of wexd's own opened under that number, or, written to
		 * the socket systemd passed, close it.) */
		wex_warn("wexd", "WEXD_READY_FD=%s names %s: ignored", s,
			 ready == d->listen_fd ? "the listening socket systemd passed"
					       : "no open file descriptor");
		unsetenv("WEXD_READY_FD");
		ready = -1;
	}
	dir = opendir("/proc/self/fd");
	if (!dir) {
		/* (No /proc: closed unseen, around those kept.) */
		int keep[2] = { d->listen_fd < ready ? d->listen_fd : ready,
				d->listen_fd < ready ? ready : d->listen_fd };
		unsigned lo = 3;

		for (int i = 0; i < 2; i++)
			if (keep[i] >= (int)lo) {
				if (keep[i] > (int)lo)
					close_range(lo, (unsigned)keep[i] - 1, 0);
				lo = (unsigned)keep[i] + 1;
			}
		close_range(lo, ~0u, 0);
		wex_debug("wexd", "closed any fds it inherited (/proc/self/fd: %m)");
		return;
	}
	while ((e = readdir(dir))) {
		char *end;
		long fd = strtol(e->d_name, &end, 10);

		if (*end || end == e->d_name || fd < 3 || fd == dirfd(dir) || fd == d->listen_fd ||
		    fd == ready)
			continue;
		if (n == cap) {
			int *more = realloc(fds, (size_t)(cap ? cap * 2 : 16) * sizeof(*fds));

			if (!more) {
				left = 1; /* (the rest stays: said below) */
				break;
			}
			fds = more;
			cap = cap ? cap * 2 : 16;
		}
		fds[n++] = (int)fd;
	}
	closedir(dir);
	for (int i = 0; i < n; i++) {
		char path[32], to[256];
		ssize_t m;

		snprintf(path, sizeof(path), "/proc/self/fd/%d", fds[i]);
		m = readlink(path, to, sizeof(to) - 1);
		to[m > 0 ? m : 0] = '\0';
		if (i < 8 && len < sizeof(names))
			len += (size_t)snprintf(names + len, sizeof(names) - len, "%s%d (%.40s)",
						i ? ", " : "", fds[i], m > 0 ? to : "?");
		close(fds[i]);
	}
	if (n)
		wex_info("wexd", "closed %d file descriptor%s it inherited: %s%s", n, n == 1 ? "" : "s",
			 names, n > 8 ? ", ..." : "");
	if (left)
		wex_warn("wexd", "out of memory listing the fds it inherited: those past the %d closed stay open",
			 n);
	free(fds);
}

/*
 * Under socket activation the socket is systemd's: status and the log name
 * the path it really listens on, and socket, socket_mode and socket_group
 * set in the configuration, which cannot apply, are reported where the
 * socket differs from them rather than ignored in silence.
 */
static void passed_socket(struct wexd *d)
{
	struct sockaddr_un sa;
	socklen_t len = sizeof(sa);
	size_t off = offsetof(struct sockaddr_un, sun_path);
	struct stat st;

	memset(&sa, 0, sizeof(sa));
	if (getsockname(d->listen_fd, (struct sockaddr *)&sa, &len) < 0 || len <= off ||
	    !sa.sun_path[0])
		return;
	sa.sun_path[sizeof(sa.sun_path) - 1] = '\0';
	if (d->cfg.source[WEX_CF_SOCKET] != WEX_CONFIG_SRC_DEFAULT &&
	    strcmp(d->cfg.socket, sa.sun_path))
		wex_warn("wexd", "socket %s (from %s) is not used: systemd passed the socket at %s "
			 "(ListenSequentialPacket= in wexd.socket)", d->cfg.socket,
			 wex__config_source_name(d->cfg.source[WEX_CF_SOCKET]), sa.sun_path);
	snprintf(d->socket_path, sizeof(d->socket_path), "%s", sa.sun_path);
	if (stat(d->socket_path, &st) < 0)
		return;
	if (d->cfg.source[WEX_CF_SOCKET_MODE] != WEX_CONFIG_SRC_DEFAULT &&
	    (st.st_mode & 0777) != d->cfg.socket_mode)
		wex_warn("wexd", "socket_mode %04o (from %s) is not applied: the socket systemd "
			 "passed has mode %04o (SocketMode= in wexd.socket)",
			 (unsigned)d->cfg.socket_mode,
			 wex__config_source_name(d->cfg.source[WEX_CF_SOCKET_MODE]),
			 (unsigned)(st.st_mode & 0777));
	if (d->cfg.socket_group.gid >= 0 && (int64_t)st.st_gid != d->cfg.socket_group.gid)
		wex_warn("wexd", "socket_group %s (from %s) is not applied: the socket systemd "
			 "passed has gid %u (SocketGroup= in wexd.socket)",
			 d->cfg.socket_group.name ? d->cfg.socket_group.name : "?",
			 wex__config_source_name(d->cfg.source[WEX_CF_SOCKET_GROUP]),
			 (unsigned)st.st_gid);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: wexd [-s|--socket PATH] [-i|--io auto|io_uring|epoll] [-c|--config FILE]\n"
		   "            [-l|--log-level error|warn|info|debug|trace]\n"
		   "Runs the wex weight-exchange daemon in the foreground.\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, 's' }, { "io", required_argument, NULL, 'i' },
		{ "config", required_argument, NULL, 'c' }, { "log-level", required_argument, NULL, 'l' },
		{ "help", no_argument, NULL, 'h' },          { 0 }
	};
	struct wexd d = { .listen_fd = -1, .lock_fd = -1, .sig_fd = -1, .plan_efd = -1, .journal.dirfd = -1, .msg_max = WEX_MSG_MAX_DEFAULT,
			  .begin_write_timeout_ms = 30000, .sync_timeout_ms = 60000 };
	const char *io = NULL, *sock = NULL, *cfg = NULL, *level = NULL, *s;
	char err[512] = "", buf[PATH_MAX];
	struct stat st;
	sigset_t mask;
	int opt, ret;

	/* Started with stdin, stdout or stderr closed (a launcher's `>&-`),
	 * the first files wexd opens would take those numbers: its log would
	 * be written into its lock file (fd 2), over the pid kept there. */
	for (int fd = 0; fd <= 2; fd++)
		/* (The lowest free number: this one, those below being open.) */
		if (fcntl(fd, F_GETFD) < 0 && errno == EBADF && open("/dev/null", O_RDWR) != fd)
			break;

	/* Held from the start, read from the signalfd once the loop runs: a
	 * SIGHUP or SIGTERM while wexd starts (its socket bound already)
	 * would otherwise kill it with the default action and leave the
	 * socket file behind. */
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	wex__log_init();
	/* getopt's own messages would be bare lines: say it through the log,
	 * like every other reason wexd will not start. */
	opterr = 0;
	while ((opt = getopt_long(argc, argv, ":s:i:c:l:h", lo, NULL)) != -1) {
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
				wex_error("wexd", "--log-level '%s' unknown (error, warn, info, debug or trace)",
					  optarg);
				return 2;
			}
			wex__log_level = ret; /* for what is logged while loading */
			level = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case ':':
			wex_error("wexd", "%s needs a value (wexd --help lists the flags)",
				  argv[optind - 1]);
			return 2;
		default:
			/* optopt: 0 for an unknown long option (optind is past
			 * it), a flag's letter for a long flag given a value it
			 * does not take (--help=x), else an unknown letter (in a
			 * group such as -xh, optind is not yet past it). */
			if (!optopt)
				wex_error("wexd", "unknown option '%s' (wexd --help lists the flags)",
					  argv[optind - 1]);
			else if (strchr("siclh", optopt))
				wex_error("wexd", "'%s': the option takes no value", argv[optind - 1]);
			else
				wex_error("wexd", "unknown option '-%c' (wexd --help lists the flags)",
					  optopt);
			return 2;
		}
	}
	if (optind < argc) {
		wex_error("wexd", "unexpected argument '%s'", argv[optind]);
		return 2;
	}
	/* Through the log, so that under systemd the reason wexd would not
	 * start is journald's error priority, not its default (info). */
	ret = wex__config_load(&d.cfg, cfg, cfg != NULL, err, sizeof(err));
	if (ret < 0) {
		wex_error("wexd", "%s", err);
		return 2;
	}
	/* Command-line flags win over every layer of the configuration, also
	 * after a reload (source "flag"). */
	if ((sock && wex__config_set_flag(&d.cfg, "socket", sock, "--socket", err, sizeof(err)) < 0) ||
	    (io && wex__config_set_flag(&d.cfg, "io_backend", io, "--io", err, sizeof(err)) < 0) ||
	    (level && wex__config_set_flag(&d.cfg, "log_level", level, "--log-level", err,
					   sizeof(err)) < 0)) {
		wex_error("wexd", "%s", err);
		wex__config_free(&d.cfg);
		return 2;
	}
	io = wex__config_io_backend_name(d.cfg.io_backend);
	wex__log_level = d.cfg.log_level;
	snprintf(d.socket_path, sizeof(d.socket_path), "%s", d.cfg.socket);
	set_config_source(&d);
	d.msg_max = (size_t)d.cfg.max_message_bytes;
	apply_config(&d);
	wex__config_log(&d.cfg);
	d.watchdog_usec = wex__sd_watchdog_usec();
	if (d.watchdog_usec)
		wex__plan_tick_set(wexd_plan_tick, &d);
	d.notify = getenv("NOTIFY_SOCKET") && *getenv("NOTIFY_SOCKET");
	if (d.watchdog_usec && !d.cfg.watchdog) {
		/* Not answering would get wexd killed in WatchdogSec: say so
		 * now rather than die puzzlingly later. */
		wex_error("wexd", "watchdog is false (%s%s%s) but systemd asks for watchdog pings every "
			  "%llu ms (WatchdogSec= in the unit): remove WatchdogSec= (systemctl edit "
			  "wexd.service) or set watchdog to true",
			  wex__config_source_name(d.cfg.source[WEX_CF_WATCHDOG]),
			  d.cfg.origin[WEX_CF_WATCHDOG] ? " " : "",
			  d.cfg.origin[WEX_CF_WATCHDOG] ? d.cfg.origin[WEX_CF_WATCHDOG] : "",
			  (unsigned long long)(d.watchdog_usec / 1000));
		wex__config_free(&d.cfg);
		return 2;
	}
	d.cfg.watchdog_required = d.watchdog_usec != 0;
	/* Before wexd opens an fd of its own (its event loop, the reserve
	 * fd): a LISTEN_FDS counting more fds than were passed would take
	 * those for passed ones, and close them as not listening. */
	d.listen_fd = wex__sd_listen_fd();
	close_inherited(&d);
	set_fd_limit(&d);
	if (d.listen_fd < -1) {
		/* The line before says why (unreadable LISTEN_FDS, or no
		 * passed fd of the right kind). */
		wex_error("wexd", "not starting: cannot use what systemd passed in LISTEN_FDS, and "
			  "binding a socket of its own would take over systemd's path");
		/* As a bad configuration: every start would fail the same way
		 * (a wexd.socket of another type), 2 is not restarted
		 * (before the event loop: nothing of it to free). */
		wex__config_free(&d.cfg);
		return 2;
	}
	(void)buf;
	d.start_ns = wex__now_ns();
	ret = wex__loop_init(&d.loop, io, d.msg_max, err, sizeof(err));
	if (ret < 0) {
		wex_error("wexd", "event loop: %s", err);
		/* io_uring forced where this kernel cannot run it fails the
		 * same way at every start: 2, which the unit does not restart
		 * (RestartPreventExitStatus=2); short of memory or fds, 1. */
		wex__config_free(&d.cfg);
		return io && !strcmp(io, "io_uring") && ret != -ENOMEM && ret != -EAGAIN &&
				       ret != -EMFILE && ret != -ENFILE
			       ? 2
			       : 1;
	}
	d.loop.cbs.on_accept = on_accept;
	d.loop.cbs.on_msg = on_msg;
	d.loop.cbs.on_free = on_free;
	d.loop.cbs.on_peer_exit = on_peer_exit;
	probe_exit_watch(&d);
	d.loop.arg = &d;

	if (d.listen_fd >= 0) {
		wex_info("wexd", "using the socket passed by systemd (fd %d)", d.listen_fd);
		d.cfg.socket_passed = 1;
		/* systemd passes it blocking (no NonBlocking= in wexd.socket):
		 * the epoll backend accepts until EAGAIN, and an accept that
		 * waits would stop the loop for good. */
		if (fcntl(d.listen_fd, F_SETFL, fcntl(d.listen_fd, F_GETFL) | O_NONBLOCK) < 0) {
			wex_error("wexd", "passed socket: O_NONBLOCK: %m");
			return 1;
		}
		passed_socket(&d);
	} else {
		int mode = (int)d.cfg.socket_mode;
		gid_t gid = d.cfg.socket_group.gid >= 0 ? (gid_t)d.cfg.socket_group.gid : (gid_t)-1;

		const char *step = "";
		pid_t holder;

		d.lock_fd = wex_sock_lock(d.socket_path, &holder, &step);
		if (d.lock_fd < 0) {
			if (d.lock_fd == -EADDRINUSE && holder > 0)
				wex_error("wexd", "cannot listen on %s: another wexd (pid %d) holds %s.lock",
					  d.socket_path, (int)holder, d.socket_path);
			else if (d.lock_fd == -EADDRINUSE)
				wex_error("wexd", "cannot listen on %s: another wexd, starting, holds %s.lock",
					  d.socket_path, d.socket_path);
			else
				wex_error("wexd", "cannot listen on %s: %s %s.lock%s: %s", d.socket_path,
					  step, d.socket_path,
					  d.lock_fd == -EPERM
						  ? " (not a file of this user's: another user's? remove "
						    "it, or choose another path: socket, --socket, "
						    "WEX_SOCKET)"
						  : "",
					  strerror(-d.lock_fd));
			return 1;
		}
		d.listen_fd = wex_sock_listen(d.socket_path, mode, gid, &step);
		if (d.listen_fd < 0) {
			char what[128] = "";

			/* Name the setting behind the step that failed. */
			if (!strcmp(step, "chown"))
				snprintf(what, sizeof(what), " to group %s (gid %lld; socket_group from %s)",
					 d.cfg.socket_group.name ? d.cfg.socket_group.name : "?",
					 (long long)d.cfg.socket_group.gid,
					 wex__config_source_name(d.cfg.source[WEX_CF_SOCKET_GROUP]));
			else if (!strcmp(step, "chmod"))
				snprintf(what, sizeof(what), " to %04o (socket_mode from %s)", mode,
					 wex__config_source_name(d.cfg.source[WEX_CF_SOCKET_MODE]));
			else if (!strcmp(step, "check for a running daemon"))
				snprintf(what, sizeof(what), ": another wexd listens there");
			else if (!strcmp(step, "remove a stale socket") ||
				 !strcmp(step, "connect to the socket file already there"))
				snprintf(what, sizeof(what), " (another user's? remove it, or choose "
					 "another path: socket, --socket, WEX_SOCKET)");
			else if (!strcmp(step, "check for a stale socket"))
				snprintf(what, sizeof(what), ": something other than a socket is there "
					 "(wexd replaces only a stale socket; check socket, --socket, "
					 "WEX_SOCKET)");
			wex_error("wexd", "cannot listen on %s: %s%s: %s", d.socket_path, step, what,
				  strerror(-d.listen_fd));
			/* A socket_group or socket_mode this user may not give
			 * fails at every start: a configuration error (2). */
			d.loop.ops->fini(&d.loop);
			wex__config_free(&d.cfg);
			return (!strcmp(step, "chown") || !strcmp(step, "chmod")) &&
					       (d.listen_fd == -EPERM || d.listen_fd == -EINVAL)
				       ? 2
				       : 1;
		}
		d.socket_owned = 1;
		/* Connecting to a UNIX socket needs write permission on it:
		 * a mode that lets a class read but not write (0640) lets it
		 * see the socket and be refused (EACCES) at every connect. */
		if (!(mode & 0200) || (mode & 0060) == 0040 || (mode & 0006) == 0004)
			wex_warn("wexd", "socket_mode %04o (from %s): connecting needs write permission on the socket, which %s lack%s (0660: its owner and its group may connect)",
				 mode, wex__config_source_name(d.cfg.source[WEX_CF_SOCKET_MODE]),
				 !(mode & 0200) ? "its owner (wexd's user, but for root)"
				 : (mode & 0060) == 0040 ? "members of its group" : "other users",
				 !(mode & 0200) ? "s" : "");
		if (stat(d.socket_path, &st) == 0) {
			d.socket_dev = st.st_dev;
			d.socket_ino = st.st_ino;
		}
	}
	d.listener.fd = d.listen_fd;
	if ((ret = d.loop.ops->listen(&d.loop, &d.listener)) < 0) {
		wex_error("wexd", "listen: %s", strerror(-ret));
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	/* A write past a file size limit (ulimit -f, inherited from a batch
	 * system) fails with EFBIG, said where it happens (a lease record, a
	 * memfd), rather than killing wexd and every lease it holds. */
	signal(SIGXFSZ, SIG_IGN);
	d.sig_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	d.sigw.fd = d.sig_fd;
	d.sigw.cb = on_signal;
	d.sigw.arg = &d;
	if (d.sig_fd < 0 || d.loop.ops->watch(&d.loop, &d.sigw) < 0) {
		wex_error("wexd", "signalfd: %m");
		return 1;
	}
	if ((ret = wexd_plan_init(&d)) < 0) {
		wex_error("wexd", "the planner's eventfd: %s", strerror(-ret));
		return 1;
	}
	/* Remap leases granted by an earlier wexd whose engines still hold
	 * them keep their producers waiting (journal.h). */
	if ((ret = wex__journal_open(&d.journal, d.socket_path)) < 0) {
		wex_warn("wexd", "lease journal off (%s): remap leases held across a restart of wexd will not hold their producers off%s",
			 d.journal.why, ret == -ENAMETOOLONG ? "" : " (wexd looks again every 200 ms, and uses it once it can)");
		/* Looked at again, as one that went while wexd ran: set right
		 * (a chmod, a chown), it is used without the restart that
		 * would lose the leases held meanwhile. */
		d.journal_lost = ret != -ENAMETOOLONG ? 2 : 0;
	} else if (d.journal.nowrite[0])
		wex_warn("wexd", "lease journal %s cannot be written (%s): leases held from before this wexd are read and hold their producers off, but the remap leases this wexd grants are not written down: a restart would lose them",
			 d.journal.path, d.journal.nowrite);
	wexd_held_load(&d);
	wex_info("wexd", "listening on %s (event loop: %s%s%s)", d.socket_path, wexd_io_backend(&d),
		 d.loop.why_fallback[0] ? ", " : "", d.loop.why_fallback);
	wex__metrics_set_info(WEX_VERSION_STRING, wexd_io_backend(&d));
	metrics_declare();
	wex__sd_ready();
	/* Tests and scripts wait for this line rather than sleeping. */
	if ((s = getenv("WEXD_READY_FD"))) {
		int fd = atoi(s);

		(void)!write(fd, "ready\n", 6);
		/* A standard stream keeps its number, on /dev/null: closed, the
		 * next connection would take it and be written the log. */
		if (fd <= 2) {
			int null = open("/dev/null", O_RDWR | O_CLOEXEC);

			if (null < 0 || dup2(null, fd) < 0)
				close(fd);
			if (null >= 0)
				close(null);
		} else {
			close(fd);
		}
	}
	while (!d.stop) {
		int timeout = wexd_service_waiters(&d);

		if (timeout < 0 || timeout > 1000)
			timeout = 1000;
		/* Wake often enough to ping at half of WatchdogSec. */
		if (d.watchdog_usec && (uint64_t)timeout > d.watchdog_usec / 4000)
			timeout = d.watchdog_usec >= 8000 ? (int)(d.watchdog_usec / 4000) : 2;
		wexd_tick(&d);
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
			/* No new client while the others are told below. */
			d.draining = 1;
			d.loop.ops->unlisten(&d.loop, &d.listener);
			break;
		}
	}
	if (d.draining && !drained(&d))
		/* The operator must learn that the drain did not finish: those
		 * consumers' copies lose their lease mid-way. */
		wex_warn("wexd", "drain cut short (%s): %u copy lease(s) still held; their "
			 "consumers' copies are cut (raise drain_timeout_ms, and TimeoutStopSec= "
			 "with it, if copies take longer)",
			 d.stop ? "second signal" : d.exit_code ? "event loop error"
							    : "drain_timeout_ms expired",
			 copies_in_flight(&d));
	wex_info("wexd", "stopping: %u client(s) told by disconnect", wexd_clients(&d));
	/* Remap leases still held stay written down for the next wexd. */
	d.journal.keep = 1;
	for (struct conn *c = d.conns; c; c = c->next)
		conn_close(&d, c);
	/* io_uring frees a connection only once its cancelled receive and
	 * pidfd poll are back: four completions a client, at most
	 * WEX_LOOP_BATCH a turn, so thousands of clients take hundreds of
	 * turns.  Bounded in time (2 s), not in turns. */
	for (uint64_t end = wex__now_ns() + 2000000000ull; d.nconns && wex__now_ns() < end;)
		d.loop.ops->run_once(&d.loop, 10);
	wexd_held_exit(&d);
	wexd_verify_free(&d);
	wex__journal_close(&d.journal);
	if (d.socket_owned && stat(d.socket_path, &st) == 0 && st.st_dev == d.socket_dev &&
	    st.st_ino == d.socket_ino)
		unlink(d.socket_path);
	close(d.listen_fd);
	/* Only now may the next wexd take the path. */
	if (d.lock_fd >= 0)
		close(d.lock_fd);
	close(d.sig_fd);
	wexd_plan_exit(&d);
	d.loop.ops->fini(&d.loop);
	wex__config_free(&d.cfg);
	return d.exit_code;
}
