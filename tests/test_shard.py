"""Grading past one machine: `autograder plan`, `grade --plan --shard`, `autograder merge`.

The fast tests use shards whose files all changed after planning (every entry is `stale`,
so no kernel starts) and drive the real commands in-process. The slow ones grade a class
collected by nbgrader's own exchange (submitted/<student>/<assignment>/<notebook>.ipynb),
unsharded and as 3 shards run as separate processes, each given its index through the
environment as a Kubernetes Indexed Job does, one of them killed with SIGKILL and rerun.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from redteam import build as redteam
from support import sandboxed

from autograder import engine, identity, plan, record, registry, results, shard, status, submissions
from autograder.__main__ import main

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "autograder" / "source"
CH1 = registry.CHAPTERS[0]


def _write(path: Path, only: set[str] | None = None, chapter: str = CH1.id) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(redteam.solved(chapter, SOURCE, only), path)
    return path


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _make_plan(capsys, subs: Path, out: Path, shards: int, *extra: str) -> plan.Plan:
    code, _, err = _cli(capsys, "plan", subs, "--shards", shards, "--out", out, *extra)
    assert code == 0, err
    return plan.load(out)


def _touch_all(plan_: plan.Plan, subs: Path) -> None:
    """Change every planned file after planning (still a valid notebook, other bytes)."""
    for entry in plan_.entries:
        path = subs / os.fsdecode(entry.raw)
        path.write_bytes(path.read_bytes() + b"\n")


@pytest.fixture
def stale_class(tmp_path, capsys):
    """Three students' chapter-1 notebooks, planned in 3 shards, then all changed."""
    subs = tmp_path / "submitted"
    for student in ("ana", "ben", "cleo"):
        _write(subs / student / CH1.id / CH1.notebook, only=set())
    plan_ = _make_plan(capsys, subs, tmp_path / "plan.json", 3)
    _touch_all(plan_, subs)
    return tmp_path, subs, plan_


def _shard(capsys, tmp: Path, subs: Path, index: int, shards: int = 3, plan_file: str = "plan.json"):
    return _cli(capsys, "grade", subs, "--plan", tmp / plan_file, "--shard", f"{index}/{shards}",
                "--out", tmp / "results" / f"shard-{index}" / "grades.csv", "--jobs", 1)


# --- --shard ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, env, expected", [
    ("0/3", {}, (0, 3)),
    ("2/3", {"JOB_COMPLETION_INDEX": "0"}, (2, 3)),  # an explicit index wins over the environment
    ("auto/3", {"JOB_COMPLETION_INDEX": "1"}, (1, 3)),
    ("auto/3", {"SLURM_ARRAY_TASK_ID": "2"}, (2, 3)),
    ("auto/4", {"JOB_COMPLETION_INDEX": "3", "SLURM_ARRAY_TASK_ID": "3"}, (3, 4)),
    (" auto/1 ", {"JOB_COMPLETION_INDEX": "0"}, (0, 1)),
])
def test_shard_parse_reads_the_index(text, env, expected):
    assert shard.parse(text, env) == expected


@pytest.mark.parametrize("text, env, message", [
    ("3/3", {}, "must be 0 to 2"),
    ("auto/3", {}, "JOB_COMPLETION_INDEX or SLURM_ARRAY_TASK_ID"),
    ("auto/3", {"JOB_COMPLETION_INDEX": "3"}, "JOB_COMPLETION_INDEX is 3"),
    ("auto/3", {"SLURM_ARRAY_TASK_ID": "-1"}, "not a shard index"),
    ("auto/3", {"JOB_COMPLETION_INDEX": "1", "SLURM_ARRAY_TASK_ID": "2"}, "ambiguous"),
    ("1/0", {}, "must be i/N"),
    ("1", {}, "must be i/N"),
    ("a/3", {}, "must be i/N"),
])
def test_shard_parse_refuses_bad_values(text, env, message):
    with pytest.raises(shard.BadShard, match=message):
        shard.parse(text, env)


# --- balance ------------------------------------------------------------------------------


def test_balance_equal_costs_deals_items_out_evenly():
    for n_items, shards in ((7, 3), (3, 5), (60, 7), (0, 2)):
        got = plan.balance([1.0] * n_items, shards)
        sizes = [got.count(s) for s in range(shards)]
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n_items


