"""A microbatch's communication inside a block on one TP rank: one tensor-parallel all-reduce of
the boundary activation, one expert all-to-all, and the cross-entropy's collectives over the split
vocabulary. Their groups' links depend on the node and the network alone, so every size of a sweep
shares them (simulator.cost.block_times paces the rest at each size)."""

from __future__ import annotations

from hwprofiles.schema import ClusterSpec, GpuProfile
from simulator.cost import collectives, experts, layout
from simulator.cost.boundary import boundary_activation_bytes
from simulator.cost.cache import IdentityCache
from simulator.cost.memory import LOSS_CHUNKS
from simulator.cost.ops import dtype_bytes
from simulator.cost.workload import padded_vocab_size
from simulator.runtime_spec import CrossEntropy
from simulator.specs import ModelSpec

_COMM = IdentityCache(4096)  # comm_times per model, node, network and GPU

LOSS_VALUE_BYTES = 4  # the cross-entropy's per-token statistics are fp32


def loss_collectives_time(
    loss: CrossEntropy, tokens: float, t: int, link: collectives.GroupLink, logit_bytes: float = 0.0
) -> float:
    """Seconds per microbatch of the collectives a vocab-parallel cross-entropy runs over the
    ``t`` ranks that split the logits of ``tokens`` tokens (fp32 statistics per token):

    * ``split``, autoplan's program (autoplan/runtime/vocab_parallel.py): one all-gather of each
      rank's max, sum of exponentials and target logit, 3 values per token from each rank;
    * ``fp32``, Megatron-LM (megatron/core/tensor_parallel/cross_entropy.py,
      ``VocabParallelCrossEntropy``): three all-reduces of one value per token (the max, the
      target's logit, the sum of exponentials);
    * ``chunked``, torchtitan's loss under torch's ``loss_parallel`` (torch/distributed/tensor/
      parallel/loss.py: ``_log_softmax`` all-reduces the max and the sum of exponentials,
      ``_nll_loss_forward`` the target's logit): those three on each of LOSS_CHUNKS chunks of the
      sequence (simulator.cost.memory);
    * ``gathered``, DeepSpeed's AutoTP (deepspeed/module_inject/auto_tp.py: the training
      ``lm_head`` is a ``LinearLayer(gather_output=True)``): one all-gather of the logits, each
      rank's V/t of ``logit_bytes`` bytes per token (the whole vocabulary's logits in their dtype);
      its backward keeps the rank's slice of the gradient, no collective;
    * ``torch``, ``fused``: a loss over the whole vocabulary on each rank, no collective.

    0 with t = 1. Latency-bound: on a GPU tens of microseconds, on gloo ranks sharing cores
    milliseconds per collective."""
    if t == 1:
        return 0.0
    values = tokens * LOSS_VALUE_BYTES
    if loss == "split":
        return collectives.all_gather_time(3 * values * t, t, link)
    if loss == "fp32":
        return 3 * collectives.all_reduce_time(values, t, link)
    if loss == "chunked":
        return 3 * LOSS_CHUNKS * collectives.all_reduce_time(values / LOSS_CHUNKS, t, link)
    if loss == "gathered":
        return collectives.all_gather_time(tokens * logit_bytes, t, link)
    return 0.0


def comm_times(
    model: ModelSpec, cluster: ClusterSpec, gpu: GpuProfile, t: int, mb: int, loss: CrossEntropy
) -> tuple[float, float, float, float]:
    """(one boundary activation's bytes, one TP all-reduce of it, one expert all-to-all, the
    loss's collectives) of a microbatch of ``mb`` on ``gpu`` (the layer's attention kernel's
    view of the cluster's). Their groups' links depend on the node and the network alone
    (simulator.cost.collectives.group_link), so they are cached per model, node, network and
    GPU: every size of a sweep shares them (hwprofiles.load.with_nodes keeps those objects)."""
    return _COMM.get_or_make(
        (model, cluster.node, cluster.network, gpu), (t, mb, loss), lambda: _comm(model, cluster, gpu, t, mb, loss)
    )


def _comm(
    model: ModelSpec, cluster: ClusterSpec, gpu: GpuProfile, t: int, mb: int, loss: CrossEntropy
) -> tuple[float, float, float, float]:
    e = dtype_bytes(gpu)
    act = boundary_activation_bytes(model, mb, e)
    link = collectives.in_pass_link(cluster, layout.tp_shape(t, cluster.gpus_per_node))
    return (
        act,
        collectives.all_reduce_time(act, t, link),
        experts.all_to_all_time(model, cluster, mb, t, e),
        loss_collectives_time(loss, mb * model.seq_length, t, link, padded_vocab_size(model, t) * e),
    )
