/* SPDX-License-Identifier: MIT */
/*
 * layout.c - interprets the layout data under adapters/.
 *
 * Families name canonical tensors by role ("q", "e_gate", ...) with shapes
 * written as expressions over config symbols; engines name physical tensors
 * by the roles they hold and a kind saying how they are cut.  A physical
 * tensor is always a concatenation along dim 0 of blocks (boxes of
 * canonical tensors), optionally stacked over local experts, followed by
 * padding rows (padded vocabularies); that one shape covers Megatron's QKV
 * interleave, vLLM's [Q;K;V] with replicated KV heads, [gate;up], vocab
 * padding and fused experts.
 */
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "layout.h"

#ifndef WEX_ADAPTERS_SRC_DIR
#define WEX_ADAPTERS_SRC_DIR "adapters"
#endif

#define MAXSYM 64
#define MAXSTR 16
#define MAXROLES 4

enum { LAY_NONE, LAY_ALL, LAY_DENSE, LAY_MOE };
enum { P_TP, P_PP, P_DP, P_EP, P_ETP, P_FIRST, P_LAST, P_FUSE_SHARED, P_DP_ATTENTION,
       P_DENSE_TP, P_DP_LM_HEAD, P_FSDP, P_VPP, P_A2A, P_EMBED_REP, P_VOCAB_DIV, P_NO_MLA,
       P_SP_MOE };
static const char *const param_names[WEX_LAYOUT_PARAMS] = {
	"tp", "pp", "dp", "ep", "etp", "first", "last", "fuse_shared", "dp_attention", "dense_tp",
	"dp_lm_head", "fsdp", "vpp", "a2a", "embed_rep", "vocab_div", "no_mla", "sp_moe"
};
_Static_assert(WEX_LAYOUT_PARAMS <= 32, "if/unless keep layout parameters in a 32-bit mask");

/* The layout keys, space-separated, into buf (for error messages). */
static const char *param_keys(char *buf, size_t len)
{
	size_t n = 0;

	buf[0] = '\0';
	for (int k = 0; k < WEX_LAYOUT_PARAMS && n < len; k++)
		n += (size_t)snprintf(buf + n, len - n, "%s%s", k ? " " : "", param_names[k]);
	return buf;
}

struct sym {
	char name[32];
	int64_t v;
};

struct kv {
	char k[32];
	char v[64];
};

struct ftensor {
	char role[32];
	char name[WEX_NAME_MAX];
	uint32_t ndim;
	uint64_t shape[WEX_MAX_DIMS];
	int layers;
	int experts;
	int dtype; /* WEX_DT_*: 0 follows the model's dtype */
	int quant; /* "quant" in the family: FP8 with block scales when the config says so */
	int scale; /* index of its weight_scale_inv tensor in ft[], -1 none */
};

struct wex_model {
	char family[32];
	char model_type[32];
	char adapters[512];
	int dtype;
	struct sym syms[MAXSYM];
	int nsyms;
	struct kv strs[MAXSTR];
	int nstrs;
	struct ftensor *ft;
	int nft;
	/* Layers the config keeps dense whatever the other rules say (the
	 * family's "dense_layer_list" key, Qwen's mlp_only_layers), sorted. */
	int64_t *dense_list;
	size_t ndense_list;
	/* quantization_config fp8 with weight_block_size: the dtype of the
	 * "quant" tensors (0: not quantized) and the block of one scale. */
	int fp8;
	uint64_t qblk[2];
	/* The engine layout wex__model_pin_engine read (NULL: none), used
	 * for that engine instead of reading its file again. */
	json_t *eng;
	char eng_name[32];
};

#include "log.h"

#define seterr wex__seterr

static int layer_is_moe(const struct wex_model *m, int64_t L);
static int64_t count_moe_layers(const struct wex_model *m, int64_t layers);
static int layer_has(const struct wex_model *m, int layers, int64_t L);

int64_t wex__model_sym(const struct wex_model *m, const char *name)
{
	for (int i = 0; i < m->nsyms; i++)
		if (!strcmp(m->syms[i].name, name))
			return m->syms[i].v;
	return -1;
}

static void sym_set(struct wex_model *m, const char *name, int64_t v)
{
	for (int i = 0; i < m->nsyms; i++)
		if (!strcmp(m->syms[i].name, name)) {
			m->syms[i].v = v;
			return;
		}
	if (m->nsyms < MAXSYM) {
		snprintf(m->syms[m->nsyms].name, sizeof(m->syms[0].name), "%s", name);
		m->syms[m->nsyms++].v = v;
	}
}

const char *wex__model_family(const struct wex_model *m)
{
	return m->family;
}

const char *wex__model_adapters(const struct wex_model *m)
{
	return m->adapters;
}

int wex__model_dtype(const struct wex_model *m)
{
	return m->dtype;
}

void wex__model_set_dtype(struct wex_model *m, int dtype)
{
	if (wex_dtype_size(dtype))
		m->dtype = dtype;
}

/* A canonical tensor's element type: its own ("dtype" in the family, e.g.
 * DeepSeek-V3's F32 router bias) or the model's. */
static int ft_dtype(const struct wex_model *m, const struct ftensor *f)
{
	return f->dtype ? f->dtype : m->dtype;
}

/* ---- expressions: + - * / ( ) == over integers and symbols ---- */

struct ex {
	const char *s;
	const struct wex_model *m;
	int bad;
	int overflow; /* a step left int64_t */
	int divzero;
	int depth;    /* open parentheses: bounded, the parser recurses */
};

static int64_t ex_cmp(struct ex *e);

static void ex_ws(struct ex *e)
{
	while (*e->s == ' ')
		e->s++;
}

static int64_t ex_factor(struct ex *e)
{
	ex_ws(e);
	if (*e->s == '(') {
		if (e->depth >= 64) {
			e->bad = 1;
			return 0;
		}
		e->s++;
		e->depth++;
		int64_t v = ex_cmp(e);

		e->depth--;
		ex_ws(e);
		if (*e->s != ')')
			e->bad = 1;
		else
			e->s++;
		return v;
	}
	if (*e->s >= '0' && *e->s <= '9') {
		char *end;
		int64_t v;

		errno = 0;
		v = strtoll(e->s, &end, 10);
		if (errno == ERANGE)
			e->overflow = 1;
		e->s = end;
		return v;
	}
	char id[32];
	size_t n = 0, len = 0;
	while ((*e->s >= 'a' && *e->s <= 'z') || (*e->s >= 'A' && *e->s <= 'Z') || *e->s == '_' ||
	       (len && *e->s >= '0' && *e->s <= '9')) {
		if (n < sizeof(id) - 1)
			id[n++] = *e->s;
		len++;
		e->s++;
	}
	id[n] = 0;
	/* (A longer name is none known: cut short, it could match one.) */
	if (!n || len != n) {
		e->bad = 1;
		return 0;
	}
	int64_t v = wex__model_sym(e->m, id);
	if (v < 0)
		e->bad = 1;
	return v;
}

static int64_t ex_term(struct ex *e)
{
	int64_t v = ex_factor(e);

	for (;;) {
		ex_ws(e);
		if (*e->s == '*') {
			e->s++;
			if (__builtin_mul_overflow(v, ex_factor(e), &v))
				e->overflow = 1;
		} else if (*e->s == '/') {
			e->s++;
			int64_t d = ex_factor(e);

			if (d == 0)
				e->divzero = 1;
			else if (v == INT64_MIN && d == -1)
				e->overflow = 1;
			else
				v /= d;
		} else {
			return v;
		}
	}
}

static int64_t ex_sum(struct ex *e)
{
	int64_t v = ex_term(e);

	for (;;) {
		ex_ws(e);
		if (*e->s == '+') {
			e->s++;
			if (__builtin_add_overflow(v, ex_term(e), &v))
				e->overflow = 1;
		} else if (*e->s == '-') {
			e->s++;
			if (__builtin_sub_overflow(v, ex_term(e), &v))
				e->overflow = 1;
		} else {
			return v;
		}
	}
}

/* Comparison binds loosest, as in C: a+b==c+d is (a+b)==(c+d). */
static int64_t ex_cmp(struct ex *e)
{
	int64_t v = ex_sum(e);

	for (;;) {
		ex_ws(e);
		if (e->s[0] != '=' || e->s[1] != '=')
			return v;
		e->s += 2;
		v = v == ex_sum(e);
	}
}

static int eval(const struct wex_model *m, const char *s, int64_t *v)
{
	struct ex e = { .s = s, .m = m };

	*v = ex_cmp(&e);
	ex_ws(&e);
	if (e.bad || *e.s)
		return -EINVAL;
	return e.divzero ? -EDOM : e.overflow ? -ERANGE : 0;
}

/* "sym" true when nonzero, "!sym" when zero, "" always. */
static int when_true(const struct wex_model *m, const char *w)
{
	int neg = 0;
	int64_t v;

	if (!w || !*w)
		return 1;
	if (*w == '!') {
		neg = 1;
		w++;
	}
	v = wex__model_sym(m, w);
	return neg ? v <= 0 : v > 0;
}

static const char *str_get(const struct wex_model *m, const char *k)
{
	for (int i = 0; i < m->nstrs; i++)
		if (!strcmp(m->strs[i].k, k))
			return m->strs[i].v;
	return NULL;
}

/* Expands {L} {l} {E} {e} and family strings in a name template. */
static int expand(const struct wex_model *m, const char *tpl, int64_t L, int64_t l, int64_t E,
		  int64_t e, char *out)
{
	size_t n = 0;

	for (const char *p = tpl; *p;) {
		char buf[80];
		const char *ins = NULL;

		if (*p == '{') {
			const char *q = strchr(p, '}');
			char key[32];

			if (!q || (size_t)(q - p - 1) >= sizeof(key))
				return -EINVAL;
			memcpy(key, p + 1, (size_t)(q - p - 1));
			key[q - p - 1] = 0;
			if (!strcmp(key, "L"))
				snprintf(buf, sizeof(buf), "%lld", (long long)L), ins = buf;
			else if (!strcmp(key, "l"))
				snprintf(buf, sizeof(buf), "%lld", (long long)l), ins = buf;
			else if (!strcmp(key, "E"))
				snprintf(buf, sizeof(buf), "%lld", (long long)E), ins = buf;
			else if (!strcmp(key, "e"))
				snprintf(buf, sizeof(buf), "%lld", (long long)e), ins = buf;
			else
				ins = str_get(m, key);
			if (!ins)
				return -EINVAL;
			p = q + 1;
		} else {
			buf[0] = *p++;
			buf[1] = 0;
			ins = buf;
		}
		size_t k = strlen(ins);
		if (n + k >= WEX_NAME_MAX)
			return -ENAMETOOLONG;
		memcpy(out + n, ins, k);
		n += k;
	}
	out[n] = 0;
	return 0;
}

static char *read_text(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	struct stat st;
	long n;

	if (!f)
		return NULL;
	/* A directory opens, and its ftell is LONG_MAX on ext4: read as a
	 * malloc that failed ("Cannot allocate memory"). */
	if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
		fclose(f);
		errno = EISDIR;
		return NULL;
	}
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
		buf = malloc((size_t)n + 1);
		if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
			free(buf);
			buf = NULL;
		} else if (buf) {
			buf[n] = 0;
		}
	}
	fclose(f);
	return buf;
}

static void pick_adapters(const char *given, char *out, size_t len)
{
	const char *env = getenv("WEX_ADAPTERS");
	const char *c[] = { given, env, WEX_ADAPTERS_SRC_DIR, "/usr/local/share/wex/adapters",
			    "/usr/share/wex/adapters" };
	char probe[600];

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		if (!c[i] || !*c[i])
			continue;
		/* A directory the user named (--adapters, $WEX_ADAPTERS) is
		 * used as given: a typo there must fail naming it, not fall
		 * back to another copy unsaid. */
		snprintf(probe, sizeof(probe), "%s/engines/hf.json", c[i]);
		if (access(probe, R_OK) == 0 || i <= 1) {
			snprintf(out, len, "%s", c[i]);
			return;
		}
	}
	snprintf(out, len, "%s", WEX_ADAPTERS_SRC_DIR);
}

