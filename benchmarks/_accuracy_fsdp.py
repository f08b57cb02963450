"""The rows of ``validation/published-fsdp.yaml`` as autoplan jobs (benchmarks/accuracy.py section 3).

Each source's settings come from the file's header:

* ``mosaicml_mpt``: Composer + PyTorch FSDP (FULL_SHARD = zero 3), FlashAttention, t = p = 1.
  A100 40GB tables: ``bf16/PURE`` mixed precision (parameters, gradient reduction and buffers in
  bf16) on hgx-a100-40gb-roce nodes (8 x 200 Gb/s RoCE); H100 tables: ``amp_bf16/DEFAULT``
  (autocast; Composer's DEFAULT FSDP mixed precision reduces gradients in fp32) on dgx-h100
  nodes (the tables do not state the fabric).
* ``torchtitan_a100_64gpu``: FSDP2 on 64 A100 80GB, bf16 parameters with fp32 gradient
  reduction (torchtitan's default ``mixed_precision_reduce = "float32"``), on dgx-a100-80gb nodes
  (fabric not stated). "selective layer" checkpoints every second block: full recomputation of
  half the layers. "selective op" (torchtitan's op-level policy: save every second matmul's
  output, recompute the rest; scope approx) is priced the same way: it recomputes about half
  of each layer's forward and keeps about half its activations.
* ``dgxc_benchmarking_h100``: NeMo/Megatron-core GPT-3 175B on DGX H100 (t4 p8 v12 mb1, no
  recomputation, sequence parallel, distributed optimizer = zero 1, overlapped DP traffic).
* ``nemo_24_07_h100_fp8``: fp8 only, ZeRO stage and recomputation not stated.

fp8 rows (Transformer Engine's hybrid recipe: the dgxc fp8 twins of the bf16 recipe rows, MPT's
``amp_fp8``) are predicted with ``prec=fp8`` and summarized apart from the bf16 rows (issue 19's
targets are on the bf16 rows). Rows with an unknown ZeRO stage or recomputation are returned as
skipped with the reason, never dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from _accuracy_cli import RowCommand, RowError, models_dir, simulate_command
from _accuracy_data import reference_file

from simulator.job import Job
from simulator.plan import Plan
from simulator.specs import ModelSpec

FILE = "published-fsdp.yaml"
#: fabric of each source's GPUs (hwprofiles/nodes)
NODE_OF_GPU = {"A100-40GB": "hgx-a100-40gb-roce", "H100-80GB": "dgx-h100", "A100-80GB": "dgx-a100-80gb"}
SOURCE_GPU = {"torchtitan_a100_64gpu": "A100-80GB", "dgxc_benchmarking_h100": "H100-80GB"}
#: the stack each source ran (autoplan/frameworks/profiles): llm-foundry's Composer FSDP with its
#: fused loss, torchtitan's FSDP2, NeMo's Megatron-core
FRAMEWORK_OF_SOURCE = {
    "mosaicml_mpt": "llm-foundry",
    "torchtitan_a100_64gpu": "torchtitan",
    "dgxc_benchmarking_h100": "megatron",
    "nemo_24_07_h100_fp8": "megatron",
}


def _options(source: str, row: dict[str, Any]) -> list[str]:
    """The row's overrides of its framework's profile: the MPT A100 tables ran ``bf16/PURE``
    mixed precision (gradients reduced in bf16: --reduce-dtype bf16)."""
    return ["--reduce-dtype", "bf16"] if source == "mosaicml_mpt" and row.get("prec_mode", "").endswith("PURE") else []


@dataclass(frozen=True)
class FsdpRow:
    """One published run: its job (None when skipped), the measured tokens/s per GPU."""

    source: str
    label: str
    command: RowCommand | None
    tok_s_gpu: float
    skipped: str = ""  # why it cannot be expressed

    @property
    def job(self) -> Job | None:
        """The job ``autoplan simulate`` builds from the row's command (None when skipped)."""
        return self.command.job() if self.command else None

    def predicted_tok_s_gpu(self, step_s: float) -> float:
        assert self.job is not None
        j = self.job
        return j.global_batch * j.model.seq_length / (step_s * j.plan.gpus)


