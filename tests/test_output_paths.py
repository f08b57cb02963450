"""Outputs are checked before the work (exit 2, one line) and nothing is overwritten silently:
``--plot``/``--trace``/``calibrate -o`` that cannot be written, ``emit`` into a folder with files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO, run_cli

from autoplan.outputs import check_output_file, check_run_dir
from hwprofiles import InputError

SIMULATE = ["simulate", "--model", "tiny", "--cluster", "localhost-cpu", "--global-batch", "8", "--plan", "t=2"]
PLAN = ["plan", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--nodes", "128", "--global-batch", "1536"]
EMIT = ["emit", "--model", "tiny", "--cluster", "localhost-cpu", "--global-batch", "8", "--plan", "t=2"]


def _one_line_bad_input(r, *words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and "internal error" not in r.stderr
    assert all(w in r.stderr for w in words), r.stderr


@pytest.mark.parametrize("flag", ["--plot", "--trace"])
def test_unwritable_picture_path_stops_the_search_before_it_starts(tmp_path, flag):
    """The main job's search would take seconds; the bad path is refused first (no report printed)."""
    r = run_cli(*PLAN, flag, str(tmp_path / "missing" / "out.png"))
    _one_line_bad_input(r, flag, "does not exist")
    assert r.stdout == ""


def test_picture_path_that_is_a_folder(tmp_path):
    _one_line_bad_input(run_cli(*SIMULATE, "--plot", str(tmp_path)), "--plot", "is a folder")


def test_picture_needs_the_des_before_the_work(tmp_path):
    r = run_cli(*SIMULATE, "--fidelity", "analytic", "--trace", str(tmp_path / "t.json"))
    _one_line_bad_input(r, "--fidelity des")
    assert r.stdout == ""


def test_calibrate_output_checked_before_measuring(tmp_path):
    (tmp_path / "file").write_text("x")
    r = run_cli("calibrate", "--device", "cpu", "--quick", "-o", str(tmp_path / "file" / "cpu.yaml"))
    _one_line_bad_input(r, "-o", "is not a folder")
    assert not list(tmp_path.glob("*.yaml"))


def test_emit_refuses_a_folder_with_files_unless_forced(tmp_path):
    out = tmp_path / "run"
    assert run_cli(*EMIT, "-o", str(out)).returncode == 0
    edited = "# my edits\n" + (out / "launch.sh").read_text()
    (out / "launch.sh").write_text(edited)
    r = run_cli(*EMIT, "-o", str(out))
    _one_line_bad_input(r, "not empty", "--force")
    assert (out / "launch.sh").read_text() == edited  # untouched
    r = run_cli(*EMIT, "-o", str(out), "--force")
    assert r.returncode == 0 and "replacing" in r.stderr
    assert (out / "launch.sh").read_text() != edited


def test_check_output_file_cases(tmp_path):
    check_output_file(None, "--plot")
    check_output_file(tmp_path / "new.png", "--plot")
    (tmp_path / "old.png").write_text("")
    check_output_file(tmp_path / "old.png", "--plot")  # a file the user named is theirs to replace
    with pytest.raises(InputError, match="does not exist"):
        check_output_file(tmp_path / "a" / "b.png", "--plot")


def test_check_run_dir_cases(tmp_path):
    check_run_dir(tmp_path / "new" / "deeper", force=False)  # created by emit
    (tmp_path / "empty").mkdir()
    check_run_dir(tmp_path / "empty", force=False)
    (tmp_path / "f").write_text("")
    with pytest.raises(InputError, match="not a folder"):
        check_run_dir(tmp_path / "f", force=True)
    with pytest.raises(InputError, match="not empty"):
        check_run_dir(tmp_path, force=False)
    check_run_dir(tmp_path, force=True)


def test_the_readme_emit_target_is_ignored_by_git():
    """The README emits into runs/: its files must not show up as changes of the checkout."""
    import subprocess

    r = subprocess.run(["git", "check-ignore", "-q", "runs/gpt3-175b/plan.json"], cwd=REPO)
    if r.returncode == 128:
        pytest.skip("not a git checkout")
    assert r.returncode == 0


def test_an_output_never_replaces_an_input_or_another_output(tmp_path):
    """--trace onto the model file had replaced it with the trace; --plot and --trace on one path
    kept only the picture: both are refused before the work, the input untouched."""
    model = tmp_path / "mine.yaml"
    model.write_text((REPO / "autoplan" / "models" / "tiny.yaml").read_text())
    before = model.read_text()
    args = ["simulate", "--model", str(model), "--cluster", "localhost-cpu", "--global-batch", "8", "--plan", "t=2"]
    _one_line_bad_input(run_cli(*args, "--trace", str(model)), "--trace", "is an input")
    assert model.read_text() == before
    same = str(tmp_path / "t.png")
    _one_line_bad_input(run_cli(*SIMULATE, "--plot", same, "--trace", same), "--plot", "--trace", "same file")


