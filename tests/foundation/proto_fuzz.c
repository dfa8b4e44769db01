/* SPDX-License-Identifier: MIT */
/*
 * proto_fuzz - proves that wexd keeps its promises (DESIGN 4, 7, 8) under a
 * deterministic, seeded mutation fuzz of its control protocol.  From valid
 * sessions (a producer: hello, register_segment with a host memfd and the
 * cuda_vmm/cuda_ipc variants, register_tensors with a sealed table,
 * begin_write, publish; a consumer: hello, attach, acquire, fetch,
 * release; anyone: status, models, clients, plans, ping, metrics, config)
 * it sends a few thousand mutated messages over fresh and reused
 * connections, ops in order, reversed, shuffled and mixed across roles:
 *
 *  - JSON-level: a key dropped, a value of another type, integer extremes
 *    (0, -1, INT32/UINT32/INT64 limits), long strings of multi-byte
 *    characters, non-UTF-8 and NUL escapes, unknown ops, other protocol
 *    versions, deeply nested junk, duplicate keys, huge number literals,
 *    trailing junk, a junk sync report, worlds of up to 65537 ranks;
 *  - byte-level: bit flips, truncation (to zero bytes too), garbage;
 *  - fds: none, two, up to 253, a pipe, a directory, /dev/null, an eventfd,
 *    a socket, an O_PATH fd, an unsealed, half-sealed, empty, short or
 *    5 GiB memfd;
 *  - tensor tables: magic, version, count, entry size, length, names
 *    without NUL or with broken UTF-8, dtype, ndim, boxes, strides and
 *    offsets that overflow, and valid but mismatching layouts that reach
 *    the planner.
 *
 * It checks that wexd answers every message with {"ok":true,...} or
 * {"ok":false,"error":{"code":C,"message":M}} with C and M non-empty
 * strings, C a named code (a deferred begin_write/acquire within its
 * timeout, or, with a long one, a second request refused); that the
 * only message that ends a connection is a zero-length one (it reads as
 * end of file); that wexd never dies (waitpid WNOHANG after every batch)
 * and answers status; that once the fuzz connections are closed wexd holds
 * exactly the fds it held before (no fd of a rejected message leaks) and
 * no model; and that a fresh producer and consumer then publish, copy and
 * verify a version end to end.
 *
 * WEX_FUZZ_ITERS (default 8000 messages) and WEX_FUZZ_SEED (printed at the
 * start) make a longer run, or a failing one, reproducible.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"
#include "ipc/sock.h"
#include "proto.h"

#define NSLOTS 6
#define NMODELS 2
#define MAX_FDS 253          /* the kernel's SCM_MAX_FD */
#define REPLY_WAIT_MS 10000  /* an immediate reply, even under sanitizers */
#define DEFER_PROBE_MS 150   /* a deferred request with a long timeout */
#define BATCH 200            /* messages between liveness checks */
#define SEG_BYTES 4096
#define DEFAULT_ITERS 8000
#define MSG_CAP 100000

static struct t_wexd d;
static int ctl;
static char dir_path[300];

/* ---------------------------------------------------------------------- */
/* A seeded PRNG (splitmix64): the same seed sends the same messages.      */

static uint64_t rng;

static uint64_t rnd(void)
{
	uint64_t z = (rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t rn(uint64_t n)
{
	return n ? rnd() % n : 0;
}

static int chance(int pct)
{
	return (int)rn(100) < pct;
}

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))
#define PICK(a) ((a)[rn(NELEM(a))])

/* ---------------------------------------------------------------------- */
/* Statistics, printed at the end.                                         */

static struct {
	uint64_t sent, ok, err, dropped, abandoned, busy_probe, fds_back, mutated;
	uint64_t op_ok[32], op_err[32]; /* unmutated messages, by seed op */
} st;

struct code_count {
	char code[32];
	uint64_t n;
};
static struct code_count codes[64];

static void count_code(const char *code)
{
	int i;

	for (i = 0; i < 64 && codes[i].code[0]; i++)
		if (!strcmp(codes[i].code, code))
			break;
	if (i == 64)
		return;
	if (!codes[i].code[0])
		snprintf(codes[i].code, sizeof(codes[i].code), "%.*s", (int)sizeof(codes[i].code) - 1, code);
	codes[i].n++;
}

/* ---------------------------------------------------------------------- */
/* One message: JSON (until serialised), bytes, fds (ours, closed after).  */

struct fz_msg {
	json_t *j;
	char *buf;
	size_t len;
	int fds[MAX_FDS];
	int nfds;
	char what[160]; /* seed op and mutations, for a failure report */
	/* Raw text that replaces the placeholder string value after
	 * serialisation (or the whole "dup" member), malloc'd if owned. */
	const char *subst;
	size_t subst_len;
	int subst_owned, subst_member;
};

#define PLACEHOLDER "\"@@FZ@@\""

static void note(struct fz_msg *m, const char *s)
{
	size_t l = strlen(m->what);

	snprintf(m->what + l, sizeof(m->what) - l, "%s%s", l ? " " : "", s);
}

static void msg_free(struct fz_msg *m)
{
	json_decref(m->j);
	if (m->subst_owned)
		free((char *)m->subst);
	free(m->buf);
	for (int i = 0; i < m->nfds; i++)
		if (m->fds[i] >= 0)
			close(m->fds[i]);
	memset(m, 0, sizeof(*m));
}

static void add_fd(struct fz_msg *m, int fd)
{
	/* (-1 with errno, or a negative errno.) */
	T_ASSERT(fd >= 0, "making a test fd: %s", strerror(fd == -1 ? errno : -fd));
	if (m->nfds < MAX_FDS)
		m->fds[m->nfds++] = fd;
	else
		close(fd);
}

/* ---------------------------------------------------------------------- */
/* Fds of every kind.                                                      */

static int mk_memfd(uint64_t size, int seals)
{
	int fd = memfd_create("fz", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	T_ASSERT(fd >= 0, "memfd_create: %s", strerror(errno));
	T_ASSERT(ftruncate(fd, (off_t)size) == 0, "ftruncate %" PRIu64 ": %s", size,
		 strerror(errno));
	if (seals)
		T_ASSERT(fcntl(fd, F_ADD_SEALS, seals) == 0, "seal: %s", strerror(errno));
	return fd;
}

/* An fd that is not what any op takes (or not in the state it needs). */
static int weird_fd(struct fz_msg *m)
{
	int p[2], fd;

	switch (rn(12)) {
	case 0:
	case 1:
		/* Either end, the other closed. */
		T_ASSERT(pipe2(p, O_CLOEXEC) == 0, "pipe");
		fd = (int)rn(2);
		close(p[!fd]);
		note(m, "fd:pipe");
		return p[fd];
	case 2:
		note(m, "fd:dir");
		return open(dir_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	case 3:
		note(m, "fd:devnull");
		return open("/dev/null", O_RDWR | O_CLOEXEC);
	case 4:
		note(m, "fd:eventfd");
		return eventfd(0, EFD_CLOEXEC);
	case 5:
		T_ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, p) == 0,
			 "socketpair");
		close(p[1]);
		note(m, "fd:socket");
		return p[0];
	case 6:
		note(m, "fd:opath");
		return open("/", O_PATH | O_CLOEXEC);
	case 7:
		note(m, "fd:unsealed");
		return mk_memfd(SEG_BYTES, 0);
	case 8:
		note(m, "fd:short");
		return mk_memfd(rn(SEG_BYTES), F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK);
	case 9:
		note(m, "fd:half-sealed");
		return mk_memfd(SEG_BYTES, F_SEAL_WRITE);
	case 10:
		note(m, "fd:empty-sealed");
		return mk_memfd(0, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL);
	default:
		/* Sparse: larger than any table wexd maps (WEX_TABLE_MAX). */
		note(m, "fd:5GiB");
		return mk_memfd(5ull << 30, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK);
	}
}

