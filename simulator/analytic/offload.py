"""Closed forms of offload (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity, Rajbhandari et al. 2021):
gradient shards down and parameter shards up over each GPU's PCIe link, Adam on the host CPU
(all of a node's ranks share it), NVMe reads and writes of the optimizer state. A runtime
offloads as DeepSpeed does or as FSDP2's CPUOffloadPolicy in autoplan's program
(``Runtime.offload``; FSDP2's rules are simulator.cost.offload's, shared with the DES).

Each rule takes numbers (one plan) or arrays (many plans, from the batch estimate) alike.
"""

from __future__ import annotations

from typing import Any

from hwprofiles.schema import NodeProfile
from simulator.analytic.data_parallel import DpPlan
from simulator.cost import state_bytes
from simulator.cost.offload import fsdp2_host_seconds, fsdp2_transfer_seconds, fsdp2_transfers
from simulator.cost.stage_memory import StageLike
from simulator.cost.step import CPU_ADAM_STATE_BYTES, OFFLOAD_SUBGROUPS
from simulator.numeric import any_of, maximum, where
from simulator.runtime_spec import Runtime


def offload_time(
    node: NodeProfile,
    psi_local: Any,
    offloaded: Any,
    zero: Any,
    nvme: Any,
    runtime: Runtime,
    m: Any,
    deferred: Any = False,
) -> Any:
    """Exposed offload seconds per step for ``psi_local`` parameters per rank (its 1/d shard) of a
    plan that offloads (``offloaded``; to NVMe: ``nvme``) over ``m`` microbatches, else 0:
    :func:`simulator.cost.offload.fsdp2_host_seconds` for an FSDP2 runtime (``deferred``: its
    gradient sync deferred to the step's end), else DeepSpeed's step below.

    The reduced gradient shard goes down over the rank's PCIe link (2 bytes/param), then the
    step runs pipelined over k = OFFLOAD_SUBGROUPS sub-groups through the phases NVMe read +
    write of the optimizer state (nvme only; all of a node's ranks share its drives), host
    Adam (all of a node's ranks share the CPU) and the updated fp16 shard back up over PCIe
    (not with ZeRO-3, whose parameters stay on the host):
        T = down + sum(phases)/k + (k - 1)/k * max(phases)
    (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity, Rajbhandari et al. 2021). A phase a plan does
    not run counts 0, which changes neither the sum nor, all phases being positive, the maximum."""
    if runtime.offload == "fsdp2":
        return where(offloaded, fsdp2_host_seconds(node, psi_local, m, deferred), 0.0)
    pcie = node.pcie.bytes_per_s
    down = psi_local * state_bytes.GRAD_BYTES / pcie + node.pcie.latency_s
    cpu = node.gpus_per_node * psi_local * CPU_ADAM_STATE_BYTES / (node.cpu_adam_GBps * 1e9)
    up = where(zero < 3, psi_local * state_bytes.PARAM_BYTES / pcie + node.pcie.latency_s, 0.0)
    drives = 0.0
    if node.nvme is not None:
        nvme_bw = node.nvme.count * node.nvme.bandwidth_GBps * 1e9
        drives = where(nvme, 2 * node.gpus_per_node * psi_local * state_bytes.OPTIMIZER_BYTES_PER_PARAM / nvme_bw, 0.0)
    k = OFFLOAD_SUBGROUPS
    step = down + (cpu + up + drives) / k + (k - 1) / k * maximum(maximum(cpu, up), drives)
    return where(offloaded, step, 0.0)


def offloaded_param_fetch(node: NodeProfile, params: Any, d: Any, nvme: Any) -> Any:
    """ZeRO-Infinity (zero=3 with offload): seconds to bring this rank's 1/d shard of a stage's
    ``params`` parameters up for one pass: over its PCIe link, and first from NVMe (shared by the
    node's ranks) with offload=nvme (``nvme``); prefetched layer by layer, so reads and copies
    overlap."""
    shard = params * 2 / d
    fetch = shard / node.pcie.bytes_per_s
    if node.nvme is None:
        return fetch
    return where(
        nvme, maximum(fetch, shard * node.gpus_per_node / (node.nvme.count * node.nvme.bandwidth_GBps * 1e9)), fetch
    )


def fetch_exposed(fetch: Any, forward: Any, backward: Any, recompute: Any) -> Any:
    """What a pass's parameter fetch (:func:`offloaded_param_fetch`) exposes beyond the forward it
    runs under, and beyond the backward and recomputation."""
    return maximum(0.0, fetch - forward) + maximum(0.0, fetch - backward - recompute)


def zero_infinity_exposed(
    node: NodeProfile, cost: StageLike, dp: DpPlan, offloaded: Any, nvme: Any, runtime: Runtime
) -> Any:
    """ZeRO-3 with offload, and FSDP2's ZeRO-2: the exposed transfers per microbatch of stage
    ``cost`` of the plans ``dp`` (simulator.analytic.data_parallel.DpPlan): under FSDP2 what
    :func:`simulator.cost.offload.fsdp2_transfer_seconds` of their shard copies
    (simulator.cost.offload.fsdp2_transfers) exceeds the microbatch's compute by, else
    ZeRO-Infinity's parameter fetches (:func:`offloaded_param_fetch`, :func:`fetch_exposed`); 0
    for other plans."""
    fsdp2 = runtime.offload == "fsdp2"
    infinity = offloaded & ((dp.zero == 3) | ((dp.zero == 2) & fsdp2))
    if not any_of(infinity):
        return 0.0
    if fsdp2:
        busy = cost.forward + cost.backward + cost.recompute
        transfers = fsdp2_transfers(dp.m, dp.deferred, dp.step_gathers, dp.zero)
        return where(infinity, maximum(0.0, fsdp2_transfer_seconds(node, cost.params, dp.d, transfers) - busy), 0.0)
    fetch = offloaded_param_fetch(node, cost.params, dp.d, nvme)
    return where(infinity, fetch_exposed(fetch, cost.forward, cost.backward, cost.recompute), 0.0)
