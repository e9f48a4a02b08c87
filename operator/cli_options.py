"""Command-line options that ``run`` and ``agent`` share, declared once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from vgpu_operator.cli_types import LogLevel

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
