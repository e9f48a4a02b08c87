"""``vgpu-operator run``: the scheduler operator (Kopf) against a cluster; and
``vgpu-operator defrag plan``, the defragmentation plans for a live cluster."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from vgpu_operator.cli_options import (
    device_config_options,
    kubeconfig_option,
    logging_options,
    plan_options,
)
from vgpu_operator.cli_types import KubeName, Seconds

if TYPE_CHECKING:
    from vgpu_operator.control.options import AutoscaleOptions, OperatorOptions, WebhookOptions
    from vgpu_operator.scheduling.defrag.defrag import Report

#: Shown in ``--help``; the full story is in control/operator.py and docs/architecture.md.
_RUN_HELP = """Run the operator: watch pods, nodes, DeviceInventories, quotas and the
device-config ConfigMap, and bind pending pods that use our schedulerName."""


@click.command("run", help=_RUN_HELP)
@kubeconfig_option
@device_config_options
@click.option(
    "--peering",
    type=KubeName("ClusterKopfPeering name"),
    default="vgpu-operator",
    show_default=True,
    help="ClusterKopfPeering object that elects the active replica.",
)
@click.option("--standalone", is_flag=True, help="No peering: this replica always decides.")
@click.option(
    "--priority", type=int, default=None, help="Peering priority (default: older replicas win)."
)
@click.option(
    "--metrics-port",
    type=click.IntRange(-1, 65535),
    default=8080,
    show_default=True,
    help="Port for /metrics, /healthz and /readyz; 0 picks a free port, -1 disables.",
)
@logging_options
@click.option(
    "--inventory-timeout",
    "inventory_timeout_s",
    type=Seconds(0.0),
    default=120.0,
    show_default=True,
    help="Seconds without a heartbeat (the node's Lease in vgpu-node-leases, or its "
    "DeviceInventory's status.heartbeat, whichever is later) before a node's devices are "
    "unschedulable; 0 disables.",
)
@click.option(
    "--resync-interval",
    "resync_interval_s",
    type=Seconds(0.0, open_min=True),
    default=300.0,
    show_default=True,
    help="Seconds an unschedulable pod waits for an event that could let it fit before it "
    "is tried again anyway (kube-scheduler's podMaxInUnschedulablePodsDuration).",
)
@click.option(
    "--allocation-gate",
    type=click.Choice(["books", "hami-lock", "off"]),
    default="books",
    show_default=True,
    help="Bind at most one GPU pod per node until its device plugin answers (bind-phase "
    "success or failed), so the plugin knows which pod an Allocate is for. hami-lock also "
    "writes HAMi's hami.io/mutex.lock node annotation, for HAMi's own device plugin; off "
    "binds without waiting (only safe where no plugin needs to tell pods apart).",
)
@click.option(
    "--allocation-gate-timeout",
    "allocation_gate_timeout_s",
    type=Seconds(1.0),
    default=60.0,
    show_default=True,
    help="Seconds after which a node whose device plugin has not answered takes GPU pods again.",
)
@click.option(
    "--max-binds-in-flight",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Bindings written at once (more helps while the API server has CPU to spare).",
)
@click.option(
    "--scheduled-events/--no-scheduled-events",
    default=True,
    show_default=True,
    help="A Normal Scheduled Event per bound pod, as kube-scheduler writes; written while "
    "no Binding is in flight, at most a few seconds late.",
)
@click.option(
    "--webhook-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve the mutating admission webhook (HTTPS) on this port.",
)
@click.option("--webhook-addr", default="0.0.0.0", show_default=True)
@click.option("--webhook-cert", type=click.Path(exists=True, path_type=Path), default=None)
@click.option("--webhook-key", type=click.Path(exists=True, path_type=Path), default=None)
@click.option("--webhook-ca", type=click.Path(exists=True, path_type=Path), default=None)
@click.option(
    "--webhook-tls-secret",
    type=KubeName("Secret name"),
    default=None,
    help="Self-managed TLS instead of --webhook-cert/--webhook-key: keep a CA and serving "
    "certificate in this Secret of --namespace, renew them, and patch the caBundle of "
    "--webhook-configuration.",
)
@click.option(
    "--webhook-service",
    type=KubeName("Service name", label=True),
    default="vgpu-operator-webhook",
    show_default=True,
    help="The webhook's Service, named in the self-managed certificate.",
)
@click.option(
    "--webhook-configuration",
    type=KubeName("MutatingWebhookConfiguration name", empty_ok=True),
    default="vgpu-operator",
    show_default=True,
    help="The MutatingWebhookConfiguration whose caBundle self-managed TLS keeps current.",
)
@click.option(
    "--webhook-tls-dir",
    type=click.Path(path_type=Path),
    default=Path("/tmp/vgpu-operator-webhook-tls"),
    show_default=True,
    help="Where self-managed TLS writes the serving certificate and key.",
)
@click.option(
    "--defrag/--no-defrag",
    default=False,
    show_default=True,
    help="Carry out defragmentation plans: evict pods (through the Eviction API) so that "
    "pods waiting on free shares scattered over cards fit (docs/operations.md).",
)
@click.option(
    "--defrag-interval",
    "defrag_interval_s",
    type=Seconds(1.0),
    default=60.0,
    show_default=True,
    help="Seconds between looks for pods blocked by fragmentation.",
)
@plan_options("defrag-")
@click.option(
    "--defrag-step-timeout",
    "defrag_step_timeout_s",
    type=Seconds(1.0),
    default=120.0,
    show_default=True,
    help="Seconds a move (the pod gone, its replacement bound) may take before the plan stops.",
)
@click.option(
    "--kueue-placeable-check/--no-kueue-placeable-check",
    default=False,
    show_default=True,
    help="Answer Kueue's AdmissionChecks of controllerName vgpu-operator.io/placeable: Ready "
    "only when every pod of the Workload fits on the cards now (docs/kueue.md).",
)
@click.option(
    "--kueue-hold",
    "kueue_hold_s",
    type=Seconds(1.0),
    default=30.0,
    show_default=True,
    help="Seconds a Ready answer holds the shares it found, at most (until Kueue admits).",
)
@click.option(
    "--kueue-retry-after",
    "kueue_retry_after_s",
    type=click.IntRange(min=2),
    default=10,
    show_default=True,
    help="requeueAfterSeconds of a Retry answer: when Kueue asks again (at least 2: the "
    "answer is set back to Pending before Kueue requeues the workload; docs/kueue.md).",
)
@click.option(
    "--autoscale-instance-types",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Ask Karpenter for the nodes waiting GPU pods need: the instance types its "
    "NodePools may use, with the cards of each (JSON; docs/autoscaling.md). Off without it.",
)
@click.option(
    "--autoscale-interval",
    "autoscale_interval_s",
    type=Seconds(0.1),
    default=5.0,
    show_default=True,
    help="Seconds between autoscaling rounds (a pod found waiting starts one sooner).",
)
@click.option(
    "--autoscale-node-timeout",
    "autoscale_node_timeout_s",
    type=Seconds(1.0),
    default=600.0,
    show_default=True,
    help="Seconds a NodeClaim may take to become a node with its inventory before it is "
    "withdrawn (and its instance type not asked for again for as long).",
)
@click.option(
    "--autoscale-scale-down-min-savings",
    "autoscale_scale_down_min_savings",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="Give back a node whose pods would all fit elsewhere only when it saves at least "
    "this much per hour (its offering's price in the instance types).",
)
@click.option(
    "--autoscale-scale-down/--no-autoscale-scale-down",
    default=True,
    show_default=True,
    help="Give back nodes of a NodePool whose pods would all fit elsewhere (their NodeClaim "
    "deleted: Karpenter drains them, honouring PodDisruptionBudgets).",
)
def run(**flags: Any) -> None:
    # Imported here so that `vgpu-operator --help` does not load Kopf.
    from vgpu_operator import logging as vgpu_logging
    from vgpu_operator.handlers import runtime

    options = _operator_options(flags)
    vgpu_logging.configure(flags["log_format"], flags["log_level"])
    runtime.run_forever(options)


def _operator_options(flags: Mapping[str, Any]) -> OperatorOptions:
    """The operator's options from ``run``'s flags (named as its parameters); a flag that
    goes with another missing, or one that excludes another given, is a usage error."""
    from vgpu_operator.control import options as operator_options
    from vgpu_operator.scheduling.books.allocation_gate import GateMode

    return operator_options.OperatorOptions(
        kubeconfig=flags["kubeconfig"],
        namespace=flags["namespace"],
        config_map=flags["config_map"],
        config_key=flags["config_key"],
        peering=flags["peering"],
        standalone=flags["standalone"],
        priority=flags["priority"],
        metrics_port=None if flags["metrics_port"] < 0 else flags["metrics_port"],
        log_format=flags["log_format"],
        log_level=flags["log_level"],
        inventory_timeout_s=flags["inventory_timeout_s"] or None,
        resync_interval_s=flags["resync_interval_s"],
        allocation_gate=GateMode(flags["allocation_gate"]),
        allocation_gate_timeout_s=flags["allocation_gate_timeout_s"],
        max_binds_in_flight=flags["max_binds_in_flight"],
        scheduled_events=flags["scheduled_events"],
        webhook=_webhook_options(flags),
        defrag=operator_options.DefragOptions(
            interval_s=flags["defrag_interval_s"],
            max_evictions=flags["defrag_max_evictions"],
            allow_bare_pods=flags["defrag_allow_bare_pods"],
            owner_kinds=frozenset(flags["defrag_owner_kinds"]),
            step_timeout_s=flags["defrag_step_timeout_s"],
        )
        if flags["defrag"]
        else None,
        kueue_check=operator_options.PlaceableOptions(
            hold_s=flags["kueue_hold_s"], retry_after_s=flags["kueue_retry_after_s"]
        )
        if flags["kueue_placeable_check"]
        else None,
        autoscale=_autoscale_options(flags),
    )


def _autoscale_options(flags: Mapping[str, Any]) -> AutoscaleOptions | None:
    """Autoscaling's options (None without ``--autoscale-instance-types``)."""
    from vgpu_operator.control import options as operator_options

    if flags["autoscale_instance_types"] is None:
        return None
    return operator_options.AutoscaleOptions(
        instance_types=flags["autoscale_instance_types"],
        interval_s=flags["autoscale_interval_s"],
        node_timeout_s=flags["autoscale_node_timeout_s"],
        cool_off_s=flags["autoscale_node_timeout_s"],
        scale_down_min_savings=flags["autoscale_scale_down_min_savings"]
        if flags["autoscale_scale_down"]
        else None,
    )


