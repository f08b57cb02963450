"""``autoplan run``: launch an emitted run dir with torchrun, check it, compare with the prediction.

0. A run whose CPU ranks cannot fit this machine's available memory is refused before anything
   starts (:func:`check_host_memory`; ``--allow-oversubscribe`` launches it anyway).
1. ``launch.sh`` runs the program on this machine (one node, t*p*d processes; gloo on CPU),
   under a timeout on the whole run; a crashed or hung worker ends it with a
   :class:`hwprofiles.errors.RunError` naming the rank and its last log lines, and no worker
   is left behind.
2. The single-process reference (same model, seed and data) runs here; its SGD losses and
   gradient norms are compared with the parallel run's.
3. The prediction: on CPU, the simulator on the ``localhost-cpu`` node with as many ranks
   as the run (``AUTOPLAN_CPU_NODE`` names another node or cluster profile, e.g. one just
   written by ``autoplan calibrate``); on GPU, the prediction stored in ``plan.json`` at emit time.
   On CPU, when steps are timed, the host's speed against that profile's, measured before and
   after the run (:mod:`hwprofiles.calibrate.speed`: a shared VM's speed drifts by tens of percent
   within an hour), and the prediction at that speed beside the profile's.

Progress goes to the ``log`` callable (default: this module's logger at INFO level).
torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplan.launch import last_lines, launch
from autoplan.runtime.config import RunSpec, load_plan_json, load_run_spec
from hwprofiles.errors import InputError, RunError
from hwprofiles.units import GiB

if TYPE_CHECKING:
    from hwprofiles.calibrate.speed import HostSpeed
    from simulator.job import Job

logger = logging.getLogger(__name__)

CHECK_STEPS = 3
REL_TOL = 1e-4
CPU_NODE = "localhost-cpu"


def _info(msg: str) -> None:
    logger.info("%s", msg)


# ----------------------------------------------------------------------------- comparing


def read_results(out: Path, world: int) -> list[dict[str, Any]]:
    ranks = []
    for r in range(world):
        path = out / f"rank{r}.json"
        if not path.is_file():
            raise RunError(f"worker rank {r} wrote no results ({path}); its last log lines: {last_lines(out, r)}")
        ranks.append(json.loads(path.read_text()))
    return ranks


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def compare(parallel: list[float], reference: list[float]) -> float:
    """Largest relative difference over the steps."""
    return max((_rel(a, b) for a, b in zip(parallel, reference)), default=0.0)


def predict(device: str, stored: dict[str, Any] | None, cpu: dict[str, Any] | None) -> dict[str, Any] | None:
    """Prediction for this run: on CPU ``cpu`` (:func:`cpu_prediction`), else the one from emit time."""
    return cpu if device == "cpu" else stored


def cpu_prediction(cpu: Job | None) -> dict[str, Any] | None:
    """The simulator's prediction of the CPU run ``cpu`` (:func:`cpu_job`); None without it."""
    if cpu is None:
        return None
    from simulator import simulate

    return simulate(cpu, "analytic").to_dict()


def cpu_job(spec: RunSpec, log: Callable[[str], None]) -> Job | None:
    """The run as the simulator sees it on this machine's CPU: the localhost-cpu node (or
    ``AUTOPLAN_CPU_NODE``) with as many ranks as the run, running autoplan's program; None, said
    with ``log``, where it cannot be made."""
    try:
        from autoplan.runtime.support import program_job
        from hwprofiles.load import load_cluster
        from simulator.job import Job
    except ImportError as e:
        log(f"autoplan run: no prediction ({e})")
        return None
    try:
        cluster = load_cluster(os.environ.get("AUTOPLAN_CPU_NODE") or CPU_NODE)
    except InputError as e:
        log(f"autoplan run: no prediction ({e})")
        return None
    if cluster.gpus_per_node != spec.world_size or cluster.nodes != 1:
        node = cluster.node.model_copy(update={"gpus_per_node": spec.world_size})
        cluster = cluster.model_copy(update={"node": node, "nodes": 1})
    return program_job(Job.make(spec.model, cluster, spec.plan, spec.global_batch))


