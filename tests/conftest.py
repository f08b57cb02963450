"""Shared test helpers: run the real CLI, read the published reference figures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, settings

# Hypothesis profiles: CI (CI=true) replays a fixed, derandomized set of examples, so a run
# never fails by chance; a local run draws fresh examples (find bugs); HYPOTHESIS_PROFILE=long
# draws many more.
_QUIET = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    max_examples=100,
    deadline=None,
    suppress_health_check=_QUIET,
    print_blob=True,
)
settings.register_profile("dev", max_examples=100, deadline=None, suppress_health_check=_QUIET)
settings.register_profile("long", max_examples=2000, deadline=None, suppress_health_check=_QUIET)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

REPO = Path(__file__).resolve().parents[1]
# the public reference figures shipped in validation/ (docs/design.md section 7)
VALIDATION_DIR = Path(os.environ.get("AUTOPLAN_VALIDATION_DIR", REPO / "validation"))


# A DGX A100-like node as an inline mapping, for tests that write or vary node files.
NODE_MAPPING = {
    "name": "test-node",
    "gpu": "a100-sxm4-80gb",
    "gpus_per_node": 8,
    "intra_node": {"kind": "nvswitch", "bandwidth_GBps": 300, "latency_us": 3},
    "pcie": {"kind": "pcie", "bandwidth_GBps": 25, "latency_us": 2},
    "nics_per_node": 8,
    "nic": {"kind": "infiniband", "bandwidth_Gbps": 200, "latency_us": 5},
    "host_memory_GiB": 2048,
}


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m autoplan ARGS`` in a subprocess (no AUTOPLAN_DEBUG, so no traceback on purpose)."""
    env = {k: v for k, v in os.environ.items() if k != "AUTOPLAN_DEBUG"}
    return subprocess.run(
        [sys.executable, "-m", "autoplan", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        env=env,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def published() -> dict:
    """``published.yaml``: ZeRO and Megatron-LM figures (docs/design.md section 7)."""
    return yaml.safe_load((VALIDATION_DIR / "published.yaml").read_text())


def analytic_and_des(model, cluster, plan_text: str, batch: int, time_rel: float, memory_rel: float) -> tuple:
    """(analytic, DES) results of one plan, asserting that the two models agree on its step time
    and peak memory within ``time_rel`` and ``memory_rel``."""
    from simulator.analytic import estimate
    from simulator.des import simulate_des
    from simulator.job import Job
    from simulator.plan import parse_plan

    plan, _ = parse_plan(plan_text, model, cluster.num_gpus, batch)
    job = Job(model, cluster, plan, batch)
    a, d = estimate(job), simulate_des(job)
    assert d.step_time == pytest.approx(a.step_time, rel=time_rel), plan_text
    assert d.peak_memory == pytest.approx(a.peak_memory, rel=memory_rel), plan_text
    return a, d


def free_port() -> int:
    """A TCP port of 127.0.0.1 free at the moment (for a test's own process group)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def localhost_cpu(ranks: int | None = None, **node_fields: object):
    """The committed localhost-cpu cluster (``ranks`` ranks; None: the node's) with the node's
    ``node_fields`` replaced, e.g. one CPU wait set and the other removed to test it alone."""
    from hwprofiles import load_cluster

    c = load_cluster("localhost-cpu", gpus_per_node=ranks)
    return c.model_copy(update={"node": c.node.model_copy(update=node_fields)})
