"""A test control plane kept up by hand, until Ctrl-C or SIGTERM (for trying things out)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from vgpu_operator.testing.controlplane import ControlPlane


@contextlib.contextmanager
def _terminate_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into SystemExit (so ``finally`` blocks run) while in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_forever(
    *, fake_gpu_nodes: int = 0, gpus_per_node: int = 8, kubeconfig_out: Path | None = None
) -> None:
    """Start a control plane with kwok (and fake GPU nodes) and keep it up until Ctrl-C/SIGTERM."""
    with _terminate_on_sigterm(), ControlPlane(kwok=True) as plane:
        for i in range(fake_gpu_nodes):
            plane.create_fake_gpu_node(f"gpu-node-{i}", gpus=gpus_per_node)
        kubeconfig = plane.kubeconfig_path
        if kubeconfig_out is not None:
            shutil.copyfile(kubeconfig, kubeconfig_out)
            kubeconfig = kubeconfig_out
        print(f"control plane at {plane.server}; export KUBECONFIG={kubeconfig}", flush=True)
        print("press Ctrl-C to stop", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while plane.running:
                time.sleep(1)
