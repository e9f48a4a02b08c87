"""The operator's HTTP endpoints: metrics, liveness, readiness (a real local server)."""

from __future__ import annotations

import asyncio

import aiohttp

from vgpu_operator.control.serving import HttpServer
from vgpu_operator.metrics import OperatorMetrics, Result


def test_endpoints_answer_from_the_callbacks() -> None:
    state: dict[str, bool] = {"ready": False, "leader": False, "live": True}
    metrics = OperatorMetrics()
    metrics.attempt(Result.SCHEDULED)

    async def scenario() -> list[tuple[str, int, str]]:
        server = HttpServer(
            metrics,
            ready=lambda: state["ready"],
            leader=lambda: state["leader"],
            live=lambda: None if state["live"] else "the scheduling loop has not turned",
        )
        await server.start("127.0.0.1", 0)
        seen: list[tuple[str, int, str]] = []
        try:
            async with aiohttp.ClientSession() as session:

                async def get(path: str) -> None:
                    async with session.get(f"http://127.0.0.1:{server.port}{path}") as resp:
                        seen.append((path, resp.status, await resp.text()))

                await get("/readyz")
                state["ready"] = True
                await get("/readyz")
                state["leader"] = True
                await get("/readyz")
                await get("/healthz")
                state["live"] = False
                await get("/healthz")
                await get("/metrics")
        finally:
            await server.stop()
        return seen

    seen = asyncio.run(scenario())
    statuses = [(path, status) for path, status, _ in seen]
    assert statuses == [
        ("/readyz", 503),
        ("/readyz", 200),
        ("/readyz", 200),
        ("/healthz", 200),
        ("/healthz", 503),
        ("/metrics", 200),
    ]
    assert "standby" in seen[1][2]
    assert "leader" in seen[2][2]
    assert "the scheduling loop has not turned" in seen[4][2]
    assert 'vgpu_operator_scheduling_attempts_total{result="scheduled"} 1.0' in seen[5][2]
