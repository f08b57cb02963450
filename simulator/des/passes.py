"""The compute work of one pass of a microbatch through a pipeline chunk, layer by layer.

Times come from :func:`simulator.cost.block_times.block_times` (the roofline op model of
:mod:`simulator.cost.ops` on :mod:`simulator.cost.workload`'s op lists, Megatron's padded vocabulary,
backward-only ops, host launch overhead): the same numbers the analytic estimator uses.
Per layer and microbatch on one TP rank:

* forward: layer forward + 2 TP all-reduces of b*s*h (all-gather + reduce-scatter pairs with
  sequence parallelism; Narayanan et al. 2021, section 3.2), and with context parallelism what
  the K/V ring adds beside the attention (a "cp" segment, simulator.cost.context.ring_exposure;
  again in a recomputed forward or attention core, twice the traffic in backward);
* backward: [full recompute: layer forward + 2 TP all-reduces | selective: attention core]
  + layer backward + 2 TP all-reduces;
* prec=fp8 in a program that does not cache the fp8 weight copies: each forward and full
  recompute casts the layer's weights first (simulator.cost.precision.weight_cast_op);
* expert parallelism: each forward, full recompute and backward exchanges the routed tokens in
  two all-to-alls on the compute stream (an "ep" segment, simulator.cost.experts.all_to_all_time);
* the chunk's first layer carries the embedding (one TP all-reduce forward), the last layer
  the LM head (one TP all-reduce backward);
* ZB-H1 (``split``): the backward ('B') is the input gradient only, less each block's
  weight-gradient share, and a separate 'W' pass runs those shares; B keeps the linears' inputs
  (:func:`simulator.cost.memory.weight_grad_input_bytes`) and W frees them.

Memory per layer and microbatch (:func:`simulator.cost.memory.activation_bytes_per_layer`, the
layer's recompute mode), the first stage's embedding dropout mask (1 byte per element of
b*s*h, split by t with SP; its output is layer 0's input, counted with the layer; as
:func:`simulator.cost.stage_memory.stage_memory`) and the last stage's logits buffer are allocated when
the forward starts and freed when the backward ends (the loss backward's gradients,
:func:`simulator.cost.memory.logits_bytes_per_element`, while the head's backward runs); a fully recomputed layer's full
activations exist while it is recomputed and back-propagated (:mod:`simulator.cost.stage`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from simulator.cost.block_times import (
    TP_EMBEDDING,
    TP_HEAD,
    job_block_times,
    tp_backward,
    tp_forward,
    tp_per_full_recompute,
)
from simulator.cost.experts import ALL_TO_ALLS_PER_PASS
from simulator.cost.memory import (
    embedding_activation_bytes,
    logits_bytes_per_element,
    logits_elements,
    weight_grad_input_bytes,
)
from simulator.cost.ops import dtype_bytes
from simulator.cost.params import (
    embedding_params_per_rank,
    head_params_per_rank,
    layer_params_per_rank,
    layer_sharded_extra,
)
from simulator.cost.phase_memory import weight_copies_held, weight_copies_saved
from simulator.cost.precision import casts_every_forward, gathered_bytes, linear_input_bytes
from simulator.cost.stage_memory import layer_activations
from simulator.cost.state_bytes import grad_reduce_bytes, param_gather_bytes, state_bytes_per_param
from simulator.cost.workload import padded_vocab_size
from simulator.job import Job

Segments = tuple[tuple[str, float], ...]  # (segment kind, seconds) in execution order


@dataclass(frozen=True)
class Costs:
    """Per-layer durations (seconds) and sizes (bytes) shared by every pass."""

    fwd: float
    bwd: float
    attn_core: float
    tp_all_reduce: float  # one TP all-reduce of b*s*h (0 when t = 1 or communication is free)
    tp_all_reduce_bytes: float  # bytes one rank sends for it: 2(t-1)/t * b*s*h*e
    tp_fwd: float  # a layer's TP all-reduces forward (block_times.tp_forward), backward, and in a full recompute
    tp_bwd: float
    tp_rec: float
    ep_a2a: float  # a layer's token all-to-alls per pass (expert parallelism; 0 without)
    cp_f: float  # what the context-parallel K/V ring adds to a layer's forward (0 at cp = 1)
    cp_b: float  # and to its backward
    w_cast: float  # prec=fp8 without cached weight copies: a forward's cast of the layer's weights
    emb_f: float
    emb_b: float
    head_f: float
    head_b: float
    loss_comm: float  # the loss's collectives over the split vocabulary (block_comm.loss_collectives_time)
    bwd_w: float  # the weight-gradient parts of bwd, emb_b and head_b (ZB-H1's W pass)
    emb_bw: float
    head_bw: float
    w_act: float  # what a layer's weight gradient needs of its activations (kept from B to W)
    act: dict[str, float]  # activations per layer per microbatch by recompute mode
    emb_act: float  # first stage: embedding dropout mask per microbatch
    logits: float  # the last stage's logits kept per in-flight microbatch
    logits_forward: float  # and more while one microbatch's loss forward runs
    logits_backward: float  # and more while its loss backward runs
    copies_unsaved: float  # the weight copies the forward holds and the backward does not (stage_memory)
    layer_params: float
    layer_sharded_extra: float  # the other ep ranks' experts of a layer (StageShape.sharded_extra)
    emb_params: float
    head_params: float
    e: int  # activation bytes
    grad_bytes: int  # per parameter, as the gradient buckets and reduction move them
    optimizer_bytes: int
    gather_bytes: int  # per parameter of a parameter all-gather (simulator.cost.state_bytes.param_gather_bytes)
    fp8ag: int  # fp8 parameters: the layers' weights gathered at 1 byte

    def gathered(self, params: float) -> float:
        """Bytes of all-gathering one layer's ``params`` (with the embedding or head folded in):
        simulator.cost.precision.gathered_bytes."""
        return gathered_bytes(params, self.layer_params, self.gather_bytes, self.fp8ag)

    @staticmethod
    def of(job: Job, free_comm: bool = False) -> Costs:
        model, cluster, plan = job.model, job.cluster, job.plan
        e = dtype_bytes(cluster.gpu)
        b, t, sp = plan.mb, plan.t, bool(plan.sp)
        bt, kernels = job_block_times(job), job.runtime.layer_kernels
        _, _, k = state_bytes_per_param(e)
        vocab = padded_vocab_size(model, t)
        loss = job.runtime.loss(t)
        per_logit = logits_bytes_per_element(loss, e)
        logits = logits_elements(model, b, t, vocab, loss)
        tp = 0.0 if (t == 1 or free_comm) else bt.tp_all_reduce
        return Costs(
            fwd=bt.layer.forward,
            bwd=bt.layer.backward,
            attn_core=bt.layer.attention_core,
            tp_all_reduce=tp,
            tp_all_reduce_bytes=2 * (t - 1) / t * bt.act_bytes if t > 1 else 0.0,
            tp_fwd=tp_forward(model),
            tp_bwd=tp_backward(model),
            tp_rec=tp_per_full_recompute(model),
            ep_a2a=0.0 if free_comm else ALL_TO_ALLS_PER_PASS * bt.ep_all_to_all,
            cp_f=0.0 if free_comm else bt.cp_forward,
            cp_b=0.0 if free_comm else bt.cp_backward,
            w_cast=bt.fp8_weight_cast if casts_every_forward(job.runtime.fp8_weight_cache, plan) else 0.0,
            emb_f=bt.embedding.forward,
            emb_b=bt.embedding.backward,
            head_f=bt.head.forward,
            head_b=bt.head.backward,
            loss_comm=0.0 if free_comm else bt.loss_comm,
            bwd_w=bt.layer.backward_weight,
            emb_bw=bt.embedding.backward_weight,
            head_bw=bt.head.backward_weight,
            w_act=weight_grad_input_bytes(model, b, t, sp, linear_input_bytes(plan.prec, e)),
            act=dict(zip(("full", "selective", "none"), layer_activations(model, b, t, sp, e, plan.prec, kernels))),
            emb_act=embedding_activation_bytes(b, model.seq_length, model.hidden_size, t, sp),
            logits=logits * per_logit.kept,
            logits_forward=logits * per_logit.forward,
            logits_backward=logits * per_logit.backward,
            copies_unsaved=copies_unsaved(job),
            layer_params=layer_params_per_rank(model, t),
            layer_sharded_extra=layer_sharded_extra(model, t),
            emb_params=embedding_params_per_rank(model, t, vocab),
            head_params=head_params_per_rank(model, t, plan.p, vocab),
            e=e,
            grad_bytes=grad_reduce_bytes(e, job.runtime.states),
            optimizer_bytes=k,
            gather_bytes=param_gather_bytes(e),
            fp8ag=plan.fp8ag,
        )


def copies_unsaved(job: Job) -> float:
    """The program's weight copies that a rank's forward holds and its backward does not: a
    non-pipelined rank's fully recomputed layers' (simulator.cost.phase_memory.weight_copies_held
    less weight_copies_saved); 0 under a pipeline, whose autocast context spans the schedule."""
    plan, copies = job.plan, job.runtime.weight_copy_bytes
    full = plan.chunk_recompute(job.model.num_layers)[0][0] * layer_params_per_rank(job.model, plan.t)
    return weight_copies_held(copies, full) - weight_copies_saved(copies, full, full, plan.p > 1)


@dataclass(frozen=True)
class Item:
    """One layer of one pass (the embedding and head folded into the chunk's end layers)."""

    segs: tuple[tuple[str, float], ...]
    alloc_act: float = 0.0  # forward: allocated at start
    alloc_buf: float = 0.0
    work: float = 0.0  # backward: transient activations while it runs
    work_buf: float = 0.0  # transient buffers while it runs (the loss forward's or backward's, weight copies)
    free_act: float = 0.0  # backward: freed at its end
    free_buf: float = 0.0
    params: float = 0.0  # this layer's parameters on one rank (buckets, ZeRO-3 gathers)
    gathered: float = 0.0  # bytes of all-gathering them (ZeRO-3: forward and backward passes)
    units: int = 1  # sharded units they belong to: 2 where the chunk's root unit rides along (:func:`root_units`)
    tp_bytes: float = 0.0  # bytes one rank sends in TP collectives
    tp_layer_all_reduces: float = 0
    rec_full: int = 0
    rec_sel: int = 0


@dataclass(frozen=True)
class Piece:
    """Items merged into one compute task: segments, duration and memory changes."""

    segs: tuple[tuple[str, float], ...]
    dur: float
    start_mem: tuple[tuple[str, float], ...]
    end_mem: tuple[tuple[str, float], ...]
    first_params: float
    first_gathered: float  # bytes of all-gathering the first item's parameters
    params: float
    first_units: int = 1  # sharded units of the first item's parameters (Item.units)


def merge_segs(segs: list[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
    """Drop empty segments and join neighbours of the same kind."""
    out: list[tuple[str, float]] = []
    for k, d in segs:
        if d <= 0.0:
            continue
        if out and out[-1][0] == k:
            out[-1] = (k, out[-1][1] + d)
        else:
            out.append((k, d))
    return tuple(out)


def make_piece(kind: str, its: list[Item]) -> Piece:
    """Forward pieces allocate at their start; backward pieces add their largest transient
    at the start and free everything their items held at the end."""
    segs = merge_segs([s for it in its for s in it.segs])
    peak = max(its, key=lambda it: it.work + it.work_buf)  # the items run one after another
    work, work_buf = peak.work, peak.work_buf
    if kind == "F":
        start: Segments = (
            ("activations", sum(it.alloc_act for it in its)),
            ("buffers", sum(it.alloc_buf for it in its) + work_buf),
        )
        end: Segments = (("buffers", -work_buf),)
    else:
        start = (("activations", work), ("buffers", work_buf))
        end = (
            ("activations", -(work + sum(it.free_act for it in its))),
            ("buffers", -(work_buf + sum(it.free_buf for it in its))),
        )
    return Piece(
        segs,
        sum(d for _, d in segs),
        start,
        end,
        its[0].params,
        its[0].gathered,
        sum(it.params for it in its),
        its[0].units,
    )


def layer_modes(full: int, selective: int, n: int, norec: bool = False) -> list[str]:
    """Recompute mode of each layer of a chunk: the first ``full`` layers fully, the next
    ``selective`` selectively (Megatron-LM's block method), the rest not at all."""
    if norec:
        return ["none"] * n
    return ["full"] * full + ["selective"] * selective + ["none"] * (n - full - selective)


def pass_items(c: Costs, kind: str, modes: list[str], first: bool, last: bool, split: bool = False) -> list[Item]:
    """Items of a forward ('F'), backward ('B') or weight-gradient ('W') pass through a chunk
    whose layers have ``modes``; ``first``/``last``: the chunk holds the embedding / the LM head;
    ``split``: ZB-H1's input-gradient backward (module docstring). Items are in execution order
    (backward: last layer first)."""
    if kind == "W":
        return weight_items(c, len(modes), first, last)
    n = len(modes)
    out: list[Item] = []
    for i in range(n) if kind == "F" else reversed(range(n)):
        has_emb, has_head = first and i == 0, last and i == n - 1
        params = c.layer_params + (c.emb_params if has_emb else 0.0) + (c.head_params if has_head else 0.0)
        if kind == "F":
            item = forward_item(c, modes[i], has_emb, has_head, params)
        else:
            item = backward_item(c, modes[i], has_emb, has_head, params, split)
        out.append(dataclasses.replace(item, units=root_units(has_emb, has_head, first)))
    return out


def root_units(has_emb: bool, has_head: bool, first: bool) -> int:
    """Sharded units whose parameters a layer's item gathers and reduce-scatters: its layer's,
    and on the chunk's root piece the root unit's too (embedding, final norm and head, one unit:
    simulator.cost.zero3.units), whose collectives the closed form counts one per pass and
    microbatch. The root piece is the embedding's layer, or without the embedding the head's
    (the head's parameters, when the embedding's layer carries the root unit, ride along with
    their layer's collective, so that the bytes stay where the items hold them)."""
    return 2 if has_emb or (has_head and not first) else 1


def forward_item(c: Costs, mode: str, has_emb: bool, has_head: bool, params: float) -> Item:
    """One layer's forward (with the embedding before it / the head after it): its compute,
    context-ring, all-to-all and TP segments, and the activations (and logits) it allocates."""
    tp = c.tp_all_reduce
    ar = c.tp_all_reduce_bytes
    segs: list[tuple[str, float]] = []
    tp_bytes = c.tp_fwd * ar
    if has_emb:
        segs += [("fwd", c.emb_f), ("tp", TP_EMBEDDING * tp)]
        tp_bytes += TP_EMBEDDING * ar
    segs += [("fwd", c.w_cast + c.fwd), ("cp", c.cp_f), ("ep", c.ep_a2a), ("tp", c.tp_fwd * tp)]
    if has_head:
        segs += [("fwd", c.head_f), ("tp", c.loss_comm)]
    return Item(
        merge_segs(segs),
        alloc_act=c.act[mode] + (c.emb_act if has_emb else 0.0),
        alloc_buf=c.logits if has_head else 0.0,
        work_buf=c.logits_forward + c.copies_unsaved if has_head else 0.0,
        params=params,
        gathered=c.gathered(params),
        tp_bytes=tp_bytes,
        tp_layer_all_reduces=c.tp_fwd,
    )


def backward_item(c: Costs, mode: str, has_emb: bool, has_head: bool, params: float, split: bool) -> Item:
    """One layer's backward (the head's first / the embedding's last): its recomputation as
    ``mode`` says, its backward (less the weight-gradient share when ``split``), the transient
    it needs, and what it frees (less the linears' inputs the W pass keeps when ``split``)."""
    keep = c.w_act if split else 0.0  # the linears' inputs stay for the W pass
    tp = c.tp_all_reduce
    ar = c.tp_all_reduce_bytes
    segs: list[tuple[str, float]] = []
    tp_bytes = c.tp_bwd * ar
    n_ar = c.tp_bwd
    work = 0.0
    if has_head:
        segs += [("bwd", c.head_b - (c.head_bw if split else 0.0)), ("tp", TP_HEAD * tp)]
        tp_bytes += TP_HEAD * ar
    if mode == "full":
        segs += [("recompute", c.w_cast + c.fwd), ("cp", c.cp_f), ("ep", c.ep_a2a), ("tp", c.tp_rec * tp)]
        tp_bytes += c.tp_rec * ar
        n_ar += c.tp_rec
        work = c.act["none"]
    elif mode == "selective":
        segs += [("recompute", c.attn_core), ("cp", c.cp_f)]
    segs += [("bwd", c.bwd - (c.bwd_w if split else 0.0)), ("cp", c.cp_b), ("ep", c.ep_a2a), ("tp", c.tp_bwd * tp)]
    if has_emb:
        segs.append(("bwd", c.emb_b - (c.emb_bw if split else 0.0)))
    loss = c.logits_backward if has_head else 0.0  # the head's backward runs before the layer recomputes
    return Item(
        merge_segs(segs),
        work=max(work - loss, 0.0),
        work_buf=loss,
        free_act=c.act[mode] + (c.emb_act if has_emb else 0.0) - keep,
        free_buf=c.logits if has_head else 0.0,
        params=params,
        gathered=c.gathered(params),
        tp_bytes=tp_bytes,
        tp_layer_all_reduces=n_ar,
        rec_full=int(mode == "full"),
        rec_sel=int(mode == "selective"),
    )


def weight_items(c: Costs, n: int, first: bool, last: bool) -> list[Item]:
    """ZB-H1's weight-gradient pass through a chunk of ``n`` layers (last layer first): each
    layer's weight-gradient share (with the head's and the embedding's), freeing the inputs its
    B pass kept; its gradients are the ones the data-parallel reduction waits for."""
    out: list[Item] = []
    for i in reversed(range(n)):
        has_emb, has_head = first and i == 0, last and i == n - 1
        segs = [("bwd", c.head_bw)] if has_head else []
        segs.append(("bwd", c.bwd_w))
        if has_emb:
            segs.append(("bwd", c.emb_bw))
        params = c.layer_params + (c.emb_params if has_emb else 0.0) + (c.head_params if has_head else 0.0)
        out.append(Item(merge_segs(segs), free_act=c.w_act, params=params))
    return out


def bucket_groups(items: list[Item], bucket_bytes: float, grad_bytes: int) -> list[list[int]]:
    """Backward-order item indices grouped into gradient buckets of at least ``bucket_bytes``
    (whole layers, as PyTorch DDP / Megatron-LM fill their buckets in backward order)."""
    out: list[list[int]] = []
    cur: list[int] = []
    size = 0.0
    for i, it in enumerate(items):
        cur.append(i)
        size += it.params * grad_bytes
        if size >= bucket_bytes:
            out.append(cur)
            cur, size = [], 0.0
    if cur:
        out.append(cur)
    return out
