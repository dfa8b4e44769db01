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
 *    is refused (EOVERFLOW) instead of recording the wrapped sum;
 *  - a host segment's fd reaches consumers read-only, whatever the access
 *    mode of the producer's fd (a memfd made by wex_segment_alloc is
 *    O_RDWR): through that fd a consumer (a peer the allow lists admit
 *    only as one) can neither map it writable nor shrink it nor add seals
 *    to it, so it cannot rewrite the trainer's weights under every other
 *    consumer, or cut the file under the producer's and the other
 *    consumers' mappings (SIGBUS).  (/proc/self/fd/N opens a memfd again
 *    writable all the same: only seals keep a consumer out; client_faults
 *    shows wex_segment_alloc's.)
 *
 * Found by review: cuda_vmm fds were kept unchecked; wexd then held a
 * duplicate of the producer's own socket, never saw it close, kept its
 * rank (and so its model) for good, and passed the socket - a live
 * connection as that producer - to consumers in their fetch replies.
 */
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "helpers.h"
#include "ipc/sock.h"
#include "proto.h"

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

/* 4. A raw producer registers `mfd` (O_RDWR) as a host segment of `model`
 * with one tensor; a raw consumer fetches it: the fd it receives must not
 * give it write access to the producer's memory.  `sealed`: the memfd is
 * sealed against resizing, as wex_segment_alloc's are. */
static void consumer_fd_readonly(const char *sock, const char *model, int sealed)
{
	char req[256], *p;
	struct wex_tensor t;
	int prod, cons, mfd, tfd, fds[8], nfds = 0, fdi, fl;
	size_t i;
	json_t *r, *s;
	void *w;

	mfd = memfd_create("t-host", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	T_ASSERT(mfd >= 0 && ftruncate(mfd, 8192) == 0, "memfd");
	if (sealed)
		T_ASSERT(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0, "seal");
	p = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	T_ASSERT(p != MAP_FAILED, "mmap");
	memset(p, 0x11, 8192);
	prod = t_raw_connect(sock);
	snprintf(req, sizeof(req),
		 "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"%s\",\"rank\":0,\"world\":1}",
		 model);
	expect(prod, req, NULL, 0, "OK", "producer hello");
	expect(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":8192}", &mfd,
	       1, "OK", "an O_RDWR memfd as a host segment");
	memset(&t, 0, sizeof(t));
	snprintf(t.name, sizeof(t.name), "w");
	t.dtype = WEX_DT_U8;
	t.ndim = 1;
	t.shape[0] = 8192;
	t.extent[0] = 8192;
	tfd = wex__table_pack(&t, NULL, 1);
	T_ASSERT(tfd >= 0, "pack table: %d", tfd);
	expect(prod, "{\"v\":1,\"op\":\"register_tensors\"}", &tfd, 1, "OK", "its tensor");
	close(tfd);

	cons = t_raw_connect(sock);
	snprintf(req, sizeof(req),
		 "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"%s\",\"group\":\"g\",\"rank\":0,\"world\":1}",
		 model);
	expect(cons, req, NULL, 0, "OK", "consumer hello");
	t_raw_send(cons, "{\"v\":1,\"op\":\"fetch\"}", 20, NULL, 0);
	{
		char buf[65536];
		int mflags = 0;
		ssize_t n = wex_sock_recv(cons, buf, sizeof(buf) - 1, fds, 8, &nfds, &mflags, 0);

		T_ASSERT(n > 0, "fetch reply: %zd", n);
		buf[n] = '\0';
		r = json_loads(buf, 0, NULL);
	}
	T_ASSERT(r && !strcmp(t_code(r), "OK"), "fetch: %s", r ? t_msg(r) : "not JSON");
	fdi = -1;
	json_array_foreach(json_object_get(r, "segments"), i, s)
		fdi = (int)json_integer_value(json_object_get(s, "fd"));
	json_decref(r);
	T_ASSERT(fdi >= 0 && fdi < nfds, "the segment's fd (index %d of %d)", fdi, nfds);
	fl = fcntl(fds[fdi], F_GETFL);
	w = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fds[fdi], 0);
	if (w != MAP_FAILED) {
		memset(w, 0x66, 4096);
		munmap(w, 8192);
	}
	printf("%-50s -> access mode %s, writable mapping %s\n",
	       sealed ? "a consumer's fd of a sealed memfd" : "a consumer's fd of an unsealed memfd",
	       (fl & O_ACCMODE) == O_RDONLY ? "O_RDONLY" : "writable",
	       w == MAP_FAILED ? "refused" : "made");
	T_ASSERT(p[0] == 0x11 && p[4095] == 0x11,
		 "a consumer wrote into the producer's memory through the fd its fetch received "
		 "(%s memfd)", sealed ? "sealed" : "unsealed");
	T_ASSERT(w == MAP_FAILED && (fl & O_ACCMODE) == O_RDONLY,
		 "a consumer's segment fd is open for writing (%#x)", fl);
	T_ASSERT(ftruncate(fds[fdi], 0) < 0, "a consumer shrank the producer's memfd");
	T_ASSERT(fcntl(fds[fdi], F_ADD_SEALS, F_SEAL_FUTURE_WRITE) < 0,
		 "a consumer sealed the producer's memfd against its own writes");
	/* The bytes still reach it. */
	w = mmap(NULL, 8192, PROT_READ, MAP_SHARED, fds[fdi], 0);
	T_ASSERT(w != MAP_FAILED && ((unsigned char *)w)[8191] == 0x11, "the consumer reads the bytes");
	p[8191] = 0x22;
	T_ASSERT(((unsigned char *)w)[8191] == 0x22, "the consumer sees the producer's writes");
	munmap(w, 8192);
	wex_sock_close_fds(fds, nfds);
	close(cons);
	close(prod);
	munmap(p, 8192);
	close(mfd);
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

	/* 4. Host memory reaches consumers read-only. */
	consumer_fd_readonly(d.sock, "ro-sealed", 1);
	consumer_fd_readonly(d.sock, "ro-unsealed", 0);
	T_ASSERT(!model_stays(ctl, "ro-sealed") && !model_stays(ctl, "ro-unsealed"),
		 "the host producers' models are gone with them");

	after = t_wexd_fds_settle(&d, before);
	T_ASSERT(after == before, "wexd holds %d fds after the producers left, %d before", after,
		 before);
	close(ctl);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
