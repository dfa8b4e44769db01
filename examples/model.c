/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"

double ex_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int ex_num(const char *prog, const char *opt, const char *s, uint64_t min, uint64_t max,
	   uint64_t *out)
{
	unsigned long long v;
	char *end = NULL;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (*s < '0' || *s > '9' || *end || errno || v < min || v > max) {
		fprintf(stderr, "%s: bad --%s '%s': a whole number from %llu to %llu\n", prog, opt, s,
			(unsigned long long)min, (unsigned long long)max);
		return -1;
	}
	*out = v;
	return 0;
}

int ex_cfg_preset(struct ex_cfg *cfg, const char *name)
{
	if (!name || !strcmp(name, "qwen2-0.5b")) {
		*cfg = (struct ex_cfg){ .hidden = 896, .inter = 4864, .kv_dim = 128, .vocab = 151936,
					.layers = 24 };
		return 0;
	}
	if (!strcmp(name, "tiny")) {
		*cfg = (struct ex_cfg){ .hidden = 64, .inter = 256, .kv_dim = 32, .vocab = 1000,
					.layers = 2 };
		return 0;
	}
	if (!strcmp(name, "small")) {
		*cfg = (struct ex_cfg){ .hidden = 256, .inter = 1024, .kv_dim = 64, .vocab = 8192,
					.layers = 4 };
		return 0;
	}
	return -1;
}

/* The tid is a hash of the name, so every rank and every program agrees. */
uint32_t ex_tid(const char *name)
{
	uint32_t h = 2166136261u;

	for (; *name; name++)
		h = (h ^ (uint8_t)*name) * 16777619u;
	return h;
}

static void add(struct wex_tensor *t, int *n, const char *name, uint64_t d0, uint64_t d1)
{
	struct wex_tensor *x = &t[(*n)++];

	memset(x, 0, sizeof(*x));
	snprintf(x->name, sizeof(x->name), "%s", name);
	x->dtype = WEX_DT_BF16;
	x->ndim = d1 ? 2 : 1;
	x->shape[0] = d0;
	x->shape[1] = d1;
}

int ex_shards(const struct ex_cfg *c, uint32_t rank, uint32_t world, struct wex_tensor **out,
	      uint64_t *seg_bytes)
{
	int cap = 12 * (int)c->layers + 2, n = 0;
	struct wex_tensor *t = calloc((size_t)cap, sizeof(*t));
	uint64_t off = 0;
	char nm[WEX_NAME_MAX];

	if (!t)
		return -1;
	add(t, &n, "model.embed_tokens.weight", c->vocab, c->hidden);
	for (uint32_t l = 0; l < c->layers; l++) {
#define L(s, a, b)                                                                  \
	do {                                                                        \
		snprintf(nm, sizeof(nm), "model.layers.%u.%s", l, s);               \
		add(t, &n, nm, a, b);                                               \
	} while (0)
		L("self_attn.q_proj.weight", c->hidden, c->hidden);
		L("self_attn.q_proj.bias", c->hidden, 0);
		L("self_attn.k_proj.weight", c->kv_dim, c->hidden);
		L("self_attn.k_proj.bias", c->kv_dim, 0);
		L("self_attn.v_proj.weight", c->kv_dim, c->hidden);
		L("self_attn.v_proj.bias", c->kv_dim, 0);
		L("self_attn.o_proj.weight", c->hidden, c->hidden);
		L("mlp.gate_proj.weight", c->inter, c->hidden);
		L("mlp.up_proj.weight", c->inter, c->hidden);
		L("mlp.down_proj.weight", c->hidden, c->inter);
		L("input_layernorm.weight", c->hidden, 0);
		L("post_attention_layernorm.weight", c->hidden, 0);
#undef L
	}
	add(t, &n, "model.norm.weight", c->hidden, 0);
	for (int i = 0; i < n; i++) {
		if (t[i].shape[0] % world) {
			free(t);
			return -1;
		}
		t[i].extent[0] = t[i].shape[0] / world;
		t[i].start[0] = t[i].extent[0] * rank;
		t[i].extent[1] = t[i].shape[1];
		t[i].offset = off;
		off += (wex_tensor_nbytes(&t[i]) + 255) & ~255ull;
	}
	*seg_bytes = (off + 4095) & ~4095ull;
	*out = t;
	return n;
}

struct job {
	void *base;
	const struct wex_tensor *t;
	size_t n;
	uint64_t version;
	int fill;
	uint64_t bad;
	uint64_t first, last; /* element range over all tensors, flattened */
	const uint64_t *prefix;
};

static void run_range(struct job *j)
{
	/* Walk the tensors overlapping [first, last). */
	size_t i = 0;

	while (i < j->n && j->prefix[i + 1] <= j->first)
		i++;
	for (uint64_t e = j->first; e < j->last && i < j->n; i++) {
		const struct wex_tensor *t = &j->t[i];
		uint64_t cols = t->ndim == 2 ? t->extent[1] : 1;
		uint64_t gcols = t->ndim == 2 ? t->shape[1] : 1;
		uint64_t local = e - j->prefix[i], end = j->prefix[i + 1];
		uint32_t tid = ex_tid(t->name);
		uint16_t *p = (uint16_t *)(j->base ? (char *)j->base + t->offset : (char *)t->ptr);

		if (end > j->last)
			end = j->last;
		for (; e < end; e++, local++) {
			uint64_t r = local / cols, col = local % cols;
			uint64_t g = (t->start[0] + r) * gcols + (t->ndim == 2 ? t->start[1] + col : 0);
			uint16_t v = ex_value(j->version, tid, g);

			if (j->fill)
				p[local] = v;
			else if (p[local] != v)
				j->bad++;
		}
	}
}

static void *worker(void *arg)
{
	run_range(arg);
	return NULL;
}

static uint64_t run(void *base, const struct wex_tensor *t, size_t n, uint64_t version,
		    int threads, int fill)
{
	uint64_t *prefix = calloc(n + 1, sizeof(uint64_t)), bad = 0;
	struct job jobs[64];
	pthread_t tid[64];

	if (!prefix)
		abort();
	for (size_t i = 0; i < n; i++)
		prefix[i + 1] = prefix[i] + wex_tensor_nbytes(&t[i]) / 2;
	if (threads < 1)
		threads = 1;
	if (threads > 64)
		threads = 64;
	for (int k = 0; k < threads; k++) {
		jobs[k] = (struct job){ .base = base, .t = t, .n = n, .version = version, .fill = fill,
					.prefix = prefix,
					.first = prefix[n] * (uint64_t)k / (uint64_t)threads,
					.last = prefix[n] * (uint64_t)(k + 1) / (uint64_t)threads };
		if (k && pthread_create(&tid[k], NULL, worker, &jobs[k]) != 0)
			run_range(&jobs[k]), tid[k] = 0;
	}
	run_range(&jobs[0]);
	for (int k = 1; k < threads; k++) {
		if (tid[k])
			pthread_join(tid[k], NULL);
		bad += jobs[k].bad;
	}
	bad += jobs[0].bad;
	free(prefix);
	return bad;
}

void ex_fill(void *base, const struct wex_tensor *t, size_t n, uint64_t version, int threads)
{
	run(base, t, n, version, threads, 1);
}

uint64_t ex_check(const void *base, const struct wex_tensor *t, size_t n, uint64_t version,
		  int threads)
{
	return run((void *)base, t, n, version, threads, 0);
}