static json_t *load_json(const char *dir, const char *sub, const char *name, char *err,
			 size_t errlen)
{
	char path[700];
	json_error_t je;
	struct stat st;
	json_t *j;

	snprintf(path, sizeof(path), "%s/%s/%s.json", dir, sub, name);
	j = json_load_file(path, 0, &je);
	/* A file jansson cannot open or read has line -1: its text names
	 * the path and the cause already.  A directory opens, and read as
	 * empty it was "'[' or '{' expected near end of file". */
	if (!j && je.line < 1)
		seterr(err, errlen, "%s", je.text);
	else if (!j && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
		seterr(err, errlen, "%s: %s", path, strerror(EISDIR));
	else if (!j)
		seterr(err, errlen, "%s: %s (line %d, column %d)", path, je.text, je.line, je.column);
	return j;
}

/* Largest value a config key may give a symbol: sizes, counts and
 * dimensions of any model stay far below it, and products of a few of them
 * still fit int64_t. */
#define CFG_INT_MAX (1ll << 40)
/* Whole-model limits: DeepSeek-V3 has about 47,000 tensors and 2^40 bytes. */
#define MODEL_MAX_TENSORS (1ull << 22)
#define MODEL_MAX_BYTES (1ull << 52)

/* Integer value of a config key: whole numbers from 0 to CFG_INT_MAX
 * (4.0 counts as 4) and booleans; null counts as absent (-ENOENT);
 * anything else is -EINVAL. */
static int cfg_int(json_t *cfg, const char *key, int64_t *v)
{
	json_t *x = key && *key ? json_object_get(cfg, key) : NULL;

	if (json_is_integer(x)) {
		*v = json_integer_value(x);
	} else if (json_is_boolean(x)) {
		*v = json_is_true(x);
	} else if (json_is_real(x)) {
		double r = json_real_value(x);

		if (!(r >= 0 && r <= (double)CFG_INT_MAX) || r != (double)(int64_t)r)
			return -EINVAL;
		*v = (int64_t)r;
	} else if (!x || json_is_null(x)) {
		return -ENOENT;
	} else {
		return -EINVAL;
	}
	return *v >= 0 && *v <= CFG_INT_MAX ? 0 : -EINVAL;
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

static int family_has_type(json_t *fam, const char *mt)
{
	size_t i;
	json_t *v;

	json_array_foreach(json_object_get(fam, "model_types"), i, v)
		if (json_is_string(v) && !strcmp(json_string_value(v), mt))
			return 1;
	return 0;
}

static const char *const family_files[] = { "llama", "moe", "deepseek_v3" };

/* Aho-Corasick automaton over the strings of a JSON list (others are
 * skipped, and so is ""): which of them occurs in a text, found in one
 * pass over the text whatever the number of strings.  A node is a prefix
 * of some string; fail is the node of its longest proper suffix that is
 * one too; hit is the index in the list of a string that ends at the node
 * or at a node its fail links lead to, -1 none. */
struct ac_node {
	int64_t child, sibling, fail, hit;
	unsigned char c;
};

struct ac {
	struct ac_node *n;
	size_t nn;
};

static int64_t ac_child(const struct ac *a, int64_t u, unsigned char c)
{
	for (int64_t v = a->n[u].child; v >= 0; v = a->n[v].sibling)
		if (a->n[v].c == c)
			return v;
	return -1;
}

static int ac_build(struct ac *a, json_t *list)
{
	size_t cap = 1, i, qh = 0, qt = 0;
	int64_t *q;
	json_t *v;

	json_array_foreach(list, i, v)
		cap += json_string_length(v);
	a->nn = 0;
	a->n = malloc(cap * sizeof(*a->n));
	q = malloc(cap * sizeof(*q));
	if (!a->n || !q) {
		free(a->n);
		free(q);
		return -ENOMEM;
	}
	a->n[a->nn++] = (struct ac_node){ .child = -1, .sibling = -1, .hit = -1 };
	json_array_foreach(list, i, v) {
		const char *s = json_string_value(v);
		int64_t u = 0;

		for (; s && *s; s++) {
			int64_t w = ac_child(a, u, (unsigned char)*s);

			if (w < 0) {
				w = (int64_t)a->nn++;
				a->n[w] = (struct ac_node){ .child = -1, .sibling = a->n[u].child, .hit = -1,
							    .c = (unsigned char)*s };
				a->n[u].child = w;
			}
			u = w;
		}
		if (u && a->n[u].hit < 0)
			a->n[u].hit = (int64_t)i;
	}
	/* Breadth first: a node's fail link and hit are set from shallower
	 * nodes, which are complete by then. */
	q[qt++] = 0;
	while (qh < qt) {
		int64_t u = q[qh++];

		for (int64_t x = a->n[u].child; x >= 0; x = a->n[x].sibling) {
			int64_t f = a->n[u].fail, w = -1;

			while (u && (w = ac_child(a, f, a->n[x].c)) < 0 && f)
				f = a->n[f].fail;
			a->n[x].fail = w >= 0 ? w : 0;
			if (a->n[x].hit < 0)
				a->n[x].hit = a->n[a->n[x].fail].hit;
			q[qt++] = x;
		}
	}
	free(q);
	return 0;
}

/* The index of a string of the automaton's list that occurs in s, -1 none. */
static int64_t ac_find(const struct ac *a, const char *s)
{
	int64_t u = 0;

	for (; *s; s++) {
		int64_t w;

		while ((w = ac_child(a, u, (unsigned char)*s)) < 0 && u)
			u = a->n[u].fail;
		u = w >= 0 ? w : 0;
		if (a->n[u].hit >= 0)
			return a->n[u].hit;
	}
	return -1;
}

int wex__model_from_text(const char *config_json, const char *adapters_dir,
			 struct wex_model **out, char *err, size_t errlen)
{
	json_error_t je;
	json_t *cfg = json_loads(config_json, 0, &je), *fam = NULL;
	struct wex_model *m = NULL;
	const char *mt;
	int ret = -EINVAL;
	size_t i;
	json_t *v;

	if (!cfg && je.line < 1) {
		seterr(err, errlen, "config.json: %s", je.text);
		return -EINVAL;
	}
	if (!cfg) {
		seterr(err, errlen, "config.json: %s (line %d, column %d)", je.text, je.line, je.column);
		return -EINVAL;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		ret = -ENOMEM;
		goto out;
	}
	pick_adapters(adapters_dir, m->adapters, sizeof(m->adapters));
	mt = json_string_value(json_object_get(cfg, "model_type"));
	if (!mt) {
		seterr(err, errlen, "config.json has no model_type");
		goto out;
	}
	snprintf(m->model_type, sizeof(m->model_type), "%s", mt);
	for (size_t f = 0; f < sizeof(family_files) / sizeof(family_files[0]); f++) {
		fam = load_json(m->adapters, "families", family_files[f], err, errlen);
		if (!fam) {
			ret = -ENOENT;
			goto out;
		}
		if (family_has_type(fam, mt))
			break;
		json_decref(fam);
		fam = NULL;
	}
	if (!fam) {
		seterr(err, errlen, "no adapter family for model_type \"%s\" (in %s/families)", mt,
		       m->adapters);
		goto out;
	}
	snprintf(m->family, sizeof(m->family), "%s",
		 json_string_value(json_object_get(fam, "family")) ?: "?");
	/* The families describe a causal LM's checkpoint (model.* and
	 * lm_head): a reward or classification head (Qwen2ForRewardModel's
	 * score.*), an EAGLE draft (LlamaForCausalLMEagle3) or a bare
	 * LlamaModel share the model_type but not the tensors. */
	json_array_foreach(json_object_get(cfg, "architectures"), i, v) {
		const char *a = json_string_value(v);
		size_t n = a ? strlen(a) : 0;

		if (a && (n < 11 || strcmp(a + n - 11, "ForCausalLM"))) {
			seterr(err, errlen, "config.json: architectures lists \"%s\": family %s "
			       "describes only a ...ForCausalLM checkpoint (model.* and lm_head), not "
			       "its tensors", a, m->family);
			goto out;
		}
	}
	/* Symbols in order: config key, else the default expression. */
	json_array_foreach(json_object_get(fam, "symbols"), i, v) {
		const char *name = json_string_value(json_array_get(v, 0));
		const char *key = json_string_value(json_array_get(v, 1));
		const char *def = json_string_value(json_array_get(v, 2));
		int64_t x;

		if (!name) {
			seterr(err, errlen, "family %s: bad symbol entry %zu", m->family, i);
			goto out;
		}
		if (strlen(name) >= sizeof(m->syms[0].name)) {
			seterr(err, errlen, "family %s: symbol name %s is longer than %zu bytes", m->family,
			       name, sizeof(m->syms[0].name) - 1);
			goto out;
		}
		int rc = cfg_int(cfg, key, &x);

		if (rc == -EINVAL) {
			char *txt = json_dumps(json_object_get(cfg, key),
					       JSON_ENCODE_ANY | JSON_REAL_PRECISION(12));

			seterr(err, errlen, "config.json: %s is %s: expected a whole number from 0 to "
			       "%lld", key, txt ? txt : "?", (long long)CFG_INT_MAX);
			free(txt);
			goto out;
		}
		if (rc < 0) {
			rc = def ? eval(m, def, &x) : -EINVAL;
			if (rc == -EDOM) {
				seterr(err, errlen, "config.json lacks %s, and its default %s divides by "
				       "zero (a size it uses is 0)", key && *key ? key : name, def);
				goto out;
			}
			if (rc < 0) {
				seterr(err, errlen, "config.json lacks %s (needed by family %s)",
				       key && *key ? key : name, m->family);
				goto out;
			}
		}
		sym_set(m, name, x);
	}
	if (wex__model_sym(m, "sparse_step") == 0) {
		seterr(err, errlen, "config.json: decoder_sparse_step is 0: every layer would divide by "
		       "it (1 makes every layer sparse)");
		goto out;
	}
	{
		/* transformers: a layer listed here has a plain MLP. */
		const char *key = json_string_value(json_object_get(fam, "dense_layer_list"));
		json_t *lst = key ? json_object_get(cfg, key) : NULL;

		if (lst && !json_is_null(lst)) {
			if (!json_is_array(lst)) {
				seterr(err, errlen, "config.json: %s is not a list of layer numbers", key);
				goto out;
			}
			m->dense_list = calloc(json_array_size(lst) + 1, sizeof(*m->dense_list));
			if (!m->dense_list) {
				ret = -ENOMEM;
				goto out;
			}
			json_array_foreach(lst, i, v) {
				int64_t x;

				if (!json_is_integer(v) || (x = json_integer_value(v)) < 0) {
					seterr(err, errlen, "config.json: %s[%zu] is not a layer number "
					       "(a whole number from 0)", key, i);
					goto out;
				}
				m->dense_list[m->ndense_list++] = x;
			}
			qsort(m->dense_list, m->ndense_list, sizeof(*m->dense_list), cmp_i64);
		}
	}
	{
		json_t *ov = json_object_get(json_object_get(fam, "model_type_symbols"), mt);

		json_array_foreach(ov, i, v) {
			int64_t x;
			const char *e = json_string_value(json_array_get(v, 1));

			if (e && eval(m, e, &x) == 0)
				sym_set(m, json_string_value(json_array_get(v, 0)) ?: "", x);
		}
	}
	{
		json_t *strs[2] = { json_object_get(fam, "strings"),
				    json_object_get(json_object_get(fam, "model_type_strings"), mt) };
		const char *k;

		for (int s = 0; s < 2; s++)
			json_object_foreach(strs[s], k, v) {
				if (!json_is_string(v) || m->nstrs >= MAXSTR)
					continue;
				snprintf(m->strs[m->nstrs].k, sizeof(m->strs[0].k), "%s", k);
				snprintf(m->strs[m->nstrs].v, sizeof(m->strs[0].v), "%s",
					 json_string_value(v));
				m->nstrs++;
			}
	}
	/* Config values the family does not describe (Llama's mlp_bias):
	 * refused, never planned without the tensors they add. */
	json_array_foreach(json_object_get(fam, "refuse"), i, v) {
		const char *e = json_string_value(json_array_get(v, 0));
		const char *why = json_string_value(json_array_get(v, 1));
		int64_t x;

		if (!e || !why || eval(m, e, &x) < 0) {
			seterr(err, errlen, "family %s: bad refuse entry %zu", m->family, i);
			goto out;
		}
		if (x) {
			seterr(err, errlen, "config.json: %s: not described by family %s", why, m->family);
			goto out;
		}
	}
	{
		/* transformers 4.56 and later write "dtype". */
		const char *dt = json_string_value(json_object_get(cfg, "torch_dtype"));

		if (!dt)
			dt = json_string_value(json_object_get(cfg, "dtype"));

		m->dtype = WEX_DT_BF16;
		if (dt && !strcmp(dt, "float16"))
			m->dtype = WEX_DT_F16;
		else if (dt && !strcmp(dt, "float32"))
			m->dtype = WEX_DT_F32;
	}
	{
		/* DeepSeek-V3's FP8 checkpoints: Linear weights F8_E4M3, each
		 * with a weight_scale_inv of one F32 per 128x128 block. */
		json_t *q = json_object_get(cfg, "quantization_config");
		const char *qm = json_string_value(json_object_get(q, "quant_method"));
		const char *fmt = json_string_value(json_object_get(q, "fmt"));
		json_t *bs = json_object_get(q, "weight_block_size");

		/* AWQ, GPTQ, compressed-tensors, bitsandbytes, MXFP4...: packed
		 * weights, zeros and scales under names no family describes. */
		if (q && !json_is_null(q) && (!qm || strcmp(qm, "fp8"))) {
			seterr(err, errlen, "config.json: quantization_config quant_method %s%s%s is "
			       "not supported (only \"fp8\" with a weight_block_size is described)",
			       qm ? "\"" : "", qm ? qm : "(none)", qm ? "\"" : "");
			goto out;
		}
		if (qm && !strcmp(qm, "fp8")) {
			int64_t b0, b1;

			m->fp8 = !fmt || !strcmp(fmt, "e4m3") ? WEX_DT_F8_E4M3
				 : !strcmp(fmt, "e5m2")	      ? WEX_DT_F8_E5M2
								      : 0;
			if (!m->fp8) {
				seterr(err, errlen, "config.json: quantization_config fmt \"%s\" is not "
				       "e4m3 or e5m2", fmt);
				goto out;
			}
			if (!json_is_array(bs) || json_array_size(bs) != 2 ||
			    !json_is_integer(json_array_get(bs, 0)) ||
			    !json_is_integer(json_array_get(bs, 1)) ||
			    (b0 = json_integer_value(json_array_get(bs, 0))) < 1 ||
			    (b1 = json_integer_value(json_array_get(bs, 1))) < 1 || b0 > CFG_INT_MAX ||
			    b1 > CFG_INT_MAX) {
				seterr(err, errlen, "config.json: FP8 quantization_config without a "
				       "weight_block_size [rows, cols] (per-tensor FP8 scales) is not "
				       "supported");
				goto out;
			}
			m->qblk[0] = (uint64_t)b0;
			m->qblk[1] = (uint64_t)b1;
			{
				/* Static activation scales would be input_scale
				 * tensors no family describes (dropped on convert);
				 * vLLM refuses them with block scales too. */
				const char *as = json_string_value(json_object_get(q, "activation_scheme"));

				if (as && strcmp(as, "dynamic")) {
					seterr(err, errlen, "config.json: FP8 quantization_config activation_scheme "
					       "\"%s\": only \"dynamic\" (no input_scale tensors) is supported", as);
					goto out;
				}
			}
		}
	}
	json_t *ts = json_object_get(fam, "tensors");
	/* Room for a weight_scale_inv beside every tensor. */
	m->ft = calloc(2 * json_array_size(ts) + 1, sizeof(*m->ft));
	if (!m->ft) {
		ret = -ENOMEM;
		goto out;
	}
	json_array_foreach(ts, i, v) {
		struct ftensor *f = &m->ft[m->nft];
		const char *lay = json_string_value(json_object_get(v, "layers"));
		json_t *shape = json_object_get(v, "shape"), *d;
		size_t k;

		if (!when_true(m, json_string_value(json_object_get(v, "when"))))
			continue;
		snprintf(f->role, sizeof(f->role), "%s", json_string_value(json_object_get(v, "role")) ?: "");
		snprintf(f->name, sizeof(f->name), "%s", json_string_value(json_object_get(v, "name")) ?: "");
		f->layers = !lay ? LAY_NONE : !strcmp(lay, "dense") ? LAY_DENSE
					    : !strcmp(lay, "moe")     ? LAY_MOE
								      : LAY_ALL;
		f->experts = json_is_true(json_object_get(v, "experts"));
		f->quant = json_is_true(json_object_get(v, "quant"));
		f->scale = -1;
		f->ndim = (uint32_t)json_array_size(shape);
		{
			const char *dn = json_string_value(json_object_get(v, "dtype"));

			f->dtype = dn ? wex_dtype_from_name(dn) : 0;
			if (dn && !f->dtype) {
				seterr(err, errlen, "family %s: tensor entry %zu has unknown dtype \"%s\"",
				       m->family, i, dn);
				goto out;
			}
		}
		if (f->ndim > WEX_MAX_DIMS || !*f->role || !*f->name) {
			seterr(err, errlen, "family %s: bad tensor entry %zu", m->family, i);
			goto out;
		}
		{
			/* Names expand at every layout: check them once here, at
			 * the longest layer and expert numbers. */
			int64_t nl = wex__model_sym(m, "layers"), ne = wex__model_sym(m, "nexp");
			char tmp[WEX_NAME_MAX];

			nl = nl > 0 ? nl - 1 : 0;
			ne = ne > 0 ? ne - 1 : 0;
			if (expand(m, f->name, nl, nl, ne, ne, tmp) < 0) {
				seterr(err, errlen, "family %s: tensor name %s has an unknown {key} or is "
				       "longer than %d bytes", m->family, f->name, WEX_NAME_MAX - 1);
				goto out;
			}
		}
		uint64_t bytes = wex_dtype_size(ft_dtype(m, f)) ?: 4;

		json_array_foreach(shape, k, d) {
			int64_t x;
			int rc = json_is_string(d) ? eval(m, json_string_value(d), &x) : -EINVAL;

			if (rc < 0 || x < 0) {
				seterr(err, errlen, "family %s: cannot evaluate shape of %s%s", m->family,
				       f->name, rc == -ERANGE ? " (the config's sizes overflow it)"
						: rc == -EDOM ? " (it divides by zero: a size it uses is 0)"
							      : "");
				goto out;
			}
			f->shape[k] = (uint64_t)x;
			/* A tensor past 2^48 bytes is no model's: refuse it before
			 * byte counts wrap anywhere downstream. */
			if (__builtin_mul_overflow(bytes, f->shape[k], &bytes) || bytes > (1ull << 48)) {
				seterr(err, errlen, "family %s: %s would be larger than 2^48 bytes: the "
				       "config's sizes are not a model's", m->family, f->name);
				goto out;
			}
		}
		m->nft++;
		if (m->fp8 && f->quant) {
			/* The weight in FP8 and, after it, its scales: one F32
			 * per block, partial blocks at the ends included. */
			struct ftensor *sc = &m->ft[m->nft];
			size_t n = strlen(f->name);

			if (f->ndim != 2 || n < 7 || strcmp(f->name + n - 7, ".weight") ||
			    n + 10 >= sizeof(f->name)) {
				seterr(err, errlen, "family %s: quantized tensor %s is not a 2-D .weight",
				       m->family, f->name);
				goto out;
			}
			*sc = *f;
			f->dtype = m->fp8;
			f->scale = m->nft;
			sc->dtype = WEX_DT_F32;
			sc->quant = 0;
			snprintf(sc->role, sizeof(sc->role), "%.24s_scale", f->role);
			snprintf(sc->name + n, sizeof(sc->name) - n, "_scale_inv");
			for (int k2 = 0; k2 < 2; k2++)
				sc->shape[k2] = (f->shape[k2] + m->qblk[k2] - 1) / m->qblk[k2];
			{
				int64_t nl = wex__model_sym(m, "layers"), ne = wex__model_sym(m, "nexp");
				char tmp[WEX_NAME_MAX];

				if (expand(m, sc->name, nl > 0 ? nl - 1 : 0, nl > 0 ? nl - 1 : 0,
					   ne > 0 ? ne - 1 : 0, ne > 0 ? ne - 1 : 0, tmp) < 0) {
					seterr(err, errlen, "family %s: tensor name %s is longer than %d bytes",
					       m->family, sc->name, WEX_NAME_MAX - 1);
					goto out;
				}
			}
			m->nft++;
		}
	}
	if (m->fp8) {
		int any = 0;

		for (int t = 0; t < m->nft; t++)
			any |= m->ft[t].scale >= 0;
		if (!any) {
			seterr(err, errlen, "config.json: FP8 block-quantized checkpoints "
			       "(quantization_config) are not supported for family %s (it marks no tensor quant)",
			       m->family);
			goto out;
		}
	}
	/* Every tensor is laid out, planned and held in memory: a layer or
	 * expert count no model has (a typo, a mutated config) is refused
	 * here, not left to exhaust memory. */
	{
		int64_t layers = wex__model_sym(m, "layers"), nexp = wex__model_sym(m, "nexp");
		int64_t nmoe = 0;
		uint64_t count = 0, total = 0;

		if (layers < 0)
			layers = 0;
		nmoe = count_moe_layers(m, layers);
		for (int t = 0; t < m->nft; t++) {
			const struct ftensor *f = &m->ft[t];
			uint64_t n = f->layers == LAY_NONE	  ? 1
				     : f->layers == LAY_DENSE ? (uint64_t)(layers - nmoe)
				     : f->layers == LAY_MOE   ? (uint64_t)nmoe
							      : (uint64_t)layers;
			uint64_t b = wex_dtype_size(ft_dtype(m, f)) ?: 4;

			for (uint32_t d = 0; d < f->ndim; d++)
				b *= f->shape[d];
			if ((f->experts && __builtin_mul_overflow(n, (uint64_t)(nexp > 0 ? nexp : 0), &n)) ||
			    __builtin_add_overflow(count, n, &count) || count > MODEL_MAX_TENSORS ||
			    __builtin_mul_overflow(n, b, &b) || __builtin_add_overflow(total, b, &total) ||
			    total > MODEL_MAX_BYTES) {
				seterr(err, errlen, "family %s: the config's sizes (%lld layers, %lld experts) "
				       "give more than %llu tensors or 2^52 bytes: they are not a model's",
				       m->family, (long long)layers, (long long)(nexp > 0 ? nexp : 0),
				       (unsigned long long)MODEL_MAX_TENSORS);
				goto out;
			}
		}
	}
	/* FP8 checkpoints that keep some Linear weights in BF16 (transformers
	 * skips a module whose name contains a modules_to_not_convert entry,
	 * vLLM reads ignored_layers with rules of its own) are not described:
	 * an entry that names a module the family quantizes is refused, one
	 * that names lm_head or another unquantized module is harmless.  Real
	 * lists name every layer's norms and router (Qwen3-MoE-FP8: 3 entries a
	 * layer, against 384 expert weights a layer): each module name is
	 * matched against all entries at once, in one pass over its text. */
	for (int k = 0; m->fp8 && k < 2; k++) {
		const char *key = k ? "ignored_layers" : "modules_to_not_convert";
		json_t *list = json_object_get(json_object_get(cfg, "quantization_config"), key);
		int64_t layers = wex__model_sym(m, "layers"), nexp = wex__model_sym(m, "nexp");
		struct ac ac;

		ret = ac_build(&ac, list);
		if (ret < 0) {
			seterr(err, errlen, "out of memory");
			goto out;
		}
		ret = -EINVAL;
		for (int t = 0; ac.nn > 1 && t < m->nft; t++) {
			const struct ftensor *f = &m->ft[t];
			int64_t L0 = f->layers == LAY_NONE ? -1 : 0, L1 = f->layers == LAY_NONE ? 0 : layers;

			for (int64_t L = L0; f->scale >= 0 && L < L1; L++) {
				if (f->layers != LAY_NONE && !layer_has(m, f->layers, L))
					continue;
				for (int64_t E = 0; E < (f->experts ? nexp : 1); E++) {
					char nm[WEX_NAME_MAX];
					int64_t hit;

					if (expand(m, f->name, L, L, E, E, nm) < 0)
						continue;
					nm[strlen(nm) - 7] = 0; /* the module: no ".weight" */
					hit = ac_find(&ac, nm);
					if (hit < 0)
						continue;
					seterr(err, errlen, "config.json: quantization_config %s lists \"%s\", "
					       "which leaves %s unquantized: FP8 checkpoints with some Linear "
					       "weights in BF16 are not supported", key,
					       json_string_value(json_array_get(list, (size_t)hit)), nm);
					free(ac.n);
					goto out;
				}
			}
		}
		free(ac.n);
	}
	*out = m;
	m = NULL;
	ret = 0;
out:
	json_decref(fam);
	json_decref(cfg);
	wex__model_free(m);
	return ret;
}

int wex__model_load(const char *config_path, const char *adapters_dir, struct wex_model **out,
		    char *err, size_t errlen)
{
	char *txt = read_text(config_path);
	int ret;

	if (!txt) {
		int e = errno;

		seterr(err, errlen, "%s: %s%s", config_path, strerror(e),
		       e == EISDIR ? " (the model's config.json is wanted)" : "");
		return -ENOENT;
	}
	ret = wex__model_from_text(txt, adapters_dir, out, err, errlen);
	free(txt);
	/* Its messages name "config.json": the file read may be called
	 * otherwise, and be one of several. */
	if (ret < 0 && err && !strncmp(err, "config.json: ", 13)) {
		char tmp[1024];

		snprintf(tmp, sizeof(tmp), "%s", err + 13);
		seterr(err, errlen, "%s: %s", config_path, tmp);
	}
	return ret;
}

void wex__model_free(struct wex_model *m)
{
	if (!m)
		return;
	free(m->ft);
	free(m->dense_list);
	json_decref(m->eng);
	free(m);
}

/* Whether layer L holds the router and experts, as transformers builds
 * it: DeepSeek's first_k_dense_replace layers are dense; Qwen-MoE's layer
 * L is sparse iff L is not in mlp_only_layers, num_experts > 0 and
 * (L + 1) % decoder_sparse_step == 0 (Qwen2MoeDecoderLayer).  A family
 * without a symbol leaves its rule out.  layer_rule_moe: all but the list. */
static int layer_rule_moe(const struct wex_model *m, int64_t L)
{
	int64_t fd = wex__model_sym(m, "first_dense"), step = wex__model_sym(m, "sparse_step");

	if (L < fd || wex__model_sym(m, "nexp") == 0)
		return 0;
	return step <= 0 || (L + 1) % step == 0;
}

static int layer_is_moe(const struct wex_model *m, int64_t L)
{
	return layer_rule_moe(m, L) &&
	       (!m->ndense_list ||
		!bsearch(&L, m->dense_list, m->ndense_list, sizeof(*m->dense_list), cmp_i64));
}

/* The number of layers L < layers that layer_is_moe says are MoE, counted
 * without a pass over the layers: a config's layer count is only bounded
 * by CFG_INT_MAX, and a count no model has must be refused at once. */
static int64_t count_moe_layers(const struct wex_model *m, int64_t layers)
{
	int64_t fd = wex__model_sym(m, "first_dense"), step = wex__model_sym(m, "sparse_step");
	int64_t n;

	if (fd < 0)
		fd = 0;
	if (layers <= fd || wex__model_sym(m, "nexp") == 0)
		return 0;
	/* L in [fd, layers) with (L + 1) % step == 0: the multiples of step
	 * in [fd + 1, layers]. */
	n = step > 0 ? layers / step - fd / step : layers - fd;
	for (size_t i = 0; i < m->ndense_list; i++) {
		int64_t L = m->dense_list[i];

		if ((i == 0 || L != m->dense_list[i - 1]) && L < layers && layer_rule_moe(m, L))
			n--;
	}
	return n;
}

static int layer_has(const struct wex_model *m, int layers, int64_t L)
{
	switch (layers) {
	case LAY_ALL:
		return 1;
	case LAY_DENSE:
		return !layer_is_moe(m, L);
	case LAY_MOE:
		return layer_is_moe(m, L);
	default:
		return 0;
	}
}

int wex__model_canonical(const struct wex_model *m, struct wex_tensor **t, size_t *n)
{
	int64_t layers = wex__model_sym(m, "layers"), nexp = wex__model_sym(m, "nexp");
	size_t cap = 256, k = 0;
	struct wex_tensor *a = malloc(cap * sizeof(*a));

	if (!a)
		return -ENOMEM;
	for (int i = 0; i < m->nft; i++) {
		const struct ftensor *f = &m->ft[i];
		int64_t L0 = f->layers == LAY_NONE ? -1 : 0, L1 = f->layers == LAY_NONE ? 0 : layers;

		for (int64_t L = L0; L < L1; L++) {
			if (f->layers != LAY_NONE && !layer_has(m, f->layers, L))
				continue;
			for (int64_t E = 0; E < (f->experts ? nexp : 1); E++) {
				if (k == cap) {
					struct wex_tensor *b = realloc(a, 2 * cap * sizeof(*a));

					if (!b) {
						free(a);
						return -ENOMEM;
					}
					a = b;
					cap *= 2;
				}
				struct wex_tensor *x = &a[k];
				memset(x, 0, sizeof(*x));
				if (expand(m, f->name, L, L, E, E, x->name) < 0) {
					free(a);
					return -EINVAL;
				}
				x->dtype = ft_dtype(m, f);
				x->ndim = f->ndim;
				for (uint32_t d = 0; d < f->ndim; d++)
					x->shape[d] = x->extent[d] = f->shape[d];
				x->segment = (uint32_t)k;
				k++;
			}
		}
	}
	*t = a;
	*n = k;
	return 0;
}

/* ---- layout specs ---- */

/* Largest parallel size or padding multiple (tp, pp, ..., vocab_pad). */
#define LAYOUT_PARAM_MAX (1 << 20)

/* stages=N/N/... (v up to end): the layers of each pipeline stage, as
 * vLLM's VLLM_PP_LAYER_PARTITION and SGLang's SGLANG_PP_LAYER_PARTITION
 * give them ('/' where they write ','), each 1 to LAYOUT_PARAM_MAX layers
 * written as digits.  Given twice, the last list counts (as other keys). */
static int parse_stages(const char *v, const char *end, struct wex_layout_spec *spec,
			const char *s, char *err, size_t errlen)
{
	uint32_t n = 0;

	memset(spec->stages, 0, sizeof(spec->stages));
	spec->nstages = 0;
	for (const char *p = v;; n++) {
		const char *q = p;
		uint64_t x = 0;
		int digits = 1;

		while (q < end && *q != '/')
			q++;
		if (n == WEX_LAYOUT_MAX_STAGES) {
			seterr(err, errlen, "bad stages: more than %d entries, one per pipeline stage (in \"%s\")",
			       WEX_LAYOUT_MAX_STAGES, s);
			return -EINVAL;
		}
		for (const char *d = p; d < q; d++) {
			if (*d < '0' || *d > '9')
				digits = 0;
			else if (x <= LAYOUT_PARAM_MAX)
				x = x * 10 + (uint64_t)(*d - '0');
		}
		if (q == p || !digits) {
			seterr(err, errlen,
			       "bad stages: entry %u (\"%.*s\") is not a number of layers written in digits (stages=N/N/..., one per pipeline stage; in \"%s\")",
			       n + 1, q - p > 32 ? 32 : (int)(q - p), p, s);
			return -EINVAL;
		}
		if (x == 0) {
			seterr(err, errlen,
			       "bad stages: entry %u is 0, but a pipeline stage with no layers cannot exist (in \"%s\")",
			       n + 1, s);
			return -EINVAL;
		}
		if (x > LAYOUT_PARAM_MAX) {
			seterr(err, errlen, "bad stages: entry %u is larger than %d layers (in \"%s\")", n + 1,
			       LAYOUT_PARAM_MAX, s);
			return -EINVAL;
		}
		spec->stages[n] = (uint32_t)x;
		if (q == end)
			break;
		p = q + 1;
	}
	spec->nstages = n + 1;
	return 0;
}

int wex__layout_parse(const char *s, struct wex_layout_spec *spec, char *err, size_t errlen)
{
	const char *c = strchr(s, ':');
	size_t n = c ? (size_t)(c - s) : strlen(s);

	memset(spec, 0, sizeof(*spec));
	if (n == 0 || n >= sizeof(spec->engine)) {
		seterr(err, errlen, "bad layout \"%s\": expected ENGINE[:k=v,...]", s);
		return -EINVAL;
	}
	/* The engine names a file (adapters/engines/ENGINE.json): letters,
	 * digits, '_' and '-' only, so no path ("../families/llama")
	 * reaches it. */
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-') {
			seterr(err, errlen,
			       "bad engine \"%.*s\" in \"%s\": letters, digits, '_' and '-' only",
			       (int)n, s, s);
			return -EINVAL;
		}
	memcpy(spec->engine, s, n);
	if (!c)
		return 0;
	for (const char *p = c + 1; *p;) {
		const char *eq = strchr(p, '='), *end = strchr(p, ',');
		char key[16], *stop;
		int k;

		if (!end)
			end = p + strlen(p);
		if (!eq || eq > end || (size_t)(eq - p) >= sizeof(key)) {
			seterr(err, errlen, "bad layout parameter in \"%s\"", s);
			return -EINVAL;
		}
		memcpy(key, p, (size_t)(eq - p));
		key[eq - p] = 0;
		if (!strcmp(key, "stages")) {
			if (spec->nstages) {
				seterr(err, errlen, "layout parameter stages given twice in \"%s\"", s);
				return -EINVAL;
			}
			if (parse_stages(eq + 1, end, spec, s, err, errlen) < 0)
				return -EINVAL;
			p = *end ? end + 1 : end;
			continue;
		}
		for (k = 0; k < WEX_LAYOUT_PARAMS; k++)
			if (!strcmp(key, param_names[k]))
				break;
		/* Digits only: strtoll also takes an empty value (as 0, which
		 * then meant the engine's default), blanks and a sign. */
		long long v = strtoll(eq + 1, &stop, 10);
		if (k == WEX_LAYOUT_PARAMS || eq[1] < '0' || eq[1] > '9' || stop != end || v < 0 ||
		    v > LAYOUT_PARAM_MAX) {
			char keys[256];

			seterr(err, errlen, "bad layout parameter \"%.*s\" in \"%s\" (keys: %s stages)",
			       (int)(end - p), p, s, param_keys(keys, sizeof(keys)));
			return -EINVAL;
		}
		/* A parallel size of 0 is refused here, with the spec's other
		 * slips, rather than when the layout is planned. */
		if (v == 0 && (k == P_TP || k == P_PP || k == P_DP || k == P_FSDP || k == P_VPP)) {
			seterr(err, errlen, "layout parameter %s must be at least 1 in \"%s\"", key,
			       s);
			return -EINVAL;
		}
		/* (A key given twice is a slip, not an override.) */
		if (spec->set[k]) {
			seterr(err, errlen, "layout parameter %s given twice in \"%s\"", key, s);
			return -EINVAL;
		}
		spec->v[k] = v;
		spec->set[k] = 1;
		p = *end ? end + 1 : end;
	}
	return 0;
}

/* ---- the interpreter ---- */

/* The ranks a kind splits over: all tp ranks of a stage; the expert
 * tensor-parallel ranks; the attention-TP group (tp/dp ranks with
 * dp_attention=1, else all tp ranks); none (one rank: the tensor whole on
 * every rank, a vocab kind still padded). */
enum { AX_TP, AX_ETP, AX_ATTN, AX_NONE };

struct etensor {
	const char *name;
	const char *kind;
	const char *roles[MAXROLES];
	int nroles;
	int axis;          /* AX_* */
	int experts;       /* 0 none, 1 local (one physical per expert), 2 stack */
	/* A stack's extra slot with fuse_shared=1: the shared expert's roles,
	 * cut as the routed experts' (SGLang's expert n_routed). */
	const char *shared_roles[MAXROLES];
	int nshared;
	/* "if" / "unless": layout parameters (bit P_* set) that must all be
	 * non-zero / all be zero for the entry to be emitted. */
	uint32_t if_mask, unless_mask;
	const char *stage; /* NULL: per layer */
	const char *when;
	int layers;
	const char *heads;
};

struct ctx {
	const struct wex_model *m;
	json_t *eng;
	int canonical;
	/* chunk_dim0 (FSDP2): each canonical tensor cut along dim 0 over the
	 * fsdp ranks as torch.chunk cuts it (fsdp is 1 otherwise). */
	int chunk_dim0;
	int64_t tp, pp, dp, ep, etp, first, last, fuse_shared, fsdp;
	/* expert_remainder "first" (vLLM): experts that do not divide by
	 * ep go one each to the first ranks; else ep must divide them. */
	int ep_rem_first;
	/* Every parameter's value (the engine's default where not given),
	 * for "if"/"unless"; dense_tp equal to tp counts as 0. */
	int64_t pv[WEX_LAYOUT_PARAMS];
	/* dp_attention=1: dp is the attention data-parallel size inside the
	 * tp ranks, whose attention-TP groups are attn_tp = tp/dp ranks;
	 * a stage has stage_ranks = tp ranks (else tp*dp, dp replicas). */
	int dp_attention;
	int64_t attn_tp, stage_ranks;
	/* Layers of each stage when given (stages=), else the engine's rule
	 * for layers that do not divide by pp (pp_remainder: PP_REM_*). */
	const uint32_t *stages;
	uint32_t nstages;
	int pp_rem;
	uint32_t world;
	/* rank coordinates; atpr: rank in the attention-TP group */
	int64_t tpr, fsdpr, dpr, ppr, etpr, epr, atpr;
	int64_t L0, L1;
	/* Megatron's virtual pipeline: vpp model chunks per pp rank, vpr the
	 * one being laid out; chunk_first / chunk_last: it holds the
	 * embedding / the final norm and output layer. */
	int64_t vpp, vpr;
	int chunk_first, chunk_last;
	int64_t vocab_pad;
	int pad_times_tp;
	char *err;
	size_t errlen;
	struct wex_rank_layout *out;
	size_t capt, capp;
};

/* pp_remainder: where the L % pp layers left over go (one each). */
enum { PP_REM_NONE, PP_REM_BEFORE_LAST, PP_REM_LAST };

#define FAIL(c, ...)                                                                       \
	do {                                                                               \
		seterr((c)->err, (c)->errlen, __VA_ARGS__);                                \
		return -WEX_ELAYOUT;                                                       \
	} while (0)

static int stage_range(struct ctx *c, int64_t s, int64_t *a, int64_t *b);

/* vpp=V: Megatron-Core's virtual pipeline (--num-virtual-stages-per-
 * pipeline-rank, the interleaved 1F1B schedule).  Each pp rank holds V
 * model chunks of L/(pp*V) layers (get_num_layers_to_build); Megatron-Core
 * refuses V > 1 without pipeline parallelism (initialize_model_parallel:
 * "pipeline-model-parallel size should be greater than 1 with interleaved
 * schedule").  With uneven stages (first, last or both) each stage's
 * layers split into V chunks (get_transformer_layer_offset counts the
 * middle stages from pp rank 0 where there is no first stage:
 * middle_pipeline_rank; Megatron-Core releases before it gave pp ranks 0
 * and 1 the same layers there).
 * An engine without the key (its default 0) has one chunk. */
static int vpp_setup(struct ctx *c, int given, int64_t vpp, int64_t layers)
{
	c->vpp = vpp || given ? vpp : 1;
	if (c->vpp < 1)
		FAIL(c, "vpp=%lld: a pipeline rank holds at least 1 model chunk", (long long)c->vpp);
	if (c->vpp == 1)
		return 0;
	if (c->pp < 2)
		FAIL(c, "vpp=%lld needs pp > 1 (pp=%lld): Megatron-Core has no interleaved schedule "
		     "without pipeline parallelism", (long long)c->vpp, (long long)c->pp);
	if (c->first || c->last) {
		/* Megatron-Core's uneven stages under a virtual pipeline:
		 * every stage's layers divide into vpp chunks (transformer_
		 * config.py), chunk v of a stage its v-th share of them.
		 * With both and pp=2 there is no middle stage, and
		 * get_transformer_layer_offset divides the middle layers by
		 * their stages (0) for pp rank 1: Megatron-Core cannot build
		 * it (ZeroDivisionError). */
		if (c->first && c->last && c->pp == 2)
			FAIL(c, "vpp=%lld with first=%lld and last=%lld on pp=2: Megatron-Core's layer "
			     "offset under a virtual pipeline divides by the middle stages, none here "
			     "(ZeroDivisionError building pp rank 1); give first or last alone",
			     (long long)c->vpp, (long long)c->first, (long long)c->last);
		for (int64_t s = 0; s < c->pp; s++) {
			int64_t a, b;
			int ret = stage_range(c, s, &a, &b);

			if (ret)
				return ret;
			if ((b - a) % c->vpp)
				FAIL(c, "vpp=%lld with first=%lld, last=%lld: pipeline stage %lld holds %lld "
				     "layers, which do not divide into %lld model chunks", (long long)c->vpp,
				     (long long)c->first, (long long)c->last, (long long)s,
				     (long long)(b - a), (long long)c->vpp);
		}
		return 0;
	}
	if (layers % (c->pp * c->vpp))
		FAIL(c, "vpp=%lld: the %lld layers do not divide into pp*vpp = %lld*%lld = %lld model "
		     "chunks of equal size", (long long)c->vpp, (long long)layers, (long long)c->pp,
		     (long long)c->vpp, (long long)(c->pp * c->vpp));
	return 0;
}

/* The engine layout adapters/engines/NAME.json: the one pinned with the
 * model, else read now.  -ENOENT when there is no such file; -EINVAL when
 * it cannot be read or parsed (load_json's message names the file and
 * why: it exists, so the engine is not unknown). */
static int engine_get(const struct wex_model *m, const char *name, json_t **eng, char *err,
		      size_t errlen)
{
	char path[700];

	if (m->eng && !strcmp(m->eng_name, name)) {
		*eng = json_incref(m->eng);
		return 0;
	}
	*eng = load_json(m->adapters, "engines", name, err, errlen);
	if (*eng)
		return 0;
	snprintf(path, sizeof(path), "%s/engines/%s.json", m->adapters, name);
	if (access(path, F_OK) == 0)
		return -EINVAL;
	seterr(err, errlen, "unknown engine \"%s\" (no %s)", name, path);
	return -ENOENT;
}

int wex__model_pin_engine(struct wex_model *m, const char *engine, char *err, size_t errlen)
{
	json_t *eng;
	int ret;

	if (strlen(engine) >= sizeof(m->eng_name))
		return -EINVAL;
	ret = engine_get(m, engine, &eng, err, errlen);
	if (ret < 0)
		return ret;
	json_decref(m->eng);
	m->eng = eng;
	snprintf(m->eng_name, sizeof(m->eng_name), "%s", engine);
	return 0;
}

/* Checks the parallel sizes against the model and sets the stage range. */
static int ctx_setup(struct ctx *c, const struct wex_model *m, const struct wex_layout_spec *spec)
{
	json_t *par;
	int64_t layers = wex__model_sym(m, "layers"), nexp = wex__model_sym(m, "nexp");
	int64_t v[WEX_LAYOUT_PARAMS];
	int ret;

	c->m = m;
	ret = engine_get(m, spec->engine, &c->eng, c->err, c->errlen);
	if (ret < 0)
		return ret;
	c->canonical = json_is_true(json_object_get(c->eng, "canonical"));
	par = json_object_get(c->eng, "params");
	for (int k = 0; k < WEX_LAYOUT_PARAMS; k++) {
		json_t *d = json_object_get(par, param_names[k]);

		if (spec->set[k] && !d)
			FAIL(c, "engine %s has no parameter %s", spec->engine, param_names[k]);
		/* A parallel size the engine does not take is 1 (fsdp has
		 * neither tp nor pp); other keys are 0. */
		v[k] = spec->set[k]	    ? spec->v[k]
		       : json_is_integer(d) ? json_integer_value(d)
		       : k == P_TP || k == P_PP || k == P_DP || k == P_FSDP ? 1
									    : 0;
		/* The engine's defaults obey the limits of given values. */
		if (v[k] < 0 || v[k] > LAYOUT_PARAM_MAX)
			FAIL(c, "engine %s: parameter %s defaults to %lld, not 0 to %d", spec->engine,
			     param_names[k], (long long)v[k], LAYOUT_PARAM_MAX);
	}
	c->tp = v[P_TP];
	c->pp = v[P_PP];
	c->dp = v[P_DP];
	c->ep = v[P_EP] ? v[P_EP] : 1;
	c->first = v[P_FIRST];
	c->last = v[P_LAST];
	c->fuse_shared = v[P_FUSE_SHARED];
	c->fsdp = v[P_FSDP];
	c->chunk_dim0 = json_is_true(json_object_get(c->eng, "chunk_dim0"));
	if (c->tp < 1 || c->pp < 1 || c->dp < 1)
		FAIL(c, "tp, pp and dp must be at least 1");
	if (c->fsdp < 1)
		FAIL(c, "fsdp (ranks a tensor is sharded over) must be at least 1, not %lld",
		     (long long)c->fsdp);
	if (c->canonical && (c->tp != 1 || c->pp != 1))
		FAIL(c, "layout %s holds whole tensors: tp and pp must be 1", spec->engine);
	/* chunk_dim0 cuts canonical tensors, and only it has fsdp ranks. */
	if (c->chunk_dim0 && !c->canonical)
		FAIL(c, "engine %s: chunk_dim0 cuts canonical tensors: it needs \"canonical\": true",
		     spec->engine);
	if (c->fsdp != 1 && !c->chunk_dim0)
		FAIL(c, "engine %s: parameter fsdp=%lld needs \"chunk_dim0\": true", spec->engine,
		     (long long)c->fsdp);
	{
		static const int flags[] = { P_DP_ATTENTION, P_DP_LM_HEAD, P_A2A, P_EMBED_REP,
					     P_NO_MLA, P_SP_MOE };

		for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++)
			if (v[flags[i]] > 1)
				FAIL(c, "%s is 0 or 1, not %lld", param_names[flags[i]],
				     (long long)v[flags[i]]);
	}
	/* SGLang's --moe-dense-tp-size: unset (the dense MLPs split over all
	 * tp ranks, also written as tp) or 1 (whole on every rank). */
	if (v[P_DENSE_TP] > 1 && v[P_DENSE_TP] != c->tp)
		FAIL(c, "dense_tp=%lld: the dense MLPs are split over tp (%lld) ranks or, with "
		     "dense_tp=1, whole on every rank; no other size", (long long)v[P_DENSE_TP],
		     (long long)c->tp);
	if (v[P_DENSE_TP] == c->tp)
		v[P_DENSE_TP] = 0;
	c->dp_attention = (int)v[P_DP_ATTENTION];
	c->attn_tp = c->tp;
	if (c->dp_attention) {
		/* SGLang's compute_dp_attention_world_info: attn_tp_size =
		 * tp_size // dp_size, attn_tp_rank = tp_rank % attn_tp_size. */
		if (c->tp % c->dp)
			FAIL(c, "dp_attention=1: dp=%lld attention data-parallel groups must divide "
			     "tp=%lld, the ranks they are carved from", (long long)c->dp, (long long)c->tp);
		c->attn_tp = c->tp / c->dp;
	}
	if (v[P_DP_LM_HEAD] && !c->dp_attention)
		FAIL(c, "dp_lm_head=1 splits lm_head over the attention-TP group: it needs "
		     "dp_attention=1 (SGLang refuses --enable-dp-lm-head without "
		     "--enable-dp-attention)");
	/* Before SGLang PR #17403 (and with SGLANG_ENABLE_EMBED_REPLICATION=1)
	 * the embedding is whole on every rank under dp-attention; without
	 * dp-attention it is split over all tp ranks in every version. */
	if (v[P_EMBED_REP] && !c->dp_attention)
		FAIL(c, "embed_rep=1 lays out the embedding whole on every rank, as SGLang does "
		     "under dp-attention before PR #17403: it needs dp_attention=1 (without it "
		     "the embedding is split over all tp ranks)");
	{
		/* An engine may describe a parameter for some model types only
		 * (SGLang's attention-TP group exists in its MoE models). */
		json_t *pm = json_object_get(c->eng, "param_model_types");

		for (int k = 0; pm && k < WEX_LAYOUT_PARAMS; k++) {
			json_t *lst = json_object_get(pm, param_names[k]), *x;
			char names[256];
			size_t i, n = 0;
			int found = 0;

			if (!lst || !v[k])
				continue;
			if (!json_is_array(lst))
				FAIL(c, "engine %s: param_model_types.%s is not a list of model types",
				     spec->engine, param_names[k]);
			names[0] = '\0';
			json_array_foreach(lst, i, x) {
				const char *mt = json_string_value(x);

				if (!mt)
					FAIL(c, "engine %s: param_model_types.%s[%zu] is not a model type",
					     spec->engine, param_names[k], i);
				found |= !strcmp(mt, m->model_type);
				if (n < sizeof(names))
					n += (size_t)snprintf(names + n, sizeof(names) - n, "%s%s",
							      i ? " " : "", mt);
			}
			if (!found)
				FAIL(c, "engine %s: %s=%lld is described for model types %s only, not %s",
				     spec->engine, param_names[k], (long long)v[k], names,
				     m->model_type);
		}
	}
	/* --moe-a2a-backend deepep/mooncake: SGLang's server_args sets ep_size
	 * to tp_size, and DeepSeek's shared experts are built with tp_size 1;
	 * shared-expert fusion is off under it (expert parallelism). */
	if (v[P_A2A] && v[P_FUSE_SHARED])
		FAIL(c, "fuse_shared=1 with a2a=1: SGLang does not fuse the shared expert into the "
		     "routed ones under --moe-a2a-backend deepep/mooncake (it keeps "
		     "mlp.shared_experts whole on every rank); use fuse_shared=0");
	if (v[P_A2A] && (v[P_EP] ? v[P_EP] : 1) != c->tp)
		FAIL(c, "a2a=1 with ep=%lld: under --moe-a2a-backend deepep/mooncake SGLang sets the "
		     "expert parallel size to tp; write ep=%lld", (long long)(v[P_EP] ? v[P_EP] : 1),
		     (long long)c->tp);
	memcpy(c->pv, v, sizeof(c->pv));
	c->stage_ranks = c->tp * c->fsdp * (c->dp_attention ? 1 : c->dp);
	if (v[P_ETP]) {
		c->etp = v[P_ETP];
	} else {
		const char *d = json_string_value(json_object_get(c->eng, "etp_default"));

		c->etp = c->tp;
		if (d && !strcmp(d, "tp/ep")) {
			if (c->tp % c->ep)
				FAIL(c, "expert parallel size %lld does not divide tensor parallel size %lld",
				     (long long)c->ep, (long long)c->tp);
			c->etp = c->tp / c->ep;
		} else if (d && !strcmp(d, "tp_dp/ep")) {
			/* vLLM: experts sharded over all tp*dp ranks of a stage. */
			if (c->stage_ranks % c->ep)
				FAIL(c, "expert parallel size %lld does not divide tp*dp = %lld",
				     (long long)c->ep, (long long)c->stage_ranks);
			c->etp = c->stage_ranks / c->ep;
		}
	}
	if ((uint64_t)c->tp * (uint64_t)c->pp * (uint64_t)c->dp * (uint64_t)c->fsdp > (1u << 24))
		FAIL(c, "layout has too many ranks");
	c->world = (uint32_t)(c->stage_ranks * c->pp);
	if (nexp > 0) {
		const char *span = json_string_value(json_object_get(c->eng, "expert_span"));
		int64_t sp = span && !strcmp(span, "tp_dp") ? c->stage_ranks : c->tp;

		if (sp % (c->etp * c->ep))
			FAIL(c, "expert tensor parallel %lld x expert parallel %lld = %lld does not divide the %lld ranks of a stage they are drawn from",
			     (long long)c->etp, (long long)c->ep, (long long)(c->etp * c->ep), (long long)sp);
		/* vLLM has no expert-parallel size of its own: with
		 * enable_expert_parallel every rank of the span is an EP rank. */
		if (json_is_true(json_object_get(c->eng, "ep_spans_all")) && c->ep != 1 && c->ep != sp)
			FAIL(c, "engine %s: expert parallelism spans all %s ranks: ep must be 1 or %lld, not %lld",
			     spec->engine, span && !strcmp(span, "tp_dp") ? "tp*dp" : "tp", (long long)sp,
			     (long long)c->ep);
		{
			/* vLLM's determine_expert_map ('linear' placement):
			 * the nexp % ep experts left over go one each to the
			 * first ep ranks (60 experts over 8 ranks: 8 8 8 8 7 7
			 * 7 7).  Megatron-Core and SGLang need ep to divide. */
			json_t *er = json_object_get(c->eng, "expert_remainder");
			const char *ers = json_string_value(er);

			if (er && !(ers && !strcmp(ers, "first")))
				FAIL(c, "engine %s: expert_remainder is \"%s\", not \"first\"", spec->engine,
				     ers ? ers : "(not a string)");
			c->ep_rem_first = er != NULL;
		}
		if (nexp % c->ep && !c->ep_rem_first)
			FAIL(c, "expert parallel size %lld does not divide the %lld experts",
			     (long long)c->ep, (long long)nexp);
		if (nexp < c->ep)
			FAIL(c, "expert parallel size %lld exceeds the %lld experts: a rank would hold none",
			     (long long)c->ep, (long long)nexp);
	} else if (c->ep > 1) {
		FAIL(c, "expert parallel size %lld given for a model without experts", (long long)c->ep);
	}
	if (c->fuse_shared) {
		/* SGLang fuses one shared expert into the routed ones, and
		 * only without expert parallelism (it would be replicated). */
		int64_t ns = wex__model_sym(m, "n_shared");

		if (c->fuse_shared != 1)
			FAIL(c, "fuse_shared is 0 or 1, not %lld", (long long)c->fuse_shared);
		/* Qwen2-MoE scales its shared expert by sigmoid(shared_expert_gate
		 * x): as one more routed slot it would lose that gate. */
		if (wex__model_sym(m, "shared_gate") > 0)
			FAIL(c, "fuse_shared=1: the shared expert is scaled by its own gate "
			     "(mlp.shared_expert_gate.weight), so it cannot be fused into the routed "
			     "experts; use fuse_shared=0");
		if (nexp <= 0 || ns != 1)
			FAIL(c, "fuse_shared=1 needs a model with routed experts and exactly one shared expert (n_shared_experts is %lld)",
			     (long long)(ns > 0 ? ns : 0));
		if (c->ep != 1)
			FAIL(c, "fuse_shared=1 with ep=%lld: SGLang fuses the shared expert only without expert parallelism",
			     (long long)c->ep);
	}
	if (c->pp > layers)
		FAIL(c, "pipeline parallel size %lld exceeds the %lld layers", (long long)c->pp,
		     (long long)layers);
	if (c->pp == 1 && (c->first || c->last))
		FAIL(c, "first/last stage sizes need pp > 1");
	{
		json_t *r = json_object_get(c->eng, "pp_remainder");
		const char *rs = json_string_value(r);

		if (!r)
			c->pp_rem = PP_REM_NONE;
		else if (rs && !strcmp(rs, "before_last"))
			c->pp_rem = PP_REM_BEFORE_LAST;
		else if (rs && !strcmp(rs, "last"))
			c->pp_rem = PP_REM_LAST;
		else
			FAIL(c, "engine %s: pp_remainder is \"%s\", not \"before_last\" or \"last\"",
			     spec->engine, rs ? rs : "(not a string)");
	}
	{
		/* params.stages: [] where the engine takes stages= (there is
		 * no default split: it depends on the layers). */
		json_t *d = json_object_get(par, "stages");

		if (d && (!json_is_array(d) || json_array_size(d)))
			FAIL(c, "engine %s: parameter stages must default to [] (a layout gives the split)",
			     spec->engine);
		if (spec->nstages && !d)
			FAIL(c, "engine %s has no parameter stages", spec->engine);
	}
	if (spec->nstages) {
		char list[64];
		size_t n = 0;
		int64_t sum = 0;

		/* The list, for messages ("15/15/16/15", cut short). */
		list[0] = '\0';
		for (uint32_t i = 0; i < spec->nstages && n < sizeof(list); i++)
			n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%u", i ? "/" : "",
					      spec->stages[i]);
		for (uint32_t i = 0; i < spec->nstages; i++)
			sum += spec->stages[i];
		if (c->pp < 2)
			FAIL(c, "stages=%s gives the layers of each pipeline stage: it needs pp > 1 (pp=%lld)",
			     list, (long long)c->pp);
		if (c->first || c->last)
			FAIL(c, "stages=%s and first/last (first=%lld, last=%lld) both give stage sizes: give one",
			     list, (long long)c->first, (long long)c->last);
		if (spec->nstages != c->pp)
			FAIL(c, "stages=%s lists %u stages for pp=%lld", list, spec->nstages,
			     (long long)c->pp);
		if (sum != layers)
			FAIL(c, "stages=%s holds %lld layers in all, but the model has %lld layers", list,
			     (long long)sum, (long long)layers);
		c->stages = spec->stages;
		c->nstages = spec->nstages;
	}
	c->vocab_pad = json_integer_value(json_object_get(c->eng, "vocab_pad"));
	/* vocab_div=N (Megatron): the multiple of --make-vocab-size-
	 * divisible-by (128 by default; Megatron-Bridge's providers, with
	 * should_pad_vocab=False by default, pad to no multiple: 1). */
	if (json_object_get(par, "vocab_div")) {
		if (v[P_VOCAB_DIV] < 1)
			FAIL(c, "vocab_div=%lld: the vocabulary is padded to a multiple of vocab_div*tp "
			     "(Megatron's --make-vocab-size-divisible-by); at least 1 (no padding "
			     "beyond tp, as Megatron-Bridge's should_pad_vocab=False)",
			     (long long)v[P_VOCAB_DIV]);
		c->vocab_pad = v[P_VOCAB_DIV];
	}
	if (c->vocab_pad < 1)
		c->vocab_pad = 1;
	/* A multiple no engine pads to would wrap (times tp) or blow the
	 * vocabulary up to terabytes. */
	if (c->vocab_pad > LAYOUT_PARAM_MAX)
		FAIL(c, "engine %s: vocab_pad %lld is larger than %d", spec->engine,
		     (long long)c->vocab_pad, LAYOUT_PARAM_MAX);
	c->pad_times_tp = json_is_true(json_object_get(c->eng, "vocab_pad_times_tp"));
	return vpp_setup(c, spec->set[P_VPP], v[P_VPP], layers);
}

