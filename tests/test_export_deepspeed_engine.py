"""DeepSpeed's engine started from every DeepSpeed export of the matrix (the ``frameworks`` extra:
deepspeed 0.19.8, transformers for AutoTP and AutoEP), as each node of the plan starts it:
``deepspeed.initialize`` through the emitted ``initialize`` on the emitted ds_config.json, as the
first rank of the first and the last pipeline stage, and without a pipeline one training step
(tests/deepspeed_engines.py says how, and what is swapped for CPU). What the engine runs is compared
with the plan the export says it runs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from export_matrix import CASES, job_of

from autoplan.emit.deepspeed import export_deepspeed
from autoplan.runtime.config import TrainSettings

pytest.importorskip("deepspeed")
pytest.importorskip("transformers")
from deepspeed_engines import HIDDEN

HERE = Path(__file__).parent


#: processes that start the cases side by side (each case's engine is single-threaded work)
PARTS = min(2, os.cpu_count() or 1)


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict[str, Any]]]:
    """Every case's started ranks by the case's index in CASES, from PARTS processes
    (tests/deepspeed_engines.py), each starting every PARTS-th case."""
    out = tmp_path_factory.mktemp("engines")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)])}
    if PARTS > 1:  # one thread each: the parts share the cores
        env["OMP_NUM_THREADS"] = "1"
    script = str(HERE / "deepspeed_engines.py")
    deadline = time.monotonic() + 600
    with contextlib.ExitStack() as stack:
        runs = []
        for part in range(PARTS):
            log = stack.enter_context((out / f"engines{part}.log").open("w"))
            run = subprocess.Popen(
                [sys.executable, script, str(out / f"engines{part}.jsonl"), str(part), str(PARTS)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
            stack.callback(run.wait)  # reaped on the way out, after the kill below
            stack.callback(run.kill)
            runs.append(run)
        for part, run in enumerate(runs):
            code = run.wait(timeout=max(0.0, deadline - time.monotonic()))
            assert code == 0, (out / f"engines{part}.log").read_text()[-3000:]
    records: dict[int, list[dict[str, Any]]] = {}
    for part in range(PARTS):
        for line in (out / f"engines{part}.jsonl").read_text().splitlines():
            record = json.loads(line)
            records.setdefault(record["case"], []).append(record)
    return records


def expected_engine(plan: Any) -> str:
    if plan.p == 1:
        return "DeepSpeedEngine"
    return "DualPipeVEngine" if plan.schedule == "zbv" else "PipelineEngine"


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c.id for c in CASES])
def test_deepspeed_starts_the_plan(index: int, engines: dict[int, list[dict[str, Any]]]) -> None:
    case = CASES[index]
    export = export_deepspeed(job_of(case), TrainSettings())
    records = engines[index]
    if export.refused:
        assert records == [{"case": index, "refused": export.refused}]
        pytest.skip(export.refused)
    plan = export.written
    assert [r["rank"] for r in records] == [s * plan.d * plan.t for s in sorted({0, plan.p - 1})]
    for seen in records:
        if "nvme_refused" in seen:
            pytest.skip(seen["nvme_refused"])
        assert "error" not in seen, seen.get("error")
        assert seen["engine"] == expected_engine(plan)
        assert seen["zero"] == plan.zero
        assert seen["bf16"]
        assert seen["cpu_offload"] == (plan.offload == "cpu")
        assert (seen["dp"], seen["mb"]) == (plan.d, plan.mb)
        assert seen["dp"] * seen["gas"] * seen["mb"] == case.batch
        assert seen["mp"] == plan.t * plan.p
        assert seen["scheduler"] == "WarmupCosineLR"
        if plan.zero == 3:
            assert seen["optimizer"] == "DeepSpeedZeroOptimizer_Stage3"
        elif plan.zero:
            assert seen["optimizer"] == "DeepSpeedZeroOptimizer"
        if plan.p > 1:
            assert seen["stages"] == plan.p
            assert seen["stage"] == seen["rank"] // (plan.d * plan.t)
            continue
        # AutoTP splits the query projection's rows t ways; AutoEP keeps E / ep whole experts
        assert seen["q_rows"] == HIDDEN // plan.t
        experts = job_of(case).model.num_experts
        if experts:
            assert seen["experts"] == experts // plan.ep
        assert math.isfinite(seen["loss"])