def check_host_memory(spec: RunSpec, cpu: Job | None, prediction: dict[str, Any] | None) -> None:
    """InputError, before anything starts, when the run's ranks will run on this machine's CPU
    (``cpu``: :func:`cpu_job`, None otherwise) and their predicted memory exceeds what it has
    available (launched, they would end in the out-of-memory killer): per rank, the tensors of the
    CPU ``prediction`` (:func:`cpu_prediction`) and the runtime a gloo rank holds besides (the CPU
    profile's ``memory_reserved_GiB``, measured by ``autoplan calibrate``)."""
    available = available_memory_bytes()
    if available is None or cpu is None or prediction is None:
        return
    tensors = prediction["peak_memory_gib"]
    runtime = cpu.cluster.gpu.memory_reserved_GiB
    per_rank = tensors + runtime
    need = spec.world_size * per_rank
    if need * GiB > available:
        raise InputError(
            f"{spec.world_size} CPU ranks need about {need:,.1f} GiB ({spec.world_size} x {per_rank:.2f} GiB: "
            f"{tensors:.2f} GiB of tensors predicted per rank + {runtime:.2f} GiB of PyTorch runtime) but this "
            f"machine has {available / GiB:.1f} GiB available; emit a plan with fewer ranks, or pass "
            "--allow-oversubscribe to run it anyway"
        )


def available_memory_bytes() -> float | None:
    """The memory this machine can give new processes (Linux MemAvailable: free plus reclaimable
    caches), else its free pages; None when neither is known."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _pct(measured: float | None, predicted: float | None) -> float | None:
    if measured is None or not predicted:
        return None
    return 100.0 * (measured - predicted) / predicted


def _anonymous(rank: dict[str, Any]) -> bool:
    """Does the CPU rank's result carry its anonymous memory (:func:`_tensor_memory`)?"""
    return rank["timed"].get("peak_anon_bytes") is not None and rank.get("anon_baseline_bytes") is not None


def _tensor_memory(rank: dict[str, Any]) -> float:
    """Bytes the training held at its peak: CUDA max allocated; on CPU the growth of the rank's
    anonymous memory (heap, tensors) at its resident peak over the timed steps, over the same
    before the model was built, or, where Linux does not report it, the growth of the peak RSS
    over the RSS then. Neither counts the PyTorch runtime that was loaded before the model was
    built, as the prediction does not count it either; the anonymous figure also leaves out the
    pages of libtorch's code that the first steps run (file-backed, shared by the ranks; 7.6-8.5
    MiB of the tiny model's runs on this project's VM, 2026-11-29), which is not training memory."""
    timed = rank["timed"]
    if rank["device"] == "cuda":
        return float(timed["peak_memory_bytes"])
    if _anonymous(rank):
        return float(max(0, timed["peak_anon_bytes"] - rank["anon_baseline_bytes"]))
    return float(max(0, timed["peak_memory_bytes"] - rank["rss_baseline_bytes"]))


def _peak_reserved(timed: list[dict[str, Any]]) -> float | None:
    """The CUDA allocator's largest peak reserved over the ranks (GiB), None on CPU."""
    reserved = [t["peak_reserved_bytes"] for t in timed if t.get("peak_reserved_bytes") is not None]
    return max(reserved) / GiB if reserved and len(reserved) == len(timed) else None


