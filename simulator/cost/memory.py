"""Memory model: model states (ZeRO 0-3, offload), activations, in-flight microbatches, buffers.

All functions return bytes and are pure. Sources are named in each docstring.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

from simulator.cost.experts import routed_copies
from simulator.cost.state_bytes import GRAD_BYTES, OPTIMIZER_BYTES_PER_PARAM, PARAM_BYTES, param_gather_bytes
from simulator.numeric import any_of, maximum, minimum, where
from simulator.runtime_spec import CrossEntropy, Runtime, loss_over_whole_vocabulary
from simulator.specs import ModelSpec


@dataclass(frozen=True)
class ModelStates:
    """Bytes of model states on one rank: numbers, or arrays in the batch estimate."""

    params: Any
    grads: Any
    optimizer: Any

    @property
    def total(self) -> Any:
        return self.params + self.grads + self.optimizer


def model_state_bytes(
    psi: Any,
    d: Any,
    zero: Any,
    offload: Any = "none",
    param_bytes: Any = PARAM_BYTES,
    grad_bytes: Any = GRAD_BYTES,
    k: Any = OPTIMIZER_BYTES_PER_PARAM,
    psi_sharded: Any = None,
    whole_grad_bytes: Any = 0.0,
    unsharded_param_bytes: Any = 0.0,
) -> ModelStates:
    """Bytes of model states on one GPU for Psi parameters held by its model-parallel rank.

    ZeRO (Rajbhandari et al. 2020, Figure 1), with 2/2/K bytes per parameter:
        stage 0: 2Psi + 2Psi + K*Psi          (16 Psi with K = 12)
        stage 1: 2Psi + 2Psi + K*Psi/d
        stage 2: 2Psi + 2Psi/d + K*Psi/d
        stage 3: (2 + 2 + K)*Psi/d
    Offload (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity, Rajbhandari et al. 2021): the optimizer state
    and the fp32 gradient copy live on the host (or NVMe), so the GPU keeps no optimizer state and only a
    gradient staging bucket (counted in buffers); with stage 3 the fp16 parameters are offloaded too (the
    gathered working set is in buffers). ``psi_sharded``: the parameters whose states the d ranks shard,
    when not Psi (a mixture of experts split over ep ranks: all E experts' states are sharded over d, as
    each E/ep over d/ep; simulator.cost.rank_view).
    ``offload``: the plan's (a string), or whether it offloads (booleans). From simulator.cost.fsdp2_sync:
    ``whole_grad_bytes`` of gradients held whole on the device until the step's end; ``unsharded_param_bytes``
    (FSDP2's ZeRO-2) of an unsharded copy beside the parameters' shards (on the host when offloaded).
    Numbers or arrays alike."""
    offloaded = offload != "none" if isinstance(offload, str) else offload
    ps = psi if psi_sharded is None else psi_sharded
    shards = (zero >= 3) | (unsharded_param_bytes > 0)

    def whole_and_shard(per_param: Any) -> tuple[Any, Any]:
        """(psi * per_param, ps * per_param / d): the one product where ps is psi (the same operations)."""
        whole = psi * per_param
        return whole, (whole if ps is psi else ps * per_param) / d

    whole, shard = whole_and_shard(param_bytes)
    unsharded = psi * unsharded_param_bytes if any_of(unsharded_param_bytes > 0) else 0.0  # x + 0.0 is x
    params = where(shards, where(offloaded, 0.0, shard), whole) + unsharded
    whole, shard = whole_and_shard(grad_bytes)
    grads = where(offloaded, 0.0, where(zero >= 2, shard, whole))
    if any_of(whole_grad_bytes > 0):
        grads = where(whole_grad_bytes > 0, psi * whole_grad_bytes, grads)
    whole, shard = whole_and_shard(k)
    opt = where(offloaded, 0.0, where(zero >= 1, shard, whole))
    return ModelStates(params, grads, opt)


#: bytes per residual-stream element of a layer's two dropout masks (attention output and MLP
#: output, one byte each: Korthikanti et al. 2022, eq. 2), kept by :func:`activation_bytes_per_layer`
DROPOUT_MASK_BYTES = 2


def activation_bytes_per_layer(
    model: ModelSpec, b: int, t: int, sp: bool, ckpt: str, e: int = 2, linear_input: int | None = None
) -> float:
    """Activations one layer keeps for backward, for one microbatch, on one TP rank.

    Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
    Models"), eqs. 2-5, with fp16 (e = 2), MHA, ffn = 4h, GELU:
        t = 1:        s*b*h*(34 + 5*a*s/h)
        TP, no SP:    s*b*h*(10 + 24/t + 5*a*s/(h*t))
        TP with SP:   s*b*h*(34 + 5*a*s/h) / t
    Generalized here term by term (so GQA, other ffn sizes and SwiGLU are exact too):
        replicated (split by t only with SP): two norm inputs, QKV input, fc1 input (4e)
            and two dropout masks (2 bytes)           -> (4e + 2)*s*b*h
            (a mixture of experts keeps its router's input and probabilities and k permuted
            copies for the experts' fc1 instead of fc1's input: :func:`mlp_input_bytes`; its
            MLP activations below are k times the dense ones, f the expert width)
        tensor-parallel: Q, K, V, proj input, MLP activations
            -> e*s*b*(2h + 2kv + f_act)/t,  f_act = 2f (GELU in/out) or 3f (SwiGLU 2f in, f out)
        attention core: the materialized scores' softmax output (e), dropout mask (1) and
            dropout output (e) -> (2e + 1)*a*s^2*b/t; with FlashAttention only the row
            log-sum-exp (:func:`attention_core_bytes`)
    Selective recomputation drops the attention-score term; full recomputation keeps only
    the layer input e*s*b*h (split by t with SP). ``linear_input``: bytes per element of the
    four linear layers' saved inputs (QKV, fc1 in the replicated part; proj, fc2 in the split
    part), e by default, 1 with fp8 linears (simulator.cost.precision.linear_input_bytes):
        replicated -> (2e + 2*li + 2)*s*b*h,  split -> s*b*(e*(h + 2kv) + li*h + e*(f_act - f) + li*f)/t
    """
    s, h = model.seq_length, model.hidden_size
    sbh = s * b * h
    if ckpt == "full":
        return e * sbh / (t if sp else 1)
    li = e if linear_input is None else linear_input
    f, k = model.ffn, routed_copies(model)
    f_act = 3 * f if model.activation == "swiglu" else 2 * f
    replicated = (2 * e + li + DROPOUT_MASK_BYTES) * sbh / (t if sp else 1) + mlp_input_bytes(model, b, t, sp, e, li)
    split = s * b * (e * (h + 2 * model.kv_size) + li * h + k * (e * (f_act - f) + li * f)) / t
    scores = 0.0 if ckpt == "selective" else attention_core_bytes(model, b, t, e)
    return replicated + split + scores


def mlp_input_bytes(model: ModelSpec, b: int, t: int, sp: bool, e: int, li: int) -> float:
    """What the MLP keeps of its input for backward, per microbatch on one TP rank: fc1's input,
    li*s*b*h (split by t with SP); a mixture of experts (simulator.cost.experts) keeps the
    router's input (e*s*b*h, split by t with SP), the routing probabilities (fp32, 4*s*b*E,
    split likewise) and the k permuted copies fc1 reads, li*k*s*b*h on every tensor rank (each
    holds all its experts' rows)."""
    s, h = model.seq_length, model.hidden_size
    per_rank = t if sp else 1
    if not model.num_experts:
        return li * s * b * h / per_rank
    return (e * s * b * h + 4 * s * b * model.experts) / per_rank + li * routed_copies(model) * s * b * h


def attention_core_bytes(model: ModelSpec, b: int, t: int, e: int = 2) -> float:
    """What the attention core keeps beyond Q, K, V and its output, per layer and microbatch on
    one TP rank. Materialized scores: softmax output (e), dropout mask (1) and dropout output
    (e) over a*s^2*b/t (Korthikanti et al. 2022, eq. 2). FlashAttention keeps only the fp32
    log-sum-exp of each query row: 4*a*s*b/t (Dao et al. 2022, section 3.1)."""
    s, a = model.seq_length, model.num_attention_heads
    if model.attention == "flash":
        return 4.0 * a * s * b / t
    return (2 * e + 1) * a * s * s * b / t


def in_flight_microbatches(schedule: str, stage: int, p: int, m: int, v: int = 1) -> float:
    """Microbatches whose activations a pipeline stage holds at its peak, in units of the
    stage's whole layer set (for interleaved, counted in chunks and divided by v).

    GPipe: all m (Huang et al. 2019).  1F1B: min(p - stage, m) (Narayanan et al. 2021,
    PipeDream-Flush).  Interleaved 1F1B (Megatron-LM schedule): a rank runs
    (p - stage - 1)*2 + (v - 1)*p warm-up chunk-forwards plus one in steady state (all m*v
    forwards first when m = p), capped by the m*v chunk-forwards it has in all; each chunk
    holds 1/v of the stage. Equals max(sum(vec)) / v over :func:`chunk_occupancy`, which ZB-V
    (two chunks in a V) takes directly.
    """
    if schedule == "gpipe":
        return float(m)
    if schedule == "interleaved" and v > 1:
        warmup = m * v if m == p else (p - stage - 1) * 2 + (v - 1) * p
        return min(warmup + 1, m * v) / v
    if schedule == "zbv":  # replayed: max(sum(vec)) / v over chunk_occupancy
        return max(sum(vec) for vec in chunk_occupancy(schedule, stage, p, m, v)) / v
    return float(min(p - stage, m))


def end_chunk_in_flight(schedule: str, stage: int, p: int, m: int, v: int, local: int) -> float:
    """Microbatches whose embedding (``local`` = 0) or head (``local`` = v - 1) activations the
    stage holding that end chunk keeps at most: under ZB-V that chunk's own largest count (the
    head's chunk on rank 0 runs each forward's backward next: one), elsewhere the stage's
    :func:`in_flight_microbatches`."""
    if schedule == "zbv":
        return float(max(vec[local] for vec in chunk_occupancy(schedule, stage, p, m, v)))
    return in_flight_microbatches(schedule, stage, p, m, v)


def chunk_occupancy(schedule: str, stage: int, p: int, m: int, v: int = 1) -> tuple[tuple[int, ...], ...]:
    """The per-chunk in-flight microbatch counts a device can reach (local chunk order): after
    every forward, the vector of forwards not yet matched by their backward, per chunk. Only
    the vectors no other one dominates are kept; the activation peak is the largest of
    sum_k count_k * held_k over them. With v = 1 this is the single count of
    :func:`in_flight_microbatches`; with interleaving chunk 0 holds more than the last chunk,
    and which chunk peaks matters when chunks differ (uneven recomputation). Replayed
    (:func:`replayed_occupancy`) over :func:`occupancy_horizon` microbatches: the counts of a
    longer run are the same, so one cache entry serves every m past the horizon (the plans of a
    cluster-size sweep: each size's d gives its own m). One chunk per device (v = 1, not ZB-V):
    the count of :func:`in_flight_microbatches`, the one vector the replay reaches (checked
    against it in tests/test_memory.py)."""
    if v == 1 and schedule != "zbv":
        return ((int(in_flight_microbatches(schedule, stage, p, m, 1)),),)
    return _replayed_once(schedule, stage, p, min(m, occupancy_horizon(schedule, p, m)), v)


@functools.lru_cache(maxsize=4096)
def _replayed_once(schedule: str, stage: int, p: int, m: int, v: int) -> tuple[tuple[int, ...], ...]:
    return replayed_occupancy(schedule, stage, p, m, v)


def occupancy_horizon(schedule: str, p: int, m: int) -> int:
    """How many microbatches :func:`chunk_occupancy` needs to replay: 1F1B's, ZB-H1's, ZB-V's and
    the interleaved schedule's (with m a multiple of p, as Megatron-LM requires) counts stop
    changing once m reaches 2p -- their warm-ups run at most p - s forwards (1F1B, ZB-H1, whose
    weight passes hold no microbatch), 2p - 1 forwards of chunk 0 (ZB-V) and
    (p - s - 1) * 2 + (v - 1) * p chunk-forwards (interleaved), and later microbatches repeat
    the steady state (tests/test_zero_bubble.py and tests/test_memory.py replay m up to 6p);
    GPipe, whose every forward runs before the first backward, all m."""
    if schedule in ("1f1b", "zbh1", "zbv") or (schedule == "interleaved" and m % p == 0):
        return 2 * p
    return m


def replayed_occupancy(schedule: str, stage: int, p: int, m: int, v: int = 1) -> tuple[tuple[int, ...], ...]:
    """:func:`chunk_occupancy` by replaying the device's whole pass order
    (:func:`simulator.cost.schedules.device_order`)."""
    import numpy as np  # here, not at import: the command line's start-up does not need it

    from simulator.cost.schedules import device_order

    counts = [0] * v
    seen: set[tuple[int, ...]] = set()
    for op in device_order(schedule, p, m, v, stage):
        if op.kind == "W":  # a weight-gradient pass holds only the linears' inputs: weight_grads_pending
            continue
        counts[op.chunk] += 1 if op.kind == "F" else -1
        if op.kind == "F":
            seen.add(tuple(counts))
    vecs = sorted(seen, key=lambda x: (-sum(x), x))
    kept = np.empty((len(vecs), v), dtype=np.int64)  # the non-dominated ones so far, in their first rows
    n = 0
    for vec in vecs:  # a vector can only be dominated by one of larger (or equal) sum, kept before it
        if n == 0 or not (kept[:n] >= vec).all(axis=1).any():
            kept[n] = vec
            n += 1
    return tuple(tuple(int(x) for x in row) for row in kept[:n])


def weight_grads_pending(schedule: str, stage: int, p: int, m: int) -> float:
    """The zero-bubble schedules: the microbatches whose weight-gradient pass (W) a stage still
    owes when its in-flight forwards peak; each keeps the linears' inputs
    (:func:`weight_grad_input_bytes`) until its W. ZB-H1's stage s
    (simulator.cost.schedules.zero_bubble_h1) holds min(p - s, m) microbatches' activations and
    defers each W by s microbatches: at the forward of its i-th steady step it has run i B's
    and max(0, i - s) W's, so it owes min(i, s), most at its last forward, i = m - min(p - s - 1,
    m) - 1 (none when m < p - s): max(0, s - max(0, p - m)). ZB-V runs each W right after its
    B until the cool-down, which runs no forward, so none is owed when a forward runs: 0, as for
    the other schedules. Both are checked against a replay of the pass orders for p <= 16,
    m <= 40 (tests/test_zero_bubble.py)."""
    if schedule != "zbh1":
        return 0.0
    return float(max(0, stage - max(0, p - m)))


def weight_grad_input_bytes(model: ModelSpec, b: int, t: int, sp: bool, linear_input: int) -> float:
    """What a layer's weight gradients need of its activations, per microbatch on one TP rank:
    the four linears' saved inputs at ``linear_input`` bytes per element (the terms of
    :func:`activation_bytes_per_layer`): QKV and fc1, 2*s*b*h (split by t with SP), and proj and
    fc2, s*b*(h + f)/t; a mixture of experts' fc1 and fc2 read k permuted copies, k*s*b*h on
    every tensor rank and k*s*b*f/t."""
    s, h = model.seq_length, model.hidden_size
    k = routed_copies(model)
    mlp = linear_input * s * b * h * k / (1 if model.num_experts else (t if sp else 1))
    return linear_input * s * b * (h / (t if sp else 1) + (h + k * model.ffn) / t) + mlp


#: the sequence chunks of torchtitan's ChunkedLossWrapper (components/loss.py ``num_chunks: int = 8``)
LOSS_CHUNKS = 8


class LogitBytes(NamedTuple):
    """Bytes per logit of the last stage's loss (:func:`logits_bytes_per_element`): ``kept`` for
    each in-flight microbatch, and ``forward`` / ``backward`` more while one microbatch's loss
    forward / backward runs."""

    kept: float
    forward: float
    backward: float


def logits_bytes_per_element(loss: CrossEntropy, e: int) -> LogitBytes:
    """Bytes per logit kept for each in-flight microbatch, and more while one microbatch's loss
    forward and backward run, by how the program computes the cross-entropy:

    * ``fp32``: Megatron-LM's vocab-parallel cross-entropy (megatron/core/tensor_parallel/
      cross_entropy.py): the e-byte logits and their fp32 softmax, the gradient written over the
      softmax in place: (e + 4, 0, 0);
    * ``torch``: ``F.cross_entropy(logits.float())`` (autoplan's program, autoplan/runtime/model.py
      ``lm_loss``; torchtitan's loss): log-softmax keeps its fp32 output for backward, the forward
      holds the fp32 copy beside it, and the backward holds the incoming and the outgoing fp32
      gradient: (4, 6, 8). Measured on an H100 (benchmarks/data/h100-memory-probe.txt): 4.0 kept
      after the forward, 10.0 at the forward's peak, 12.0 at the backward's;
    * ``gathered``: ``torch``'s on the logits all-gathered to the whole vocabulary (DeepSpeed's
      AutoTP; :func:`logits_elements` counts them whole);
    * ``split``: autoplan's program with t > 1 (autoplan/runtime/vocab_parallel.py): the forward
      holds the e-byte logits, their fp32 copy (none when they are fp32 already) and the shifted
      fp32 copy that becomes the kept softmax; the backward writes the gradient over the softmax
      and casts it to the logits' dtype (a copy when it is not fp32): (4, e + copy, copy * e / 4)
      with copy = 4 if e < 4 else 0;
    * ``fused``: flash-attn's ``CrossEntropyLoss(inplace_backward=True)`` keeps the logits only: (e, 0, 0);
    * ``chunked``: torchtitan's ``ChunkedLossWrapper`` (torchtitan 0.3, components/loss.py; its
      llama3 configs' loss) runs the head and ``F.cross_entropy`` over LOSS_CHUNKS chunks of the
      sequence and each chunk's backward at once, inside the forward: nothing kept, and one chunk's
      e-byte logits with the torch loss's 12 bytes at its peak: (0, (e + 12) / LOSS_CHUNKS) twice.
    """
    if loss == "fused":
        return LogitBytes(float(e), 0.0, 0.0)
    if loss == "chunked":
        chunk = (e + 12.0) / LOSS_CHUNKS
        return LogitBytes(0.0, chunk, chunk)
    if loss in ("torch", "gathered"):  # gathered: torch's loss over the whole vocabulary (logits_elements)
        return LogitBytes(4.0, 6.0, 8.0)
    if loss == "split":
        copy = 4.0 if e < 4 else 0.0
        return LogitBytes(4.0, e + copy, copy * e / 4)
    return LogitBytes(float(e + 4), 0.0, 0.0)


def logits_elements(model: ModelSpec, b: int, t: int, vocab: int | None = None, loss: CrossEntropy = "fp32") -> float:
    """Logits of one microbatch on one TP rank: b*s*V/t, or b*s*V where the program gathers the
    ranks' logits to the whole vocabulary before its loss (``loss`` "gathered": DeepSpeed's AutoTP,
    simulator.runtime_spec.Runtime.cross_entropy). ``vocab`` is the (padded) vocabulary the
    program really allocates, default the model's."""
    return b * model.seq_length * (vocab or model.vocab_size) / (1 if loss_over_whole_vocabulary(loss) else t)


def kept_logits_bytes(elements: Any, loss: CrossEntropy = "fp32", e: int = 2, inflight: Any = 1.0) -> Any:
    """What the last stage keeps of the logits of ``inflight`` microbatches in flight, of
    ``elements`` logits each (:func:`logits_elements`): elements * inflight * kept
    (:func:`logits_bytes_per_element`). Numbers or arrays alike."""
    return elements * inflight * logits_bytes_per_element(loss, e).kept


def loss_transient_bytes(elements: Any, loss: CrossEntropy = "fp32", e: int = 2) -> tuple[Any, Any]:
    """(forward, backward): what one microbatch's loss holds beyond the kept logits while its
    forward and its backward run, ``elements`` logits (:func:`logits_bytes_per_element`).
    Numbers or arrays alike."""
    per = logits_bytes_per_element(loss, e)
    return elements * per.forward, elements * per.backward


ZERO3_LAYERS_HELD = 2  # ZeRO-3's gathered layers: the one running and the one prefetched


def zero3_working_set_bytes(layer_params_rank: float, e: int, prefetch_layers: int = ZERO3_LAYERS_HELD) -> float:
    """ZeRO-3 gathers each layer's full (TP-local) parameters before use and prefetches the
    next: about two layers of gathered parameters (:func:`param_gather_bytes`) are resident
    (Rajbhandari et al. 2021, section 5)."""
    return prefetch_layers * layer_params_rank * param_gather_bytes(e)


DP_BUCKET_BYTES = 25e6  # PyTorch DDP's default gradient bucket (``bucket_cap_mb=25``)


def bucket_bytes_of(runtime: Runtime, d: Any) -> Any:
    """The runtime's gradient bucket over ``d`` data-parallel ranks (simulator.runtime_spec.Runtime):
    max(dp_bucket_bytes, dp_bucket_bytes_per_rank * d); PyTorch DDP 25e6, Megatron-core 40M fp32
    elements (160e6 bytes) up to 40 ranks and 1M elements (4e6 bytes) per rank beyond. Numbers or
    arrays alike."""
    return maximum(runtime.dp_bucket_bytes, runtime.dp_bucket_bytes_per_rank * d)


def gradient_bucket_bytes(
    psi: Any, bucket_bytes: Any = DP_BUCKET_BYTES, grad_bytes: Any = GRAD_BYTES, every_bucket: Any = False
) -> Any:
    """Fused gradient buckets for the overlapped all-reduce / reduce-scatter: two in flight of
    ``bucket_bytes`` (the runtime's, bucket_bytes_of), capped by the gradients themselves; with
    ``every_bucket`` all of them, a copy of every gradient (PyTorch DDP without
    ``gradient_as_bucket_view``: its Reducer allocates each bucket's flat ``gradients`` tensor for
    the whole run and copies the reduced bucket back into the parameters' ``.grad``,
    torch/csrc/distributed/c10d/reducer.hpp ``Bucket::gradients``, ``copy_bucket_to_grad``).
    Numbers or arrays alike."""
    return where(every_bucket, psi * grad_bytes, minimum(psi * grad_bytes, 2 * bucket_bytes))


def embedding_activation_bytes(b: int, s: int, h: int, t: int, sp: bool) -> float:
    """The embedding dropout mask one microbatch keeps on the first stage: 1 byte per element,
    split by t with sequence parallelism (Korthikanti et al. 2022, section 4.3). The dropout
    output is layer 0's input and is counted with the layers."""
    return b * s * h / (t if sp else 1)
