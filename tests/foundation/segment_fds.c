/* SPDX-License-Identifier: MIT */
/*
 * segment_fds - proves that wexd keeps only memory among a producer's
 * segment fds, and keeps a chained segment's size honest:
 *  - a producer that registers its own connection to wexd as a cuda_vmm
 *    segment is refused (EINVAL naming a socket); it then closes its
 *    connection and wexd drops its rank at once (crash safety: wexd holds
 *    no end of a client's connection, so it sees every client leave);
 *  - the end of a socketpair is refused the same way (wexd would hand it
 *    to every consumer that fetches);
 *  - a chained segment whose parts' allocation sizes add up past 64 bits
 *    is refused (EOVERFLOW) instead of recording the wrapped sum.
 *
 * Found by review: cuda_vmm fds were kept unchecked; wexd then held a
 * duplicate of the producer's own socket, never saw it close, kept its
 * rank (and so its model) for good, and passed the socket - a live
 * connection as that producer - to consumers in their fetch replies.
 */
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "helpers.h"

#define SEG "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"cuda_vmm\",\"device\":\"GPU-a\","

static json_t *models(int ctl)
{
	json_t *r = t_raw_rpc(ctl, "{\"v\":1,\"op\":\"models\"}", NULL, 0);

	T_ASSERT(!strcmp(t_code(r), "OK"), "models: %s", t_msg(r));
	return r;
}

/* Whether wexd still lists `name` (polls until gone, up to 5 s). */
static int model_stays(int ctl, const char *name)
{
	for (double t0 = t_now(); t_now() - t0 < 5.0;) {
		json_t *r = models(ctl), *m;
		size_t i;
		int found = 0;

		json_array_foreach(json_object_get(r, "models"), i, m)
			found |= !strcmp(json_string_value(json_object_get(m, "name")) ?: "", name);
		json_decref(r);
		if (!found)
			return 0;
	}
	return 1;
}

static const char *expect(int fd, const char *req, const int *fds, int nfds, const char *code,
			  const char *what)
{
	static char msg[512];
	json_t *r = t_raw_rpc(fd, req, fds, nfds);

	snprintf(msg, sizeof(msg), "%s", t_msg(r));
	printf("%-50s -> %s: %s\n", what, t_code(r), msg);
	T_ASSERT(!strcmp(t_code(r), code), "%s: expected %s, got %s (%s)", what, code, t_code(r),
		 msg);
	json_decref(r);
	return msg;
}

int main(void)
{
	struct t_wexd d;
	int ctl, prod, sv[2], mfd, before, after;
	const char *msg;
	json_t *r;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	ctl = t_raw_connect(d.sock);
	before = t_wexd_fds_settle(&d, -1);

	/* 1. Its own connection as memory. */
	prod = t_raw_connect(d.sock);
	expect(prod, "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"loop\"}", NULL, 0,
	       "OK", "producer hello");
	r = t_raw_rpc(prod, SEG "\"size\":4096}", &prod, 1);
	printf("%-50s -> %s: %s\n", "its own connection as a cuda_vmm segment", t_code(r), t_msg(r));
	json_decref(r);
	close(prod);
	T_ASSERT(!model_stays(ctl, "loop"),
		 "a producer that registered its own connection as a segment and then closed it "
		 "still holds its rank 5 s later: wexd holds the client's end of the socket and "
		 "never sees it leave");

	/* 2. A socketpair's end, and memory beside it for the chain. */
	prod = t_raw_connect(d.sock);
	expect(prod, "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"sock\"}", NULL, 0,
	       "OK", "producer hello");
	T_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");
	msg = expect(prod, SEG "\"size\":4096}", &sv[0], 1, "EINVAL", "a socketpair end as a cuda_vmm segment");
	T_ASSERT(strstr(msg, "socket"), "the refusal names the socket: '%s'", msg);
	close(sv[0]);
	close(sv[1]);

	/* 3. Parts whose allocations add up past 2^64 bytes. */
	mfd = memfd_create("t-part", MFD_CLOEXEC);
	T_ASSERT(mfd >= 0 && ftruncate(mfd, 4096) == 0, "memfd");
	for (int i = 0; i < 3; i++)
		expect(prod, SEG "\"size\":4096,\"alloc_size\":9223372036854775807,\"part\":true}",
		       &mfd, 1, "OK", "part of 2^63-1 bytes");
	close(mfd);
	expect(prod, SEG "\"size\":4096,\"parts\":[0,1,2]}", NULL, 0, "EOVERFLOW",
	       "a chain of parts adding up past 2^64 bytes");
	close(prod);
	T_ASSERT(!model_stays(ctl, "sock"), "the second producer's model is gone with it");

	after = t_wexd_fds_settle(&d, before);
	T_ASSERT(after == before, "wexd holds %d fds after the producers left, %d before", after,
		 before);
	close(ctl);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
