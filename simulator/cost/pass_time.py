"""Time of a block's forward and backward passes on one TP rank, from its ops (simulator.cost.ops).

Host overhead, with a profile's measured ``eager`` host times (``autoplan calibrate``): a
block's forward or backward pass costs
    synchronous (a CPU rank): sum of work(op) + host(pass)
    asynchronous (a GPU):     max(sum of work(op), host(pass))
where host(pass) is the eager framework's measured time for the whole pass (Python, dispatcher,
autograd, DTensor under tensor parallelism). Without it, per-op overhead:
* synchronous execution (a CPU rank computes its own ops: the gloo/localhost-cpu case):
      time(pass) = sum of (work(op) + kernel_launch_us)
  per op of the simulator's op lists (the unit ``autoplan calibrate`` measures it in);
* asynchronous execution (a GPU: the host enqueues kernels while earlier ones run), with
  L(op) = kernel_launch_us * op.kernels, the host's time to issue the op's kernels: a pass (a
  block's forward or backward, a stream of kernels the host issues back to back with no
  synchronization in between) runs at the pace of the slower of the two, host or device:
      time(pass) = max(sum of work(op), sum of L(op))
  (the steady state of a single-server queue: the device cannot start a kernel before the
  host has issued it, and the host runs ahead of the device when kernels are long). Small
  models are "launch-bound" or "CPU-bound": PyTorch eager spends tens of microseconds of
  Python, dispatcher and autograd work per kernel.

A pass's ops are added up once (:func:`pass_work`, what does not depend on the cluster) and then
paced (:func:`paced`: the slowdowns of ranks sharing a processor and of the slowest GPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hwprofiles.schema import GpuProfile
from simulator.cost.op import Op
from simulator.cost.ops import backward_ops, op_time, work_time
from simulator.numeric import maximum


@dataclass(frozen=True)
class PassTimes:
    """Seconds of one microbatch through one block on one TP rank. ``backward_weight``: the part
    of ``backward`` that computes the parameters' gradients (what a zero-bubble schedule runs as
    its separate W pass), its ops' share of the backward's work."""

    forward: float
    backward: float
    attention_core: float  # forward time of scores/softmax/dropout/attn-v (selective recompute)
    backward_weight: float = 0.0


ATTENTION_CORE = ("scores", "softmax", "attn_dropout", "attn_v", "flash_attention", "cp_out_correction")
#: backward ops that compute or accumulate parameter gradients (simulator.cost.workload names): the
#: weight GEMMs' wgrad (not the attention bmm's, whose operands are both activations) and the
#: gradient accumulation; everything else of a backward is the input gradient
WEIGHT_GRADIENT_OPS = frozenset(
    {
        "qkv_wgrad",
        "proj_wgrad",
        "fc1_wgrad",
        "fc2_wgrad",
        "logits_wgrad",
        "grad_accum",
        "embedding_wgrad",
        "logits_grad_accum",
        "router_wgrad",
        "expert_fc1_wgrad",
        "expert_fc2_wgrad",
    }
)


def weight_share(bwd_ops: list[Op], gpu: GpuProfile) -> float:
    """The weight-gradient ops' share of a backward's work (0 without work)."""
    total = sum(work_time(o, gpu) for o in bwd_ops)
    return sum(work_time(o, gpu) for o in bwd_ops if o.name in WEIGHT_GRADIENT_OPS) / total if total > 0 else 0.0


@dataclass(frozen=True)
class PassWork:
    """A block's ops added up once, before any pace applies (:func:`pass_work`): what
    :func:`pass_times` scales by the slowdowns and combines with the host's time. Each sum runs
    over the ops in their list order, as the formulas of the module docstring add them."""

    forward: float  # sum of work(op) of the forward's ops
    backward: float  # of the backward's ops (backward_ops of each, then backward_extra)
    core: float  # of the forward's attention-core ops (ATTENTION_CORE)
    forward_kernels: int  # sum of op.kernels: the launches of each (asynchronous host)
    backward_kernels: int
    core_kernels: int
    forward_serial: float  # serial_time of the forward's ops (a synchronous rank)
    backward_serial: float  # serial_time of the backward's ops, plus backward_extra's work
    core_serial: float
    weight_share: float  # the weight-gradient ops' share of the backward's work (weight_share)


def pass_work(ops: list[Op], gpu: GpuProfile, backward_extra: tuple[Op, ...] | list[Op] = ()) -> PassWork:
    """:class:`PassWork` of a block's forward ``ops`` and backward-only ``backward_extra`` on ``gpu``."""
    bwd_ops = [b for o in ops for b in backward_ops(o)]
    bwd_all = bwd_ops + list(backward_extra)
    core_ops = [o for o in ops if o.name in ATTENTION_CORE]
    return PassWork(
        forward=sum(work_time(o, gpu) for o in ops),
        backward=sum(work_time(o, gpu) for o in bwd_all),
        core=sum(work_time(o, gpu) for o in core_ops),
        forward_kernels=sum(o.kernels for o in ops),
        backward_kernels=sum(o.kernels for o in bwd_all),
        core_kernels=sum(o.kernels for o in core_ops),
        forward_serial=serial_time(ops, gpu),
        backward_serial=serial_time(bwd_ops, gpu) + sum(work_time(x, gpu) for x in backward_extra),
        core_serial=serial_time(core_ops, gpu),
        weight_share=weight_share(bwd_all, gpu),
    )


