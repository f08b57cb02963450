"""FSDP2's CPUOffloadPolicy as autoplan's program runs it (``Runtime.offload = "fsdp2"``): the
PCIe traffic of a microbatch and the host's work at the step's end, for the analytic model
(simulator.analytic.offload) and the DES (simulator.des.program) alike.

Each rule takes numbers (one plan) or arrays (many plans) alike.
"""

from __future__ import annotations

from typing import Any

from hwprofiles.schema import NodeProfile
from hwprofiles.units import GB
from simulator.cost import state_bytes
from simulator.numeric import where

#: FSDP2's offloaded parameter shards are the fp32 ones (cast to bf16 on the GPU after the copy up)
#: and its gradients are reduced in fp32 (MixedPrecisionPolicy reduce_dtype, autoplan.runtime.
#: data_parallel.apply_fsdp): bytes per parameter each way
FSDP2_OFFLOAD_BYTES = 4


def fsdp2_transfer_seconds(node: NodeProfile, params: Any, d: Any, transfers: Any = 3.0) -> Any:
    """PCIe seconds per microbatch of a stage of ``params`` parameters under FSDP2's
    CPUOffloadPolicy on d ranks: ``transfers`` shard copies (:func:`fsdp2_transfers`; 3: its
    fp32 shard up before the forward and again before the backward, ZeRO-3 resharding after the
    forward and a recomputed forward using the backward's gather, and the fp32 reduced gradient
    shard down after it), b = FSDP2_OFFLOAD_BYTES:

        T = transfers * b * params / d / B_pcie

    The two directions count one after the other, as measured: one rank of the 7B-layer slice
    (1.48e9 parameters, 4 microbatches of 4,096 tokens, H200 VM, 2026-11-27) took 0.133 s of
    forward and 0.202 s of backward per microbatch with 5.9 GB up per pass and 5.9 GB down,
    at 55.4 GB/s pinned each way (benchmarks/data/h200-2026-11-27/offload.json):
    3 * 5.9 / 55.4 = 0.32 s against 0.335 s measured."""
    return transfers * FSDP2_OFFLOAD_BYTES * params / d / node.pcie.bytes_per_s


def fsdp2_transfers(m: Any, deferred: Any, step_gathers: Any, zero: Any = 3) -> Any:
    """Shard copies per microbatch of an offloaded ZeRO-2/3 stage under FSDP2
    (:func:`fsdp2_transfer_seconds`): at ZeRO-3 2 up and 1 down every microbatch, at ZeRO-2
    (``reshard_after_forward=False``: the backward uses the forward's gather) 1 up and 1 down, or, with the gradient
    sync deferred to the step's end (simulator.cost.fsdp2_sync.deferred_sync: under
    torch.distributed.pipelining), a copy up for each of the step's ``step_gathers`` gathers
    (simulator.cost.fsdp2_window.step_gathers: m + 1 without a window) and the reduced gradients
    down once, spread over the ``m`` microbatches: (step_gathers + 1) / m."""
    return where(deferred, (step_gathers + 1.0) / m, where(zero >= 3, 3.0, 2.0))


def host_summed_microbatches(m: Any, deferred: Any) -> Any:
    """Microbatches whose offloaded gradients reach the host apart, to be summed there
    (:func:`fsdp2_host_seconds`): all m where FSDP2 copies each microbatch's reduced shard down,
    1 with the sync deferred (the GPU accumulates them whole and copies their sum down once; the
    program builds its HostGradients only at p = 1, autoplan/runtime/trainer.py)."""
    return where(deferred, 1, m)


def fsdp2_host_seconds(node: NodeProfile, psi_local: Any, m: Any, deferred: Any = False) -> Any:
    """Host seconds of an FSDP2-offloaded step of ``psi_local`` parameters per rank over ``m``
    microbatches, whose gradients come down apart unless the sync is ``deferred``
    (:func:`host_summed_microbatches`: m' of them), all of a node's ``g`` ranks sharing the host:
    the m' - 1 sums of a microbatch's fp32 gradients into the
    held ones (autoplan.runtime.data_parallel.HostGradients), the gradient norm over them
    (autoplan.runtime.grads.clip_global_norm) and fused AdamW (12 bytes of fp32 state per
    parameter, as calibrate times ``cpu_adam_GBps``):

        T = g * psi * (4 (m' - 1) / B_sum + 4 / B_norm + 12 / B_adam)

    Measured on one rank of the 7B-layer slice (H200 VM, 2026-11-27: benchmarks/data/
    h200-2026-11-27/offload.json): 0.47 s of sums over 3 microbatches, 0.79 s of norm and
    clipping, 0.37 s of AdamW; this gives 0.45, 0.56 and 0.35 s with that host's figures."""
    b, summed = FSDP2_OFFLOAD_BYTES, host_summed_microbatches(m, deferred)
    per_param = b * (summed - 1) / node.host_sum_GBps + b / node.host_norm_GBps
    per_param = per_param + state_bytes.OPTIMIZER_BYTES_PER_PARAM / node.cpu_adam_GBps
    return node.gpus_per_node * psi_local * per_param / GB