/* Layer range of stage s: as stages= gives them; else uneven first/last
 * stages, the rest even; else, when the layers do not divide by pp, the
 * engine's pp_remainder rule: L / pp layers each and the L % pp left over
 * one each to the stages before the last, from the one before last
 * backwards (vLLM's get_pp_indices), or to the last ones (SGLang's). */
static int stage_range(struct ctx *c, int64_t s, int64_t *a, int64_t *b)
{
	int64_t layers = wex__model_sym(c->m, "layers"), pp = c->pp;
	int64_t f = c->first, l = c->last, mid, nmid, rest;

	if (pp == 1) {
		*a = 0;
		*b = layers;
		return 0;
	}
	if (c->nstages) {
		*a = 0;
		for (int64_t i = 0; i < s; i++)
			*a += c->stages[i];
		*b = *a + c->stages[s];
		return 0;
	}
	if (!f && !l && layers % pp && c->pp_rem != PP_REM_NONE) {
		/* pp <= layers (ctx_setup): every stage gets base >= 1. */
		int64_t base = layers / pp, r = layers % pp;
		/* Stages [x0, x0 + r) hold base + 1 layers. */
		int64_t x0 = c->pp_rem == PP_REM_LAST ? pp - r : pp - 1 - r;
		int64_t before = s < x0 ? 0 : s - x0 < r ? s - x0 : r;

		*a = s * base + before;
		*b = *a + base + (s >= x0 && s < x0 + r);
		return 0;
	}
	nmid = pp - (f ? 1 : 0) - (l ? 1 : 0);
	rest = layers - f - l;
	if (rest < 0)
		FAIL(c, "first (%lld) + last (%lld) stage layers exceed the %lld layers", (long long)f,
		     (long long)l, (long long)layers);
	if (nmid == 0) {
		if (rest)
			FAIL(c, "first + last stage layers (%lld) must equal the %lld layers when pp=2",
			     (long long)(f + l), (long long)layers);
		mid = 0;
	} else {
		if (rest % nmid)
			FAIL(c, "the %lld layers left for %lld even pipeline stages do not divide evenly (pp=%lld, first=%lld, last=%lld)",
			     (long long)rest, (long long)nmid, (long long)pp, (long long)f, (long long)l);
		mid = rest / nmid;
		if (mid == 0)
			FAIL(c, "pipeline stages would hold no layers (pp=%lld, %lld layers)",
			     (long long)pp, (long long)layers);
	}
	int64_t fs = f ? f : mid;
	if (s == 0) {
		*a = 0;
		*b = fs;
	} else {
		*a = fs + (s - 1) * mid;
		*b = (s == pp - 1) ? layers : *a + mid;
	}
	return 0;
}

