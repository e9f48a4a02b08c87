"""The bench's split of a run's CPU by process, and its pinning of processes to CPUs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if _BENCH not in sys.path:
    sys.path.append(_BENCH)

from e2e import cpu  # noqa: E402  (needs the path above)


def test_per_pod_splits_the_machine_by_process_and_leaves_the_rest_as_other() -> None:
    before = {cpu.WALL: 100.0, cpu.MACHINE: 50.0, "kube-apiserver": 10.0, "pid:kube-apiserver": 7}
    after = {cpu.WALL: 102.0, cpu.MACHINE: 54.0, "kube-apiserver": 13.0, "pid:kube-apiserver": 7}
    shares = cpu.per_pod(before, after, placed=1000)
    assert shares["kube-apiserver"] == pytest.approx(3.0)
    assert shares[cpu.MACHINE] == pytest.approx(4.0)
    assert shares["other"] == pytest.approx(1.0)
    assert shares["cores"] == pytest.approx(2.0)
    assert "pid:kube-apiserver" not in shares


def test_a_process_restarted_in_the_window_is_not_counted_as_one() -> None:
    before = {cpu.WALL: 0.0, cpu.MACHINE: 0.0, "scheduler": 30.0, "pid:scheduler": 11}
    after = {cpu.WALL: 1.0, cpu.MACHINE: 2.0, "scheduler": 0.5, "pid:scheduler": 12}
    shares = cpu.per_pod(before, after, placed=100)
    assert "scheduler" not in shares
    assert shares["other"] == pytest.approx(20.0)


def test_nothing_placed_gives_no_figures() -> None:
    shot = cpu.sample({"bench": os.getpid()})
    assert cpu.per_pod(shot, shot, placed=0) == {}


def test_sample_reads_live_processes_and_skips_missing_ones() -> None:
    shot = cpu.sample({"bench": os.getpid(), "gone": None})
    assert shot["bench"] > 0
    assert shot["pid:bench"] == os.getpid()
    assert "gone" not in shot
    assert shot[cpu.MACHINE] > 0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to split")
def test_split_cores_pins_each_side_and_gives_every_cpu_back() -> None:
    everything = os.sched_getaffinity(0)
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    right = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with cpu.split_cores([left.pid], [right.pid]) as split:
            assert split is not None
            assert os.sched_getaffinity(left.pid) == split[0]
            assert os.sched_getaffinity(right.pid) == split[1]
            assert not split[0] & split[1]
            assert split[0] | split[1] == everything
        assert os.sched_getaffinity(left.pid) == everything
        assert os.sched_getaffinity(right.pid) == everything
    finally:
        left.kill()
        right.kill()
        left.wait()
        right.wait()


def test_at_rest_gives_each_process_its_cores_over_the_window() -> None:
    before = {cpu.WALL: 0.0, cpu.MACHINE: 0.0, "kwok": 1.0, "pid:kwok": 9, "etcd": 0.0}
    after = {cpu.WALL: 10.0, cpu.MACHINE: 8.0, "kwok": 6.0, "pid:kwok": 9, "etcd": 2.0}
    assert cpu.at_rest(before, after) == "0.80 cores busy over 10 s (kwok 0.50, etcd 0.20)"
