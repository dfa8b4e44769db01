#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""fsdp_glue_test - FSDP2 shards registered through wex.torch_util, CPU
PyTorch on host segments, through a real wexd.

fsdp_rows agrees with torch.chunk (padded with empty chunks, as FSDP2's
_chunk_with_empty) for every size to 40 rows over 1 to 9 ranks.  A
producer group of 4 ranks (clients of one child process, each with its own
host segment) registers only its dim-0 chunk of every tensor, by boxes=
(model fsdp-boxes: 5 rows over 4 ranks are 2,2,1,0, the empty one left
out), and an HSDP group of 2 shards x 2 replicas registers DTensor-like
parameters (model fsdp-hsdp), and 8 DTensor shards of at most 10 rows
(model fsdp-wide) leave rank 7 with no row of any parameter: it registers
no memory and an empty table, and publishes each version with the others;
an engine attaches whole tensors, copy-syncs
each version and finds them equal (torch.equal) to what the producers
wrote.  Placements FSDP2 tensors do not have here (Shard(1) from
shard_placement_fn, _StridedShard of FSDP over TP, Partial, Shard(0) on
two mesh dims), a local shard of other rows than torch.chunk's, FSDP1's
parameters (marked _fsdp_flattened: the FlatParameter, or 1-D slices of
it with use_orig_params=True), DeepSpeed ZeRO-3's (empty between steps:
not left out as empty) and bad boxes are refused naming the parameter.

PyTorch here is Debian's 1.13, which has no DTensor: StandInDTensor stands
in for torch.distributed.tensor.DTensor with the attributes the glue reads
(to_local, placements, device_mesh, shape; placements with is_shard,
is_replicate and dim; a mesh with size and get_coordinate).  A real FSDP2
parameter is registered by tests/gpu/torch_check.py fsdp (torch_fsdp:
torch 2.4+, one GPU, a 1-way shard, its only rank holding every row;
written, not yet run on a GPU).

