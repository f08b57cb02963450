"""Host time of eager PyTorch training for ``autoplan calibrate`` (``GpuProfile.eager``).

A CPU rank runs each op on the thread that issues it, so its step time is the arithmetic
plus the framework's host work: Python module calls, the dispatcher, autograd bookkeeping,
and under tensor parallelism the host work of the split layer's collectives. Per-op
overhead on the simulator's op lists (Megatron's fused kernels, about 15 per layer) misses
most of it: an eager layer runs about a hundred aten ops forward and backward (a layer whose
every op dispatched through DTensor took ten times its host time: hwprofiles/gpus/cpu.yaml before
2026-11-27). So the blocks a GPT training step runs are
timed whole, at a size where the arithmetic is negligible (hidden 16, 8 tokens), and the
time is all host work:

* layer: pre-norm GPT layer (LayerNorm; q, k, v, o Linear; causal scaled-dot-product
  attention; LayerNorm; Linear, tanh-GELU, Linear; two residual adds), as
  ``autoplan.runtime`` and Megatron-LM order it;
* tp_layer: the same layer under Megatron tensor parallelism as autoplan's program splits it
  (the split the caller gives: autoplan.runtime.tensor_parallel.split_layer, q, k, v, fc1
  column-parallel, o, fc2 row-parallel, on the local tensors of DTensor parameters) on 2 ranks,
  each rank's thread CPU time, which leaves out the time it waits in collectives (the simulator
  prices those on the link). Two
  busy ranks slow each other by an amount that drifts with the host (cores shared with
  other tenants, hyperthread siblings): timed alone, the TP figure moved by 40% between two
  calibrations minutes apart while the single-process layer moved by 2%. So the ranks time
  the plain layer right after the TP layer, and the profile gets the ratio of the two times
  the single-process layer (:func:`tp_layer_ratios`), in which that slowdown cancels;
* embedding: token plus learned position embedding; head: LayerNorm, Linear to the
  vocabulary, cross-entropy;
* tp_optimizer_tensor: the AdamW step over the TP layer's parameters (DTensors where sharded,
  every op a DTensor dispatch) with the norm of their local gradients, per tensor: its ratio
  to the same step over the plain layer's parameters, times optimizer_tensor;
* optimizer_tensor: one AdamW step (the implementation autoplan's program steps: torch's fused
  AdamW, on a GPU and on a CPU) with the global gradient norm and clipping
  (``clip_grad_norm_``), over many small tensors, per tensor;
* optimizer_param: the same step over a few large tensors, per parameter: on a CPU (4 x 2^18
  elements) the thread's CPU time less the tensors' share of optimizer_tensor; on a GPU (4 x 2^24 elements) the wall-clock time with the device
  synchronized (the host's per-tensor work overlaps the kernels there). The GPU tensors must
  be large: at 4 x 2^18 elements an H100's step is its ~20 kernel launches, not its memory
  passes, and the figure came out at 0.36 ns per parameter (benchmarks/data/h100-calibrate.yaml),
  ten times the 0.038 ns that 4 x 2^24 elements measure (h100-optimizer-probe.txt, 2026-11-25).

Clock: on a CPU the thread's CPU time (``time.thread_time``): host work only, without the time
other processes hold the core (the simulator's compute slowdown accounts for shared cores). On
a GPU the wall clock (``time.perf_counter``), the device synchronized after each loop: the
autograd engine runs a CUDA backward on a thread of its own, which the caller's CPU time
misses (it read 139 us for the layer's backward against 607 us forward, H100, 2026-11-26,
shared/gpu/h100-2026-11-26), and at this size every kernel is shorter than the host's issuing
of it, so the wall time of a pass is its host time. A GPU's passes run under bf16 autocast, as
autoplan's program runs them (autoplan/runtime/trainer.py): its weight casts are host work too.

A layer's figure is the slope over depth: a stack of STACK_LAYERS layers timed against one
layer, (T(stack) - T(1)) / (STACK_LAYERS - 1), for the forward and the backward. The time of
one layer alone also holds each pass's own call costs (the ``sum`` of the output, entering
autocast, starting the autograd engine, which on a GPU hands the graph to its device thread):
a program pays those once per microbatch, not per layer. On an H100 the one-layer figures
(1231 us forward, 1770 backward) priced gpt-1.3b's host-bound mb=1 step 22% slow, where the
slope of the program's own model over 1 and 9 layers (853 and 1743 us, benchmarks/
gpu_host_probe.py, benchmarks/data/h100-2026-11-26b/eager.json) gives, by hand, 1.01 s of host
time for it (16 microbatches x (24 layers x 2.6 ms + 1.0 ms)) against 1.02 s measured.

Two layers (:mod:`hwprofiles.calibrate.reference_layers`): the pre-norm GPT layer above, and
the Llama layer (``LlamaReferenceLayer``: RMSNorm, q/k/v/o without biases and grouped-query
attention, rotary embedding in its rotate-half form, SwiGLU), whose rotary embedding and gated
MLP add a score of ops; the simulator charges each model the layer of its kind
(``EagerHost.layer_us``).
Forward and backward (``loss.backward()`` of the block output's sum) are timed separately,
loops of ``_CALLS`` calls, the median over ``repeats`` loops. A shared host's speed drifts by
tens of percent over minutes (a virtual machine's cores share physical cores with other
tenants), so ``calibrate.run`` measures the single-process blocks in
``calibrate.settings.EAGER_ROUNDS`` rounds
spread over the calibration and keeps the median of each figure (:func:`median_result`).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hwprofiles.calibrate.program_optimizer import program_adamw
from hwprofiles.calibrate.reference_layers import HIDDEN, LayerSplit, LlamaReferenceLayer, ReferenceLayer
from hwprofiles.calibrate.timing import clock, synchronizer

_S, _VOCAB = 8, 32  # tokens and vocabulary of the timed blocks: with HIDDEN, negligible arithmetic
_CALLS = 20
#: layers of the stack whose host time, less one layer's, gives a layer's (module docstring)
STACK_LAYERS = 4
_OPT_TENSORS = 64
OPT_LARGE_TENSORS, _OPT_LARGE_CALLS = 4, 5
#: elements per large tensor of optimizer_param: CPU, and CUDA (module docstring)
OPT_LARGE_ELEMENTS = {"cpu": 1 << 18, "cuda": 1 << 24}


@dataclass(frozen=True)
class PassHost:
    """Host seconds of one forward and one backward pass."""

    forward_s: float
    backward_s: float


def _precision(device: str) -> Callable[[], contextlib.AbstractContextManager]:
    """bf16 autocast on a GPU (autoplan's program, autoplan/runtime/trainer.py); fp32 on a CPU."""
    if device == "cuda":
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext


def time_passes(forward: Callable[[], torch.Tensor], repeats: int, device: str = "cpu") -> PassHost:
    """Median over ``repeats`` loops of the mean host time of a forward and of its backward
    (the device's clock, calibrate.timing.clock, and precision: module docstring)."""
    now, sync, amp = clock(device), synchronizer(device), _precision(device)

    def loss() -> torch.Tensor:
        with amp():
            return forward().sum()

    for _ in range(3):
        loss().backward()
    fwd, bwd = [], []
    for _ in range(repeats):
        tf = tb = 0.0
        sync()
        for _ in range(_CALLS):
            t0 = now()
            out = loss()
            t1 = now()
            out.backward()
            t2 = now()
            tf, tb = tf + t1 - t0, tb + t2 - t1
        sync()
        fwd.append(tf / _CALLS)
        bwd.append(tb / _CALLS)
    return PassHost(statistics.median(fwd), statistics.median(bwd))


def _activation(device: str) -> torch.Tensor:
    return torch.randn(1, _S, HIDDEN, device=device, requires_grad=True)


def layer_host(device: str, repeats: int, llama: bool = False) -> PassHost:
    """A layer's host time: the slope between a stack of STACK_LAYERS layers and one (module
    docstring), floored at a tenth of the one layer's time (noise)."""
    make = LlamaReferenceLayer if llama else ReferenceLayer
    x = _activation(device)
    one_layer = make().to(device)
    stack = nn.Sequential(*(make() for _ in range(STACK_LAYERS))).to(device)
    one = time_passes(lambda: one_layer(x), repeats, device)
    many = time_passes(lambda: stack(x), repeats, device)
    per_layer = lambda a, b: max((b - a) / (STACK_LAYERS - 1), 0.1 * a)
    return PassHost(per_layer(one.forward_s, many.forward_s), per_layer(one.backward_s, many.backward_s))


@dataclass(frozen=True)
class TpRatios:
    """Host time under the program's TP relative to the plain layer, measured by the same ranks in the
    same turn: forward, backward, and the optimizer step per parameter tensor."""

    forward: float
    backward: float
    optimizer: float


def _layer_host(layer: nn.Module, device: str, repeats: int) -> tuple[PassHost, float]:
    """Passes of ``layer`` and its AdamW step + gradient norm per parameter tensor."""
    from torch.distributed.tensor import DTensor

    x = _activation(device)
    passes = time_passes(lambda: layer(x), repeats, device)  # leaves every parameter with a gradient
    params = list(layer.parameters())
    grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params if p.grad is not None]
    opt = program_adamw(params, lr=1e-4)

    def step() -> None:
        torch.nn.utils.get_total_norm(grads)  # the runtime's norm runs on the local shards
        opt.step()

    for _ in range(3):
        step()
    return passes, _per_call(step, _CALLS, repeats, time.thread_time, lambda: None) / len(params)


