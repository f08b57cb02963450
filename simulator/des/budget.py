"""What a DES run would cost, estimated before it runs, and the time budget the commands keep to.

A run's CPU time is its engine events over the engine's speed. Both are known before it runs,
closely enough to keep ``autoplan plan`` and ``autoplan simulate`` within about
:data:`DES_BUDGET_S` seconds: :func:`estimated_events` counts the events from the plan's
shape, :func:`over_budget` says whether that many events on so many worker processes would
run past the budget, and why, in one line (the commands then take the analytic estimate, or
refuse what only the DES can do).
"""

from __future__ import annotations

from collections.abc import Sequence

from hwprofiles.errors import InputError
from simulator.cost.fsdp2_window import step_gathers
from simulator.cost.rank_view import rank_job
from simulator.des.program.compute import ReductionMode
from simulator.job import Job

#: (model, cluster, nodes, seq or None, global batch, plan): the runs that measure the engine's
#: speed, a deep interleaved pipeline of whole passes and a ZeRO-3 plan split into layers
REFERENCE_RUNS: tuple[tuple[str, str, int, int | None, int, str], ...] = (
    ("gpt-1t", "dgx-a100-80gb", 64, None, 512, "t=8,p=64,ckpt=full,schedule=interleaved,v=2"),
    ("llama3-8b", "dgx-h100", 1, 131072, 256, "t=2,cp=4,zero=3,ckpt=none,sp=1,offload=cpu,prec=fp8"),
    ("gpt3-175b", "dgx-a100-80gb", 128, None, 1536, "t=8,p=16,d=8,mb=1,zero=3,ckpt=full,sp=1"),
)

#: seconds a command may spend in the DES (the issue's "about 20 s on 2 cores")
DES_BUDGET_S = 20.0

#: engine events per CPU second, the slow end of what large runs reach on this project's 2-core
#: machine, measured (2026-11-26) with ``python -m simulator.des.budget`` on :data:`REFERENCE_RUNS`:
#: gpt-1t's interleaved pipeline, 779,742 events in 6.9 to 7.2 CPU s (108,000 to 113,000 events/s;
#: 67,000 with another busy process on the cores), llama3-8b's ZeRO-3 layers, 229,394 events in
#: 1.3 to 1.4 CPU s (163,000 to 173,000 events/s). The rate falls as more flows are in flight.
#: On a 2.2x faster 2-core VM (2026-11-29): 298,000, 330,000 and, for gpt3-175b's ZeRO-3 over 8
#: nodes (tens of flows in flight, one ring per stage), 108,600 events/s, whose 317,992 events
#: :func:`estimated_events` puts at 663,552: its estimate, at the pipeline's rate, is 1.3 times
#: short (before each allocation refilled only the flows linked to a change,
#: simulator.des.network, the run took 13.7 s at 23,000 events/s: six times short). Later that day,
#: with a lone flow's end and latency one event (Network.add) and the engine's hot paths trimmed:
#: 403,000, 334,000 and 77,000 events/s (fewer events for the same run: 1.62, 0.54 and 4.05 CPU s).
DES_EVENTS_PER_S = 100_000.0

#: the most events a run may take: DES_BUDGET_S * DES_EVENTS_PER_S
DES_MAX_EVENTS = DES_BUDGET_S * DES_EVENTS_PER_S

#: events per compute piece that is a whole pass or one gradient bucket of one: its task's
#: start and end, and the transfer beside it (a pipeline send or the bucket's reduction: start,
#: its flow's end with the latency after it when it ran alone, simulator.des.network.Network.add,
#: else a network event and the latency, end); 4.2 to 4.9 measured per whole pass (2026-11-29:
#: gpt-1t's interleaved reference run 652,603 events, gpt3-175b t=8,p=16 30,113)
EVENTS_PER_PIECE = 5.0

#: events per layer of a ZeRO-3 pass: the layer's task, its parameter gather and (backward) its
#: gradient reduce-scatter, each with network events; 8 to 14 measured (14.0: llama3-8b cp=8,
#: 57,388 events for 4,096 layer passes, 2026-11-29)
EVENTS_PER_ZERO3_LAYER = 14.0


