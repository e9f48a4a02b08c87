"""What kubelet does with the DRA plugin when it admits a pod, for nodes without a kubelet
(the demo's KWOK nodes): NodePrepareResources for a claim over the plugin's socket, and the
CDI spec the plugin wrote, read back as the runtime would find it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from vgpu_operator.agent.dra import dra_pb2, dra_pb2_grpc, prepare


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    """kubelet's answer for one claim, and the CDI spec behind its device IDs."""

    cdi_ids: tuple[str, ...]
    error: str
    spec: dict[str, Any] | None


async def prepare_claim(
    socket_path: Path, cdi_dir: Path, namespace: str, name: str, uid: str, timeout_s: float = 10.0
) -> PreparedClaim:
    async with grpc.aio.insecure_channel(f"unix://{socket_path}") as channel:
        stub = dra_pb2_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
        reply: dra_pb2.NodePrepareResourcesResponse = await stub.NodePrepareResources(
            dra_pb2.NodePrepareResourcesRequest(
                claims=[dra_pb2.Claim(namespace=namespace, name=name, uid=uid)]
            ),
            timeout=timeout_s,
        )
    answer = reply.claims[uid]
    ids = tuple(i for device in answer.devices for i in device.cdi_device_ids)
    spec_file = cdi_dir / prepare.spec_file_name(uid)
    spec = json.loads(spec_file.read_text()) if spec_file.exists() else None
    return PreparedClaim(ids, answer.error, spec)