def _model(name: str, shape: dict[str, Any], seq: int) -> ModelSpec:
    llama = shape.get("activation") == "swiglu"
    return ModelSpec(
        name=name,
        num_layers=shape["num_layers"],
        hidden_size=shape["hidden_size"],
        num_attention_heads=shape["num_attention_heads"],
        num_query_groups=shape["num_query_groups"],
        ffn_hidden_size=shape["ffn_hidden_size"],
        vocab_size=shape["vocab_size"],
        seq_length=seq,
        activation=shape["activation"],
        tie_embeddings=shape["tie_embeddings"],
        position_embedding_type="rope" if llama else "learned_absolute",
        normalization="RMSNorm" if llama else "LayerNorm",
        attention="flash",
    )


def _recompute(row: dict[str, Any], layers: int) -> tuple[str, tuple[tuple[int, int], ...] | None]:
    ckpt = row["ckpt"]
    if ckpt == "other":  # both torchtitan policies recompute about half the layer's work
        return "full", ((layers // 2, 0),)
    return ckpt, None


def _skip_reason(row: dict[str, Any]) -> str:
    if row.get("zero") == "unknown" or row.get("ckpt") == "unknown":
        return "ZeRO stage or recomputation not stated by the source"
    return ""


def _row(source: str, row: dict[str, Any], shapes: dict[str, Any]) -> FsdpRow:
    gpu = row.get("gpu", SOURCE_GPU.get(source, "H100-80GB"))
    seq, gpus = row["seq"], row["gpus"]
    tok = row["tok_s_gpu"] if "tok_s_gpu" in row else row["gbs"] * seq / (row["iter_s"] * gpus)
    label = (
        f"{row['model']} {gpu} {gpus} GPUs s={seq} B={row['gbs']} t{row['t']}"
        + (f" cp{row['cp']}" if row.get("cp", 1) > 1 else "")
        + f" p{row['p']} d{row['d']}"
        f" mb{row['mb']} z{row['zero']} ckpt={row.get('ckpt_detail') or row['ckpt']}"
        + (" fp8" if row.get("prec") == "fp8" else "")
    )
    why = _skip_reason(row)
    if why:
        return FsdpRow(source, label, None, tok, why)
    model = _model(row["model"], shapes[row["model"]], seq)
    ckpt, recompute = _recompute(row, model.num_layers)
    v = row.get("v", 1)
    plan = Plan(
        t=row["t"],
        p=row["p"],
        d=row["d"],
        mb=row["mb"],
        zero=row["zero"],
        ckpt=ckpt,  # type: ignore[arg-type]
        v=v,
        schedule="interleaved" if v > 1 else "1f1b",
        sp=int(bool(row["sp"])),
        recompute=recompute,
        prec=row.get("prec", "bf16"),
        cp=row.get("cp", 1),
    )
    nodes = max(1, gpus // 8)
    command = simulate_command(
        model,
        models_dir(),
        NODE_OF_GPU[gpu],
        nodes,
        row["gbs"],
        plan,
        FRAMEWORK_OF_SOURCE[source],
        _options(source, row),
    )
    return FsdpRow(source, label, command, tok)


def fsdp_rows() -> list[FsdpRow]:
    """Every row of published-fsdp.yaml, in file order."""
    data = yaml.safe_load(reference_file(FILE).read_text())
    shapes = data["models"]
    return [_row(source, row, shapes) for source, body in data.items() if source != "models" for row in body["rows"]]


# ------------------------------------------------------------------------------ the section


def _predict(row: FsdpRow, fidelity: str) -> tuple[float, bool]:
    """(predicted tokens/s per GPU, fits in memory) of a row's job."""
    from simulator import simulate

    assert row.job is not None
    r = simulate(row.job, fidelity)
    return row.predicted_tok_s_gpu(r.step_time), r.fits


@dataclass
class _Errors:
    """The section's per-row results: errors (%) per source group, analytic and DES, the rows
    predicted not to fit, and each row with its analytic tokens/s per GPU."""

    analytic: dict[str, list[float]] = field(default_factory=dict)
    des: dict[str, list[float]] = field(default_factory=dict)
    oom: list[str] = field(default_factory=list)
    points: list[tuple[FsdpRow, float]] = field(default_factory=list)


def _row_errors(rows: list[FsdpRow], use_des: bool, out: Callable[[str], None]) -> _Errors:
    """Predict every row that has a job and print one line each: measured, predicted, error."""
    errors = _Errors()
    out(f"   {'run':<78} {'measured':>8} {'predicted':>9} {'error':>8}" + (f" {'DES':>8}" if use_des else ""))
    for r in rows:
        if r.job is None:
            continue
        pred, fits = _predict(r, "analytic")
        errors.points.append((r, pred))
        e = 100.0 * (pred / r.tok_s_gpu - 1.0)
        group = r.source + (" fp8" if r.job.plan.prec == "fp8" else "")
        errors.analytic.setdefault(group, []).append(e)
        line = f"   {r.label:<78} {r.tok_s_gpu:>8.0f} {pred:>9.0f} {e:>+7.1f}%"
        if not fits:
            errors.oom.append(r.label)
            line += " OOM"
        if use_des:
            dp, _ = _predict(r, "des")
            de = 100.0 * (dp / r.tok_s_gpu - 1.0)
            errors.des.setdefault(group, []).append(de)
            line += f" {de:>+7.1f}%"
        out(line)
    return errors


def _source_summaries(errors: _Errors, out: Callable[[str], None]) -> dict[str, dict[str, float]]:
    """Each source group's error statistics, printed one line each (with the DES MAPE if run)."""
    sources: dict[str, dict[str, float]] = {}
    for source, e in errors.analytic.items():
        stats = _stats(e)
        sources[source] = stats
        des = f"; DES MAPE {_stats(errors.des[source])['mape']:.1f}%" if source in errors.des else ""
        out(
            f"   {source:<28} {len(e):>3} rows: MAPE {stats['mape']:.1f}%, mean {stats['mean']:+.1f}%, "
            f"range {stats['min']:+.1f}% .. {stats['max']:+.1f}%{des}"
        )
    return sources


def fsdp_section(use_des: bool, out: Callable[[str], None], target: float = 10.0) -> dict[str, Any]:
    """Section 3 of benchmarks/accuracy.py: every row's error and the MAPE per source."""
    out(f"3. Published FSDP / ZeRO-3 and Megatron-core runs ({FILE}): tokens/s per GPU, measured vs predicted")
    out("   a run predicted not to fit counts as a miss; fp8 rows are predicted with prec=fp8 and summarized apart")
    out("")
    rows = fsdp_rows()
    skipped = [r for r in rows if r.job is None]
    errors = _row_errors(rows, use_des, out)
    oom = errors.oom
    out("")
    res: dict[str, Any] = {"sources": _source_summaries(errors, out), "points": errors.points}
    res["stack_rows"] = [
        RowError(
            FRAMEWORK_OF_SOURCE[r.source],
            r.source + (" fp8" if r.label.endswith(" fp8") else ""),
            r.label,
            100 * (pred / r.tok_s_gpu - 1),
        )
        for r, pred in errors.points
    ]
    every = [x for source, e in errors.analytic.items() if not source.endswith(" fp8") for x in e]
    fp8 = [x for source, e in errors.analytic.items() if source.endswith(" fp8") for x in e]
    res["all"] = _stats(every)
    res["fp8"] = _stats(fp8) if fp8 else None
    res["oom"] = oom
    res["within_20"] = sum(abs(x) <= 20.0 for x in every)
    res["rows"] = len(every)
    res["skipped"] = len(skipped)
    out(
        f"   all {len(every)} bf16 rows: MAPE {res['all']['mape']:.1f}% (target <= {target:.0f}%), "
        f"{res['within_20']} within 20%, {len(oom)} predicted out of memory"
    )
    if fp8:
        f = res["fp8"]
        out(
            f"   all {len(fp8)} fp8 rows (prec=fp8, issue 18): MAPE {f['mape']:.1f}%, mean {f['mean']:+.1f}%, "
            f"range {f['min']:+.1f}% .. {f['max']:+.1f}%"
        )
    for label in oom:
        out(f"     OOM (a miss): {label}")
    out(f"   skipped ({len(skipped)}):")
    for r in skipped:
        out(f"     {r.label}: {r.skipped}")
    return res


def _stats(errors: list[float]) -> dict[str, float]:
    return {
        "n": len(errors),
        "mape": sum(abs(x) for x in errors) / len(errors),
        "mean": sum(errors) / len(errors),
        "min": min(errors),
        "max": max(errors),
    }
