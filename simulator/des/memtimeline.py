"""Memory timeline of each simulated rank: allocations and frees tied to task starts and ends.

The program attaches each change to a task (at its start or its end); once the engine has
run, the changes get their times, are replayed in time order (frees before allocations at
the same instant), and give each rank's curve, its peak, and the breakdown at the peak.
``peak_memory`` and ``fits`` of the DES result come from here, so the number of in-flight
microbatches (1F1B: p - stage, GPipe: m, interleaved: more on the first stage) is whatever
the simulated schedule really holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CATEGORIES = ("params", "grads", "optimizer", "activations", "buffers")
_CAT_INDEX = {c: i for i, c in enumerate(CATEGORIES)}


@dataclass
class RankMemory:
    """One rank's replayed timeline: (time, total bytes) points, the peak and its breakdown."""

    times: list[float]
    totals: list[float]
    peak: float
    peak_time: float
    breakdown: dict[str, float]
    max_by_category: dict[str, float] = field(default_factory=dict)


class MemoryTimeline:
    """Static allocations per rank plus task-bound changes (see module docstring)."""

    def __init__(self, ranks: int):
        self.ranks = ranks
        self.static = [[0.0] * len(CATEGORIES) for _ in range(ranks)]
        self._task: list[int] = []
        self._at_end: list[bool] = []
        self._rank: list[int] = []
        self._cat: list[int] = []
        self._delta: list[float] = []
        self._bulk: list[tuple[int, int, tuple[tuple[str, float], ...], tuple[tuple[str, float], ...]]] = []

    def add_static(self, rank: int, category: str, nbytes: float) -> None:
        """Memory held for the whole iteration (model states, persistent buffers)."""
        self.static[rank][_CAT_INDEX[category]] += nbytes

    def add(self, task: int, rank: int, at_end: bool, category: str, delta: float) -> None:
        """``delta`` bytes (negative: a free) when ``task`` starts (or ends)."""
        if delta:
            self._task.append(task)
            self._at_end.append(at_end)
            self._rank.append(rank)
            self._cat.append(_CAT_INDEX[category])
            self._delta.append(delta)

    def add_many(
        self, task: int, rank: int, at_start: tuple[tuple[str, float], ...], at_end: tuple[tuple[str, float], ...]
    ) -> None:
        """Several (category, delta) changes at ``task``'s start and end (one record)."""
        self._bulk.append((task, rank, at_start, at_end))

    def replay(self, start: list[float], end: list[float]) -> list[RankMemory]:
        """Resolve the changes against the engine's task times and replay them per rank."""
        per_rank: list[list[tuple[float, int, int, float]]] = [[] for _ in range(self.ranks)]
        for tid, at_end, rank, cat, delta in zip(self._task, self._at_end, self._rank, self._cat, self._delta):
            t = end[tid] if at_end else start[tid]
            per_rank[rank].append((t, 0 if delta < 0 else 1, cat, delta))
        idx = _CAT_INDEX
        for tid, rank, ats, ate in self._bulk:
            evs = per_rank[rank]
            for name, change in ats:
                if change:
                    evs.append((start[tid], 0 if change < 0 else 1, idx[name], change))
            for name, change in ate:
                if change:
                    evs.append((end[tid], 0 if change < 0 else 1, idx[name], change))
        out = []
        for r, evs in enumerate(per_rank):
            evs.sort()
            cur = list(self.static[r])
            total = sum(cur)
            peak, peak_t, peak_cur = total, 0.0, list(cur)
            best = list(cur)
            times, totals = [0.0], [total]
            for t, _, cat, delta in evs:
                cur[cat] += delta
                total += delta
                if cur[cat] > best[cat]:
                    best[cat] = cur[cat]
                if times[-1] == t:
                    totals[-1] = total
                else:
                    times.append(t)
                    totals.append(total)
                if total > peak:
                    peak, peak_t, peak_cur = total, t, list(cur)
            out.append(
                RankMemory(times, totals, peak, peak_t, dict(zip(CATEGORIES, peak_cur)), dict(zip(CATEGORIES, best)))
            )
        return out
