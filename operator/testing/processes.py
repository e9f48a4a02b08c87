"""The control plane's child processes, and the guardian that kills them if Python dies."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Final

from vgpu_operator.testing.errors import ControlPlaneError, T

_LOG_TAIL_LINES = 40


# Runs as a separate process holding the read end of a pipe from us. Lines "+pg N"/"-pg N" and
# "+dir P"/"-dir P" register or forget process groups and directories. At EOF (we closed the pipe
# or died, even by SIGKILL) it kills the remaining groups and removes the remaining directories.
_GUARDIAN = r"""
import os, shutil, signal, sys
groups, dirs = set(), set()
for line in sys.stdin:
    op, _, arg = line.rstrip("\n").partition(" ")
    if op == "+pg": groups.add(int(arg))
    elif op == "-pg": groups.discard(int(arg))
    elif op == "+dir": dirs.add(arg)
    elif op == "-dir": dirs.discard(arg)
for pg in groups:
    try: os.killpg(pg, signal.SIGKILL)
    except OSError: pass
for d in dirs:
    shutil.rmtree(d, ignore_errors=True)
"""


class Guardian:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _GUARDIAN],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # no terminal signals: it must outlive us
            text=True,
        )

    def send(self, line: str) -> None:
        with self._lock:
            if self._proc is None or self._proc.stdin is None:
                return
            try:
                self._proc.stdin.write(line + "\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class ChildProcess:
    """A child in its own process group, logging stdout+stderr to a file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        guardian: Guardian,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self._guardian = guardian
        self._log: IO[bytes] | None = log_path.open("ab")
        self._log.write(f"--- {time.strftime('%H:%M:%S')} starting {' '.join(argv)}\n".encode())
        self._log.flush()
        try:
            self.popen: subprocess.Popen[bytes] = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=dict(env) if env is not None else None,
                cwd=cwd,
            )
        except OSError:
            self._log.close()
            self._log = None
            raise
        self.pgid = self.popen.pid  # start_new_session: pid == pgid
        guardian.send(f"+pg {self.pgid}")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=timeout)
        # Kill whatever is left in the group (the leader may have exited before its children).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signal.SIGKILL)
        self.popen.wait()
        self._guardian.send(f"-pg {self.pgid}")
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        return log_tail(self.log_path, lines)


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a child's log ("" if it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def stop_group(popen: subprocess.Popen[bytes], timeout_s: float, sig: int = signal.SIGTERM) -> int:
    """Stop a child started in a session of its own: ``sig`` to its process group, SIGKILL
    if it has not exited ``timeout_s`` later; its exit status."""
    if popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, sig)
        try:
            popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()
    return popen.returncode


_EPHEMERAL_RANGE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_LISTEN_PORT: Final = 10000
_handed_out: set[int] = set()


def _ephemeral_floor() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port nobody listens on, for a server this process is about to start.

    Asking the kernel for port 0 hands out a port from its ephemeral range, the same
    range every outgoing connection draws from: between the probe and the server's own
    bind, a client socket of any test may take it ("address already in use", seen in CI).
    So the port comes from below that range, at random, never one handed out before in
    this process, and is probed once.
    """
    ceiling = _ephemeral_floor()
    if ceiling - _LOWEST_LISTEN_PORT < 1000:
        return _kernel_port()
    for _ in range(200):
        port = random.randrange(_LOWEST_LISTEN_PORT, ceiling)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    return _kernel_port()


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(
    what: str,
    check: Callable[[], T | None],
    timeout: float,
    *,
    interval: float = 0.2,
    alive: Callable[[], str | None] | None = None,
) -> T:
    """Call ``check`` until it returns non-None; ``alive`` returns an error text to stop early."""
    deadline = time.monotonic() + timeout
    last_error = ""
    while True:
        if alive is not None and (problem := alive()):
            raise ControlPlaneError(f"{what}: {problem}")
        try:
            result = check()
        except (OSError, ControlPlaneError, ValueError) as exc:
            last_error = f" (last error: {exc})"
            result = None
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"timed out after {timeout:.0f}s: {what}{last_error}")
        time.sleep(interval)


def insecure_ssl() -> ssl.SSLContext:
    """For the health checks of kube-scheduler and kube-controller-manager, which serve on
    loopback with a certificate they made themselves at start."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def http_ok(url: str, context: ssl.SSLContext | None, must_contain: bytes = b"") -> bool:
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    try:
        with opener.open(url, timeout=5) as resp:
            return bool(resp.status == 200 and must_contain in resp.read())
    except urllib.error.HTTPError as exc:
        exc.close()
        return False
    except OSError:
        return False