def test_balance_unequal_costs_stays_within_one_item_of_the_mean():
    import random

    rng = random.Random(0)
    for _ in range(50):
        shards = rng.randint(1, 9)
        costs = [rng.choice([1.0, 2.5, 8.0]) * rng.uniform(0.5, 1.5) for _ in range(rng.randint(1, 80))]
        got = plan.balance(costs, shards)
        load = [sum(c for c, s in zip(costs, got) if s == i) for i in range(shards)]
        assert max(load) <= sum(costs) / shards + max(costs) + 1e-9  # the list-scheduling bound
        assert got == plan.balance(costs, shards)  # deterministic
    # a heavy chapter is spread, not stacked: 4 heavy and 8 light items on 4 shards
    got = plan.balance([10.0] * 4 + [1.0] * 8, 4)
    assert sorted(got[:4]) == [0, 1, 2, 3]


# --- plan ---------------------------------------------------------------------------------


def test_plan_is_grade_plan_frozen_with_raw_names(tmp_path, capsys):
    """The plan's entries and fixed rows are the engine's work list, and any file name survives as bytes."""
    subs = tmp_path / "subs"
    odd = b"st\xffud\nent\\x"  # not UTF-8, a newline, a backslash
    _write(subs / os.fsdecode(odd) / CH1.notebook)
    _write(subs / "ana" / CH1.notebook)
    _write(subs / "ana" / f"{CH1.id}-Copy1.ipynb")  # a duplicate
    _write(subs / "ben" / "homework.ipynb")  # no chapter's name
    (subs / "cleo").mkdir()  # nothing submitted: missing
    plan_ = _make_plan(capsys, subs, tmp_path / "plan.json", 2, "--chapter", CH1.id)
    _, jobs, fixed = engine.work_list(subs.resolve(), (CH1.id,), 64 * 2**20, tmp_path)
    assert sorted((e.student, e.raw, e.sha256) for e in plan_.entries) == sorted(
        (j.student, j.raw, j.sha256) for j in jobs)
    assert sorted(json.dumps(r, sort_keys=True) for r in plan_.fixed) == sorted(
        json.dumps(r, sort_keys=True) for r in fixed)
    assert {r["kind"] for r in plan_.fixed} == {"duplicate", "unmatched", "missing"}
    by_raw = {e.raw: e for e in plan_.entries}
    entry = by_raw[odd + b"/" + CH1.notebook.encode()]
    assert submissions.read(subs.resolve(), entry.raw, 2**26)[1] == entry.sha256
    assert "\n" not in entry.student and "\\xff" in entry.student  # printable, one-to-one
    assert entry.key == engine.state_key(entry.submission, entry.sha256)
    raw_json = json.loads((tmp_path / "plan.json").read_text())
    assert base64.b64decode(raw_json["entries"][0]["raw"]) in by_raw


def test_plan_refuses_bad_options(tmp_path, capsys):
    subs = tmp_path / "subs"
    _write(subs / "ana" / CH1.notebook)
    for argv, message in (
        (["--shards", "0"], "--shards must be at least 1"),
        (["--shards", "2", "--cost", "99_nothing=3"], "--cost must be NN_name=SECONDS"),
        (["--shards", "2", "--cost", f"{CH1.id}=-1"], "--cost must be NN_name=SECONDS"),
        (["--shards", "2", "--out", str(subs / "plan.json")], "outside SUBMISSIONS"),
    ):
        code, _, err = _cli(capsys, "plan", subs, *argv)
        assert code == 1 and message in err, err
    code, _, err = _cli(capsys, "plan", tmp_path / "nothing", "--shards", 2)
    assert code == 1 and "must be a folder" in err


def test_plan_costs_balance_a_heavy_chapter(tmp_path, capsys):
    subs = tmp_path / "subs"
    for student in "abcdef":
        _write(subs / student / CH1.notebook)
    plan_ = _make_plan(capsys, subs, tmp_path / "plan.json", 2, "--cost", f"{CH1.id}=2.5")
    assert {e.cost for e in plan_.entries} == {2.5}
    assert sorted(len(plan_.of_shard(i)) for i in range(2)) == [3, 3]


