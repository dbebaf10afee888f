"""deploy/: the Kubernetes manifests (validated offline against the API's schemas, and against each
other and the grader's own options) and the Slurm scripts (their index handling by a dry run under
bash, and for real on a plan whose notebooks all changed, so no kernel starts); the training launchers
(their torchrun commands parsed by torchrun's own parser and the trainer's, and the Slurm one run for real
on this machine)."""

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

from torch.distributed.run import get_args_parser as torchrun_parser

from autograder import grade, merge, plan, record, registry, status
from redteam import build as redteam
from solutions.train import build_parser as train_parser

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
    pvc = _manifests()["volume.yaml:PersistentVolumeClaim/course"]
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


# --- Training launchers: torchrun on Kubernetes and Slurm -------------------------------------------------


def _torchrun(argv: list[str]) -> tuple[argparse.Namespace, argparse.Namespace]:
    """torchrun's own parser on ``python -m torch.distributed.run ...``, then the trainer's on what it starts."""
    assert argv[1:3] == ["-m", "torch.distributed.run"], argv
    run = torchrun_parser().parse_args(argv[3:])
    assert run.module and run.training_script == "solutions.train", argv
    return run, train_parser().parse_args(run.training_script_args)


def _document(kind: str, name: str) -> dict:
    return next(d for d in _manifests().values() if d["kind"] == kind and d["metadata"]["name"] == name)


def test_kubernetes_training_job_pods_meet_at_pod_0_through_the_headless_service(tmp_path):
    job, service = _job("tdd-train"), _document("Service", "tdd-train")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    assert spec["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"  # a lost pod fails the run, no half-restart
    (container,) = pod["containers"]
    for index in range(spec["completions"]):
        run, trainer = _torchrun(_argv(container, {"JOB_COMPLETION_INDEX": str(index)}, tmp_path))
        assert run.node_rank == index  # pod i is node i of the rendezvous
    assert int(run.nnodes) == spec["completions"]
    assert int(run.nproc_per_node) == int(container["resources"]["limits"]["nvidia.com/gpu"])  # one process per GPU
    # Pod 0's stable name: <job>-0.<subdomain>, served by a headless Service that selects these pods.
    assert run.master_addr == f"{job['metadata']['name']}-0.{pod['subdomain']}" and pod["subdomain"] == "tdd-train"
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert run.master_port == service["spec"]["ports"][0]["port"] == container["ports"][0]["containerPort"]
    assert trainer.task in ("translate", "vit", "gpt") and trainer.device == "cuda"
    # Rank 0 writes into a volume every pod mounts (ReadWriteMany), and NCCL gets a real /dev/shm.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    runs = next(path for path in mounts if str(trainer.out).startswith(path + "/"))
    claim = _document("PersistentVolumeClaim", volumes[mounts[runs]]["persistentVolumeClaim"]["claimName"])
    assert "ReadWriteMany" in claim["spec"]["accessModes"] and str(trainer.metrics_json).startswith(runs + "/")
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"


def test_kubernetes_training_pods_are_not_cut_off_by_the_graders_network_policy():
    """The grading pods get no network at all; the training pods need it to meet."""
    labels = _job("tdd-train")["spec"]["template"]["metadata"]["labels"]
    for doc in _manifests().values():
        if doc["kind"] == "NetworkPolicy":
            assert not doc["spec"]["podSelector"]["matchLabels"].items() <= labels.items(), doc["metadata"]["name"]


@pytest.fixture
def slurm_bin(tmp_path):
    """Stand-ins for Slurm's commands: scontrol expands the node list as Slurm does ("gpu[01-03]" is three
    hosts), srun runs its command once, here."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        '#!/bin/bash\n[[ "$1 $2" == "show hostnames" ]] || exit 1\n'
        'if [[ "$3" =~ ^(.*)\\[([0-9]+)-([0-9]+)\\]$ ]]; then\n'
        '  for i in $(seq -w "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}"); do echo "${BASH_REMATCH[1]}$i"; done\n'
        'else echo "$3"; fi\n')
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    for tool in ("scontrol", "srun"):
        (bin_dir / tool).chmod(0o755)
    return bin_dir


def _sbatch_env(slurm_bin, **env) -> dict[str, str]:
    return {"PATH": f"{slurm_bin}{os.pathsep}{os.environ['PATH']}", "PYTHON": sys.executable, **env}


@pytest.mark.parametrize("nodes, nodelist, gpus, head", [
    ("1", "gpu07", "4", "gpu07"),           # one node x 4 GPUs
    ("3", "gpu[01-03]", "8", "gpu01"),      # three nodes x 8 GPUs: the rendezvous on the first
])
def test_slurm_train_dry_run_rendezvous_from_the_allocation(slurm_bin, nodes, nodelist, gpus, head):
    env = _sbatch_env(slurm_bin, DRY_RUN="1", SLURM_JOB_ID="4242", SLURM_NNODES=nodes,
                      SLURM_JOB_NODELIST=nodelist, SLURM_GPUS_ON_NODE=gpus)
    done = subprocess.run(["bash", str(SLURM / "train.sbatch"), "gpt", "--out", "runs/my gpt", "--batch-size", "96"],
                          capture_output=True, text=True, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr
    argv = shlex.split(done.stdout)
    assert argv[0] == "srun" and "--ntasks-per-node=1" in argv and "--kill-on-bad-exit=1" in argv
    run, trainer = _torchrun(argv[argv.index(sys.executable):])
    assert (run.nnodes, run.nproc_per_node) == (nodes, gpus)
    assert (run.rdzv_backend, run.rdzv_endpoint, run.rdzv_id) == ("c10d", f"{head}:29500", "4242")
    assert trainer.task == "gpt" and str(trainer.out) == "runs/my gpt" and trainer.batch_size == 96  # quoting


@pytest.mark.parametrize("env, argv, message", [
    ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1"}, [], "give the trainer and its options"),
    ({}, ["vit"], "not in a Slurm allocation"),
    ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1", "NPROC_PER_NODE": "x"}, ["vit"], "NPROC_PER_NODE is 'x'"),
])
def test_slurm_train_refuses_what_it_cannot_run(slurm_bin, env, argv, message):
    done = subprocess.run(["bash", str(SLURM / "train.sbatch"), *argv], capture_output=True, text=True, cwd=REPO,
                          env=_sbatch_env(slurm_bin, DRY_RUN="1", **env))
    assert done.returncode == 2 and message in done.stderr and not done.stdout


@pytest.mark.train
@pytest.mark.subprocess
@pytest.mark.slow
def test_slurm_train_script_runs_for_real_on_this_machine(slurm_bin, tmp_path):
    """One node of two CPU processes, as Slurm would start it: the c10d rendezvous forms and rank 0 writes."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = _sbatch_env(slurm_bin, SLURM_JOB_ID="7", SLURM_NNODES="1", SLURM_JOB_NODELIST="localhost",
                      NPROC_PER_NODE="2", RDZV_PORT=str(port), OMP_NUM_THREADS="1")
    done = subprocess.run(["bash", str(SLURM / "train.sbatch"), "vit", "--device", "cpu", "--quiet", "--epochs", "1",
                           "--warmup-epochs", "0.5", "--n-layers", "1", "--d-model", "16", "--d-mlp", "32",
                           "--out", str(tmp_path / "run"), "--metrics-json", str(tmp_path / "m.json")],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["world_size"] == 2 and 0.0 <= metrics["accuracy"] <= 1.0
    assert done.stdout.count("test accuracy") == 1  # rank 0 alone evaluates and prints