/* ---------------------------------------------------------------------- */
/* Tensor tables.                                                          */

static const char *const tnames[] = { "embed.weight", "layers.0.attn.qkv.weight",
				      "layers.0.mlp.up.weight", "norm.weight" };

/* n valid tensors of 4x8 f32 (128 bytes each) in segment 0. */
static void tensors(struct wex_tensor *t, int n)
{
	memset(t, 0, sizeof(*t) * (size_t)n);
	for (int i = 0; i < n; i++) {
		snprintf(t[i].name, sizeof(t[i].name), "%s", tnames[i % 4]);
		t[i].dtype = WEX_DT_F32;
		t[i].ndim = 2;
		t[i].shape[0] = t[i].extent[0] = 4;
		t[i].shape[1] = t[i].extent[1] = 8;
		t[i].offset = (uint64_t)i * 128;
	}
}

static const uint64_t u64x[] = { 0, 1, 2, 3, 7, 8, 9, 63, 64, 4095, 4096, 4097, 1ull << 31,
				 1ull << 32, (1ull << 32) + 1, 1ull << 62, 1ull << 63,
				 UINT64_MAX - 1, UINT64_MAX };

static void wire_entry(struct wex_wire_tensor *w, const struct wex_tensor *t)
{
	memset(w, 0, sizeof(*w));
	memcpy(w->name, t->name, WEX_NAME_MAX);
	w->dtype = t->dtype;
	w->ndim = t->ndim;
	memcpy(w->shape, t->shape, sizeof(w->shape));
	memcpy(w->start, t->start, sizeof(w->start));
	memcpy(w->extent, t->extent, sizeof(w->extent));
	memcpy(w->strides, t->strides, sizeof(w->strides));
	w->segment = t->segment;
	w->offset = t->offset;
}

/* Mutates one entry: invalid, or valid but unlike the producer's. */
static void entry_mutate(struct fz_msg *m, struct wex_wire_tensor *w)
{
	uint32_t dim = (uint32_t)rn(WEX_MAX_DIMS);

	switch (rn(14)) {
	case 0:
		memset(w->name, 'x', sizeof(w->name));
		note(m, "t:name-no-nul");
		break;
	case 1:
		w->name[0] = '\0';
		note(m, "t:name-empty");
		break;
	case 2: {
		/* Broken UTF-8, and a name long enough to be cut in error
		 * messages in the middle of a character. */
		static const char *const bad[] = { "\xff\xfe", "\xc3", "\xe2\x82", "\xed\xa0\x80",
						   "\xc0\x80", "\xf4\x90\x80\x80" };
		size_t l = rn(sizeof(w->name) - 4);

		memset(w->name, 0, sizeof(w->name));
		for (size_t i = 0; i + 2 <= l; i += 2)
			memcpy(w->name + i, "\xc3\xa9", 2); /* é */
		snprintf(w->name + strlen(w->name), sizeof(w->name) - strlen(w->name), "%s",
			 PICK(bad));
		note(m, "t:name-utf8");
		break;
	}
	case 3:
		w->dtype = (int32_t)PICK(u64x);
		if (chance(50))
			w->dtype = (int32_t)rn(WEX_DT_COUNT + 2) - 1;
		note(m, "t:dtype");
		break;
	case 4:
		w->ndim = chance(50) ? (uint32_t)rn(WEX_MAX_DIMS + 3) : (uint32_t)PICK(u64x);
		note(m, "t:ndim");
		break;
	case 5:
		w->start[dim] = PICK(u64x);
		note(m, "t:start");
		break;
	case 6:
		w->extent[dim] = PICK(u64x);
		note(m, "t:extent");
		break;
	case 7:
		w->shape[dim] = PICK(u64x);
		note(m, "t:shape");
		break;
	case 8:
		w->strides[dim] = chance(50) ? -(int64_t)rn(1000) - 1 : (int64_t)PICK(u64x);
		note(m, "t:strides");
		break;
	case 9:
		w->segment = chance(50) ? (uint32_t)rn(4) : (uint32_t)PICK(u64x);
		note(m, "t:segment");
		break;
	case 10:
		w->offset = PICK(u64x);
		note(m, "t:offset");
		break;
	case 11:
		/* Valid, but a box of its own: the planner must cope. */
		w->extent[0] = 1 + rn(4);
		w->start[0] = rn(5 - w->extent[0]);
		w->extent[1] = 1 + rn(8);
		w->start[1] = rn(9 - w->extent[1]);
		note(m, "t:box");
		break;
	case 12:
		/* Valid, but another shape or dtype than the producer's. */
		w->shape[0] = w->extent[0] = 1 + rn(6);
		w->dtype = (int32_t)(1 + rn(WEX_DT_COUNT - 1));
		note(m, "t:reshape");
		break;
	default:
		((unsigned char *)w)[rn(sizeof(*w))] ^= (unsigned char)(1u << rn(8));
		note(m, "t:flip");
		break;
	}
}

/* A table fd for n tensors, possibly mutated; sealed unless mutated not
 * to be. */
