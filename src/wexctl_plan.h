/* SPDX-License-Identifier: MIT */
/*
 * wexctl_plan.h - the planner's wexctl subcommands.  argv[0] is the
 * subcommand name.  Both return a process exit status (0 ok, 1 failure,
 * 2 usage) and print errors to stderr.  They block (files, computation).
 *
 *   wexctl plan --config config.json --from LAYOUT --to LAYOUT
 *               [--rank K] [--json] [--adapters DIR]
 *   wexctl convert --config config.json --from LAYOUT --to LAYOUT
 *               [--adapters DIR] IN OUTDIR
 *
 * LAYOUT is ENGINE[:k=v,...], e.g. megatron:tp=4,pp=2,dp=2 or vllm:tp=2.
 */
#ifndef WEX_WEXCTL_PLAN_H
#define WEX_WEXCTL_PLAN_H

int wexctl_cmd_plan(int argc, char **argv);
int wexctl_cmd_convert(int argc, char **argv);

#endif
