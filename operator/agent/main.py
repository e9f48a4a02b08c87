"""The node agent's process: which path the node's cards take (the device plugin or the
DRA driver), and the loops that serve it, wired over one API client.

Every path runs the inventory loop (``inventory_loop.Agent``: read the machine, report
what changed, heartbeat, never give up) and follows the device-config ConfigMap; the
device-plugin path adds kubelet's device plugin and the container listing, the DRA path
the node's ResourceSlices, kubelet's DRA plugin and its health stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Final

import structlog

from vgpu_operator import dra_shapes, resources
from vgpu_operator.agent import config_watch, hamicore, mig, nodeconfig
from vgpu_operator.agent.backends import Backend
from vgpu_operator.agent.backoff import Backoff, wait_or_stop
from vgpu_operator.agent.containers import container_cards
from vgpu_operator.agent.deviceplugin.allocation import (
    CONTAINER_HOOK_DIR,
    HostPaths,
    MigDevices,
    NodeSettings,
)
from vgpu_operator.agent.deviceplugin.runner import PluginRunner
from vgpu_operator.agent.deviceplugin.server import GpuDevicePlugin, StaleRead, cards_of
from vgpu_operator.agent.dra import mig_prepare
from vgpu_operator.agent.dra import sysfs as dra_sysfs
from vgpu_operator.agent.dra.health_stream import HealthStream
from vgpu_operator.agent.dra.mig_prepare import MigMaker
from vgpu_operator.agent.dra.plugin import DraPlugin
from vgpu_operator.agent.dra.publisher import SlicePublisher
from vgpu_operator.agent.dra.runner import DraRunner
from vgpu_operator.agent.inventory_loop import Agent
from vgpu_operator.agent.metrics import AgentMetrics, Operation
from vgpu_operator.agent.settings import AgentSettings, describe_error, utc_now
from vgpu_operator.devices import dra
from vgpu_operator.kube import events as kube_events
from vgpu_operator.kube import resource_slices
from vgpu_operator.kube.agent_writer import KubeAgentWriter
from vgpu_operator.kube.client import api_client
from vgpu_operator.kube.node_labels import read_node_labels
from vgpu_operator.kube.pods import patch_pod_annotations, pods_on_node
from vgpu_operator.kube.requests import ApiClient, ApiError
from vgpu_operator.wire import Pod, ResourceClaim

log = structlog.get_logger(__name__)

#: Events the agent writes say they come from it, not from the scheduler.
AGENT_COMPONENT: Final = "vgpu-agent"


async def run_agent(
    settings: AgentSettings,
    backend: Backend,
    *,
    kubeconfig: str | None = None,
    metrics_port: int = 0,
    stop: asyncio.Event | None = None,
    metrics: AgentMetrics | None = None,
) -> None:
    """Connect to the API server and run the agent until ``stop`` is set."""
    agent_metrics = AgentMetrics() if metrics is None else metrics
    agent_metrics.serve(metrics_port)
    stop_event = asyncio.Event() if stop is None else stop
    async with api_client(kubeconfig) as api:
        path = await node_path(settings, api, stop_event)
        if path is None:
            return  # stopped before the node could be read
        log.info("gpu_path_chosen", node=settings.node_name, path=path)
        if path == dra.PATH_DRA:
            await run_dra_driver(settings, backend, api, agent_metrics, stop_event)
            return
        if settings.dra_plugins_dir is not None:
            # This node serves the device plugin: no card of it may be offered by both.
            await withdraw_slices(api, settings.node_name)
        if settings.device_plugin_dir is None:
            agent = Agent(settings, backend, KubeAgentWriter(api), metrics=agent_metrics)
            await asyncio.gather(
                agent.run(stop_event), follow_config(settings, api, agent, stop_event)
            )
            return
        await install_hami_core(settings)
        # MIG entries: the geometry tables of the config in force when Allocate runs.
        instances = mig.MigInstances(
            backend.nvml_module, lambda card_type: agent.node_config.geometries_for(card_type)
        )
        plugin = device_plugin(settings, api, instances)
        agent = Agent(
            settings,
            backend,
            KubeAgentWriter(api),
            metrics=agent_metrics,
            on_status=lambda status: plugin.set_cards(cards_of(status)),
        )
        agent.on_config = lambda config: plugin.apply_config(
            config.registration.memory_scaling, config.core_policy, config.schedulers
        )
        runner = PluginRunner(plugin, Path(settings.device_plugin_dir))
        await asyncio.gather(
            agent.run(stop_event),
            runner.run(stop_event),
            follow_config(settings, api, agent, stop_event),
            follow_containers(settings, api, agent_metrics, stop_event),
        )


async def install_hami_core(settings: AgentSettings) -> None:
    """HAMi-core's library from the image into its host directory (both paths use it)."""
    if settings.hami_core_library is not None:
        await asyncio.to_thread(
            hamicore.install,
            Path(settings.hami_core_library),
            Path(settings.hami_core_dir),
            CONTAINER_HOOK_DIR,
        )