static int table_fd(struct fz_msg *m, const struct wex_tensor *t, int n, int mutate)
{
	size_t len = sizeof(struct wex_table_hdr) + (size_t)n * sizeof(struct wex_wire_tensor);
	struct wex_table_hdr *h;
	struct wex_wire_tensor *w;
	int fd, how;

	if (!mutate)
		return wex__table_pack(t, NULL, (size_t)n);
	/* Room for an extended table. */
	h = calloc(1, len + 3 * sizeof(*w));
	T_ASSERT(h, "oom");
	h->magic = WEX_TABLE_MAGIC;
	h->version = WEX_TABLE_VERSION;
	h->count = (uint64_t)n;
	h->entry_size = sizeof(*w);
	w = (struct wex_wire_tensor *)(h + 1);
	for (int i = 0; i < n; i++)
		wire_entry(&w[i], &t[i]);
	how = 0;
	for (int k = 1 + (int)rn(2); k > 0; k--) {
		switch (rn(10)) {
		case 0:
			h->magic = chance(50) ? WEX_PLAN_MAGIC : (uint32_t)rnd();
			note(m, "t:magic");
			break;
		case 1:
			h->version = (uint32_t)PICK(u64x);
			note(m, "t:version");
			break;
		case 2:
			h->count = chance(50) ? (uint64_t)n + rn(3) - 1 : PICK(u64x);
			if (chance(30)) /* count * entry_size wraps to the length */
				h->count = (UINT64_MAX / sizeof(*w)) + 2;
			note(m, "t:count");
			break;
		case 3:
			h->entry_size = chance(50) ? sizeof(*w) + rn(3) - 1 : PICK(u64x);
			note(m, "t:entry-size");
			break;
		case 4:
			/* Length off by a little or a lot, count left alone. */
			if (chance(50) && len > 0) {
				len = rn(len);
			} else {
				memset((char *)h + len, 0x41, sizeof(*w));
				len += 1 + rn(sizeof(*w));
			}
			note(m, "t:length");
			break;
		case 5:
			/* More entries, counted: duplicates or junk. */
			if (n < 4) {
				memcpy(&w[n], &w[rn((uint64_t)n)], sizeof(*w));
				if (chance(30))
					entry_mutate(m, &w[n]);
				h->count = (uint64_t)n + 1;
				len += sizeof(*w);
				n++;
				note(m, "t:extra-entry");
			}
			break;
		case 6:
			how = 1 + (int)rn(3);
			break;
		default:
			if (n)
				entry_mutate(m, &w[rn((uint64_t)n)]);
			break;
		}
	}
	switch (how) {
	case 0:
		fd = wex_table_seal(h, len, "fz-table");
		break;
	case 1: /* unsealed */
		fd = mk_memfd(0, 0);
		T_ASSERT(len == 0 || pwrite(fd, h, len, 0) == (ssize_t)len, "pwrite");
		note(m, "t:unsealed");
		break;
	case 2: /* sealed against writes only: it could still grow */
		fd = mk_memfd(0, 0);
		T_ASSERT(len == 0 || pwrite(fd, h, len, 0) == (ssize_t)len, "pwrite");
		T_ASSERT(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) == 0, "seal");
		note(m, "t:half-sealed");
		break;
	default: /* sealed with sparse room after it */
		fd = mk_memfd(len + 4096 * (1 + rn(16)), 0);
		T_ASSERT(len == 0 || pwrite(fd, h, len, 0) == (ssize_t)len, "pwrite");
		T_ASSERT(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK) == 0,
			 "seal");
		note(m, "t:padded");
		break;
	}
	free(h);
	return fd;
}

/* ---------------------------------------------------------------------- */
/* Seed messages.                                                          */

enum {
	OP_HELLO_P, OP_SEG_HOST, OP_SEG_PART, OP_SEG_CHAIN, OP_SEG_IPC, OP_SEG_FABRIC, OP_TENSORS,
	OP_BEGIN, OP_PUBLISH, OP_HELLO_C, OP_ATTACH, OP_ACQUIRE, OP_FETCH, OP_RELEASE,
	OP_HELLO_A, OP_STATUS, OP_MODELS, OP_CLIENTS, OP_PLANS, OP_PING, OP_METRICS,
	OP_CONFIG_GET, OP_CONFIG_SET, OP_VERIFY, NOPS
};

static const char *const op_names[NOPS] = {
	"hello(p)", "register_segment(host)", "register_segment(part)",
	"register_segment(chain)", "register_segment(ipc)", "register_segment(fabric)",
	"register_tensors", "begin_write", "publish", "hello(c)", "attach", "acquire", "fetch",
	"release", "hello(admin)", "status", "models", "clients", "plans", "ping", "metrics",
	"config_get", "config_set", "verify",
};

/* What each connection has been told, so that seeds stay plausible. */
struct slot {
	int fd;
	int model;
	uint64_t next_v;    /* producer: the version to write next */
	uint64_t lease_v;   /* consumer: the version acquired */
};
static struct slot slots[NSLOTS];

static json_t *req(const char *op)
{
	return json_pack("{s:i, s:s}", "v", WEX_PROTO_VERSION, "op", op);
}

static void seed(struct fz_msg *m, int op, struct slot *s, int mutate_table)
{
	char model[16];
	struct wex_tensor t[4];
	int n = 1 + (int)rn(4);

	snprintf(model, sizeof(model), "fz%d", s->model);
	note(m, op_names[op]);
	switch (op) {
	case OP_HELLO_P:
		m->j = json_pack("{s:i, s:s, s:s, s:s, s:i, s:i, s:s}", "v", 1, "op", "hello",
				 "role", "producer", "model", model, "rank", 0, "world", 1, "name",
				 "fz-producer");
		break;
	case OP_SEG_HOST:
		m->j = json_pack("{s:i, s:s, s:s, s:i}", "v", 1, "op", "register_segment", "kind",
				 "host", "size", SEG_BYTES);
		add_fd(m, mk_memfd(SEG_BYTES, 0));
		break;
	case OP_SEG_PART:
		m->j = json_pack("{s:i, s:s, s:s, s:s, s:i, s:i, s:b}", "v", 1, "op",
				 "register_segment", "kind", "cuda_vmm", "device", "GPU-fz", "size",
				 2 << 20, "alloc_size", 2 << 20, "part", 1);
		add_fd(m, mk_memfd(0, 0));
		break;
	case OP_SEG_CHAIN:
		m->j = json_pack("{s:i, s:s, s:s, s:s, s:i, s:[i,i]}", "v", 1, "op",
				 "register_segment", "kind", "cuda_vmm", "device", "GPU-fz", "size",
				 4 << 20, "parts", chance(70) ? 1 : (int)rn(3),
				 chance(70) ? 2 : 1 + (int)rn(3));
		break;
	case OP_SEG_IPC:
		m->j = json_pack("{s:i, s:s, s:s, s:s, s:i, s:s}", "v", 1, "op",
				 "register_segment", "kind", "cuda_ipc", "device", "GPU-fz", "size",
				 SEG_BYTES, "handle", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
				 "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff");
		break;
	case OP_SEG_FABRIC: {
		char hex[129];

		for (int i = 0; i < 128; i++)
			hex[i] = "0123456789abcdef"[rn(16)];
		hex[128] = '\0';
		m->j = json_pack("{s:i, s:s, s:s, s:s, s:i, s:s}", "v", 1, "op",
				 "register_segment", "kind", "cuda_vmm", "device", "GPU-fz", "size",
				 SEG_BYTES, "handle", hex);
		break;
	}
	case OP_TENSORS:
		m->j = req("register_tensors");
		tensors(t, n);
		add_fd(m, table_fd(m, t, n, mutate_table));
		break;
	case OP_BEGIN:
		m->j = json_pack("{s:i, s:s, s:I, s:i}", "v", 1, "op", "begin_write", "version",
				 (json_int_t)s->next_v, "timeout_ms", (int)rn(3) * 10);
		break;
	case OP_PUBLISH:
		m->j = json_pack("{s:i, s:s, s:I}", "v", 1, "op", "publish", "version",
				 (json_int_t)s->next_v);
		break;
	case OP_HELLO_C:
		m->j = json_pack("{s:i, s:s, s:s, s:s, s:s, s:i, s:i}", "v", 1, "op", "hello",
				 "role", "consumer", "model", model, "group",
				 chance(80) ? "g" : "g2", "rank", 0, "world", chance(80) ? 1 : 2);
		break;
	case OP_ATTACH:
		m->j = req("attach");
		if (chance(80)) {
			tensors(t, n);
			add_fd(m, table_fd(m, t, n, mutate_table));
		}
		break;
	case OP_ACQUIRE:
		m->j = json_pack("{s:i, s:s, s:I, s:i, s:i}", "v", 1, "op", "acquire",
				 "min_version", (json_int_t)rn(2), "timeout_ms", (int)rn(3) * 10,
				 "mode", 1 + (int)rn(3));
		break;
	case OP_FETCH:
		m->j = json_pack("{s:i, s:s, s:i}", "v", 1, "op", "fetch", "start", (int)rn(2));
		break;
	case OP_RELEASE:
		m->j = json_pack("{s:i, s:s, s:I}", "v", 1, "op", "release", "version",
				 (json_int_t)s->lease_v);
		break;
	case OP_HELLO_A:
		m->j = json_pack("{s:i, s:s, s:s, s:s}", "v", 1, "op", "hello", "role", "admin",
				 "name", "fz-admin");
		break;
	case OP_STATUS:
	case OP_MODELS:
	case OP_CLIENTS:
	case OP_PLANS:
	case OP_PING:
	case OP_METRICS:
		m->j = req(op_names[op]); /* requests without arguments: named as sent */
		break;
	case OP_CONFIG_GET:
		m->j = json_pack("{s:i, s:s, s:s}", "v", 1, "op", "config_get", "name",
				 chance(50) ? "sync_timeout_ms" : "max_clients");
		break;
	case OP_VERIFY:
		/* An ask (wexctl verify), or a poll of an early ticket. */
		m->j = json_pack("{s:i, s:s, s:s}", "v", 1, "op", "verify", "model", model);
		if (chance(40))
			json_object_set_new(m->j, "ticket", json_integer((json_int_t)rn(3)));
		if (chance(30))
			json_object_set_new(m->j, "group", json_string(chance(50) ? "g0" : "nope"));
		break;
	default:
		/* Only fields whose change cannot disturb the rest of the test. */
		m->j = json_pack("{s:i, s:s, s:s, s:s}", "v", 1, "op", "config_set", "name",
				 chance(50) ? "sync_timeout_ms" : "drain_timeout_ms", "value",
				 chance(50) ? "60000" : "10000");
		break;
	}
	T_ASSERT(m->j, "json_pack of seed %s", op_names[op]);
	if (chance(5))
		json_object_set_new(m->j, "report",
				    json_pack("{s:s, s:s, s:I, s:f}", "mode", "copy", "backend",
					      "host", "bytes", (json_int_t)4096, "seconds", 0.001));
	/* A consumer's verification in its report (wexctl verify's answer). */
	if (chance(5) && json_object_get(m->j, "report"))
		json_object_set_new(json_object_get(m->j, "report"), "verify",
				    json_pack("{s:I, s:s, s:I, s:I, s:f, s:I, s:s, s:I}", "ticket",
					      (json_int_t)rn(3), "result",
					      chance(50) ? "equal" : "differ", "version",
					      (json_int_t)s->lease_v, "bytes", (json_int_t)4096,
					      "seconds", 0.001, "differ_bytes", (json_int_t)1,
					      "tensor", "t0", "offset", (json_int_t)rn(4096)));
}

