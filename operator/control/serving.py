"""The operator's small HTTP server: ``/metrics``, ``/healthz``, ``/readyz``.

It runs on the operator's own event loop (aiohttp), so a scrape reads the engine on the
thread that changes it: the per-device figures need no lock and are exact at scrape time.
``/healthz`` fails once a background task (the worker, a watch) has died, so that the
kubelet restarts the process. ``/readyz`` answers 200 once the operator has started, on
standby replicas too (they must be Ready for a rolling update to proceed); its body says
whether this one is the leader.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from vgpu_operator.metrics import OperatorMetrics


class HttpServer:
    def __init__(
        self,
        metrics: OperatorMetrics,
        *,
        ready: Callable[[], bool],
        leader: Callable[[], bool],
        live: Callable[[], bool] = lambda: True,
    ) -> None:
        self._metrics = metrics
        self._ready = ready
        self._leader = leader
        self._live = live
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self, addr: str, port: int) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._serve_metrics)
        app.router.add_get("/healthz", self._serve_health)
        app.router.add_get("/readyz", self._serve_ready)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, addr, port)
        await site.start()
        addresses = self._runner.addresses  # the bound port when port=0
        self.port = addresses[0][1] if addresses else port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _serve_metrics(self, request: web.Request) -> web.Response:
        body, content_type = await self._metrics.render_beside_the_loop()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _serve_health(self, request: web.Request) -> web.Response:
        if not self._live():
            return web.Response(status=503, text="a background task has stopped\n")
        return web.Response(text="ok\n")

    async def _serve_ready(self, request: web.Request) -> web.Response:
        if not self._ready():
            return web.Response(status=503, text="starting\n")
        role = "leader" if self._leader() else "standby"
        return web.Response(text=f"ok ({role})\n")
