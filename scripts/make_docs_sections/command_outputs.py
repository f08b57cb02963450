"""The README's command outputs: ``autoplan plan``, ``simulate``, ``emit``, ``run`` and ``calibrate`` on the main
job and its neighbours (with the timeline pictures plan and simulate draw), the files emit writes, and
benchmarks/gpu_compare.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from .docs_runner import IMAGES, REPO, Docs, fence, rel, shrink_png

MAIN_JOB = ["--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--nodes", "128", "--global-batch", "1536"]
PIPELINE_PLAN = "t=8,p=16,mb=1,ckpt=full"
CPU_RUN = ["--model", "tiny", "--cluster", "localhost-cpu", "--global-batch", "8", "--plan", "t=2,p=2"]


def plan_output(d: Docs) -> str:
    """the main job: autoplan plan for gpt3-175b on 128 dgx-a100-80gb nodes, with --plot docs/images/timeline-best.png"""
    png = IMAGES / "timeline-best.png"
    shown, out = d.autoplan("plan", *MAIN_JOB, "--plot", str(png))
    shrink_png(png)
    m = re.search(r"^plan string: (\S+)", out, re.M)
    if not m:
        raise SystemExit("make_docs: no 'plan string:' line in the plan output")
    d.best_plan = m.group(1)
    return fence(shown.replace(str(png), rel(png)) + "\n" + out)


def plan_frameworks(d: Docs) -> str:
    """the main job planned for each training stack (--framework): its best plan, step time, throughput
    and memory, or why the stack has none"""
    import json

    rows = [("framework", "best plan (des)", "step s", "TFLOP/s", "MFU", "GiB")]
    notes = []
    for name in ("autoplan", "megatron", "deepspeed", "torchtitan", "fsdp", "llm-foundry"):
        _, out = d.autoplan("plan", *MAIN_JOB, "--framework", name, "--top", "3", "--json", allowed=(0, 2, 3))
        if d.last_code:
            notes.append(f"{name}: no plan ({d.last_stderr.removeprefix('autoplan: error: ').splitlines()[-1]})")
            continue
        best = json.loads(out)["best"]
        rows.append(
            (
                name,
                _short(best["plan_string"]),
                f"{best['step_time_s']:.2f}",
                f"{best['tflops_per_gpu']:.0f}",
                f"{100 * best['mfu']:.1f}%",
                f"{best['peak_memory_gib']:.1f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = [("  ".join(c.ljust(w) for c, w in zip(r, widths))).rstrip() for r in rows]
    table.insert(1, "  ".join("-" * w for w in widths))
    shown = "$ autoplan plan " + " ".join(MAIN_JOB) + " --framework NAME"
    return fence("\n".join([shown, *table, "", *notes]))


def _short(plan: str) -> str:
    """A plan string without the keys at their defaults (offload=none, v=1, sp=0, 1f1b)."""
    drop = {"offload=none", "v=1", "sp=0", "schedule=1f1b"}
    return ",".join(k for k in plan.split(",") if k not in drop).replace("schedule=", "")


H100_JOB = ["--model", "gpt3-175b", "--cluster", "dgx-h100", "--nodes", "16", "--global-batch", "256", "--top", "4"]


def modern_plan(d: Docs) -> str:
    """the plan space on H100: autoplan plan for gpt3-175b on 16 dgx-h100 nodes (fp8 and the zero-bubble
    schedule searched), then the same pinned to bf16; headline and top plans of each"""
    runs = [d.autoplan("plan", *H100_JOB, "--framework", "megatron", *extra) for extra in ([], ["--fix", "prec=bf16"])]
    return fence("\n\n".join(_plan_summary(shown, out, ("plan ", "step time", "TFLOP/s")) for shown, out in runs))


def _plan_summary(shown: str, out: str, headline: tuple[str, ...]) -> str:
    """A plan command and its output cut to the headline lines starting with ``headline`` and the
    top-plans table."""
    lines = out.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("top plans"))
    end = next((i for i in range(top + 1, len(lines)) if not lines[i].strip()), len(lines))
    head = [line for line in lines[:top] if line.startswith(headline)]
    return "\n".join([shown, *head, "", *lines[top:end]])


LONG_CONTEXT_JOB = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--nodes", "64", "--global-batch", "64"]
LONG_CONTEXT_JOB += ["--seq-len", "131072", "--top", "3"]


def long_context(d: Docs) -> str:
    """context parallelism: autoplan plan for llama3-70b at 131,072 tokens on 64 dgx-h100 nodes, then
    the same with cp pinned to 1; headline and top plans of each"""
    runs = [
        d.autoplan("plan", *LONG_CONTEXT_JOB, "--framework", "megatron", *extra) for extra in ([], ["--fix", "cp=1"])
    ]
    return fence("\n\n".join(_plan_summary(shown, out, ("plan ", "step time", "peak memory")) for shown, out in runs))


MOE_JOB = ["--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "8", "--global-batch", "256", "--top", "3"]


def moe_plan(d: Docs) -> str:
    """mixture of experts: autoplan plan for mixtral-8x7b on 8 dgx-h100 nodes, then the same with ep pinned
    to 1; headline and top plans of each"""
    runs = [d.autoplan("plan", *MOE_JOB, "--framework", "megatron", *extra) for extra in ([], ["--fix", "ep=1"])]
    return fence("\n\n".join(_plan_summary(shown, out, ("plan ", "step time", "TFLOP/s")) for shown, out in runs))


SIZING_JOB = ["--model", "gpt3-175b", "--cluster", "dgx-h100", "--nodes", "16:128:16", "--global-batch", "1536"]
SIZING_GOAL = ["--tokens", "300e9", "--gpu-hour-price", "2.50", "--deadline", "20"]


def cluster_sizing(d: Docs) -> str:
    """cluster sizing: autoplan plan for gpt3-175b over 16 to 128 dgx-h100 nodes, 300B tokens, a
    20-day deadline, with --plot docs/images/cluster-sizing.png"""
    png = IMAGES / "cluster-sizing.png"
    shown, out = d.autoplan("plan", *SIZING_JOB, *SIZING_GOAL, "--plot", str(png))
    shrink_png(png)
    return fence(shown.replace(str(png), rel(png)) + "\n" + out)


def simulate_output(d: Docs) -> str:
    """autoplan simulate of the t=8,p=16 pipeline plan, with --plot docs/images/timeline-t8p16.png"""
    png = IMAGES / "timeline-t8p16.png"
    shown, out = d.autoplan("simulate", *MAIN_JOB, "--plan", PIPELINE_PLAN, "--plot", str(png))
    shrink_png(png)
    return fence(shown.replace(str(png), rel(png)) + "\n" + out)


def simulate_json(d: Docs) -> str:
    """the same simulate with --json"""
    shown, out = d.autoplan("simulate", *MAIN_JOB, "--plan", PIPELINE_PLAN, "--json")
    return fence(shown + "\n" + out, "json")


def emit_output(d: Docs) -> str:
    """autoplan emit of the main job's best plan (every tool's files), then of Megatron-LM's best plan
    for Megatron-LM (--framework megatron)"""
    import json

    plan = d.best_plan or _best_plan(d)
    shown, out = d.autoplan("emit", *MAIN_JOB, "--plan", plan, "-o", "runs/gpt3-175b")
    first = shown + "\n" + d.last_stderr + "\n" + out
    _, best = d.autoplan("plan", *MAIN_JOB, "--framework", "megatron", "--json")
    megatron = json.loads(best)["best"]["plan_string"]
    shown, out = d.autoplan(
        "emit", *MAIN_JOB, "--plan", megatron, "--framework", "megatron", "-o", "runs/gpt3-175b-megatron"
    )
    return fence(first + "\n\n" + shown + "\n" + d.last_stderr + "\n" + out)


def _best_plan(d: Docs) -> str:
    import json

    _, out = d.autoplan("plan", *MAIN_JOB, "--json")
    d.best_plan = json.loads(out)["best"]["plan_string"]
    return d.best_plan


def _emitted(d: Docs, name: str) -> str:
    path = d.work / "runs" / "gpt3-175b" / name
    if not path.is_file():
        emit_output(d)
    return fence(d.clean(path.read_text()), "bash")


def emit_launch(d: Docs) -> str:
    """the emitted launch.sh"""
    return _emitted(d, "launch.sh")


def emit_slurm(d: Docs) -> str:
    """the emitted slurm.sbatch"""
    return _emitted(d, "slurm.sbatch")


def run_output(d: Docs) -> str:
    """autoplan emit + autoplan run of the tiny model on localhost-cpu (about a minute)"""
    shown_e, out_e = d.autoplan("emit", *CPU_RUN, "-o", "runs/tiny")
    shown_r, out_r = d.autoplan("run", "runs/tiny")
    cores = os.cpu_count()
    return fence(f"{shown_e}\n{out_e}\n{shown_r}\n{out_r}") + (
        f"\n<sub>Generated on a machine with {cores} CPU core{'s' if cores != 1 else ''} "
        f"running the plan's 4 processes.</sub>\n"
    )


def calibrate_output(d: Docs) -> str:
    """autoplan calibrate --device cpu --quick and the start of the profiles it writes"""
    shown, out = d.autoplan("calibrate", "--device", "cpu", "--quick", "-o", "my-cpu.yaml")
    gpu = (d.work / "my-cpu.yaml").read_text().splitlines()
    node = (d.work / "my-cpu-node.yaml").read_text().splitlines()
    table_at = next((i for i, line in enumerate(gpu) if line.strip().startswith("table:")), len(gpu))
    after = next((i for i in range(table_at + 1, len(gpu)) if not gpu[i].startswith("    ")), len(gpu))
    measured_at = next((i for i, line in enumerate(gpu) if line.startswith("measured:")), len(gpu))
    gpu_part = [
        *gpu[: table_at + 4],
        f"    # ... {after - table_at - 4} more lines of the GEMM table",
        *gpu[after:measured_at],
        f"# ... {len(gpu) - measured_at} more lines: a 'measured:' block (raw rates: dispatch, attention)",
    ]
    end = next((i for i, line in enumerate(node) if line.startswith("# Collective times")), len(node))
    node_part = [*node[:end], f"# ... {len(node) - end} more lines: the measured collective times next to the model's"]
    return (
        fence(f"{shown}\n{out}")
        + "\n`my-cpu.yaml` (start):\n\n"
        + fence(d.clean("\n".join(gpu_part)), "yaml")
        + "\n`my-cpu-node.yaml` (start):\n\n"
        + fence(d.clean("\n".join(node_part)), "yaml")
    )


def gpu_compare(d: Docs) -> str:
    """benchmarks/gpu_compare.py on the committed H100 runs (no GPU needed)."""
    script = REPO / "benchmarks" / "gpu_compare.py"
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, check=True)
    return fence("$ python benchmarks/gpu_compare.py\n" + d.clean(proc.stdout))


def accuracy_stacks(d: Docs) -> str:
    """benchmarks/accuracy.py's per-stack table (every published row through the command line, without the
    DES columns and the CPU runs)"""
    shown = "$ python benchmarks/accuracy.py --no-des --no-cpu-runs"
    proc = subprocess.run(
        [sys.executable, "benchmarks/accuracy.py", "--no-des", "--no-cpu-runs"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise SystemExit(f"make_docs: '{shown}' failed with exit code {proc.returncode}:\n{proc.stderr.strip()}")
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Per stack"))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].strip())
    return fence("\n".join([shown, "...", *lines[start:end]]))
