"""Command-line options that several commands share (``run``, ``agent``, ``defrag plan``),
declared once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from vgpu_operator.cli_types import ConfigMapKey, KubeName, LogLevel, OwnerKind

_F = TypeVar("_F", bound=Callable[..., Any])

kubeconfig_option = click.option(
    "--kubeconfig",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    envvar="KUBECONFIG",
    default=None,
    help="Kubeconfig file; default: in-cluster service account, else ~/.kube/config.",
)


def logging_options(command: _F) -> _F:
    """``--log-format`` and ``--log-level``, as every long-running command takes them."""
    command = click.option("--log-level", type=LogLevel(), default="INFO", show_default=True)(
        command
    )
    return click.option(
        "--log-format",
        type=click.Choice(["auto", "json", "console"]),
        default="auto",
        show_default=True,
        help="auto: console on a terminal, JSON otherwise.",
    )(command)


def plan_options(prefix: str) -> Callable[[_F], _F]:
    """What bounds a defragmentation plan, as ``run`` (``prefix="defrag-"``) and
    ``defrag plan`` (``prefix=""``) take it: ``--{prefix}max-evictions``,
    ``--{prefix}allow-bare-pods`` and the repeatable ``--{prefix}owner-kind`` (its values
    as ``{prefix}owner_kinds``)."""

    def decorate(command: _F) -> _F:
        command = click.option(
            f"--{prefix}owner-kind",
            f"{prefix.replace('-', '_')}owner_kinds",
            type=OwnerKind(),
            multiple=True,
            help="Another controller kind whose pods may move (Kind or group/Kind); repeatable.",
        )(command)
        command = click.option(
            f"--{prefix}allow-bare-pods",
            is_flag=True,
            help="Move pods no controller recreates too (their owner must create them again).",
        )(command)
        return click.option(
            f"--{prefix}max-evictions",
            type=click.IntRange(min=1),
            default=3,
            show_default=True,
            help="The most pods one plan evicts.",
        )(command)

    return decorate


def device_config_options(command: _F) -> _F:
    """Where the device config is read: ``--namespace``, ``--config-map`` and
    ``--config-key`` (``run`` and ``defrag plan`` read the same ConfigMap)."""
    command = click.option(
        "--config-key",
        type=ConfigMapKey(),
        default="device-config.yaml",
        show_default=True,
        help="Key of the ConfigMap holding device-config.yaml.",
    )(command)
    command = click.option(
        "--config-map",
        type=KubeName("ConfigMap name"),
        default="vgpu-device-config",
        show_default=True,
        help="Name of the device-config ConfigMap.",
    )(command)
    return click.option(
        "--namespace",
        type=KubeName("namespace", label=True),
        default="vgpu-operator",
        show_default=True,
        help="Namespace of the device-config ConfigMap.",
    )(command)