/* Enters model chunk c->vpr of the rank's pp stage: its layers and
 * whether it holds the embedding or the output layer.  Chunk v of pp rank p
 * holds the n = L/(pp*vpp) layers from v*L/vpp + p*n on (Megatron-Core's
 * layer offset: each of the vpp rounds runs through all pp ranks in
 * order); the embedding is in chunk 0 of pp rank 0 only, the final norm
 * and output layer in the last chunk of the last pp rank
 * (is_pipeline_first_stage / is_pipeline_last_stage without
 * ignore_virtual).  One chunk is the whole stage. */
static int chunk_enter(struct ctx *c)
{
	int64_t layers = wex__model_sym(c->m, "layers"), n;

	c->chunk_first = c->ppr == 0 && c->vpr == 0;
	c->chunk_last = c->ppr == c->pp - 1 && c->vpr == c->vpp - 1;
	if (c->vpp == 1)
		return stage_range(c, c->ppr, &c->L0, &c->L1);
	if (c->first || c->last) {
		/* Uneven first/last stages (Megatron-Core's offset with
		 * num_layers_in_first/last_pipeline_stage): every stage's
		 * layers divide by vpp (vpp_setup), so round v starts at
		 * v*L/vpp and the stage's chunk at its first layer / vpp. */
		int64_t a, b;
		int ret = stage_range(c, c->ppr, &a, &b);

		if (ret)
			return ret;
		c->L0 = c->vpr * (layers / c->vpp) + a / c->vpp;
		c->L1 = c->L0 + (b - a) / c->vpp;
		return 0;
	}
	n = layers / (c->pp * c->vpp);
	c->L0 = c->vpr * (layers / c->vpp) + c->ppr * n;
	c->L1 = c->L0 + n;
	return 0;
}