def summarize(
    spec: RunSpec, ranks: list[dict[str, Any]], ref: dict[str, list[float]] | None, prediction: dict[str, Any] | None
) -> dict[str, Any]:
    """The ``run --json`` dict (docs/design.md section 3) from per-rank results and the reference."""
    result: dict[str, Any] = dict(prediction) if prediction else {"plan": spec.plan.to_dict(spec.num_microbatches)}
    last = next(r for r in ranks if r["has_last_stage"])
    timed = [r["timed"] for r in ranks if r.get("timed")]
    all_timed = len(timed) == len(ranks)
    measured_time = max(t["step_time_s"] for t in timed) if all_timed else None
    peak = max(_tensor_memory(r) for r in ranks) / GiB if all_timed else None
    pred_time = prediction.get("step_time_s") if prediction else None
    pred_mem = prediction.get("peak_memory_gib") if prediction else None
    result.update(
        {
            "device": ranks[0]["device"],
            "backend": ranks[0]["backend"],
            "world_size": len(ranks),
            "measured_peak_rss_gib": max(t["peak_memory_bytes"] for t in timed) / GiB
            if all_timed and ranks[0]["device"] == "cpu"
            else None,
            "measured_memory_is_anonymous": all_timed and ranks[0]["device"] == "cpu" and all(map(_anonymous, ranks)),
            "measured_step_time_s": measured_time,
            "predicted_step_time_s": pred_time,
            "error_pct": _pct(measured_time, pred_time),
            "measured_peak_memory_gib": peak,
            "measured_peak_reserved_gib": _peak_reserved(timed) if all_timed else None,
            "predicted_peak_memory_gib": pred_mem,
            "memory_error_pct": _pct(peak, pred_mem),
            "timed_losses": last["timed"]["losses"] if last.get("timed") else None,
        }
    )
    check = last.get("check")
    if check and ref:
        loss_diff = compare(check["losses"], ref["losses"])
        norm_diff = compare(check["grad_norms"], ref["grad_norms"])
        result.update(
            {
                "losses": check["losses"],
                "reference_losses": ref["losses"],
                "grad_norms": check["grad_norms"],
                "reference_grad_norms": ref["grad_norms"],
                "max_rel_loss_diff": loss_diff,
                "max_rel_grad_norm_diff": norm_diff,
                "loss_match": loss_diff <= REL_TOL and norm_diff <= REL_TOL,
            }
        )
    result["ranks"] = [
        {
            "rank": r["rank"],
            **r["coords"],
            "step_time_s": r["timed"]["step_time_s"] if r.get("timed") else None,
            "peak_memory_gib": _tensor_memory(r) / GiB if r.get("timed") else None,
            "baseline_rss_gib": r["rss_baseline_bytes"] / GiB,
            "parameters": r["check"].get("local_parameters") if r.get("check") else None,
        }
        for r in ranks
    ]
    return result


def run_and_verify(
    run_dir: Path,
    steps: int,
    timeout_s: float,
    log: Callable[[str], None] = _info,
    check_steps: int = CHECK_STEPS,
    check_memory: bool = True,
) -> dict[str, Any]:
    """Launch, check against one process, and compare with the prediction (see module docstring);
    ``check_memory``: refuse first a run whose ranks cannot fit this machine (:func:`check_host_memory`)."""
    run_dir = Path(run_dir)
    spec = load_run_spec(run_dir)
    stored = load_plan_json(run_dir).get("prediction")
    if steps < 0 or check_steps < 0:
        raise InputError(f"--steps: expected a non-negative number of steps, got {steps}")
    if timeout_s <= 0:
        raise InputError(f"--timeout: expected a positive number of seconds, got {timeout_s}")
    from autoplan.runtime.train import uses_cuda

    # the ranks take CUDA by this same rule (train.pick_device, one node: local world = world)
    cpu = None if uses_cuda("auto", spec.world_size) else cpu_job(spec, log)
    on_cpu = cpu_prediction(cpu)
    if check_memory:
        check_host_memory(spec, cpu, on_cpu)
    before = measure_host_speed(cpu, log) if steps else None  # nothing is timed without steps
    out = launch(run_dir, spec, steps, check_steps, timeout_s, log)
    ranks = read_results(out, spec.world_size)
    after = measure_host_speed(cpu, log) if before is not None and ranks[0]["device"] == "cpu" else None
    speed = None
    if before is not None and after is not None:
        from hwprofiles.calibrate import speed as speed_check

        speed = speed_check.HostSpeed.mean([before, after])
    ref = None
    if check_steps:
        from autoplan.runtime.reference import reference_losses

        log("autoplan run: single-process reference")
        ref = reference_losses(spec, check_steps)
    prediction = predict(ranks[0]["device"], stored, on_cpu)
    return with_host_speed(summarize(spec, ranks, ref, prediction), speed)


def measure_host_speed(cpu: Job | None, log: Callable[[str], None]) -> HostSpeed | None:
    """This host's speed now against the CPU profile of ``cpu`` (:func:`cpu_job`), which the
    prediction uses (module docstring, step 3); None without that job (the ranks have GPUs, or
    the profile cannot be loaded), or where its profile holds no such figures."""
    if cpu is None:
        return None
    from hwprofiles.calibrate.speed import host_speed

    log("autoplan run: host speed check")
    return host_speed(cpu.cluster.gpu)


