"""Every rule a plan must keep for a model, a GPU count and a global batch, each family in its
own function with its own message (:func:`plan_errors`); :func:`validate_plan` raises the first
as a :class:`PlanError`, :func:`parse_plan` parses and validates a plan string."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hwprofiles.errors import PlanError
from simulator.plan.fields import ZERO_STAGES, Offload, Plan, Precision, Schedule, num_microbatches
from simulator.plan.text import parse_plan_items, resolve_plan
from simulator.specs import ModelSpec

if TYPE_CHECKING:
    from hwprofiles.schema import GpuProfile, NodeProfile


def plan_errors(model: ModelSpec, plan: Plan, gpus: int, global_batch: int) -> list[str]:
    """Every rule a plan breaks for this model, GPU count and global batch (empty: valid)."""
    e = [
        f"{key} must be a positive integer, got {getattr(plan, key)}"
        for key in ("t", "p", "d", "mb", "v", "cp", "ep")
        if getattr(plan, key) < 1
    ]
    if e:
        return e
    e += _layout_errors(model, plan, gpus) + context_errors(model, plan) + expert_errors(model, plan)
    if global_batch < 1:
        e.append(f"global batch must be positive, got {global_batch}")
    elif global_batch % (plan.d * plan.mb):
        e.append(f"global batch {global_batch} is not divisible by d*mb = {plan.d}*{plan.mb} = {plan.d * plan.mb}")
    m = global_batch // (plan.d * plan.mb) if global_batch > 0 else 0
    e += _schedule_errors(plan, m) + _split_errors(model, plan) + _memory_errors(plan)
    return e + fp8_shape_errors(model, plan) + fp8_param_errors(plan)


def fp8_shape_errors(model: ModelSpec, plan: Plan) -> list[str]:
    """fp8 GEMMs need each linear layer's input of height divisible by 8 and width by 16
    (Transformer Engine ``assert_dim_for_fp8_exec``, transformer_engine/pytorch/utils.py): the
    tokens of a microbatch, and h, the QKV, ffn and projection widths on one tensor rank."""
    if plan.prec != Precision.FP8:
        return []
    if model.num_experts:
        return [
            "prec=fp8 with a mixture of experts is not modelled (Transformer Engine's grouped fp8 GEMMs); use prec=bf16"
        ]
    widths = {
        "hidden_size": model.hidden_size,
        "the QKV width per tensor rank": (model.hidden_size + 2 * model.kv_size) // plan.t,
        "ffn_hidden_size per tensor rank": model.ffn // plan.t,
        "hidden_size per tensor rank": model.hidden_size // plan.t,
    }
    bad = [f"{name} {w}" for name, w in widths.items() if w % 16]
    tokens = plan.mb * model.seq_length // plan.cp
    if tokens % 8:
        bad.append(f"the {tokens} tokens of a microbatch on one rank (a multiple of 8 is needed)")
    return [f"prec=fp8 needs GEMM dimensions divisible by 16: {', '.join(bad)}"] if bad else []


def fp8_param_errors(plan: Plan) -> list[str]:
    """fp8 parameters (fp8ag=1) are fp8 GEMMs' weights, kept and gathered by a sharded optimizer
    or FSDP (Megatron-LM arguments.py: "--fp8-param-gather only supported with distributed
    optimizer, torch fsdp2, megatron fsdp"; TransformerConfig: "fp8_param must be used together
    with fp8 mode")."""
    if plan.fp8ag not in (0, 1):
        return [f"fp8ag must be 0 or 1, got {plan.fp8ag}"]
    if not plan.fp8ag:
        return []
    e = []
    if plan.prec != Precision.FP8:
        e.append(f"fp8ag=1 (fp8 parameters) needs prec=fp8, got prec={plan.prec}")
    if plan.zero < 1:
        e.append("fp8ag=1 (fp8 parameters, all-gathered in fp8) needs zero >= 1 (a sharded optimizer or FSDP)")
    if plan.offload != "none":
        e.append(f"fp8ag=1 with offload={plan.offload} is not modelled (fp8 parameters offloaded); use offload=none")
    return e


def precision_errors(plan: Plan, gpu: GpuProfile) -> list[str]:
    """prec=fp8 needs a GPU with an fp8 peak and a measured fp8 GEMM efficiency (``gemm.fp8``:
    the datasheet's 2x is not what fp8 GEMMs deliver)."""
    if plan.prec != Precision.FP8:
        return []
    if "fp8" not in gpu.peak_tflops or gpu.gemm.fp8 is None:
        return [
            f"prec=fp8 needs fp8 tensor cores: the GPU profile {gpu.name} gives no fp8 peak and fp8 GEMM "
            "efficiency (peak_tflops.fp8, gemm.fp8); use prec=bf16"
        ]
    return []


def offload_errors(plan: Plan, node: NodeProfile) -> list[str]:
    """offload=nvme needs NVMe drives in the node (its profile's ``nvme:``), where ZeRO-Infinity
    keeps the optimizer state."""
    if plan.offload == Offload.NVME and node.nvme is None:
        return [f"offload=nvme needs NVMe drives: the node profile {node.name} has none (no 'nvme:'); use offload=cpu"]
    return []


def _layout_errors(model: ModelSpec, plan: Plan, gpus: int) -> list[str]:
    """ZeRO and SP values, t*p*d against the cluster, t against the heads, KV groups and ffn."""
    e: list[str] = []
    if plan.zero not in ZERO_STAGES:
        e.append(f"zero must be 0, 1, 2 or 3, got {plan.zero}")
    if plan.sp not in (0, 1):
        e.append(f"sp must be 0 or 1, got {plan.sp}")
    if plan.gpus != gpus:
        what = (
            f"t*cp*p*d = {plan.t}*{plan.cp}*{plan.p}*{plan.d}" if plan.cp > 1 else f"t*p*d = {plan.t}*{plan.p}*{plan.d}"
        )
        e.append(f"{what} = {plan.gpus} but the cluster has {gpus} GPUs")
    if model.num_attention_heads % plan.t:
        e.append(f"t={plan.t} does not divide num_attention_heads={model.num_attention_heads}")
    if model.kv_heads % plan.t:
        e.append(f"t={plan.t} does not divide the {model.kv_heads} KV heads (num_query_groups)")
    if model.ffn % plan.t:
        e.append(f"t={plan.t} does not divide ffn_hidden_size={model.ffn}")
    if plan.sp and plan.t == 1:
        e.append("sp=1 (sequence parallelism) needs t > 1")
    if plan.sp and model.seq_length % (plan.t * plan.cp):
        rank_seq = "seq_length" if plan.cp == 1 else f"the {model.seq_length}/{plan.cp}-token sequence chunk of a rank"
        e.append(f"sp=1 needs t={plan.t} to divide {rank_seq} (seq_length={model.seq_length})")
    return e


def expert_errors(model: ModelSpec, plan: Plan) -> list[str]:
    """Expert parallelism needs a mixture of experts whose experts it divides, carved from the
    d*cp ranks holding the same weights (Megatron-LM: the expert-parallel group lies inside the
    data-parallel-with-context one), so ep divides d*cp."""
    if plan.ep == 1:
        return []
    if not model.num_experts:
        return [f"ep={plan.ep} (expert parallelism) needs a mixture of experts; {model.name} has dense MLPs"]
    e: list[str] = []
    if model.num_experts % plan.ep:
        e.append(f"ep={plan.ep} does not divide the {model.num_experts} experts")
    if plan.grad_group % plan.ep:
        what = "d" if plan.cp == 1 else "d*cp"
        e.append(f"ep={plan.ep} must divide {what}={plan.grad_group} (expert ranks are data-parallel ranks)")
    return e


def context_errors(model: ModelSpec, plan: Plan) -> list[str]:
    """Context parallelism splits each sequence into 2*cp chunks, two per rank (the causal
    load balancing of Megatron-LM's ``get_batch_on_this_cp_rank`` and Transformer Engine's
    ring attention, which requires ``seq_len % (2 * cp_size) == 0``), and needs fused
    (flash) attention: the ring exchanges keys and values between flash-attention steps
    (transformer_engine/pytorch/attention, ``AttnFuncWithCPAndKVP2P``)."""
    if plan.cp == 1:
        return []
    e: list[str] = []
    if model.seq_length % (2 * plan.cp):
        e.append(f"cp={plan.cp} needs seq_length={model.seq_length} divisible by 2*cp = {2 * plan.cp}")
    if model.attention != "flash":
        e.append(
            f"cp={plan.cp} (context parallelism) needs flash attention; the model uses attention={model.attention}"
        )
    return e


def _schedule_errors(plan: Plan, m: int) -> list[str]:
    """Virtual stages need the interleaved schedule, which needs p >= 2, v >= 2 and m % p == 0;
    the zero-bubble schedule needs a pipeline (p >= 2) and unsharded gradients (zero <= 1)."""
    e = zero_bubble_errors(plan)
    if plan.v > 1 and plan.schedule not in (Schedule.INTERLEAVED, Schedule.ZB_V):
        e.append(f"v={plan.v} needs schedule=interleaved or zbv (got {plan.schedule})")
    if plan.schedule == Schedule.INTERLEAVED:
        if plan.p < 2:
            e.append("schedule=interleaved needs p >= 2")
        if plan.v < 2:
            e.append("schedule=interleaved needs v >= 2 virtual stages per device")
        if m and m % plan.p:
            e.append(f"interleaved schedule needs the {m} microbatches to be a multiple of p={plan.p}")
    return e


def zero_bubble_errors(plan: Plan) -> list[str]:
    """The zero-bubble schedules need a pipeline (p >= 2) and unsharded gradients (zero <= 1);
    ZB-V exactly two chunks per rank (torch's ScheduleZBVZeroBubble: "ZBV requires exactly 2
    stages per rank")."""
    e: list[str] = []
    if not plan.split_backward:
        return e
    if plan.p < 2:
        e.append(f"schedule={plan.schedule} (zero bubble) needs p >= 2")
    if plan.schedule == Schedule.ZB_V and plan.v != 2:
        e.append(f"schedule=zbv runs two chunks per rank in a V: it needs v=2, got v={plan.v}")
    if plan.zero >= 2:
        e.append(
            f"schedule={plan.schedule} with zero={plan.zero} is not modelled (sharded gradients reduced from the "
            "split weight-gradient passes); use zero=0 or 1"
        )
    return e


def _split_errors(model: ModelSpec, plan: Plan) -> list[str]:
    """The layer split (uniform or layers=) and the recompute map against the model's layers."""
    e: list[str] = []
    chunks = plan.p * plan.v
    if plan.layers is None:
        if model.num_layers < chunks:
            e.append(f"p*v = {chunks} pipeline chunks exceed the model's {model.num_layers} layers")
        elif plan.v > 1 and model.num_layers % chunks:
            e.append(
                f"v={plan.v} chunks per rank need p*v = {chunks} to divide num_layers={model.num_layers} "
                "(or a layers= split)"
            )
    elif len(plan.layers) != chunks:
        e.append(f"layers= gives {len(plan.layers)} stage sizes, expected p*v = {chunks}")
    elif sum(plan.layers) != model.num_layers or min(plan.layers) < 1:
        e.append(
            f"layers= must be positive and sum to num_layers={model.num_layers}, got {'/'.join(map(str, plan.layers))}"
        )
    if plan.recompute is not None:
        sizes = plan.chunk_layers(model.num_layers)
        if len(plan.recompute) != len(sizes):
            e.append(f"recompute= gives {len(plan.recompute)} entries, expected p*v = {chunks}")
        else:
            for i, ((f, s), n) in enumerate(zip(plan.recompute, sizes)):
                if f < 0 or s < 0 or f + s > n:
                    e.append(f"recompute= chunk {i}: {f} full + {s} selective exceeds its {n} layers")
                    break
    return e


def _memory_errors(plan: Plan) -> list[str]:
    """Offload needs a ZeRO stage that partitions the optimizer state; NVMe needs ZeRO-3;
    hybrid sharding needs ZeRO-2/3 and a shard group that divides d."""
    e = hsdp_errors(plan)
    if plan.offload != Offload.NONE and plan.zero == 0:
        e.append(f"offload={plan.offload} needs zero >= 1 (ZeRO-Offload partitions the optimizer state)")
    if plan.offload == Offload.NVME and plan.zero != 3:
        e.append("offload=nvme needs zero=3 (ZeRO-Infinity)")
    return e


def hsdp_errors(plan: Plan) -> list[str]:
    """Hybrid sharding needs ZeRO-2/3, no offload, and a shard group of 2 to g-1 ranks that
    divides the g = d*cp ranks holding the same weights (Plan.grad_group) and holds whole
    expert-parallel groups (each expert's states are sharded over hsdp/ep ranks)."""
    e: list[str] = []
    if not plan.hsdp:
        return e
    if plan.zero < 2:
        e.append(f"hsdp={plan.hsdp} (hybrid sharding) needs zero=2 or zero=3, got zero={plan.zero}")
    g = plan.grad_group
    if plan.hsdp < 2 or plan.hsdp >= g or g % plan.hsdp:
        name = "d" if plan.cp == 1 else "d*cp"
        e.append(
            f"hsdp={plan.hsdp} must divide {name}={g} and lie between 2 and {name}-1 (hsdp={name} is plain sharding)"
        )
    if plan.offload != Offload.NONE:
        e.append(f"hsdp={plan.hsdp} with offload={plan.offload} is not modelled")
    if plan.hsdp % plan.ep:
        e.append(f"hsdp={plan.hsdp} must be a multiple of ep={plan.ep} (a shard group holds whole expert groups)")
    return e


def validate_plan(model: ModelSpec, plan: Plan, gpus: int, global_batch: int, source: str = "--plan") -> int:
    """Raise PlanError with the first broken rule; return the microbatch count m."""
    errors = plan_errors(model, plan, gpus, global_batch)
    if errors:
        more = f" (and {len(errors) - 1} more: {'; '.join(errors[1:])})" if len(errors) > 1 else ""
        raise PlanError(f"{source}: {errors[0]}{more}")
    return num_microbatches(plan, global_batch)


def parse_plan(text: str, model: ModelSpec, gpus: int, global_batch: int, source: str = "--plan") -> tuple[Plan, int]:
    """Parse and validate a plan string; returns (plan, num_microbatches)."""
    plan = resolve_plan(parse_plan_items(text, source), gpus, source)
    return plan, validate_plan(model, plan, gpus, global_batch, source)
