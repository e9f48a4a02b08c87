"""Stopping a child in a session of its own (the demo's operator, the bench's processes):
SIGTERM to its group ends a child that honours it; one that ignores it is killed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from vgpu_operator.testing.processes import log_tail, stop_group

IGNORES_SIGTERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)


def test_a_child_that_honours_sigterm_ends_on_it() -> None:
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    assert stop_group(child, timeout_s=60) == -15


def test_a_child_that_ignores_sigterm_is_killed() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", IGNORES_SIGTERM], start_new_session=True, stdout=subprocess.PIPE
    )
    assert child.stdout is not None
    assert child.stdout.readline() == b"ready\n"  # the SIGTERM handler is in place
    assert stop_group(child, timeout_s=0.2) == -9
    child.stdout.close()


def test_a_child_that_has_exited_keeps_its_status() -> None:
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], start_new_session=True)
    child.wait()
    assert stop_group(child, timeout_s=60) == 3


def test_the_log_tail_is_the_last_lines_or_nothing(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    log.write_text("one\ntwo\nthree\n")
    assert log_tail(log, 2) == "two\nthree"
    assert log_tail(tmp_path / "missing.log") == ""