def _webhook_options(flags: Mapping[str, Any]) -> WebhookOptions | None:
    """The webhook's options (None without ``--webhook-port``): its certificate from files
    or from a Secret, never both."""
    from vgpu_operator.control import options as operator_options

    cert, key, secret = flags["webhook_cert"], flags["webhook_key"], flags["webhook_tls_secret"]
    has_files = cert is not None and key is not None
    if flags["webhook_port"] is not None and not has_files and secret is None:
        raise click.UsageError(
            "--webhook-port needs --webhook-cert and --webhook-key, or --webhook-tls-secret"
        )
    if secret is not None and (cert or key):
        raise click.UsageError("--webhook-tls-secret excludes --webhook-cert/--webhook-key")
    if flags["webhook_port"] is None:
        return None
    return operator_options.WebhookOptions(
        port=flags["webhook_port"],
        addr=flags["webhook_addr"],
        certfile=cert,
        pkeyfile=key,
        cafile=flags["webhook_ca"],
        tls_secret=secret,
        service=flags["webhook_service"],
        configuration=flags["webhook_configuration"] or None,
        tls_dir=flags["webhook_tls_dir"],
    )


# --- vgpu-operator defrag plan --------------------------------------------------------------

_DEFRAG_HELP = """Defragmentation: plans that move pods so that pods waiting on scattered
shares fit (docs/operations.md)."""