def with_host_speed(result: dict[str, Any], speed: HostSpeed | None) -> dict[str, Any]:
    """``result`` with the host speed check's figures and the prediction at the host's speed now:
    the predicted step divided by the speed factor (hwprofiles.calibrate.speed)."""
    predicted = result.get("predicted_step_time_s")
    if speed is None or predicted is None:
        return result
    at_speed = predicted / speed.factor
    return {
        **result,
        "host_speed": speed.factor,
        "host_gemm_tflops": speed.gemm_tflops,
        "profile_gemm_tflops": speed.profile_gemm_tflops,
        "host_layer_us": speed.layer_us,
        "profile_layer_us": speed.profile_layer_us,
        "predicted_step_time_at_host_speed_s": at_speed,
        "error_at_host_speed_pct": _pct(result.get("measured_step_time_s"), at_speed),
    }


def _fmt(x: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if x is None else f"{x:{spec}}{unit}"


def format_report(result: dict[str, Any]) -> str:
    """Human-readable summary of ``run_and_verify``'s result."""
    plan = result.get("plan", {})
    plan_s = ",".join(f"{k}={v}" for k, v in plan.items() if k not in ("layers", "recompute"))
    lines = [
        f"plan        {plan_s}",
        f"ran on      {result['world_size']} x {result['device']} ({result['backend']})",
        "",
        f"{'':12}{'measured':>12}{'predicted':>12}{'error':>10}",
        f"{'step time':12}{_fmt(result['measured_step_time_s'], '.4f', ' s'):>12}"
        f"{_fmt(result['predicted_step_time_s'], '.4f', ' s'):>12}{_fmt(result['error_pct'], '+.1f', '%'):>10}",
        f"{'peak memory':12}{_fmt(result['measured_peak_memory_gib'], '.3f', ' GiB'):>12}"
        f"{_fmt(result['predicted_peak_memory_gib'], '.3f', ' GiB'):>12}{_fmt(result['memory_error_pct'], '+.1f', '%'):>10}",
    ]
    if result.get("host_speed") is not None:
        lines.insert(
            -1,
            f"{'  host now':12}{'':>12}{_fmt(result['predicted_step_time_at_host_speed_s'], '.4f', ' s'):>12}"
            f"{_fmt(result['error_at_host_speed_pct'], '+.1f', '%'):>10}"
            f"   (this host now runs {result['host_speed']:.2f}x its profile's speed: GEMM"
            f" {result['host_gemm_tflops']:.3f} vs {result['profile_gemm_tflops']:.3f} TFLOP/s, eager layer"
            f" {result['host_layer_us'] / 1e3:.2f} vs {result['profile_layer_us'] / 1e3:.2f} ms)",
        )
    if result["device"] == "cpu" and result["measured_peak_memory_gib"] is not None:
        anonymous = result.get("measured_memory_is_anonymous")
        what = "anonymous memory at its peak RSS" if anonymous else "peak RSS"
        before = "anonymous memory" if anonymous else "RSS"
        lines.append(
            f"            (CPU: growth of the busiest rank's {what} over its {before} before the model was built;"
            f" peak RSS with the PyTorch runtime: {result['measured_peak_rss_gib']:.3f} GiB)"
        )
    if result.get("measured_peak_reserved_gib") is not None:
        lines.append(
            f"            (CUDA: torch.cuda.max_memory_allocated; the caching allocator reserved up to"
            f" {result['measured_peak_reserved_gib']:.3f} GiB)"
        )
    if "losses" in result:
        verdict = "MATCH" if result["loss_match"] else "MISMATCH"
        lines += [
            "",
            f"equivalence with a single process ({len(result['losses'])} SGD steps): {verdict} "
            f"(max relative difference: loss {result['max_rel_loss_diff']:.2e}, grad norm {result['max_rel_grad_norm_diff']:.2e}; "
            f"tolerance {REL_TOL:.0e})",
            "  parallel:  " + " ".join(f"{x:.6f}" for x in result["losses"]),
            "  reference: " + " ".join(f"{x:.6f}" for x in result["reference_losses"]),
        ]
    return "\n".join(lines)
