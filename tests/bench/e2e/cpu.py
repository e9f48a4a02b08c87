"""Where the machine's CPU goes in a run, and the ceiling pair on separate cores.

On one small machine the API server, etcd, KWOK, the scheduler under test and the bench
share the cores. Once they are full, every millisecond one process spends per pod is
taken from the others: the binding ceiling's client spends little, a scheduler that
decides spends more, so their ratio measures the machine as much as the scheduler.
``sample``/``per_pod`` split a run's CPU by process (and the whole machine's busy time,
kernel threads included); ``split_cores`` runs with the control plane on one half of the
CPUs and the scheduler and the bench on the other, as in a cluster whose scheduler does
not share the API server's cores.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Final

from e2e import procs

MACHINE: Final = "machine"
_PID: Final = "pid:"
WALL: Final = "wall"


def sample(processes: Mapping[str, int | None]) -> dict[str, float]:
    """CPU seconds so far of each named process (those still running) and the machine."""
    shot = {WALL: time.monotonic(), MACHINE: procs.machine_busy_seconds()}
    for label, pid in processes.items():
        if pid:
            with contextlib.suppress(OSError):
                shot[label] = procs.cpu_seconds(pid)
                shot[_PID + label] = pid
    return shot


def per_pod(
    before: Mapping[str, float], after: Mapping[str, float], placed: int
) -> dict[str, float]:
    """Milliseconds of CPU per placed pod for each process sampled both times (the same
    process), the rest of the machine as ``other`` (kernel threads, other processes,
    a process restarted in between) and the cores in use."""
    if placed <= 0:
        return {}
    out: dict[str, float] = {}
    named = 0.0
    for label, seconds in after.items():
        if label in (WALL, MACHINE) or label.startswith(_PID) or label not in before:
            continue
        if before.get(_PID + label) != after.get(_PID + label):
            continue  # restarted in between (a fault run): not one process's figure
        spent = max(0.0, seconds - before[label])
        named += spent
        out[label] = 1000 * spent / placed
    machine = max(0.0, after[MACHINE] - before[MACHINE])
    out[MACHINE] = 1000 * machine / placed
    out["other"] = 1000 * max(0.0, machine - named) / placed
    wall = after[WALL] - before[WALL]
    out["cores"] = machine / wall if wall > 0 else 0.0
    return out


def cores(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """Cores each process used between two samples (the same process both times), and
    the whole machine's busy cores as ``machine``; empty when no time passed."""
    wall = after[WALL] - before[WALL]
    if wall <= 0:
        return {}
    out: dict[str, float] = {}
    for label, seconds in after.items():
        if label in (WALL, MACHINE) or label.startswith(_PID) or label not in before:
            continue
        if before.get(_PID + label) == after.get(_PID + label):
            out[label] = (seconds - before[label]) / wall
    out[MACHINE] = (after[MACHINE] - before[MACHINE]) / wall
    return out


def at_rest(before: Mapping[str, float], after: Mapping[str, float]) -> str:
    """Cores each process used between two samples, as one line: what a cluster of this
    size costs the machine with nothing being placed (KWOK's node leases, the bench's
    Lease heartbeats, the watches)."""
    used = cores(before, after)
    if not used:
        return "-"
    machine = used.pop(MACHINE)
    parts = [f"{label} {value:.2f}" for label, value in used.items()]
    wall = after[WALL] - before[WALL]
    return f"{machine:.2f} cores busy over {wall:.0f} s (" + ", ".join(parts) + ")"


def halves() -> tuple[set[int], set[int]] | None:
    """The CPUs this process may use, split in two (None with fewer than two)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    middle = len(cpus) // 2
    return set(cpus[:middle]), set(cpus[middle:])


def pin(pids: Iterable[int], cpus: set[int]) -> None:
    """Every thread of each process onto ``cpus`` (a Go binary's threads each have their
    own mask; threads started later inherit their creator's)."""
    for pid in pids:
        threads: list[str] = []
        with contextlib.suppress(OSError):
            threads = os.listdir(f"/proc/{pid}/task")
        for tid in threads:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), cpus)


@contextlib.contextmanager
def split_cores(
    control_plane: Iterable[int], scheduler_side: Iterable[int]
) -> Iterator[tuple[set[int], set[int]] | None]:
    """The control plane's processes on one half of the CPUs, the scheduler's (and the
    bench's) on the other, for the block; all CPUs for all of them afterwards."""
    split = halves()
    everything = set(os.sched_getaffinity(0))
    plane, others = list(control_plane), list(scheduler_side)
    if split is not None:
        pin(plane, split[0])
        pin(others, split[1])
    try:
        yield split
    finally:
        pin([*plane, *others], everything)
