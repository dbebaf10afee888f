"""deploy/: the Kubernetes manifests (validated offline against the API's schemas, and against each
other and the grader's own options) and the Slurm scripts (their index handling by a dry run under
bash, and for real on a plan whose notebooks all changed, so no kernel starts)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import nbformat
import pytest
import yaml

from autograder import grade, merge, plan, record, registry, status
from redteam import build as redteam

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "deploy" / "kubernetes"
SLURM = REPO / "deploy" / "slurm"
OLDEST = "1.30"  # appArmorProfile in the pod's securityContext needs 1.30; backoffLimitPerIndex is on from 1.29


def _manifests() -> dict[str, dict]:
    docs = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            docs[f"{path.name}:{doc['kind']}/{doc['metadata']['name']}"] = doc
    return docs


def _job(name: str) -> dict:
    return next(d for d in _manifests().values() if d["kind"] == "Job" and d["metadata"]["name"] == name)


def _argv(container: dict, env: dict[str, str], tmp_path: Path) -> list[str]:
    """The argv the container's command runs: through sh for real, with `python` replaced by a printer."""
    command = container["command"] + container.get("args", [])
    if command[:2] != ["sh", "-c"]:
        return command
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "python").write_text('#!/bin/sh\nprintf "%s\\0" python "$@"\n')
    (fake / "python").chmod(0o755)
    done = subprocess.run(["sh", "-c", command[2]], capture_output=True, check=True,
                          env={"PATH": f"{fake}:/usr/bin:/bin", **env})
    return done.stdout.decode().split("\0")[:-1]


def _parse(module, argv: list[str]) -> argparse.Namespace:
    """The grader's own parser for ``python -m autograder <command> ...``: the options must exist."""
    assert argv[:3] == ["python", "-m", "autograder"], argv
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(argv[4:])


@pytest.mark.parametrize("version", [OLDEST, kubernetes_validate.latest_version()])
def test_kubernetes_manifests_are_valid_against_the_api_schema(version):
    docs = _manifests()
    assert {d["kind"] for d in docs.values()} >= {"Job", "PersistentVolumeClaim"}
    for name, doc in docs.items():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{name} is not valid Kubernetes {version}: {err.message} at {list(err.path)}")


def test_kubernetes_schema_check_is_real():
    """The validator rejects what the cluster would: a misspelt field, a wrong type."""
    job = _job("grade-shards")
    for broken in ({**job, "spec": {**job["spec"], "backoffLimitPerIndx": 2}},
                   {**job, "spec": {**job["spec"], "completions": "many"}}):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)


def test_kubernetes_shard_job_is_an_indexed_job_with_retries_and_resources(tmp_path):
    job = _job("grade-shards")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed"
    assert 1 <= spec["parallelism"] <= spec["completions"]
    assert spec["backoffLimitPerIndex"] >= 1 and pod["restartPolicy"] == "Never"  # per-index retries
    (container,) = pod["containers"]
    requests = container["resources"]["requests"]
    assert requests["cpu"] and requests["memory"] and container["resources"]["limits"]["memory"]
    args = _parse(grade, _argv(container, {"JOB_COMPLETION_INDEX": "7"}, tmp_path))
    assert args.shard == f"auto/{spec['completions']}"  # the index comes from the Job, N from completions
    assert str(args.out) == "/course/grading/shard-7/grades.csv"  # one folder per shard index
    assert args.jobs == int(requests["cpu"])  # one notebook per requested core
    assert args.gradebook is None  # shards never write the gradebook


