"""A gRPC server on a unix socket, as kubelet's plugin APIs (device plugins, DRA, plugin
registration) are served and as our kubelet stand-in serves registration."""

from __future__ import annotations

from collections.abc import Callable
from os import PathLike

import grpc


async def serve_unix(
    add_servicer: Callable[[grpc.aio.Server], object], socket_path: str | PathLike[str]
) -> grpc.aio.Server:
    """A started server on ``socket_path`` with what ``add_servicer`` puts on it (the
    generated ``add_*Servicer_to_server`` of the API, applied to the servicer)."""
    server = grpc.aio.server()
    add_servicer(server)
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    return server
