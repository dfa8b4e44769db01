/* SPDX-License-Identifier: MIT */
/*
 * proto_roundtrip - proves the control protocol's basic round trips: hello
 * for each role (and refused for a rank already held or a world size that
 * disagrees), status/models/clients/plans/ping, a producer registering a
 * host segment (memfd over SCM_RIGHTS) and a tensor table (sealed memfd)
 * that status then shows, and that every op sent by the wrong role is
 * refused with EPERM (and any op before hello with EPROTO), with the
 * connection still usable afterwards.
 */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "helpers.h"
#include "proto.h"

static json_t *expect(int fd, const char *req, const int *fds, int nfds, const char *code)
{
	json_t *r = t_raw_rpc(fd, req, fds, nfds);

	if (strcmp(t_code(r), code))
		T_FAIL("%s: expected %s, got %s (%s)", req, code, t_code(r), t_msg(r));
	return r;
}

static void expect_free(int fd, const char *req, const int *fds, int nfds, const char *code)
{
	json_decref(expect(fd, req, fds, nfds, code));
}

int main(void)
{
	struct t_wexd d;
	struct wex_tensor t[2];
	int prod, cons, admin, anon, anon2, mfd, tfd;
	json_t *r, *st, *m, *p0;
	size_t i;
	const char *s = NULL;

	t_wexd_start(&d);
	t_check_backend(d.sock);

	/* Before hello only the monitoring ops work. */
	anon = t_raw_connect(d.sock);
	expect_free(anon, "{\"v\":1,\"op\":\"ping\"}", NULL, 0, "OK");
	expect_free(anon, "{\"v\":1,\"op\":\"begin_write\",\"version\":1}", NULL, 0, "EPROTO");
	expect_free(anon, "{\"v\":1,\"op\":\"acquire\"}", NULL, 0, "EPROTO");
	r = expect(anon, "{\"v\":1,\"op\":\"models\"}", NULL, 0, "OK");
	T_ASSERT(json_is_array(json_object_get(r, "models")) &&
			 json_array_size(json_object_get(r, "models")) == 0,
		 "a fresh wexd lists no models");
	json_decref(r);

	/* hello for each role; the reply names the protocol version. */
	prod = t_raw_connect(d.sock);
	r = expect(prod,
		   "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"m1\",\"rank\":0,\"world\":1,\"name\":\"p\"}",
		   NULL, 0, "OK");
	T_ASSERT(json_integer_value(json_object_get(r, "v")) == 1, "hello reply names v 1");
	T_ASSERT(json_integer_value(json_object_get(r, "published")) == 0, "nothing published");
	json_decref(r);
	expect_free(prod, "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"m1\"}", NULL, 0,
		    "EINVAL"); /* a second hello */
	cons = t_raw_connect(d.sock);
	expect_free(cons,
		    "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"m1\",\"group\":\"g\",\"rank\":0,\"world\":1}",
		    NULL, 0, "OK");
	/* A rank is held by one connection at a time; a group's size is fixed. */
	anon2 = t_raw_connect(d.sock);
	expect_free(anon2, "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"m1\",\"rank\":0,\"world\":1}",
		    NULL, 0, "EADDRINUSE");
	expect_free(anon2, "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"m1\",\"rank\":0,\"world\":2}",
		    NULL, 0, "EINVAL");
	expect_free(anon2, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"m1\",\"group\":\"g\",\"rank\":0,\"world\":1}",
		    NULL, 0, "EADDRINUSE");
	expect_free(anon2, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"m1\",\"group\":\"g\",\"rank\":1,\"world\":2}",
		    NULL, 0, "EINVAL");
	expect_free(anon2, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"rank\":0}", NULL, 0,
		    "EINVAL"); /* no model */
	expect_free(anon2, "{\"v\":1,\"op\":\"hello\",\"role\":\"wizard\"}", NULL, 0, "EINVAL");
	close(anon2);
	admin = t_raw_connect(d.sock);
	r = expect(admin, "{\"v\":1,\"op\":\"hello\",\"role\":\"admin\"}", NULL, 0, "OK");
	T_ASSERT(json_unpack(r, "{s:s}", "io", &s) == 0 && s, "admin hello names the io backend");
	json_decref(r);

	/* A producer registers a host segment and its tensors. */
	mfd = memfd_create("t-seg", MFD_CLOEXEC);
	T_ASSERT(mfd >= 0 && ftruncate(mfd, 1 << 16) == 0, "memfd");
	r = expect(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":65536}", &mfd,
		   1, "OK");
	T_ASSERT(json_integer_value(json_object_get(r, "segment")) == 0, "first segment is id 0");
	json_decref(r);
	memset(t, 0, sizeof(t));
	for (int k = 0; k < 2; k++) {
		snprintf(t[k].name, sizeof(t[k].name), "w%d", k);
		t[k].dtype = WEX_DT_BF16;
		t[k].ndim = 2;
		t[k].shape[0] = 64;
		t[k].shape[1] = 32;
		t[k].extent[0] = 64;
		t[k].extent[1] = 32;
		t[k].offset = (uint64_t)k * 4096;
	}
	tfd = wex__table_pack(t, NULL, 2);
	T_ASSERT(tfd >= 0, "pack table: %d", tfd);
	r = expect(prod, "{\"v\":1,\"op\":\"register_tensors\"}", &tfd, 1, "OK");
	T_ASSERT(json_integer_value(json_object_get(r, "count")) == 2, "two tensors registered");
	json_decref(r);

	/* status, models and clients show them. */
	st = t_status(d.sock);
	T_ASSERT(json_unpack(st, "{s:{s:s}}", "daemon", "socket", &s) == 0 && !strcmp(s, d.sock),
		 "status names the socket");
	m = t_status_model(st, "m1");
	T_ASSERT(m, "status lists model m1");
	p0 = json_array_get(json_object_get(m, "producers"), 0);
	T_ASSERT(json_integer_value(json_object_get(p0, "segments")) == 1 &&
			 json_integer_value(json_object_get(p0, "tensors")) == 2 &&
			 json_integer_value(json_object_get(p0, "bytes")) == 65536 &&
			 json_integer_value(json_object_get(p0, "pid")) == getpid(),
		 "status shows rank 0 with 1 segment, 2 tensors, 65536 bytes, our pid");
	T_ASSERT(json_array_size(json_object_get(m, "groups")) == 1, "one consumer group");
	T_ASSERT(json_array_size(json_object_get(st, "clients")) >= 4, "clients listed in status");
	json_decref(st);
	r = expect(admin, "{\"v\":1,\"op\":\"clients\"}", NULL, 0, "OK");
	{
		int roles = 0;
		json_t *c;

		json_array_foreach(json_object_get(r, "clients"), i, c) {
			const char *role = json_string_value(json_object_get(c, "role"));

			roles |= !strcmp(role, "producer") ? 1 : !strcmp(role, "consumer") ? 2 :
				 !strcmp(role, "admin") ? 4 : 0;
		}
		T_ASSERT(roles == 7, "clients lists a producer, a consumer and an admin (%d)", roles);
	}
	json_decref(r);
	r = expect(admin, "{\"v\":1,\"op\":\"plans\"}", NULL, 0, "OK");
	T_ASSERT(json_is_array(json_object_get(r, "plans")), "plans is an array");
	json_decref(r);

	/* Wrong roles: consumers and admins cannot produce, producers and
	 * admins cannot consume. */
	expect_free(cons, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":65536}", &mfd,
		    1, "EPERM");
	expect_free(cons, "{\"v\":1,\"op\":\"register_tensors\"}", &tfd, 1, "EPERM");
	expect_free(cons, "{\"v\":1,\"op\":\"begin_write\",\"version\":1}", NULL, 0, "EPERM");
	expect_free(cons, "{\"v\":1,\"op\":\"publish\",\"version\":1}", NULL, 0, "EPERM");
	expect_free(prod, "{\"v\":1,\"op\":\"attach\"}", NULL, 0, "EPERM");
	expect_free(prod, "{\"v\":1,\"op\":\"acquire\",\"mode\":1}", NULL, 0, "EPERM");
	expect_free(prod, "{\"v\":1,\"op\":\"fetch\"}", NULL, 0, "EPERM");
	expect_free(prod, "{\"v\":1,\"op\":\"release\"}", NULL, 0, "EPERM");
	expect_free(admin, "{\"v\":1,\"op\":\"begin_write\",\"version\":1}", NULL, 0, "EPERM");
	expect_free(admin, "{\"v\":1,\"op\":\"acquire\"}", NULL, 0, "EPERM");

	/* The connections still work, and the producer's tables are intact. */
	expect_free(prod, "{\"v\":1,\"op\":\"ping\"}", NULL, 0, "OK");
	expect_free(cons, "{\"v\":1,\"op\":\"ping\"}", NULL, 0, "OK");
	r = expect(prod, "{\"v\":1,\"op\":\"begin_write\",\"version\":1}", NULL, 0, "OK");
	json_decref(r);
	expect_free(prod, "{\"v\":1,\"op\":\"publish\",\"version\":1}", NULL, 0, "OK");
	r = expect(cons, "{\"v\":1,\"op\":\"acquire\",\"mode\":2,\"timeout_ms\":2000}", NULL, 0, "OK");
	T_ASSERT(json_integer_value(json_object_get(r, "version")) == 1, "consumer acquires v1");
	json_decref(r);
	expect_free(cons, "{\"v\":1,\"op\":\"release\",\"version\":1}", NULL, 0, "OK");

	close(mfd);
	close(tfd);
	close(anon);
	close(prod);
	close(cons);
	close(admin);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