def tp_layer_ratios(mesh: Any, device: str, repeats: int, split_layer: LayerSplit) -> TpRatios:
    """The TP layer (the reference layer split by ``split_layer``) host time over the plain
    layer's, both timed now by this rank while the other ranks of ``mesh`` do the same: the
    cores' current speed and sharing cancel out, and the ratios times the single-process figures
    give the TP figures (module docstring). Call on every rank of ``mesh``."""
    layer = ReferenceLayer().to(device)
    split_layer(layer, mesh)
    tp, tp_opt = _layer_host(layer, device, repeats)
    plain, plain_opt = _layer_host(ReferenceLayer().to(device), device, repeats)
    return TpRatios(tp.forward_s / plain.forward_s, tp.backward_s / plain.backward_s, tp_opt / plain_opt)


def embedding_host(device: str, repeats: int) -> PassHost:
    tok, pos = nn.Embedding(_VOCAB, HIDDEN).to(device), nn.Embedding(_S, HIDDEN).to(device)
    ids = torch.randint(0, _VOCAB, (1, _S), device=device)
    positions = torch.arange(_S, device=device)
    return time_passes(lambda: tok(ids) + pos(positions), repeats, device)


def head_host(device: str, repeats: int) -> PassHost:
    norm, out = nn.LayerNorm(HIDDEN).to(device), nn.Linear(HIDDEN, _VOCAB, bias=False).to(device)
    x = _activation(device)
    targets = torch.randint(0, _VOCAB, (_S,), device=device)
    return time_passes(lambda: F.cross_entropy(out(norm(x)).float().view(-1, _VOCAB), targets), repeats, device)