/* Names the physical tensors from nt0 on as chunk c->vpr's: prefixed
 * model{v}. when a rank holds several chunks, as Megatron's checkpoints
 * store them (state_dict['model%d' % v] per chunk, state_dict['model']
 * for one: then no prefix, the names as they were). */
static int chunk_prefix(struct ctx *c, size_t nt0)
{
	char name[WEX_NAME_MAX];

	if (c->vpp == 1)
		return 0;
	for (size_t k = nt0; k < c->out->nt; k++) {
		struct wex_layout_tensor *t = &c->out->t[k];

		if ((size_t)snprintf(name, sizeof(name), "model%lld.%s", (long long)c->vpr, t->name) >=
		    sizeof(name))
			FAIL(c, "model%lld.%s: a physical name longer than %d bytes", (long long)c->vpr,
			     t->name, WEX_NAME_MAX - 1);
		memcpy(t->name, name, sizeof(name));
	}
	return 0;
}

static const struct ftensor *role_find(const struct wex_model *m, const char *role)
{
	for (int i = 0; i < m->nft; i++)
		if (!strcmp(m->ft[i].role, role))
			return &m->ft[i];
	return NULL;
}

struct block {
	const struct ftensor *f;
	uint64_t start[WEX_MAX_DIMS], ext[WEX_MAX_DIMS];
};