async def node_path(settings: AgentSettings, api: ApiClient, stop: asyncio.Event) -> str | None:
    """Which path this node's cards are offered by: its label's, or the device plugin
    (None when ``stop`` is set before the Node could be read). DRA needs the driver's
    directories (``--kubelet-plugins-dir``); without them a node labelled for DRA is served
    by the device plugin, and the log says so."""
    backoff = Backoff(settings.backoff_initial_s, settings.backoff_max_s)
    while True:
        try:
            labels = await read_node_labels(api, settings.node_name)
            break
        except Exception as exc:
            delay = backoff.next_delay_s()
            log.warning(
                "node_read_failed",
                node=settings.node_name,
                error=describe_error(exc),
                retry_in_s=round(delay, 3),
            )
            await wait_or_stop(stop, delay)
            if stop.is_set():
                return None
    wanted = labels.get(dra.NODE_PATH_LABEL, dra.PATH_DEVICE_PLUGIN)
    if wanted not in dra.PATHS:
        log.error(
            "gpu_path_unknown",
            node=settings.node_name,
            label=dra.NODE_PATH_LABEL,
            value=wanted,
            detail=f"expected one of {', '.join(dra.PATHS)}; the device plugin serves",
        )
        return dra.PATH_DEVICE_PLUGIN
    if wanted == dra.PATH_DRA and settings.dra_plugins_dir is None:
        log.error(
            "gpu_path_dra_unavailable",
            node=settings.node_name,
            detail="the node is labelled for DRA but the agent has no --kubelet-plugins-dir",
        )
        return dra.PATH_DEVICE_PLUGIN
    return wanted


async def withdraw_slices(api: ApiClient, node: str) -> None:
    """Delete this driver's slices of ``node`` (a node moved back to the device plugin).
    Best effort: a cluster without DRA (or without agent-dra.yaml) has none to delete."""
    try:
        for found in await resource_slices.list_slices(api, dra.DRIVER, node):
            await resource_slices.delete_slice(api, str(found["metadata"]["name"]))
            log.info("resource_slice_withdrawn", node=node, name=found["metadata"]["name"])
    except Exception as exc:
        log.warning("resource_slices_not_withdrawn", node=node, error=describe_error(exc))


def _request_defaults(config: nodeconfig.NodeConfig) -> dra_shapes.RequestDefaults:
    return dra_shapes.RequestDefaults(
        memory_mib=config.default_memory_mib, cores=config.default_cores
    )