def _optimizer_step(elements: int, tensors: int, device: str) -> Callable[[], None]:
    """AdamW with global-norm clipping over ``tensors`` parameters of ``elements`` each, in the
    implementation autoplan's program steps (hwprofiles.calibrate.program_optimizer)."""
    params = [torch.zeros(elements, device=device, requires_grad=True) for _ in range(tensors)]
    for p in params:
        p.grad = torch.ones_like(p)
    opt = program_adamw(params, lr=1e-4)

    def step() -> None:
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    for _ in range(3):
        step()
    return step


def _per_call(
    step: Callable[[], None], calls: int, repeats: int, clock: Callable[[], float], sync: Callable[[], None]
) -> float:
    """Median over ``repeats`` loops of ``calls`` calls of the mean time per call."""
    samples = []
    for _ in range(repeats):
        sync()
        t0 = clock()
        for _ in range(calls):
            step()
        sync()
        samples.append((clock() - t0) / calls)
    return statistics.median(samples)


def optimizer_tensor_host(device: str, repeats: int) -> float:
    """Host seconds per parameter tensor of AdamW step + global norm + clipping."""
    step = _optimizer_step(HIDDEN, _OPT_TENSORS, device)
    return _per_call(step, _CALLS, repeats, clock(device), synchronizer(device)) / _OPT_TENSORS


def optimizer_param_time(device: str, repeats: int, per_tensor_s: float) -> float:
    """Seconds per parameter of the same step on large tensors (module docstring)."""
    elements = OPT_LARGE_ELEMENTS[device]
    step = _optimizer_step(elements, OPT_LARGE_TENSORS, device)
    n = elements * OPT_LARGE_TENSORS
    t = _per_call(step, _OPT_LARGE_CALLS, repeats, clock(device), synchronizer(device))
    if device == "cuda":
        return t / n
    return max(0.0, t - OPT_LARGE_TENSORS * per_tensor_s) / n


@dataclass(frozen=True)
class EagerResult:
    layer: PassHost
    embedding: PassHost
    head: PassHost
    optimizer_tensor_s: float
    optimizer_param_s: float
    llama_layer: PassHost
    tp_layer: PassHost | None = None  # filled in by the collective benchmark's ranks
    tp_optimizer_tensor_s: float | None = None  # also filled in by those ranks


def measure_eager(device: str, repeats: int, tick: Callable[[str], None]) -> EagerResult:
    """The single-process blocks (the TP layer is timed by ``calibrate.comm``'s ranks)."""
    layer = layer_host(device, repeats)
    llama = layer_host(device, repeats, llama=True)
    emb = embedding_host(device, repeats)
    head = head_host(device, repeats)
    opt = optimizer_tensor_host(device, repeats)
    opt_param = optimizer_param_time(device, repeats, opt)
    tick("eager host time per block")
    return EagerResult(layer, emb, head, opt, opt_param, llama)


def median_result(rounds: list[EagerResult]) -> EagerResult:
    """Each figure's median over measurement rounds (module docstring)."""

    def med(get: Callable[[EagerResult], float]) -> float:
        return statistics.median(get(r) for r in rounds)

    def passes(get: Callable[[EagerResult], PassHost]) -> PassHost:
        return PassHost(med(lambda r: get(r).forward_s), med(lambda r: get(r).backward_s))

    return EagerResult(
        passes(lambda r: r.layer),
        passes(lambda r: r.embedding),
        passes(lambda r: r.head),
        med(lambda r: r.optimizer_tensor_s),
        med(lambda r: r.optimizer_param_s),
        passes(lambda r: r.llama_layer),
    )