def estimated_events(job: Job, full: bool = False) -> float:
    """About how many engine events the DES of ``job`` takes (an upper estimate):

        ranks * m * v * pieces_per_microbatch_chunk * events_per_piece

    for the job as the DES simulates it (its rank view, simulator.cost.rank_view): ``ranks`` =
    p (one pipeline by symmetry) or p*d*t (``full``); m microbatches through v chunks per rank;
    per microbatch and chunk, the passes (F and B, plus W for split-backward schedules), each
    one compute piece (:data:`EVENTS_PER_PIECE`) except where the program splits them by layer
    (simulator.des.program.compute): ZeRO-3 splits every pass into its L/(p*v) layers
    (:data:`EVENTS_PER_ZERO3_LAYER`; FSDP2's ZeRO-2 under a pipeline only the passes that gather,
    simulator.cost.fsdp2_window.step_gathers, and the reduce-scatters after the last backward), ZeRO-2
    with overlapped reduction every backward into
    per-layer gradient buckets (a bucket is at least one layer). Step-end work (optimizer,
    all-gathers) is a few events per rank and left out."""
    view = rank_job(job)
    plan = view.plan
    mode = ReductionMode.of(view)
    ranks = plan.p * (plan.d * plan.t if full else 1)
    layers = view.model.num_layers / (plan.p * plan.v)  # per chunk
    passes = 3 if plan.split_backward else 2  # per microbatch and chunk
    if mode.zero3 and mode.deferred and not (mode.serial or mode.backward_gathers):
        # FSDP2's ZeRO-2 under a pipeline: the passes that gather split into layers, and the reduce-scatters
        gathers = step_gathers(plan.schedule, plan.p, view.m, plan.v, plan.zero)
        per_chunk = passes * EVENTS_PER_PIECE + (gathers + 1) * layers * EVENTS_PER_ZERO3_LAYER / view.m
    elif mode.zero3:
        per_chunk = passes * layers * EVENTS_PER_ZERO3_LAYER
    elif mode.overlap and mode.per_mb:
        per_chunk = (passes - 1 + layers) * EVENTS_PER_PIECE
    else:
        per_chunk = passes * EVENTS_PER_PIECE
    return ranks * view.m * plan.v * per_chunk


def estimated_seconds(events: float, workers: int = 1) -> float:
    """Wall seconds of ``events`` engine events shared by ``workers`` processes: events /
    (workers * DES_EVENTS_PER_S)."""
    return events / (max(workers, 1) * DES_EVENTS_PER_S)


def over_budget(jobs: Sequence[Job], workers: int = 1, full: bool = False) -> str | None:
    """None when the DES of ``jobs``, shared by ``workers`` processes, keeps to :data:`DES_BUDGET_S`
    (by :func:`estimated_events` and :func:`estimated_seconds`); otherwise why not, in one line.
    The topology, built once per cluster, is left out: at most ~2.3 s, at simulator.DES_MAX_GPUS."""
    events = sum(estimated_events(job, full) for job in jobs)
    seconds = estimated_seconds(events, workers)
    if seconds <= DES_BUDGET_S:
        return None
    on = f" on {workers} workers" if workers > 1 else ""
    return (
        f"the DES would take about {events:,.0f} events (~{seconds:,.0f} s{on} at "
        f"{DES_EVENTS_PER_S:,.0f} events/s), over the {DES_BUDGET_S:.0f} s budget"
    )


def des_within_budget(jobs: Sequence[Job], workers: int, full: bool, des_only: Sequence[str]) -> str | None:
    """None when the DES of ``jobs`` keeps to the budget (:func:`over_budget`); otherwise why
    not, for the caller to take the analytic estimate (warned about: :func:`fallback_warning`).
    ``des_only``: the given options that only the DES serves (--full, --plot, --trace): with any,
    an over-budget run is refused instead (InputError, one line)."""
    reason = over_budget(jobs, workers, full)
    if reason is not None and des_only:
        verb, it = ("needs", "it") if len(des_only) == 1 else ("need", "them")
        raise InputError(f"{reason}; {' and '.join(des_only)} {verb} the DES: drop {it} for the analytic estimate")
    return reason


def fallback_warning(reason: str) -> str:
    """The warning line of a command that takes the analytic estimate for ``reason`` (over_budget's)."""
    return f"autoplan: {reason}: using the analytic estimate instead (fidelity analytic)"


def measure() -> None:
    """Print each reference run's events, CPU seconds and events per CPU second, beside
    :func:`estimated_events` (``python -m simulator.des.budget``)."""
    import time

    from hwprofiles.load import load_cluster
    from simulator.des.simulate import simulate_des
    from simulator.model_files import load_model
    from simulator.plan import parse_plan

    for model_name, cluster_name, nodes, seq, batch, plan_text in REFERENCE_RUNS:
        model = load_model(model_name, seq)
        cluster = load_cluster(cluster_name, nodes)
        job = Job(model, cluster, parse_plan(plan_text, model, cluster.num_gpus, batch)[0], batch)
        simulate_des(job)  # the topology, built once per cluster
        t0 = time.process_time()
        events = simulate_des(job).extra["events"]
        cpu = time.process_time() - t0
        print(
            f"{model_name} on {nodes} x {cluster_name}, B={batch}, {plan_text}: {events:,} events "
            f"(estimated {estimated_events(job):,.0f}) in {cpu:.2f} CPU s = {events / cpu:,.0f} events/s"
        )


if __name__ == "__main__":
    measure()
