"""The processes the bench runs beside the control plane, and what it reads of them.

The operator is ``vgpu-operator run --standalone`` in its own process (as in the demo
and the tests); kube-scheduler (built with the control plane) and toxiproxy-server
(``build.sh --bench``) are the cached binaries. CPU seconds and resident memory come from
/proc, sampled by ``Sampler``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final

from e2e import tasks
from vgpu_operator.demo.operator_process import operator_argv
from vgpu_operator.testing.processes import free_port as free_port
from vgpu_operator.testing.processes import stop_group

_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")
_PAGE: Final = os.sysconf("SC_PAGE_SIZE")
_NO_PROXY: Final = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (its threads included), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


#: Fields of /proc/stat's ``cpu`` line that count as busy: user, nice, system, irq,
#: softirq, steal (idle and iowait are not).
_BUSY_FIELDS: Final = (0, 1, 2, 5, 6, 7)


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy since boot (all cores)."""
    with open("/proc/stat") as fh:
        fields = fh.readline().split()[1:]
    return sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields)) / _CLOCK_TICKS


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as fh:
        return int(fh.read().split()[1]) * _PAGE / 2**20


def peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def http_get(url: str, timeout_s: float = 5.0) -> str | None:
    try:
        with _NO_PROXY.open(url, timeout=timeout_s) as response:
            return str(response.read().decode())
    except urllib.error.HTTPError as exc:
        exc.close()
        return None
    except OSError:
        return None


class Child:
    """A child process in its own session, logging to a file, stopped by SIGTERM."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str]):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.started_at = 0.0
        self._log: IO[bytes] | None = None
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._popen is None:
            raise RuntimeError(f"{self.name} is not running")
        return self._popen.pid

    @property
    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        self.started_at = time.time()
        self._popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.log_path.parent,
            start_new_session=True,
        )

    def stop(self, timeout_s: float = 20.0, sig: int = signal.SIGTERM) -> None:
        popen, self._popen = self._popen, None
        if popen is not None:
            stop_group(popen, timeout_s, sig)
        if self._log is not None:
            self._log.close()
            self._log = None

    def check(self) -> None:
        if self._popen is not None and self._popen.poll() is not None:
            tail = self.log_path.read_text(errors="replace").splitlines()[-30:]
            raise RuntimeError(
                f"{self.name} exited ({self._popen.returncode}):\n" + "\n".join(tail)
            )

    async def wait_http(self, url: str, timeout_s: float) -> float:
        """Poll ``url`` until it answers 200; seconds since the process started."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check()
            if await asyncio.to_thread(http_get, url, 2.0) is not None:
                return time.time() - self.started_at
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{self.name}: {url} not ready after {timeout_s}s")


def operator(
    kubeconfig: Path, workdir: Path, namespace: str, extra: Sequence[str] = ()
) -> tuple[Child, int]:
    """The operator's process (not started) and its metrics port."""
    port = free_port()
    # KWOK nodes run no device plugin to answer the allocation gate (issue 13).
    argv = operator_argv(kubeconfig, namespace, port, "--allocation-gate=off", *extra)
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    return Child("vgpu-operator", argv, workdir / "operator.log", env), port


def kube_scheduler(
    binary: Path, kubeconfig: Path, workdir: Path, qps: int, burst: int, feature_gates: str = ""
) -> tuple[Child, int]:
    """kube-scheduler with its client QPS/burst set in its config file; its health port.
    ``feature_gates``: its ``--feature-gates`` (e.g. ``SchedulerPreQueueingHints=true``)."""
    port = free_port()
    config = workdir / f"kube-scheduler-qps{qps}.yaml"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {"kubeconfig": str(kubeconfig), "qps": qps, "burst": burst},
                "leaderElection": {"leaderElect": False},
            }
        )
    )
    argv = [
        str(binary),
        f"--config={config}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--v=1",
    ]
    if feature_gates:
        argv.append(f"--feature-gates={feature_gates}")
    child = Child(
        f"kube-scheduler-qps{qps}", argv, workdir / f"kube-scheduler-qps{qps}.log", dict(os.environ)
    )
    return child, port


def toxiproxy(binary: Path, workdir: Path) -> tuple[Child, int]:
    port = free_port()
    argv = [str(binary), "-host", "127.0.0.1", "-port", str(port)]
    return Child("toxiproxy", argv, workdir / "toxiproxy.log", dict(os.environ)), port


@dataclass
class Sampler:
    """Samples one process's CPU seconds and RSS every ``interval_s`` (time, cpu, rss)."""

    pid: int
    interval_s: float = 0.5
    samples: list[tuple[float, float, float]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    def sample(self) -> tuple[float, float, float]:
        point = (time.time(), cpu_seconds(self.pid), rss_mib(self.pid))
        self.samples.append(point)
        return point

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(OSError):
                self.sample()
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = tasks.start(self._run())

    async def stop(self) -> None:
        await tasks.stop(self._task)
