/* SPDX-License-Identifier: MIT */
/*
 * lib_unload - a process that unloads libwex (dlclose: a plugin host, a
 * Python extension torn down) after closing a client while wexd was down
 * lives on.  That close leaves a thread of libwex's that says the hello
 * ending the client's remap lease once a wexd answers (client_close,
 * owed_hello_later); with the library unmapped under it, the thread ran
 * into unmapped code and killed the process when wexd came back.  libwex
 * is linked -z nodelete: it stays loaded after dlclose.
 *
 * This program does not link libwex: it loads it (argv[1]) with dlopen,
 * publishes v1 from a producer client, takes a remap-view lease from a
 * consumer client, kills wexd, closes both clients (the consumer's hello
 * is owed), dlcloses libwex, starts wexd again and waits for the owed
 * hello to end the lease: the producer's next begin_write (from libwex
 * loaded again) succeeds at once, and this process is still here.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "wex.h"

static struct t_wexd d;

struct lib {
	void *h;
	int (*open)(const struct wex_client_params *, wex_client_t **);
	void (*close)(wex_client_t *);
	int (*seg_alloc)(wex_client_t *, int, int, uint64_t, uint32_t *, void **);
	int (*reg)(wex_client_t *, const struct wex_tensor *, size_t);
	int (*begin)(wex_client_t *, uint64_t, uint32_t);
	int (*publish)(wex_client_t *, uint64_t);
	int (*sync)(wex_client_t *, int, uint64_t, uint32_t, struct wex_sync_result *);
	const char *(*last_error)(wex_client_t *);
};

static void *sym(void *h, const char *name)
{
	void *p = dlsym(h, name);

	T_ASSERT(p, "dlsym %s: %s", name, dlerror());
	return p;
}

static void lib_load(struct lib *l, const char *path)
{
	l->h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	T_ASSERT(l->h, "dlopen %s: %s", path, dlerror());
	l->open = (int (*)(const struct wex_client_params *, wex_client_t **))sym(
		l->h, "wex_client_open");
	l->close = (void (*)(wex_client_t *))sym(l->h, "wex_client_close");
	l->seg_alloc = (int (*)(wex_client_t *, int, int, uint64_t, uint32_t *, void **))sym(
		l->h, "wex_segment_alloc");
	l->reg = (int (*)(wex_client_t *, const struct wex_tensor *, size_t))sym(
		l->h, "wex_register_tensors");
	l->begin = (int (*)(wex_client_t *, uint64_t, uint32_t))sym(l->h, "wex_begin_write");
	l->publish = (int (*)(wex_client_t *, uint64_t))sym(l->h, "wex_publish");
	l->sync = (int (*)(wex_client_t *, int, uint64_t, uint32_t, struct wex_sync_result *))sym(
		l->h, "wex_sync");
	l->last_error = (const char *(*)(wex_client_t *))sym(l->h, "wex_last_error");
}

#define L_OK(l, c, call)                                                                  \
	do {                                                                              \
		int l_ret_ = (call);                                                      \
		T_ASSERT(l_ret_ >= 0, "%s: %s: %s", #call, strerror(-l_ret_),             \
			 (l)->last_error(c));                                             \
	} while (0)

static wex_client_t *client(struct lib *l, int role)
{
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_RANK | WEX_CLIENT_FIELD_MODEL |
			      (role == WEX_ROLE_CONSUMER ? WEX_CLIENT_FIELD_GROUP : 0),
		.role = role, .model = "unload", .group = "g", .rank = 0, .world_size = 1,
	};
	wex_client_t *c = NULL;
	int ret = l->open(&p, &c);

	T_ASSERT(ret == 0, "wex_client_open(role %d): %s: %s", role, strerror(-ret),
		 l->last_error(NULL));
	return c;
}

/* A producer of one 4 KiB tensor in a host segment. */
static wex_client_t *producer(struct lib *l)
{
	struct wex_tensor t = { .dtype = WEX_DT_F32, .ndim = 1, .shape = { 1024 },
				.extent = { 1024 }, .strides = { 1 } };
	wex_client_t *c = client(l, WEX_ROLE_PRODUCER);
	void *base = NULL;
	uint32_t seg = 0;

	snprintf(t.name, sizeof(t.name), "w");
	L_OK(l, c, l->seg_alloc(c, WEX_SEG_HOST, 0, 4096, &seg, &base));
	t.segment = seg;
	L_OK(l, c, l->reg(c, &t, 1));
	return c;
}

int main(int argc, char **argv)
{
	struct lib l;
	struct wex_sync_result r;
	wex_client_t *p, *k;
	void *again;

	T_ASSERT(argc == 2, "usage: lib_unload LIBWEX");
	t_wexd_start(&d);
	lib_load(&l, argv[1]);
	p = producer(&l);
	L_OK(&l, p, l.begin(p, 1, 5000));
	L_OK(&l, p, l.publish(p, 1));
	k = client(&l, WEX_ROLE_CONSUMER);
	L_OK(&l, k, l.sync(k, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
	t_wexd_kill(&d);
	l.close(k); /* (its hello is owed: no wexd answers) */
	l.close(p);
	T_ASSERT(dlclose(l.h) == 0, "dlclose: %s", dlerror());
	/* Still loaded: the owed hello's thread runs in it. */
	again = dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD);
	T_ASSERT(again, "libwex was unloaded by dlclose with a thread of its own running");
	dlclose(again);
	t_wexd_restart(&d);
	/* The owed hello ends the lease this wexd read from its journal: the
	 * trainer's next write is not held off (it was until the process
	 * exited, before the owed hello). */
	lib_load(&l, argv[1]);
	p = producer(&l);
	L_OK(&l, p, l.begin(p, 2, 5000));
	L_OK(&l, p, l.publish(p, 2));
	l.close(p);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