def test_kubernetes_plan_shards_and_merge_agree(tmp_path):
    shards, plan_job, merge_job = _job("grade-shards"), _job("grade-plan"), _job("grade-merge")
    grade_args = _parse(grade, _argv(shards["spec"]["template"]["spec"]["containers"][0],
                                     {"JOB_COMPLETION_INDEX": "0"}, tmp_path))
    plan_args = _parse(plan, _argv(plan_job["spec"]["template"]["spec"]["containers"][0], {}, tmp_path))
    (tmp_path / "course" / "grading").mkdir(parents=True)
    for i in range(3):
        (tmp_path / "course" / "grading" / f"shard-{i}").mkdir()
    merge_container = merge_job["spec"]["template"]["spec"]["containers"][0]
    glob_argv = _argv({**merge_container, "args": [merge_container["args"][0].replace("/course", str(tmp_path / "course"))]},
                      {}, tmp_path)
    merge_args = _parse(merge, glob_argv)
    assert plan_args.shards == shards["spec"]["completions"]
    assert str(plan_args.out) == str(grade_args.plan) == str(merge_args.plan).replace(str(tmp_path), "")
    assert plan_args.submissions == grade_args.submissions
    assert [d.name for d in merge_args.dirs] == ["shard-0", "shard-1", "shard-2"]  # the shards' folders
    assert merge_args.gradebook.startswith("sqlite:///")
    claims = set()
    for job in (shards, plan_job, merge_job):
        pod = job["spec"]["template"]["spec"]
        volumes = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]}
        for mount in pod["containers"][0]["volumeMounts"]:
            claims.add((volumes[mount["name"]], mount["mountPath"]))
    pvc = next(d for d in _manifests().values() if d["kind"] == "PersistentVolumeClaim")
    assert claims == {(pvc["metadata"]["name"], "/course")}  # one shared volume, mounted alike everywhere
    assert "ReadWriteMany" in pvc["spec"]["accessModes"]


# --- Slurm --------------------------------------------------------------------------------


def _bash(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SLURM / script), *args], capture_output=True, text=True, cwd=REPO,
                          env={"PATH": os.environ["PATH"], "PYTHON": sys.executable, **env})


@pytest.fixture
def fake_plan(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps({"shards": 3}))
    return tmp_path


def test_slurm_shard_script_dry_run_maps_the_array_index(fake_plan):
    env = {"DRY_RUN": "1", "SUBMISSIONS": str(fake_plan / "sub mitted"), "PLAN": str(fake_plan / "plan.json"),
           "RESULTS": str(fake_plan / "results"), "SLURM_CPUS_PER_TASK": "2"}
    for index in range(3):
        done = _bash("grade-shard.sbatch", {**env, "SLURM_ARRAY_TASK_ID": str(index)})
        assert done.returncode == 0, done.stderr
        argv = shlex.split(done.stdout)
        assert argv[0] == sys.executable
        args = _parse(grade, ["python", *argv[1:]])
        assert args.shard == "auto/3" and args.jobs == 2
        assert args.out == fake_plan / "results" / f"shard-{index}" / "grades.csv"
        assert args.submissions == fake_plan / "sub mitted"  # quoting survives a space


@pytest.mark.parametrize("task_id, message", [
    (None, "not a shard index"), ("", "not a shard index"), ("x", "not a shard index"), ("-1", "not a shard index"),
    ("3", "the plan has 3 shards"),
])
def test_slurm_shard_script_refuses_a_bad_index(fake_plan, task_id, message):
    env = {"DRY_RUN": "1", "SUBMISSIONS": "s", "PLAN": str(fake_plan / "plan.json"), "RESULTS": "r"}
    if task_id is not None:
        env["SLURM_ARRAY_TASK_ID"] = task_id
    done = _bash("grade-shard.sbatch", env)
    assert done.returncode == 2 and message in done.stderr and not done.stdout


def test_slurm_submit_dry_run_sizes_the_array_from_the_plan(fake_plan):
    done = _bash("submit.sh", {"DRY_RUN": "1", "SUBMISSIONS": "s", "PLAN": str(fake_plan / "plan.json"),
                               "RESULTS": "r", "SBATCH_OPTIONS": "--partition=cpu --account=course"})
    assert done.returncode == 0, done.stderr
    shard_line, merge_line = [shlex.split(line) for line in done.stdout.splitlines()]
    assert shard_line[0] == "sbatch" and "--array=0-2" in shard_line and shard_line[-1].endswith("grade-shard.sbatch")
    assert "--partition=cpu" in shard_line and "--account=course" in merge_line
    assert any(a.startswith("--dependency=afterok:") for a in merge_line) and merge_line[-1].endswith("merge.sbatch")
    assert "--kill-on-invalid-dep=yes" in merge_line  # a failed shard cancels the merge, not pending for ever


