"""Running an operator: in the foreground (the CLI) or in a background thread (tests,
the demo). Each run gets its own ``OperatorApp``, Kopf registry and event loop."""

from __future__ import annotations

import asyncio
import threading

from vgpu_operator.control.options import OperatorOptions
from vgpu_operator.handlers import app as operator_app


def run_forever(options: OperatorOptions) -> None:
    """Run until SIGINT/SIGTERM (Kopf installs the signal handlers in the main thread).
    A port that cannot be served ends the process at once, with its sentence."""
    try:
        asyncio.run(operator_app.run(operator_app.OperatorApp(options)))
    except operator_app.ServingError as exc:
        raise SystemExit(f"vgpu-operator: {exc}") from None


class OperatorThread:
    """An operator in a daemon thread; ``stop`` asks Kopf to exit cleanly.

    ``app`` exposes the live instance (its engine, queue and metrics) for assertions.
    """

    def __init__(self, options: OperatorOptions) -> None:
        self.app = operator_app.OperatorApp(options)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="vgpu-operator", daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(operator_app.run(self.app, stop_flag=self._stop, ready_flag=self._ready))
        except BaseException as exc:  # surfaced by stop()
            self._error = exc
        finally:
            self._ready.set()

    def start(self, timeout_s: float = 60.0) -> OperatorThread:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError("the operator did not start in time")
        if self._error is not None:
            raise RuntimeError("the operator failed to start") from self._error
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError("the operator did not stop in time")
        if self._error is not None:
            raise RuntimeError("the operator failed") from self._error

    def __enter__(self) -> OperatorThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