@pytest.mark.parametrize("name", ["timeline.txt", "timeline"])
def test_a_picture_needs_a_format_matplotlib_writes(tmp_path, name):
    """x.txt failed after the work (an internal error); x was written as x.png: both refused first."""
    r = run_cli(*SIMULATE, "--plot", str(tmp_path / name))
    _one_line_bad_input(r, "--plot", ".png")
    assert not list(tmp_path.iterdir())


def test_emit_force_replaces_a_link_not_the_file_it_points_to(tmp_path):
    """--force writes the run dir's own files: a launch.sh that is a link to a file elsewhere is
    replaced as a link, the file it pointed to kept."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "run"
    out.mkdir()
    (out / "launch.sh").symlink_to(victim)
    r = run_cli(*EMIT, "-o", str(out), "--force")
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "precious\n"
    assert not (out / "launch.sh").is_symlink() and "autoplan.runtime.train" in (out / "launch.sh").read_text()


def test_emit_force_removes_the_previous_plans_other_tool_files(tmp_path):
    """A plan emitted for every tool, then another plan for torch only with --force: the earlier
    megatron_args.txt would contradict the new plan.json. The files the earlier plan.json lists
    and this emit does not write are removed (said); the user's own files stay, even where a
    hand-edited plan.json lists them, and so does any name that is not one emit writes."""
    import json

    out = tmp_path / "run"
    assert run_cli(*EMIT[:-1], "t=2,p=2", "-o", str(out)).returncode == 0
    assert (out / "megatron_args.txt").exists()
    (out / "notes.txt").write_text("mine\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("keep\n")
    record = json.loads((out / "plan.json").read_text())
    record["exports"]["megatron"]["files"] += ["../outside.txt", "notes.txt"]  # hand-edited: not emit's files
    (out / "plan.json").write_text(json.dumps(record))
    r = run_cli(*EMIT[:-1], "t=4", "--target", "torch", "--force", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "removed" in r.stderr and not (out / "megatron_args.txt").exists()
    assert (out / "notes.txt").read_text() == "mine\n" and outside.read_text() == "keep\n"
    assert json.loads((out / "plan.json").read_text())["plan"]["t"] == 4


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("run\n", "a control character ('\\n')"),  # "$(cd ... && pwd)" drops it: the launchers ran in "run"
        ("a\x1bb", "a control character ('\\x1b')"),
        ("evil:x", "a ':' in the run dir's path"),  # the torchtitan launcher's PYTHONPATH would import from "evil"
        ("x" * 300, "File name too long"),
    ],
)
def test_a_run_dir_its_scripts_would_misname_is_refused(tmp_path, name, why):
    with pytest.raises(InputError, match=re.escape(why)):
        check_run_dir(tmp_path / name, force=False)
    assert list(tmp_path.iterdir()) == []


def test_a_run_dir_named_like_an_option_runs(tmp_path, monkeypatch):
    """'autoplan run ./-x' of a run dir named '-x': bash is given the script's absolute path, not
    "-x/launch.sh", which it read as options."""
    import subprocess

    from autoplan import launch
    from autoplan.runtime.config import load_run_spec

    commands: list[list[str]] = []

    def recorded(cmd: list[str], **_kw: object) -> subprocess.Popen:
        commands.append(cmd)
        raise OSError("recorded")

    tiny = ["--model", "tiny", "--cluster", "localhost-cpu", "--global-batch", "8", "--plan", "d=4,mb=2"]
    assert run_cli("emit", *tiny, "-o", "./-x", cwd=tmp_path).returncode == 0
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launch.subprocess, "Popen", recorded)
    relative = Path("-x")
    with pytest.raises(OSError, match="recorded"):
        launch.launch(relative, load_run_spec(relative), 1, 0, 10, lambda _line: None)
    assert commands and commands[0][:2] == ["bash", str(tmp_path / "-x" / "launch.sh")]


def test_every_file_an_exporter_writes_is_one_force_may_remove(tmp_path):
    """writer.EMITTED_FILES lists every name the exports write (GPT-style and Llama-style models,
    every target), so --force can remove a previous plan's files and nothing else."""
    import json

    from autoplan.emit.writer import EMITTED_FILES

    names: set[str] = set()
    for model, plan in (("tiny", "t=2,p=2"), ("llama3-8b", "t=2,p=2")):
        out = tmp_path / model
        args = ["emit", "--model", model, "--cluster", "localhost-cpu", "--global-batch", "8", "--plan", plan]
        assert run_cli(*args, "--target", "all", "-o", str(out)).returncode in (0, 3)  # 3: written, does not fit
        exports = json.loads((out / "plan.json").read_text())["exports"]
        names |= {name for record in exports.values() for name in record["files"]}
    assert "torchtitan_config.py" in names and names <= EMITTED_FILES, names - EMITTED_FILES
