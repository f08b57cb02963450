"""Issue 31's "internal errors and surprises": each case as a new user met it, and what autoplan
does now (an answer or a one-line error, never an internal error, a hang or a silent choice)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, run_cli

from autoplan import space, verify
from autoplan.cli import build_parser, main
from autoplan.emit.writer import write_run_dir
from autoplan.search import SearchOptions, search
from autoplan.workers import can_fork
from hwprofiles.errors import InputError, PlanError
from hwprofiles.load import load_cluster, load_node, read_yaml
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import parse_plan

# ---------------------------------------------------------------- NVMe offload on nodes without NVMe

NO_NVME = "hgx-a100-40gb-roce"  # a built-in node with no 'nvme:'


def test_the_search_offers_no_nvme_offload_where_the_node_has_none():
    assert load_node(NO_NVME).nvme is None
    assert space.offloads(load_node(NO_NVME), {}) == ("none", "cpu")
    assert space.offloads(load_node("dgx-h100"), {}) == ("none", "cpu", "nvme")
    model, cluster = load_model("llama2-7b"), load_cluster(NO_NVME, 1)
    plans = space.enumerate_plans(
        model, cluster.num_gpus, 64, {"t": 8}, cluster.gpus_per_node, offloads=space.offloads(cluster.node, {})
    )
    assert plans and {p.offload for p in plans} == {"none", "cpu"}


def test_plan_on_a_node_without_nvme_ends_in_an_answer_not_an_internal_error():
    """The issue's command: llama3-70b needs more than one such node (its optimizer state, offloaded
    to the host, exceeds the host's memory), and says so."""
    done = run_cli(
        "plan", "--model", "llama3-70b", "--cluster", NO_NVME, "--nodes", "1", "--global-batch", "64", "--jobs", "1"
    )
    assert "internal error" not in done.stderr and done.returncode == 3, done.stderr
    assert done.stderr.count("\n") == 1 and "host memory" in done.stderr and "--nodes" in done.stderr


def test_nvme_offload_pinned_or_given_on_a_node_without_nvme_is_refused_with_one_line():
    for args in (
        ["plan", "--fix", "offload=nvme"],
        ["simulate", "--plan", "t=8,zero=3,offload=nvme", "--fidelity", "analytic"],
    ):
        done = run_cli(*args, "--model", "llama3-8b", "--cluster", NO_NVME, "--global-batch", "64")
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("autoplan: error: ") and done.stderr.count("\n") == 1
        assert f"the node profile {NO_NVME} has none" in done.stderr and "offload=cpu" in done.stderr


def test_a_job_cannot_offload_to_nvme_a_node_lacks():
    model, cluster = load_model("tiny"), load_cluster(NO_NVME, 1)
    plan, _ = parse_plan("t=1,d=8,zero=3,offload=nvme", model, cluster.num_gpus, 8)
    with pytest.raises(PlanError, match="offload=nvme needs NVMe drives"):
        Job(model, cluster, plan, 8)


# ---------------------------------------------------------------- autoplan run: ranks this machine cannot hold


def _run_dir(tmp_path: Path, model_name: str, plan_text: str, ranks: int, batch: int) -> Path:
    base = load_cluster("dgx-a100-80gb")
    cluster = base.model_copy(update={"node": base.node.model_copy(update={"gpus_per_node": ranks})})
    model = load_model(model_name)
    plan, _ = parse_plan(plan_text, model, ranks, batch)
    write_run_dir(Job(model, cluster, plan, batch), {}, tmp_path / "run")
    return tmp_path / "run"


def test_run_refuses_up_front_ranks_that_cannot_fit_this_machines_memory(tmp_path, monkeypatch):
    """64 CPU ranks of a 175B model: no machine holds them; nothing is launched, the figure is given."""
    run_dir = _run_dir(tmp_path, "gpt3-175b", "d=64", 64, 64)

    def launched(*_args: object, **_kw: object) -> Path:
        raise RuntimeError("launched")

    monkeypatch.setattr(verify, "launch", launched)
    with pytest.raises(InputError, match=r"64 CPU ranks need about [\d,.]+ GiB \(64 x [\d,.]+ GiB: .*available"):
        verify.run_and_verify(run_dir, steps=1, timeout_s=10)
    assert not (run_dir / "results").exists()
    with pytest.raises(RuntimeError, match="launched"):  # told otherwise: it launches
        verify.run_and_verify(run_dir, steps=1, timeout_s=10, check_memory=False)
    assert build_parser().parse_args(["run", str(run_dir), "--allow-oversubscribe"]).allow_oversubscribe


