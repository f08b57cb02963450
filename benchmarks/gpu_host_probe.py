"""Host time of autoplan's own program on a GPU, per layer and per microbatch, and where a
ZeRO-3 CPU-offload step spends its time. Run on a CUDA machine::

    python benchmarks/gpu_host_probe.py --out DIR

1. Eager host time: the program's model (``autoplan.runtime.model.GPT``) at negligible
   arithmetic (hidden 64, 16 tokens, vocabulary 128), GPT-style (LayerNorm, GELU, biases,
   learned positions) and Llama-style (RMSNorm, SwiGLU, rotary, GQA), with 1 and 9 layers and
   each recomputation mode, under bf16 autocast as the program runs it; the wall time of a
   microbatch's forward + loss and of its backward (device synchronized per loop of 20). The
   slope over the layer count is a layer's host time, the intercept the microbatch's own
   (embedding, head, loss, the backward call). Written to ``DIR/eager.json``.
2. Offload: one rank of FSDP2 with CPUOffloadPolicy over the 7B-layer slice
   (benchmarks/models/llama7b-slice.yaml), as ``autoplan run`` builds it, stepping fused AdamW
   on the host's threads and summing the microbatches' gradients there as the trainer does
   (autoplan.runtime.data_parallel.HostGradients); the host's transfer and stream rates
   (:func:`host_transfers`), the time of each phase of a step (forward, backward, host sum,
   gradient norm, optimizer) and torch.profiler's top host ops of the second step. Written to
   ``DIR/offload.json`` and ``DIR/offload-profile.txt``.

``--slopes-into PROFILE EAGER_JSON SOURCE`` (no GPU) writes a copy of a calibrated profile whose
eager layer figures are the probe's slopes: benchmarks/data/h100-2026-11-26b/
h100-calibrated-slopes.yaml was made so from that session's calibration and eager.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from autoplan.runtime.model import GPT, lm_loss  # noqa: E402
from simulator.model_files import load_model  # noqa: E402
from simulator.specs import ModelSpec  # noqa: E402

_CALLS, _REPEATS = 20, 5


def tiny_spec(llama: bool) -> dict[str, object]:
    base: dict[str, object] = dict(
        name="probe", num_layers=9, hidden_size=64, num_attention_heads=4, vocab_size=128, seq_length=16
    )
    if llama:
        base.update(
            num_query_groups=2,
            ffn_hidden_size=256,
            activation="swiglu",
            position_embedding_type="rope",
            normalization="RMSNorm",
            tie_embeddings=False,
        )
    return base


def microbatch_host(spec: ModelSpec, layers: int, recompute: str) -> tuple[float, float]:
    """Median (forward + loss, backward) wall seconds of one microbatch (module docstring)."""
    model = GPT(spec, range(layers), True, True, {i: recompute for i in range(layers)}).cuda()
    x = torch.randint(0, spec.vocab_size, (1, spec.seq_length), device="cuda")
    fwd, bwd = [], []
    for r in range(_REPEATS + 1):
        tf = tb = 0.0
        torch.cuda.synchronize()
        for _ in range(_CALLS):
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = lm_loss(model(x), x)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            tf, tb = tf + t1 - t0, tb + t2 - t1
        torch.cuda.synchronize()
        if r:  # the first loop warms up
            fwd.append(tf / _CALLS)
            bwd.append(tb / _CALLS)
    return statistics.median(fwd), statistics.median(bwd)


def eager_probe() -> dict[str, object]:
    out: dict[str, object] = {}
    for llama in (False, True):
        spec = ModelSpec(**tiny_spec(llama))
        for recompute in ("none", "selective", "full"):
            one, nine = microbatch_host(spec, 1, recompute), microbatch_host(spec, 9, recompute)
            key = f"{'llama' if llama else 'gpt'}/{recompute}"
            out[key] = {
                "layer_forward_us": (nine[0] - one[0]) / 8 * 1e6,
                "layer_backward_us": (nine[1] - one[1]) / 8 * 1e6,
                "microbatch_forward_us": (one[0] - (nine[0] - one[0]) / 8) * 1e6,
                "microbatch_backward_us": (one[1] - (nine[1] - one[1]) / 8) * 1e6,
                "one_layer_us": [one[0] * 1e6, one[1] * 1e6],
                "nine_layers_us": [nine[0] * 1e6, nine[1] * 1e6],
            }
            print(key, out[key], flush=True)
    return out


def _offloaded_model(spec: ModelSpec) -> tuple[GPT, torch.optim.Optimizer]:
    """One rank's model under FSDP2 (ZeRO-3) with CPUOffloadPolicy, as ``autoplan run`` builds it,
    and its fused AdamW."""
    from torch.distributed.device_mesh import init_device_mesh

    from autoplan.runtime.data_parallel import apply_fsdp
    from autoplan.runtime.init import init_parameters

    with torch.device("meta"):
        model = GPT(spec, range(spec.num_layers), True, True)
    model.to_empty(device="cuda")
    init_parameters(model, 0, 0.02, spec.tie_embeddings)
    apply_fsdp(model, init_device_mesh("cuda", (1,)), 3, offload=True, param_dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    return model, opt


def _timed_step(model: GPT, opt: torch.optim.Optimizer, x: torch.Tensor, microbatches: int) -> dict[str, float]:
    """One training step over ``microbatches`` microbatches of ``x`` as the trainer runs it (each
    microbatch's offloaded gradients summed on the host: autoplan.runtime.data_parallel.
    HostGradients): wall seconds of its forward, backward, host sum, gradient norm and optimizer
    phases."""
    from autoplan.runtime.data_parallel import HostGradients
    from autoplan.runtime.grads import clip_global_norm

    held = HostGradients(list(model.parameters()))
    phases: dict[str, float] = {"forward": 0.0, "backward": 0.0, "host_sum": 0.0}
    for i in range(microbatches):
        t0 = time.perf_counter()
        loss = lm_loss(model(x[i]), x[i])
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        loss.backward()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        held.take()
        phases["forward"] += t1 - t0
        phases["backward"] += t2 - t1
        phases["host_sum"] += time.perf_counter() - t2
    held.give_back()
    t2 = time.perf_counter()
    grads = [(p.grad._local_tensor, 1.0) for p in model.parameters() if p.grad is not None]
    clip_global_norm(grads, 1.0, torch.device("cuda"))
    t3 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    phases.update(norm=t3 - t2, optimizer=time.perf_counter() - t3)
    return phases


def host_transfers() -> dict[str, float]:
    """GB/s of what an offloading rank moves, measured as ``autoplan calibrate`` measures them
    (hwprofiles.calibrate.host: pinned copies each way, the host gradient sum and norm, on its
    CUDA buffer), and beside them a device -> host copy into pageable memory (a fresh
    ``.to("cpu")``, as FSDP2 copies an accumulated gradient)."""
    from hwprofiles.calibrate import host
    from hwprofiles.calibrate.settings import settings_for
    from hwprofiles.calibrate.timing import seconds_per_call
    from hwprofiles.units import GB

    s = settings_for("cuda", False)
    copies = host.measure_copies(s, lambda _: None)
    sum_GBps, norm_GBps = host.measure_host_streams(s, lambda _: None)
    gpu = torch.empty(s.host_copy_bytes // 4, device="cuda")
    pageable = s.host_copy_bytes / seconds_per_call(lambda: gpu.to("cpu"), "cuda", s.timing) / GB
    return {
        "h2d_pinned": copies.h2d_GBps,
        "d2h_pinned": copies.d2h_GBps,
        "d2h_pageable": pageable,
        "host_add": sum_GBps,
        "host_norm": norm_GBps,
    }


def offload_probe(out_dir: Path, microbatches: int) -> dict[str, object]:
    """Part 2 of the module docstring: three timed offload steps, the second under torch.profiler
    (its top host and device ops written to ``out_dir/offload-profile.txt``)."""
    import torch.distributed as dist

    from autoplan.runtime.train import host_threads

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    threads = host_threads("cpu", "cuda", 1)
    assert threads is not None
    torch.set_num_threads(threads)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    spec = load_model(str(HERE / "models" / "llama7b-slice.yaml"))
    model, opt = _offloaded_model(spec)
    x = torch.randint(0, spec.vocab_size, (microbatches, 1, spec.seq_length), device="cuda")
    record: dict[str, object] = {
        "threads": threads,
        "torch_threads": torch.get_num_threads(),
        "params": sum(p.numel() for p in model.parameters()),
        "microbatches": microbatches,
        "transfers_GBps": host_transfers(),
        "steps": [],
    }
    print("offload transfers", record["transfers_GBps"], flush=True)

    steps = record["steps"]
    assert isinstance(steps, list)
    steps.append(_timed_step(model, opt, x, microbatches))
    print("offload step 1", steps[-1], flush=True)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        steps.append(_timed_step(model, opt, x, microbatches))
    print("offload step 2", steps[-1], flush=True)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
    (out_dir / "offload-profile.txt").write_text(
        table + "\n\n" + prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25)
    )
    steps.append(_timed_step(model, opt, x, microbatches))
    print("offload step 3", steps[-1], flush=True)
    dist.destroy_process_group()
    return record


#: profile lines the slopes replace: (eager.json key, its field, the profile's key)
_SLOPE_KEYS = (
    ("gpt/none", "layer_forward_us", "layer_forward_us"),
    ("gpt/none", "layer_backward_us", "layer_backward_us"),
    ("llama/none", "layer_forward_us", "llama_layer_forward_us"),
    ("llama/none", "layer_backward_us", "llama_layer_backward_us"),
)


def with_slopes(profile_text: str, eager: dict, source: str) -> str:
    """``profile_text`` (a calibrated GPU profile) with its eager layer figures replaced by the
    per-layer slopes of ``eager`` (this probe's eager.json), each line citing ``source``: what
    calibrate's slope method (hwprofiles.calibrate.eager.layer_host) measures, for a profile
    written before it."""
    lines = profile_text.splitlines()
    for key, field, profile_key in _SLOPE_KEYS:
        at = [i for i, line in enumerate(lines) if line.strip().startswith(f"{profile_key}:")]
        if len(at) != 1:
            raise SystemExit(f"the profile has {len(at)} '{profile_key}' lines, expected one")
        value = eager[key][field]
        lines[at[0]] = f"  {profile_key}: {value:.1f}   # per-layer slope over 1 and 9 layers; {source}"
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--skip-eager", action="store_true")
    ap.add_argument(
        "--slopes-into",
        nargs=3,
        metavar=("PROFILE", "EAGER_JSON", "SOURCE"),
        help="write to --out the calibrated PROFILE with its eager layer figures replaced by EAGER_JSON's "
        "slopes (no GPU needed), each citing SOURCE",
    )
    a = ap.parse_args()
    if a.slopes_into:
        profile, eager_json, source = a.slopes_into
        text = with_slopes(Path(profile).read_text(), json.loads(Path(eager_json).read_text()), source)
        a.out.write_text(text.replace("name: h100-calibrated", f"name: {a.out.stem}", 1))
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    if not a.skip_eager:
        (a.out / "eager.json").write_text(json.dumps(eager_probe(), indent=1))
    (a.out / "offload.json").write_text(json.dumps(offload_probe(a.out, a.microbatches), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