#define MAXBLK 512

static void blk_full(struct block *b, const struct ftensor *f)
{
	b->f = f;
	for (uint32_t d = 0; d < f->ndim; d++) {
		b->start[d] = 0;
		b->ext[d] = f->shape[d];
	}
}

/* Blocks of one (inner) physical tensor; *rows0 gets its dim-0 size. */
static int make_blocks(struct ctx *c, const struct etensor *et, const struct ftensor **f,
		       struct block *b, int *nb, uint64_t *rows0, int64_t L)
{
	/* Names for messages: the first role's canonical tensor at this layer. */
	char fname[MAXROLES][WEX_NAME_MAX];

	for (int i = 0; i < et->nroles; i++)
		if (expand(c->m, f[i]->name, L, L, 0, 0, fname[i]) < 0)
			snprintf(fname[i], sizeof(fname[i]), "%s", f[i]->name);
	int64_t T = et->axis == AX_ETP ? c->etp : et->axis == AX_ATTN ? c->attn_tp
						: et->axis == AX_NONE ? 1 : c->tp;
	int64_t r = et->axis == AX_ETP ? c->etpr : et->axis == AX_ATTN ? c->atpr
						 : et->axis == AX_NONE ? 0 : c->tpr;
	/* What T is, in messages: the attention-TP size is not the tp given. */
	const char *tpn = et->axis == AX_ATTN && c->dp_attention
				  ? "attention tensor parallel size (tp/dp)"
				  : "tensor parallel size";
	const char *k = et->kind;
	int n = 0;
	uint64_t rows = 0;

	if (et->heads) {
		int64_t h = wex__model_sym(c->m, et->heads);

		if (h > 0 && h % T)
			FAIL(c, "%s %lld does not divide %s=%lld (for %s)", tpn,
			     (long long)T, et->heads, (long long)h, fname[0]);
	}
	if (!strcmp(k, "rep")) {
		for (int i = 0; i < et->nroles; i++)
			blk_full(&b[n++], f[i]);
	} else if (!strcmp(k, "col")) {
		for (int i = 0; i < et->nroles; i++) {
			uint64_t n0 = f[i]->ndim ? f[i]->shape[0] : 1;

			if (n0 % (uint64_t)T)
				FAIL(c, "%s %lld does not divide dim 0 (%llu) of %s", tpn,
				     (long long)T, (unsigned long long)n0, fname[i]);
			blk_full(&b[n], f[i]);
			b[n].start[0] = (uint64_t)r * (n0 / (uint64_t)T);
			b[n].ext[0] = n0 / (uint64_t)T;
			n++;
		}
	} else if (!strcmp(k, "row")) {
		uint64_t n1 = f[0]->ndim > 1 ? f[0]->shape[1] : 0;

		if (f[0]->ndim < 2 || n1 % (uint64_t)T)
			FAIL(c, "%s %lld does not divide dim 1 (%llu) of %s", tpn,
			     (long long)T, (unsigned long long)n1, fname[0]);
		blk_full(&b[n], f[0]);
		b[n].start[1] = (uint64_t)r * (n1 / (uint64_t)T);
		b[n].ext[1] = n1 / (uint64_t)T;
		n++;
	} else if (!strcmp(k, "qkv_group") || !strcmp(k, "qkv_cat")) {
		int64_t nh = wex__model_sym(c->m, "nh"), nkv = wex__model_sym(c->m, "nkv");
		uint64_t hd;

		if (et->nroles != 3 || nh <= 0 || nkv <= 0 || nh % nkv)
			FAIL(c, "%s: needs roles q,k,v and num_attention_heads (%lld) a multiple of num_key_value_heads (%lld)",
			     et->name, (long long)nh, (long long)nkv);
		/* The blocks below cut q, k and v by heads of k's size: a
		 * family whose q, k, v rows are not nh, nkv and nkv such
		 * heads would put boxes past their tensors. */
		if (!f[0]->ndim || !f[1]->ndim || !f[2]->ndim || f[1]->shape[0] % (uint64_t)nkv ||
		    f[2]->shape[0] != f[1]->shape[0] ||
		    f[0]->shape[0] != (uint64_t)nh * (f[1]->shape[0] / (uint64_t)nkv))
			FAIL(c, "%s: q, k and v must have %lld, %lld and %lld heads of one size in dim 0, "
			     "not %llu, %llu and %llu rows (%s, %s, %s)", et->name, (long long)nh,
			     (long long)nkv, (long long)nkv,
			     (unsigned long long)(f[0]->ndim ? f[0]->shape[0] : 0),
			     (unsigned long long)(f[1]->ndim ? f[1]->shape[0] : 0),
			     (unsigned long long)(f[2]->ndim ? f[2]->shape[0] : 0), fname[0], fname[1],
			     fname[2]);
		hd = f[1]->shape[0] / (uint64_t)nkv;
		if (!strcmp(k, "qkv_group")) {
			/* Megatron: per query group [q heads of the group; k; v]. */
			int64_t ng, qpg = nh / nkv;

			if (nkv % T)
				FAIL(c, "%s %lld does not divide num_key_value_heads (query groups) %lld",
				     tpn, (long long)T, (long long)nkv);
			ng = nkv / T;
			if (3 * ng > MAXBLK)
				FAIL(c, "%s: too many query groups per rank", et->name);
			for (int64_t g = 0; g < ng; g++) {
				uint64_t G = (uint64_t)(r * ng + g);

				blk_full(&b[n], f[0]);
				b[n].start[0] = G * (uint64_t)qpg * hd;
				b[n++].ext[0] = (uint64_t)qpg * hd;
				for (int i = 1; i < 3; i++) {
					blk_full(&b[n], f[i]);
					b[n].start[0] = G * hd;
					b[n++].ext[0] = hd;
				}
			}
		} else {
			/* vLLM: [Q; K; V] for this rank; KV heads replicated
			 * when there are fewer than ranks. */
			uint64_t k0, kn;

			if (nh % T)
				FAIL(c, "%s %lld does not divide num_attention_heads %lld", tpn,
				     (long long)T, (long long)nh);
			if (T >= nkv) {
				if (T % nkv)
					FAIL(c, "%s %lld is not a multiple of num_key_value_heads %lld, so KV heads cannot be replicated evenly",
					     tpn, (long long)T, (long long)nkv);
				k0 = (uint64_t)(r / (T / nkv));
				kn = 1;
			} else {
				if (nkv % T)
					FAIL(c, "%s %lld does not divide num_key_value_heads %lld", tpn,
					     (long long)T, (long long)nkv);
				kn = (uint64_t)(nkv / T);
				k0 = (uint64_t)r * kn;
			}
			blk_full(&b[n], f[0]);
			b[n].start[0] = (uint64_t)r * (uint64_t)(nh / T) * hd;
			b[n++].ext[0] = (uint64_t)(nh / T) * hd;
			for (int i = 1; i < 3; i++) {
				blk_full(&b[n], f[i]);
				b[n].start[0] = k0 * hd;
				b[n++].ext[0] = kn * hd;
			}
		}
	} else if (!strcmp(k, "vocab")) {
		uint64_t V = f[0]->shape[0], mult = (uint64_t)c->vocab_pad * (c->pad_times_tp ? (uint64_t)T : 1);
		uint64_t Vp = (V + mult - 1) / mult * mult, per, a, e;

		if (Vp % (uint64_t)T)
			FAIL(c, "%s %lld does not divide the padded vocabulary %llu (vocab_size %llu padded to a multiple of %llu)",
			     tpn, (long long)T, (unsigned long long)Vp, (unsigned long long)V,
			     (unsigned long long)mult);
		per = Vp / (uint64_t)T;
		a = (uint64_t)r * per;
		e = a + per < V ? a + per : V;
		if (a < e) {
			blk_full(&b[n], f[0]);
			b[n].start[0] = a;
			b[n++].ext[0] = e - a;
		}
		*nb = n;
		*rows0 = per;
		return 0;
	} else {
		FAIL(c, "%s: unknown layout kind \"%s\"", et->name, k);
	}
	for (int i = 0; i < n; i++) {
		rows += b[i].f->ndim ? b[i].ext[0] : 1;
		/* Blocks stack along dim 0: the other dims must agree. */
		if (b[i].f->ndim != b[0].f->ndim ||
		    (b[i].f->ndim > 1 && memcmp(&b[i].ext[1], &b[0].ext[1],
					       (b[i].f->ndim - 1) * sizeof(uint64_t))))
			FAIL(c, "%s: fused tensors disagree beyond dim 0", et->name);
	}
	*nb = n;
	*rows0 = rows;
	return 0;
}