@click.group("defrag", help=_DEFRAG_HELP)
def defrag_group() -> None:
    pass


@defrag_group.command("plan")
@kubeconfig_option
@device_config_options
@plan_options("")
@click.option(
    "--method",
    type=click.Choice(["auto", "exact", "heuristic"]),
    default="auto",
    show_default=True,
    help="auto: exact up to 8 nodes, heuristic beyond.",
)
@click.option(
    "--inventory-timeout",
    "inventory_timeout_s",
    type=Seconds(0.0),
    default=120.0,
    show_default=True,
    help="As the operator's: a node without a heartbeat this long offers no devices.",
)
@click.option(
    "-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True
)
def defrag_plan(
    kubeconfig: Path | None,
    namespace: str,
    config_map: str,
    config_key: str,
    max_evictions: int,
    allow_bare_pods: bool,
    owner_kinds: tuple[str, ...],
    method: str,
    inventory_timeout_s: float,
    output: str,
) -> None:
    """Read the cluster (get and list only) and print the plans the operator would make
    for the pods waiting because their room is scattered over cards; nothing is moved."""
    import asyncio
    import json
    import sys
    import time

    from vgpu_operator import logging as vgpu_logging
    from vgpu_operator.control import snapshot
    from vgpu_operator.kube import client
    from vgpu_operator.kube.requests import ApiError
    from vgpu_operator.scheduling.defrag import defrag

    # What reading the cluster logs (a node without an inventory, an allocation the books
    # refuse) goes to stderr, warnings and worse only: stdout is the table or the JSON.
    vgpu_logging.configure("auto", "WARNING", stream=sys.stderr)

    async def read() -> snapshot.Snapshot:
        async with client.api_client(kubeconfig) as api:
            return await snapshot.read_cluster(
                api,
                namespace=namespace,
                config_map=config_map,
                config_key=config_key,
                inventory_timeout_s=inventory_timeout_s or None,
            )

    try:
        cluster = asyncio.run(read())
    except (ApiError, snapshot.SnapshotError) as exc:
        click.echo(f"error: cannot read the cluster: {exc}", err=True)
        sys.exit(2)
    options = defrag.PlanOptions(
        max_evictions=max_evictions,
        allow_bare_pods=allow_bare_pods,
        owner_kinds=frozenset(owner_kinds),
    )
    report = defrag.plan(
        cluster.state,
        cluster.waiting(),
        cluster.pods,
        time.time(),
        options,
        exact=None if method == "auto" else method == "exact",
    )
    if output == "json":
        click.echo(json.dumps(report_json(report), indent=2))
    else:
        click.echo(report_table(report))


