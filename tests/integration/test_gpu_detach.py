"""scripts/gpu/detach.sh, the way long GPU jobs outlive a call: real bash processes, a few seconds (in the
integration tier: it spawns jobs and waits on them, with limits generous enough for a loaded machine)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "detach.sh"


def sh(*args, jobs: Path, timeout=300):
    return subprocess.run(["bash", str(SCRIPT), *args], env={**os.environ, "JOBS": str(jobs)}, capture_output=True,
                          text=True, timeout=timeout)


def test_a_job_outlives_the_call_that_started_it_and_reports_its_status(tmp_path):
    marker = tmp_path / "marker"
    r = sh("start", "j1", "bash", "-c", f"sleep 2; echo done > {marker}; echo the-end; exit 4", jobs=tmp_path)
    assert r.returncode == 0 and "started job 'j1'" in r.stdout  # returned before the job's 2 s
    assert not marker.exists()
    w = sh("wait", "j1", "30", jobs=tmp_path)
    assert w.returncode == 0 and "the-end" in w.stdout and "ended with status 4" in w.stdout
    assert marker.read_text().strip() == "done"


def test_wait_says_still_running_and_stop_ends_the_whole_job(tmp_path):
    child = tmp_path / "child.pid"
    sh("start", "j2", "bash", "-c", f"sleep 300 & echo $! > {child}; wait", jobs=tmp_path)
    deadline = time.time() + 120  # the job's bash has started its child (a busy machine starts it late)
    while time.time() < deadline and not (child.exists() and child.read_text().strip()):
        time.sleep(0.2)
    w = sh("wait", "j2", "5", jobs=tmp_path)
    assert w.returncode == 3 and "still running" in w.stdout
    again = sh("start", "j2", "true", jobs=tmp_path)
    assert again.returncode == 2 and "already running" in again.stderr
    pid = int(child.read_text())
    assert sh("stop", "j2", jobs=tmp_path).returncode == 0
    deadline = time.time() + 120
    while time.time() < deadline and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.2)
    assert not os.path.exists(f"/proc/{pid}")  # the job's own children end with it


def test_bad_names_and_commands_are_refused(tmp_path):
    assert sh("start", "a/b", "true", jobs=tmp_path).returncode == 2
    assert sh("wait", "nothing", "1", jobs=tmp_path).returncode == 2
    assert "unknown command" in sh("go", "x", jobs=tmp_path).stderr
