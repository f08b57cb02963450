"""CP-SAT layer partition and recomputation choice."""

import pytest

from autoplan.partition import optimize_partition
from hwprofiles import load_cluster
from simulator.analytic import estimate
from simulator.job import Job
from simulator.plan import Plan
from simulator.specs import ModelSpec


def heavy_ends_model() -> ModelSpec:
    """A huge vocabulary makes the embedding (first stage) and LM head (last stage) heavy."""
    return ModelSpec(
        name="heavy-ends",
        num_layers=16,
        hidden_size=2048,
        num_attention_heads=16,
        vocab_size=256000,
        seq_length=2048,
        tie_embeddings=False,
    )


def test_partition_beats_or_equals_uniform_on_heavy_ends():
    model = heavy_ends_model()
    cluster = load_cluster("dgx-a100-80gb", nodes=1)
    plan = Plan(t=2, p=4, d=1, mb=1, ckpt="full")
    job = Job.make(model, cluster, plan, 32)
    uniform = estimate(job)
    part = optimize_partition(model, cluster, plan, job.m, choose_recompute=False)
    assert part is not None
    optimized = estimate(Job.make(model, cluster, part.plan, 32))
    assert optimized.step_time <= uniform.step_time * (1 + 1e-9)
    # the LM head (2*b*s*h*V/t FLOPs, ~10 layers' worth at V = 256k) makes the last stage
    # heavy: it gets the fewest transformer layers, fewer than the uniform 4
    layers = part.plan.chunk_layers(model.num_layers)
    assert layers[-1] == min(layers) < 4
    assert optimized.step_time < uniform.step_time * 0.99


def test_recompute_selection_fits_with_less_recompute_than_full():
    model = ModelSpec(
        name="m",
        num_layers=24,
        hidden_size=4096,
        num_attention_heads=32,
        vocab_size=51200,
        seq_length=2048,
        attention="materialized",  # the s x s scores make ckpt=none overflow
    )
    cluster = load_cluster("dgx-a100-80gb", nodes=1)
    base = Plan(t=1, p=1, d=8, mb=4, zero=3)
    none = estimate(Job.make(model, cluster, base.replace(ckpt="none"), 64))
    full = estimate(Job.make(model, cluster, base.replace(ckpt="full"), 64))
    assert not none.fits and full.fits
    part = optimize_partition(model, cluster, base.replace(ckpt="full"), 2, choose_recompute=True)
    assert part is not None
    chosen = estimate(Job.make(model, cluster, part.plan, 64))
    assert chosen.fits
    assert chosen.time_breakdown["recompute"] < full.time_breakdown["recompute"]
    assert chosen.step_time < full.step_time


def test_no_partition_when_nothing_fits():
    model = ModelSpec(
        name="m", num_layers=8, hidden_size=16384, num_attention_heads=128, vocab_size=51200, seq_length=2048
    )
    cluster = load_cluster("dgx-a100-80gb", nodes=1)
    assert optimize_partition(model, cluster, Plan(t=1, p=2, d=1, mb=1, ckpt="full"), 4) is None


@pytest.mark.parametrize("v", [2, 4])
def test_interleaved_chunks_on_a_device_stay_balanced(v):
    model = heavy_ends_model()
    cluster = load_cluster("dgx-a100-80gb", nodes=1)
    plan = Plan(t=2, p=2, d=2, mb=1, ckpt="full", schedule="interleaved", v=v)
    part = optimize_partition(model, cluster, plan, 8, choose_recompute=False)
    assert part is not None
    layers = part.plan.chunk_layers(model.num_layers)
    for dev in range(2):
        mine = layers[dev::2]
        assert max(mine) - min(mine) <= 1