def _grader_copy(tmp_path: Path) -> Path:
    """The autograder package and the released notebooks, copied elsewhere as another image would hold them."""
    shutil.copytree(identity.PACKAGE_DIR, tmp_path / "autograder", ignore=shutil.ignore_patterns("__pycache__", "source"))
    for notebook in (REPO / "course").glob(f"{registry.CHAPTER_GLOB}/*.ipynb"):
        shutil.copy(notebook, _mkdirs(tmp_path / "course" / notebook.relative_to(REPO / "course")))
    return tmp_path / "autograder"


def test_sources_digest_follows_the_sources_not_their_place(tmp_path):
    mine = identity.sources_digest()
    assert identity.sources_digest(_grader_copy(tmp_path)) == mine  # the same sources installed elsewhere


@pytest.mark.parametrize("edited", [
    "autograder/checks/attention.py",  # a check
    "autograder/verdict.py",  # judging
    "autograder/runner.py",
    "autograder/sandbox.py",
    "autograder/wire.py",
    f"course/{CH1.id}/{CH1.notebook}",  # the release: its unchanged test cells are skipped
])
def test_sources_digest_changes_with_every_file_that_decides_a_verdict(tmp_path, edited):
    copy = _grader_copy(tmp_path)
    before = identity.sources_digest(copy)
    path = tmp_path / edited
    path.write_bytes(path.read_bytes() + b"\n")
    assert identity.sources_digest(copy) != before


def test_plan_of_another_grader_is_refused_in_one_line(tmp_path, capsys):
    subs = tmp_path / "subs"
    _write(subs / "ana" / CH1.notebook)
    _make_plan(capsys, subs, tmp_path / "plan.json", 1)
    data = json.loads((tmp_path / "plan.json").read_text())
    for field, value in (("version", "0.0.1"), ("sources", "0" * 64)):
        changed = {**data, "grader": {**data["grader"], field: value}}
        (tmp_path / "old.json").write_text(json.dumps(changed))
        for argv in (["grade", subs, "--plan", tmp_path / "old.json", "--shard", "0/1", "--out",
                      tmp_path / "r" / "grades.csv"],
                     ["merge", tmp_path / "r", "--plan", tmp_path / "old.json", "--out", tmp_path / "g.csv"]):
            code, _, err = _cli(capsys, *argv)
            assert code == 1
            assert err.count("\n") == 1 and "make a new plan with this grader" in err, err
    assert not (tmp_path / "r").exists() and not (tmp_path / "g.csv").exists()
    (tmp_path / "bad.json").write_text('{"format": "something else"}')
    code, _, err = _cli(capsys, "grade", subs, "--plan", tmp_path / "bad.json", "--shard", "0/1",
                        "--out", tmp_path / "r" / "grades.csv")
    assert code == 1 and "not a grading plan" in err


def test_grade_shard_options_that_do_not_go_together(stale_class, capsys):
    tmp, subs, _ = stale_class
    out = ["--out", tmp / "r" / "grades.csv"]
    for argv, message in (
        (["--plan", tmp / "plan.json"], "--plan and --shard go together"),
        (["--shard", "0/3"], "--plan and --shard go together"),
        (["--plan", tmp / "plan.json", "--shard", "0/4"], "has 3 shard(s); --shard says 4"),
        (["--plan", tmp / "plan.json", "--shard", "0/3", "--gradebook", f"sqlite:///{tmp / 'gb.db'}"],
         "a shard writes no gradebook"),
        (["--plan", tmp / "plan.json", "--shard", "0/3", "--chapter", CH1.id], "fixed by the plan"),
    ):
        code, _, err = _cli(capsys, "grade", subs, *argv, *out)
        assert code == 1 and message in err, err
    assert not (tmp / "gb.db").exists() and not (tmp / "r").exists()


# --- a shard: stale, finish record ---------------------------------------------------------