# ---------------------------------------------------------------- Ctrl-C and a lost worker during the search

LONG_SEARCH = ["plan", "--model", "gpt-1t", "--cluster", "dgx-a100-80gb", "--nodes", "384", "--global-batch", "3072"]


def _children(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        return [int(c) for t in tasks for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
    except OSError:
        return []


def _kill_one(pids: list[int]) -> bool:
    """SIGKILL the first of ``pids`` that is still running (not a zombie); whether one was."""
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            os.kill(pid, signal.SIGKILL)
            return True
        except (OSError, IndexError):
            continue
    return False


def _search_then(send: str) -> subprocess.CompletedProcess:
    """Start the long search with two workers; once they run, send SIGINT to the whole process
    group (what Ctrl-C does: ``send`` "ctrl-c") or SIGKILL to one worker ("kill-worker")."""
    env = {k: v for k, v in os.environ.items() if k != "AUTOPLAN_DEBUG"}
    cmd = [sys.executable, "-m", "autoplan", *LONG_SEARCH, "--jobs", "2"]
    pipe = subprocess.PIPE
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, text=True, stdout=pipe, stderr=pipe, start_new_session=True)
    deadline = time.monotonic() + 60
    while len(_children(proc.pid)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = _children(proc.pid)
    assert len(workers) >= 2, "the search never started its workers"
    if send == "ctrl-c":
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)
    else:  # at once: a worker may be waiting for its first task (multiprocessing.Pool's then hung)
        assert _kill_one(_children(proc.pid)), "the search's workers ended before one could be killed"
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{send}: the search hung")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.slow
@pytest.mark.skipif(not (can_fork() and Path("/proc/self/task").is_dir()), reason="fork and /proc needed")
def test_ctrl_c_during_the_search_prints_interrupted_only():
    done = _search_then("ctrl-c")
    assert (done.returncode, done.stderr) == (130, "autoplan: error: interrupted\n")


@pytest.mark.slow
@pytest.mark.skipif(not (can_fork() and Path("/proc/self/task").is_dir()), reason="fork and /proc needed")
def test_a_killed_search_worker_ends_the_search_with_one_line():
    """multiprocessing.Pool replaced a worker the out-of-memory killer ended and waited for its task
    for ever, or, the worker killed as it waited for a task, for the task queue's lock."""
    done = _search_then("kill-worker")
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "a search worker process" in done.stderr and "SIGKILL" in done.stderr and "--jobs" in done.stderr


# ---------------------------------------------------------------- Hugging Face configs

QWEN25_7B = {  # Qwen/Qwen2.5-7B config.json (no _name_or_path, as published)
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "vocab_size": 152064,
}


def test_a_hugging_face_config_is_named_by_architecture_and_size_and_says_its_sequence(tmp_path, caplog):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN25_7B))
    with caplog.at_level(logging.INFO, logger="simulator"):
        model = load_model(str(path))
    assert model.name == "Qwen2ForCausalLM-7.6B" and model.seq_length == 131072
    said = [r.getMessage() for r in caplog.records if "131,072" in r.getMessage()]
    assert len(said) == 1 and "max_position_embeddings" in said[0] and "--seq-len" in said[0], caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="simulator"):
        assert load_model(str(path), 4096).seq_length == 4096
    assert not caplog.records  # --seq-len given: nothing to say
    path.write_text(json.dumps({**QWEN25_7B, "_name_or_path": "Qwen/Qwen2.5-7B"}))
    assert load_model(str(path)).name == "Qwen/Qwen2.5-7B"


# ---------------------------------------------------------------- --objective cost: the node count it uses


def test_the_cost_objective_reports_the_nodes_its_plan_uses_and_emit_accepts_them(tmp_path):
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", 32)
    opts = SearchOptions(objective="cost", fidelity="analytic", top=3, jobs=1, partition=False)
    found = search(model, cluster, 256, opts).to_dict()
    best = found["best"]
    assert best["nodes"] < 32 and found["nodes_given"] == 32  # fewer GPUs cost less here
    assert best["gpus"] == best["nodes"] * 8 and best["cluster"] == f"dgx-h100-x{best['nodes']}"
    args = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", str(best["nodes"]), "--global-batch", "256"]
    plan = ["--plan", best["plan_string"], "--target", "megatron"]  # fp8: not autoplan's own program (nor DeepSpeed)
    assert main(["-q", "emit", *args, *plan, "-o", str(tmp_path / "run")]) == 0


