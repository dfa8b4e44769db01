/* SPDX-License-Identifier: MIT */
/*
 * plan_exec.c - turns a plan's relative ops into absolute copies and runs
 * them with the host backend.  The plan names producer (rank, segment)
 * pairs and consumer pieces; only the caller knows where those live in its
 * address space, hence the callback.
 */
#include <errno.h>
#include <stdlib.h>

#include "plan.h"
#include "vmm/backend.h"

int wex__plan_resolve(const struct wex_plan *p,
		      uint64_t (*src_base)(void *arg, uint32_t rank, uint32_t seg), void *arg,
		      const struct wex_tensor *dst, struct wex_copy_op **out)
{
	struct wex_copy_op *ops = calloc(p->nops ? p->nops : 1, sizeof(*ops));

	if (!ops)
		return -ENOMEM;
	for (size_t i = 0; i < p->nops; i++) {
		const struct wex_plan_op *o = &p->ops[i];
		uint64_t base = src_base(arg, o->src_rank, o->src_seg);

		if (!base || !dst[o->dst_piece].ptr) {
			free(ops);
			return -EINVAL;
		}
		ops[i].src = base + o->src_off;
		ops[i].dst = (uint64_t)(uintptr_t)dst[o->dst_piece].ptr + o->dst_off;
		ops[i].len = o->len;
		ops[i].nouter = o->nouter;
		for (int k = 0; k < 3; k++) {
			ops[i].count[k] = o->count[k];
			ops[i].src_stride[k] = o->src_stride[k];
			ops[i].dst_stride[k] = o->dst_stride[k];
		}
	}
	*out = ops;
	return 0;
}

int wex__plan_exec_host(const struct wex_plan *p,
			uint64_t (*src_base)(void *arg, uint32_t rank, uint32_t seg), void *arg,
			const struct wex_tensor *dst, int threads)
{
	struct wex_copy_op *ops;
	int ret = wex__plan_resolve(p, src_base, arg, dst, &ops);

	if (ret < 0)
		return ret;
	ret = wex_mem_host_copy(ops, p->nops, threads);
	free(ops);
	return ret;
}
