"""Serving the DRA plugin where kubelet finds it, and again when its sockets vanish.

The DRA service listens on ``<plugins dir>/<driver>/dra.sock`` and the registration service
on ``<registry dir>/<driver>-reg.sock``; kubelet's plugin watcher notices the second,
registers the driver, and does so again by itself after a kubelet restart (it scans the
registry directory when it starts). Only a socket removed from under the agent needs the
agent: both are then served afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import structlog

from vgpu_operator.agent.backoff import wait_or_stop
from vgpu_operator.agent.dra import health_stream
from vgpu_operator.agent.dra import plugin as dra_plugin
from vgpu_operator.agent.dra.health_stream import HealthStream
from vgpu_operator.agent.dra.plugin import DraPlugin, Registration
from vgpu_operator.devices import dra

log = structlog.get_logger("vgpu_operator.dra")


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class DraRunner:
    """Runs one DRA plugin until stopped."""

    def __init__(
        self,
        plugin: DraPlugin,
        plugins_dir: Path,
        registry_dir: Path,
        *,
        driver: str = dra.DRIVER,
        poll_s: float = 0.5,
        health: HealthStream | None = None,
    ) -> None:
        self.plugin = plugin
        self.health = health
        self.driver = driver
        self.dra_socket = plugins_dir / driver / "dra.sock"
        self.registration_socket = registry_dir / f"{driver}-reg.sock"
        self.poll_s = poll_s
        services: tuple[str, ...] = (dra_plugin.DRA_SERVICE,)
        if health is not None:
            services += (health_stream.HEALTH_SERVICE,)
        self.registration = Registration(driver, str(self.dra_socket), services)
        #: How often both sockets were served (1 + the times they had vanished).
        self.serves = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.dra_socket.parent.mkdir(parents=True, exist_ok=True)
            self.registration_socket.parent.mkdir(parents=True, exist_ok=True)
            _unlink(self.dra_socket)  # stale sockets of an earlier run
            _unlink(self.registration_socket)
            # The service first: kubelet dials it as soon as it sees the registration.
            dra_server = await dra_plugin.serve_dra(self.plugin, str(self.dra_socket), self.health)
            registration_server = await dra_plugin.serve_registration(
                self.registration, str(self.registration_socket)
            )
            self.serves += 1
            log.info(
                "dra_plugin_serving",
                driver=self.driver,
                socket=str(self.dra_socket),
                registration=str(self.registration_socket),
            )
            try:
                await self._watch(stop)
            finally:
                await registration_server.stop(None)
                await dra_server.stop(None)
                _unlink(self.registration_socket)
                _unlink(self.dra_socket)

    async def _watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await wait_or_stop(stop, self.poll_s)
            if not (self.dra_socket.exists() and self.registration_socket.exists()):
                log.info("dra_socket_removed", driver=self.driver)
                return
