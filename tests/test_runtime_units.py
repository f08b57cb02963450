"""Single-process tests of the runtime's pieces (no torchrun): layout, init, chunks, data, support."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autoplan.runtime.config import RunSpec, load_run_spec, run_spec_to_dict
from autoplan.runtime.rank import RankLayout, chunk_layer_ids
from autoplan.runtime.support import unsupported_reason
from autoplan.runtime.zero1 import shard_pieces
from simulator.model_files import load_model
from simulator.plan import Plan
from simulator.specs import ModelSpec

LLAMA_LIKE = ModelSpec(
    name="tiny-llama",
    num_layers=4,
    hidden_size=64,
    num_attention_heads=4,
    num_query_groups=2,
    ffn_hidden_size=96,
    vocab_size=128,
    seq_length=16,
    activation="swiglu",
    tie_embeddings=False,
    position_embedding_type="rope",
    normalization="RMSNorm",
)


def test_planner_side_modules_do_not_import_torch():
    code = (
        "import sys, autoplan.runtime.support, autoplan.runtime.config, autoplan.emit.writer, autoplan.verify; "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


@pytest.mark.parametrize(
    "plan,m,expected",
    [
        (Plan(t=2, p=2, d=1), 4, None),
        (Plan(d=4, zero=3, offload="nvme"), 4, "offload=nvme"),
        (Plan(d=4, zero=1, offload="cpu"), 4, "offload=cpu with zero=1"),
        (Plan(d=4, zero=3, offload="cpu"), 4, None),
        (Plan(p=4, schedule="1f1b"), 2, "at least as many microbatches"),
        (Plan(p=4, schedule="gpipe"), 2, None),
        (Plan(p=2, v=2, schedule="interleaved"), 3, "multiple of p=2"),
    ],
)
def test_unsupported_reason(plan, m, expected):
    reason = unsupported_reason(load_model("tiny"), plan, m)
    assert reason is None if expected is None else expected in reason


def test_layout_coordinates_and_looped_chunks():
    plan = Plan(t=2, p=2, d=2, v=2, schedule="interleaved")
    coords = [(lay.pp_rank, lay.dp_rank, lay.tp_rank) for lay in (RankLayout.of(plan, r) for r in range(8))]
    assert coords == [(pp, dp, tp) for pp in range(2) for dp in range(2) for tp in range(2)]
    first, last = RankLayout.of(plan, 0), RankLayout.of(plan, 7)
    assert first.chunks == [0, 2] and first.has_first and not first.has_last
    assert last.chunks == [1, 3] and last.has_last
    assert [last.global_rank(1, 1, 1), first.global_rank(0, 1, 0)] == [7, 2]


def test_chunk_layers_and_recompute_modes():
    from autoplan.runtime.model import layer_recompute

    model = load_model("tiny")
    plan = Plan(p=2, layers=(1, 3), recompute=((1, 0), (1, 1)))
    assert [list(chunk_layer_ids(model, plan, c)) for c in range(2)] == [[0], [1, 2, 3]]
    modes = layer_recompute(model, plan.chunk_layers(4), plan.chunk_recompute(4))
    assert modes == {0: "full", 1: "full", 2: "selective", 3: "none"}


def test_zero1_shards_cover_every_value_once():
    """Sizes 5, 3, 4 (12 values) over 5 ranks pad to 15, shards of 3: rank 0 holds p0[0:3];
    rank 1 p0[3:5] + p1[0:1]; rank 2 p1[1:3] + p2[0:1]; rank 3 p2[1:4]; rank 4 only padding."""
    sizes = [5, 3, 4]
    got = [shard_pieces(sizes, 5, r) for r in range(5)]
    assert {length for length, _ in got} == {3}
    assert [[(pc.index, pc.param_start, pc.shard_start, pc.length) for pc in pieces] for _, pieces in got] == [
        [(0, 0, 0, 3)],
        [(0, 3, 0, 2), (1, 0, 2, 1)],
        [(1, 1, 0, 2), (2, 0, 2, 1)],
        [(2, 1, 0, 3)],
        [],
    ]
    # every value of every parameter lands in exactly one shard, for any split
    for ranks in (1, 2, 3, 4, 7, 16):
        seen = [[0] * n for n in sizes]
        for r in range(ranks):
            length, pieces = shard_pieces(sizes, ranks, r)
            assert length * ranks >= sum(sizes) > (length - 1) * ranks
            for pc in pieces:
                assert pc.shard_start >= 0 and pc.shard_start + pc.length <= length
                for k in range(pc.param_start, pc.param_start + pc.length):
                    seen[pc.index][k] += 1
        assert all(c == 1 for row in seen for c in row)


@pytest.mark.parametrize("spec", [load_model("tiny").model_copy(update={"seq_length": 16}), LLAMA_LIKE])
@pytest.mark.parametrize("ckpt", ["none", "selective", "full"])
def test_pipeline_chunks_compose_to_the_full_model(spec, ckpt):
    """Chunks built separately (own init, own tied copy) chain to the full model's logits and loss."""
    import torch

    from autoplan.runtime.data import global_batch
    from autoplan.runtime.init import init_parameters
    from autoplan.runtime.model import GPT, lm_loss

    modes = {i: ckpt for i in range(spec.num_layers)}
    full = GPT(spec, range(spec.num_layers), True, True, modes)
    chunks = [GPT(spec, ids, i == 0, i == 2, modes) for i, ids in enumerate([[0], [1, 2], [3]])]
    for m in [full, *chunks]:
        init_parameters(m, seed=7, std=0.02, tied=spec.tie_embeddings)
    x, y = global_batch(0, 3, spec.seq_length, spec.vocab_size, seed=7)
    ref = full(x)
    h = x
    for c in chunks:
        h = c(h)
    assert torch.equal(h, ref)
    lm_loss(ref, y).backward()
    assert full.head.out.weight is full.embed.tok.weight or not spec.tie_embeddings
    assert all(p.grad is not None for p in full.parameters())


