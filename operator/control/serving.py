"""The operator's small HTTP server: ``/metrics``, ``/healthz``, ``/readyz``.

It runs on the serving loop (aiohttp), with the webhook, apart from the scheduling loop
(``scheduling_thread``): no decision, however slow, delays a probe's answer. A scrape
copies the engine's figures on the scheduling loop (``OperatorMetrics``).
``/healthz`` fails when the process should be restarted (``live`` says why: a background
task has died, or the scheduling loop has not turned for a minute), so that the kubelet
restarts it. ``/readyz`` answers 200 once the operator has started, on standby replicas
too (they must be Ready for a rolling update to proceed); its body says whether this one
is the leader.
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
        live: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._metrics = metrics
        self._ready = ready
        self._leader = leader
        self._live = live
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self, addr: str, port: int) -> None:
        """Serve on ``addr:port``; raises OSError when the port cannot be bound."""
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
        problem = self._live()
        if problem is not None:
            return web.Response(status=503, text=f"{problem}\n")
        return web.Response(text="ok\n")

    async def _serve_ready(self, request: web.Request) -> web.Response:
        if not self._ready():
            return web.Response(status=503, text="starting\n")
        role = "leader" if self._leader() else "standby"
        return web.Response(text=f"ok ({role})\n")