Needs Debian's python3-torch (exit 77 with the reason without it).
Environment: WEX_LIB, WEXD_BIN, PYTHONPATH with adapters/python.
"""
import sys
import unittest

try:
    import torch
except ImportError as e:
    if __name__ == "__main__" and len(sys.argv) == 1:
        print("fsdp_glue_test: skipped: no PyTorch for %s: %s" % (sys.executable, e))
        sys.exit(77)
    raise

import wex
from wexd_harness import WexdProducerCase
from wex import torch_util

SHAPES = (("embed.weight", (7, 6), torch.bfloat16),
          ("layers.0.norm.weight", (5,), torch.float32),
          ("layers.0.mlp.weight", (3, 8), torch.bfloat16),
          ("lm_head.weight", (10, 4), torch.bfloat16))
# (model, shards, replicas, how the ranks register)
# fsdp-wide: 8 shards of at most 10 rows, ranks 5-7 hold no row of some
# parameters and rank 7 none of any (no memory, an empty table).
GROUPS = (("fsdp-boxes", 4, 1, "boxes"), ("fsdp-hsdp", 2, 2, "dtensor"),
          ("fsdp-wide", 8, 1, "dtensor"))


def expected(v):
    g = torch.Generator().manual_seed(v)
    return {n: torch.randn(s, generator=g).to(d) for n, s, d in SHAPES}


class Shard:
    def __init__(self, dim):
        self.dim = dim

    def is_shard(self, dim=None):
        return dim is None or dim == self.dim

    def is_replicate(self):
        return False


class _StridedShard(Shard):
    pass


class Replicate:
    def is_shard(self, dim=None):
        return False

    def is_replicate(self):
        return True


class Partial(Replicate):
    def is_replicate(self):
        return False


class Mesh:
    def __init__(self, shape, coord):
        self.shape, self.coord = shape, coord

    def size(self, i):
        return self.shape[i]

    def get_coordinate(self):
        return list(self.coord)


class StandInDTensor:
    """Stands in for a DTensor parameter (torch 1.13 has none): the global
    shape, the local shard, placements and mesh."""

    def __init__(self, shape, local, placements, mesh):
        self.shape, self._local = torch.Size(shape), local
        self.placements, self.device_mesh = tuple(placements), mesh

    def detach(self):
        return self

    def to_local(self):
        return self._local


def chunk(t, n, r):
    """FSDP2's shard r of n: torch.chunk's, or empty past the last."""
    c = torch.chunk(t, n, dim=0)
    return c[r] if r < len(c) else t.new_empty((0,) + tuple(t.shape[1:]))


def producer():
    ranks = []
    for model, n, m, how in GROUPS:
        for rank in range(n * m):
            s, rep = rank % n, rank // n
            c = wex.Client(wex.ROLE_PRODUCER, model, rank=rank, world_size=n * m)
            lay, off = [], 0
            for name, shape, dt in SHAPES:
                a, rows = torch_util.fsdp_rows(shape[0], n, s)
                local = (rows,) + shape[1:]
                lay.append((name, shape, dt, local, a, off))
                nb = torch.empty(local, dtype=dt).numel() * torch.empty((), dtype=dt).element_size()
                off += (nb + 4095) & ~4095
            if off:
                seg, base = c.segment_alloc(wex.SEG_HOST, off)
                mine = {name: torch_util.from_ptr(base + o, local, dt, "cpu")
                        for name, _, dt, local, _, o in lay}
                segs = [(seg, base, off)]
            else:
                mine = {name: torch.empty(local, dtype=dt) for name, _, dt, local, _, _ in lay}
                segs = []
            if how == "boxes":
                items = list(mine.items())
                boxes = {name: (shape, a) for name, shape, _, _, a, _ in lay}
            else:
                mesh = Mesh((m, n), (rep, s))
                items = [(name, StandInDTensor(shape, mine[name], (Replicate(), Shard(0)), mesh))
                         for name, shape, _, _, _, _ in lay]
                boxes = None
            got = torch_util.register_module(c, items, segments=segs, boxes=boxes)
            assert off or got == [], got
            ranks.append((c, n, s, mine))
    for line in sys.stdin:
        v = int(line)
        want = expected(v)
        for c, n, s, mine in ranks:
            c.begin_write(v, 5000)
            for name, t in mine.items():
                t.copy_(chunk(want[name], n, s))
        for c, *_ in ranks:
            c.publish(v)
        print("published %d" % v, flush=True)
    for c, *_ in ranks:
        c.close()


class Rows(unittest.TestCase):
    def test_torch_chunk(self):
        for d0 in range(41):
            t = torch.arange(d0)
            for n in range(1, 10):
                for r in range(n):
                    a, rows = torch_util.fsdp_rows(d0, n, r)
                    want = chunk(t, n, r)
                    self.assertEqual(rows, want.numel(), (d0, n, r))
                    if rows:
                        self.assertEqual(a, int(want[0]), (d0, n, r))
        self.assertEqual([torch_util.fsdp_rows(5, 4, r)[1] for r in range(4)], [2, 2, 1, 0])
        with self.assertRaises(ValueError):
            torch_util.fsdp_rows(5, 4, 4)


class TableClient:
    """A producer client's register_tensors, keeping the table."""

    def register_tensors(self, table):
        self.table = table