/* ---------------------------------------------------------------------- */
/* JSON-level mutations.                                                   */

static const json_int_t i64x[] = { 0, -1, 1, 2, 63, 64, 65, 159, 160, 4096, 65535, 65536, 65537,
				   INT32_MAX, (json_int_t)INT32_MAX + 1, UINT32_MAX,
				   (json_int_t)UINT32_MAX + 1, 1ll << 53, 1ll << 62, INT64_MAX,
				   INT64_MIN, INT64_MIN + 1, -65536, -4096 };

/* A string of `n` bytes of one character (ASCII, 2, 3 or 4 bytes long),
 * cut at a character boundary. */
static json_t *long_string(size_t n)
{
	static const char *const ch[] = { "a", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80" };
	const char *c = PICK(ch);
	size_t cl = strlen(c), k = 0;
	char *s = malloc(n + 1);
	json_t *j;

	T_ASSERT(s, "oom");
	while (k + cl <= n) {
		memcpy(s + k, c, cl);
		k += cl;
	}
	s[k] = '\0';
	j = json_string(s);
	free(s);
	return j;
}

static json_t *junk(int depth)
{
	switch (rn(depth > 3 ? 6 : 8)) {
	case 0:
		return json_null();
	case 1:
		return json_boolean(chance(50));
	case 2:
		return json_integer(PICK(i64x));
	case 3: {
		static const double r[] = { 0.5, -0.0, 1e308, -1e308, 1e-320, 3.0, -1.5 };

		return json_real(PICK(r));
	}
	case 4: {
		static const char *const s[] = { "", " ", "host", "producer", "consumer", "admin",
						 "status", "copy", "-1", "1", "\xc3\xa9t\xc3\xa9",
						 "a\tb\nc" };

		return json_string(PICK(s));
	}
	case 5:
		return long_string(1 + rn(300));
	case 6: {
		json_t *a = json_array();

		for (int i = (int)rn(4); i > 0; i--)
			json_array_append_new(a, junk(depth + 1));
		return a;
	}
	default: {
		json_t *o = json_object();
		char k[8];

		for (int i = (int)rn(4); i > 0; i--) {
			snprintf(k, sizeof(k), "k%d", (int)rn(10));
			json_object_set_new(o, k, junk(depth + 1));
		}
		return o;
	}
	}
}

/* A key of the object (NULL if empty), "v" and "op" as likely as others. */
static const char *some_key(json_t *o)
{
	size_t n = json_object_size(o), i = 0, want;
	const char *k;
	json_t *v;

	if (!n)
		return NULL;
	want = rn(n);
	json_object_foreach(o, k, v) {
		if (i++ == want)
			return k;
	}
	return NULL;
}

static void set_key(json_t *o, const char *k, json_t *v)
{
	char key[256];

	/* The key may be owned by the object: copy it first. */
	snprintf(key, sizeof(key), "%s", k);
	json_object_set_new(o, key, v);
}

static void json_mutate(struct fz_msg *m)
{
	const char *k = some_key(m->j);
	static const char *const keys[] = { "role", "model", "group", "rank", "world", "name",
					    "kind", "size", "device", "handle", "handle_offset",
					    "alloc_size", "part", "parts", "version", "timeout_ms",
					    "min_version", "mode", "start", "value" };

	switch (rn(14)) {
	case 13: {
		/* A wide world: large allocations and listings (status of
		 * 65536 ranks is larger than one message). */
		static const json_int_t w[] = { 2, 3, 1024, 65535, 65536, 65537 };
		json_int_t world = PICK(w);

		json_object_set_new(m->j, "world", json_integer(world));
		json_object_set_new(m->j, "rank", json_integer(chance(50) ? 0 : world - 1));
		note(m, "j:wide");
		break;
	}
	case 0:
		if (k) {
			char key[256];

			snprintf(key, sizeof(key), "%s", k);
			json_object_del(m->j, key);
		}
		note(m, "j:drop-key");
		break;
	case 1:
		if (k)
			set_key(m->j, k, junk(0));
		note(m, "j:retype");
		break;
	case 2:
		/* Integer extremes, on a key of the seed or one an op reads. */
		set_key(m->j, k && chance(50) ? k : PICK(keys), json_integer(PICK(i64x)));
		note(m, "j:int-extreme");
		break;
	case 3: {
		static const size_t lens[] = { 63, 64, 65, 159, 160, 161, 255, 256, 511, 512,
					       513, 1000, 4096, 30000, 70000 };

		set_key(m->j, k && chance(50) ? k : PICK(keys), long_string(PICK(lens)));
		note(m, "j:long-string");
		break;
	}
	case 4: {
		static const char *const bad[] = { "", "hellO", "status ", " ping", "PING",
						   "register", "hello\n", "acquire\t", "x" };
		static const char *const good[] = { "hello", "register_segment", "register_tensors",
						    "begin_write", "publish", "attach", "acquire",
						    "fetch", "release", "status", "config_set" };

		if (chance(40))
			json_object_set_new(m->j, "op", long_string(60 + rn(200)));
		else if (chance(50))
			json_object_set_new(m->j, "op", json_string(PICK(bad)));
		else /* a valid op of another role or session: out of order */
			json_object_set_new(m->j, "op", json_string(PICK(good)));
		note(m, "j:op");
		break;
	}
	case 5: {
		json_t *v;

		switch (rn(6)) {
		case 0:
			v = json_integer(PICK(i64x));
			break;
		case 1:
			v = json_string("1");
			break;
		case 2:
			v = json_real(1.0);
			break;
		case 3:
			v = json_true();
			break;
		case 4:
			v = json_pack("[i]", 1);
			break;
		default:
			v = json_null();
			break;
		}
		json_object_set_new(m->j, "v", v);
		note(m, "j:version");
		break;
	}
	case 6:
		set_key(m->j, PICK(keys), junk(0));
		note(m, "j:extra-key");
		break;
	case 7:
		json_object_set_new(m->j, "report",
				    chance(50) ? junk(0) :
						 json_pack("{s:o, s:o, s:o, s:o}", "mode", junk(3),
							   "backend", junk(3), "bytes", junk(3),
							   "seconds", junk(3)));
		note(m, "j:report");
		break;
	case 8:
	case 9: {
		/* Raw text where a string value goes: broken UTF-8, NUL and
		 * surrogate escapes, control bytes, a huge or odd number. */
		static const char *const raw[] = {
			"\"\xff\xfe\"",       "\"\xc3\"",          "\"\xe2\x82\"",
			"\"\xed\xa0\x80\"",   "\"\xc0\x80\"",      "\"a\\u0000b\"",
			"\"\\ud800\"",        "\"\\udc00\\ud800\"", "\"\x01\x02\"",
			"\"a\nb\"",           "99999999999999999999999", "-99999999999999999999",
			"1e999",              "-0",                "01",
			"0x10",               "1.",                "NaN",
			"Infinity",           "\"\\x41\"",         "tru",
			"[1,]",               "{\"a\":}",          "\"\\u00e9\\u20ac\"",
		};
		const char *key = k && chance(50) ? k : PICK(keys);

		set_key(m->j, key, json_string("@@FZ@@"));
		m->subst = PICK(raw);
		m->subst_len = strlen(m->subst);
		note(m, "j:raw-value");
		break;
	}
	case 10: {
		/* Nesting around the parser's depth limit (2048 in jansson). */
		static const int depths[] = { 10, 500, 2047, 2048, 2049, 4000, 30000 };
		int dep = PICK(depths);
		int obj = chance(30);
		size_t cap = (size_t)dep * 6 + 8, l = 0;
		char *s = malloc(cap);

		T_ASSERT(s, "oom");
		for (int i = 0; i < dep; i++)
			l += (size_t)snprintf(s + l, cap - l, obj ? "{\"a\":" : "[");
		l += (size_t)snprintf(s + l, cap - l, "0");
		for (int i = 0; i < dep; i++)
			s[l++] = obj ? '}' : ']';
		s[l] = '\0';
		set_key(m->j, chance(50) ? "junk" : PICK(keys), json_string("@@FZ@@"));
		m->subst = s;
		m->subst_len = l;
		m->subst_owned = 1;
		note(m, "j:nest");
		break;
	}
	case 11: {
		/* Duplicate keys (wexd parses with JSON_REJECT_DUPLICATES). */
		static const char *const dups[] = { "\"op\":\"status\",\"op\":\"status\"",
						    "\"v\":1,\"v\":1",
						    "\"op\":\"hello\",\"op\":\"ping\"",
						    "\"x\":1,\"x\":2" };

		set_key(m->j, "dup", json_string("@@FZ@@"));
		m->subst = PICK(dups);
		m->subst_len = strlen(m->subst);
		m->subst_member = 1;
		note(m, "j:dup-key");
		break;
	}
	default:
		/* Not an object at all. */
		json_decref(m->j);
		m->j = chance(50) ? junk(0) : json_pack("[s,i]", "status", 1);
		note(m, "j:not-object");
		break;
	}
}

/* Serialises the JSON, substituting the raw text for the placeholder. */
static void msg_serialise(struct fz_msg *m)
{
	char *s = json_dumps(m->j, JSON_COMPACT | JSON_ENCODE_ANY);
	char *p;

	T_ASSERT(s, "json_dumps");
	p = m->subst ? strstr(s, PLACEHOLDER) : NULL;
	if (p) {
		size_t pre = (size_t)(p - s), post = strlen(p + strlen(PLACEHOLDER));
		size_t sub = m->subst_len;
		const char *text = m->subst;

		/* Duplicate-key text replaces the whole "dup":"@@FZ@@" member. */
		if (m->subst_member && pre >= 6 && !strncmp(p - 6, "\"dup\":", 6))
			pre -= 6;
		m->len = pre + sub + post;
		m->buf = malloc(m->len + 1);
		T_ASSERT(m->buf, "oom");
		memcpy(m->buf, s, pre);
		memcpy(m->buf + pre, text, sub);
		memcpy(m->buf + pre + sub, p + strlen(PLACEHOLDER), post);
		m->buf[m->len] = '\0';
		free(s);
	} else {
		m->buf = s;
		m->len = strlen(s);
	}
	if (m->subst_owned)
		free((char *)m->subst);
	m->subst = NULL;
	m->subst_owned = 0;
	json_decref(m->j);
	m->j = NULL;
}

/* ---------------------------------------------------------------------- */
/* Byte-level and fd mutations.                                            */

static void byte_mutate(struct fz_msg *m)
{
	size_t n;

	switch (rn(7)) {
	case 0:
		for (int i = 1 + (int)rn(8); i > 0 && m->len; i--)
			m->buf[rn(m->len)] ^= (char)(1u << rn(8));
		note(m, "b:flip");
		break;
	case 1:
		m->len = chance(10) ? 0 : rn(m->len);
		note(m, m->len ? "b:truncate" : "b:empty");
		break;
	case 2:
		n = 1 + rn(16);
		for (size_t i = 0, at = rn(m->len + 1); i < n && at + i < m->len; i++)
			m->buf[at + i] = (char)rnd();
		note(m, "b:garbage");
		break;
	case 3: {
		/* Insert bytes (a NUL among them sometimes). */
		size_t at = rn(m->len + 1);

		n = 1 + rn(8);
		m->buf = realloc(m->buf, m->len + n + 1);
		T_ASSERT(m->buf, "oom");
		memmove(m->buf + at + n, m->buf + at, m->len - at);
		for (size_t i = 0; i < n; i++)
			m->buf[at + i] = chance(20) ? '\0' : (char)rnd();
		m->len += n;
		note(m, "b:insert");
		break;
	}
	case 4: {
		static const char *const tails[] = { " ",  "{}", "garbage", "\n{\"v\":1}",
						     "]", "\0" };
		const char *t = PICK(tails);
		size_t tl = t[0] ? strlen(t) : 1;

		m->buf = realloc(m->buf, m->len + tl + 1);
		T_ASSERT(m->buf, "oom");
		memcpy(m->buf + m->len, t, tl);
		m->len += tl;
		note(m, "b:trailing");
		break;
	}
	case 5:
		n = 1 + rn(300);
		free(m->buf);
		m->buf = malloc(n + 1);
		T_ASSERT(m->buf, "oom");
		for (size_t i = 0; i < n; i++)
			m->buf[i] = (char)rnd();
		m->len = n;
		note(m, "b:random");
		break;
	default:
		/* A message past the size limit (65536 by default). */
		n = (m->len > 65536 ? m->len : 65536) + rn(3);
		m->buf = realloc(m->buf, n + 1);
		T_ASSERT(m->buf, "oom");
		if (m->len && m->buf[m->len - 1] == '}') {
			memset(m->buf + m->len - 1, ' ', n - m->len + 1);
			m->buf[n - 1] = '}';
		} else {
			memset(m->buf + m->len, ' ', n - m->len);
		}
		m->len = n;
		note(m, "b:oversize");
		break;
	}
}

static void fd_mutate(struct fz_msg *m)
{
	static const int many[] = { 2, 3, 8, 63, 64, 65, 128, 253 };
	int n, base;

	switch (rn(4)) {
	case 0:
		for (int i = 0; i < m->nfds; i++)
			close(m->fds[i]);
		m->nfds = 0;
		note(m, "f:none");
		break;
	case 1:
		add_fd(m, chance(50) ? weird_fd(m) : mk_memfd(SEG_BYTES, 0));
		note(m, "f:extra");
		break;
	case 2:
		n = PICK(many);
		base = m->nfds ? m->fds[0] : mk_memfd(SEG_BYTES, 0);
		if (!m->nfds)
			add_fd(m, base);
		while (m->nfds < n)
			add_fd(m, fcntl(base, F_DUPFD_CLOEXEC, 0));
		note(m, "f:many");
		break;
	default:
		n = weird_fd(m);
		T_ASSERT(n >= 0, "making a test fd: %s", strerror(errno));
		if (m->nfds) {
			close(m->fds[0]);
			m->fds[0] = n;
		} else {
			add_fd(m, n);
		}
		note(m, "f:replace");
		break;
	}
}

/* ---------------------------------------------------------------------- */
/* Talking to wexd.                                                        */

static void check_alive(const char *when)
{
	int stt;
	pid_t r = waitpid(d.pid, &stt, WNOHANG);

	if (r == d.pid) {
		d.pid = 0;
		if (WIFSIGNALED(stt))
			T_FAIL("wexd died of signal %d %s", WTERMSIG(stt), when);
		T_FAIL("wexd exited with %d %s", WEXITSTATUS(stt), when);
	}
	T_ASSERT(r == 0, "waitpid wexd: %s", strerror(errno));
}

static void print_msg(const struct fz_msg *m)
{
	fprintf(stderr, "  message %" PRIu64 " (%s), %zu bytes, %d fds: ", st.sent, m->what, m->len,
		m->nfds);
	for (size_t i = 0; i < m->len && i < 300; i++) {
		unsigned char c = (unsigned char)m->buf[i];

		if (c >= 0x20 && c < 0x7f && c != '\\')
			fputc(c, stderr);
		else
			fprintf(stderr, "\\x%02x", c);
	}
	fprintf(stderr, "%s\n", m->len > 300 ? "..." : "");
}

/* Checks the reply's shape; returns its code ("OK" or the error's). */
static const char *check_reply(const struct fz_msg *m, json_t *r)
{
	json_t *ok = json_object_get(r, "ok"), *e, *code, *msg;

	if (!json_is_object(r) || !json_is_boolean(ok)) {
		print_msg(m);
		T_FAIL("a reply without a boolean 'ok'");
	}
	if (json_is_true(ok))
		return "OK";
	e = json_object_get(r, "error");
	code = json_object_get(e, "code");
	msg = json_object_get(e, "message");
	/* EUNKNOWN: an errno without a name (proto.c), no clear error. */
	if (!json_is_string(code) || !json_string_length(code) || !json_is_string(msg) ||
	    !json_string_length(msg) || !strcmp(json_string_value(code), "EUNKNOWN")) {
		char *s = json_dumps(r, JSON_COMPACT);

		print_msg(m);
		T_FAIL("a malformed error reply: %s", s ? s : "?");
	}
	return json_string_value(code);
}

/* 1: a reply (checked; *code set, copied), 0: wexd ended the connection,
 * -1: nothing within `ms`.  Fds that came with it are closed. */
static int recv_reply(int fd, int ms, const struct fz_msg *m, char *code, size_t codelen,
		      json_t **out)
{
	static char buf[1 << 20];
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int fds[WEX_SOCK_MAX_FDS], nfds = 0, mflags = 0, ret;
	json_error_t je;
	json_t *r;
	ssize_t n;

	do
		ret = poll(&p, 1, ms);
	while (ret < 0 && errno == EINTR);
	T_ASSERT(ret >= 0, "poll: %s", strerror(errno));
	if (ret == 0)
		return -1;
	n = wex_sock_recv(fd, buf, sizeof(buf), fds, WEX_SOCK_MAX_FDS, &nfds, &mflags, 0);
	st.fds_back += (uint64_t)nfds;
	wex_sock_close_fds(fds, nfds);
	if (n == 0 || n == -ECONNRESET)
		return 0;
	T_ASSERT(n > 0, "receive: %s", strerror((int)-n));
	T_ASSERT(!(mflags & MSG_TRUNC), "a reply larger than %zu bytes", sizeof(buf));
	r = json_loadb(buf, (size_t)n, 0, &je);
	if (!r) {
		print_msg(m);
		T_FAIL("a reply that is not JSON (%s): %.200s", je.text, buf);
	}
	snprintf(code, codelen, "%s", check_reply(m, r));
	if (out)
		*out = r;
	else
		json_decref(r);
	return 1;
}

/* How long wexd may take to answer: 0 at once, > 0 the ms of a deferral
 * its timeout_ms bounds, -1 a long one (a default or a huge timeout).  The
 * same parse as wexd's. */
static int defer_ms(const struct fz_msg *m)
{
	json_t *j, *op, *v, *t;
	int ret = 0;

	if (m->nfds)
		return 0;
	j = json_loadb(m->buf, m->len, JSON_REJECT_DUPLICATES, NULL);
	if (!j)
		return 0;
	op = json_object_get(j, "op");
	v = json_object_get(j, "v");
	t = json_object_get(j, "timeout_ms");
	if (json_is_object(j) && json_is_integer(v) && json_integer_value(v) == 1 &&
	    json_is_string(op) &&
	    (!strcmp(json_string_value(op), "begin_write") ||
	     !strcmp(json_string_value(op), "acquire"))) {
		if (!t || (json_is_integer(t) && json_integer_value(t) < 0))
			ret = -1;
		else if (json_is_integer(t))
			ret = json_integer_value(t) <= 100 ? (int)json_integer_value(t) : -1;
	}
	json_decref(j);
	return ret;
}

static void slot_close(struct slot *s)
{
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
}

static void slot_open(struct slot *s)
{
	slot_close(s);
	s->fd = t_raw_connect(d.sock);
	s->model = (int)rn(NMODELS);
	s->next_v = 1;
	s->lease_v = 0;
}

/* Learns what a good reply says, so that later seeds stay plausible. */
static void learn(struct slot *s, int op, json_t *r)
{
	json_t *v;

	if (!json_is_true(json_object_get(r, "ok")))
		return;
	if ((op == OP_HELLO_P || op == OP_HELLO_C) &&
	    json_is_integer(v = json_object_get(r, "published")))
		s->next_v = (uint64_t)json_integer_value(v) + 1;
	if (op == OP_PUBLISH)
		s->next_v++;
	if (op == OP_ACQUIRE && json_is_integer(v = json_object_get(r, "version")))
		s->lease_v = (uint64_t)json_integer_value(v);
}

static void send_one(struct slot *s, int op, int mutate)
{
	struct fz_msg m;
	char code[64];
	json_t *r = NULL;
	ssize_t n;
	int wait, got, bytes = 0;

	memset(&m, 0, sizeof(m));
	/* A table op's mutation may be its table's alone. */
	seed(&m, op, s, mutate && chance(40));
	if (mutate) {
		st.mutated++;
		for (int k = 1 + (int)rn(2); k > 0; k--) {
			int c = (int)rn(100);

			if (c < 55 && json_is_object(m.j) && !m.subst)
				json_mutate(&m);
			else if (c < 80)
				fd_mutate(&m);
			else
				bytes = 1;
		}
	}
	msg_serialise(&m);
	if (bytes)
		byte_mutate(&m);
	/* One message must fit this end's socket buffer (about 208 KiB);
	 * anything past wexd's 64 KiB limit tests the same. */
	if (m.len > MSG_CAP)
		m.len = MSG_CAP;
	wait = defer_ms(&m);
	n = wex_sock_send(s->fd, m.buf, m.len, m.fds, m.nfds, 0);
	if (n < 0) {
		print_msg(&m);
		T_FAIL("send: %s (wexd closed the connection without a reason?)",
		       strerror((int)-n));
	}
	st.sent++;
	got = recv_reply(s->fd, wait < 0 ? DEFER_PROBE_MS : wait + REPLY_WAIT_MS, &m, code,
			 sizeof(code), &r);
	if (got < 0 && wait < 0) {
		/* Waiting, as asked: a second request is refused (one at a
		 * time); either that refusal or the first reply comes. */
		static const char ping[] = "{\"v\":1,\"op\":\"ping\"}";

		n = wex_sock_send(s->fd, ping, sizeof(ping) - 1, NULL, 0, 0);
		T_ASSERT(n > 0, "send ping: %s", strerror((int)-n));
		got = recv_reply(s->fd, REPLY_WAIT_MS, &m, code, sizeof(code), &r);
		if (got > 0) {
			count_code(code);
			st.busy_probe++;
		}
		st.abandoned++;
		json_decref(r);
		slot_close(s);
		msg_free(&m);
		if (got > 0)
			return;
		if (got == 0)
			T_FAIL("wexd dropped a connection with a request waiting");
		T_FAIL("no reply to a request sent while one waits");
	}
	if (got < 0) {
		print_msg(&m);
		check_alive("while a reply was awaited");
		T_FAIL("no reply within %d ms", wait + REPLY_WAIT_MS);
	}
	if (got == 0) {
		/* A zero-length message reads as end of file; anything else
		 * must be answered (wexd.c: "a bad message gets a clear
		 * error; the connection stays usable"). */
		if (m.len) {
			print_msg(&m);
			check_alive("after dropping a connection");
			T_FAIL("wexd dropped the connection instead of answering");
		}
		st.dropped++;
		slot_close(s);
		msg_free(&m);
		return;
	}
	count_code(code);
	if (!strcmp(code, "OK"))
		st.ok++;
	else
		st.err++;
	if (!mutate)
		(!strcmp(code, "OK") ? st.op_ok : st.op_err)[op]++;
	learn(s, op, r);
	json_decref(r);
	msg_free(&m);
}

/* ---------------------------------------------------------------------- */
/* Sessions.                                                               */

static const int prod_script[] = { OP_HELLO_P, OP_SEG_HOST, OP_TENSORS, OP_BEGIN, OP_PUBLISH };
static const int cons_script[] = { OP_HELLO_C, OP_ATTACH, OP_ACQUIRE, OP_FETCH, OP_RELEASE };

struct step {
	struct slot *s;
	int op;
};

static int add_script(struct step *st_, int n, struct slot *s, const int *ops, size_t nops)
{
	for (size_t i = 0; i < nops; i++) {
		st_[n++] = (struct step){ s, ops[i] };
		/* Other kinds of memory after the host segment: two parts and
		 * the segment that chains them, or one of any kind. */
		if (ops[i] == OP_SEG_HOST && chance(15)) {
			st_[n++] = (struct step){ s, OP_SEG_PART };
			st_[n++] = (struct step){ s, OP_SEG_PART };
			st_[n++] = (struct step){ s, OP_SEG_CHAIN };
		} else if (ops[i] == OP_SEG_HOST && chance(20)) {
			st_[n++] = (struct step){ s, OP_SEG_PART + (int)rn(4) };
		}
	}
	return n;
}

/* One session: a producer, a consumer, a producer and a consumer of one
 * model of their own, or monitoring; on a fresh or a reused connection;
 * its steps in order, reversed, shuffled or swapped for ops of any role;
 * some mutated. */
static int session(int budget)
{
	/* Clean sessions reach deep states (a publish, a fetch with fds);
	 * dirty ones spread their mutations from there. */
	static const int rates[] = { 0, 0, 10, 20, 30, 50, 80, 100 };
	static const int again_p[] = { OP_BEGIN, OP_PUBLISH };
	static const int again_c[] = { OP_ACQUIRE, OP_FETCH };
	struct slot *a = &slots[rn(NSLOTS)], *b;
	struct step steps[32], t;
	int n = 0, sent = 0, kind = (int)rn(10), order = (int)rn(10), rate = PICK(rates);

	if (a->fd < 0 || chance(50))
		slot_open(a);
	if (kind < 3) {
		b = &slots[(a - slots + 1 + (int)rn(NSLOTS - 1)) % NSLOTS];
		slot_open(a);
		slot_open(b);
		a->model = b->model = NMODELS + (int)(a - slots);
		n = add_script(steps, n, a, prod_script, NELEM(prod_script));
		n = add_script(steps, n, b, cons_script, NELEM(cons_script) - (chance(50) ? 1 : 0));
		if (chance(50)) {
			n = add_script(steps, n, a, again_p, NELEM(again_p));
			n = add_script(steps, n, b, again_c, NELEM(again_c));
		}
	} else if (kind < 6) {
		n = add_script(steps, n, a, prod_script, NELEM(prod_script));
		if (chance(40))
			n = add_script(steps, n, a, again_p, NELEM(again_p));
	} else if (kind < 9) {
		n = add_script(steps, n, a, cons_script, NELEM(cons_script));
		if (chance(30))
			n = add_script(steps, n, a, again_c, NELEM(again_c));
	} else {
		if (chance(30))
			steps[n++] = (struct step){ a, OP_HELLO_A };
		for (int i = 1 + (int)rn(4); i > 0; i--)
			steps[n++] = (struct step){ a, OP_STATUS + (int)rn(NOPS - OP_STATUS) };
	}
	if (order == 0) { /* reversed */
		for (int i = 0; i < n / 2; i++) {
			t = steps[i];
			steps[i] = steps[n - 1 - i];
			steps[n - 1 - i] = t;
		}
	} else if (order == 1) { /* shuffled */
		for (int i = n - 1; i > 0; i--) {
			int j = (int)rn((uint64_t)i + 1);

			t = steps[i];
			steps[i] = steps[j];
			steps[j] = t;
		}
	} else if (order == 2) { /* ops of any role */
		for (int i = 0; i < n; i++)
			if (chance(30))
				steps[i].op = (int)rn(NOPS);
	}
	for (int i = 0; i < n && sent < budget; i++, sent++) {
		if (steps[i].s->fd < 0)
			slot_open(steps[i].s);
		send_one(steps[i].s, steps[i].op, chance(rate));
	}
	/* A session may end by vanishing mid-way. */
	if (chance(20))
		slot_close(a);
	return sent;
}

/* ---------------------------------------------------------------------- */

/* Status on the connection kept from the start: answered, and (with
 * must_ok) ok. */
static void status_ok(const char *when, int must_ok)
{
	static const char s[] = "{\"v\":1,\"op\":\"status\"}";
	struct fz_msg m = { .buf = (char *)s, .len = sizeof(s) - 1 };
	char code[64];
	int got;

	snprintf(m.what, sizeof(m.what), "status %s", when);
	T_ASSERT(wex_sock_send(ctl, s, m.len, NULL, 0, 0) > 0, "send status %s", when);
	got = recv_reply(ctl, REPLY_WAIT_MS, &m, code, sizeof(code), NULL);
	if (got <= 0)
		check_alive(when);
	T_ASSERT(got > 0, "status %s: %s", when, got ? "no reply" : "connection dropped");
	T_ASSERT(!must_ok || !strcmp(code, "OK"), "status %s: %s", when, code);
}

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *s = getenv(name);

	return s && *s ? strtoull(s, NULL, 0) : def;
}

