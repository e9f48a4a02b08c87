"""How one node agent behaves (its flags, as one value), and the small words its loops
share: the time now and one line for an error."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

from vgpu_operator.agent.inventory import RegistrationOptions
from vgpu_operator.devices import nvidia


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """How one agent behaves. Intervals are in seconds."""

    node_name: str
    #: How often the node's Lease is renewed (and the inventory checked against the reading).
    heartbeat_interval_s: float = 30.0
    #: What the Lease says it lasts (``spec.leaseDurationSeconds``): the operator's
    #: ``--inventory-timeout``, which is what decides when the node counts as lost.
    lease_duration_s: int = 120
    #: How often the machine is read; health events cut the wait short.
    poll_interval_s: float = 10.0
    registration: RegistrationOptions = field(default_factory=RegistrationOptions)
    #: Also write hami.io/node-nvidia-register, -score and the handshake on the Node.
    write_hami_annotations: bool = False
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    #: Longest single wait for an NVML event; bounds how long shutdown waits for it.
    health_wait_s: float = 1.0
    #: The whole status is written again at least this often, whatever the server shows.
    reassert_interval_s: float = 300.0
    #: kubelet's device-plugin directory; None runs no device plugin (no kubelet here).
    device_plugin_dir: str | None = None
    #: The count resource the plugin advertises (the device config's resourceCountName).
    device_plugin_resource: str = nvidia.COUNT_RESOURCE
    #: HAMi-core's directory on the host, mounted at the same path into the agent.
    hami_core_dir: str = "/usr/local/vgpu"
    #: The device-config ConfigMap this node's settings follow; name None follows none
    #: (the flags above are then all there is).
    config_namespace: str = "vgpu-operator"
    config_map: str | None = None
    config_key: str = "device-config.yaml"
    #: The libvgpu.so the image carries, installed into hami_core_dir at start; None
    #: installs nothing (the library is put there some other way).
    hami_core_library: str | None = None
    #: kubelet's DRA directories (plugins, plugin registry) and the CDI spec directory;
    #: None runs no DRA driver. A node labelled for DRA runs the driver instead of the
    #: device plugin (``devices.dra.NODE_PATH_LABEL``).
    dra_plugins_dir: str | None = None
    dra_registry_dir: str = "/var/lib/kubelet/plugins_registry"
    cdi_dir: str = "/var/run/cdi"


def utc_now() -> datetime:
    return datetime.now(UTC)


def describe_error(exc: BaseException) -> str:
    """One line for a log: API errors as status, reason and the server's message
    (the library's own text carries every response header)."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        reason = getattr(exc, "reason", "") or ""
        message = ""
        body = getattr(exc, "body", None)
        if isinstance(body, str | bytes):
            with contextlib.suppress(ValueError):
                parsed = json.loads(body)
                if isinstance(parsed, dict):
                    message = str(parsed.get("message", ""))
        text = f"{type(exc).__name__} {status} {reason}".rstrip()
        return f"{text}: {message}" if message else text
    return f"{type(exc).__name__}: {exc}"