static int out_grow(struct ctx *c, size_t nt, size_t np)
{
	struct wex_rank_layout *o = c->out;

	if (o->nt + nt > c->capt) {
		size_t cap = c->capt ? c->capt : 64;

		while (cap < o->nt + nt)
			cap *= 2;
		void *x = realloc(o->t, cap * sizeof(*o->t));
		if (!x)
			return -ENOMEM;
		o->t = x;
		c->capt = cap;
	}
	if (o->np + np > c->capp) {
		size_t cap = c->capp ? c->capp : 128;

		while (cap < o->np + np)
			cap *= 2;
		void *x = realloc(o->p, cap * sizeof(*o->p));
		if (!x)
			return -ENOMEM;
		o->p = x;
		c->capp = cap;
	}
	return 0;
}

/* Emits physical tensor pname from blocks b (f0: the first role's
 * tensor): nslot slots when stacked, those past nstack from bs (the fused
 * shared expert). */
static int emit_phys(struct ctx *c, const char *pname, const struct ftensor *f0,
		     const struct block *b, int nb, uint64_t rows0, const struct block *bs,
		     int64_t nstack, int64_t nslot, int stack, int64_t L, int64_t l, int64_t E0)
{
	int ret = out_grow(c, 1, (size_t)(nb * nslot));

	if (ret < 0)
		return ret;
	struct wex_layout_tensor *t = &c->out->t[c->out->nt];
	uint32_t ind = f0->ndim ? f0->ndim : 1;
	uint64_t inner_shape[WEX_MAX_DIMS];
	int64_t st[WEX_MAX_DIMS];
	int dtype = ft_dtype(c->m, f0);
	size_t esz = wex_dtype_size(dtype);

	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "%s", pname);
	t->dtype = dtype;
	inner_shape[0] = rows0;
	for (uint32_t d = 1; d < ind; d++)
		inner_shape[d] = nb ? b[0].ext[d] : f0->shape[d];
	t->ndim = ind + (stack ? 1 : 0);
	if (stack)
		t->shape[0] = (uint64_t)nslot;
	for (uint32_t d = 0; d < ind; d++)
		t->shape[d + (stack ? 1 : 0)] = inner_shape[d];
	/* C order strides of the inner tensor. */
	uint64_t inner_elems = 1;
	for (int d = (int)ind - 1; d >= 0; d--) {
		st[d] = (int64_t)inner_elems;
		inner_elems *= inner_shape[d];
	}
	t->nbytes = inner_elems * (uint64_t)nslot * esz;
	t->first = c->out->np;
	for (int64_t s = 0; s < nslot; s++) {
		const struct block *bb = s < nstack ? b : bs;
		uint64_t row = 0;

		for (int i = 0; i < nb; i++) {
			struct wex_tensor *p = &c->out->p[c->out->np++];
			const struct ftensor *ff = bb[i].f;

			memset(p, 0, sizeof(*p));
			ret = expand(c->m, ff->name, L, l, E0 + s, s, p->name);
			if (ret < 0)
				FAIL(c, "cannot expand canonical name %s", ff->name);
			p->dtype = dtype;
			p->ndim = ff->ndim;
			for (uint32_t d = 0; d < ff->ndim; d++) {
				p->shape[d] = ff->shape[d];
				p->start[d] = bb[i].start[d];
				p->extent[d] = bb[i].ext[d];
				p->strides[d] = st[d];
			}
			p->segment = (uint32_t)c->out->nt;
			p->offset = ((uint64_t)s * inner_elems + row * (uint64_t)st[0]) * esz;
			row += ff->ndim ? bb[i].ext[0] : 1;
		}
	}
	t->npieces = c->out->np - t->first;
	c->out->total_bytes += t->nbytes;
	c->out->nt++;
	return 0;
}

/* FP8 scales of blocks b: the same boxes in units of quantization blocks;
 * a shard that does not start on a block boundary, or ends inside a block
 * short of its tensor's end, has no scales of its own: refused.  Fused
 * parts (qkv_proj, gate_up_proj, w13) stack their scales as vLLM's and
 * SGLang's loaders do, part k at row ceil(offset_k / R): that is the
 * concatenation of each part's own block rows only when every part but the
 * last ends on a block (their validate_fp8_block_shape refuses the rest).
 * L and E name the layer and expert in messages. */
static int scale_blocks(struct ctx *c, const char *pname, const struct block *b, struct block *sb,
			int nb, uint64_t *rows, int64_t L, int64_t E)
{
	for (int i = 0; i < nb; i++) {
		const struct ftensor *f = b[i].f;

		if (f->scale < 0)
			FAIL(c, "%s: fuses FP8 and unquantized tensors (%s)", pname, f->name);
		sb[i].f = &c->m->ft[f->scale];
		for (uint32_t d = 0; d < 2; d++) {
			uint64_t q = c->m->qblk[d], a = b[i].start[d], e = a + b[i].ext[d];
			char nm[WEX_NAME_MAX], wn[WEX_NAME_MAX];

			if (!(a % q || (e % q && e != f->shape[d])) && !(d == 0 && i < nb - 1 && e % q)) {
				sb[i].start[d] = a / q;
				sb[i].ext[d] = (e + q - 1) / q - a / q;
				continue;
			}
			if (expand(c->m, sb[i].f->name, L, L, E, E, nm) < 0)
				snprintf(nm, sizeof(nm), "%s", sb[i].f->name);
			if (expand(c->m, f->name, L, L, E, E, wn) < 0)
				snprintf(wn, sizeof(wn), "%s", f->name);
			if (a % q || (e % q && e != f->shape[d]))
				FAIL(c, "%s: its shard [%llu, %llu) of dim %u of %s does not fall on the "
				     "%llu-element blocks of the FP8 scales (%s, weight_block_size): choose "
				     "a tensor/expert parallel size that cuts whole blocks",
				     pname, (unsigned long long)a, (unsigned long long)e, d, wn,
				     (unsigned long long)q, nm);
			FAIL(c, "%s: its part %s (rows [%llu, %llu)) ends inside a %llu-row block of the "
			     "FP8 scales (%s, weight_block_size), so the fused scales of the parts after "
			     "it cannot be placed: every fused part but the last must be a multiple of %llu rows",
			     pname, wn, (unsigned long long)a, (unsigned long long)e,
			     (unsigned long long)q, nm, (unsigned long long)q);
		}
		*rows += sb[i].ext[0];
	}
	return 0;
}

/* Emits one physical tensor: `nstack` copies of the inner blocks (one per
 * local expert, each from its own canonical tensors) or a plain one; and
 * after it, for FP8 weights, their scales cut the same way. */
static int emit(struct ctx *c, const struct etensor *et, int64_t L, int64_t nstack, int64_t E0)
{
	struct block b[MAXBLK];
	const struct ftensor *f[MAXROLES];
	int nb = 0, ret;
	uint64_t rows0 = 0;
	char pname[WEX_NAME_MAX];
	int stack = et->experts == 2;
	int64_t l = L - c->L0;

	/* SGLang's fused shared expert: one more slot after the routed ones,
	 * cut the same way from the shared expert's tensors. */
	struct block bs[MAXBLK];
	int nbs = 0;
	uint64_t rows_s = 0;
	int64_t nslot = nstack;

	for (int i = 0; i < et->nroles; i++)
		f[i] = role_find(c->m, et->roles[i]);
	ret = make_blocks(c, et, f, b, &nb, &rows0, L);
	if (ret < 0)
		return ret;
	if (stack && c->fuse_shared && et->nshared) {
		struct etensor se = *et;
		const struct ftensor *fs[MAXROLES];

		se.nroles = et->nshared;
		for (int i = 0; i < et->nshared; i++) {
			se.roles[i] = et->shared_roles[i];
			fs[i] = role_find(c->m, et->shared_roles[i]);
			if (!fs[i] || fs[i]->experts || !layer_has(c->m, fs[i]->layers, L))
				FAIL(c, "%s: fuse_shared=1 but the model has no shared expert role %s at layer %lld",
				     et->name, et->shared_roles[i], (long long)L);
			if (ft_dtype(c->m, fs[i]) != ft_dtype(c->m, f[0]))
				FAIL(c, "%s: the shared expert's dtype differs from the routed experts'", et->name);
		}
		ret = make_blocks(c, &se, fs, bs, &nbs, &rows_s, L);
		if (ret < 0)
			return ret;
		if (rows_s != rows0 || nbs != nb)
			FAIL(c, "%s: the shared expert is not shaped like a routed one (%llu rows, not %llu): it cannot be fused",
			     et->name, (unsigned long long)rows_s, (unsigned long long)rows0);
		for (int i = 0; i < nb; i++)
			for (uint32_t d = 1; d < b[i].f->ndim; d++)
				if (bs[i].ext[d] != b[i].ext[d])
					FAIL(c, "%s: the shared expert is not shaped like a routed one: it cannot be fused",
					     et->name);
		nslot = nstack + 1;
	}
	ret = expand(c->m, et->name, L, l, E0, 0, pname);
	if (ret < 0)
		FAIL(c, "cannot expand physical name %s", et->name);
	for (int i = 1; i < et->nroles; i++)
		if (ft_dtype(c->m, f[i]) != ft_dtype(c->m, f[0]))
			FAIL(c, "%s: fused tensors disagree on dtype", et->name);
	for (int i = 1; i < et->nroles; i++)
		if ((f[i]->scale < 0) != (f[0]->scale < 0))
			FAIL(c, "%s: fuses FP8 and unquantized tensors", et->name);
	ret = emit_phys(c, pname, f[0], b, nb, rows0, bs, nstack, nslot, stack, L, l, E0);
	if (ret < 0 || f[0]->scale < 0)
		return ret;
	/* FP8 block scales: a second tensor cut like the weight, in blocks
	 * (vLLM's and SGLang's weight_scale_inv beside every FP8 weight). */
	{
		struct block sb[MAXBLK], sbs[MAXBLK];
		uint64_t srows = 0;
		size_t n = strlen(pname);

		if (!json_is_true(json_object_get(c->eng, "fp8_block_scales")))
			FAIL(c, "engine %s has no layout for FP8 block scales: %s_scale_inv (and the FP8 "
			     "weights) cannot be placed; convert FP8 checkpoints to hf, vllm or sglang",
			     json_string_value(json_object_get(c->eng, "engine")) ?: "?", pname);
		if (n < 6 || strcmp(pname + n - 6, "weight") || n + 10 >= sizeof(pname))
			FAIL(c, "%s: an FP8 weight's physical name must end in weight", pname);
		uint64_t srows_s = 0;

		ret = scale_blocks(c, pname, b, sb, nb, &srows, L, E0);
		if (ret == 0 && nslot > nstack)
			ret = scale_blocks(c, pname, bs, sbs, nb, &srows_s, L, 0);
		if (ret < 0)
			return ret;
		snprintf(pname + n, sizeof(pname) - n, "_scale_inv");
		return emit_phys(c, pname, &c->m->ft[f[0]->scale], sb, nb, srows, sbs, nstack, nslot,
				 stack, L, l, E0);
	}
}

