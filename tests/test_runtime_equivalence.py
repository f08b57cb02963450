"""Real torchrun runs (gloo, CPU): every parallel layout trains exactly like one process.

Each case emits a run dir for the tiny model; autoplan's program (autoplan.runtime.train) runs its
3 plain-SGD check steps, and their losses and global gradient norms are compared with the
single-process reference (relative difference <= 1e-4, as ``autoplan run`` compares them:
autoplan.verify.summarize). Where every rank holds its stage's parameters whole (ZeRO 0-1, no
expert parallelism), each holds as many as the planner prices on it.

The cases of one world size run in one torchrun, one after the other in one process group
(tests/equivalence_worker.py): starting torchrun and importing torch in each worker cost more
than most cases' steps. ``autoplan run``'s own path (launch.sh, torchrun, one run dir) is tested
in tests/test_verify_run.py and tests/test_cpu_prediction.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from equivalence_worker import CHECK_STEPS

from autoplan.emit.writer import write_run_dir
from autoplan.runtime.config import load_run_spec
from autoplan.runtime.reference import reference_losses
from autoplan.runtime.support import unsupported_reason
from autoplan.verify import read_results, summarize
from hwprofiles.errors import RunError
from hwprofiles.load import load_cluster
from simulator.cost.rank_view import rank_plan
from simulator.cost.stage import stage_costs
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import parse_plan
from simulator.specs import ModelSpec

TINY = load_model("tiny")
# Llama-style variant: RoPE, RMSNorm, SwiGLU, grouped-query attention, untied embeddings.
TINY_LLAMA = TINY.model_copy(
    update={
        "name": "tiny-llama",
        "num_query_groups": 2,
        "ffn_hidden_size": 352,
        "activation": "swiglu",
        "tie_embeddings": False,
        "position_embedding_type": "rope",
        "normalization": "RMSNorm",
    }
)

# A mixture of experts: 4 SwiGLU experts, 2 per token.
TINY_MOE = TINY_LLAMA.model_copy(update={"name": "tiny-moe", "num_experts": 4, "moe_router_topk": 2})

CASES = [
    ("t=2,ckpt=full", TINY),
    ("p=2,schedule=1f1b,ckpt=selective", TINY),
    ("p=2,schedule=gpipe", TINY_LLAMA),
    ("p=2,v=2,schedule=interleaved,ckpt=full", TINY),
    ("p=2,schedule=zbh1", TINY_LLAMA),  # zero bubble: input and weight gradients in separate passes
    ("p=2,d=2,schedule=zbh1,ckpt=full", TINY),
    ("t=2,p=2,schedule=zbh1,ckpt=full", TINY_LLAMA),  # with DTensor tensor parallelism
    ("p=2,schedule=zbv", TINY_LLAMA),  # ZB-V: rank 0 runs chunks 0 and 3, rank 1 chunks 1 and 2
    ("p=2,d=2,zero=1,schedule=zbv,ckpt=full", TINY),  # tied embeddings: one parameter in rank 0's two stages
    ("d=2,zero=1", TINY),
    ("d=2,zero=2,ckpt=full", TINY),
    ("d=2,zero=3", TINY_LLAMA),
    ("d=4,zero=3,hsdp=2", TINY),  # hybrid sharding: FSDP2 on a (replicate, shard) mesh
    ("d=4,zero=2,hsdp=2,ckpt=full", TINY_LLAMA),  # hybrid ZeRO-2 (parameters kept after forward)
    ("t=2,p=2,ckpt=full", TINY),  # the tied embedding split over t: its two stages' shards summed
    ("t=2,d=2,sp=1,zero=1", TINY),
    ("t=2,d=2,zero=3", TINY),  # FSDP2 over the tensor-parallel DTensors, the split embedding among them
    ("p=2,d=2,zero=1", TINY),  # tied embeddings: the last stage's copy weighs 0 in the norm
    # context parallelism: sequence chunks, K/V all-gathered, gradients over the d*cp ranks
    ("cp=2,ckpt=selective", TINY_LLAMA),
    ("cp=2,d=2,zero=1,ckpt=full", TINY),  # learned positions offset by the chunk
    ("t=2,cp=2,sp=1", TINY_LLAMA),  # with DTensor tensor and sequence parallelism
    ("p=2,cp=2,schedule=1f1b", TINY),
    ("cp=2,d=2,zero=3", TINY_LLAMA),  # FSDP2 over the d*cp ranks
    # mixture of experts: every expert on every rank, then split over ep ranks (all-to-all dispatch)
    ("d=2,zero=1", TINY_MOE),
    ("d=2,ep=2", TINY_MOE),
    ("d=4,ep=2,ckpt=full", TINY_MOE),  # two expert groups: the experts' gradients over their replicas
    ("p=2,d=2,ep=2", TINY_MOE),
]


WORKER = Path(__file__).with_name("equivalence_worker.py")
TEST = "test_parallel_losses_equal_single_process"


def emit_run_dir(out: Path, model: ModelSpec, plan_text: str, global_batch: int = 4) -> Path:
    """A run dir for ``plan_text`` (world size t*cp*p*d on one 'node') at ``out``, no prediction stored."""
    job = _job(model, plan_text, global_batch)
    assert unsupported_reason(model, job.plan, job.m) is None
    write_run_dir(job, {}, out)
    return out


def _job(model: ModelSpec, plan_text: str, global_batch: int = 4) -> Job:
    """``plan_text`` on one 'node' of t*cp*p*d A100s."""
    items = dict(kv.split("=") for kv in plan_text.split(","))
    world = int(items.get("t", 1)) * int(items.get("cp", 1)) * int(items.get("p", 1)) * int(items.get("d", 1))
    base = load_cluster("dgx-a100-80gb")
    cluster = base.model_copy(update={"node": base.node.model_copy(update={"gpus_per_node": world})})
    plan, _ = parse_plan(plan_text, model, world, global_batch)
    return Job(model, cluster, plan, global_batch)


def _priced_parameters(job: Job) -> list[float]:
    """The parameters the planner prices on each pipeline rank (simulator.cost.stage)."""
    return [stage.params for stage in stage_costs(job.model, job.cluster, rank_plan(job.plan))]


class Batches:
    """The check-step results of the collected cases, run by world size: one torchrun each."""

    def __init__(self, cases: list[tuple[str, ModelSpec]], root: Path) -> None:
        self.cases, self.root = cases, root
        self.stderr: dict[int, str] = {}

    def run_dir(self, plan_text: str, model: ModelSpec) -> Path:
        return self.root / f"case{self.cases.index((plan_text, model))}"

    def summary(self, plan_text: str, model: ModelSpec) -> dict[str, Any]:
        """``autoplan run --json``'s comparison for one case (autoplan.verify.summarize)."""
        world = _job(model, plan_text).cluster.num_gpus
        if world not in self.stderr:
            self._launch(world)
        run_dir = self.run_dir(plan_text, model)
        try:
            ranks = read_results(run_dir / "results", world)
        except RunError as e:
            pytest.fail(f"{e}\nthe batch's stderr ends: {self.stderr[world][-3000:]}")
        spec = load_run_spec(run_dir)
        return summarize(spec, ranks, reference_losses(spec, CHECK_STEPS), None)

    def _launch(self, world: int) -> None:
        dirs = [
            str(emit_run_dir(self.run_dir(text, model), model, text))
            for text, model in self.cases
            if _job(model, text).cluster.num_gpus == world
        ]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world)]
        env = {**os.environ, "PYTHONPATH": str(WORKER.parent.parent)}
        done = subprocess.run([*cmd, str(WORKER), *dirs], capture_output=True, text=True, timeout=900, env=env)
        self.stderr[world] = done.stderr


@pytest.fixture(scope="module")
def batches(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Batches:
    """The cases this session collected (all of CASES, or those ``-k`` selects)."""
    collected = [item.callspec.params for item in request.session.items if getattr(item, "originalname", "") == TEST]
    cases = [(params["plan_text"], params["model"]) for params in collected]
    return Batches(cases, tmp_path_factory.mktemp("equivalence"))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("plan_text,model", CASES, ids=[f"{c[0]}:{c[1].name}" for c in CASES])
def test_parallel_losses_equal_single_process(batches, plan_text, model):
    result = batches.summary(plan_text, model)
    assert len(result["losses"]) == CHECK_STEPS
    assert result["max_rel_loss_diff"] <= 1e-4, (result["losses"], result["reference_losses"])
    assert result["max_rel_grad_norm_diff"] <= 1e-4, (result["grad_norms"], result["reference_grad_norms"])
    assert result["loss_match"] is True
    job = _job(model, plan_text)
    if job.plan.zero <= 1 and job.plan.ep == 1:  # every rank holds its stage's whole (TP-split) parameters
        priced = _priced_parameters(job)
        assert [r["parameters"] for r in result["ranks"]] == [priced[r["pp"]] for r in result["ranks"]]
