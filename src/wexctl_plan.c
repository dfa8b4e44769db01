/* SPDX-License-Identifier: MIT */
/*
 * wexctl_plan.c - `wexctl plan` (statistics of the plan between two
 * layouts) and `wexctl convert` (a checkpoint resharded offline through the
 * same layouts, planner and host executor that serve live transfers).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "layout.h"
#include "plan.h"
#include "safetensors.h"
#include "wexctl_plan.h"
#include "vmm/backend.h"

#define LINK_GBPS 50.0 /* per GPU link, for the estimate */
#define PLAN_BATCH 64  /* consumer ranks planned per group call */

static void seterr(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

struct opts {
	const char *config, *from, *to, *adapters;
	const char *pos[2];
	int npos;
	long rank;
	int json;
	uint64_t max_shard; /* convert --to hf: bytes of tensors per file */
	int progress; /* convert: -1 auto (stderr is a terminal), 0 never, 1 always */
};

#define HF_SHARD_DEFAULT 5000000000ull /* transformers' save_pretrained: "5GB" */

/* A size as transformers' max_shard_size takes it: digits, then
 * optionally B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB
 * (of 1024), any case, but a decimal unit ending in a lower-case b (Kb,
 * Mb, Gb, Tb) counts bits, as transformers reads it.  0 if it is not one,
 * or is 0 or too large. */
static uint64_t parse_size(const char *s)
{
	static const struct {
		const char *unit;
		uint64_t mul;
	} units[] = {
		{ "", 1 },		  { "B", 1 },		 { "KB", 1000ull },
		{ "MB", 1000000ull },	  { "GB", 1000000000ull }, { "TB", 1000000000000ull },
		{ "KIB", 1ull << 10 },	  { "MIB", 1ull << 20 },   { "GIB", 1ull << 30 },
		{ "TIB", 1ull << 40 },
	};
	uint64_t v = 0;
	const char *p = s;

	if (*p < '0' || *p > '9')
		return 0;
	for (; *p >= '0' && *p <= '9'; p++) {
		if (v > (UINT64_MAX - 9) / 10)
			return 0;
		v = v * 10 + (uint64_t)(*p - '0');
	}
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strcasecmp(p, units[i].unit))
			continue;
		if (!v || v > UINT64_MAX / units[i].mul)
			return 0;
		/* transformers reads "5Gb" (a lower-case b after a decimal
		 * unit) as bits. */
		if (units[i].mul >= 1000 && units[i].mul % 1000 == 0 && p[strlen(p) - 1] == 'b')
			return v * units[i].mul / 8;
		return v * units[i].mul;
	}
	return 0;
}

/* --help: to stdout, exit 0 (like wexctl --help); a usage error: stderr, 2. */
static int usage(const char *cmd, int help)
{
	FILE *f = help ? stdout : stderr;

	if (!strcmp(cmd, "plan"))
		fprintf(f, "usage: wexctl plan --config config.json --from LAYOUT --to LAYOUT "
			   "[--rank K] [--json] [--adapters DIR]\n");
	else
		fprintf(f, "usage: wexctl convert --config config.json --from LAYOUT --to LAYOUT "
			   "[--max-shard-size SIZE] [--progress auto|always|never] [--adapters DIR] "
			   "IN OUTDIR\n");
	fprintf(f, "  LAYOUT: ENGINE[:tp=N,pp=N,dp=N,ep=N,etp=N,first=N,last=N,vpp=N,stages=N/N/...,"
		   "fuse_shared=0|1,dp_attention=0|1,dp_lm_head=0|1,dense_tp=1,a2a=0|1,embed_rep=0|1,"
		   "fsdp=N,vocab_div=N,no_mla=0|1,sp_moe=0|1]; engines: hf "
		   "fsdp megatron megatron_grouped vllm sglang (fsdp: dim-0 chunks of every tensor "
		   "over fsdp=N ranks as torch.chunk cuts them, PyTorch FSDP2, dp=M HSDP replicas, "
		   "rank = shard + N*replica; vpp: megatron megatron_grouped, "
		   "--num-virtual-stages-per-pipeline-rank: N model chunks per pp rank, layers "
		   "interleaved over the ranks, chunk v's names prefixed model{v}.; vocab_div: megatron "
		   "megatron_grouped, --make-vocab-size-divisible-by (128): the vocabulary padded to "
		   "a multiple of vocab_div*tp, 1 for Megatron-Bridge (should_pad_vocab=False); "
		   "fuse_shared, dp_attention, dp_lm_head, "
		   "dense_tp, a2a, embed_rep: sglang; dp_attention=1: --enable-dp-attention, tp ranks "
		   "in all with attention split over tp/dp of them; a2a=1: --moe-a2a-backend "
		   "deepep|mooncake (DeepSeek; ep=tp), shared experts whole on every rank; "
		   "embed_rep=1 (with dp_attention=1): SGLang before PR #17403 or "
		   "SGLANG_ENABLE_EMBED_REPLICATION=1, the embedding whole on every rank; no_mla, "
		   "sp_moe: vllm, DeepSeek; no_mla=1: VLLM_MLA_DISABLE=1, q_a_proj and "
		   "kv_a_proj_with_mqa apart, not fused_qkv_a_proj; sp_moe=1: vLLM's "
		   "sequence-parallel MoE (DP + EP with tp > 1), shared experts whole on every rank; "
		   "stages: vllm sglang, the layers of each of the pp stages, "
		   "as VLLM_PP_LAYER_PARTITION / SGLANG_PP_LAYER_PARTITION; without it layers that "
		   "do not divide by pp go one each to the stages before the last (vllm) or to the "
		   "last ones (sglang), and megatron needs first/last)\n");
	if (strcmp(cmd, "plan"))
		fprintf(f, "  IN: a .safetensors file or a directory of them (an HF checkpoint, "
			   "model.safetensors.index.json if there; or that index itself) when --from "
			   "has one rank, else a "
			   "directory of rank-K.safetensors; OUTDIR gets rank-K.safetensors, one per "
			   "rank of --to; --to hf writes a Hugging Face checkpoint instead: "
			   "model.safetensors, or model-0000K-of-0000N.safetensors files of at most "
			   "SIZE bytes of tensors each (--max-shard-size, default 5GB; B KB MB GB TB, "
			   "KiB MiB GiB TiB, any case, but Kb Mb Gb Tb count bits as transformers "
			   "reads them; refused beside a model.safetensors already in OUTDIR, which "
			   "transformers would load instead), model.safetensors.index.json naming each tensor's file "
			   "(none for model.safetensors alone, as save_pretrained writes none, unless "
			   "OUTDIR holds other .safetensors files), and "
			   "where OUTDIR has none config.json from --config and the tokenizer files "
			   "(tokenizer.json, tokenizer_config.json, special_tokens_map.json, "
			   "added_tokens.json, tokenizer.model, vocab.json, merges.txt, "
			   "chat_template.jinja/.json) and generation_config.json found beside IN, else "
			   "beside --config)\n"
			   "  While it writes, convert holds OUTDIR/.wexctl-convert.lock (a second convert "
			   "into OUTDIR meanwhile is refused, naming the first's pid) and removes the "
			   "NAME.safetensors.partial and NAME.safetensors.partial.tmp.PID files (--to hf: "
			   "also FILE.tmp.PID of the index, config.json and tokenizer files) a convert "
			   "killed there (SIGKILL, the OOM killer) left, naming each and its bytes on "
			   "stderr (a .tmp.PID of a running wexctl convert stays).  A source file that "
			   "shrinks or is rewritten while read (a trainer still saving it) fails the "
			   "conversion, naming it.\n"
			   "  --progress: how far each rank is, on stderr (auto: when it is a terminal, "
			   "a line redrawn in place; always: also into a log, a line every 10 s and one "
			   "per rank)\n");
	return help ? 0 : 2;
}

/* Returns 0, 1 for --help, or -1 after naming what is wrong on stderr (the
 * usage alone left a bad --rank or a missing option to guess).  npos: the
 * positional arguments the command takes (IN OUTDIR for convert). */
