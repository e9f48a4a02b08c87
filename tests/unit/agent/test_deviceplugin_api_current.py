"""The generated device-plugin API code matches the vendored api.proto (make deviceplugin-api)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_generated_code_is_current() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "gen-deviceplugin-api.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_generated_service_has_kubelets_rpcs() -> None:
    from vgpu_operator.agent.deviceplugin import api_pb2, api_pb2_grpc

    assert {m.name for m in api_pb2.DESCRIPTOR.services_by_name["DevicePlugin"].methods} == {
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    }
    assert hasattr(api_pb2_grpc, "RegistrationStub")
