"""What a layer's, the embedding's and the head's times on one TP rank are paced from, before any
slowdown applies (:class:`BlockInputs`): their passes' op sums (:class:`BlockWork`), the
communication inside them (simulator.cost.block_comm), the eager host time of a layer's passes and
the fp8 weight cast's op sums. None of it depends on the GPU count, so every cluster size of a
sweep shares it (block_work and comm_times are cached per model and GPU, per node and network);
simulator.cost.block_times.paced_blocks paces it at each size.

Numbers for one (t, sp, mb, prec) key (:func:`block_inputs`), or arrays of many keys'
(:func:`stacked_inputs`): the batch estimate paces every key of a size at once with the same rule.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from hwprofiles.schema import ClusterSpec, GpuProfile
from simulator.cost import params
from simulator.cost.block_comm import comm_times
from simulator.cost.cache import IdentityCache
from simulator.cost.eager_layer import eager_layer_ops
from simulator.cost.ops import dtype_bytes
from simulator.cost.pass_time import PassWork, pass_work
from simulator.cost.precision import FP8, weight_cast_op
from simulator.cost.workload import (
    embedding_backward_extra_ops,
    embedding_forward_ops,
    head_backward_extra_ops,
    head_forward_ops,
    layer_backward_extra_ops,
    layer_forward_ops,
    padded_vocab_size,
)
from simulator.runtime_spec import EAGER, CrossEntropy, LayerKernels, loss_over_whole_vocabulary
from simulator.specs import ModelSpec

_WORK = IdentityCache(4096)  # block_work per model and GPU
_ROWS = IdentityCache(1024)  # each key's _row, per model, node, network, GPU, kernels and loss (stacked_inputs)


@dataclass(frozen=True)
class BlockWork:
    """The ops of a layer's, the embedding's and the head's passes on one TP rank, added up
    before any pace applies (simulator.cost.pass_time.pass_work)."""

    layer: PassWork
    embedding: PassWork
    head: PassWork


def block_work(
    model: ModelSpec, gpu: GpuProfile, t: int, sp: bool, mb: int, prec: str, kernels: LayerKernels, loss: CrossEntropy
) -> BlockWork:
    """:class:`BlockWork` of a microbatch of ``mb`` on ``gpu`` (as the layer's attention kernel sees
    it): the layer's ops (with ``kernels`` "eager", the eager program's extra ops), the embedding's
    and the head's over Megatron's padded vocabulary (``loss``: the cross-entropy's
    implementation, simulator.runtime_spec.loss_over_whole_vocabulary). Cached per model and GPU
    (by identity): every cluster size of a sweep prices the same work, each at its own pace."""
    return _WORK.get_or_make(
        (model, gpu), (t, sp, mb, prec, kernels, loss), lambda: _block_work(model, gpu, t, sp, mb, prec, kernels, loss)
    )


def _block_work(
    model: ModelSpec, gpu: GpuProfile, t: int, sp: bool, mb: int, prec: str, kernels: LayerKernels, loss: CrossEntropy
) -> BlockWork:
    e, vocab = dtype_bytes(gpu), padded_vocab_size(model, t)
    layer_params = params.layer_params_per_rank(model, t)
    eager_ops = eager_layer_ops(model, mb, t, sp, layer_params, e) if kernels == EAGER else []
    return BlockWork(
        layer=pass_work(
            layer_forward_ops(model, mb, t, sp, e, prec) + eager_ops,
            gpu,
            layer_backward_extra_ops(model, mb, t, sp, e, layer_params),
        ),
        embedding=pass_work(
            embedding_forward_ops(model, mb, t, sp, e), gpu, embedding_backward_extra_ops(model, t, e, vocab)
        ),
        head=pass_work(
            head_forward_ops(model, mb, t, sp, e, vocab, gathered=loss_over_whole_vocabulary(loss)),
            gpu,
            head_backward_extra_ops(model, t, e, vocab),
        ),
    )


@dataclass(frozen=True)
class BlockInputs:
    """What :func:`simulator.cost.block_times.paced_blocks` paces (module docstring): numbers of one
    key, or arrays of many keys' (one element per key)."""

    work: BlockWork
    comm: tuple[Any, Any, Any, Any]  # block_comm.comm_times: activation bytes, TP all-reduce, all-to-all, loss
    layer_host_us: tuple[Any, Any] | None  # the GPU's eager (forward, backward) host time of a layer; None: per op
    cast: PassWork | None  # the fp8 weight cast's op sums; None where no key is fp8
    fp8: Any  # the key's precision is fp8
    t: Any
    sp: Any


