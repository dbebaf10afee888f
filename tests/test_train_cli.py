"""The `tdd-train` console script (= python -m solutions.train): exit 0 on success, 2 and one error line on bad
input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def console_script() -> str:
    """`tdd-train` as pip installed it next to this interpreter (or on PATH)."""
    beside = Path(sys.executable).parent / "tdd-train"
    found = str(beside) if beside.exists() else shutil.which("tdd-train")
    if found is None:
        pytest.skip("the tdd-train console script is not installed (pip install -e . creates it)")
    return found


@pytest.mark.train
@pytest.mark.subprocess
def test_tdd_train_exits_0_on_success_and_writes_metrics(tmp_path):
    (tmp_path / "pairs.tsv").write_text("".join(f"a{i}\tb{i % 7}\n" for i in range(40)), encoding="utf-8")
    result = subprocess.run(
        [console_script(), "translate", "--data", str(tmp_path / "pairs.tsv"), "--steps", "2", "--d-model", "16",
         "--d-ff", "16", "--n-layers", "1", "--quiet", "--metrics-json", str(tmp_path / "m.json")],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "held-out test (4 pairs, never trained on)" in result.stdout
    assert 0.0 <= json.loads((tmp_path / "m.json").read_text())["exact_match"] <= 1.0


@pytest.mark.subprocess
@pytest.mark.parametrize("argv, message", [
    (["translate", "--data", "{tmp}/missing.tsv"], "missing.tsv: no such file"),
    (["vit", "--data", "{tmp}"], "found 0 class folders"),
])
def test_tdd_train_bad_input_exits_2_with_one_error_line(tmp_path, argv, message):
    argv = [arg.format(tmp=tmp_path) for arg in argv]
    result = subprocess.run([console_script(), *argv, "--quiet"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1 and message in result.stderr
    assert "Traceback" not in result.stderr
