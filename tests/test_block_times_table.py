"""The batch estimate's block times of many keys at once (simulator.cost.block_times.block_times_table,
what simulator.cost.block_work stacks) equal those of each key alone (block_times), bit for bit:
one pacing rule, called with arrays or numbers."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest

from autoplan.space import precisions
from hwprofiles.load import load_cluster, with_nodes
from simulator.cost.block_times import BlockTimes, block_times, block_times_table
from simulator.cost.pass_time import PassTimes
from simulator.cost.rank_view import rank_model
from simulator.model_files import load_model

KEYS = [(t, sp, mb, prec) for t in (1, 2, 4) for sp in (False, True) for mb in (1, 2) for prec in ("bf16", "fp8")]
CASES = [  # model, node, nodes, kernels, attention, loss, context parallel
    ("llama3-70b", "dgx-h100", 8, "fused", "sdpa", "fp32", 1),  # fp8 and bf16 keys together
    ("llama3-70b", "dgx-h100", 8, "fused-tp-overlap", "te-fused", "fused", 1),  # userbuffers' overlap at sp, t > 1
    ("gpt3-175b", "dgx-a100-80gb", 37, "eager", "flash-attn-2", "split", 1),  # eager ops, no fp8 on an A100
    ("llama3-8b", "dgx-h100", 2, "fused", "sdpa", "chunked", 2),  # context parallel: priced key by key
]


def _flat(b: BlockTimes) -> list:
    """The fields of ``b``, PassTimes opened."""
    out = []
    for f in fields(BlockTimes):
        v = getattr(b, f.name)
        out += [getattr(v, g.name) for g in fields(PassTimes)] if isinstance(v, PassTimes) else [v]
    return out


def _assert_each_key(model, cluster, keys, kernels, attention, loss, busy=None) -> None:
    """Each key with its own loss: ``loss`` at t > 1 and torch's at t = 1, as a stack whose
    tensor parallelism changes its loss runs them (simulator.runtime_spec.Runtime.loss)."""
    losses = [loss if t > 1 else "torch" for t, *_ in keys]
    table = _flat(block_times_table(model, cluster, keys, kernels, attention, busy, losses))
    for k, (t, sp, mb, prec) in enumerate(keys):
        ranks = None if busy is None else busy[k]
        one = _flat(block_times(model, cluster, t, sp, mb, prec, kernels, attention, ranks, losses[k]))
        got = [float(np.broadcast_to(x, len(keys))[k]) for x in table]
        assert got == one, (t, sp, mb, prec)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[3]}-cp{c[6]}")
def test_keys_paced_at_once_equal_each_alone(case):
    name, node, nodes, kernels, attention, loss, cp = case
    model, cluster = load_model(name), load_cluster(node, nodes)
    model = rank_model(model, cp)
    keys = [k for k in KEYS if k[3] in precisions(cluster.gpu, {})]
    _assert_each_key(model, cluster, keys, kernels, attention, loss)
    _assert_each_key(model, with_nodes(cluster, 2 * nodes), keys[::-1], kernels, attention, loss)  # another pace


def test_cpu_ranks_sharing_cores_per_key():
    """On a CPU node each key has its own busy ranks (the processor-sharing slowdown per key)."""
    model, cluster = load_model("tiny"), load_cluster("localhost-cpu")
    keys = [(t, sp, mb, "bf16") for t in (1, 2) for sp in (False, True) for mb in (1, 2, 4)]
    busy = [1.0 + 0.25 * k for k in range(len(keys))]
    _assert_each_key(model, cluster, keys, "eager", "sdpa", "split", busy)
