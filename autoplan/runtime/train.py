"""Worker entry point: ``torchrun ... -m autoplan.runtime.train -- --run-dir DIR [options]``.

Reads the run dir's ``plan.json``, joins the process group (gloo on CPU, nccl on GPU;
nothing else changes), builds the (pp, dp, tp) DeviceMesh and runs two phases:

1. timing: AdamW with gradient clipping, bf16 on GPU (fp32 on CPU), ``--warmup`` untimed
   steps then ``--steps`` timed steps; per-rank peak memory over this phase;
2. check: a fresh model trained ``--check-steps`` steps with plain SGD (no clipping) in fp32,
   whose losses and global gradient norms ``autoplan run`` compares with a single process.

Each rank logs to ``<out>/rank<r>.log`` and writes ``<out>/rank<r>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from autoplan.runtime.config import RunSpec, load_run_spec
from autoplan.runtime.data_parallel import local
from autoplan.runtime.measure import (
    Stopwatch,
    host_memory,
    peak_memory_bytes,
    peak_reserved_bytes,
    reset_host_peak,
    reset_peak,
    rss_bytes,
)
from autoplan.runtime.rank import RankLayout
from autoplan.runtime.trainer import DistEnv, Trainer, import_plan_modules
from simulator.cost.rank_view import rank_plan


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="autoplan.runtime.train", allow_abbrev=False)
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--steps", type=int, default=10, help="timed AdamW steps (0: skip timing)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps before timing")
    ap.add_argument("--check-steps", type=int, default=3, help="SGD steps for the equivalence check (0: skip)")
    ap.add_argument("--out", type=Path, default=None, help="results/log directory (default RUN_DIR/results)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--pg-timeout", type=float, default=600.0, help="seconds a collective may wait")
    return ap.parse_args([a for a in argv if a != "--"] if argv[:1] == ["--"] else argv)


class RankLog:
    """Line-buffered per-rank log file (also echoed to stderr), plus a heartbeat file.

    A daemon thread rewrites ``rank<r>.heartbeat`` every second with the time and how many
    lines the rank has logged. It keeps beating while the main thread waits in a collective,
    so when a run hangs, ``autoplan run`` can tell a stopped rank (stale heartbeat) from the
    ranks waiting for it, or find the rank that is behind (fewest lines).
    """

    def __init__(self, out: Path, rank: int):
        out.mkdir(parents=True, exist_ok=True)
        self.f: TextIO = open(out / f"rank{rank}.log", "a", buffering=1)  # noqa: SIM115 (open for the process lifetime)
        self.rank = rank
        self.lines = 0
        self.heartbeat = out / f"rank{rank}.heartbeat"
        threading.Thread(target=self._beat, daemon=True).start()

    def __call__(self, msg: str) -> None:
        line = f"[rank {self.rank}] {time.strftime('%H:%M:%S')} {msg}"
        self.f.write(line + "\n")
        self.lines += 1
        print(line, file=sys.stderr, flush=True)

    def _beat(self) -> None:
        while True:
            tmp = self.heartbeat.with_suffix(".tmp")
            tmp.write_text(json.dumps({"time": time.time(), "lines": self.lines}))
            os.replace(tmp, self.heartbeat)
            time.sleep(1.0)


def uses_cuda(choice: str, local_world: int) -> bool:
    """Whether the ranks run on CUDA: when asked, or when every local rank can have its own GPU."""
    return choice == "cuda" or (
        choice == "auto" and torch.cuda.is_available() and torch.cuda.device_count() >= local_world
    )


def pick_device(choice: str, local_rank: int, local_world: int) -> torch.device:
    """CUDA when asked or when every local rank can have its own GPU (:func:`uses_cuda`); else CPU."""
    if uses_cuda(choice, local_world):
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def host_threads(offload: str, device: str, local_world: int) -> int | None:
    """Intra-op threads of a GPU rank whose optimizer steps on the host (offload=cpu): the
    host's cores shared by the node's ranks, since the launcher sets OMP_NUM_THREADS=1 (right
    for CPU ranks, one per core) and FSDP2's CPUOffloadPolicy steps AdamW on the host: fused on
    the 16 threads of the H100 host it stepped 1.48 B parameters in 0.31 s
    (benchmarks/data/h100-2026-11-26b/offload.json), where torch's foreach step on one thread runs
    about 0.09 G parameters per second (13 s for them). None: leave the launcher's setting."""
    if offload != "cpu" or device != "cuda":
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_world))


def warm_up_runtime(device: torch.device) -> None:
    """One tiny forward/backward, an optimizer step and a collective, so that PyTorch's one-time
    allocations (autograd engine, kernels, communication buffers, and the modules torch.optim
    imports at its first step: 823 of them, torch._dynamo among them, +74 MiB of RSS on torch
    2.13 CPU, 2026-11-26) count in the RSS baseline, not as training memory."""
    layer = torch.nn.Linear(8, 8, device=device)
    layer(torch.ones(2, 8, device=device)).sum().backward()
    torch.optim.AdamW(layer.parameters()).step()
    t = torch.ones(8, device=device)
    dist.all_reduce(t)
    dist.barrier()