class Refused(unittest.TestCase):
    """Refused before any client call (client None)."""

    def refused(self, items, *needles, boxes=None):
        with self.assertRaises(ValueError) as e:
            torch_util.register_module(None, items, segments=[(1, 0, 1 << 20)], boxes=boxes)
        for s in needles:
            self.assertIn(s, str(e.exception))

    def test_placements(self):
        local = torch.zeros(2, 4)
        for pl, what in (((Shard(1),), "Shard(1)"), ((_StridedShard(0),), "_StridedShard(0)"),
                         ((Partial(),), "Partial()"), ((Shard(0), Shard(0)), "Shard(0) on mesh dim 1")):
            mesh = Mesh((2,) * len(pl), (0,) * len(pl))
            self.refused([("w.weight", StandInDTensor((4, 4), local, pl, mesh))], "w.weight", what)
        # 5 rows over 4: rank 3 holds none, not 1 (torch.chunk, not 2,1,1,1).
        self.refused([("w.weight", StandInDTensor((5, 4), torch.zeros(1, 4), (Shard(0),),
                                                  Mesh((4,), (3,))))],
                     "w.weight", "holds 0 rows")

    def test_fsdp1(self):
        # FSDP1 (FullyShardedDataParallel) marks its FlatParameter and, with
        # use_orig_params=True, each original parameter _fsdp_flattened;
        # sharded, a (4, 3) weight is a 1-D slice of the rank's flat
        # parameter (here 5 of its 12 elements), which would register as
        # a whole tensor of shape (5,) under the canonical name.
        for name, shape in (("layers.0.mlp.weight", (5,)), ("_flat_param", (40,))):
            p = torch.nn.Parameter(torch.zeros(shape))
            p._fsdp_flattened = True
            with self.assertRaises(ValueError) as e:
                torch_util.register_module(TableClient(), [(name, p)],
                                           segments=[(1, p.data_ptr(), 4 * shape[0])])
            for s in (name, "FSDP1", "(%d,)" % shape[0]):
                self.assertIn(s, str(e.exception))

    def test_zero3(self):
        # DeepSpeed ZeRO-3 leaves a partitioned parameter's data empty
        # between steps (its shard is in ds_tensor): it would be left out
        # as empty, the rank registering an empty table and publishing.
        w = torch.nn.Parameter(torch.empty(0))
        w.ds_id, w.ds_numel, w.ds_shape = 3, 12, torch.Size((4, 3))
        with self.assertRaises(ValueError) as e:
            torch_util.register_module(TableClient(), [("layers.0.mlp.weight", w)], segments=[])
        for s in ("layers.0.mlp.weight", "ZeRO-3", "(4, 3)"):
            self.assertIn(s, str(e.exception))

    def test_cpu_offload(self):
        # FSDP2 with CPUOffloadPolicy keeps each shard in (pinned) host
        # memory: the refusal says why, and names the offload.
        d = StandInDTensor((4, 4), torch.zeros(2, 4), (Shard(0),), Mesh((2,), (0,)))
        with self.assertRaises(ValueError) as e:
            torch_util.register_module(TableClient(), [("w.weight", d)])
        for s in ("w.weight", "is on cpu", "CPUOffloadPolicy", "segments="):
            self.assertIn(s, str(e.exception))

    def test_boxes(self):
        t = torch.zeros(2, 4)
        self.refused([("w", t)], "w", "[4, 6) of 5", boxes={"w": ((5, 4), 4)})
        self.refused([("w", t)], "w", "2-dim", boxes={"w": ((8,), 0)})
        self.refused([("w", t)], "x", "not among", boxes={"x": ((8, 4), 0)})
        self.refused([("w", t)], "w", "(shape, start)", boxes={"w": 3})
        d = StandInDTensor((4, 4), t, (Shard(0),), Mesh((2,), (0,)))
        self.refused([("w", d)], "w", "leave it out", boxes={"w": ((4, 4), 0)})


class FsdpGroups(WexdProducerCase):
    def test_copy(self):
        for model, _, _, _ in GROUPS:
            c = wex.Client(wex.ROLE_CONSUMER, model, group="engine", timeout_ms=10000)
            self.addCleanup(c.close)
            setattr(self, model, c)
        own = {model: {n: torch.zeros(s, dtype=d) for n, s, d in SHAPES} for model, *_ in GROUPS}
        for v in (1, 2):
            self.publish(v)
            want = expected(v)
            for model, *_ in GROUPS:
                c = getattr(self, model)
                torch_util.attach_module(c, own[model].items())
                r = c.sync(wex.SYNC_COPY, min_version=v)
                self.assertEqual(r.version, v)
                for n in want:
                    self.assertTrue(torch.equal(own[model][n], want[n]),
                                    "%s v%d: %s differs" % (model, v, n))


if __name__ == "__main__":
    if sys.argv[1:] == ["producer"]:
        producer()
    else:
        unittest.main()
