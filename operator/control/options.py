"""How one operator process is run: the command line's options, as one value."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from vgpu_operator.control.feed import DEFAULT_CONFIG_KEY
from vgpu_operator.scheduling.books.allocation_gate import DEFAULT_TIMEOUT_S, GateMode

DEFAULT_NAMESPACE: Final = "vgpu-operator"
DEFAULT_CONFIG_MAP: Final = "vgpu-device-config"
DEFAULT_PEERING: Final = "vgpu-operator"


@dataclass(frozen=True, slots=True)
class WebhookOptions:
    """The mutating admission webhook's HTTPS server (served by Kopf)."""

    port: int
    addr: str = "0.0.0.0"
    host: str | None = None  # the name in the webhook URL, if Kopf manages the configuration
    certfile: Path | None = None
    pkeyfile: Path | None = None
    cafile: Path | None = None
    #: When set, Kopf creates/patches a MutatingWebhookConfiguration of this name itself
    #: (handy for local runs and tests); otherwise manifests/ provides a static one.
    managed_name: str | None = None
    #: Self-managed TLS (no cert-manager): the operator keeps its own CA and serving
    #: certificate in this Secret of its namespace, serves them from ``tls_dir``
    #: (``certfile``/``pkeyfile`` are ignored) and patches ``configuration``'s caBundle.
    tls_secret: str | None = None
    service: str = "vgpu-operator-webhook"
    configuration: str | None = "vgpu-operator"
    tls_dir: Path = Path("/tmp/vgpu-operator-webhook-tls")
    tls_check_interval_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class DefragOptions:
    """Carrying out defragmentation plans (``control/defrag.py``)."""

    #: Seconds between looks for pods blocked by fragmentation.
    interval_s: float = 60.0
    #: The most pods one plan evicts.
    max_evictions: int = 3
    #: Move pods no controller recreates too.
    allow_bare_pods: bool = False
    #: More controller kinds (``Kind`` or ``group/Kind``) whose pods may move.
    owner_kinds: frozenset[str] = frozenset()
    #: How long one move (the pod gone, its replacement bound) or the final bind may take.
    step_timeout_s: float = 120.0
    #: How often a move's progress is read.
    poll_s: float = 1.0


@dataclass(frozen=True, slots=True)
class AutoscaleOptions:
    """Asking Karpenter for the nodes the waiting pods need (``control/autoscaler.py``)."""

    #: The instance types the NodePools may use, with their cards (``autoscale_catalogue``).
    instance_types: Path
    #: Seconds between rounds (a pod found waiting also starts one).
    interval_s: float = 5.0
    #: A NodeClaim that has not become a node (its inventory read) by then is withdrawn.
    node_timeout_s: float = 600.0
    #: An instance type whose NodeClaim timed out or failed is not asked for this long.
    cool_off_s: float = 600.0
    #: The longest one round's search may take (seconds of CPU).
    max_search_s: float = 0.25
    #: New nodes are asked for once no new pod has been found waiting for ``batch_idle_s``,
    #: or ``batch_max_s`` after the first (Karpenter's own batching window): pods created
    #: together are planned together.
    batch_idle_s: float = 1.0
    batch_max_s: float = 10.0
    #: Give back a node whose pods all fit elsewhere when it saves at least this much per
    #: hour (the offering's price; None: never give a node back).
    scale_down_min_savings: float | None = 0.0
    #: A node younger than this (its NodeClaim's age) is not given back.
    scale_down_after_s: float = 300.0
    #: The most waiting pods one round plans for (the most important first).
    max_pods: int = 256


@dataclass(frozen=True, slots=True)
class TemplateCollection:
    """The collection of webhook-made ResourceClaimTemplates no pod names
    (``control/template_collector``): a round every ``interval_s``; a template is kept
    ``grace_s`` after its creation or the last pod admitted with it; at most
    ``max_deletes`` per round."""

    interval_s: float = 60.0
    grace_s: float = 600.0
    max_deletes: int = 100


@dataclass(frozen=True, slots=True)
class PlaceableOptions:
    """Kueue's AdmissionCheck ``vgpu-operator.io/placeable`` (``--kueue-placeable-check``)."""

    #: How long a Ready answer holds its shares at most (seconds; docs/kueue.md).
    hold_s: float = 30.0
    #: ``requeueAfterSeconds`` of a Retry answer: when Kueue tries the workload again (at
    #: least 2: ``admission_checks`` resets the answer before Kueue's requeue).
    retry_after_s: int = 10


@dataclass(frozen=True, slots=True)
class OperatorOptions:
    kubeconfig: Path | None = None
    namespace: str = DEFAULT_NAMESPACE  # where the device-config ConfigMap lives
    config_map: str = DEFAULT_CONFIG_MAP
    config_key: str = DEFAULT_CONFIG_KEY
    #: Kopf peering object (ClusterKopfPeering); ignored when ``standalone``.
    peering: str = DEFAULT_PEERING
    standalone: bool = False
    priority: int | None = None  # None: older replicas win (leadership.peering_priority)
    metrics_port: int | None = 8080  # None: no HTTP server for /metrics, /healthz, /readyz
    metrics_addr: str = "0.0.0.0"
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: str = "INFO"
    #: A node whose heartbeat (the later of its Lease's renewal and its DeviceInventory's
    #: status.heartbeat) is older than this offers no devices (None: never).
    inventory_timeout_s: float | None = 120.0
    #: How long an unschedulable pod waits for an event that could let it fit before it
    #: is tried again anyway (the queue's flush; the watches keep the books current, a
    #: kind is listed again only when its watch's resourceVersion has expired).
    resync_interval_s: float = 300.0
    #: A failed pod's backoff: from the first, doubling up to the longest (kube-scheduler's).
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 10.0
    #: Bindings written at once. The API server answers a Binding in 100-500 ms under a
    #: burst, so this many in flight bounds the rate at this many per that latency.
    max_binds_in_flight: int = 64
    #: A Normal "Scheduled" Event per bound pod, as kube-scheduler writes.
    scheduled_events: bool = True
    #: At most one GPU pod per node between its Binding and the device plugin's answer,
    #: so the plugin can tell which pod an Allocate is for (``allocation_gate``).
    allocation_gate: GateMode = GateMode.BOOKS
    allocation_gate_timeout_s: float = DEFAULT_TIMEOUT_S
    webhook: WebhookOptions | None = None
    #: Carry out defragmentation plans (None: off, the default).
    defrag: DefragOptions | None = None
    #: Collect the webhook's unused ResourceClaimTemplates (None: never).
    template_collection: TemplateCollection | None = TemplateCollection()
    #: Answer Kueue's AdmissionCheck ``vgpu-operator.io/placeable`` (None: off, the
    #: default; ``control/admission_checks``, docs/kueue.md).
    kueue_check: PlaceableOptions | None = None
    #: Ask Karpenter for the nodes waiting pods need (None: off, the default;
    #: docs/autoscaling.md).
    autoscale: AutoscaleOptions | None = None
    #: ``/healthz`` fails once the scheduling loop has not turned for this long
    #: (``control/scheduling_thread``).
    scheduling_stuck_after_s: float = 60.0