static int parse_opts(int argc, char **argv, struct opts *o, int npos)
{
	const char *cmd = argv[0];
	char missing[64] = "";
	int seen_rank = 0, seen_shard = 0, seen_progress = 0;

	memset(o, 0, sizeof(*o));
	o->rank = -1;
	o->progress = -1;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char **dst = NULL;

		if (!strcmp(a, "--config"))
			dst = &o->config;
		else if (!strcmp(a, "--from"))
			dst = &o->from;
		else if (!strcmp(a, "--to"))
			dst = &o->to;
		else if (!strcmp(a, "--adapters"))
			dst = &o->adapters;
		else if (npos && (!strcmp(a, "--json") || !strcmp(a, "--rank"))) {
			/* plan's options: convert writes every rank and prints
			 * no JSON, so taking them would ignore what was asked. */
			fprintf(stderr, "wexctl %s: %s is an option of wexctl plan only\n", cmd, a);
			return -1;
		} else if (!strcmp(a, "--json")) {
			o->json = 1;
			continue;
		} else if (!strcmp(a, "--rank")) {
			char *end;

			if (seen_rank++) {
				fprintf(stderr, "wexctl %s: %s given twice\n", cmd, a);
				return -1;
			}
			if (i + 1 >= argc) {
				fprintf(stderr, "wexctl %s: %s needs a value\n", cmd, a);
				return -1;
			}
			/* Digits only: strtol's sign and leading blanks
			 * ("+1", " 1") are refused, as the examples refuse them. */
			errno = 0;
			o->rank = strtol(argv[++i], &end, 10);
			if (!*argv[i] || argv[i][strspn(argv[i], "0123456789")] || *end || errno ||
			    o->rank < 0 || o->rank > UINT32_MAX) {
				fprintf(stderr, "wexctl %s: bad --rank '%s' (a rank, 0 or more, in "
					"digits)\n", cmd, argv[i]);
				return -1;
			}
			continue;
		} else if (!strcmp(a, "--max-shard-size")) {
			if (!npos) {
				fprintf(stderr, "wexctl %s: %s is an option of wexctl convert only\n",
					cmd, a);
				return -1;
			}
			if (seen_shard++) {
				fprintf(stderr, "wexctl %s: %s given twice\n", cmd, a);
				return -1;
			}
			if (i + 1 >= argc) {
				fprintf(stderr, "wexctl %s: %s needs a value\n", cmd, a);
				return -1;
			}
			o->max_shard = parse_size(argv[++i]);
			if (!o->max_shard) {
				fprintf(stderr, "wexctl %s: bad --max-shard-size '%s' (bytes, more than 0, "
					"optionally followed by B KB MB GB TB KiB MiB GiB TiB; Kb Mb Gb Tb are "
					"bits)\n", cmd,
					argv[i]);
				return -1;
			}
			continue;
		} else if (!strcmp(a, "--progress")) {
			const char *v = i + 1 < argc ? argv[i + 1] : NULL;

			if (!npos) {
				fprintf(stderr, "wexctl %s: %s is an option of wexctl convert only\n",
					cmd, a);
				return -1;
			}
			if (seen_progress++) {
				fprintf(stderr, "wexctl %s: %s given twice\n", cmd, a);
				return -1;
			}
			if (!v) {
				fprintf(stderr, "wexctl %s: %s needs a value\n", cmd, a);
				return -1;
			}
			i++;
			if (!strcmp(v, "auto")) {
				o->progress = -1;
			} else if (!strcmp(v, "always")) {
				o->progress = 1;
			} else if (!strcmp(v, "never")) {
				o->progress = 0;
			} else {
				fprintf(stderr, "wexctl %s: bad --progress '%s' (auto, always or never)\n",
					cmd, v);
				return -1;
			}
			continue;
		} else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			return 1;
		} else if (a[0] == '-' && a[1] == '-') {
			fprintf(stderr, "wexctl %s: unknown option %s\n", argv[0], a);
			return -1;
		} else {
			if (o->npos >= npos) {
				fprintf(stderr, "wexctl %s: unexpected argument '%s'\n", cmd, a);
				return -1;
			}
			o->pos[o->npos++] = a;
			continue;
		}
		if (i + 1 >= argc) {
			fprintf(stderr, "wexctl %s: %s needs a value\n", cmd, a);
			return -1;
		}
		/* Given twice is a slip (two commands pasted together), not an
		 * override: taking the last would plan from the wrong file. */
		if (*dst) {
			fprintf(stderr, "wexctl %s: %s given twice ('%s' and '%s')\n", cmd, a, *dst,
				argv[i + 1]);
			return -1;
		}
		*dst = argv[++i];
	}
	snprintf(missing, sizeof(missing), "%s%s%s", o->config ? "" : " --config",
		 o->from ? "" : " --from", o->to ? "" : " --to");
	if (*missing) {
		fprintf(stderr, "wexctl %s: missing%s\n", cmd, missing);
		return -1;
	}
	if (o->npos < npos) {
		fprintf(stderr, "wexctl %s: missing IN OUTDIR\n", cmd);
		return -1;
	}
	/* An empty one (a variable not set) was named as nothing: ": No
	 * such file or directory", exit 1. */
	for (int k = 0; k < o->npos; k++)
		if (!*o->pos[k]) {
			fprintf(stderr, "wexctl %s: %s is an empty string\n", cmd, k ? "OUTDIR" : "IN");
			return -1;
		}
	/* A LAYOUT that does not parse is a bad value (exit 2); one that
	 * parses but does not fit the model is the planner's refusal. */
	for (int k = 0; k < 2; k++) {
		struct wex_layout_spec s;
		char err[512];

		if (wex__layout_parse(k ? o->to : o->from, &s, err, sizeof(err)) < 0) {
			fprintf(stderr, "wexctl %s: %s %s\n", cmd, k ? "--to:" : "--from:", err);
			return -1;
		}
		if (k && o->max_shard && strcmp(s.engine, "hf")) {
			fprintf(stderr, "wexctl %s: --max-shard-size applies to --to hf only (--to %s "
				"writes one file per rank)\n", cmd, o->to);
			return -1;
		}
	}
	/* A directory named by --adapters that is not one is a bad value,
	 * named as such (the family file it lacked was named instead, with
	 * jansson's "(line -1)"). */
	if (o->adapters && *o->adapters) {
		struct stat st;
		char sub[4200];
		int bad = stat(o->adapters, &st) < 0 ? errno : !S_ISDIR(st.st_mode) ? ENOTDIR : 0;

		if (bad) {
			fprintf(stderr, "wexctl %s: --adapters %s: %s (the adapters directory, holding "
				"families/ and engines/)\n", cmd, o->adapters, strerror(bad));
			return -1;
		}
		for (int k = 0; k < 2; k++) {
			snprintf(sub, sizeof(sub), "%s/%s", o->adapters, k ? "engines" : "families");
			if (stat(sub, &st) < 0 || !S_ISDIR(st.st_mode)) {
				fprintf(stderr, "wexctl %s: --adapters %s: not an adapters directory "
					"(it has no %s/)\n", cmd, o->adapters, k ? "engines" : "families");
				return -1;
			}
		}
	}
	/* OUTDIR: a directory, or a name to make one at (in a directory).
	 * Refused up front: found only once the files were written, it was
	 * named through a temporary file ("OUTDIR/model.safetensors.partial.
	 * tmp.PID: Not a directory"). */
	if (npos == 2) {
		const char *out = o->pos[1];
		struct stat st;
		int bad = stat(out, &st) < 0 ? errno : !S_ISDIR(st.st_mode) ? ENOTDIR : 0;

		if (bad == ENOTDIR) {
			fprintf(stderr, "wexctl %s: OUTDIR %s: not a directory\n", cmd, out);
			return -1;
		}
		if (bad && bad != ENOENT) {
			fprintf(stderr, "wexctl %s: OUTDIR %s: %s\n", cmd, out, strerror(bad));
			return -1;
		}
		if (bad && lstat(out, &st) == 0 && S_ISLNK(st.st_mode)) {
			/* mkdir makes no directory where a link points. */
			char to[4096];
			ssize_t n = readlink(out, to, sizeof(to) - 1);

			to[n > 0 ? n : 0] = '\0';
			fprintf(stderr, "wexctl %s: OUTDIR %s: a symbolic link to %s, which does not "
				"exist (convert makes OUTDIR, not the target of a link)\n", cmd, out,
				to[0] ? to : "?");
			return -1;
		}
		if (bad) {
			char parent[4096];
			size_t l = strlen(out);

			while (l > 1 && out[l - 1] == '/') /* "new/" */
				l--;
			while (l > 0 && out[l - 1] != '/')
				l--;
			/* (Its trailing '/' left out, but of "/" itself.) */
			snprintf(parent, sizeof(parent), "%.*s", (int)(l > 1 ? l - 1 : 1), l ? out : ".");
			bad = stat(parent, &st) < 0 ? errno : !S_ISDIR(st.st_mode) ? ENOTDIR : 0;
			if (bad) {
				fprintf(stderr, "wexctl %s: OUTDIR %s: its parent %s: %s (convert makes "
					"OUTDIR, not the directories above it)\n", cmd, out, parent,
					strerror(bad));
				return -1;
			}
		}
	}
	if (npos && !o->max_shard)
		o->max_shard = HF_SHARD_DEFAULT;
	return 0;
}

/* The model of --config, its family from the adapters directory.  A
 * family file missing from $WEX_ADAPTERS's directory names the variable
 * (--adapters was checked in parse_opts). */
static int model_load(const struct opts *o, struct wex_model **m, char *err, size_t errlen)
{
	const char *env = getenv("WEX_ADAPTERS");
	int ret = wex__model_load(o->config, o->adapters, m, err, errlen);
	size_t l = strlen(err);

	if (ret == -ENOENT && !(o->adapters && *o->adapters) && env && *env && strstr(err, env) &&
	    l + 1 < errlen)
		snprintf(err + l, errlen - l, " (the adapters directory $WEX_ADAPTERS names)");
	return ret;
}

/* An engine that parses but has no layout in the adapters directory is a
 * bad value of --from or --to (exit 2, as a parameter it does not take),
 * not a failure of the planner.  Returns 0, or -ENOENT with err set. */