def test_slurm_submit_gives_the_merge_the_array_job_and_cancels_it_on_failure(fake_plan):
    """The real submission path, with an sbatch that records its arguments and answers as --parsable does."""
    bin_dir = fake_plan / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text('#!/bin/bash\necho "$*" >> "$SBATCH_LOG"\necho "4242;cluster"\n')
    (bin_dir / "sbatch").chmod(0o755)
    done = subprocess.run(["bash", str(SLURM / "submit.sh")], capture_output=True, text=True, cwd=REPO,
                          env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHON": sys.executable,
                               "SUBMISSIONS": "s", "PLAN": str(fake_plan / "plan.json"), "RESULTS": "r",
                               "SBATCH_LOG": str(fake_plan / "sbatch.log")})
    assert done.returncode == 0, done.stderr
    shard_call, merge_call = [line.split() for line in (fake_plan / "sbatch.log").read_text().splitlines()]
    assert "--array=0-2" in shard_call and shard_call[-1].endswith("grade-shard.sbatch")
    assert {"--kill-on-invalid-dep=yes", "--dependency=afterok:4242"} <= set(merge_call)
    assert merge_call[-1].endswith("merge.sbatch") and "merge: job 4242" in done.stdout


@pytest.mark.slow
def test_slurm_scripts_run_a_plan_for_real(tmp_path):
    """The array tasks and the merge, run as Slurm would run them (the notebooks changed since the plan)."""
    subs = tmp_path / "submitted"
    for student in ("ana", "ben", "cleo"):
        path = subs / student / redteam.CH1 / f"{redteam.CH1}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(redteam.release(redteam.CH1), path)
    done = subprocess.run([sys.executable, "-m", "autograder", "plan", str(subs), "--shards", "2", "--out",
                           str(tmp_path / "plan.json")], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    for path in subs.rglob("*.ipynb"):
        path.write_bytes(path.read_bytes() + b"\n")
    env = {"SUBMISSIONS": str(subs), "PLAN": str(tmp_path / "plan.json"), "RESULTS": str(tmp_path / "results"),
           "SLURM_CPUS_PER_TASK": "1"}
    assert _bash("merge.sbatch", env).returncode == 2  # no shard yet
    for index in range(2):
        done = _bash("grade-shard.sbatch", {**env, "SLURM_ARRAY_TASK_ID": str(index)})
        assert done.returncode == 0, done.stderr
    done = _bash("merge.sbatch", env)
    assert done.returncode == 0, done.stderr
    rows = record.read_csv(tmp_path / "results" / "grades.csv")
    assert len(rows) == 3 * len(registry.get(redteam.CH1).exercises)
    assert {r["status"] for r in rows} == {status.STALE}
    shutil.rmtree(tmp_path / "results" / "shard-1")  # a lost shard: the merge refuses
    (tmp_path / "results" / "grades.csv").unlink()
    done = _bash("merge.sbatch", env)
    assert done.returncode == 1 and "missing shard(s) 1/2" in done.stderr


def test_kubernetes_rerun_one_shard(tmp_path):
    done = subprocess.run(["bash", str(K8S / "rerun-shard.sh"), "5"], capture_output=True, text=True, check=True)
    (job,) = list(yaml.safe_load_all(done.stdout))
    kubernetes_validate.validate(job, kubernetes_validate.latest_version(), strict=True)
    shards = _job("grade-shards")["spec"]["completions"]
    assert job["metadata"]["name"] == "grade-shard-5"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 1
    args = _parse(grade, _argv(job["spec"]["template"]["spec"]["containers"][0], {"JOB_COMPLETION_INDEX": "0"},
                               tmp_path))
    assert args.shard == f"5/{shards}"  # explicit: the one-pod Job's own index (0) is not used
    assert str(args.out) == "/course/grading/shard-5/grades.csv"  # the folder of shard 5: it resumes there
    for bad in (str(shards), "x", "-1"):
        refused = subprocess.run(["bash", str(K8S / "rerun-shard.sh"), bad], capture_output=True, text=True)
        assert refused.returncode == 2 and "error:" in refused.stderr and not refused.stdout
