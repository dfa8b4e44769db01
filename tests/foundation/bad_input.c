/* SPDX-License-Identifier: MIT */
/*
 * bad_input - proves that wexd validates every message and survives bad
 * input (DESIGN 7, 9): malformed JSON and non-objects (EBADMSG), unknown
 * ops (EOPNOTSUPP), oversized messages (EMSGSIZE), another protocol
 * version (WEX_EPROTO_VERSION), missing and unexpected fds (EINVAL), too
 * many fds in one message (control data truncated), an unsealed memfd as
 * a tensor table (EPERM), a table with a box outside its shape (EINVAL
 * naming the tensor), a segment fd shorter than its size, and a client
 * that disconnects while its begin_write waits.  After each case wexd
 * still answers status, and at the end its open fd count equals the count
 * before the sequence (every fd a bad message carried was closed).
 *
 * Cases found by proto_fuzz: an error message cut inside a multi-byte
 * character or quoting a tensor name that is not UTF-8 (jansson refused
 * to build the reply and none was sent), a client name cut inside a
 * character (the client vanished from clients and status), a reply too
 * large for one message (the requester's connection was dropped: status
 * while four producers claim worlds of 1024 ranks; a world of 65536
 * lists only its ranks in use), a timeout_ms too
 * large for nanoseconds (it wrapped into an immediate timeout), and a
 * pipe or a directory accepted as host memory; and a write-only fd
 * accepted as host memory (every consumer's fetch then failed).
 *
 * Also: strides whose span wrapped to 0 bytes (taken in any segment), a
 * consumer's byte stride past int64 and strides that shrink outward (the
 * planner overflowed int64: a sanitized wexd aborted), a fetch from a
 * negative start (an empty page), and config get/set fields of another
 * type (read as absent).  And a producer's table of thousands of
 * overlapping pieces of one tensor, which held wexd's event loop for
 * seconds planning a consumer's fetch: refused, to the raw fetch and to
 * libwex's wex_sync, naming the tensor and the bound.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "helpers.h"
#include "ipc/sock.h"
#include "proto.h"

static int ctl;

static void alive(const char *after)
{
	json_t *r = t_raw_rpc(ctl, "{\"v\":1,\"op\":\"status\"}", NULL, 0);

	if (strcmp(t_code(r), "OK"))
		T_FAIL("status after %s: %s", after, t_code(r));
	json_decref(r);
}

static void expect_raw(int fd, const void *buf, size_t len, const int *fds, int nfds,
		       const char *code, const char *msg_part, const char *what)
{
	json_t *r;

	t_raw_send(fd, buf, len, fds, nfds);
	r = t_raw_recv(fd);
	if (strcmp(t_code(r), code))
		T_FAIL("%s: expected %s, got %s (%s)", what, code, t_code(r), t_msg(r));
	if (msg_part && !strstr(t_msg(r), msg_part))
		T_FAIL("%s: message '%s' does not mention '%s'", what, t_msg(r), msg_part);
	printf("%-40s -> %s: %s\n", what, code, t_msg(r));
	json_decref(r);
	alive(what);
}

static void expect_req(int fd, const char *req, const int *fds, int nfds, const char *code,
		       const char *msg_part, const char *what)
{
	expect_raw(fd, req, strlen(req), fds, nfds, code, msg_part, what);
}

static struct wex_tensor tensor(const char *name, uint64_t off)
{
	struct wex_tensor t;

	memset(&t, 0, sizeof(t));
	snprintf(t.name, sizeof(t.name), "%s", name);
	t.dtype = WEX_DT_F32;
	t.ndim = 2;
	t.shape[0] = 16;
	t.shape[1] = 16;
	t.extent[0] = 16;
	t.extent[1] = 16;
	t.offset = off;
	return t;
}

int main(void)
{
	struct t_wexd d;
	int before, after = -1, fd, prod, cons, mfd, tfd, many[100];
	static char big[70000];
	struct wex_tensor t[2];
	json_t *r;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	ctl = t_raw_connect(d.sock);
	alive("start");
	before = t_fd_count(d.pid);

	fd = t_raw_connect(d.sock);
	expect_req(fd, "{\"v\":1,\"op\":\"status\"", NULL, 0, "EBADMSG", "malformed JSON",
		   "malformed JSON");
	expect_raw(fd, "\0\1\2garbage\xff", 12, NULL, 0, "EBADMSG", NULL, "binary garbage");
	expect_req(fd, "[1,2,3]", NULL, 0, "EBADMSG", "object", "a JSON array");
	expect_req(fd, "\"status\"", NULL, 0, "EBADMSG", NULL, "a JSON string");
	expect_req(fd, "{\"op\":\"status\"}", NULL, 0, "EBADMSG", NULL, "no protocol version");
	expect_req(fd, "{\"v\":1,\"op\":7}", NULL, 0, "EBADMSG", NULL, "op not a string");
	expect_req(fd, "{\"v\":1,\"op\":\"status\",\"op\":\"models\"}", NULL, 0, "EBADMSG", NULL,
		   "duplicate keys");
	expect_req(fd, "{\"v\":1,\"op\":\"frobnicate\"}", NULL, 0, "EOPNOTSUPP", "frobnicate",
		   "unknown op");
	expect_req(fd, "{\"v\":2,\"op\":\"status\"}", NULL, 0, "WEX_EPROTO_VERSION", "version 2",
		   "protocol version 2");
	/* A field of the wrong type: config get answered every field as if
	 * none was named, and config set said a value given as a number was
	 * missing ("needs 'name' and 'value'"). */
	expect_req(fd, "{\"v\":1,\"op\":\"config_get\",\"name\":5}", NULL, 0, "EINVAL",
		   "Expected string", "config_get with a name that is a number");
	expect_req(fd, "{\"v\":1,\"op\":\"config_set\",\"name\":\"sync_timeout_ms\",\"value\":2500}",
		   NULL, 0, "EINVAL", "Expected string", "config_set with a value that is a number");
	{
		/* The error quotes at most 64 bytes of the op: 21 3-byte
		 * characters and a third of the 22nd. */
		char op[256] = "{\"v\":1,\"op\":\"";

		for (int i = 0; i < 30; i++)
			strcat(op, "\xe2\x82\xac");
		strcat(op, "\"}");
		expect_req(fd, op, NULL, 0, "EOPNOTSUPP", "unknown request",
			   "unknown op cut inside a character");
	}
	{
		/* Names with control characters (terminal escapes, line
		 * breaks) would reach logs and operators' terminals. */
		int esc = t_raw_connect(d.sock);

		expect_req(esc, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"evil\\u001b[2J\"}",
			   NULL, 0, "EINVAL", "control characters", "a model name with an escape");
		expect_req(esc, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"m\",\"group\":\"g\\nfake\"}",
			   NULL, 0, "EINVAL", "control characters", "a group name with a line break");
		/* The C1 controls too (U+0080..U+009F): U+009B is CSI, which
		 * terminals act on in UTF-8 as they do on ESC [: wexctl status
		 * would clear the operator's screen, or worse. */
		expect_req(esc, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"evil\\u009b2J\"}",
			   NULL, 0, "EINVAL", "control characters", "a model name with a C1 CSI");
		expect_req(esc, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"m\",\"group\":\"g\\u0085fake\"}",
			   NULL, 0, "EINVAL", "control characters", "a group name with a C1 line break");
		close(esc);
	}
	{
		/* A client name is kept to 63 bytes: 31 'é' and half of one. */
		char hello[256] = "{\"v\":1,\"op\":\"hello\",\"role\":\"admin\",\"name\":\"";
		int named = 0, anon = t_raw_connect(d.sock);
		size_t i;
		json_t *c;

		for (int k = 0; k < 40; k++)
			strcat(hello, "\xc3\xa9");
		strcat(hello, "\"}");
		expect_req(anon, hello, NULL, 0, "OK", NULL, "hello with a long multi-byte name");
		r = t_raw_rpc(ctl, "{\"v\":1,\"op\":\"clients\"}", NULL, 0);
		json_array_foreach(json_object_get(r, "clients"), i, c) {
			const char *nm = json_string_value(json_object_get(c, "name"));

			named |= nm && !strncmp(nm, "\xc3\xa9\xc3\xa9", 4);
		}
		json_decref(r);
		T_ASSERT(named, "clients lists the client whose name was cut");
		close(anon);
	}
	{
		/* A client name's controls, C1 too, are shown as '?' (its
		 * hello is not refused: the name is only a label). */
		int k = t_raw_connect(d.sock), seen = 0;
		size_t i;
		json_t *c;

		expect_req(k, "{\"v\":1,\"op\":\"hello\",\"role\":\"admin\",\"name\":\"c1\\u009b2J\\u0007x\"}",
			   NULL, 0, "OK", NULL, "hello with controls in its name");
		r = t_raw_rpc(ctl, "{\"v\":1,\"op\":\"clients\"}", NULL, 0);
		json_array_foreach(json_object_get(r, "clients"), i, c) {
			const char *nm = json_string_value(json_object_get(c, "name"));

			seen |= nm && !strcmp(nm, "c1??2J?x");
		}
		json_decref(r);
		T_ASSERT(seen, "clients shows the name's controls as '?'");
		close(k);
	}
	memset(big, ' ', sizeof(big));
	memcpy(big, "{\"v\":1,\"op\":\"status\"", 20);
	big[sizeof(big) - 1] = '}';
	expect_raw(fd, big, sizeof(big), NULL, 0, "EMSGSIZE", NULL, "70000-byte message");


	/* fds where none belong, and too many of them. */
	mfd = memfd_create("t-bad", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	T_ASSERT(mfd >= 0 && ftruncate(mfd, 4096) == 0, "memfd");
	expect_req(fd, "{\"v\":1,\"op\":\"status\"}", &mfd, 1, "EINVAL", "fds", "status with an fd");
	for (int i = 0; i < 100; i++)
		many[i] = mfd;
	expect_req(fd, "{\"v\":1,\"op\":\"status\"}", many, 100, "EINVAL", "control data truncated",
		   "100 fds in one message");
	expect_req(fd, "{\"v\":1,\"op\":\"register_tensors\"}", many, 100, "EINVAL",
		   "control data truncated", "register_tensors with 100 fds");

	/* A producer connection for the table cases. */
	prod = t_raw_connect(d.sock);
	r = t_raw_rpc(prod, "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"bad\"}", NULL, 0);
	T_ASSERT(!strcmp(t_code(r), "OK"), "producer hello: %s", t_msg(r));
	json_decref(r);
	expect_req(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":65536}", &mfd,
		   1, "EINVAL", "smaller than size", "segment fd shorter than its size");
	expect_req(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":4096}", NULL,
		   0, "EINVAL", NULL, "host segment without its fd");
	{
		int dfd = open(d.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), p[2];

		T_ASSERT(dfd >= 0 && pipe2(p, O_CLOEXEC) == 0, "dir, pipe");
		expect_req(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":16}",
			   &dfd, 1, "EINVAL", "regular file", "a directory as host memory");
		expect_req(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":16}",
			   &p[0], 1, "EINVAL", "regular file", "a pipe as host memory");
		close(dfd);
		close(p[0]);
		close(p[1]);
	}
	{
		/* Consumers mmap host memory for reading through wexd's
		 * duplicate of the fd: a write-only one was taken, and then
		 * every consumer's fetch of the rank's segments failed
		 * (EACCES "importing host segment 0"). */
		char path[400];
		int wfd;

		snprintf(path, sizeof(path), "%s/wo", d.dir);
		wfd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
		T_ASSERT(wfd >= 0 && ftruncate(wfd, 4096) == 0, "write-only file");
		expect_req(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":4096}",
			   &wfd, 1, "EBADF", "open for reading", "a write-only fd as host memory");
		close(wfd);
		unlink(path);
	}
	expect_req(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":4096,\"handle_offset\":1,\"alloc_size\":4096}",
		   &mfd, 1, "EINVAL", "exceed the allocation", "a segment running past its allocation");
	/* Named as what is wrong (it said "size must be positive"). */
	expect_req(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":4096,\"handle_offset\":-1,\"alloc_size\":4096}",
		   &mfd, 1, "EINVAL", "handle_offset -1 is negative", "a negative handle_offset");
	expect_req(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":4096,\"alloc_size\":-4096}",
		   &mfd, 1, "EINVAL", "alloc_size -4096 is negative", "a negative alloc_size");
	expect_req(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":4096}", &mfd,
		   1, "OK", NULL, "good segment");

	/* Chained segments (a range over several VMM allocations): wexd
	 * checks the parts' bookkeeping; the fds are opaque to it here. */
#define SEG "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"cuda_vmm\",\"device\":\"GPU-a\","
#define FABRIC16 "0123456789abcdef"
#define FABRIC64 FABRIC16 FABRIC16 FABRIC16 FABRIC16 FABRIC16 FABRIC16 FABRIC16 FABRIC16
	expect_req(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":4096,\"part\":true}",
		   &mfd, 1, "EINVAL", "only cuda_vmm", "host memory as a part");
	expect_req(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"cuda_vmm\",\"device\":\"GPU-\\u001b[2J\",\"size\":4096}",
		   &mfd, 1, "EINVAL", "printable", "a device name with a control character");
	expect_req(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"cuda_vmm\",\"device\":\"GPU-0123456789abcdef0123456789abcdef0123456789abcdef\",\"size\":4096}",
		   &mfd, 1, "EINVAL", "printable", "a device name too long");
	expect_req(prod, SEG "\"size\":4096,\"handle\":\"00ff\"}", NULL, 0, "EINVAL", "takes 1 fd",
		   "VMM memory with neither an fd nor a fabric handle");
	/* Consumers refuse any other length at import: each fetch failed
	 * where the register had been answered OK. */
	expect_req(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"cuda_ipc\",\"device\":\"GPU-a\",\"size\":4096,\"handle\":\"00ff\"}",
		   NULL, 0, "EINVAL", "64 bytes (CUipcMemHandle), got 2", "a 2-byte legacy IPC handle");
	expect_req(prod, SEG "\"size\":4096,\"handle\":\"00ff\"}", &mfd, 1, "EINVAL",
		   "fabric handle, got 2", "VMM memory with an fd and a 2-byte handle");
	expect_req(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":4096,\"handle\":\"00\"}",
		   &mfd, 1, "EINVAL", "host handle is empty", "host memory with a handle");
	expect_req(prod, SEG "\"size\":4096,\"handle\":\"+1-10g\"}", &mfd, 1, "EINVAL", "must be hex",
		   "a handle with signs and a non-hex digit");
	expect_req(prod, SEG "\"size\":4096,\"part\":true,\"parts\":[0,1]}", NULL, 0, "EINVAL",
		   "cannot chain", "a part that chains parts");
	expect_req(prod, SEG "\"size\":4096,\"parts\":[0,0]}", NULL, 0, "EINVAL", "not a part",
		   "chaining a segment that is not a part");
	expect_req(prod, SEG "\"size\":2097152,\"alloc_size\":2097152,\"part\":true}", &mfd, 1, "OK",
		   NULL, "part 1");
	expect_req(prod, SEG "\"size\":2097152,\"alloc_size\":2097152,\"part\":true}", &mfd, 1, "OK",
		   NULL, "part 2");
	expect_req(prod, SEG "\"size\":4096,\"parts\":[1]}", NULL, 0, "EINVAL", "2 or more",
		   "a chain of one part");
	expect_req(prod, SEG "\"size\":4096,\"parts\":[1,1]}", NULL, 0, "EINVAL", "twice",
		   "a part listed twice");
	expect_req(prod, SEG "\"size\":4096,\"parts\":[1,2]}", &mfd, 1, "EINVAL", "takes 0 fd",
		   "a chained segment with an fd");
	expect_req(prod, SEG "\"size\":4194305,\"parts\":[1,2]}", NULL, 0, "EINVAL", "exceed",
		   "a chained segment larger than its parts");
	expect_req(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"cuda_vmm\",\"device\":\"GPU-b\",\"size\":4096,\"parts\":[1,2]}",
		   NULL, 0, "EINVAL", "device GPU-b", "parts of another device");
	expect_req(prod, SEG "\"size\":4194304,\"parts\":[1,2]}", NULL, 0, "OK", NULL,
		   "good chained segment");
	expect_req(prod, SEG "\"size\":4096,\"parts\":[1,2]}", NULL, 0, "EINVAL", "already chained",
		   "parts chained twice");
	expect_req(prod, SEG "\"size\":4096,\"handle\":\"" FABRIC64 "\"}", NULL, 0, "OK", NULL,
		   "VMM memory with a 64-byte fabric handle and no fd (fabric-only memory)");
#undef SEG
#undef FABRIC64
#undef FABRIC16
	t[0] = tensor("on.part", 0);
	t[0].segment = 1;
	tfd = wex__table_pack(t, NULL, 1);
	T_ASSERT(tfd >= 0, "pack");
	expect_req(prod, "{\"v\":1,\"op\":\"register_tensors\"}", &tfd, 1, "EINVAL",
		   "part of a chained segment", "tensor on a part");
	close(tfd);
	expect_req(prod, "{\"v\":1,\"op\":\"register_tensors\"}", NULL, 0, "EINVAL", "fd",
		   "register_tensors without its fd");
	expect_req(prod, "{\"v\":1,\"op\":\"register_tensors\"}", &mfd, 1, "EPERM", NULL,
		   "unsealed memfd as tensor table");
	{
		int fds2[2] = { mfd, mfd };

		expect_req(prod, "{\"v\":1,\"op\":\"register_tensors\"}", fds2, 2, "EINVAL", NULL,
			   "register_tensors with 2 fds");
	}
	t[0] = tensor("ok.weight", 0);
	t[1] = tensor("bad.box", 1024);
	t[1].start[1] = 8; /* [8, 24) of a 16-wide dim */
	tfd = wex__table_pack(t, NULL, 2);
	T_ASSERT(tfd >= 0, "pack");
	expect_req(prod, "{\"v\":1,\"op\":\"register_tensors\"}", &tfd, 1, "EINVAL", "bad.box",
		   "box outside the shape");
	close(tfd);
	t[1] = tensor("past.end", 4000); /* 1 KiB at 4000 of a 4 KiB segment */
	tfd = wex__table_pack(t, NULL, 2);
	expect_req(prod, "{\"v\":1,\"op\":\"register_tensors\"}", &tfd, 1, "EINVAL", "past.end",
		   "tensor past its segment's end");
	close(tfd);
	t[1] = tensor("bad.seg", 1024);
	t[1].segment = 5;
	tfd = wex__table_pack(t, NULL, 2);
	expect_req(prod, "{\"v\":1,\"op\":\"register_tensors\"}", &tfd, 1, "EINVAL", "bad.seg",
		   "tensor in a missing segment");
	close(tfd);
	t[1] = tensor("huge.dims", 1024);
	t[1].shape[0] = t[1].extent[0] = 1ull << 62; /* bytes overflow 64 bits */
	tfd = wex__table_pack(t, NULL, 2);
	expect_req(prod, "{\"v\":1,\"op\":\"register_tensors\"}", &tfd, 1, "EOVERFLOW",
		   "huge.dims", "tensor size overflowing 64 bits");
	close(tfd);
	/* Strides whose highest element offset is exactly 2^64 - 1: one
	 * element more wrapped the span to 0 bytes, which every segment
	 * holds (6 elements reaching 2^66 bytes in were taken at offset 0,
	 * and the planner multiplied the strides past int64). */
	t[1] = tensor("wrapped.span", 1024);
	t[1].shape[0] = t[1].extent[0] = 3;
	t[1].shape[1] = t[1].extent[1] = 2;
	t[1].strides[0] = INT64_MAX; /* 2 * (2^63 - 1) + 1 = 2^64 - 1 */
	t[1].strides[1] = 1;
	tfd = wex__table_pack(t, NULL, 2);
	expect_req(prod, "{\"v\":1,\"op\":\"register_tensors\"}", &tfd, 1, "EOVERFLOW",
		   "wrapped.span", "strides whose span wraps to 0 bytes");
	close(tfd);
	{
		/* A header whose count disagrees with the table's size. */
		struct {
			struct wex_table_hdr h;
			struct wex_wire_tensor w;
		} bad;

		memset(&bad, 0, sizeof(bad));
		bad.h.magic = WEX_TABLE_MAGIC;
		bad.h.version = WEX_TABLE_VERSION;
		bad.h.count = 1ull << 60;
		bad.h.entry_size = sizeof(bad.w);
		tfd = wex_table_seal(&bad, sizeof(bad), "t-bad");
		T_ASSERT(tfd >= 0, "seal");
		expect_req(prod, "{\"v\":1,\"op\":\"register_tensors\"}", &tfd, 1, "EINVAL",
			   "bad header", "table count beyond its size");
		close(tfd);
		bad.h.count = 1;
		memset(bad.w.name, 'x', sizeof(bad.w.name)); /* no NUL */
		tfd = wex_table_seal(&bad, sizeof(bad), "t-bad");
		expect_req(prod, "{\"v\":1,\"op\":\"register_tensors\"}", &tfd, 1, "EINVAL",
			   "NUL", "tensor name without NUL");
		close(tfd);
	}
	t[1] = tensor("bad\xff\xc3.name", 1024); /* not UTF-8 */
	t[1].dtype = 999;
	tfd = wex__table_pack(t, NULL, 2);
	expect_req(prod, "{\"v\":1,\"op\":\"register_tensors\"}", &tfd, 1, "EINVAL", "invalid dtype",
		   "tensor name that is not UTF-8");
	close(tfd);
	t[1] = tensor("fine.weight", 2048);
	tfd = wex__table_pack(t, NULL, 2);
	expect_req(prod, "{\"v\":1,\"op\":\"register_tensors\"}", &tfd, 1, "OK", NULL, "good table");
	close(tfd);
	expect_req(prod, "{\"v\":1,\"op\":\"begin_write\",\"version\":-3}", NULL, 0, "EINVAL", NULL,
		   "negative version");
	expect_req(prod, "{\"v\":1,\"op\":\"begin_write\",\"version\":1,\"timeout_ms\":9223372036854775807}",
		   NULL, 0, "EINVAL", "timeout_ms", "begin_write timeout_ms past nanoseconds");
	expect_req(prod, "{\"v\":1,\"op\":\"publish\",\"version\":9}", NULL, 0, "EINVAL", NULL,
		   "publish without begin_write");
	expect_req(prod, "{\"v\":1,\"op\":\"begin_write\",\"version\":1}", NULL, 0, "OK", NULL,
		   "begin_write v1");
	expect_req(prod, "{\"v\":1,\"op\":\"publish\",\"version\":1}", NULL, 0, "OK", NULL, "publish v1");

	/* A consumer holds a lease; a client begins a write that must wait,
	 * then disconnects mid-request. */
	cons = t_raw_connect(d.sock);
	expect_req(cons, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"bad\"}", NULL, 0,
		   "OK", NULL, "consumer hello");
	/* The GPU an attach names (its layout's): a printable UUID string. */
	expect_req(cons, "{\"v\":1,\"op\":\"attach\",\"device\":7}", NULL, 0, "EINVAL",
		   "device must be a string", "attach with a numeric device");
	expect_req(cons, "{\"v\":1,\"op\":\"attach\",\"device\":\"GPU-\\u001b[2J\"}", NULL, 0,
		   "EINVAL", "printable", "attach with a control character in its device");
	expect_req(cons, "{\"v\":1,\"op\":\"attach\",\"device\":\"GPU-0123456789abcdef0123456789abcdef0123456789abcdef\"}",
		   NULL, 0, "EINVAL", "printable", "attach with a device name too long");
	{
		/* A stride of 2^61 f32 elements: 2^63 + 32 bytes in all, under
		 * 2^64, and taken; the planner's byte stride (2^63) then
		 * overflowed int64 at the next fetch (a sanitized wexd
		 * aborted there). */
		struct wex_tensor w = tensor("big.stride", 0);

		w.shape[0] = w.extent[0] = 2;
		w.shape[1] = w.extent[1] = 8;
		w.strides[0] = 1ll << 61;
		w.strides[1] = 1;
		tfd = wex__table_pack(&w, NULL, 1);
		T_ASSERT(tfd >= 0, "pack");
		expect_req(cons, "{\"v\":1,\"op\":\"attach\"}", &tfd, 1, "EOVERFLOW", "big.stride",
			   "attach with a byte stride past int64");
		close(tfd);
		/* Strides that do not grow outward, (1, 2^57) of f32: under
		 * 2^63 bytes, but the planner's test whether the dims tile
		 * each other multiplied 16 by 2^59 in int64 (a sanitized wexd
		 * aborted at this fetch). */
		w = tensor("ok.weight", 0);
		w.strides[0] = 1;
		w.strides[1] = 1ll << 57;
		tfd = wex__table_pack(&w, NULL, 1);
		T_ASSERT(tfd >= 0, "pack");
		expect_req(cons, "{\"v\":1,\"op\":\"attach\"}", &tfd, 1, "OK", NULL,
			   "attach with strides that shrink outward");
		close(tfd);
		expect_req(cons, "{\"v\":1,\"op\":\"fetch\"}", NULL, 0, "OK", NULL,
			   "fetch planning strides that shrink outward");
	}
	expect_req(cons, "{\"v\":1,\"op\":\"attach\",\"device\":\"GPU-a\"}", NULL, 0, "OK", NULL,
		   "attach with a device and no layout");
	expect_req(cons, "{\"v\":1,\"op\":\"acquire\",\"mode\":99}", NULL, 0, "EINVAL", NULL,
		   "acquire with an unknown mode");
	expect_req(cons, "{\"v\":1,\"op\":\"acquire\",\"mode\":1,\"min_version\":-1}", NULL, 0,
		   "EINVAL", "min_version -1 is negative", "acquire with a negative min_version");
	expect_req(cons, "{\"v\":1,\"op\":\"acquire\",\"mode\":2,\"timeout_ms\":18446744073709}", NULL,
		   0, "EINVAL", "timeout_ms", "acquire timeout_ms past nanoseconds");
	expect_req(cons, "{\"v\":1,\"op\":\"acquire\",\"mode\":2,\"timeout_ms\":2000}", NULL, 0, "OK",
		   NULL, "acquire v1");
	/* A page before the first: answered as an empty page (no tables, no
	 * plan, no segments, no "more"), which reads as a model without
	 * segments. */
	expect_req(cons, "{\"v\":1,\"op\":\"fetch\",\"start\":-1}", NULL, 0, "EINVAL",
		   "start -1", "fetch from a negative segment index");
	{
		const char *bw = "{\"v\":1,\"op\":\"begin_write\",\"version\":2,\"timeout_ms\":20000}";
		int waiting = 0;

		t_raw_send(prod, bw, strlen(bw), NULL, 0);
		/* Requests on different connections are not ordered: poll
		 * status until wexd shows the writer waiting. */
		for (double t0 = t_now(); !waiting && t_now() - t0 < 5.0;) {
			char *s;

			r = t_raw_rpc(ctl, "{\"v\":1,\"op\":\"clients\"}", NULL, 0);
			s = json_dumps(r, JSON_COMPACT);
			waiting = s && strstr(s, "\"waiting\":\"begin_write\"");
			free(s);
			json_decref(r);
		}
		T_ASSERT(waiting, "the writer waits for the consumer's lease");
	}
	close(prod);
	alive("disconnect mid-request");
	close(cons);
	alive("consumer disconnect");
	{
		/* A status listing 4 x 1024 producer ranks is larger than
		 * one message: it comes whole in a sealed memfd, the message
		 * saying so; the requester stays connected.  A world over
		 * 1024 lists only the ranks in use: 65536 listed every empty
		 * slot, 5.5 MB per such client. */
		int wide4[4], wide, huge, ok = 0, rfd = -1, nr = 0, mfl = 0;
		static char small[4096];
		const void *data;
		size_t dlen;
		ssize_t n;
		json_t *whole;

		for (int i = 0; i < 4; i++) {
			char model[16];

			snprintf(model, sizeof(model), "big%d", i);
			wide4[i] = t_raw_producer(d.sock, model, 1024);
		}
		t_raw_send(fd, "{\"v\":1,\"op\":\"status\"}", 21, NULL, 0);
		n = wex_sock_recv(fd, small, sizeof(small) - 1, &rfd, 1, &nr, &mfl, 0);
		small[n > 0 ? n : 0] = 0;
		T_ASSERT(n > 0 && nr == 1, "status too large: %zd bytes with %d fds: %s", n, nr, small);
		small[n] = '\0';
		T_ASSERT(strstr(small, "\"reply_in_fd\":true"), "the message names the memfd: %s", small);
		T_ASSERT(wex_table_map(rfd, 1u << 30, &data, &dlen) == 0, "a sealed memfd");
		whole = json_loadb(data, dlen, 0, NULL);
		T_ASSERT(whole && json_is_true(json_object_get(whole, "ok")) &&
				 json_array_size(json_object_get(
					 t_status_model(whole, "big0"), "producers")) == 1024,
			 "the memfd holds the whole status (%zu bytes), 1024 producer ranks", dlen);
		printf("%-40s -> OK: %zu bytes in a sealed memfd\n", "status larger than a message",
		       dlen);
		json_decref(whole);
		wex_table_unmap(data, dlen);
		close(rfd);
		r = t_raw_rpc(fd, "{\"v\":1,\"op\":\"ping\"}", NULL, 0);
		T_ASSERT(!strcmp(t_code(r), "OK"), "ping after a reply too large: %s", t_code(r));
		json_decref(r);
		for (int i = 0; i < 4; i++)
			close(wide4[i]);
		/* World 65536, producers and a consumer group: the ranks in
		 * use, and a count of the others. */
		huge = t_raw_connect(d.sock);
		r = t_raw_rpc(huge, "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"huge\",\"rank\":7,\"world\":65536}",
			      NULL, 0);
		T_ASSERT(!strcmp(t_code(r), "OK"), "hello with world 65536: %s", t_msg(r));
		json_decref(r);
		wide = t_raw_connect(d.sock);
		r = t_raw_rpc(wide, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"huge\",\"group\":\"g\",\"rank\":3,\"world\":65536}",
			      NULL, 0);
		T_ASSERT(!strcmp(t_code(r), "OK"), "consumer hello with world 65536: %s", t_msg(r));
		json_decref(r);
		whole = t_status(d.sock);
		{
			json_t *hm = t_status_model(whole, "huge"), *g, *pr;

			pr = json_object_get(hm, "producers");
			g = json_array_get(json_object_get(hm, "groups"), 0);
			T_ASSERT(json_array_size(pr) == 1 &&
					 json_integer_value(json_object_get(json_array_get(pr, 0), "rank")) == 7 &&
					 json_integer_value(json_object_get(hm, "producers_unlisted")) == 65535,
				 "world 65536: %zu producer ranks listed, %lld unlisted", json_array_size(pr),
				 (long long)json_integer_value(json_object_get(hm, "producers_unlisted")));
			T_ASSERT(json_array_size(json_object_get(g, "ranks")) == 1 &&
					 json_integer_value(json_object_get(g, "ranks_unlisted")) == 65535,
				 "group of 65536: %zu ranks listed, %lld unlisted",
				 json_array_size(json_object_get(g, "ranks")),
				 (long long)json_integer_value(json_object_get(g, "ranks_unlisted")));
		}
		json_decref(whole);
		close(wide);
		close(huge);
		/* Its disconnect is processed asynchronously. */
		for (double t0 = t_now(); !ok && t_now() - t0 < 5.0;) {
			r = t_raw_rpc(ctl, "{\"v\":1,\"op\":\"status\"}", NULL, 0);
			ok = !strcmp(t_code(r), "OK");
			json_decref(r);
		}
		T_ASSERT(ok, "status once the large producer left");
	}
	{
		/* A producer's table of 4K overlapping pieces of one [K+1,
		 * K+1] tensor (each boundary cut both ways in each dim): the
		 * consumer's fetch checked K^2 cells against 4K pieces each,
		 * 2.9e9 steps in wexd's event loop (6 s, no other client
		 * served; K = 1600, over 10 s).  Refused, naming the tensor
		 * and the bound, before the walk. */
		enum { K = 900, N = K + 1 };
		int sp = t_raw_connect(d.sock), sc = t_raw_connect(d.sock), sfd, n = 0;
		struct wex_tensor *pt = calloc(4 * K, sizeof(*pt)), w;
		char req[160];
		double t0;

		T_ASSERT(pt, "calloc");
		expect_req(sp, "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"stall\"}",
			   NULL, 0, "OK", NULL, "producer hello (stall)");
		sfd = memfd_create("stall", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		T_ASSERT(sfd >= 0 && ftruncate(sfd, (off_t)N * N * 4) == 0, "memfd");
		snprintf(req, sizeof(req), "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":%d}",
			 N * N * 4);
		expect_req(sp, req, &sfd, 1, "OK", NULL, "segment (stall)");
		for (int dim = 0; dim < 2; dim++)
			for (int i = 1; i <= K; i++)
				for (int hi = 0; hi < 2; hi++) {
					struct wex_tensor *x = &pt[n++];

					*x = tensor("w", 0);
					x->shape[0] = x->shape[1] = x->extent[0] = x->extent[1] = N;
					x->start[dim] = hi ? (uint64_t)i : 0;
					x->extent[dim] = hi ? (uint64_t)(N - i) : (uint64_t)i;
				}
		tfd = wex__table_pack(pt, NULL, (size_t)n);
		T_ASSERT(tfd >= 0, "pack");
		expect_req(sp, "{\"v\":1,\"op\":\"register_tensors\"}", &tfd, 1, "OK", NULL,
			   "4K overlapping pieces of one tensor");
		close(tfd);
		expect_req(sp, "{\"v\":1,\"op\":\"begin_write\",\"version\":1}", NULL, 0, "OK", NULL,
			   "begin_write (stall)");
		expect_req(sp, "{\"v\":1,\"op\":\"publish\",\"version\":1}", NULL, 0, "OK", NULL,
			   "publish (stall)");
		expect_req(sc, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"stall\"}",
			   NULL, 0, "OK", NULL, "consumer hello (stall)");
		w = tensor("w", 0);
		w.shape[0] = w.shape[1] = w.extent[0] = w.extent[1] = N;
		tfd = wex__table_pack(&w, NULL, 1);
		T_ASSERT(tfd >= 0, "pack");
		expect_req(sc, "{\"v\":1,\"op\":\"attach\"}", &tfd, 1, "OK", NULL, "attach (stall)");
		close(tfd);
		t0 = t_now();
		expect_req(sc, "{\"v\":1,\"op\":\"fetch\"}", NULL, 0, "WEX_ELAYOUT",
			   "w: refused: planning it takes over 1073741824 steps", "fetch planning a table that stalls");
		printf("%-40s -> refused in %.2f s\n", "", t_now() - t0);
		{
			/* Through libwex: the sync fails, saying why. */
			struct wex_client_params cp = {
				.field_mask = WEX_CLIENT_FIELD_SOCKET | WEX_CLIENT_FIELD_ROLE |
					      WEX_CLIENT_FIELD_MODEL | WEX_CLIENT_FIELD_GROUP,
				.socket = d.sock, .role = WEX_ROLE_CONSUMER, .model = "stall",
				.group = "libwex",
			};
			struct wex_sync_result sr;
			wex_client_t *lc = NULL;
			int ret;

			w.ptr = calloc((size_t)N * N, 4);
			T_ASSERT(w.ptr && wex_client_open(&cp, &lc) == 0, "libwex consumer: %s",
				 wex_last_error(NULL));
			T_WEX(lc, wex_attach(lc, &w, 1));
			ret = wex_sync(lc, WEX_SYNC_COPY, 1, 5000, &sr);
			T_ASSERT(ret == -WEX_ELAYOUT && strstr(wex_last_error(lc),
							       "w: refused: planning it takes over 1073741824 steps"),
				 "wex_sync of the stalling table: %d (%s)", ret, wex_last_error(lc));
			printf("%-40s -> %s\n", "wex_sync of it", wex_last_error(lc));
			wex_client_close(lc);
			free(w.ptr);
		}
		close(sc);
		close(sp);
		close(sfd);
		free(pt);
	}
	close(fd);
	close(mfd);

	/* Disconnects are processed asynchronously: poll with status round
	 * trips (no sleeps) until the count settles or 5 s passed. */
	for (double t0 = t_now(); t_now() - t0 < 5.0;) {
		alive("final");
		after = t_fd_count(d.pid);
		if (after == before)
			break;
	}
	T_ASSERT(after == before, "wexd has %d fds open after the bad-input sequence, %d before",
		 after, before);
	printf("wexd fds: %d before, %d after\n", before, after);
	r = t_raw_rpc(ctl, "{\"v\":1,\"op\":\"models\"}", NULL, 0);
	T_ASSERT(json_array_size(json_object_get(r, "models")) == 0,
		 "the model is gone with its clients");
	json_decref(r);
	close(ctl);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