static int check_engines(const struct opts *o, const struct wex_model *m, char *err,
			 size_t errlen)
{
	for (int k = 0; k < 2; k++) {
		struct wex_layout_spec s;
		char path[700];

		if (wex__layout_parse(k ? o->to : o->from, &s, err, errlen) < 0)
			return -EINVAL; /* (parse_opts refused it already) */
		snprintf(path, sizeof(path), "%s/engines/%s.json", wex__model_adapters(m), s.engine);
		if (access(path, F_OK) < 0) {
			seterr(err, errlen, "%s unknown engine \"%s\" (no %s; --help lists the "
			       "engines)", k ? "--to:" : "--from:", s.engine, path);
			return -ENOENT;
		}
	}
	return 0;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct side {
	struct wex_layout_spec spec;
	uint32_t world;
	struct wex_rank_layout *l;
};

static int side_load(const struct wex_model *m, const char *s, struct side *sd, int all,
		     char *err, size_t errlen)
{
	int ret = wex__layout_parse(s, &sd->spec, err, errlen);

	if (ret < 0)
		return ret;
	ret = wex__layout_world(m, &sd->spec, &sd->world, err, errlen);
	if (ret < 0)
		return ret;
	sd->l = calloc(sd->world, sizeof(*sd->l));
	if (!sd->l)
		return -ENOMEM;
	for (uint32_t r = 0; all && r < sd->world; r++) {
		ret = wex__layout_rank(m, &sd->spec, r, &sd->l[r], err, errlen);
		if (ret < 0)
			return ret;
	}
	return 0;
}

static void side_free(struct side *sd)
{
	for (uint32_t r = 0; sd->l && r < sd->world; r++)
		wex__rank_layout_free(&sd->l[r]);
	free(sd->l);
	sd->l = NULL;
}

int wexctl_cmd_plan(int argc, char **argv)
{
	struct opts o;
	struct wex_model *m = NULL;
	struct side src = { 0 }, dst = { 0 };
	struct wex_plan_src *srcs = NULL;
	struct wex_plan_dst *dsts = NULL;
	struct wex_plan **plans = NULL;
	struct wex_planner *pl = NULL;
	struct wex_plan_stats st;
	char err[1024] = "";
	uint32_t first = 0, count = 0;
	int ret, rc = 1;

	if ((ret = parse_opts(argc, argv, &o, 0)) != 0)
		return usage("plan", ret == 1);
	ret = model_load(&o, &m, err, sizeof(err));
	if (ret < 0)
		goto fail;
	ret = check_engines(&o, m, err, sizeof(err));
	if (ret < 0) {
		rc = 2;
		goto fail;
	}
	ret = side_load(m, o.from, &src, 1, err, sizeof(err));
	if (ret < 0)
		goto fail;
	ret = side_load(m, o.to, &dst, 0, err, sizeof(err));
	if (ret < 0)
		goto fail;
	count = dst.world;
	if (o.rank >= 0) {
		if ((uint64_t)o.rank >= dst.world) {
			/* A bad value (exit 2), as --rank x is. */
			seterr(err, sizeof(err), "bad --rank %ld: the destination (--to %s) has %u "
				 "rank%s, 0 to %u", o.rank, o.to, dst.world, dst.world == 1 ? "" : "s",
				 dst.world - 1);
			rc = 2;
			goto fail;
		}
		first = (uint32_t)o.rank;
		count = 1;
	}
	/* Consumer ranks are laid out and planned in batches on one planner:
	 * the load carried between batches keeps the balance global while
	 * memory stays bounded for thousands of ranks. */
	uint32_t batch = count < PLAN_BATCH ? count : PLAN_BATCH;
	dsts = calloc(batch, sizeof(*dsts));
	plans = calloc(batch, sizeof(*plans));
	srcs = calloc(src.world, sizeof(*srcs));
	if (!srcs || !dsts || !plans) {
		ret = -ENOMEM;
		goto fail;
	}
	uint64_t src_hash = 1469598103934665603ull, dst_hash = 1469598103934665603ull;
	for (uint32_t r = 0; r < src.world; r++) {
		srcs[r] = (struct wex_plan_src){ r, src.l[r].p, src.l[r].np };
		src_hash = (src_hash ^ wex__pieces_hash(src.l[r].p, src.l[r].np)) * 1099511628211ull;
	}
	double t0 = now(), secs;
	ret = wex__planner_new(srcs, src.world, &pl, err, sizeof(err));
	if (ret < 0)
		goto fail;
	secs = now() - t0;
	uint64_t plan_hash = 1469598103934665603ull, busiest_dst = 0;
	for (uint32_t b0 = 0; b0 < count; b0 += batch) {
		uint32_t n = count - b0 < batch ? count - b0 : batch;

		for (uint32_t i = 0; i < n; i++) {
			uint32_t r = first + b0 + i;

			ret = wex__layout_rank(m, &dst.spec, r, &dst.l[r], err, sizeof(err));
			if (ret < 0)
				goto fail;
			dsts[i] = (struct wex_plan_dst){ r, dst.l[r].p, dst.l[r].np };
			dst_hash = (dst_hash ^ wex__pieces_hash(dsts[i].t, dsts[i].n)) * 1099511628211ull;
		}
		t0 = now();
		if (count == 1)
			ret = wex__planner_plan(pl, dsts[0].t, dsts[0].n, first, dst.world, &plans[0],
						err, sizeof(err));
		else
			ret = wex__planner_plan_group(pl, dsts, n, dst.world, plans, err, sizeof(err));
		if (ret < 0)
			goto fail;
		secs += now() - t0;
		for (uint32_t i = 0; i < n; i++) {
			plan_hash = (plan_hash ^ plans[i]->hash) * 1099511628211ull;
			if (plans[i]->stats.bytes_needed > busiest_dst)
				busiest_dst = plans[i]->stats.bytes_needed;
			wex__plan_free(plans[i]);
			plans[i] = NULL;
			wex__rank_layout_free(&dst.l[first + b0 + i]);
		}
	}
	wex__planner_stats(pl, &st);
	double ratio = st.src_bound_bytes ? (double)st.busiest_src_bytes / (double)st.src_bound_bytes : 1.0;
	uint64_t link = st.busiest_src_bytes > busiest_dst ? st.busiest_src_bytes : busiest_dst;
	double est = (double)link / (LINK_GBPS * 1e9);
	if (o.json) {
		printf("{\"family\":\"%s\",\"from\":\"%s\",\"to\":\"%s\",\"producer_ranks\":%u,"
		       "\"consumer_ranks\":%u,\"planned_ranks\":%u,\"bytes_needed\":%llu,"
		       "\"bytes_moved\":%llu,\"ops\":%llu,\"busiest_src_rank\":%u,"
		       "\"busiest_src_bytes\":%llu,\"src_bound_bytes\":%llu,"
		       "\"busiest_link_vs_bound\":%.4f,\"busiest_dst_bytes\":%llu,"
		       "\"est_sync_seconds\":%.4f,\"plan_seconds\":%.4f,\"plan_hash\":\"%016llx\","
		       "\"producer_layout_hash\":\"%016llx\",\"consumer_layout_hash\":\"%016llx\"}\n",
		       wex__model_family(m), o.from, o.to, src.world, dst.world, count,
		       (unsigned long long)st.bytes_needed, (unsigned long long)st.bytes_moved,
		       (unsigned long long)st.ops, st.busiest_src, (unsigned long long)st.busiest_src_bytes,
		       (unsigned long long)st.src_bound_bytes, ratio, (unsigned long long)busiest_dst, est,
		       secs, (unsigned long long)plan_hash, (unsigned long long)src_hash,
		       (unsigned long long)dst_hash);
	} else {
		printf("model family        %s\n", wex__model_family(m));
		printf("from                %s (%u rank%s)\n", o.from, src.world,
		       src.world == 1 ? "" : "s");
		printf("to                  %s (%u rank%s; planned %s)\n", o.to, dst.world,
		       dst.world == 1 ? "" : "s",
		       count == 1 ? "one rank" : "all ranks, balanced as a group");
		printf("bytes needed        %llu\n", (unsigned long long)st.bytes_needed);
		printf("bytes moved         %llu (%s)\n", (unsigned long long)st.bytes_moved,
		       st.bytes_moved == st.bytes_needed ? "zero redundancy" : "REDUNDANT");
		printf("copy ops            %llu\n", (unsigned long long)st.ops);
		printf("busiest source      rank %u: %llu bytes; lower bound %llu (%.3fx)\n",
		       st.busiest_src, (unsigned long long)st.busiest_src_bytes,
		       (unsigned long long)st.src_bound_bytes, ratio);
		printf("busiest destination %llu bytes\n", (unsigned long long)busiest_dst);
		printf("est. sync time      %.3f s at %.0f GB/s per GPU link\n", est, LINK_GBPS);
		printf("plan time           %.3f s\n", secs);
		printf("plan hash           %016llx (layouts %016llx -> %016llx)\n",
		       (unsigned long long)plan_hash, (unsigned long long)src_hash,
		       (unsigned long long)dst_hash);
	}
	rc = 0;
	goto out;
fail:
	fprintf(stderr, "wexctl plan: %s\n", err[0] ? err : wex_strerror(ret));
out:
	for (uint32_t i = 0; plans && i < count && i < PLAN_BATCH; i++)
		wex__plan_free(plans[i]);
	free(plans);
	free(dsts);
	free(srcs);
	wex__planner_free(pl);
	side_free(&src);
	side_free(&dst);
	wex__model_free(m);
	return rc;
}

/* ---- convert ---- */

struct rank_files {
	struct wex_st_file *f;
	char **path; /* f[i]'s, for errors that name the file */
	size_t n;
};

static int add_file(struct rank_files *rf, const char *path, char *err, size_t errlen)
{
	struct wex_st_file *x = realloc(rf->f, (rf->n + 1) * sizeof(*x));
	char **p;

	if (x)
		rf->f = x;
	p = x ? realloc(rf->path, (rf->n + 1) * sizeof(*p)) : NULL;
	if (p)
		rf->path = p;
	if (!p || !(p[rf->n] = strdup(path))) {
		seterr(err, errlen, "out of memory");
		return -ENOMEM;
	}
	if (wex__st_open(path, &rf->f[rf->n], err, errlen) < 0) {
		free(p[rf->n]);
		return -EINVAL;
	}
	rf->n++;
	return 0;
}

/* The file of rf holding t (a tensor of one of them). */
static const char *file_of(const struct rank_files *rf, const struct wex_st_tensor *t)
{
	for (size_t i = 0; i < rf->n; i++)
		if (t >= rf->f[i].t && t < rf->f[i].t + rf->f[i].n)
			return rf->path[i];
	return "?";
}

/* A source rank's files, for an error: the file, or how many of `in`. */
static const char *files_str(char *buf, size_t len, const struct rank_files *rf, const char *in)
{
	if (rf->n == 1)
		snprintf(buf, len, "%s", rf->path[0]);
	else
		snprintf(buf, len, "%zu files of %s", rf->n, in);
	return buf;
}

/* A shape as "[24, 32]". */
static const char *shape_str(char *buf, size_t len, uint32_t ndim, const uint64_t *shape)
{
	size_t at = 0;

	at += (size_t)snprintf(buf, len, "[");
	for (uint32_t d = 0; d < ndim && at < len; d++)
		at += (size_t)snprintf(buf + at, len - at, "%s%llu", d ? ", " : "",
				       (unsigned long long)shape[d]);
	if (at < len)
		snprintf(buf + at, len - at, "]");
	return buf;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The files an HF checkpoint's index (idx, in directory dir) names, as
 * rf's (one rank). */
static int open_index(const char *idx_path, const char *dir, struct rank_files *rf, char *err,
		      size_t errlen)
{
	json_error_t je;
	json_t *idx = json_load_file(idx_path, 0, &je), *v;
	const char *k, *names[4096];
	char path[4096];
	size_t nn = 0;
	int ret;

	if (!idx || !json_is_object(json_object_get(idx, "weight_map"))) {
		seterr(err, errlen, "%s: not an index (%s)", idx_path, idx ? "no weight_map" : je.text);
		json_decref(idx);
		return -EINVAL;
	}
	json_object_foreach(json_object_get(idx, "weight_map"), k, v) {
		const char *fn = json_string_value(v);
		int seen = 0;

		if (!fn || strchr(fn, '/')) {
			seterr(err, errlen, "%s: bad file name for %s", idx_path, k);
			json_decref(idx);
			return -EINVAL;
		}
		for (size_t i = 0; i < nn; i++)
			if (!strcmp(names[i], fn))
				seen = 1;
		if (!seen && nn == 4096) {
			seterr(err, errlen, "%s: more than 4096 files", idx_path);
			json_decref(idx);
			return -E2BIG;
		}
		if (!seen)
			names[nn++] = fn;
	}
	qsort(names, nn, sizeof(names[0]), cmp_str);
	for (size_t i = 0; i < nn; i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		ret = add_file(rf, path, err, errlen);
		if (ret < 0) {
			json_decref(idx);
			return ret;
		}
	}
	json_decref(idx);
	return 0;
}

/* The files of each source rank: a file (one rank), an HF index (one
 * rank; IN the directory holding it, or the index itself),
 * rank-K.safetensors, or every *.safetensors of a directory (one rank). */
static int open_inputs(const char *in, uint32_t world, struct rank_files *rf, char *err,
		       size_t errlen)
{
	struct stat st;
	char path[4096];
	int ret;

	if (stat(in, &st) < 0) {
		seterr(err, errlen, "%s: %s", in, strerror(errno));
		return -errno;
	}
	if (!S_ISDIR(st.st_mode)) {
		size_t l = strlen(in);

		if (world != 1)
			goto one_rank;
		/* model.safetensors.index.json given as IN: it was read as
		 * a safetensors file ("header length 8387229874382703227
		 * exceeds the 100,000,000 byte limit"). */
		if (l > 5 && !strcmp(in + l - 5, ".json")) {
			const char *slash = strrchr(in, '/');

			snprintf(path, sizeof(path), "%.*s", slash ? (int)(slash > in ? slash - in : 1) : 1,
				 slash ? in : ".");
			return open_index(in, path, &rf[0], err, errlen);
		}
		return add_file(&rf[0], in, err, errlen);
	}
	/* An HF checkpoint's index names its files: read first, since a
	 * directory may also hold files it does not name (an earlier
	 * conversion's, which transformers and vLLM ignore as well). */
	snprintf(path, sizeof(path), "%s/model.safetensors.index.json", in);
	if (world == 1 && stat(path, &st) == 0)
		return open_index(path, in, &rf[0], err, errlen);
	snprintf(path, sizeof(path), "%s/rank-0.safetensors", in);
	if (stat(path, &st) == 0) {
		/* One rank: a directory that is also an hf checkpoint (an
		 * earlier conversion in place) is not guessed at. */
		DIR *d = world == 1 ? opendir(in) : NULL;
		struct dirent *e;

		while (d && (e = readdir(d))) {
			size_t l = strlen(e->d_name);

			if (l <= 12 || strcmp(e->d_name + l - 12, ".safetensors"))
				continue;
			/* (rank-K.safetensors: past rank 0, refused below.) */
			if (l > 17 && !strncmp(e->d_name, "rank-", 5) &&
			    strspn(e->d_name + 5, "0123456789") == l - 17)
				continue;
			seterr(err, errlen, "%s holds rank-0.safetensors and %s (an hf checkpoint?): "
			       "which is the one-rank source is not guessed; give the file as IN", in,
			       e->d_name);
			closedir(d);
			return -EINVAL;
		}
		if (d)
			closedir(d);
		for (uint32_t r = 0; r < world; r++) {
			snprintf(path, sizeof(path), "%s/rank-%u.safetensors", in, r);
			ret = add_file(&rf[r], path, err, errlen);
			if (ret < 0)
				return ret;
		}
		snprintf(path, sizeof(path), "%s/rank-%u.safetensors", in, world);
		if (stat(path, &st) == 0) {
			seterr(err, errlen, "%s holds more than the source layout's %u ranks", in, world);
			return -EINVAL;
		}
		return 0;
	}
	if (world != 1) {
		/* A directory of ranks without rank-0.safetensors (a copy
		 * cut short), or of none: it was called "one checkpoint". */
		DIR *d = opendir(in);
		struct dirent *e;
		int ranks = 0, other = 0;

		while (d && (e = readdir(d))) {
			size_t l = strlen(e->d_name);

			if (l <= 12 || strcmp(e->d_name + l - 12, ".safetensors"))
				continue;
			if (l > 17 && !strncmp(e->d_name, "rank-", 5) &&
			    strspn(e->d_name + 5, "0123456789") == l - 17)
				ranks = 1;
			else
				other = 1;
		}
		if (d)
			closedir(d);
		if (ranks || !other) {
			seterr(err, errlen, "%s/rank-0.safetensors: No such file or directory (the "
			       "source layout has %u ranks: IN is a directory of rank-0.safetensors "
			       "to rank-%u.safetensors)", in, world, world - 1);
			return -ENOENT;
		}
		goto one_rank;
	}
	{
		DIR *d = opendir(in);
		struct dirent *e;
		char **names = NULL;
		size_t nn = 0;

		if (!d) {
			seterr(err, errlen, "%s: %s", in, strerror(errno));
			return -errno;
		}
		while ((e = readdir(d))) {
			size_t l = strlen(e->d_name);

			if (l > 12 && !strcmp(e->d_name + l - 12, ".safetensors")) {
				char **x = realloc(names, (nn + 1) * sizeof(*names));

				if (!x || !(x[nn] = strdup(e->d_name))) {
					/* Never a checkpoint with files left out. */
					names = x ? x : names;
					for (size_t i = 0; i < nn; i++)
						free(names[i]);
					free(names);
					closedir(d);
					seterr(err, errlen, "%s: out of memory listing its files", in);
					return -ENOMEM;
				}
				names = x;
				nn++;
			}
		}
		closedir(d);
		qsort(names, nn, sizeof(*names), cmp_str);
		ret = nn ? 0 : -ENOENT;
		if (!nn)
			seterr(err, errlen, "%s holds no .safetensors file", in);
		for (size_t i = 0; i < nn; i++) {
			snprintf(path, sizeof(path), "%s/%s", in, names[i]);
			if (ret == 0)
				ret = add_file(&rf[0], path, err, errlen);
			free(names[i]);
		}
		free(names);
		return ret;
	}
one_rank:
	seterr(err, errlen, "the source layout has %u ranks but %s is one checkpoint "
		 "(a sharded source is a directory of rank-K.safetensors)", world, in);
	return -EINVAL;
}

static int cmp_tname(const void *a, const void *b)
{
	return strcmp((*(const struct wex_st_tensor *const *)a)->name,
		      (*(const struct wex_st_tensor *const *)b)->name);
}

/* A tensor name in two files of one rank is ambiguous (which one would
 * be read depended on the file names' order): refused, named. */
static int check_unique(const struct rank_files *rf, uint32_t rank, char *err, size_t errlen)
{
	const struct wex_st_tensor **v;
	size_t n = 0, k = 0;
	int ret = 0;

	for (size_t i = 0; i < rf->n; i++)
		n += rf->f[i].n;
	if (n < 2)
		return 0;
	v = malloc(n * sizeof(*v));
	if (!v) {
		seterr(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (size_t i = 0; i < rf->n; i++)
		for (size_t j = 0; j < rf->f[i].n; j++)
			v[k++] = &rf->f[i].t[j];
	qsort(v, n, sizeof(*v), cmp_tname);
	for (size_t i = 1; i < n; i++)
		if (!strcmp(v[i - 1]->name, v[i]->name)) {
			seterr(err, errlen, "source rank %u: tensor %s is in two of its files, %s and %s",
			       rank, v[i]->name, file_of(rf, v[i - 1]), file_of(rf, v[i]));
			ret = -EINVAL;
			break;
		}
	free(v);
	return ret;
}

static const struct wex_st_tensor *find_in(const struct rank_files *rf, const char *name)
{
	for (size_t i = 0; i < rf->n; i++) {
		const struct wex_st_tensor *t = wex__st_find(&rf->f[i], name);

		if (t)
			return t;
	}
	return NULL;
}

/* The first tensor of a source rank's files that its layout does not
 * name, or NULL.  Names sorted and searched: DeepSeek-V3 has 47,000. */
static const char *first_unnamed(const struct rank_files *rf, const struct wex_rank_layout *l)
{
	const char **v = malloc((l->nt + 1) * sizeof(*v)), *ret = NULL;

	if (!v)
		return NULL;
	for (size_t i = 0; i < l->nt; i++)
		v[i] = l->t[i].name;
	qsort(v, l->nt, sizeof(*v), cmp_str);
	for (size_t i = 0; !ret && i < rf->n; i++)
		for (size_t j = 0; !ret && j < rf->f[i].n; j++) {
			const char *k = rf->f[i].t[j].name;

			if (!bsearch(&k, v, l->nt, sizeof(*v), cmp_str))
				ret = k;
		}
	free(v);
	return ret;
}

struct bases {
	uint64_t **b; /* [rank][physical tensor] */
	uint32_t n;
};

static uint64_t base_of(void *arg, uint32_t rank, uint32_t seg)
{
	struct bases *b = arg;

	return rank < b->n ? b->b[rank][seg] : 0;
}

/* Files written beside the weights of an hf target, each at a temporary
 * name (tmp) until renamed to its own (path) once the weights are. */
#define HF_EXTRAS_MAX 16
struct staged {
	char tmp[HF_EXTRAS_MAX][4200], path[HF_EXTRAS_MAX][4096];
	size_t n;
};

/* Writes `text` (len bytes) to dir/name through a temporary renamed over
 * it, synced first; with sg, left at the temporary and noted in sg. */
static int write_beside(const char *dir, const char *name, const char *text, size_t len,
			struct staged *sg, char *err, size_t errlen)
{
	char path[4096], tmp[4200];
	int fd, ret = 0;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		seterr(err, errlen, "%s: %s", tmp, strerror(errno));
		return -errno;
	}
	for (size_t at = 0; at < len && ret == 0;) {
		ssize_t w = write(fd, text + at, len - at);

		if (w > 0)
			at += (size_t)w;
		else if (w == 0)
			ret = -EIO;
		else if (errno != EINTR)
			ret = -errno;
	}
	if (ret == 0 && fsync(fd) < 0)
		ret = -errno;
	if (close(fd) < 0 && ret == 0)
		ret = -errno;
	if (ret == 0 && sg) {
		if (sg->n < HF_EXTRAS_MAX) {
			snprintf(sg->tmp[sg->n], sizeof(sg->tmp[0]), "%s", tmp);
			snprintf(sg->path[sg->n], sizeof(sg->path[0]), "%s", path);
			sg->n++;
			return 0;
		}
		ret = -E2BIG;
	}
	if (ret == 0 && !sg && rename(tmp, path) < 0)
		ret = -errno;
	if (ret < 0) {
		seterr(err, errlen, "%s: %s", path, strerror(-ret));
		unlink(tmp);
	}
	return ret;
}

/* Copies file `from` to dir/name unless dir/name exists: 0 also when it
 * does; -errno with the cause in err. */
static int copy_if_absent(const char *dir, const char *name, const char *from, struct staged *sg,
			  char *err, size_t errlen)
{
	char path[4096];
	FILE *in;
	char *buf = NULL;
	long n = -1;
	int ret;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (access(path, F_OK) == 0 || errno != ENOENT)
		return 0;
	errno = 0;
	in = fopen(from, "rb");
	if (in && fseek(in, 0, SEEK_END) == 0 && (n = ftell(in)) >= 0 && fseek(in, 0, SEEK_SET) == 0 &&
	    (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, in) == (size_t)n)
		ret = write_beside(dir, name, buf, (size_t)n, sg, err, errlen);
	else {
		ret = errno ? -errno : -EIO;
		seterr(err, errlen, "copying %s to %s: %s", from, path, strerror(-ret));
	}
	free(buf);
	if (in)
		fclose(in);
	return ret;
}

/* What a Hugging Face checkpoint directory holds beside its weights and
 * config.json, the files transformers and vLLM load a tokenizer and
 * generation defaults from: small, copied as they are. */
static const char *const hf_side_files[] = {
	"tokenizer.json",	   "tokenizer_config.json", "special_tokens_map.json",
	"added_tokens.json",	   "tokenizer.model",	    "vocab.json",
	"merges.txt",		   "generation_config.json", "chat_template.jinja",
	"chat_template.json",
};

/* The directory holding `path`, or `path` itself when it is one. */
static void dir_of(const char *path, char *out, size_t len)
{
	struct stat st;
	const char *slash;

	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
		snprintf(out, len, "%s", path);
		return;
	}
	slash = strrchr(path, '/');
	if (!slash)
		snprintf(out, len, ".");
	else if (slash == path)
		snprintf(out, len, "/");
	else
		snprintf(out, len, "%.*s", (int)(slash - path), path);
}

/*
 * An hf target is a Hugging Face checkpoint directory, as transformers'
 * save_pretrained writes one: the tensors in model.safetensors, or in
 * model-0000K-of-0000N.safetensors files of at most --max-shard-size bytes
 * of tensors each (one larger tensor alone in its file), in the family's
 * order; model.safetensors.index.json naming each tensor's file when
 * `index` (the shards; one file only where OUTDIR holds other
 * .safetensors files, which readers then leave out), else none, as
 * save_pretrained writes none for one file, and an earlier conversion's
 * is removed (it would name other files: vLLM and wex read only those);
 * config.json copied from --config, and the tokenizer and generation
 * config (hf_side_files) from beside IN, else beside --config, each only
 * where OUTDIR has none.  Called with the weights still staged as
 * NAME.partial: what it writes is left at temporary names in sg, renamed
 * by hf_publish once the weights are (a full disk here fails the
 * conversion before any file of it replaces one in OUTDIR).
 */
static int hf_extras(const char *outdir, char *const *files, size_t nfiles, int index,
		     const char *in, const char *config, struct staged *sg, char *err, size_t errlen)
{
	char dirs[2][4096];
	json_t *idx, *map;
	uint64_t total = 0;
	char *text;
	int ret = -ENOMEM;

	idx = json_object();
	map = json_object();
	if (!idx || !map)
		goto out;
	for (size_t k = 0; index && k < nfiles; k++) {
		struct wex_st_file f;
		const char *base = strrchr(files[k], '/') ? strrchr(files[k], '/') + 1 : files[k];
		char staged[4200];

		snprintf(staged, sizeof(staged), "%s.partial", files[k]);
		ret = wex__st_open(staged, &f, err, errlen);
		if (ret < 0)
			goto out;
		ret = -ENOMEM;
		for (size_t i = 0; i < f.n; i++) {
			total += f.t[i].end - f.t[i].begin;
			if (json_object_set_new(map, f.t[i].name, json_string(base)) < 0) {
				wex__st_close(&f);
				goto out;
			}
		}
		wex__st_close(&f);
	}
	if (index) {
		if (json_object_set_new(idx, "metadata",
					json_pack("{s:I}", "total_size", (json_int_t)total)) < 0 ||
		    json_object_set(idx, "weight_map", map) < 0)
			goto out;
		text = json_dumps(idx, JSON_INDENT(2) | JSON_SORT_KEYS);
		if (!text)
			goto out;
		ret = write_beside(outdir, "model.safetensors.index.json", text, strlen(text), sg,
				   err, errlen);
		free(text);
		if (ret < 0)
			goto out;
	}
	ret = copy_if_absent(outdir, "config.json", config, sg, err, errlen);
	dir_of(in, dirs[0], sizeof(dirs[0]));
	dir_of(config, dirs[1], sizeof(dirs[1]));
	for (size_t i = 0; ret == 0 && i < sizeof(hf_side_files) / sizeof(hf_side_files[0]); i++)
		for (int k = 0; k < 2; k++) {
			char side[sizeof(dirs[k]) + 64];
			int n = snprintf(side, sizeof(side), "%s/%s", dirs[k], hf_side_files[i]);

			if (n > 0 && (size_t)n < sizeof(side) && access(side, R_OK) == 0) {
				ret = copy_if_absent(outdir, hf_side_files[i], side, sg, err, errlen);
				break;
			}
		}
out:
	if (ret == -ENOMEM)
		seterr(err, errlen, "out of memory");
	json_decref(map);
	json_decref(idx);
	return ret;
}

/* Removes what hf_extras staged (a conversion that failed). */
static void hf_unstage(struct staged *sg)
{
	for (size_t i = 0; i < sg->n; i++)
		unlink(sg->tmp[i]);
	sg->n = 0;
}

/* Renames what hf_extras staged into place, once the weights are; without
 * an index (`index` 0) an earlier conversion's is removed first. */
static int hf_publish(const char *outdir, int index, struct staged *sg, char *err, size_t errlen)
{
	int ret = 0;

	if (!index) {
		char path[4200];

		snprintf(path, sizeof(path), "%s/model.safetensors.index.json", outdir);
		if (unlink(path) < 0 && errno != ENOENT) {
			ret = -errno;
			seterr(err, errlen, "removing the earlier %s: %s", path, strerror(errno));
		}
	}
	for (size_t i = 0; ret == 0 && i < sg->n; i++)
		if (rename(sg->tmp[i], sg->path[i]) < 0) {
			ret = -errno;
			seterr(err, errlen, "rename %s to %s: %s", sg->tmp[i], sg->path[i],
			       strerror(errno));
		} else {
			sg->tmp[i][0] = '\0';
		}
	for (size_t i = 0; i < sg->n; i++)
		if (sg->tmp[i][0])
			unlink(sg->tmp[i]);
	sg->n = 0;
	return ret;
}

/* Syncs directory `dir` (renames and unlinks in it), best effort. */
static void sync_dir(const char *dir)
{
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (dfd >= 0) {
		fsync(dfd);
		close(dfd);
	}
}

/*
 * Removes OUTDIR's model.safetensors.index.json before the files of this
 * conversion are renamed into place where it names one of them (or does
 * not parse): from the first rename until the new index is renamed over
 * it (never, after a crash or a failed index write) it would describe
 * files it no longer matches, an earlier split over this one's shards.
 * One naming only other files stays: its checkpoint is whole until the
 * new index replaces it.  1 when it was removed.
 */
static int hf_drop_stale_index(const char *outdir, char *const *files, size_t nfiles, char *err,
			       size_t errlen)
{
	char path[4200];
	json_t *idx, *v;
	const char *k;
	int stale = 0;

	snprintf(path, sizeof(path), "%s/model.safetensors.index.json", outdir);
	if (access(path, F_OK) < 0)
		return 0;
	idx = json_load_file(path, 0, NULL);
	if (!json_is_object(json_object_get(idx, "weight_map")))
		stale = 1;
	json_object_foreach(json_object_get(idx, "weight_map"), k, v) {
		const char *fn = json_string_value(v);

		for (size_t i = 0; !stale && fn && i < nfiles; i++) {
			const char *base = strrchr(files[i], '/') ? strrchr(files[i], '/') + 1 : files[i];

			stale = !strcmp(base, fn);
		}
		if (stale)
			break;
	}
	json_decref(idx);
	if (!stale)
		return 0;
	if (unlink(path) < 0 && errno != ENOENT) {
		int e = errno;

		seterr(err, errlen, "removing the earlier %s: %s", path, strerror(e));
		return -e;
	}
	sync_dir(outdir);
	return 1;
}

/* Warns of *.safetensors files in an hf OUTDIR that this conversion did
 * not write (an earlier one's shards, or its rank-0.safetensors), and
 * returns how many: the index (written then, for one file too) leaves
 * them out, as transformers and vLLM then do, but they are not part of
 * the checkpoint. */
static size_t hf_warn_strays(const char *outdir, char *const *files, size_t nfiles)
{
	DIR *d = opendir(outdir);
	struct dirent *e;
	char first[256] = "";
	size_t n = 0;

	if (!d)
		return 0;
	while ((e = readdir(d))) {
		size_t l = strlen(e->d_name);
		int ours = 0;

		if (l <= 12 || strcmp(e->d_name + l - 12, ".safetensors"))
			continue;
		for (size_t k = 0; !ours && k < nfiles; k++) {
			const char *base = strrchr(files[k], '/') ? strrchr(files[k], '/') + 1 : files[k];

			ours = !strcmp(base, e->d_name);
		}
		if (!ours && !n++)
			snprintf(first, sizeof(first), "%s", e->d_name);
	}
	closedir(d);
	if (n)
		fprintf(stderr, "wexctl convert: warning: %s holds %zu .safetensors file%s not from this "
			"conversion (e.g. %s): model.safetensors.index.json does not name %s, but "
			"remove %s before reading %s with tools that take every file\n", outdir, n,
			n == 1 ? "" : "s", first, n == 1 ? "it" : "them", n == 1 ? "it" : "them",
			outdir);
	return n;
}

struct names {
	char **v;
	size_t cap;
};

/* Room for n names, the new slots NULL. */
static int grow_names(struct names *nm, size_t n)
{
	char **v;

	if (n <= nm->cap)
		return 0;
	v = realloc(nm->v, n * sizeof(*v));
	if (!v)
		return -ENOMEM;
	memset(v + nm->cap, 0, (n - nm->cap) * sizeof(*v));
	nm->v = v;
	nm->cap = n;
	return 0;
}

/* --progress: how far the rank being written is.  On a terminal, one line
 * redrawn in place (at most five times a second); into a log, a line every
 * 10 s.  Each rank ends with a line of its own once its files are on disk. */
struct progress {
	int on, tty, mid; /* mid: a terminal line not ended yet */
	uint32_t rank, world;
	size_t files;
	uint64_t done, total; /* bytes of this rank's copies */
	double t0, shown;
	char *err; /* for stopped() */
	size_t errlen;
};

#define PROGRESS_STEP (256ull << 20) /* bytes copied between two looks */

/* b as "12.3 MiB" (KiB below 1 MiB, GiB from 1 GiB) into buf. */
static const char *size_str(char *buf, size_t len, uint64_t b)
{
	static const char *const unit[] = { "KiB", "MiB", "GiB", "TiB" };
	double v = (double)b / 1024.0;
	int u = 0;

	while (v >= 1024.0 && u < 3) {
		v /= 1024.0;
		u++;
	}
	snprintf(buf, len, "%.1f %s", v, unit[u]);
	return buf;
}

/* what: "copied" while copying, "syncing" before the files' fsync (both
 * at most every 10 s into a log; "syncing" always on a terminal), NULL
 * for the rank's last line. */
static void progress_show(struct progress *pg, const char *what)
{
	double t = now(), el = t - pg->t0;
	char a[32], b[32];

	if (!pg->on || (what && t - pg->shown < (!pg->tty ? 10.0 : !strcmp(what, "copied") ? 0.2 : 0)))
		return;
	pg->shown = t;
	pg->mid = pg->tty && what;
	if (what)
		fprintf(stderr, "%swexctl convert: rank %u of %u: %s %s of %s (%.0f %%), %.1f s%s",
			pg->tty ? "\r" : "", pg->rank, pg->world, what,
			size_str(a, sizeof(a), pg->done), size_str(b, sizeof(b), pg->total), pg->total ? 100.0 * (double)pg->done / (double)pg->total : 100.0,
			el, pg->tty ? "\033[K" : "\n");
	else
		fprintf(stderr, "%swexctl convert: rank %u of %u: %s in %zu file%s on disk, %.1f s "
			"(%s/s)%s\n", pg->tty ? "\r" : "", pg->rank, pg->world,
			size_str(a, sizeof(a), pg->total), pg->files, pg->files == 1 ? "" : "s", el,
			size_str(b, sizeof(b), el > 0 ? (uint64_t)((double)pg->total / el) : 0),
			pg->tty ? "\033[K" : "");
	fflush(stderr);
}

static uint64_t op_bytes(const struct wex_copy_op *op)
{
	uint64_t b = op->len;

	for (uint32_t i = 0; i < op->nouter && i < 3; i++)
		b *= op->count[i];
	return b;
}

/* SIGINT, SIGTERM, SIGHUP (those not ignored): blocked while convert
 * writes, and looked for between steps, so that the files written so far
 * are removed before the signal, once unblocked, ends the process (it
 * left the ranks done as NAME.partial and the one being written as
 * NAME.partial.tmp.PID, a checkpoint's size of hidden files, more with
 * every retry; what SIGKILL leaves the next convert into OUTDIR removes:
 * drop_dead_partials). */
static void stop_signals(sigset_t *set)
{
	static const int sigs[] = { SIGINT, SIGTERM, SIGHUP };

	sigemptyset(set);
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
		struct sigaction sa;

		/* One ignored (nohup's SIGHUP, the SIGINT of a job a script
		 * runs in the background) stays ignored: blocked, it was
		 * held pending instead of dropped, and stopped the
		 * conversion the user had shielded from it. */
		if (sigaction(sigs[i], NULL, &sa) == 0 && !(sa.sa_flags & SA_SIGINFO) &&
		    sa.sa_handler == SIG_IGN)
			continue;
		sigaddset(set, sigs[i]);
	}
}

/* -EINTR, with err set, once one of stop_signals is pending. */
static int stopped(char *err, size_t errlen)
{
	sigset_t p, stop;

	stop_signals(&stop);
	if (sigpending(&p) < 0)
		return 0;
	for (int s = 1; s < NSIG; s++)
		if (sigismember(&stop, s) == 1 && sigismember(&p, s) == 1) {
			seterr(err, errlen, "interrupted (%s): the files written so far are removed",
			       strsignal(s));
			return -EINTR;
		}
	return 0;
}

/* Runs a rank's plan on the host executor, in steps of about
 * PROGRESS_STEP bytes (to show progress and to see a signal). */
static int copy_rank(const struct wex_plan *p, struct bases *bs, const struct wex_tensor *pieces,
		     struct progress *pg)
{
	struct wex_copy_op *ops;
	int ret = wex__plan_resolve(p, base_of, bs, pieces, &ops);

	if (ret < 0)
		return ret;
	pg->done = pg->total = 0;
	for (size_t i = 0; i < p->nops; i++)
		pg->total += op_bytes(&ops[i]);
	for (size_t i = 0, j; i < p->nops && ret == 0; i = j) {
		uint64_t b = 0;

		for (j = i; j < p->nops && b < PROGRESS_STEP; j++)
			b += op_bytes(&ops[j]);
		ret = wex_mem_host_copy(ops + i, j - i, 2);
		pg->done += b;
		progress_show(pg, "copied");
		if (ret == 0)
			ret = stopped(pg->err, pg->errlen);
	}
	free(ops);
	return ret;
}

/* The lock a convert holds on OUTDIR while it writes there, removed as it
 * ends: a second convert into OUTDIR is refused naming the first, and one
 * that takes it knows that the staged files there are those of a convert
 * that died (SIGKILL, the OOM killer) with no time to remove them. */
#define CONVERT_LOCK ".wexctl-convert.lock"

/* Takes OUTDIR's lock into *fd (-1 where the file system has no flock:
 * nothing is then known of other converts).  -EBUSY, with err naming its
 * holder, where another convert holds it. */
static int outdir_lock(const char *outdir, int *fd, char *err, size_t errlen)
{
	char path[4200], pid[32];
	struct stat a, b;
	int n;

	snprintf(path, sizeof(path), "%s/" CONVERT_LOCK, outdir);
	for (;;) {
		*fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
		if (*fd < 0) {
			int e = errno;

			seterr(err, errlen, "%s: %s", path, strerror(e));
			return -e;
		}
		if (flock(*fd, LOCK_EX | LOCK_NB) < 0) {
			int e = errno;
			ssize_t r = e == EWOULDBLOCK ? pread(*fd, pid, sizeof(pid) - 1, 0) : -1;

			close(*fd);
			*fd = -1;
			if (e != EWOULDBLOCK) {
				unlink(path);
				fprintf(stderr, "wexctl convert: warning: %s: flock: %s: a convert into "
					"%s at the same time is not refused, nor files an earlier one "
					"left removed\n", path, strerror(e), outdir);
				return 0;
			}
			pid[r > 0 ? r : 0] = '\0';
			pid[strcspn(pid, "\n")] = '\0';
			seterr(err, errlen, "%s is being written by another wexctl convert (pid %s, "
			       "holding %s): wait for it to end, or choose another OUTDIR", outdir,
			       pid[0] ? pid : "?", path);
			return -EBUSY;
		}
		/* Removed by the convert that held it, ending, between our
		 * open and flock: lock the one now there. */
		if (fstat(*fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
		    a.st_ino == b.st_ino)
			break;
		close(*fd);
	}
	n = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
	if (ftruncate(*fd, 0) < 0 || pwrite(*fd, pid, (size_t)n, 0) != n) {
		/* only the holder's name, for a second convert's message */
	}
	return 0;
}

/* Whether process pid is running `wexctl convert`. */
static int is_convert(long pid)
{
	char path[64], cmd[4096];
	int fd, wexctl = 0, convert = 0;
	ssize_t n;

	if (kill((pid_t)pid, 0) < 0 && errno == ESRCH)
		return 0;
	snprintf(path, sizeof(path), "/proc/%ld/cmdline", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno != ENOENT; /* alive, unknown: kept */
	n = read(fd, cmd, sizeof(cmd) - 1);
	close(fd);
	if (n <= 0)
		return 0; /* a zombie, or a kernel thread */
	cmd[n] = '\0';
	for (char *a = cmd; a < cmd + n; a += strlen(a) + 1) {
		const char *base = strrchr(a, '/') ? strrchr(a, '/') + 1 : a;

		wexctl |= !strncmp(base, "wexctl", 6);
		convert |= wexctl && !strcmp(a, "convert");
	}
	return convert;
}

/* Whether name's first len bytes name a file convert stages under a
 * temporary: NAME.safetensors.partial, the index, config.json, or one of
 * hf_side_files. */
static int staged_name(const char *name, size_t len)
{
	static const char partial[] = ".safetensors.partial";
	size_t pl = sizeof(partial) - 1;

	if (len > pl && !strncmp(name + len - pl, partial, pl))
		return 1;
	if ((len == 28 && !strncmp(name, "model.safetensors.index.json", 28)) ||
	    (len == 11 && !strncmp(name, "config.json", 11)))
		return 1;
	for (size_t i = 0; i < sizeof(hf_side_files) / sizeof(hf_side_files[0]); i++)
		if (strlen(hf_side_files[i]) == len && !strncmp(name, hf_side_files[i], len))
			return 1;
	return 0;
}

/* With OUTDIR's lock held: removes what a convert that died left there,
 * NAME.partial and NAME.partial.tmp.PID, NAME a .safetensors file, and
 * the hf index and side files' FILE.tmp.PID (but for a PID still running
 * wexctl convert, one that took no lock), saying so.  Nothing else. */
static void drop_dead_partials(const char *outdir)
{
	DIR *d = opendir(outdir);
	struct dirent *e;
	uint64_t total = 0;
	size_t n = 0;
	char sz[32];

	if (!d)
		return;
	while ((e = readdir(d))) {
		const char *name = e->d_name, *dot = strrchr(name, '.');
		size_t l = strlen(name);
		char path[4400];
		struct stat st;

		/* (Only the names convert stages: NAME.safetensors.partial,
		 * and the index and the hf files beside it as NAME.tmp.PID.) */
		if (l <= 20 || strcmp(name + l - 20, ".safetensors.partial")) {
			long pid;

			if (!dot || dot - name <= 4 || strncmp(dot - 4, ".tmp", 4) || !dot[1] ||
			    strspn(dot + 1, "0123456789") != strlen(dot + 1) || strlen(dot + 1) >= 10 ||
			    !staged_name(name, (size_t)(dot - 4 - name)))
				continue;
			pid = strtol(dot + 1, NULL, 10);
			if (pid == (long)getpid() || (pid > 0 && is_convert(pid)))
				continue;
		}
		snprintf(path, sizeof(path), "%s/%s", outdir, name);
		if (lstat(path, &st) < 0 || !S_ISREG(st.st_mode) || unlink(path) < 0)
			continue;
		fprintf(stderr, "wexctl convert: removed %s (%s, %llu bytes), staged by an earlier "
			"convert that did not end (killed)\n", path,
			size_str(sz, sizeof(sz), (uint64_t)st.st_size), (unsigned long long)st.st_size);
		total += (uint64_t)st.st_size;
		n++;
	}
	closedir(d);
	if (n > 1)
		fprintf(stderr, "wexctl convert: removed %zu files (%s, %llu bytes) left by earlier "
			"converts into %s\n", n, size_str(sz, sizeof(sz), total),
			(unsigned long long)total, outdir);
}

int wexctl_cmd_convert(int argc, char **argv)
{
	struct opts o;
	struct wex_model *m = NULL;
	struct side src = { 0 }, dst = { 0 };
	struct rank_files *rf = NULL;
	struct wex_plan_src *srcs = NULL;
	struct wex_planner *pl = NULL;
	struct bases bs = { 0 };
	struct progress pg = { 0 };
	char err[1024] = "";
	int ret = 0, rc = 1;
	struct names names = { 0 }; /* the files written, as NAME.partial until renamed */
	size_t nnames = 0;
	int staged = 1, hf, blocked = 0, lockfd = -1, index = 0, dropped = 0;
	struct staged *sg = NULL; /* hf: the index and files beside the weights */
	sigset_t stop, old;

	if ((ret = parse_opts(argc, argv, &o, 2)) != 0)
		return usage("convert", ret == 1);
	ret = model_load(&o, &m, err, sizeof(err));
	if (ret < 0)
		goto fail;
	ret = check_engines(&o, m, err, sizeof(err));
	if (ret < 0) {
		rc = 2;
		goto fail;
	}
	{
		struct wex_layout_spec s;

		ret = wex__layout_parse(o.from, &s, err, sizeof(err));
		if (ret < 0)
			goto fail;
		ret = wex__layout_world(m, &s, &src.world, err, sizeof(err));
		if (ret < 0)
			goto fail;
	}
	rf = calloc(src.world, sizeof(*rf));
	if (!rf) {
		ret = -ENOMEM;
		goto fail;
	}
	ret = open_inputs(o.pos[0], src.world, rf, err, sizeof(err));
	if (ret < 0)
		goto fail;
	/* A source file shrunk while read (a trainer still saving it) is
	 * refused after the copy, naming it, not a SIGBUS and a core. */
	wex__st_guard();
	for (uint32_t r = 0; r < src.world; r++) {
		ret = check_unique(&rf[r], r, err, sizeof(err));
		if (ret < 0)
			goto fail;
	}
	ret = side_load(m, o.from, &src, 1, err, sizeof(err));
	if (ret < 0)
		goto fail;
	/* The checkpoint's own dtype wins over config.json's torch_dtype:
	 * that of the first tensor the source layout names (a checkpoint may
	 * carry other tensors too, e.g. an F32 rotary buffer, listed first)
	 * and gives the model's dtype (not an F32 router bias, FP8 weights
	 * or their scales, whose dtypes the family pins). */
	for (size_t i = 0; i < src.l[0].nt; i++) {
		const struct wex_st_tensor *t = find_in(&rf[0], src.l[0].t[i].name);

		if (!t || src.l[0].t[i].dtype != wex__model_dtype(m))
			continue;
		if (t->dtype != wex__model_dtype(m)) {
			wex__model_set_dtype(m, t->dtype);
			side_free(&src);
			ret = side_load(m, o.from, &src, 1, err, sizeof(err));
			if (ret < 0)
				goto fail;
		}
		break;
	}
	ret = side_load(m, o.to, &dst, 0, err, sizeof(err));
	if (ret < 0)
		goto fail;
	hf = !strcmp(dst.spec.engine, "hf");
	if (hf && dst.world != 1) {
		seterr(err, sizeof(err), "--to %s: a Hugging Face checkpoint is one copy of the model, "
			 "not %u", o.to, dst.world);
		ret = -EINVAL;
		goto fail;
	}
	srcs = calloc(src.world, sizeof(*srcs));
	bs.b = calloc(src.world, sizeof(*bs.b));
	bs.n = src.world;
	if (!srcs || !bs.b) {
		ret = -ENOMEM;
		goto fail;
	}
	for (uint32_t r = 0; r < src.world; r++) {
		const struct wex_rank_layout *l = &src.l[r];

		bs.b[r] = calloc(l->nt + 1, sizeof(uint64_t));
		if (!bs.b[r]) {
			ret = -ENOMEM;
			goto fail;
		}
		for (size_t i = 0; i < l->nt; i++) {
			const struct wex_st_tensor *t = find_in(&rf[r], l->t[i].name);

			if (!t) {
				char w[512];

				seterr(err, sizeof(err), "source rank %u (%s) lacks %s", r,
				       files_str(w, sizeof(w), &rf[r], o.pos[0]), l->t[i].name);
				ret = -WEX_ELAYOUT;
				goto fail;
			}
			if (t->dtype != l->t[i].dtype || t->ndim != l->t[i].ndim ||
			    memcmp(t->shape, l->t[i].shape, t->ndim * sizeof(uint64_t))) {
				char a[200], b[200];

				seterr(err, sizeof(err),
				       "source rank %u: %s: %s is %s %s, the layout expects %s %s", r,
				       file_of(&rf[r], t), t->name, wex_dtype_name(t->dtype),
				       shape_str(a, sizeof(a), t->ndim, t->shape),
				       wex_dtype_name(l->t[i].dtype),
				       shape_str(b, sizeof(b), l->t[i].ndim, l->t[i].shape));
				ret = -WEX_ELAYOUT;
				goto fail;
			}
			bs.b[r][i] = (uint64_t)(uintptr_t)t->data;
		}
		srcs[r] = (struct wex_plan_src){ r, l->p, l->np };
	}
	/* Tensors of the source its layout does not name are not converted:
	 * harmless for an F32 rotary buffer or DeepSeek-V3's MTP layer, data
	 * lost for one the family does not describe (Llama's mlp_bias, an
	 * lm_head beside tie_word_embeddings).  Said, never dropped unsaid.
	 * Every named tensor was found once above, so the rest is the count. */
	{
		size_t unnamed = 0;
		const char *example = NULL;

		for (uint32_t r = 0; r < src.world; r++) {
			size_t nf = 0;

			for (size_t i = 0; i < rf[r].n; i++)
				nf += rf[r].f[i].n;
			if (nf <= src.l[r].nt)
				continue;
			unnamed += nf - src.l[r].nt;
			if (!example)
				example = first_unnamed(&rf[r], &src.l[r]);
		}
		if (unnamed)
			fprintf(stderr, "wexctl convert: warning: %zu tensor%s of the source %s not in "
				"layout %s and %s not converted (e.g. %s)\n", unnamed,
				unnamed == 1 ? "" : "s", unnamed == 1 ? "is" : "are", o.from,
				unnamed == 1 ? "is" : "are", example ? example : "?");
	}
	ret = wex__planner_new(srcs, src.world, &pl, err, sizeof(err));
	if (ret < 0)
		goto fail;
	stop_signals(&stop);
	blocked = sigprocmask(SIG_BLOCK, &stop, &old) == 0;
	pg.err = err;
	pg.errlen = sizeof(err);
	if (mkdir(o.pos[1], 0755) == 0) {
		/* A new OUTDIR's own entry is synced too: else a crash after
		 * the files' fsync and the renames synced in OUTDIR could
		 * still lose the directory, and every file with it. */
		char parent[PATH_MAX];

		snprintf(parent, sizeof(parent), "%s", o.pos[1]);
		sync_dir(dirname(parent));
	} else if (errno != EEXIST) {
		seterr(err, sizeof(err), "%s: %s", o.pos[1], strerror(errno));
		ret = -errno;
		goto fail;
	}
	ret = outdir_lock(o.pos[1], &lockfd, err, sizeof(err));
	if (ret < 0)
		goto fail;
	if (lockfd >= 0)
		drop_dead_partials(o.pos[1]);
	/* Every file is written as NAME.partial and renamed to its name only
	 * once all files are: a convert that fails (disk full) or is killed
	 * half way never leaves new ranks beside the old ones of an earlier
	 * conversion, a set that looks complete but mixes two.  The staging
	 * name does not end in .safetensors: never read as input. */
	uint64_t total = 0;
	size_t in_files = 0;
	pg.tty = isatty(STDERR_FILENO);
	pg.on = o.progress == 1 || (o.progress < 0 && pg.tty);
	pg.world = dst.world;
	for (uint32_t r = 0; r < src.world; r++)
		in_files += rf[r].n;
	for (uint32_t r = 0; r < dst.world; r++) {
		struct wex_rank_layout *l = &dst.l[r];
		struct wex_st_tensor *out = NULL;
		struct wex_tensor *pieces = NULL;
		struct wex_plan *p = NULL;
		struct wex_st_out *files = NULL;
		size_t *first = NULL, nfiles = 0, created = 0, base = nnames;
		uint64_t bytes = 0;

		ret = wex__layout_rank(m, &dst.spec, r, l, err, sizeof(err));
		if (ret < 0)
			goto fail;
		out = calloc(l->nt + 1, sizeof(*out));
		pieces = calloc(l->np + 1, sizeof(*pieces));
		first = calloc(l->nt + 2, sizeof(*first));
		ret = -ENOMEM;
		if (!out || !pieces || !first)
			goto rank_out;
		/* The files of this rank: one, or for hf shards of at most
		 * max_shard bytes of tensors (first[k] .. first[k + 1]). */
		first[nfiles++] = 0;
		for (size_t i = 0; i < l->nt; i++) {
			uint64_t nb = wex_dtype_size(l->t[i].dtype);

			snprintf(out[i].name, sizeof(out[i].name), "%s", l->t[i].name);
			out[i].dtype = l->t[i].dtype;
			out[i].ndim = l->t[i].ndim;
			memcpy(out[i].shape, l->t[i].shape, sizeof(out[i].shape));
			for (uint32_t d = 0; d < l->t[i].ndim; d++)
				nb *= l->t[i].shape[d];
			if (hf && bytes && bytes + nb > o.max_shard) {
				first[nfiles++] = i;
				bytes = 0;
			}
			bytes += nb;
		}
		first[nfiles] = l->nt;
		/* Shards beside a model.safetensors of an earlier conversion (or
		 * the input, resharded in place): transformers' from_pretrained
		 * takes model.safetensors before the index, and would load the
		 * old weights where every other reader loads the new. */
		if (hf && nfiles > 1) {
			char stale[4200];
			struct stat st;

			snprintf(stale, sizeof(stale), "%s/model.safetensors", o.pos[1]);
			if (lstat(stale, &st) == 0) {
				seterr(err, sizeof(err), "%s is there and this conversion writes %zu "
					 "shards (--max-shard-size %llu) beside it: transformers' "
					 "from_pretrained would load it, not the shards; remove it or "
					 "choose another OUTDIR", stale, nfiles,
					 (unsigned long long)o.max_shard);
				ret = -EEXIST;
				nfiles = 0;
				goto rank_out;
			}
		}
		/* Every file of a rank stays open until the plan has filled
		 * them all: within the open files allowed (raised to the hard
		 * limit), with room for the inputs. */
		if (nfiles > 1) {
			struct rlimit rl;
			uint64_t need = nfiles + in_files + 64;

			if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < need &&
			    rl.rlim_cur < rl.rlim_max) {
				rl.rlim_cur = rl.rlim_max < need ? rl.rlim_max : need;
				setrlimit(RLIMIT_NOFILE, &rl);
			}
			if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
			    rl.rlim_cur < need) {
				seterr(err, sizeof(err), "--max-shard-size %llu gives %zu files, open at "
					 "once with the %zu input files: more than the %llu open files "
					 "allowed (ulimit -n); raise that or the shard size",
					 (unsigned long long)o.max_shard, nfiles, in_files,
					 (unsigned long long)rl.rlim_cur);
				ret = -EMFILE;
				nfiles = 0;
				goto rank_out;
			}
		}
		files = calloc(nfiles, sizeof(*files));
		if (!files || grow_names(&names, nnames + nfiles) < 0) {
			nfiles = 0;
			goto rank_out;
		}
		/* The plan copies straight into the output files, mapped: a
		 * rank is never held in memory (a 70B model converted to hf is
		 * 140 GB), and padding rows (vocabulary) read as zeros, as the
		 * files' claimed blocks do. */
		for (size_t k = 0; k < nfiles; k++) {
			char path[4096];

			if (!hf)
				snprintf(path, sizeof(path), "%s/rank-%u.safetensors", o.pos[1], r);
			else if (nfiles == 1)
				snprintf(path, sizeof(path), "%s/model.safetensors", o.pos[1]);
			else
				snprintf(path, sizeof(path), "%s/model-%05zu-of-%05zu.safetensors", o.pos[1],
					 k + 1, nfiles);
			names.v[nnames + k] = strdup(path);
			if (!names.v[nnames + k]) {
				ret = -ENOMEM;
				goto rank_out;
			}
			snprintf(path + strlen(path), sizeof(path) - strlen(path), ".partial");
			files[k].fd = -1;
			ret = wex__st_create(path, out + first[k], first[k + 1] - first[k], &files[k], err,
					     sizeof(err));
			if (ret < 0)
				goto rank_out;
			created = k + 1;
			/* (posix_fallocate writes zeros where the file system
			 * cannot reserve blocks: not quick for 70 GB.) */
			ret = stopped(err, sizeof(err));
			if (ret < 0)
				goto rank_out;
		}
		for (size_t i = 0; i < l->np; i++) {
			pieces[i] = l->p[i];
			pieces[i].ptr = (char *)(uintptr_t)out[l->p[i].segment].data + l->p[i].offset;
		}
		ret = wex__planner_plan(pl, pieces, l->np, r, dst.world, &p, err, sizeof(err));
		if (ret < 0)
			goto rank_out;
		pg.rank = r;
		pg.files = nfiles;
		pg.t0 = pg.shown = now();
		ret = copy_rank(p, &bs, pieces, &pg);
		if (ret < 0) {
			if (ret != -EINTR)
				seterr(err, sizeof(err), "copy failed: %s", strerror(-ret));
			goto rank_out;
		}
		/* What was read of a source file shrunk or rewritten meanwhile
		 * is zeros (wex__st_guard) or a mix of two saves. */
		for (uint32_t s = 0; ret == 0 && s < src.world; s++)
			for (size_t i = 0; ret == 0 && i < rf[s].n; i++)
				ret = wex__st_changed(&rf[s].f[i], rf[s].path[i], err, sizeof(err));
		if (ret < 0)
			goto rank_out;
		total += p->stats.bytes_moved;
		progress_show(&pg, "syncing");
		created = 0; /* finish closes each file, whatever it returns */
		for (size_t k = 0; k < nfiles; k++) {
			ret = stopped(err, sizeof(err));
			if (ret < 0)
				wex__st_abort(&files[k]);
			else
				ret = wex__st_finish(&files[k], err, sizeof(err));
			if (ret < 0) {
				/* The files before k were staged; those after
				 * still need aborting. */
				for (size_t j = k + 1; j < nfiles; j++)
					wex__st_abort(&files[j]);
				nnames += k;
				goto rank_out;
			}
		}
		nnames += nfiles;
		progress_show(&pg, NULL);
rank_out:
		for (size_t k = 0; k < created; k++)
			wex__st_abort(&files[k]);
		for (size_t k = nnames; ret < 0 && names.v && k < base + nfiles; k++) {
			free(names.v[k]);
			names.v[k] = NULL;
		}
		wex__plan_free(p);
		free(files);
		free(first);
		free(out);
		free(pieces);
		wex__rank_layout_free(l);
		if (ret < 0)
			goto fail;
	}
	ret = stopped(err, sizeof(err));
	if (ret == 0 && hf) {
		/* One file: no index, as save_pretrained writes none, unless
		 * the index must keep readers from others in OUTDIR.  The
		 * index and the files copied beside the weights are written
		 * (staged) before any weights are renamed into place. */
		size_t strays = hf_warn_strays(o.pos[1], names.v, nnames);

		index = nnames > 1 || strays;
		sg = calloc(1, sizeof(*sg));
		ret = sg ? hf_extras(o.pos[1], names.v, nnames, index, o.pos[0], o.config, sg, err,
				     sizeof(err))
			 : -ENOMEM;
	}
	if (ret == 0 && hf && (ret = hf_drop_stale_index(o.pos[1], names.v, nnames, err,
							  sizeof(err))) > 0) {
		dropped = 1;
		ret = 0;
	}
	if (ret < 0)
		goto fail;
	for (size_t k = 0; k < nnames; k++) {
		char from[4200];

		snprintf(from, sizeof(from), "%s.partial", names.v[k]);
		if (rename(from, names.v[k]) < 0) {
			ret = -errno;
			if (k)
				seterr(err, sizeof(err), "rename %s to %s: %s (the %zu file%s before it "
				       "in place, it and the %zu after it not: %s mixes this conversion's "
				       "files with what it held before)", from, names.v[k],
				       strerror(errno), k, k == 1 ? "" : "s", nnames - k - 1, o.pos[1]);
			else
				seterr(err, sizeof(err), "rename %s to %s: %s (nothing renamed: %s "
				       "unchanged%s)", from, names.v[k], strerror(errno), o.pos[1],
				       dropped ? " but for its earlier model.safetensors.index.json, "
						 "removed as naming files of this conversion" : "");
			/* Those renamed are in place; the rest still staged. */
			for (size_t j = 0; j < k; j++)
				free(names.v[j]);
			memmove(names.v, names.v + k, (nnames - k) * sizeof(*names.v));
			for (size_t j = nnames - k; j < nnames; j++)
				names.v[j] = NULL;
			nnames -= k;
			goto fail;
		}
	}
	staged = 0;
	/* The renames themselves reach the disk before "converted". */
	sync_dir(o.pos[1]);
	if (hf) {
		ret = hf_publish(o.pos[1], index, sg, err, sizeof(err));
		if (ret < 0)
			goto fail;
		/* ... and the index's rename (or removal) too. */
		sync_dir(o.pos[1]);
	} else {
		/* Ranks past ours are an earlier conversion's (into OUTDIR, or
		 * in place from more ranks): left alone, but the directory
		 * now mixes two layouts and reads as neither. */
		char path[4096];
		struct stat st;

		snprintf(path, sizeof(path), "%s/rank-%u.safetensors", o.pos[1], dst.world);
		if (stat(path, &st) == 0)
			fprintf(stderr, "wexctl convert: warning: %s is not from this conversion (%s has "
				"%u rank%s): remove it and the ranks after it before reading %s as %s\n",
				path, o.to, dst.world, dst.world == 1 ? "" : "s", o.pos[1], o.to);
	}
	printf("converted %s (%s, %u rank%s) to %s (%s, %u rank%s", o.pos[0], o.from, src.world,
	       src.world == 1 ? "" : "s", o.pos[1], o.to, dst.world, dst.world == 1 ? "" : "s");
	if (hf)
		printf(", %zu file%s", nnames, nnames == 1 ? "" : "s");
	printf("): %llu bytes copied\n", (unsigned long long)total);
	rc = 0;
	goto out;
fail:
	if (pg.mid)
		fputc('\n', stderr);
	fprintf(stderr, "wexctl convert: %s\n", err[0] ? err : wex_strerror(ret));
	for (size_t k = 0; staged && k < nnames; k++) {
		char path[4200];

		snprintf(path, sizeof(path), "%s.partial", names.v[k]);
		unlink(path);
	}
	if (sg)
		hf_unstage(sg);
out:
	free(sg);
	if (lockfd >= 0) {
		char path[4200];

		/* Removed while still held: a convert that opened it since
		 * sees it gone and takes the new one. */
		snprintf(path, sizeof(path), "%s/" CONVERT_LOCK, o.pos[1]);
		unlink(path);
		close(lockfd);
	}
	for (size_t k = 0; k < names.cap; k++)
		free(names.v[k]);
	free(names.v);
	wex__planner_free(pl);
	for (uint32_t r = 0; bs.b && r < bs.n; r++)
		free(bs.b[r]);
	free(bs.b);
	free(srcs);
	for (uint32_t r = 0; rf && r < src.world; r++) {
		for (size_t i = 0; i < rf[r].n; i++) {
			wex__st_close(&rf[r].f[i]);
			free(rf[r].path[i]);
		}
		free(rf[r].f);
		free(rf[r].path);
	}
	free(rf);
	side_free(&src);
	side_free(&dst);
	wex__model_free(m);
	/* A signal that came meanwhile ends the process now, as it would
	 * have, with nothing of this conversion left half done. */
	if (blocked)
		sigprocmask(SIG_SETMASK, &old, NULL);
	return rc;
}