def release_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def timed_phase(spec: RunSpec, env: DistEnv, warmup: int, steps: int, log: RankLog) -> dict[str, Any]:
    """AdamW steps; mean time of the timed ones (data generation excluded) and peak memory: CUDA's
    over all the steps; on CPU the peak RSS over all the steps, and the anonymous memory at the
    resident set's peak over the timed steps (:meth:`HostMemory.anon_peak_since`: the code pages
    the warm-up steps first ran left out), None where Linux does not report it."""
    reset_peak(env.device)
    trainer = Trainer(spec, env, "adamw", mixed_precision=True)
    losses: list[float | None] = []
    for k in range(warmup):
        losses.append(trainer.step(*trainer.batch(k), spec.train.max_norm).loss)
        log(f"warmup step {k + 1}/{warmup} loss {losses[-1]}")
    dist.barrier()
    at_reset = host_memory() if env.device.type == "cpu" and reset_host_peak() else None
    step_times = []
    for k in range(warmup, warmup + steps):
        batch = trainer.batch(k)
        with Stopwatch(env.device) as sw:
            losses.append(trainer.step(*batch, spec.train.max_norm).loss)
        step_times.append(sw.elapsed)
        log(f"timed step {k - warmup + 1}/{steps} {sw.elapsed:.4f}s loss {losses[-1]}")
    dist.barrier()
    peak = peak_memory_bytes(env.device)
    reserved = peak_reserved_bytes(env.device)
    at_end = host_memory() if at_reset else None
    del trainer
    release_memory(env.device)
    return {
        "step_time_s": sum(step_times) / steps,
        "step_times_s": step_times,
        "losses": losses,
        "peak_memory_bytes": peak,
        "peak_reserved_bytes": reserved,
        "peak_anon_bytes": at_end.anon_peak_since(at_reset) if at_end and at_reset else None,
    }


def check_phase(spec: RunSpec, env: DistEnv, steps: int, log: RankLog) -> dict[str, Any]:
    """Plain-SGD steps without clipping: per-step global loss and gradient norm, and the
    parameters this rank holds (the elements of its local tensors: its shards where split)."""
    trainer = Trainer(spec, env, "sgd", mixed_precision=False)
    held = sum(local(p).numel() for p in trainer.params)
    losses, norms = [], []
    for k in range(steps):
        r = trainer.step(*trainer.batch(k), None)
        losses.append(r.loss)
        norms.append(r.grad_norm)
        log(f"check step {k + 1}/{steps} loss {r.loss} grad_norm {r.grad_norm:.6f}")
    del trainer
    release_memory(env.device)
    return {"losses": losses, "grad_norms": norms, "local_parameters": held}


def run(args: argparse.Namespace, own_group: bool = True) -> None:
    """This rank's run of ``args.run_dir``: join the process group, build the mesh, run the
    phases, write ``rank<r>.json``. ``own_group`` False: the default process group is already up
    and stays up (a caller that checks several run dirs in one group: tests/equivalence_worker.py)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    out = args.out or args.run_dir / "results"
    log = RankLog(out, rank)
    log(f"pid {os.getpid()} start")
    spec = load_run_spec(args.run_dir)
    if world != spec.world_size:
        raise SystemExit(f"world size {world} does not match the plan's {spec.world_size} ranks (t*cp*p*d)")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    device = pick_device(args.device, local_rank, local_world)
    threads = host_threads(spec.plan.offload, device.type, local_world)
    if threads is not None:
        torch.set_num_threads(threads)
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=args.pg_timeout)
    if own_group:
        dist.init_process_group(backend, timeout=timeout, device_id=device if device.type == "cuda" else None)
    plan = rank_plan(spec.plan)  # context parallelism: d*cp data-parallel ranks (simulator.cost.rank_view)
    if plan.hsdp:  # hybrid sharding: FSDP2 shards over dp_shard, replicates over dp_replicate
        shape = (plan.p, plan.replicas, plan.shard_group, plan.t)
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=("pp", "dp_replicate", "dp_shard", "tp"))
        mesh[("dp_replicate", "dp_shard")]._flatten("dp")  # the whole data-parallel group, as "dp"
    else:
        mesh = init_device_mesh(device.type, (plan.p, plan.d, plan.t), mesh_dim_names=("pp", "dp", "tp"))
    layout = RankLayout.of(plan, rank)
    env = DistEnv(rank=rank, world=world, local_rank=local_rank, device=device, mesh=mesh, layout=layout)
    log(
        f"{backend} on {device}; plan {plan.to_string()}; pp={layout.pp_rank} dp={layout.dp_rank} "
        f"tp={layout.tp_rank} chunks={layout.chunks}"
    )
    import_plan_modules(plan)
    warm_up_runtime(device)
    baseline = host_memory()
    result: dict[str, Any] = {
        "rank": rank,
        "pid": os.getpid(),
        "device": device.type,
        "backend": backend,
        "coords": {"pp": layout.pp_rank, "dp": layout.dp_rank, "tp": layout.tp_rank},
        "has_last_stage": layout.has_last,
        "rss_baseline_bytes": baseline.rss if baseline else rss_bytes(),
        "anon_baseline_bytes": baseline.anon if baseline else None,
    }
    if args.steps > 0:
        result["timed"] = timed_phase(spec, env, args.warmup, args.steps, log)
    if args.check_steps > 0:
        result["check"] = check_phase(spec, env, args.check_steps, log)
    (out / f"rank{rank}.json").write_text(json.dumps(result, indent=1))
    log("done")
    dist.barrier()
    if own_group:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args)
    except BaseException as e:
        ok_exit = isinstance(e, SystemExit) and e.code in (0, None)
        if not ok_exit and not isinstance(e, KeyboardInterrupt):
            rank = os.environ.get("RANK", "?")
            out = args.out or args.run_dir / "results"
            out.mkdir(parents=True, exist_ok=True)
            with open(out / f"rank{rank}.log", "a") as f:
                f.write(f"[rank {rank}] FAILED: {e!r}\n{traceback.format_exc()}")
        raise


if __name__ == "__main__":
    main()