def block_inputs(
    model: ModelSpec,
    cluster: ClusterSpec,
    gpu: GpuProfile,
    t: int,
    sp: bool,
    mb: int,
    prec: str,
    kernels: LayerKernels,
    loss: CrossEntropy,
) -> BlockInputs:
    """:class:`BlockInputs` of one key on ``cluster`` (``gpu``: its GPU as the layer's attention
    kernel sees it); the eager host time is the GPU profile's, with its tensor-parallel and Llama
    figures where measured (GpuProfile.layer_us)."""
    eager, fp8 = gpu.eager, prec == FP8
    return BlockInputs(
        work=block_work(model, gpu, t, sp, mb, prec, kernels, loss),
        comm=comm_times(model, cluster, gpu, t, mb, loss),
        layer_host_us=eager.layer_us(t > 1, llama=model.normalization == "RMSNorm") if eager else None,
        cast=pass_work([weight_cast_op(model, t, dtype_bytes(gpu))], gpu) if fp8 else None,
        fp8=fp8,
        t=t,
        sp=sp,
    )


def stacked_inputs(
    model: ModelSpec,
    cluster: ClusterSpec,
    gpu: GpuProfile,
    keys: Sequence[tuple[int, bool, int, str]],
    kernels: LayerKernels,
    losses: Sequence[CrossEntropy],
) -> BlockInputs:
    """:class:`BlockInputs` of the (t, sp, mb, prec) ``keys`` with each key's loss (``losses``),
    each field an array over them: each key's inputs read as one row of numbers (:func:`_row`,
    cached per model, node, network and GPU: every size of a sweep asks for the same keys
    again), stacked into columns."""
    # each key's row, by (t, sp, mb, prec, loss), of what a key's inputs depend on
    known: dict = _ROWS.get_or_make((model, cluster.node, cluster.network, gpu), kernels, dict)
    rows = []
    for key, loss in zip(keys, losses):
        found = known.get((*key, loss))
        if found is None:
            found = known[(*key, loss)] = _row(block_inputs(model, cluster, gpu, *key, kernels, loss))
        rows.append(found)
    columns = iter(np.stack(rows, axis=1))
    work = BlockWork(*(_work_of(columns) for _ in fields(BlockWork)))
    cast = _work_of(columns)
    comm = (next(columns), next(columns), next(columns), next(columns))
    host = (next(columns), next(columns))
    fp8, t, sp = next(columns) != 0, next(columns), next(columns)
    return BlockInputs(work, comm, None if gpu.eager is None else host, cast if fp8.any() else None, fp8, t, sp)


def _row(x: BlockInputs) -> np.ndarray:
    """One key's :class:`BlockInputs` ``x`` as an array of numbers, in the order
    :func:`stacked_inputs` reads them: the layer's, embedding's and head's PassWork fields, the
    fp8 weight cast's (zeros for a key of another precision, which ``fp8`` masks), the
    communication, the eager host time (0 without one), fp8, t, sp."""
    works = (x.work.layer, x.work.embedding, x.work.head)
    cast = [0.0] * len(fields(PassWork)) if x.cast is None else [getattr(x.cast, f.name) for f in fields(PassWork)]
    numbers = [
        *(getattr(w, f.name) for w in works for f in fields(PassWork)),
        *cast,
        *x.comm,
        *(x.layer_host_us or (0.0, 0.0)),
        x.fp8,
        x.t,
        x.sp,
    ]
    return np.array(numbers, dtype=float)


def _work_of(columns: Iterator[np.ndarray]) -> PassWork:
    """A PassWork of the next of ``columns``, one per field (numbers or arrays alike)."""
    values: list[Any] = [next(columns) for _ in fields(PassWork)]
    return PassWork(*values)