def test_shard_reports_a_file_changed_after_planning_as_stale(tmp_path, capsys):
    subs = tmp_path / "submitted"
    changed = _write(subs / "ana" / CH1.id / CH1.notebook)
    gone = _write(subs / "ben" / CH1.id / CH1.notebook)
    _make_plan(capsys, subs, tmp_path / "plan.json", 1)
    changed.write_bytes(changed.read_bytes().replace(b"def ", b"def  ", 1))
    gone.unlink()
    code, _, err = _shard(capsys, tmp_path, subs, 0, shards=1)
    assert code == 0, err
    assert "1 stale" not in err and "2 stale" in err
    rows = record.read_csv(tmp_path / "results" / "shard-0" / "grades.csv")
    assert len(rows) == 2 * len(CH1.exercises)
    assert {r["status"] for r in rows} == {status.STALE} and {r["points"] for r in rows} == {"0"}
    reasons = {r["student"]: r["reason"] for r in rows}
    assert "changed after the plan was made" in reasons["ana"] and "make a new plan" in reasons["ana"]
    assert "cannot be read since the plan was made" in reasons["ben"]
    finished = json.loads((tmp_path / "results" / "shard-0" / "shard-0-of-1.json").read_text())
    assert finished["plan"] == plan.load(tmp_path / "plan.json").digest
    assert len(finished["results"]) == 2


def test_shard_of_a_wrong_folder_is_refused(stale_class, capsys):
    tmp, _, _ = stale_class
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    code, _, err = _shard(capsys, tmp, elsewhere, 0)
    assert code == 1 and "is SUBMISSIONS the folder the plan was made from" in err
    assert not (tmp / "results" / "shard-0" / "shard-0-of-3.json").exists()


def test_restale_turns_a_result_of_other_bytes_into_stale_rows():
    rows = [{"exercise": e.name, "points": e.points, "max_points": e.points, "status": "passed", "reason": ""}
            for e in CH1.exercises]
    res = results.result("ana", "ana/x.ipynb", CH1.id, rows, "b" * 64)
    assert shard.restale(res, {"ana/x.ipynb": "b" * 64}) is res
    stale = shard.restale(res, {"ana/x.ipynb": "a" * 64})
    assert [r["status"] for r in stale["rows"]] == [status.STALE] * len(CH1.exercises)
    assert sum(r["points"] for r in stale["rows"]) == 0 and stale["kind"] == "stale"


# --- merge -------------------------------------------------------------------------------


def test_summary_totals_each_student_once(capsys):
    """merge prints grade's summary; a student's notebooks may come from different shards, in any order."""
    def res(student, points, top, st="passed"):
        return results.result(student, f"{student}/x.ipynb", CH1.id, [
            {"exercise": "e", "points": points, "max_points": top, "status": st, "reason": ""}], "s")
    results.summary([res("bo", 1, 2), res("al", 0, 3, "failed"), res("bo", 2, 2), res("al", 3, 3)], Path("g.csv"))
    out = capsys.readouterr().out.splitlines()
    assert out == ["graded 4 notebook(s) of 2 student(s) -> g.csv", "  failed: 1, passed: 3", "  al: 3/6", "  bo: 3/4"]



def test_merge_refuses_a_missing_shard_and_lists_it(stale_class, capsys):
    tmp, subs, _ = stale_class
    for index in (0, 2):
        assert _shard(capsys, tmp, subs, index)[0] == 0
    dirs = [tmp / "results" / f"shard-{i}" for i in (0, 2)]
    code, _, err = _cli(capsys, "merge", *dirs, "--plan", tmp / "plan.json", "--out", tmp / "grades.csv")
    assert code == 1
    assert "missing shard(s) 1/3" in err and "nothing was written" in err
    assert not (tmp / "grades.csv").exists()
    assert _shard(capsys, tmp, subs, 1)[0] == 0
    dirs.append(tmp / "results" / "shard-1")
    code, out, err = _cli(capsys, "merge", *dirs, "--plan", tmp / "plan.json", "--out", tmp / "grades.csv",
                          "--gradebook", f"sqlite:///{tmp / 'gradebook.db'}")
    assert code == 0, err
    rows = record.read_csv(tmp / "grades.csv")
    assert sorted({r["student"] for r in rows}) == ["ana", "ben", "cleo"]
    assert {r["status"] for r in rows} == {status.STALE}
    assert not (tmp / "gradebook.db").exists()  # nothing graded: nothing for the gradebook
    code, out, err = _cli(capsys, "feedback", tmp / "grades.csv", "--out", tmp / "feedback")
    assert code == 0, err
    page = (tmp / "feedback" / "ana.html").read_text()
    assert status.DESCRIPTIONS[status.STALE] in page