/* A fresh producer and consumer after the fuzz: v1 published, copied and
 * verified byte for byte. */
static void end_to_end(void)
{
	struct t_prod p;
	struct t_cons k;
	struct wex_sync_result r;

	t_prod_open(&p, "fz-final", "tiny", 0, 1);
	t_cons_open(&k, "fz-final", "g", "tiny", 0, 1);
	t_prod_write(&p, 1);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 1, 10000, &r));
	T_ASSERT(r.version == 1, "the consumer got v%llu", (unsigned long long)r.version);
	T_ASSERT(t_own_bad(&k, 1) == 0, "the consumer's copy of v1 is exact");
	t_prod_write(&p, 2);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 2, 10000, &r));
	T_ASSERT(r.version == 2 && t_own_bad(&k, 2) == 0, "the consumer's copy of v2 is exact");
	t_cons_close(&k);
	t_prod_close(&p);
}

int main(void)
{
	uint64_t seed0 = env_u64("WEX_FUZZ_SEED", 0x5eed0001), iters, done = 0;
	double t0;
	int before, after;
	json_t *r;

	/* Messages of up to MAX_FDS fds, several in flight. */
	t_nofile_at_least(4 * MAX_FDS + 64);
	iters = env_u64("WEX_FUZZ_ITERS", DEFAULT_ITERS);
	rng = seed0;
	printf("proto_fuzz: WEX_FUZZ_SEED=0x%" PRIx64 " WEX_FUZZ_ITERS=%" PRIu64 "\n", seed0,
	       iters);
	fflush(stdout);
	/* Thousands of hellos: keep wexd's log to what matters. */
	if (!getenv("WEX_LOG_LEVEL"))
		setenv("WEX_LOG_LEVEL", "warn", 1);
	signal(SIGPIPE, SIG_IGN);
	t_wexd_start(&d);
	t_check_backend(d.sock);
	snprintf(dir_path, sizeof(dir_path), "%s", d.dir);
	ctl = t_raw_connect(d.sock);
	status_ok("at the start", 1);
	before = t_wexd_fds_settle(&d, -1);
	for (int i = 0; i < NSLOTS; i++)
		slots[i].fd = -1;

	t0 = t_now();
	while (done < iters) {
		uint64_t mark = done / BATCH;

		done += (uint64_t)session((int)(iters - done));
		if (done / BATCH != mark) {
			check_alive("during the fuzz");
			status_ok("during the fuzz", 0);
		}
	}
	check_alive("after the fuzz");
	printf("sent %" PRIu64 " messages (%" PRIu64 " mutated) in %.1f s: %" PRIu64
	       " ok, %" PRIu64 " errors, %" PRIu64 " connections ended by a zero-length "
	       "message, %" PRIu64 " waits abandoned (%" PRIu64 " answered the probe), %" PRIu64
	       " fds received\n",
	       st.sent, st.mutated, t_now() - t0, st.ok, st.err, st.dropped, st.abandoned,
	       st.busy_probe, st.fds_back);
	for (int i = 0; i < 64 && codes[i].code[0]; i++)
		printf("  %-20s %" PRIu64 "\n", codes[i].code, codes[i].n);
	printf("unmutated seeds, ok/error:");
	for (int i = 0; i < NOPS; i++)
		printf("%s %s %" PRIu64 "/%" PRIu64, i % 4 ? "," : "\n ", op_names[i], st.op_ok[i],
		       st.op_err[i]);
	printf("\n");

	/* Every fuzz connection closed: wexd is back to its fds and models. */
	for (int i = 0; i < NSLOTS; i++)
		slot_close(&slots[i]);
	after = t_wexd_fds_settle(&d, before);
	T_ASSERT(after == before, "wexd holds %d fds after the fuzz, %d before", after, before);
	/* The closes are processed (a wide model would fail status). */
	status_ok("after the fuzz", 1);
	for (double t1 = t_now(); t_now() - t1 < 5.0;) {
		r = t_raw_rpc(ctl, "{\"v\":1,\"op\":\"models\"}", NULL, 0);
		after = (int)json_array_size(json_object_get(r, "models"));
		json_decref(r);
		if (!after)
			break;
	}
	T_ASSERT(after == 0, "%d model(s) left after every fuzz client closed", after);

	end_to_end();
	status_ok("after the end-to-end session", 1);
	after = t_wexd_fds_settle(&d, before);
	T_ASSERT(after == before, "wexd holds %d fds after the end-to-end session, %d before",
		 after, before);
	check_alive("at the end");
	close(ctl);
	t_wexd_stop(&d);
	printf("wexd fds: %d before, %d after; total %.1f s\n", before, after, t_now() - t0);
	return T_EXIT_PASS;
}
