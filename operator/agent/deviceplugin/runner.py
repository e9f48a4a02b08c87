"""Keeping the plugin registered: serve, register, and start over when kubelet restarts.

kubelet wipes its device-plugin directory when it starts and re-creates ``kubelet.sock``;
a plugin must then serve again and register again. The runner watches the socket's
identity (inode and change time) and the plugin's own socket, and re-registers within a
poll interval; registration is retried with backoff while kubelet is away.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Final

import grpc
import structlog

from vgpu_operator.agent.backoff import Backoff, wait_or_stop
from vgpu_operator.agent.deviceplugin import server
from vgpu_operator.agent.deviceplugin.server import GpuDevicePlugin

log = structlog.get_logger("vgpu_operator.deviceplugin")

KUBELET_SOCKET: Final = "kubelet.sock"
PLUGIN_SOCKET: Final = "vgpu-operator-nvidia.sock"


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_ctime_ns


class PluginRunner:
    """Runs one plugin in kubelet's device-plugin ``directory`` until stopped."""

    def __init__(
        self,
        plugin: GpuDevicePlugin,
        directory: Path,
        *,
        poll_s: float = 0.5,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
    ) -> None:
        self.plugin = plugin
        self.directory = directory
        self.poll_s = poll_s
        self._backoff = Backoff(backoff_initial_s, backoff_max_s)
        self.registrations = 0

    @property
    def socket(self) -> Path:
        return self.directory / PLUGIN_SOCKET

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            grpc_server = await self._serve()
            try:
                kubelet = await self._register(stop)
                if kubelet is not None:
                    await self._watch(kubelet, stop)
            finally:
                await grpc_server.stop(None)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.socket)

    async def _serve(self) -> grpc.aio.Server:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)  # a stale socket from an earlier run
        return await server.serve(self.plugin, str(self.socket))

    async def _register(self, stop: asyncio.Event) -> tuple[int, int] | None:
        """Register until kubelet accepts; its socket's identity then, or None if stopped."""
        kubelet = self.directory / KUBELET_SOCKET
        while not stop.is_set():
            identity = _identity(kubelet)
            if identity is not None:
                try:
                    await server.register(str(kubelet), PLUGIN_SOCKET, self.plugin.resource)
                except Exception as exc:
                    log.warning("register_failed", error=str(exc))
                else:
                    self._backoff.reset()
                    self.registrations += 1
                    log.info("registered", resource=self.plugin.resource, socket=str(self.socket))
                    return identity
            delay = self._backoff.next_delay_s()
            await wait_or_stop(stop, delay)
        return None

    async def _watch(self, kubelet_identity: tuple[int, int], stop: asyncio.Event) -> None:
        """Return when kubelet restarted (its socket changed) or wiped ours."""
        kubelet = self.directory / KUBELET_SOCKET
        while not stop.is_set():
            await wait_or_stop(stop, self.poll_s)
            if _identity(kubelet) != kubelet_identity or not self.socket.exists():
                log.info("kubelet_restarted", directory=str(self.directory))
                return