def test_merge_refuses_a_killed_shard_and_lists_its_entries(stale_class, capsys):
    tmp, subs, _ = stale_class
    for index in range(3):
        assert _shard(capsys, tmp, subs, index)[0] == 0
    finished = tmp / "results" / "shard-1" / "shard-1-of-3.json"
    data = json.loads(finished.read_text())
    lost = next(iter(data["results"]))
    del data["results"][lost]
    finished.write_text(json.dumps(data))
    dirs = [tmp / "results" / f"shard-{i}" for i in range(3)]
    code, _, err = _cli(capsys, "merge", *dirs, "--plan", tmp / "plan.json", "--out", tmp / "grades.csv")
    assert code == 1 and "shard 1/3 lacks 1 result(s)" in err
    data["results"][lost] = {"rows": "not rows"}  # a record that is JSON but not results
    finished.write_text(json.dumps(data))
    code, _, err = _cli(capsys, "merge", *dirs, "--plan", tmp / "plan.json", "--out", tmp / "grades.csv")
    assert code == 1 and "not a finished shard's record" in err
    finished.write_text(finished.read_text()[:40])  # a record cut short
    code, _, err = _cli(capsys, "merge", *dirs, "--plan", tmp / "plan.json", "--out", tmp / "grades.csv")
    assert code == 1 and "not a finished shard's record" in err and "missing shard(s) 1/3" in err
    finished.unlink()  # a shard killed before it finished leaves no record
    code, _, err = _cli(capsys, "merge", *dirs, "--plan", tmp / "plan.json", "--out", tmp / "grades.csv")
    assert code == 1 and "no finished shard in it" in err and "missing shard(s) 1/3" in err
    assert not (tmp / "grades.csv").exists()


def test_merge_detects_two_different_results_for_one_submission(stale_class, capsys):
    tmp, subs, _ = stale_class
    for index in range(3):
        assert _shard(capsys, tmp, subs, index)[0] == 0
    again = tmp / "results" / "shard-2-again"
    shutil.copytree(tmp / "results" / "shard-2", again)
    dirs = [tmp / "results" / f"shard-{i}" for i in range(3)]
    code, _, err = _cli(capsys, "merge", *dirs, again, "--plan", tmp / "plan.json", "--out", tmp / "a.csv")
    assert code == 0, err  # the same shard twice with the same results is fine
    finished = again / "shard-2-of-3.json"
    data = json.loads(finished.read_text())
    key = next(iter(data["results"]))
    data["results"][key]["rows"][0]["reason"] = "graded differently"
    finished.write_text(json.dumps(data))
    code, _, err = _cli(capsys, "merge", *dirs, again, "--plan", tmp / "plan.json", "--out", tmp / "b.csv")
    assert code == 1 and "two different results for 1 notebook(s) of shard 2/3" in err
    assert not (tmp / "b.csv").exists()


def test_merge_refuses_shards_of_another_plan(stale_class, capsys):
    tmp, subs, _ = stale_class
    for index in range(3):
        assert _shard(capsys, tmp, subs, index)[0] == 0
    _cli(capsys, "plan", subs, "--shards", 3, "--out", tmp / "plan2.json")  # the files changed: another plan
    dirs = [tmp / "results" / f"shard-{i}" for i in range(3)]
    code, _, err = _cli(capsys, "merge", *dirs, "--plan", tmp / "plan2.json", "--out", tmp / "grades.csv")
    assert code == 1 and "graded from another plan" in err
    assert not (tmp / "grades.csv").exists()


def test_merge_is_idempotent_and_atomic(stale_class, capsys):
    tmp, subs, _ = stale_class
    for index in range(3):
        assert _shard(capsys, tmp, subs, index)[0] == 0
    dirs = [tmp / "results" / f"shard-{i}" for i in range(3)]
    assert _cli(capsys, "merge", *dirs, "--plan", tmp / "plan.json", "--out", tmp / "grades.csv")[0] == 0
    first = (tmp / "grades.csv").read_bytes()
    dirs[0] = dirs[0] / "grades.csv"  # a shard's --out names its folder too
    assert _cli(capsys, "merge", *reversed(dirs), "--plan", tmp / "plan.json", "--out", tmp / "grades.csv")[0] == 0
    assert (tmp / "grades.csv").read_bytes() == first
    assert [p.name for p in tmp.iterdir() if p.name.startswith(".grades.csv")] == []  # no temp file left


