"""Where a rank's iteration time goes: busy time by segment kind, waiting time by cause.

The rank's compute stream is busy with forward/backward/recompute compute, tensor-parallel
collectives (synchronous in Megatron-LM), the context-parallel ring's exposed part (``cp_comm``), the optimizer step, and what data-parallel traffic
beside a piece costs it (contention, FSDP2's copy-out: ``dp_comm``). Every gap in it, and the
tail after its last compute task, is explained by walking the chain of critical
predecessors back from the task that ended the gap (``Engine.cause``): the part of the gap
covered by a pipeline transfer is exposed ``pp_comm``, by a data-parallel or ZeRO collective
``dp_comm``, by PCIe/NVMe offload traffic ``offload``, by the host optimizer ``optimizer``;
time spent waiting on other ranks' compute (and anything left) is ``bubble``. The parts add
up to the rank's end time exactly.
"""

from __future__ import annotations

from simulator.des.engine import Engine
from simulator.result import TIME_KEYS

SEGMENT_CATEGORY = {
    "fwd": "compute",
    "bwd": "compute",
    "recompute": "recompute",
    "tp": "tp_comm",
    "cp": "cp_comm",  # what the context-parallel K/V ring adds beside the attention
    "ep": "ep_comm",  # the token all-to-alls of expert parallelism
    "opt": "optimizer",
    "dp": "dp_comm",  # the contention price of DP/ZeRO traffic beside a piece, and FSDP2's copy-out
}
TASK_CATEGORY = {"pp": "pp_comm", "dp": "dp_comm", "zero": "dp_comm", "offload": "offload", "cpu": "optimizer"}
COMPUTE_KINDS = ("F", "B", "W", "opt")  # W: ZB-H1's weight-gradient passes


def _explain_gap(eng: Engine, cause: int, g0: float, g1: float, own_stream: int, out: dict[str, float]) -> None:
    covered = g1
    cur = cause
    start, end, kind, stream = eng.start, eng.end, eng.kind, eng.stream
    while cur >= 0 and end[cur] > g0 and covered > g0:
        if stream[cur] == own_stream:
            break
        s = max(start[cur], g0)
        e = min(end[cur], covered)
        if e > s:
            out[TASK_CATEGORY.get(kind[cur], "bubble")] += e - s
            covered = s
        cur = eng.cause[cur]
    if covered > g0:
        out["bubble"] += covered - g0


def rank_breakdown(eng: Engine, compute_stream: int, final_task: int) -> dict[str, float]:
    """Time breakdown (docs/design.md section 3 keys) of the rank owning ``compute_stream``, up to
    the end of ``final_task`` (the rank's last task)."""
    out = dict.fromkeys(TIME_KEYS, 0.0)
    prev = 0.0
    for tid in eng.stream_queue[compute_stream]:
        st = eng.start[tid]
        if st > prev:
            _explain_gap(eng, eng.cause[tid], prev, st, compute_stream, out)
        for seg, d in eng.info[tid].segments:
            out[SEGMENT_CATEGORY[seg]] += d
        prev = max(prev, eng.end[tid])
    t_end = eng.end[final_task]
    if t_end > prev:
        if eng.stream[final_task] == compute_stream:
            out["bubble"] += t_end - prev
        else:
            _explain_gap(eng, final_task, prev, t_end, compute_stream, out)
            # the final task itself was walked first: nothing else to add
    return out
