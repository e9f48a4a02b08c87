"""The operator as its own process (``vgpu-operator run``), stopped with the demo."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Final

from vgpu_operator.demo.settings import CONFIG_MAP, OPERATOR_NAMESPACE, DemoError, wait_for
from vgpu_operator.testing.processes import free_port as _free_port
from vgpu_operator.testing.processes import log_tail, stop_group

#: ``python -c`` source that runs ``vgpu-operator run`` (its arguments follow); the thread
#: ends the operator if its parent (the demo, the bench) dies without stopping it: the
#: operator would otherwise retry a vanished API server forever.
OPERATOR_MAIN: Final = """
import os, signal, threading, time
parent = os.getppid()
def _orphaned():
    while os.getppid() == parent:
        time.sleep(1)
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=_orphaned, daemon=True).start()
from vgpu_operator.operator_cli import run
run(prog_name="vgpu-operator run")
"""


def operator_argv(kubeconfig: Path, namespace: str, metrics_port: int, *extra: str) -> list[str]:
    """The command line of ``vgpu-operator run --standalone`` in this interpreter (see
    ``OPERATOR_MAIN``), logging JSON, its ConfigMap in ``namespace``; then ``extra``."""
    return [
        sys.executable,
        "-c",
        OPERATOR_MAIN,
        "--kubeconfig",
        str(kubeconfig),
        "--standalone",
        "--namespace",
        namespace,
        "--metrics-port",
        str(metrics_port),
        "--log-format",
        "json",
        *extra,
    ]


class OperatorProcess:
    """``vgpu-operator run --standalone`` as a child process, logging to a file."""

    def __init__(self, kubeconfig: Path, log_path: Path, env: Mapping[str, str]) -> None:
        self.log_path = log_path
        self.metrics_port = _free_port()
        self._argv = operator_argv(
            kubeconfig, OPERATOR_NAMESPACE, self.metrics_port, "--config-map", CONFIG_MAP
        )
        # The package directory is called operator/: never let the working directory
        # shadow the standard library's module of that name.
        self._env = {**env, "PYTHONSAFEPATH": "1"}
        self._log: IO[bytes] | None = None
        self._popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        self._popen = subprocess.Popen(
            self._argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self._env,
            cwd=self.log_path.parent,
            start_new_session=True,  # Ctrl-C reaches the demo, which stops it in order
        )

    @property
    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def check_alive(self) -> None:
        if self._popen is not None and self._popen.poll() is not None:
            raise DemoError(
                f"the operator exited with status {self._popen.returncode}\n"
                f"--- last lines of {self.log_path}:\n{self.log_tail()}"
            )

    def wait_ready(self, timeout_s: float) -> None:
        url = f"http://127.0.0.1:{self.metrics_port}/readyz"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def ready() -> bool:
            self.check_alive()
            try:
                with opener.open(url, timeout=2) as response:
                    return bool(response.status == 200)
            except urllib.error.HTTPError as exc:
                exc.close()
                return False
            except OSError:
                return False

        try:
            wait_for("the operator to become ready", ready, timeout_s)
        except DemoError as exc:
            tail = self.log_tail()
            raise DemoError(f"{exc}\n--- last lines of {self.log_path}:\n{tail}") from None

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM (Kopf exits cleanly), SIGKILL after ``timeout_s``; the exit status."""
        popen, self._popen = self._popen, None
        status = stop_group(popen, timeout_s) if popen is not None else None
        if self._log is not None:
            self._log.close()
            self._log = None
        return status

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)
