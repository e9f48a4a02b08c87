"""session.tune: the client's HTTP session does no per-request environment lookups and
keeps its connections between bursts."""

from __future__ import annotations

import asyncio

from kubernetes_asyncio import client

from vgpu_operator.kube import session


def test_tuned_session_keeps_connections_and_ignores_the_environment() -> None:
    async def scenario() -> tuple[bool, int, float]:
        configuration = client.Configuration(host="https://127.0.0.1:6443")
        configuration.verify_ssl = False
        api = client.ApiClient(configuration)
        try:
            await session.tune(api)
            tuned = session.session_of(api)
            connector = tuned.connector
            assert connector is not None
            keepalive = float(connector._keepalive_timeout)  # type: ignore[arg-type]
            return tuned.trust_env, connector.limit, keepalive
        finally:
            await api.close()

    trust_env, limit, keepalive = asyncio.run(scenario())
    assert not trust_env  # no netrc read per request
    assert limit == session.MAX_CONNECTIONS
    assert keepalive == session.KEEPALIVE_S > 15.0  # aiohttp's default closes them in 15 s