def report_json(report: Report) -> dict[str, Any]:
    """A defragmentation report as ``simulate`` prints it (docs/scenario-format.md)."""
    return {
        "plans": [p.to_json() for p in report.plans],
        "fragmented": list(report.fragmented),
        "unplanned": dict(report.unplanned),
        **({"groupsLeft": dict(report.groups_left)} if report.groups_left else {}),
    }


def report_table(report: Report) -> str:
    """A defragmentation report for a terminal: per plan, its moves in order."""
    if not report.fragmented:
        return "No pod is waiting for room scattered over cards."
    lines: list[str] = []
    for number, plan in enumerate(report.plans, 1):
        cards = " ".join(",".join(c) for c in plan.cards)
        lines.append(
            f"Plan {number}: {plan.pod} fits on {plan.node} ({cards}) after "
            f"{plan.evictions} eviction{'s' if plan.evictions != 1 else ''}, "
            f"{plan.memory_mib} MiB moved ({plan.method})"
        )
        rows = [("STEP", "EVICT", "OWNER", "FROM", "FITS AGAIN ON", "MiB", "REPLACEMENT")]
        for step, move in enumerate(plan.moves, 1):
            owner = "-" if move.owner is None else f"{move.owner.kind}/{move.owner.name}"
            rows.append(
                (
                    str(step),
                    move.pod,
                    owner,
                    f"{move.from_node} {','.join(move.from_cards)}",
                    f"{move.to_node} {','.join(move.to_cards)}",
                    str(move.memory_mib),
                    move.replacement.value,
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            lines.append("  " + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
        lines.append("")
    if report.unplanned:
        lines.append("Waiting for scattered room, without a plan:")
        for pod, why in sorted(report.unplanned.items()):
            lines.append(f"  {pod}: {why}")
    if report.groups_left:
        lines.append("Pod groups left alone:")
        lines.extend(f"  {why}" for _group, why in sorted(report.groups_left.items()))
    return "\n".join(lines).rstrip("\n")
