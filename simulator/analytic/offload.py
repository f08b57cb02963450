"""Closed forms of offload (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity, Rajbhandari et al. 2021):
gradient shards down and parameter shards up over each GPU's PCIe link, Adam on the host CPU
(all of a node's ranks share it), NVMe reads and writes of the optimizer state.
"""

from __future__ import annotations

from simulator.cost import memory
from simulator.cost.stage import StageCost
from simulator.cost.step import CPU_ADAM_STATE_BYTES, OFFLOAD_SUBGROUPS
from simulator.job import Job


def offload_time(job: Job, psi_local: float) -> float:
    """Exposed offload seconds per step for ``psi_local`` parameters per rank (its 1/d shard).

    The reduced gradient shard goes down over the rank's PCIe link (2 bytes/param), then the
    step runs pipelined over k = OFFLOAD_SUBGROUPS sub-groups through the phases NVMe read +
    write of the optimizer state (nvme only; all of a node's ranks share its drives), host
    Adam (all of a node's ranks share the CPU) and the updated fp16 shard back up over PCIe
    (not with ZeRO-3, whose parameters stay on the host):
        T = down + sum(phases)/k + (k - 1)/k * max(phases)
    (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity, Rajbhandari et al. 2021)."""
    plan, node = job.plan, job.cluster.node
    if plan.offload == "none":
        return 0.0
    pcie = node.pcie.bytes_per_s
    down = psi_local * 2 / pcie + node.pcie.latency_s
    phases = [node.gpus_per_node * psi_local * CPU_ADAM_STATE_BYTES / (node.cpu_adam_GBps * 1e9)]
    if plan.zero < 3:
        phases.append(psi_local * 2 / pcie + node.pcie.latency_s)
    if plan.offload == "nvme" and node.nvme is not None:
        phases.append(
            2
            * node.gpus_per_node
            * psi_local
            * memory.OPTIMIZER_BYTES_PER_PARAM
            / (node.nvme.count * node.nvme.bandwidth_GBps * 1e9)
        )
    k = OFFLOAD_SUBGROUPS
    return down + sum(phases) / k + (k - 1) / k * max(phases)


def offloaded_param_fetch(job: Job, cost: StageCost) -> float:
    """ZeRO-Infinity (zero=3 with offload): seconds to bring this rank's 1/d parameter shard
    of the stage up for one pass: over its PCIe link, and first from NVMe (shared by the
    node's ranks) with offload=nvme; prefetched layer by layer, so reads and copies overlap."""
    plan, node = job.plan, job.cluster.node
    shard = cost.params * 2 / plan.d
    t = shard / node.pcie.bytes_per_s
    if plan.offload == "nvme" and node.nvme is not None:
        t = max(t, shard * node.gpus_per_node / (node.nvme.count * node.nvme.bandwidth_GBps * 1e9))
    return t
