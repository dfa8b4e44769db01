/* SPDX-License-Identifier: MIT */
/*
 * open_errors - a wex_client_open that fails says why: wex_last_error(NULL)
 * gives the calling thread the reason, since there is no client to hold
 * it.  No wexd at the socket: the path and what to check.  A producer
 * rank another connection holds: wexd's "held by pid N" (not only
 * "Address already in use").  Another world size than the model's
 * producers: wexd's reason (not only "Invalid argument").  Parameters
 * refused before connecting: which one.  An open that succeeds leaves it
 * empty.
 *
 * Found by following the README as a new user: these opens returned only
 * the errno, and the Python binding raised "wex_client_open: Address
 * already in use" for a rank held by a live process.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "wex.h"

static int open_as(int role, const char *model, uint32_t rank, uint32_t world, const char *sock,
		   wex_client_t **c)
{
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_RANK | WEX_CLIENT_FIELD_FLAGS |
			      (model ? WEX_CLIENT_FIELD_MODEL : 0) | (sock ? WEX_CLIENT_FIELD_SOCKET : 0),
		.role = role, .model = model, .rank = rank, .world_size = world, .socket = sock,
		.flags = WEX_CLIENT_NO_WATCH,
	};

	*c = NULL;
	return wex_client_open(&p, c);
}

static void expect(int ret, int code, const char *has, const char *what)
{
	const char *why = wex_last_error(NULL);

	T_ASSERT(ret == code, "%s: %s, expected %s", what, wex_strerror(ret), wex_strerror(code));
	T_ASSERT(strstr(why, has), "%s: wex_last_error(NULL) is \"%s\", naming no \"%s\"", what,
		 why, has);
	printf("%s: %s\n", what, why);
}

int main(void)
{
	struct t_wexd d;
	wex_client_t *held, *c;
	char none[400], pid[32];
	int ret;

	t_wexd_start(&d);
	t_check_backend(d.sock);

	snprintf(none, sizeof(none), "%s/none.sock", d.dir);
	ret = open_as(WEX_ROLE_CONSUMER, "oe", 0, 1, none, &c);
	expect(ret, -ENOENT, none, "no wexd at the socket");
	T_ASSERT(strstr(wex_last_error(NULL), "is wexd running"), "no hint: %s",
		 wex_last_error(NULL));

	ret = open_as(WEX_ROLE_CONSUMER, NULL, 0, 1, NULL, &c);
	expect(ret, -EINVAL, "model name", "no model");
	ret = open_as(9, "oe", 0, 1, NULL, &c);
	expect(ret, -EINVAL, "role", "bad role");

	T_WEX(NULL, open_as(WEX_ROLE_PRODUCER, "oe", 0, 1, NULL, &held));
	T_ASSERT(!strcmp(wex_last_error(NULL), ""), "after an open that succeeded: \"%s\"",
		 wex_last_error(NULL));

	snprintf(pid, sizeof(pid), "held by pid %d", (int)getpid());
	ret = open_as(WEX_ROLE_PRODUCER, "oe", 0, 1, NULL, &c);
	expect(ret, -EADDRINUSE, pid, "a producer rank held by a live connection");
	T_ASSERT(c == NULL, "*out written on failure");

	ret = open_as(WEX_ROLE_PRODUCER, "oe", 1, 2, NULL, &c);
	expect(ret, -EINVAL, "has 1 producer ranks, this producer says 2",
	       "another world size");

	wex_client_close(held);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