async def run_dra_driver(
    settings: AgentSettings,
    backend: Backend,
    api: ApiClient,
    metrics: AgentMetrics,
    stop: asyncio.Event,
) -> None:
    """The node on the DRA path: the inventory as always, the cards as this node's
    ResourceSlice pool, and kubelet's DRA plugin preparing claims with HAMi-core's limits."""
    assert settings.dra_plugins_dir is not None
    await install_hami_core(settings)
    node = settings.node_name
    real_sysfs = backend.description == "nvml"
    publisher = SlicePublisher(
        node,
        resource_slices.ApiSliceStore(api),
        _request_defaults(nodeconfig.from_flags(settings.registration)),
        pcie_root=dra_sysfs.pcie_root if real_sysfs else (lambda bus_id: None),
        backoff_initial_s=settings.backoff_initial_s,
        backoff_max_s=settings.backoff_max_s,
        # Read back as often as the Lease is renewed (kubelet wipes slices when it starts).
        check_interval_s=settings.heartbeat_interval_s,
        # MIG instances the claims' CDI specs record are the driver's; the others on a
        # card (made before the agent started, or by someone else) leave its counters.
        own_instances=lambda: mig_prepare.recorded_instances(Path(settings.cdi_dir)),
    )

    async def claim(namespace: str, name: str) -> ResourceClaim | None:
        return await resource_slices.get_claim(api, namespace, name)

    plugin = DraPlugin(
        node,
        publisher.cards,
        claim,
        NodeSettings(
            device_memory_scaling=settings.registration.memory_scaling,
            host=HostPaths(hook_dir=settings.hami_core_dir),
        ),
        Path(settings.cdi_dir),
        mig=(publisher.mig_placements, MigMaker(backend.nvml_module)),
    )
    agent = Agent(settings, backend, KubeAgentWriter(api), metrics=metrics)
    # kubelet's health stream reports the cards as published, resent every heartbeat.
    health = HealthStream(node, publisher.cards, resend_s=settings.heartbeat_interval_s)

    def on_status(status: resources.DeviceInventoryStatus) -> None:
        publisher.set_status(status)
        health.changed()

    agent.on_status = on_status
    plugin.on_mig_prepared = publisher.refresh
    plugin.on_mig_unprepared = agent.poll_now

    def on_config(config: nodeconfig.NodeConfig) -> None:
        publisher.set_defaults(_request_defaults(config))
        plugin.settings = replace(
            plugin.settings,
            device_memory_scaling=config.registration.memory_scaling,
            core_policy=config.core_policy,
        )

    agent.on_config = on_config
    runner = DraRunner(
        plugin, Path(settings.dra_plugins_dir), Path(settings.dra_registry_dir), health=health
    )
    await asyncio.gather(
        agent.run(stop),
        publisher.run(stop),
        runner.run(stop),
        follow_config(settings, api, agent, stop),
    )


async def follow_config(
    settings: AgentSettings, api: ApiClient, agent: Agent, stop: asyncio.Event
) -> None:
    """Follow the device-config ConfigMap (if one is named) until ``stop``."""
    if settings.config_map is None:
        return
    follower = config_watch.ConfigFollower(
        settings.node_name, settings.config_key, settings.registration, agent.apply_config
    )
    await config_watch.follow(
        api,
        follower,
        settings.config_namespace,
        settings.config_map,
        stop,
        backoff_initial_s=settings.backoff_initial_s,
        backoff_max_s=settings.backoff_max_s,
    )


async def follow_containers(
    settings: AgentSettings, api: ApiClient, metrics: AgentMetrics, stop: asyncio.Event
) -> None:
    """Keep the container info series (which container holds which card) current: the
    node's pods are listed once per heartbeat interval, until ``stop``. A failed listing
    keeps the last rows (they are more likely right than none)."""
    node = settings.node_name
    while not stop.is_set():
        try:
            pods = await pods_on_node(api, node)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            metrics.report_failed(Operation.CONTAINERS)
            log.warning("container_listing_failed", node=node, error=describe_error(exc))
        else:
            metrics.containers(node, container_cards(pods, node))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), settings.heartbeat_interval_s)


def device_plugin(
    settings: AgentSettings, api: ApiClient, mig_devices: MigDevices | None = None
) -> GpuDevicePlugin:
    """The kubelet device plugin of this node, reading and settling pods through ``api``."""
    node = settings.node_name

    async def pods() -> list[Pod]:
        return await pods_on_node(api, node)

    async def patch(pod: Pod, annotations: Mapping[str, str]) -> None:
        try:
            await patch_pod_annotations(api, pod, annotations)
        except ApiError as exc:
            if exc.status == 409:
                raise StaleRead(str(exc)) from exc
            raise

    events = kube_events.EventAggregator(component=AGENT_COMPONENT)

    async def report(pod: Pod, reason: str, message: str) -> None:
        ref = kube_events.ObjectRef.of(pod, "Pod")
        await kube_events.write_event(api, events.record(ref, reason, message, utc_now()))

    node_settings = NodeSettings(
        device_memory_scaling=settings.registration.memory_scaling,
        host=HostPaths(hook_dir=settings.hami_core_dir),
    )
    return GpuDevicePlugin(
        node, settings.device_plugin_resource, [], pods, patch, node_settings, report, mig_devices
    )
