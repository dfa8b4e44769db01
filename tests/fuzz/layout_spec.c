/* SPDX-License-Identifier: MIT */
/*
 * layout_spec.c - fuzzes wex__layout_parse, the reader of wexctl's
 * --from/--to LAYOUT strings ("megatron:tp=8,pp=16,ep=64").
 *
 * A spec it accepts must be what the string said: an engine name of 1 to
 * 31 letters, digits, '_' or '-' (it names a file: no path) that begins the
 * string, known keys set to values
 * in [0, 2^20] written as digits (not empty, no sign or blank), unset
 * keys 0; stages= a list of 1 to 256 layer counts in [1, 2^20], digits
 * separated by '/' (every '/' after the engine lies between digits), the
 * unused entries 0; and writing it back and parsing that again gives the
 * same spec, byte for byte.  A refusal must say why.
 */
#include <ctype.h>
#include <errno.h>
#include <string.h>

#include "fuzz.h"
#include "layout.h"

static const char *const keys[] = {
	"tp", "pp", "dp", "ep", "etp", "first", "last", "fuse_shared", "dp_attention", "dense_tp",
	"dp_lm_head", "fsdp", "vpp", "a2a", "embed_rep", "vocab_div", "no_mla", "sp_moe"
};
/* A key added to the layout spec must be added here too: a missing one
 * would be written back as "(null)=". */
_Static_assert(sizeof(keys) / sizeof(keys[0]) == WEX_LAYOUT_PARAMS,
	       "keys[] lists every layout parameter");

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct wex_layout_spec spec, again;
	char *s = fz_strdup(data, size), text[4096], err[256] = "";
	size_t el, l;
	int ret;

	ret = wex__layout_parse(s, &spec, err, sizeof(err));
	if (ret < 0) {
		FZ_ASSERT(ret == -EINVAL, "returned %d", ret);
		FZ_ASSERT(err[0], "refused \"%s\" without a reason", s);
		free(s);
		return 0;
	}
	FZ_ASSERT(ret == 0, "returned %d", ret);
	el = strnlen(spec.engine, sizeof(spec.engine));
	FZ_ASSERT(el > 0 && el < sizeof(spec.engine), "engine of %zu bytes", el);
	FZ_ASSERT(!strchr(spec.engine, ':') && !strncmp(spec.engine, s, el) &&
		  (s[el] == '\0' || s[el] == ':'),
		  "engine \"%s\" is not what \"%s\" begins with", spec.engine, s);
	for (size_t i = 0; i < el; i++)
		FZ_ASSERT(isalnum((unsigned char)spec.engine[i]) || spec.engine[i] == '_' ||
				  spec.engine[i] == '-',
			  "engine \"%s\" accepted: it could name a path", spec.engine);
	for (const char *p = strchr(s, ':'); p && (p = strchr(p, '=')); p++)
		FZ_ASSERT(p[1] >= '0' && p[1] <= '9', "\"%s\" accepted: a value that is not digits",
			  s);
	for (const char *p = strchr(s, ':'); p && (p = strchr(p, '/')); p++)
		FZ_ASSERT(p[-1] >= '0' && p[-1] <= '9' && p[1] >= '0' && p[1] <= '9',
			  "\"%s\" accepted: a '/' not between digits", s);
	FZ_ASSERT(spec.nstages <= WEX_LAYOUT_MAX_STAGES, "%u stages", spec.nstages);
	for (uint32_t i = 0; i < WEX_LAYOUT_MAX_STAGES; i++)
		FZ_ASSERT(i < spec.nstages ? spec.stages[i] >= 1 && spec.stages[i] <= (1 << 20)
					   : spec.stages[i] == 0,
			  "stage %u of %u holds %u layers", i, spec.nstages, spec.stages[i]);
	l = (size_t)snprintf(text, sizeof(text), "%s", spec.engine);
	for (int k = 0; k < WEX_LAYOUT_PARAMS; k++) {
		FZ_ASSERT(spec.set[k] == 0 || spec.set[k] == 1, "set[%d] = %d", k, spec.set[k]);
		FZ_ASSERT(spec.set[k] || spec.v[k] == 0, "%s unset but %lld", keys[k],
			  (long long)spec.v[k]);
		FZ_ASSERT(spec.v[k] >= 0 && spec.v[k] <= (1 << 20), "%s = %lld", keys[k],
			  (long long)spec.v[k]);
		if (spec.set[k])
			l += (size_t)snprintf(text + l, sizeof(text) - l, "%s%s=%lld",
					      strchr(text, ':') ? "," : ":", keys[k],
					      (long long)spec.v[k]);
	}
	for (uint32_t i = 0; i < spec.nstages; i++)
		l += (size_t)snprintf(text + l, sizeof(text) - l, "%s%u",
				      i ? "/" : strchr(text, ':') ? ",stages=" : ":stages=",
				      spec.stages[i]);
	FZ_ASSERT(l < sizeof(text), "\"%s\" written back in %zu bytes", s, l);
	ret = wex__layout_parse(text, &again, err, sizeof(err));
	FZ_ASSERT(ret == 0, "\"%s\" (from \"%s\") refused: %s", text, s, err);
	FZ_ASSERT(!memcmp(&spec, &again, sizeof(spec)), "\"%s\" and \"%s\" differ", text, s);
	free(s);
	return 0;
}
