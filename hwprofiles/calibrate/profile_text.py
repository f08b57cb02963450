"""Render a :class:`Calibration` as GPU and node profile YAML, every number with its source.

The text is written by hand (not yaml.dump) so each number carries a comment, like the shipped
profiles; numbers are printed with 4 significant digits in a form YAML reads back as a float
(a dot and a signed exponent when an exponent is needed: PyYAML reads "1e-05" as a string).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from hwprofiles.calibrate.eager import OPT_LARGE_ELEMENTS, OPT_LARGE_TENSORS
from hwprofiles.calibrate.result import Calibration
from hwprofiles.calibrate.settings import BURST_GEMMS, BUS_BYTES, BUS_LOOPS, EAGER_ROUNDS, SLOT_ROUNDS, WAIT_ROUNDS
from hwprofiles.units import GB


def num(x: float, sig: int = 4) -> str:
    """``x`` with ``sig`` significant digits, always parsed as a float by YAML 1.1."""
    x = float(x)
    if x == 0:
        return "0.0"
    if 1e-4 <= abs(x) < 1e7:
        digits = max(sig - 1 - int(f"{x:e}".split("e")[1]), 1)
        return f"{round(x, digits):.{digits}f}"
    mantissa, exp = f"{x:.{sig - 1}e}".split("e")
    return f"{mantissa}e{int(exp):+03d}"


def _q(s: str) -> str:
    """A YAML double-quoted scalar (JSON strings are valid YAML)."""
    return json.dumps(s)


def _stamp(c: Calibration) -> str:
    return f"measured by autoplan calibrate on {c.date}"


def _table_lines(c: Calibration) -> list[str]:
    stamp = _stamp(c)
    return [
        f"    - {{m: {p.m}, n: {p.n}, k: {p.k}, tflops: {num(p.tflops)}, dtype: {p.dtype}}}   # {stamp}"
        for p in c.gemm_points
    ]


def _measured_lines(c: Calibration) -> list[str]:
    items: dict[str, str] = {
        "date": c.date,
        "device": c.device_name,
        "torch": c.torch_version,
        "host": c.host,
        "mode": c.mode,
        "intra_op_threads": str(c.threads),
        "load_average_before_after": c.host_load,
        "dispatch_us": num(c.dispatch_us),
        "autograd_forward_op_us": num(c.forward_op_us),
        "autograd_backward_op_us": num(c.backward_op_us),
        "gemm_fit_rms_log_error": num(c.gemm_fit.rms_log_error),
    }
    if c.attention_fit is not None:
        items["attention_fit_rms_log_error"] = num(c.attention_fit.rms_log_error)
    return [f"  {k}: {_q(v)}" for k, v in items.items()]


#: what each GPU-profile number is (the comment before the date stamp)
_GPU_NOTES: dict[str, str] = {
    "memory_bandwidth_GBps": "copy_ (read+write bytes)/time, median over tensor sizes",
    "memory_efficiency": "median over add, scale, gelu, dropout, layer_norm, softmax x sizes "
    "of achieved / copy bandwidth",
    "kernel_launch_us": "per-op overhead of a forward+backward of tiny ops, backward counted as 2 ops",
    "max_efficiency": "least-squares fit (log error) of the curve to the table, vs the default dtype's peak",
}


def _gpu_header(c: Calibration) -> list[str]:
    what = "one CPU core (torch.set_num_threads(1), one rank per core)" if c.device == "cpu" else "one GPU"
    work = (
        "the thread's CPU time of the op less that of the same op on a tiny tensor"
        if c.device == "cpu"
        else "device time, the host's launch time hidden"
    )
    return [
        f"# {c.device_name}: profile of {what},",
        f"# written by autoplan calibrate ({c.mode} mode) on {c.date}, host {c.host}, torch {c.torch_version}.",
        f"# GEMM and memory-op rates are work alone ({work});",
        "# the simulator adds the eager section's host time per block pass (kernel_launch_us per op without it).",
    ]


def _fp8_curve_lines(c: Calibration) -> list[str]:
    """The fp8 GEMM curve (``gemm.fp8``), fitted to the fp8 table against the fp8 peak."""
    f = c.gemm_fp8_fit
    if f is None:
        return []
    s = _stamp(c)
    return [
        "  fp8:   # torch._scaled_mm, e4m3 operands, per-tensor scales, bf16 output",
        f"    max_efficiency: {num(f.max_efficiency)}   # fit of the curve to the fp8 table, vs the fp8 peak; {s}",
        f"    half_dim_m: {num(f.half_dim_m)}   # same fit; {s}",
        f"    half_dim_n: {num(f.half_dim_n)}   # same fit; {s}",
        f"    half_dim_k: {num(f.half_dim_k)}   # same fit; {s}",
    ]


def _attention_lines(c: Calibration) -> list[str]:
    """The ``attention`` section: the curve fitted to the measured points, and the points."""
    f = c.attention_fit
    if f is None:
        return []
    s = _stamp(c)
    lines = [
        "attention:   # causal F.scaled_dot_product_attention, TFLOP/s on the FLOPs executed (causal half; "
        "backward 2.5x forward), efficiency = TFLOP/s / the default dtype's peak",
        f"  forward_efficiency: {num(f.forward_efficiency)}   # fit of top * s / (s + half_seq) to the table; {s}",
        f"  backward_efficiency: {num(f.backward_efficiency)}   # same fit; {s}",
        f"  half_seq: {num(f.half_seq)}   # same fit (rms log error {num(f.rms_log_error, 2)}); {s}",
        "  table:",
    ]
    lines += [
        f"    - {{seq: {p.seq}, head_dim: {p.head_dim}, forward_tflops: {num(p.forward_tflops)}, "
        f"backward_tflops: {num(p.backward_tflops)}}}   # {s}"
        for p in c.attention_points
    ]
    return lines


def _elementwise_lines(c: Calibration) -> list[str]:
    s = _stamp(c)
    lines = ["elementwise_GBps:   # achieved (read+write bytes)/work time per op, median over tensor sizes"]
    lines += [f"  {op}: {num(v)}   # {s}" for op, v in c.memory_by_op_GBps.items() if op != "copy"]
    return lines


#: the clock of the eager section's host times (hwprofiles.calibrate.eager)
_EAGER_CLOCK = {"cpu": "thread CPU time", "cuda": "wall clock, device synchronized per loop, bf16 autocast"}


def _eager_lines(c: Calibration) -> list[str]:
    """The ``eager`` section: host microseconds per pass of each block (calibrate.eager)."""
    e = c.eager
    if e is None:
        return []
    s = _stamp(c)
    lines = [
        f"eager:   # host time ({_EAGER_CLOCK[c.device]}) of eager PyTorch per pass at negligible arithmetic "
        "(hidden 16, 8 tokens), median of timed loops, single-process blocks: median of "
        f"{EAGER_ROUNDS} rounds spread over the calibration"
    ]
    blocks = [
        ("layer", e.layer, "pre-norm GPT layer"),
        ("llama_layer", e.llama_layer, "Llama layer: RMSNorm, GQA, rotary, SwiGLU, no biases"),
        ("embedding", e.embedding, "token + position embedding"),
        ("head", e.head, "final LayerNorm, output Linear, cross-entropy"),
    ]
    if e.tp_layer is not None:
        blocks.insert(
            1,
            (
                "tp_layer",
                e.tp_layer,
                f"the layer under autoplan's tensor parallelism (its program's split) over the plain layer, "
                f"both timed by 2-rank groups of {c.ranks} {c.backend} ranks one group at "
                f"a time (collective waits excluded; median of {EAGER_ROUNDS} turns, mean "
                f"over ranks), times layer_*_us",
            ),
        )
    for key, p, what in blocks:
        lines.append(f"  {key}_forward_us: {num(p.forward_s * 1e6)}   # {what}; {s}")
        lines.append(f"  {key}_backward_us: {num(p.backward_s * 1e6)}   # same, backward; {s}")
    lines.append(
        f"  optimizer_tensor_us: {num(e.optimizer_tensor_s * 1e6)}   # AdamW step + global grad norm + "
        f"clipping, per parameter tensor; {s}"
    )
    if e.tp_optimizer_tensor_s is not None:
        lines.append(
            f"  tp_optimizer_tensor_us: {num(e.tp_optimizer_tensor_s * 1e6)}   # AdamW step over the tensor-parallel "
            f"layer's parameters (DTensors where sharded) + norm of the local gradients, per tensor, over the "
            f"same step on the plain layer's, same groups and turns as tp_layer, times optimizer_tensor_us; {s}"
        )
    how = (
        "wall-clock, device synchronized"
        if c.device == "cuda"
        else "thread CPU time less the tensors' optimizer_tensor_us"
    )
    lines.append(
        f"  optimizer_param_ns: {num(e.optimizer_param_s * 1e9)}   # the same step on "
        f"{OPT_LARGE_TENSORS} x 2^{OPT_LARGE_ELEMENTS[c.device].bit_length() - 1}-element "
        f"tensors, per parameter ({how}); {s}"
    )
    return lines


def _spread_line(c: Calibration) -> str:
    """speed_spread, which one machine cannot measure (it is a spread over a cluster's GPUs): on
    a GPU the built-in profiles' published figure, on a CPU host none (its ranks share cores)."""
    if c.device == "cpu":
        return "speed_spread: 0.0   # the ranks are cores of this one host, not GPUs of a cluster"
    return (
        "speed_spread: 0.011   # not measured (a spread over a cluster's GPUs): 8% average variation among "
        "same-SKU GPUs of a cluster (Sinha et al. SC'22, arXiv:2208.11035), as in the built-in GPU profiles"
    )


def _overlap_line(c: Calibration) -> str:
    """comm_overlap_slowdown, which calibrate does not measure. On a CPU, collectives run on
    gloo's host threads, whose sharing of the cores is what the node's ``compute_slots`` and
    ``busy_latency_us`` already charge; on a GPU the schema's published figure applies."""
    if c.device == "cpu":
        return (
            "comm_overlap_slowdown: 0.0   # gloo's collectives run on host threads: their sharing of the cores is "
            "the node's measured compute_slots and busy_latency_us"
        )
    return (
        "comm_overlap_slowdown: 0.3   # not measured: the schema's default "
        "(overlapped matmuls run 30-40% slower, pytorch/pytorch PR #179937)"
    )


def render_gpu(c: Calibration, name: str) -> str:
    """The GPU profile (hwprofiles.schema.GpuProfile) of a calibration."""
    s = _stamp(c)
    lines = [*_gpu_header(c), f"name: {name}", f"default_dtype: {c.default_dtype}", "peak_tflops:"]
    for dtype, p in c.peaks.items():
        lines.append(f"  {dtype}: {num(p.tflops)}   # fastest GEMM of the table ({p.m}x{p.n}x{p.k}); {s}")
    mem_note = "host memory / the node's ranks, which share it" if c.device == "cpu" else "device memory"
    fit = c.gemm_fit
    lines += [
        f"memory_GiB: {num(c.memory_GiB)}   # {mem_note}; {s}",
        f"memory_bandwidth_GBps: {num(c.memory_bandwidth_GBps)}   # {_GPU_NOTES['memory_bandwidth_GBps']}; {s}",
        f"memory_efficiency: {num(c.memory_efficiency)}   # {_GPU_NOTES['memory_efficiency']}; {s}",
        f"kernel_launch_us: {num(c.kernel_launch_us)}   # {_GPU_NOTES['kernel_launch_us']}; {s}",
        f"memory_reserved_GiB: {num(c.memory_reserved_GiB)}   # {c.reserved_how}; {s}",
        "allocator_fragmentation: 0.05   # not measured: the schema's default (a few percent of capacity)",
        _overlap_line(c),
        _spread_line(c),
        "gemm:",
        f"  max_efficiency: {num(fit.max_efficiency)}   # {_GPU_NOTES['max_efficiency']} ({c.default_dtype}); {s}",
        f"  half_dim_m: {num(fit.half_dim_m)}   # same fit; {s}",
        f"  half_dim_n: {num(fit.half_dim_n)}   # same fit; {s}",
        f"  half_dim_k: {num(fit.half_dim_k)}   # same fit; {s}",
        *_fp8_curve_lines(c),
        "  table:   # C[m,n] = A[m,k] @ B[k,n] with torch.mm (fp8: torch._scaled_mm), best of timed loops, "
        "TFLOP/s = 2mnk / work time",
        *_table_lines(c),
        *_attention_lines(c),
        *_elementwise_lines(c),
        *_eager_lines(c),
        "measured:",
        *_measured_lines(c),
    ]
    return "\n".join(lines) + "\n"


def _link_comment(c: Calibration) -> str:
    assert c.link is not None
    per_op = ", ".join(
        f"{op} {num(f.bandwidth_Bps / GB, 3)} GB/s {num(f.latency_s * 1e6, 3)} us" for op, f in c.link_by_op.items()
    )
    return (
        f"{c.backend} over {c.ranks} ranks, ring alpha-beta fit of all-reduce, all-gather, reduce-scatter, "
        f"send/recv (rms error {num(c.link.rms_rel_error * 100, 2)}%; per op: {per_op}); {_stamp(c)}"
    )


def _per_ranks(values: dict[int, float], each: Callable[[float], float]) -> str:
    """A {ranks: each(value)} flow mapping."""
    return "{" + ", ".join(f"{k}: {num(each(v))}" for k, v in sorted(values.items())) + "}"


#: the host optimizer step that cpu_adam_GBps times (hwprofiles.calibrate.host)
_ADAM = {"cpu": "torch.optim.Adam.step", "cuda": "torch.optim.AdamW(fused=True).step on the host"}


def _node_title(c: Calibration) -> str:
    """The node profile's first comment line: what the node is and how its ranks are joined."""
    if c.device == "cpu":
        return f"# This host as a node of {c.gpus_per_node} CPU ranks joined by {c.backend} over loopback"
    return f"# This host's {c.gpus_per_node} x {c.device_name} joined by {c.backend}"


def _pcie_line(c: Calibration, s: str) -> str:
    """The host<->device link: host memory copies on a CPU node, pinned copies on a GPU node."""
    if c.device == "cpu":
        pcie_kind, pcie_note = "loopback", f"host memory copy_ (GB/s of bytes copied), 4-byte copy latency; {s}"
    else:
        pcie_kind = "pcie"
        pcie_note = (
            f"pinned host<->device copies: H2D {num(c.copy_h2d_GBps, 3)}, "
            f"D2H {num(c.copy_d2h_GBps, 3)} GB/s (mean), 4-byte copy latency; {s}"
        )
    return (
        f"pcie: {{kind: {pcie_kind}, bandwidth_GBps: {num(0.5 * (c.copy_h2d_GBps + c.copy_d2h_GBps))}, "
        f"latency_us: {num(c.copy_latency_us)}, efficiency: 1.0}}   # {pcie_note}"
    )


def _node_optional_lines(c: Calibration, s: str) -> list[str]:
    """The optional node keys: per-collective fits (gloo), and on a CPU node its compute slots and
    the busy ranks' extra latency."""
    lines: list[str] = []
    if _own_fits(c):
        lines.append(
            f"collectives:   # each collective's own ring alpha-beta fit (gloo runs each with its own code); {s}"
        )
        for op, f in c.link_by_op.items():
            lines.append(
                f"  {op}: {{bandwidth_GBps: {num(f.bandwidth_Bps / GB)}, latency_us: {num(f.latency_s * 1e6)}}}"
                f"   # rms error {num(f.rms_rel_error * 100, 2)}% over {f.samples} samples"
            )
    if c.device == "cpu" and c.compute_slots:
        lines.append(
            f"compute_slots: {_per_ranks(c.compute_slots, lambda x: max(1.0, x))}   # busy ranks: throughput of "
            f"single-threaded training loops (a GPT layer's forward+backward+AdamW at hidden 256, 128 tokens, the "
            f"busy ranks synchronized by a scalar all-reduce after each, its time alone taken out) on that many "
            f"ranks at once / on one alone, median of {SLOT_ROUNDS} ({c.cpu_cores} cores usable); {s}"
        )
    if c.device == "cpu" and c.busy_wait_s is not None:
        lines.append(
            f"busy_latency_us: {{{c.ranks}: {num(c.busy_wait_s * 1e6)}}}   # with this many ranks: extra one-way "
            f"latency of a 16 KiB send/recv between two ranks while the others run training steps (a woken "
            f"rank waits for a core), median of {WAIT_ROUNDS} rounds of busy minus idle; {s}"
        )
    if c.device == "cpu" and c.sync_wait_s:
        lines.append(
            f"sync_wait_us: {_per_ranks(c.sync_wait_s, lambda x: x * 1e6)}   # busy ranks with a core each: "
            f"extra time of a blocking collective issued after computing (ranks arriving apart, a blocked rank woken): a scalar all-reduce after "
            f"each burst of {BURST_GEMMS[0]} fp32 GEMMs {'x'.join(map(str, BURST_GEMMS[1:]))}, mean time inside "
            f"over calls and ranks less that of the same all-reduces back to back, median of {WAIT_ROUNDS}; {s}"
        )
    if c.device == "cpu" and c.sync_bus_s_per_byte:
        lines.append(
            f"sync_bus_us_per_MB: {_per_ranks(c.sync_bus_s_per_byte, lambda x: x * 1e12)}   # the same ranks: "
            f"extra time per MB of bus traffic of a {BUS_BYTES // 2**20} MiB all-reduce after each burst, over the fastest of {BUS_LOOPS} back-to-back "
            f"loops of it and the scalar's wait, median of {WAIT_ROUNDS}; {s}"
        )
    if c.device == "cpu" and not c.compute_slots:
        lines.append(
            f"compute_slots: {c.cpu_cores}   # CPU cores this process may use (sched_getaffinity): "
            f"ranks beyond that share cores; {s}"
        )
    return lines


def render_node(c: Calibration, name: str, gpu_ref: str) -> str:
    """The node profile (hwprofiles.schema.NodeProfile) of a calibration with collectives."""
    assert c.link is not None, "a node profile needs measured collectives"
    s = _stamp(c)
    count_note = "ranks of the collective benchmark" if c.device == "cpu" else "torch.cuda.device_count()"
    lines = [
        f"{_node_title(c)},",
        f"# written by autoplan calibrate ({c.mode} mode) on {c.date}, host {c.host}, torch {c.torch_version}.",
        f"name: {name}",
        f"gpu: {_q(gpu_ref)}",
        f"gpus_per_node: {c.gpus_per_node}   # {count_note}",
        f"backend: {c.backend}",
        (
            f"intra_node: {{kind: {c.intra_kind}, bandwidth_GBps: {num(c.link.bandwidth_Bps / GB)}, "
            f"latency_us: {num(c.link.latency_s * 1e6)}, efficiency: 1.0}}   "
            f"# bus bandwidth and per-step latency: {_link_comment(c)}"
        ),
        _pcie_line(c, s),
        "nics_per_node: 0   # not measured: a one-host calibration sees no NIC (add one for multi-node clusters)",
        f"host_memory_GiB: {num(c.host_memory_GiB)}   # physical memory (sysconf); {s}",
        (
            f"cpu_adam_GBps: {num(c.cpu_adam_GBps)}   # {_ADAM[c.device]}, 12 B/param of fp32 state / step time, "
            f"{c.threads} thread(s); {s}"
        ),
        f"host_sum_GBps: {num(c.host_sum_GBps)}   # fp32 a += b, bytes of one operand / time, {c.threads} thread(s); {s}",
        (
            f"host_norm_GBps: {num(c.host_norm_GBps)}   # torch.nn.utils.get_total_norm over 64 fp32 tensors, "
            f"bytes read / time, {c.threads} thread(s); {s}"
        ),
    ]
    lines += _node_optional_lines(c, s)
    return "\n".join(lines + _sample_lines(c)) + "\n"


def _own_fits(c: Calibration) -> bool:
    """Whether the node gets per-collective fits: gloo, whose collectives differ in speed (NCCL
    runs them all as the same rings and trees, so one link fits them)."""
    return c.backend == "gloo" and bool(c.link_by_op)


def _sample_lines(c: Calibration) -> list[str]:
    """The collective measurements behind the node's link figures, as comments: op, group size,
    bytes, measured time and the model's time for it (the collective's own fit when written)."""
    assert c.link is not None
    own = _own_fits(c)
    what = "each collective's own fit above" if own else "the intra_node link above"
    out = [
        f"# Collective times {_stamp(c)} (best loop mean of the slowest rank; model: {what}):",
        "#   op              ranks        bytes   measured_us      model_us",
    ]
    for x in c.collective_samples:
        model = (c.link_by_op[x.op] if own else c.link).predict(x.op, x.nbytes, x.ranks)
        out.append(f"#   {x.op:<15} {x.ranks:>5} {x.nbytes:>12} {x.seconds * 1e6:>13.1f} {model * 1e6:>13.1f}")
    return out