# ---------------------------------------------------------------- bubble warnings


def test_a_plan_whose_pipeline_mostly_idles_is_warned_about(capsys):
    args = ["simulate", "--model", "tiny", "--cluster", "dgx-h100", "--global-batch", "8", "--fidelity", "analytic"]
    assert main([*args, "--plan", "p=4,d=2,mb=4"]) == 0  # m = 1 microbatch for 4 stages
    err = capsys.readouterr().err
    assert "pipeline bubble" in err and "1 microbatch per pipeline for p=4 stages" in err
    assert main([*args, "--plan", "p=2,d=4,mb=1"]) == 0
    assert "bubble" not in capsys.readouterr().err


# ---------------------------------------------------------------- --memory-headroom


@pytest.mark.parametrize("headroom,gib", [("8", 8.0), ("8GiB", 8.0), ("10%", 8.0)])
def test_memory_headroom_lowers_the_usable_memory_every_command_uses(capsys, headroom, gib):
    args = ["simulate", "--model", "llama2-7b", "--cluster", "dgx-h100", "--global-batch", "64", "--plan", "t=2,p=2"]
    assert main([*args, "--fidelity", "analytic", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, "--fidelity", "analytic", "--json", "--memory-headroom", headroom]) == 0
    kept = json.loads(capsys.readouterr().out)
    assert kept["memory_capacity_gib"] == pytest.approx(plain["memory_capacity_gib"] - gib)
    assert kept["memory_headroom_gib"] == pytest.approx(gib) and "memory_headroom_gib" not in plain


def test_the_search_leaves_the_headroom_free(capsys):
    args = ["plan", "--model", "llama2-7b", "--cluster", "dgx-h100", "--global-batch", "64", "--fidelity", "analytic"]
    usable = load_cluster("dgx-h100").gpu.usable_memory_bytes / 2**30
    assert main([*args, "--json", "--jobs", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["best"]["peak_memory_gib"] > usable - 50  # the fastest needs more
    assert main([*args, "--json", "--jobs", "1", "--memory-headroom", "50"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    assert best["peak_memory_gib"] <= best["memory_capacity_gib"] == pytest.approx(usable - 50)


@pytest.mark.parametrize(
    "bad,why",
    [("4x", "expected GiB"), ("-3", "expected GiB"), ("100%", "below 100%"), ("90", "leaves no memory on the h100")],
)
def test_a_headroom_that_cannot_be_used_is_bad_input(capsys, bad, why):
    args = ["simulate", "--model", "tiny", "--cluster", "dgx-h100", "--global-batch", "8", "--plan", "t=1"]
    assert main([*args, f"--memory-headroom={bad}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autoplan: error: ") and "--memory-headroom" in err and err.count("\n") == 1
    assert why in err, err


# ---------------------------------------------------------------- a key given twice


@pytest.mark.parametrize("kind", ["model", "gpu", "node", "cluster"])
def test_a_yaml_key_given_twice_is_refused_with_the_key_and_line(tmp_path, kind):
    text = {
        "model": "name: m\nnum_layers: 4\nhidden_size: 128\nnum_layers: 8\n",
        "gpu": "name: g\nmemory_GiB: 80\nmemory_GiB: 40\n",
        "node": "name: n\nintra_node: {kind: nvswitch, bandwidth_GBps: 300, bandwidth_GBps: 600}\n",
        "cluster": "name: c\nnodes: 2\nnode: dgx-h100\n\nnodes: 4\n",
    }[kind]
    path = tmp_path / f"{kind}.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as e:
        read_yaml(path)
    key = {"model": "num_layers", "gpu": "memory_GiB", "node": "bandwidth_GBps", "cluster": "nodes"}[kind]
    where = {"model": 4, "gpu": 3, "node": 2, "cluster": 5}[kind]
    assert f"key '{key}' given twice" in str(e.value) and f"line {where}" in str(e.value), str(e.value)


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  x: 3\n")
    assert read_yaml(path) == {"base": {"x": 1, "y": 2}, "other": {"x": 3, "y": 2}}
