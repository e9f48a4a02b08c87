"""The demo's tables: nodes and cards, placed pods, waiting and preempted ones."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vgpu_operator.demo.dra_claim import render_dra_claim
from vgpu_operator.demo.nodes import CardFacts
from vgpu_operator.demo.result import DemoResult
from vgpu_operator.devices import nvidia


def _short_model(model: str) -> str:
    return model.removeprefix(f"{nvidia.COMMON_WORD} ").removeprefix(f"{nvidia.COMMON_WORD}-")


def _short_uuid(uuid: str) -> str:
    """``GPU-6f3e1a52…0003`` (+ a MIG suffix): the part that tells cards apart."""
    card, bracket, suffix = uuid.partition("[")
    short = card if len(card) <= 18 else f"{card[:12]}…{card[-4:]}"
    return short + bracket + suffix


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        return "  ".join(cells).rstrip()

    return [line(header), *(line(row) for row in rows)]


def render_nodes(cards: Mapping[str, CardFacts]) -> list[str]:
    """One line per node: its cards by model, and the unhealthy ones."""
    by_node: dict[str, list[CardFacts]] = {}
    for card in cards.values():
        by_node.setdefault(card.node, []).append(card)
    lines = []
    for node, node_cards in by_node.items():
        models: dict[str, int] = {}
        for card in sorted(node_cards, key=lambda c: c.index):
            models[_short_model(card.model)] = models.get(_short_model(card.model), 0) + 1
        text = ", ".join(f"{n}x {model}" for model, n in models.items())
        unhealthy = [str(c.index) for c in node_cards if not c.healthy]
        mig = [str(c.index) for c in node_cards if c.mode == "mig"]
        extras = []
        if mig:
            extras.append(f"MIG mode: #{', #'.join(mig)}")
        if unhealthy:
            extras.append(f"unhealthy: #{', #'.join(unhealthy)}")
        suffix = f" ({'; '.join(extras)})" if extras else ""
        lines.append(f"  {node:<18} {text}{suffix}")
    return lines


def _memory_limits(envs: Mapping[str, str]) -> str:
    limits = [v for k, v in sorted(envs.items()) if k.startswith("CUDA_DEVICE_MEMORY_LIMIT_")]
    return ",".join(v.removesuffix("m") for v in limits) or "-"


def _render_containers(result: DemoResult) -> list[str]:
    """What each GPU container receives from its node's device plugin (HAMi-core's
    settings), as the kubelet stand-in got them."""
    if not result.containers and not result.unsettled:
        return []
    lines = ["", "What each container receives from its node's device plugin:"]
    rows: list[list[str]] = []
    for got in result.containers:
        if got.error is not None:
            rows.append([got.pod, got.container, f"refused: {got.error}", "", ""])
            continue
        rows.append(
            [
                got.pod,
                got.container,
                ",".join(
                    _short_uuid(u) for u in got.envs.get(nvidia.VISIBLE_DEVICES_ENV, "-").split(",")
                ),
                _memory_limits(got.envs),
                got.envs.get("CUDA_DEVICE_SM_LIMIT", "-"),
            ]
        )
    header = ["POD", "CONTAINER", nvidia.VISIBLE_DEVICES_ENV, "MEMORY LIMIT MiB", "SM LIMIT %"]
    lines += _table(header, rows, right={3, 4}) if rows else []
    if result.unsettled:
        lines.append(f"  still waiting for their device plugin: {', '.join(result.unsettled)}")
    return lines


def render_result(result: DemoResult) -> str:
    """The placement table, then each waiting pod and why it waits."""
    rows: list[list[str]] = []
    for pod in result.placed:
        label = f"{pod.namespace}/{pod.name}"
        if not pod.gpus:
            rows.append([label, pod.node, "-", "-", "-"])
        for i, grant in enumerate(pod.gpus):
            card = result.cards.get(grant.card_uuid)
            where = f"#{card.index} " if card is not None else ""
            model = f"  {_short_model(card.model)}" if card is not None else ""
            rows.append(
                [
                    label if i == 0 else "",
                    pod.node if i == 0 else "",
                    f"{where}{_short_uuid(grant.uuid)}{model}",
                    str(grant.memory_mib),
                    str(grant.cores),
                ]
            )
    header = ["POD", "NODE", "GPU", "MEMORY MiB", "CORES %"]
    lines = _table(header, rows, right={3, 4}) if rows else ["(no pod was bound)"]
    lines += _render_containers(result)
    if result.waiting:
        lines += ["", "Waiting:"]
        for waiting in result.waiting:
            lines.append(f"  {waiting.namespace}/{waiting.name}: {waiting.message}")
            details = waiting.event_message.removeprefix(waiting.message).strip()
            if details:
                lines.append(f"      {details}")
    if result.preempted:
        lines += ["", "Preempted:"]
        lines += [f"  {p.namespace}/{p.name}: {p.message}" for p in result.preempted]
    if result.undecided:
        lines += ["", "Not decided in time:", *(f"  {key}" for key in result.undecided)]
    if result.dra is not None:
        lines += ["", *render_dra_claim(result.dra)]
    return "\n".join(lines)
