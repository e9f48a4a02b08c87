"""Which path a node's cards are offered by: the node's label, or the device plugin."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from vgpu_operator.agent import main
from vgpu_operator.agent.settings import AgentSettings
from vgpu_operator.devices import dra


def path_for(
    monkeypatch: pytest.MonkeyPatch, labels: dict[str, str] | Exception, **settings: Any
) -> str | None:
    async def read(api: object, node: str) -> dict[str, str]:
        if isinstance(labels, Exception):
            raise labels
        return labels

    monkeypatch.setattr(main, "read_node_labels", read)
    values: dict[str, Any] = {"node_name": "n", "backoff_initial_s": 0.01, "backoff_max_s": 0.01}
    values.update(settings)

    async def run() -> str | None:
        stop = asyncio.Event()
        if isinstance(labels, Exception):
            asyncio.get_running_loop().call_later(0.05, stop.set)
        return await main.node_path(AgentSettings(**values), object(), stop)  # type: ignore[arg-type]

    return asyncio.run(run())


@pytest.mark.parametrize(
    ("labels", "plugins_dir", "expected"),
    [
        ({}, "/var/lib/kubelet/plugins", dra.PATH_DEVICE_PLUGIN),
        ({dra.NODE_PATH_LABEL: "dra"}, "/var/lib/kubelet/plugins", dra.PATH_DRA),
        (
            {dra.NODE_PATH_LABEL: "device-plugin"},
            "/var/lib/kubelet/plugins",
            dra.PATH_DEVICE_PLUGIN,
        ),
        # Labelled for DRA, but the agent was given no DRA directories: the device plugin.
        ({dra.NODE_PATH_LABEL: "dra"}, None, dra.PATH_DEVICE_PLUGIN),
        # A value it does not know is not read as DRA.
        ({dra.NODE_PATH_LABEL: "DRA please"}, "/var/lib/kubelet/plugins", dra.PATH_DEVICE_PLUGIN),
    ],
)
def test_the_label_chooses_one_path(
    monkeypatch: pytest.MonkeyPatch,
    labels: dict[str, str],
    plugins_dir: str | None,
    expected: str,
) -> None:
    assert path_for(monkeypatch, labels, dra_plugins_dir=plugins_dir) == expected


def test_an_unreadable_node_is_retried_until_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    assert path_for(monkeypatch, OSError("API server down")) is None
