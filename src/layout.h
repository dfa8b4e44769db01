/* SPDX-License-Identifier: MIT */
/*
 * layout.h - the model adaptation layer (DESIGN section 5).
 *
 * A model is a family (adapters/families/NAME.json: canonical tensors with
 * shapes written in terms of config symbols) plus a Hugging Face
 * config.json.  An engine layout (adapters/engines/NAME.json) says which
 * physical tensors each rank holds and how they are cut (kinds: rep, col,
 * row, qkv_group, qkv_cat, vocab; per expert or stacked experts), or that
 * each rank holds every canonical tensor whole ("canonical": hf) or its
 * torch.chunk of dim 0 over the fsdp ranks ("chunk_dim0": FSDP2).  The
 * interpreter turns (model, layout, rank) into that rank's physical tensors,
 * each a list of pieces in canonical coordinates.  Pure computation over
 * files read once at load; nothing here blocks except wex__model_load,
 * wex__model_pin_engine, and wex__layout_world / wex__layout_rank, which
 * read the engine's file when it was not pinned with the model.
 */
#ifndef WEX_LAYOUT_H
#define WEX_LAYOUT_H

#include <stddef.h>
#include <stdint.h>
#include "wex.h"

struct wex_model;

/* Loads the family for config.json at `config_path` from `adapters_dir`
 * (NULL: $WEX_ADAPTERS when set, used as given; else the source tree's
 * adapters/, then /usr/local/share/wex/adapters).  Blocks (reads files).  Errors: -ENOENT,
 * -EINVAL (bad JSON or no family for the model type; message in err),
 * -ENOMEM. */
int wex__model_load(const char *config_path, const char *adapters_dir, struct wex_model **out,
		    char *err, size_t errlen);
/* Same from config.json text. */
int wex__model_from_text(const char *config_json, const char *adapters_dir,
			 struct wex_model **out, char *err, size_t errlen);
void wex__model_free(struct wex_model *m);
const char *wex__model_family(const struct wex_model *m);
/* The adapters directory the model's family was read from (its engines/
 * hold the engine layouts). */
const char *wex__model_adapters(const struct wex_model *m);
/* A config symbol (e.g. "nh", "nkv", "vocab", "layers"); -1 when unknown. */
int64_t wex__model_sym(const struct wex_model *m, const char *name);
int wex__model_dtype(const struct wex_model *m);
/* Overrides config.json's torch_dtype (e.g. with a checkpoint's own). */
void wex__model_set_dtype(struct wex_model *m, int dtype);

/* "engine:k=v,k=v".  Known keys: tp pp dp ep etp first last fuse_shared
 * dp_attention dense_tp dp_lm_head fsdp vpp a2a embed_rep vocab_div no_mla sp_moe,
 * and stages=N/N/...
 * (the layers of each pipeline stage, in order). */
#define WEX_LAYOUT_PARAMS 18
#define WEX_LAYOUT_MAX_STAGES 256
struct wex_layout_spec {
	char engine[32];
	/* tp pp dp ep etp first last fuse_shared dp_attention dense_tp dp_lm_head
	 * fsdp vpp a2a embed_rep vocab_div no_mla sp_moe */
	int64_t v[WEX_LAYOUT_PARAMS];
	int set[WEX_LAYOUT_PARAMS];
	/* stages=: nstages entries of 1 to 2^20 layers (0 entries: not given,
	 * the engine's rule splits the layers); the rest of stages[] is 0, so
	 * that equal specs compare equal byte for byte. */
	uint32_t nstages;
	uint32_t stages[WEX_LAYOUT_MAX_STAGES];
};
int wex__layout_parse(const char *s, struct wex_layout_spec *spec, char *err, size_t errlen);

/* One physical tensor of a rank is a struct wex_layout_tensor (wex.h):
 * pieces [first, first+npieces) of the rank's piece array.  A piece's
 * offset is bytes from the physical tensor's start, its strides are the
 * physical tensor's (elements), its segment is the physical tensor's
 * index.  Bytes not covered by a piece are padding. */

struct wex_rank_layout {
	struct wex_layout_tensor *t;
	size_t nt;
	struct wex_tensor *p;
	size_t np;
	uint64_t total_bytes;   /* sum of physical tensor sizes */
};

/* Ranks are rank = tp_rank + tp*(fsdp_rank + fsdp*(dp_rank + dp*pp_rank));
 * with dp_attention=1 dp is carved out of the tp ranks and does not
 * multiply them: rank = tp_rank + tp*pp_rank.
 * Number of ranks of the layout, after checking that it can exist (every
 * size divides what it must).  Errors: -WEX_ELAYOUT with the number that
 * does not fit in err; -ENOENT for an unknown engine, -EINVAL for an
 * engine file that cannot be read or parsed. */
int wex__layout_world(const struct wex_model *m, const struct wex_layout_spec *spec,
		      uint32_t *world, char *err, size_t errlen);
/* Reads adapters/engines/ENGINE.json once and keeps it with m: layouts of
 * that engine then read no file (a wex_layout_t's ranks after a chdir, a
 * relative adapters directory, or the files changed lay out the engine
 * that was opened).  Errors: -ENOENT (no such engine), -EINVAL (its file
 * cannot be read or parsed; err says why), as wex__layout_world's. */
int wex__model_pin_engine(struct wex_model *m, const char *engine, char *err, size_t errlen);
/* The physical tensors of `rank`.  Free with wex__rank_layout_free. */
int wex__layout_rank(const struct wex_model *m, const struct wex_layout_spec *spec, uint32_t rank,
		     struct wex_rank_layout *out, char *err, size_t errlen);
void wex__rank_layout_free(struct wex_rank_layout *l);

/* Every canonical tensor, whole (start 0, extent = shape, C order, offset 0,
 * segment = its index).  *t is malloc'ed. */
int wex__model_canonical(const struct wex_model *m, struct wex_tensor **t, size_t *n);

#endif