def test_data_parallel_shards_cover_the_global_batch():
    import torch

    from autoplan.runtime.data import global_batch, local_batch

    x, y = global_batch(3, 8, 16, 128, seed=1)
    parts = [local_batch(3, 8, 16, 128, 1, r, 4) for r in range(4)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x) and torch.equal(torch.cat([p[1] for p in parts]), y)
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_plan_json_round_trip(tmp_path: Path):
    import json

    spec = RunSpec(
        model=LLAMA_LIKE, plan=Plan(t=2, p=2, d=2, layers=(1, 3), recompute=((1, 0), (0, 2))), global_batch=8
    )
    (tmp_path / "plan.json").write_text(json.dumps(run_spec_to_dict(spec)))
    back = load_run_spec(tmp_path)
    assert back == spec and back.num_microbatches == 4 and back.world_size == 8


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        ({"d": 0}, "key 'd': expected a positive integer, got 0"),  # was a ZeroDivisionError
        ({"mb": None}, "key 'mb': expected integers, got None"),  # was a TypeError
        ({"d": "2"}, "key 'd': expected integers, got '2'"),  # was read as 2
        ({"layers": [1.0, 3]}, "key 'layers': expected integers"),
        ({"schedule": 1}, "key 'schedule': expected a string, got 1"),
        ({"schedule": "evil"}, "key 'schedule': expected one of"),  # was run without a word
        ({"t": -1}, "key 't': expected a positive integer"),
        ({"layers": [1, 2, 3]}, "layers= gives 3 stage sizes, expected p\\*v = 2"),
        ({"global_batch": 1e400}, "expected a positive integer, got inf"),  # was an OverflowError
        ({"global_batch": 7}, "global batch 7 is not divisible by d\\*mb"),
    ],
)
def test_a_hand_edited_plan_json_meets_the_rules_a_plan_string_does(tmp_path: Path, edit, why):
    """autoplan run reads plan.json's plan as --plan reads a plan string: one line naming the file."""
    import json

    from hwprofiles.errors import AutoplanError

    spec = RunSpec(model=LLAMA_LIKE, plan=Plan(t=2, p=2, d=2), global_batch=8)
    data = run_spec_to_dict(spec)
    for key, value in edit.items():
        (data if key == "global_batch" else data["plan"])[key] = value
    (tmp_path / "plan.json").write_text(json.dumps(data))
    with pytest.raises(AutoplanError, match=f"plan.json: key '(plan|global_batch)': .*{why}") as caught:
        load_run_spec(tmp_path)
    assert caught.value.exit_code == 2


@pytest.mark.parametrize("theta", [10_000.0, 500_000.0])
def test_rope_uses_the_models_rotary_base(theta):
    """Head dim 4: pair (x1, x3) turns by position / theta^(2/4); at position 1 a unit x1 becomes
    (cos w, sin w) with w = theta^-0.5 (0.01 for Llama 2's 10000, 0.0014142 for Llama 3's 500000)."""
    from autoplan.runtime.model import apply_rope

    x = torch.zeros(1, 1, 2, 4)
    x[..., 1] = 1.0
    out = apply_rope(x, theta)[0, 0, 1]
    w = theta**-0.5
    assert out.tolist() == pytest.approx([0.0, math.cos(w), 0.0, math.sin(w)], abs=1e-7)
