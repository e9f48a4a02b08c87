"""The ``agent`` and ``crds`` commands (registered on the main group in cli.py)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import cast

import click

from vgpu_operator import resources
from vgpu_operator.cli_options import kubeconfig_option, logging_options
from vgpu_operator.cli_types import Positive, Seconds
from vgpu_operator.devices import nvidia
from vgpu_operator.errors import ConfigError


@click.command("agent")
@click.option(
    "--node-name",
    envvar="NODE_NAME",
    required=True,
    help="The Node this agent reports for (the DaemonSet passes spec.nodeName).",
)
@click.option(
    "--backend",
    default="nvml",
    show_default=True,
    help="nvml, or sim:FILE / sim:NAME for a simulated machine (bundled: see docs/agent.md).",
)
@kubeconfig_option
@click.option(
    "--heartbeat-interval",
    type=Seconds(0.1),
    default=30.0,
    show_default=True,
    help="Seconds between renewals of the node's Lease (in vgpu-node-leases).",
)
@click.option(
    "--lease-duration",
    type=click.IntRange(min=1),
    default=120,
    show_default=True,
    help="What the node's Lease says it lasts (spec.leaseDurationSeconds): the operator's "
    "--inventory-timeout.",
)
@click.option("--poll-interval", type=Seconds(0.1), default=10.0, show_default=True)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=9402,
    show_default=True,
    help="Port for Prometheus /metrics; 0 turns it off.",
)
@click.option(
    "--write-hami-annotations/--no-write-hami-annotations",
    default=False,
    show_default=True,
    help=f"Also write {nvidia.REGISTER_ANNOTATION} and -score on the Node.",
)
@click.option("--device-split-count", type=click.IntRange(min=1), default=10, show_default=True)
@click.option(
    "--device-memory-scaling",
    type=Positive(),
    default=1.0,
    show_default=True,
)
@click.option(
    "--device-core-scaling",
    type=Positive(),
    default=1.0,
    show_default=True,
)
@click.option(
    "--device-plugin-dir",
    default="",
    help="kubelet's device-plugin directory (/var/lib/kubelet/device-plugins on a node), "
    "where the agent serves and registers the count resource; empty (the default) runs "
    "no device plugin. Needs manifests/agent-device-plugin.yaml (the pods it may read "
    "and settle).",
)
@click.option(
    "--device-plugin-resource",
    default=nvidia.COUNT_RESOURCE,
    show_default=True,
    help="The count resource the device plugin advertises (resourceCountName).",
)
@click.option(
    "--config-map",
    default="vgpu-device-config",
    show_default=True,
    help="The device-config ConfigMap whose nodeconfig entry for this node (and nvidia "
    "section) the agent follows without restart; the --device-* flags are fallbacks for "
    "what it does not say. Empty follows none.",
)
@click.option(
    "--config-namespace",
    envvar="POD_NAMESPACE",
    default="vgpu-operator",
    show_default=True,
    help="The ConfigMap's namespace (env POD_NAMESPACE).",
)
@click.option("--config-key", default="device-config.yaml", show_default=True)
@click.option(
    "--hami-core-dir",
    default="/usr/local/vgpu",
    show_default=True,
    help="HAMi-core's directory on the host (mounted at the same path into the agent): "
    "libvgpu.so, ld.so.preload and the per-container cache directories.",
)
@click.option(
    "--hami-core-library",
    default="",
    help="A libvgpu.so to install into --hami-core-dir at start (the image carries one); "
    "empty installs nothing.",
)
@click.option(
    "--kubelet-plugins-dir",
    default="",
    help="kubelet's plugins directory (/var/lib/kubelet/plugins on a node), where the DRA "
    "driver serves; empty (the default) runs no DRA driver. A node labelled "
    "gpu.vgpu-operator.io/path=dra is then served by the DRA driver instead of the device "
    "plugin (docs/agent.md).",
)
@click.option(
    "--kubelet-registry-dir",
    default="/var/lib/kubelet/plugins_registry",
    show_default=True,
    help="kubelet's plugin registry directory, watched by kubelet for the DRA driver's "
    "registration socket.",
)
@click.option(
    "--cdi-dir",
    default="/var/run/cdi",
    show_default=True,
    help="The container runtime's CDI spec directory: the DRA driver writes each prepared "
    "claim's spec there.",
)
@logging_options
def agent_command(
    node_name: str,
    backend: str,
    kubeconfig: Path | None,
    heartbeat_interval: float,
    lease_duration: int,
    poll_interval: float,
    metrics_port: int,
    write_hami_annotations: bool,
    device_split_count: int,
    device_memory_scaling: float,
    device_core_scaling: float,
    device_plugin_dir: str,
    device_plugin_resource: str,
    config_map: str,
    config_namespace: str,
    config_key: str,
    hami_core_dir: str,
    hami_core_library: str,
    kubelet_plugins_dir: str,
    kubelet_registry_dir: str,
    cdi_dir: str,
    log_format: str,
    log_level: str,
) -> None:
    """Report this node's GPUs as a DeviceInventory (runs until SIGTERM)."""
    # Imported here so that `vgpu-operator --help` does not load the client libraries.
    from vgpu_operator import logging as vgpu_logging
    from vgpu_operator.agent.backends import backend_from_spec
    from vgpu_operator.agent.inventory import RegistrationOptions
    from vgpu_operator.agent.main import run_agent
    from vgpu_operator.agent.settings import AgentSettings

    vgpu_logging.configure(cast(vgpu_logging.LogFormat, log_format), log_level)
    try:
        source = backend_from_spec(backend, node_name)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--backend") from None
    settings = AgentSettings(
        node_name=node_name,
        heartbeat_interval_s=heartbeat_interval,
        lease_duration_s=lease_duration,
        poll_interval_s=poll_interval,
        registration=RegistrationOptions(
            split_count=device_split_count,
            memory_scaling=device_memory_scaling,
            core_scaling=device_core_scaling,
        ),
        write_hami_annotations=write_hami_annotations,
        device_plugin_dir=device_plugin_dir or None,
        device_plugin_resource=device_plugin_resource,
        config_map=config_map or None,
        config_namespace=config_namespace,
        config_key=config_key,
        hami_core_dir=hami_core_dir,
        hami_core_library=hami_core_library or None,
        dra_plugins_dir=kubelet_plugins_dir or None,
        dra_registry_dir=kubelet_registry_dir,
        cdi_dir=cdi_dir,
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await run_agent(
            settings,
            source,
            kubeconfig=None if kubeconfig is None else str(kubeconfig),
            metrics_port=metrics_port,
            stop=stop,
        )

    asyncio.run(main())


@click.command("crds")
@click.option(
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("crds"),
    show_default=True,
    help="Folder to write the CRD manifests into; '-' prints them instead.",
)
def crds_command(output: Path) -> None:
    """Render the CustomResourceDefinitions from the models."""
    text = resources.render_crd_yaml()
    if str(output) == "-":
        click.echo(text, nl=False)
        return
    output.mkdir(parents=True, exist_ok=True)
    target = output / resources.CRD_FILE_NAME
    target.write_text(text)
    click.echo(str(target))