def pass_times(
    ops: list[Op],
    gpu: GpuProfile,
    slowdown: float = 1.0,
    backward_extra: tuple[Op, ...] | list[Op] = (),
    host_async: bool = False,
    host_us: tuple[float, float] | None = None,
    device_factor: float = 1.0,
) -> PassTimes:
    """Forward, backward and attention-core times of a block's ops; ``slowdown`` >= 1 scales
    compute when ranks share a processor (more ranks than compute slots on a CPU host).
    ``backward_extra``: backward-only ops (bias-gradient reductions, gradient accumulation).
    ``host_async``: the device runs asynchronously to its host (a GPU): each pass is a kernel
    stream (:func:`stream_time`, charging ``kernels`` launches per op); otherwise (a CPU rank)
    ops add up (:func:`serial_time`). ``host_us``: the block's measured eager host time per
    (forward, backward) pass, which replaces the per-op overhead (module docstring).
    ``device_factor`` >= 1 scales the device's work alone, not the host's issuing of it (a job
    paced by its slowest GPU, simulator.cost.variability)."""
    return paced(pass_work(ops, gpu, backward_extra), gpu, slowdown, host_async, host_us, device_factor)


def paced(
    w: PassWork,
    gpu: GpuProfile,
    slowdown: Any = 1.0,
    host_async: bool = False,
    host_us: tuple[Any, Any] | None = None,
    device_factor: float = 1.0,
) -> PassTimes:
    """:func:`pass_times` of a block whose ops are added up in ``w`` (:func:`pass_work`): the
    sums at the pace of the call (the arguments of the same names there). Numbers or arrays
    alike (the batch estimate paces the blocks of many keys at once: simulator.cost.block_times.
    block_times_table)."""
    share = w.weight_share
    if host_us is not None:
        work_f, work_b, core = w.forward * device_factor, w.backward * device_factor, w.core * device_factor
        host_f, host_b = host_us[0] * 1e-6, host_us[1] * 1e-6
        combine = maximum if host_async else (lambda x, h: x + h)
        b = combine(work_b, host_b) * slowdown
        return PassTimes(combine(work_f, host_f) * slowdown, b, core * slowdown, b * share)
    if host_async:
        b = stream_time(w.backward, w.backward_kernels, gpu, device_factor) * slowdown
        return PassTimes(
            stream_time(w.forward, w.forward_kernels, gpu, device_factor) * slowdown,
            b,
            stream_time(w.core, w.core_kernels, gpu, device_factor) * slowdown,
            b * share,
        )
    serial = slowdown * device_factor  # the rank's processor both issues and runs its ops
    bwd = w.backward_serial
    return PassTimes(w.forward_serial * serial, bwd * serial, w.core_serial * serial, bwd * serial * share)


def serial_time(ops: list[Op], gpu: GpuProfile) -> float:
    """Ops run one after another by the processor that also issues them (a CPU rank): the sum
    of :func:`op_time`. On a CPU the per-op overhead is calibrated per op of these lists
    (hwprofiles.calibrate.ops), so it is charged once per op whatever its GPU kernel count;
    backward-only extra ops (:func:`pass_times`) add their work only."""
    return sum(op_time(o, gpu) for o in ops)


def stream_time(work: Any, kernels: Any, gpu: GpuProfile, device_factor: float = 1.0) -> Any:
    """A stream of kernels issued asynchronously by a host, ``work`` the sum of its ops' work and
    ``kernels`` of their launches: max(work * device_factor, kernel_launch_us * kernels) (module
    docstring; ``device_factor``: :func:`pass_times`)."""
    return maximum(work * device_factor, gpu.kernel_launch_us * 1e-6 * kernels)