static int parse_etensor(struct ctx *c, json_t *v, struct etensor *et)
{
	json_t *roles = json_object_get(v, "roles"), *r;
	const char *ax = json_string_value(json_object_get(v, "axis"));
	const char *ex = json_string_value(json_object_get(v, "experts"));
	const char *lay = json_string_value(json_object_get(v, "layers"));
	size_t i;

	memset(et, 0, sizeof(*et));
	et->name = json_string_value(json_object_get(v, "name"));
	et->kind = json_string_value(json_object_get(v, "kind"));
	et->stage = json_string_value(json_object_get(v, "stage"));
	et->when = json_string_value(json_object_get(v, "when"));
	et->heads = json_string_value(json_object_get(v, "heads"));
	et->axis = !ax ? AX_TP : !strcmp(ax, "etp") ? AX_ETP : !strcmp(ax, "attn") ? AX_ATTN
		   : !strcmp(ax, "none") ? AX_NONE : -1;
	if (et->axis < 0)
		FAIL(c, "engine tensor %s: unknown axis \"%s\" (etp, attn or none; absent: tp)",
		     et->name ? et->name : "?", ax);
	et->experts = !ex ? 0 : !strcmp(ex, "stack") ? 2 : 1;
	et->layers = !lay ? LAY_ALL : !strcmp(lay, "dense") ? LAY_DENSE : !strcmp(lay, "moe") ? LAY_MOE : LAY_ALL;
	json_array_foreach(roles, i, r) {
		if (i >= MAXROLES || !json_is_string(r))
			FAIL(c, "engine tensor %s: bad roles", et->name ? et->name : "?");
		et->roles[et->nroles++] = json_string_value(r);
	}
	json_array_foreach(json_object_get(v, "shared_roles"), i, r) {
		if (i >= MAXROLES || !json_is_string(r) || et->experts != 2)
			FAIL(c, "engine tensor %s: bad shared_roles (a stack's, at most %d)",
			     et->name ? et->name : "?", MAXROLES);
		et->shared_roles[et->nshared++] = json_string_value(r);
	}
	/* "if"/"unless": one layout parameter, or a list of them. */
	for (int w = 0; w < 2; w++) {
		const char *what = w ? "unless" : "if";
		json_t *cond = json_object_get(v, what), *one = cond;
		uint32_t *mask = w ? &et->unless_mask : &et->if_mask;
		size_t j = 0, n = json_is_array(cond) ? json_array_size(cond) : cond ? 1 : 0;

		for (; j < n; j++) {
			const char *u;
			int k = 0;

			if (json_is_array(cond))
				one = json_array_get(cond, j);
			u = json_string_value(one);
			while (u && k < WEX_LAYOUT_PARAMS && strcmp(u, param_names[k]))
				k++;
			if (!u || k == WEX_LAYOUT_PARAMS) {
				char keys[256];

				FAIL(c, "engine tensor %s: unknown \"%s\" %s (a layout parameter: %s; "
				     "or a list of them)", et->name ? et->name : "?", what,
				     u ? u : "(not a string)", param_keys(keys, sizeof(keys)));
			}
			*mask |= 1u << k;
		}
	}
	if (!et->name || !et->kind || !et->nroles)
		FAIL(c, "engine tensor entry lacks name, kind or roles");
	return 0;
}

/* The entry's "if" parameters are all set and its "unless" ones all 0. */
static int params_match(const struct ctx *c, const struct etensor *et)
{
	for (int k = 0; k < WEX_LAYOUT_PARAMS; k++)
		if (((et->if_mask >> k & 1) && !c->pv[k]) || ((et->unless_mask >> k & 1) && c->pv[k]))
			return 0;
	return 1;
}

/* All roles present, as per-layer or global tensors as the entry needs. */
static int roles_exist(const struct ctx *c, const struct etensor *et, int64_t L)
{
	for (int i = 0; i < et->nroles; i++) {
		const struct ftensor *f = role_find(c->m, et->roles[i]);

		if (!f || (f->experts != (et->experts != 0)))
			return 0;
		if (L < 0 ? f->layers != LAY_NONE : !layer_has(c->m, f->layers, L))
			return 0;
	}
	return 1;
}

/* The rows [*r0, *r0 + *n) of a d0-row dim 0 that rank r of an n-way
 * FSDP2 shard holds: torch.chunk's chunks of ceil(d0 / n) rows, and an
 * empty one for each rank past the last chunk (_chunk_with_empty). */
static void fsdp_rows(uint64_t d0, uint64_t n, uint64_t r, uint64_t *r0, uint64_t *nr)
{
	uint64_t c = d0 / n + (d0 % n != 0), a = r * c, b = a + c;

	a = a < d0 ? a : d0;
	b = b < d0 ? b : d0;
	*r0 = a;
	*nr = b - a;
}

/* A canonical engine's rank: every canonical tensor under its own name,
 * whole (hf), or its dim-0 chunk for this fsdp rank (chunk_dim0), one
 * piece each; an empty chunk is a tensor of 0 rows without pieces (FSDP2's
 * local tensor there is empty).  A 0-dim tensor is one element, whole;
 * FSDP2 has no dim 0 to shard it on (FSDPParam refuses "Shard dim 0 is
 * invalid for 0D tensor"), so chunk_dim0 refuses it. */
static int canonical_rank(const struct ctx *c, struct wex_rank_layout *o)
{
	struct wex_tensor *ct;
	size_t n, np = 0;
	int ret = wex__model_canonical(c->m, &ct, &n);

	if (ret < 0)
		return ret;
	for (size_t k = 0; c->chunk_dim0 && k < n; k++)
		if (!ct[k].ndim) {
			seterr(c->err, c->errlen, "%.*s is a 0-dim tensor: FSDP2 shards dim 0, which "
			       "it lacks (not described; hf holds it whole)", WEX_NAME_MAX, ct[k].name);
			free(ct);
			return -WEX_ELAYOUT;
		}
	o->t = calloc(n ? n : 1, sizeof(*o->t));
	if (!o->t) {
		free(ct);
		return -ENOMEM;
	}
	o->p = ct;
	o->nt = n;
	for (size_t k = 0; k < n; k++) {
		struct wex_layout_tensor *t = &o->t[k];
		struct wex_tensor x = ct[k];
		uint64_t r0 = 0, nr = x.ndim ? x.shape[0] : 1;

		if (c->chunk_dim0)
			fsdp_rows(x.shape[0], (uint64_t)c->fsdp, (uint64_t)c->fsdpr, &r0, &nr);
		if (x.ndim) {
			x.start[0] = r0;
			x.extent[0] = nr;
		}
		snprintf(t->name, sizeof(t->name), "%s", x.name);
		t->dtype = x.dtype;
		t->ndim = x.ndim;
		memcpy(t->shape, x.extent, sizeof(x.extent));
		t->nbytes = wex_tensor_nbytes(&x);
		t->first = np;
		t->npieces = nr ? 1 : 0;
		o->total_bytes += t->nbytes;
		/* Pieces in place: np <= k. */
		if (nr) {
			x.segment = (uint32_t)k;
			ct[np++] = x;
		}
	}
	o->np = np;
	return 0;
}

int wex__layout_world(const struct wex_model *m, const struct wex_layout_spec *spec,
		      uint32_t *world, char *err, size_t errlen)
{
	struct ctx c = { .err = err, .errlen = errlen };
	int ret = ctx_setup(&c, m, spec);

	/* Every stage must be possible too; sizes that must divide a tensor
	 * show when a rank of each stage is laid out. */
	for (int64_t s = 0; ret == 0 && s < c.pp; s++) {
		struct wex_rank_layout l;

		ret = wex__layout_rank(m, spec, (uint32_t)(s * c.stage_ranks), &l, err, errlen);
		if (ret == 0)
			wex__rank_layout_free(&l);
	}
	if (ret == 0)
		*world = c.world;
	json_decref(c.eng);
	return ret;
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A rank's physical tensors are found by name (attach, convert, the
 * Python glue): two under one name (an entry without {L} in a per-layer
 * name, say) would be one tensor for all but the layout. */
static int unique_names(const struct wex_rank_layout *o, const char *engine, uint32_t rank,
			char *err, size_t errlen)
{
	const char **v;
	int ret = 0;

	if (o->nt < 2)
		return 0;
	v = malloc(o->nt * sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < o->nt; i++)
		v[i] = o->t[i].name;
	qsort(v, o->nt, sizeof(*v), name_cmp);
	for (size_t i = 1; i < o->nt; i++)
		if (!strcmp(v[i - 1], v[i])) {
			seterr(err, errlen, "engine %s rank %u: two physical tensors are both named %s (a per-layer or per-expert name without {L} or {e}?)",
			       engine, rank, v[i]);
			ret = -WEX_ELAYOUT;
			break;
		}
	free(v);
	return ret;
}

int wex__layout_rank(const struct wex_model *m, const struct wex_layout_spec *spec, uint32_t rank,
		     struct wex_rank_layout *out, char *err, size_t errlen)
{
	struct wex_rank_layout o = { 0 };
	struct ctx c = { .err = err, .errlen = errlen, .out = &o };
	int64_t nexp = wex__model_sym(m, "nexp");
	int ret;
	size_t i, chunk_nt0;
	json_t *v;

	ret = ctx_setup(&c, m, spec);
	if (ret < 0)
		goto out;
	if (rank >= c.world) {
		seterr(err, errlen, "rank %u is outside the layout's %u ranks", rank, c.world);
		ret = -WEX_ELAYOUT;
		goto out;
	}
	c.tpr = rank % c.tp;
	c.fsdpr = (rank / c.tp) % c.fsdp;
	c.dpr = c.dp_attention ? 0 : (rank / (c.tp * c.fsdp)) % c.dp;
	c.ppr = rank / c.stage_ranks;
	c.atpr = c.tpr % c.attn_tp;
	ret = stage_range(&c, c.ppr, &c.L0, &c.L1);
	if (ret < 0)
		goto out;
	{
		const char *span = json_string_value(json_object_get(c.eng, "expert_span"));
		int64_t idx = c.tpr + (span && !strcmp(span, "tp_dp") ? c.tp * c.dpr : 0);

		c.etpr = idx % c.etp;
		c.epr = (idx / c.etp) % c.ep;
	}
	if (c.canonical) {
		ret = canonical_rank(&c, &o);
		if (ret < 0)
			goto out;
		goto done;
	}
	/* One pass over the engine's entries per model chunk (vpp; one
	 * chunk without it), each chunk's tensors after the previous ones'. */
	c.vpr = 0;
chunk:
	ret = chunk_enter(&c);
	if (ret < 0)
		goto out;
	chunk_nt0 = o.nt;
	json_array_foreach(json_object_get(c.eng, "tensors"), i, v) {
		struct etensor et;
		/* This rank's experts: [e0, e0 + nloc), the first nexp % ep
		 * ranks one more (expert_remainder; else none are left). */
		int64_t base = nexp > 0 ? nexp / c.ep : 0, rem = nexp > 0 ? nexp % c.ep : 0;
		int64_t nloc = base + (c.epr < rem);
		int64_t e0 = c.epr * base + (c.epr < rem ? c.epr : rem);

		ret = parse_etensor(&c, v, &et);
		if (ret < 0)
			goto out;
		if (!when_true(m, et.when) || !params_match(&c, &et))
			continue;
		if (et.stage) {
			int ok = !strcmp(et.stage, "first") ? c.chunk_first
				 : !strcmp(et.stage, "last") ? c.chunk_last
				 : !strcmp(et.stage, "last_not_first") ? (c.chunk_last && !c.chunk_first)
				 : 0;

			if (!ok || !roles_exist(&c, &et, -1))
				continue;
			ret = emit(&c, &et, 0, 1, 0);
			if (ret < 0)
				goto out;
			continue;
		}
		for (int64_t L = c.L0; L < c.L1; L++) {
			if (!layer_has(m, et.layers, L) || !roles_exist(&c, &et, L))
				continue;
			if (et.experts == 1) {
				for (int64_t e = 0; e < nloc; e++) {
					size_t nt0 = o.nt;

					ret = emit(&c, &et, L, 1, e0 + e);
					if (ret < 0)
						goto out;
					/* {e} is the local index in the name (of
					 * the weight and of its FP8 scales). */
					for (size_t k = nt0; k < o.nt; k++) {
						struct wex_layout_tensor *t = &o.t[k];

						ret = expand(m, et.name, L, L - c.L0, e0 + e, e, t->name);
						if (ret < 0) {
							seterr(err, errlen, "cannot expand physical name %s", et.name);
							ret = -WEX_ELAYOUT;
							goto out;
						}
						/* (emit checked the name's length for
						 * expert 0, fewer digits than e may have.) */
						if (k > nt0 && strlen(t->name) + 10 >= sizeof(t->name)) {
							seterr(err, errlen, "%s_scale_inv: the physical name of expert %lld's FP8 scales is %zu bytes or more, over the %d a name may have",
							       t->name, (long long)e, strlen(t->name) + 10, WEX_NAME_MAX - 1);
							ret = -WEX_ELAYOUT;
							goto out;
						}
						if (k > nt0)
							strcat(t->name, "_scale_inv");
					}
				}
			} else {
				ret = emit(&c, &et, L, et.experts == 2 ? nloc : 1, e0);
				if (ret < 0)
					goto out;
			}
		}
	}
	ret = chunk_prefix(&c, chunk_nt0);
	if (ret < 0)
		goto out;
	if (++c.vpr < c.vpp)
		goto chunk;
done:
	ret = unique_names(&o, spec->engine, rank, err, errlen);
	if (ret < 0)
		goto out;
	*out = o;
	memset(&o, 0, sizeof(o));
	ret = 0;
out:
	wex__rank_layout_free(&o);
	json_decref(c.eng);
	return ret;
}

void wex__rank_layout_free(struct wex_rank_layout *l)
{
	free(l->t);
	free(l->p);
	memset(l, 0, sizeof(*l));
}
