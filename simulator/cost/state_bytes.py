"""Bytes per parameter: what a program's model states hold and what its data-parallel collectives
move, by the compute dtype's e bytes and the program's state layout (simulator.runtime_spec.
StateLayout). Pure functions; the memory model (simulator.cost.memory), the step's rules
(simulator.cost.step) and the DES read them.
"""

from __future__ import annotations

from simulator.runtime_spec import ScatterGather, StateLayout

# Mixed-precision Adam: fp32 master params, momentum and variance (Rajbhandari et al. 2020, ZeRO, section 3.1).
OPTIMIZER_BYTES_PER_PARAM = 12  # K
PARAM_BYTES = 2  # fp16/bf16 working copy
GRAD_BYTES = 2  # fp16/bf16 gradients


def state_bytes_per_param(e: int) -> tuple[int, int, int]:
    """(param, grad, optimizer) bytes per parameter for training in a dtype of e bytes:
    mixed precision (e = 2): 2, 2, 12 (fp32 master + Adam moments, ZeRO section 3.1);
    plain fp32 (e = 4, the CPU runs): 4, 4, 8 (Adam moments only)."""
    return (2, 2, 12) if e <= 2 else (4, 4, 8)


def program_state_bytes(
    layout: StateLayout, e: int, zero: int, scatter_gather: ScatterGather = "native"
) -> tuple[int, int, int]:
    """(param, grad, optimizer) bytes per parameter a program keeps, before ZeRO sharding:

    * ``mixed``: :func:`state_bytes_per_param` (Megatron-LM, DeepSpeed: e-byte weights and
      gradients, fp32 master weights and Adam moments);
    * ``fp32-params``: autoplan's program (autoplan/runtime/trainer.py), whose parameters stay
      fp32 with fp32 ``.grad`` (autocast computes in bf16 on a GPU): 4, 4, 8 (Adam's moments);
      with zero=1 its optimizer (autoplan/runtime/zero1.py) also keeps a full fp32 flat buffer
      of the parameters (counted with the gradients, which it reduce-scatters: 8) and, for its
      1/d shard, an fp32 master copy and its gradient beside Adam's moments (16, sharded); where
      its ZeRO-1 all-reduces the buffer in place (``scatter_gather`` "all-reduce":
      Runtime.scatter_gather, on gloo) the shard's gradient is a view of the buffer (12).
    """
    if layout == "mixed":
        return state_bytes_per_param(e)
    if zero != 1:
        return (4, 4, 8)
    return (4, 8, 12 if scatter_gather == "all-reduce" else 16)


def param_gather_bytes(e: int) -> int:
    """Bytes per parameter of each pass's parameter all-gathers and of what they hold (ZeRO-3,
    FSDP2's ZeRO-2): the compute dtype's e, the fp16/bf16 working copy (FSDP2's
    ``MixedPrecisionPolicy.param_dtype``, DeepSpeed's fp16 parameters), fp32 on a fp32 run
    (autoplan's program on a CPU sets no param_dtype: autoplan/runtime/trainer.py)."""
    return e


def grad_reduce_bytes(e: int, states: StateLayout) -> int:
    """Bytes per gradient element of ZeRO 0-1's reduction (ZeRO-2/3 reduce at the runtime's reduce
    dtype: simulator.cost.fsdp2_sync.reduce_bytes): the program's gradient dtype
    (:func:`program_state_bytes`): e-byte gradients in Megatron-LM and DeepSpeed ("mixed"), fp32
    ``.grad`` in autoplan's program ("fp32-params": DDP and its ZeRO-1 buffer reduce them as they
    are, autoplan/runtime/data_parallel.py, zero1.py)."""
    return program_state_bytes(states, e, 0)[1]


def step_gather_bytes(e: int, states: StateLayout) -> int:
    """Bytes per parameter of ZeRO-1's (and bucketed ZeRO-2's) gather of the updated parameters
    after the optimizer step: the program's parameter dtype (:func:`program_state_bytes`): e-byte
    weights in Megatron-LM's distributed optimizer and DeepSpeed ("mixed"), fp32 in autoplan's
    program ("fp32-params": its flat buffer of fp32 parameters, autoplan/runtime/zero1.py)."""
    return program_state_bytes(states, e, 0)[0]