# --- the whole flow, graded for real (sandbox) ----------------------------------------------


def graded_for_real(test):
    """Needs bubblewrap; grades the class of the shared batch in shards (the batch graded it unsharded)."""
    return sandboxed(pytest.mark.timeout(1800)(test))


def _shard_cmd(subs: Path, grading: Path, index_dir: str, shards: int, jobs: int = 1) -> list[str]:
    return [sys.executable, "-m", "autograder", "grade", str(subs), "--plan", str(grading / "plan.json"),
            "--shard", f"auto/{shards}", "--out", str(grading / index_dir / "grades.csv"), "--jobs", str(jobs),
            "--cell-timeout", "20"]


@pytest.fixture(scope="module")
def sharded(grading_batch, tmp_path_factory):
    """The shared batch's class (collected by nbgrader's exchange), planned in 3 shards and graded shard by
    shard as separate processes (index from the environment, as a Kubernetes Indexed Job gives it); the largest
    shard is killed with SIGKILL once it has graded one notebook, then rerun with two jobs; then merged. The
    unsharded reference is the shared batch's rows for the same students."""
    tmp = tmp_path_factory.mktemp("sharded")
    subs = grading_batch.class_root
    grading = tmp / "grading"
    before = _hashes(subs)
    # the chapters the shared batch expects (every one), so that its rows are the unsharded reference
    chapters = [arg for chapter in registry.CHAPTERS for arg in ("--chapter", chapter.id)]
    done = _run("plan", subs, "--shards", 3, "--out", grading / "plan.json", *chapters)
    assert done.returncode == 0, done.stderr
    plan_ = plan.load(grading / "plan.json")
    unsharded = tmp / "unsharded.csv"
    record.write_csv(unsharded, [r for r in grading_batch.rows() if r["student"] in grading_batch.class_students])

    victim = max(range(3), key=lambda i: (len(plan_.of_shard(i)), -i))
    assert len(plan_.of_shard(victim)) >= 2
    state = grading / f"shard-{victim}" / "grades.csv.state"
    proc = subprocess.Popen(_shard_cmd(subs, grading, f"shard-{victim}", 3), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "JOB_COMPLETION_INDEX": str(victim)})
    others = {i: subprocess.Popen(_shard_cmd(subs, grading, f"shard-{i}", 3), cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env={**os.environ, "JOB_COMPLETION_INDEX": str(i)})
              for i in range(3) if i != victim}
    deadline = time.monotonic() + 600

    def saved() -> list[str]:  # results saved whole (a temp file being written is not one: record.atomic_write)
        return sorted(p.name for p in state.glob("*.json")) if state.is_dir() else []

    while time.monotonic() < deadline and proc.poll() is None and not saved():
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = {"state": saved(),
              "finished": (state.parent / f"shard-{victim}-of-3.json").exists()}
    rerun = subprocess.Popen(_shard_cmd(subs, grading, f"shard-{victim}", 3, jobs=2), cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "JOB_COMPLETION_INDEX": str(victim)})
    shards = {i: (p.wait(timeout=1800), *p.communicate()) for i, p in {**others, victim: rerun}.items()}
    merged = _run("merge", *[grading / f"shard-{i}" for i in range(3)], "--plan", grading / "plan.json", "--out",
                  grading / "grades.csv", "--gradebook", f"sqlite:///{tmp / 'gradebook.db'}")
    return {"tmp": tmp, "subs": subs, "grading": grading, "plan": plan_, "before": before, "unsharded": unsharded,
            "victim": victim, "killed": killed, "shards": shards, "merged": merged}


