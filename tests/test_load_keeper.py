"""The CPU-bound process the hostile batch is graded beside (support.LOAD_KEEPER): it spins while the machine has a
core to spare or exactly fills its cores, and yields while the others already oversubscribe them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import support

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads /proc (Linux)")


def _cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (/proc/PID/stat, fields 14 and 15, after the command name in parentheses)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_share(loadavg: str, tmp_path, seconds: float = 0.5) -> float:
    """The keeper's CPU time over ``seconds`` of wall time, as a share of them, with /proc/loadavg faked."""
    fake = tmp_path / "loadavg"
    fake.write_text(loadavg)
    proc = subprocess.Popen([sys.executable, "-c", support.LOAD_KEEPER, str(fake)])
    try:
        time.sleep(0.5)  # the interpreter started
        before = _cpu_seconds(proc.pid)
        time.sleep(seconds)
        return (_cpu_seconds(proc.pid) - before) / seconds
    finally:
        proc.kill()
        proc.wait()


def test_load_keeper_spins_while_the_others_exactly_fill_the_cores(tmp_path):
    running = len(os.sched_getaffinity(0)) + 1  # + the keeper itself
    assert _cpu_share(f"0.00 0.00 0.00 {running}/300 4242\n", tmp_path) > 0.15


def test_load_keeper_yields_while_the_others_oversubscribe_the_cores(tmp_path):
    running = len(os.sched_getaffinity(0)) + 2  # one more than the cores, + the keeper itself
    assert _cpu_share(f"0.00 0.00 0.00 {running}/300 4242\n", tmp_path) < 0.05


def test_load_keeper_spins_where_the_load_cannot_be_read(tmp_path):
    assert _cpu_share("not a loadavg\n", tmp_path) > 0.15
