/* SPDX-License-Identifier: MIT */
/*
 * open_errors - a wex_client_open that fails says why: wex_last_error(NULL)
 * gives the calling thread the reason, since there is no client to hold
 * it.  No wexd at the socket: the path and what to check.  A producer
 * rank another connection holds: wexd's "held by pid N" (not only
 * "Address already in use").  Another world size than the model's
 * producers: wexd's reason (not only "Invalid argument").  Parameters
 * refused before connecting: which one.  An open that succeeds leaves it
 * empty.  A group name of WEX_NAME_MAX bytes or more, or a socket path
 * (given, or in $WEX_SOCKET) that does not fit, is refused (-EINVAL,
 * naming it), not cut short: two groups that differ only past the cut
 * were one group, sharing ranks.  So is a model or group name that is not
 * UTF-8 (-EINVAL, naming which; a group was -ENOMEM before).
 *
 * Found by following the README as a new user: these opens returned only
 * the errno, and the Python binding raised "wex_client_open: Address
 * already in use" for a rank held by a live process.
 */
#include <errno.h>
#include <stdlib.h>
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

/* A consumer of group `group` (rank 0 of 1) at the test's wexd. */
static int open_group(const char *group, wex_client_t **c)
{
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL | WEX_CLIENT_FIELD_GROUP,
		.role = WEX_ROLE_CONSUMER, .model = "oe", .group = group,
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
	wex_client_t *held, *longest, *c;
	char none[400], pid[32], group[WEX_NAME_MAX + 40], longsock[512];
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

	/* Names that do not fit: refused, where they were cut short to
	 * the group (rank 0 held) of the longest name that fits. */
	memset(group, 'g', WEX_NAME_MAX - 1);
	group[WEX_NAME_MAX - 1] = '\0';
	T_WEX(NULL, open_group(group, &longest));
	snprintf(group + WEX_NAME_MAX - 1, sizeof(group) - (WEX_NAME_MAX - 1), "x");
	ret = open_group(group, &c);
	expect(ret, -EINVAL, "group name", "a group name of WEX_NAME_MAX bytes");
	T_ASSERT(c == NULL, "*out written on failure");
	snprintf(group + WEX_NAME_MAX - 1, sizeof(group) - (WEX_NAME_MAX - 1), "-another-group");
	ret = open_group(group, &c);
	expect(ret, -EINVAL, "group name", "a group name past WEX_NAME_MAX bytes");
	wex_client_close(longest);
	/* Names that are not UTF-8 cannot go into hello's JSON: refused,
	 * naming which, where a group was -ENOMEM ("Cannot allocate
	 * memory") and a model wexd's "a consumer needs a model name". */
	ret = open_group("g\xff", &c);
	expect(ret, -EINVAL, "group name is not valid UTF-8", "a group name that is not UTF-8");
	T_ASSERT(c == NULL, "*out written on failure");
	ret = open_as(WEX_ROLE_CONSUMER, "oe\xc3", 0, 1, NULL, &c);
	expect(ret, -EINVAL, "model name is not valid UTF-8", "a model name that is not UTF-8");
	T_WEX(NULL, open_group("gr\xc3\xbcn", &c)); /* UTF-8 beyond ASCII is fine */
	wex_client_close(c);
	snprintf(longsock, sizeof(longsock), "%.100s/%0300d.sock", d.dir, 0);
	ret = open_as(WEX_ROLE_CONSUMER, "oe", 0, 1, longsock, &c);
	expect(ret, -EINVAL, "socket path", "a socket path that does not fit");
	T_ASSERT(setenv("WEX_SOCKET", longsock, 1) == 0, "setenv");
	ret = open_as(WEX_ROLE_CONSUMER, "oe", 0, 1, NULL, &c);
	expect(ret, -EINVAL, "socket path", "a $WEX_SOCKET that does not fit");
	T_ASSERT(setenv("WEX_SOCKET", d.sock, 1) == 0, "setenv");

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