def _mkdirs(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _run(*argv, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograder", *map(str, argv)], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, **kw)


def _six(path: Path) -> list[tuple]:
    return sorted((r["student"], r["notebook"], r["exercise"], r["points"], r["max_points"], r["status"])
                  for r in record.read_csv(path))


@graded_for_real
def test_sharded_grading_equals_unsharded(sharded):
    for index, (code, _, err) in sharded["shards"].items():
        assert code == 0, (index, err[-3000:])
    assert sharded["merged"].returncode == 0, sharded["merged"].stderr[-3000:]
    merged = sharded["grading"] / "grades.csv"
    reference = sharded["unsharded"]
    assert _six(merged) == _six(reference)
    statuses = {r[5] for r in _six(merged)}
    assert {status.PASSED, status.FAILED, status.MISSING, status.DUPLICATE} <= statuses  # a class worth comparing
    unfailed = [r for r in record.read_csv(merged) if r["status"] != status.FAILED]
    assert unfailed == [r for r in record.read_csv(reference) if r["status"] != status.FAILED]  # same reasons too


@graded_for_real
def test_sharded_shard_killed_with_sigkill_and_rerun_completes(sharded):
    victim = sharded["victim"]
    assert sharded["killed"]["state"], "the shard was killed before it graded anything"
    assert not sharded["killed"]["finished"], "the shard finished before it was killed"
    code, _, err = sharded["shards"][victim]
    assert code == 0, err[-3000:]
    assert f"({len(sharded['killed']['state'])} already graded)" in err
    assert (sharded["grading"] / f"shard-{victim}" / f"shard-{victim}-of-3.json").exists()


@graded_for_real
def test_sharded_shard_with_two_jobs_gives_the_rows_of_one_job(sharded):
    """The killed shard's rerun grades the rest of its notebooks two at a time; its rows are the unsharded
    batch's rows for the same notebooks."""
    victim, grading = sharded["victim"], sharded["grading"]
    code, _, err = sharded["shards"][victim]
    assert code == 0, err[-3000:]
    left = len(sharded["plan"].of_shard(victim)) - len(sharded["killed"]["state"])
    assert f"grading {left} notebook(s) with 2 job(s)" in err
    mine = _six(grading / f"shard-{victim}" / "grades.csv")
    planned = {e.submission for e in sharded["plan"].of_shard(victim)}
    assert mine == [r for r in _six(sharded["unsharded"]) if r[1] in planned] and len({r[1] for r in mine}) == len(planned)


@graded_for_real
def test_sharded_collect_layout_is_graded_in_place(sharded):
    subs = sharded["subs"]
    assert _hashes(subs) == sharded["before"]  # read, never written
    assert any(name.endswith("timestamp.txt") for name in sharded["before"])  # really nbgrader's collect output
    notebooks = {r["notebook"] for r in record.read_csv(sharded["grading"] / "grades.csv")}
    on_disk = {name for name in sharded["before"] if name.endswith(".ipynb")}
    assert on_disk <= notebooks  # every collected notebook has rows, under the path collect gave it
    assert all(n.count("/") == 2 for n in on_disk)  # <student>/<assignment>/<notebook>.ipynb
    assert not any(p.name == "gradebook.db" for p in sharded["grading"].rglob("*"))


@graded_for_real
def test_sharded_merge_writes_the_gradebook_and_feedback_reads_it(sharded, tmp_path):
    from nbgrader.api import Gradebook

    merged = sharded["grading"] / "grades.csv"
    subs = sharded["subs"]
    totals: dict[tuple[str, str], float] = {}
    for row in record.read_csv(merged):  # the graded notebooks: on disk, not a duplicate
        if (subs / row["notebook"]).is_file() and row["status"] != status.DUPLICATE and row["exercise"] != "-":
            key = (row["student"], Path(row["notebook"]).stem)
            totals[key] = totals.get(key, 0.0) + float(row["points"])
    assert len(totals) == 7 and len(set(totals.values())) > 2
    with Gradebook(f"sqlite:///{sharded['tmp'] / 'gradebook.db'}") as gb:
        for (student, chapter), score in totals.items():
            assert gb.find_submission(chapter, student).score == pytest.approx(score), (student, chapter)
    done = _run("feedback", merged, "--out", tmp_path / "feedback")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "feedback" / "ana.html").read_text().count("<h2>") >= 2


@graded_for_real
def test_sharded_merge_without_one_shard_fails_with_the_list(sharded):
    grading = sharded["grading"]
    done = _run("merge", grading / "shard-0", grading / "shard-1", "--plan", grading / "plan.json",
                "--out", sharded["tmp"] / "partial.csv", "--gradebook", "none")
    assert done.returncode == 1
    assert "missing shard(s) 2/3" in done.stderr
    assert not (sharded["tmp"] / "partial.csv").exists()
