"""``vgpu-operator simulate``: a scenario file through the engine, decisions as JSON.

The scenario format is defined in ``docs/scenario-format.md``: nodes (with
``devices`` or HAMi's annotations), pods (running ones hold devices; pending ones are
admitted, then placed one after the other, preempting lower-priority running pods when
they fit nowhere), ResourceQuotas, PodDisruptionBudgets, ``defrag`` (plans for the pods
left waiting because their room is scattered over cards), and ``expect`` (checked by
``check`` only, never by the simulation itself).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from vgpu_operator import simulation_dra, simulation_gangs, simulation_replay
from vgpu_operator.devices import codec, mig_allocations
from vgpu_operator.devices.catalog import load_config
from vgpu_operator.devices.mig_allocations import MigAllocation
from vgpu_operator.errors import CodecError, ConfigError, ScenarioError
from vgpu_operator.scheduling.cycle.cluster import ClusterState, Decision
from vgpu_operator.scheduling.defrag import defrag
from vgpu_operator.wire import Pod

#: The ``defrag`` section's keys and the options they set.
_DEFRAG_METHODS = ("auto", "exact", "heuristic")

#: Bounds on what a scenario file may hold, far above any real cluster's description
#: (a Kubernetes object nests about a dozen levels; a 1,000-node cluster with its pods is
#: a few hundred thousand values). Deeper input exhausted Python's recursion in the YAML
#: reader or later in the engine, and the command died with a traceback.
MAX_SCENARIO_BYTES: Final = 64 * 1024 * 1024
MAX_NESTING: Final = 64
MAX_VALUES: Final = 5_000_000


def read_scenario(path: Path) -> dict[str, Any]:
    """A scenario file, read within the bounds above and parsed (``parse_scenario``)."""
    try:
        size = path.stat().st_size
        if size > MAX_SCENARIO_BYTES:
            raise ScenarioError(
                "<file>", f"is {size} bytes; a scenario may be at most {MAX_SCENARIO_BYTES}"
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise ScenarioError("<file>", f"cannot be read: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError("<file>", f"is not UTF-8 text (byte {exc.start})") from exc
    return parse_scenario(text)


class _YamlReadsOtherwise(ValueError):
    """A JSON number that YAML 1.1 (PyYAML) would read as something else."""


_NOT_JSON: Final = object()


def _yaml_float(literal: str) -> float:
    # PyYAML's floats need a dot and a signed exponent: it reads ``1e3`` or ``1.5e3``
    # as strings, and the scenario must mean the same whichever parser reads it.
    mantissa, _, exponent = literal.lower().partition("e")
    if "." not in mantissa or (exponent and exponent[0] not in "+-"):
        raise _YamlReadsOtherwise(literal)
    return float(literal)


def _refuse_constant(literal: str) -> Any:
    raise _YamlReadsOtherwise(literal)  # NaN, Infinity: strings to YAML


def _as_json(text: str) -> Any:
    """The text read as JSON, the same values YAML gives (a JSON scenario of 10,000 pods
    took PyYAML 20 s); ``_NOT_JSON`` for YAML or anything JSON and YAML may read apart."""
    try:
        return json.loads(text, parse_float=_yaml_float, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return _NOT_JSON


def parse_scenario(text: str) -> dict[str, Any]:
    """JSON or YAML text to a scenario mapping; structural errors name the field."""
    if len(text) > MAX_SCENARIO_BYTES:
        raise ScenarioError("<file>", f"a scenario may be at most {MAX_SCENARIO_BYTES} characters")
    try:
        data = _as_json(text)
        if data is _NOT_JSON:
            data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError("<file>", f"neither JSON nor YAML: {exc}") from exc
    except RecursionError:
        raise ScenarioError("<file>", f"nested deeper than {MAX_NESTING} levels") from None
    except ValueError as exc:  # an integer of more than 4,300 digits, for instance
        raise ScenarioError("<file>", f"holds a value that cannot be read: {exc}") from None
    _check_bounds(data)
    if not isinstance(data, dict):
        raise ScenarioError("<file>", "a scenario must be a mapping")
    for key in ("nodes", "pods", "resourceQuotas", "podDisruptionBudgets", "expect"):
        if key in data and not isinstance(data[key], list):
            raise ScenarioError(key, "must be a list")
    if "config" in data and not isinstance(data["config"], dict | type(None)):
        raise ScenarioError("config", "must be a mapping")
    simulation_gangs.check(data)
    if "defrag" in data:
        defrag_options(data)  # refuses a malformed section here, naming the field
    for position, node in enumerate(data.get("nodes") or []):
        where = f"nodes[{position}]"
        name = _require_name(node, where)
        if "devices" in node and not isinstance(node["devices"], list):
            raise ScenarioError(f"{where}.devices", f"node {name}: must be a list")
        if "pairScores" in node and not isinstance(node["pairScores"], list):
            raise ScenarioError(f"{where}.pairScores", f"node {name}: must be a list")
    for position, pod in enumerate(data.get("pods") or []):
        where = f"pods[{position}]"
        _require_name(pod, where)
        spec = pod.get("spec")
        if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list):
            raise ScenarioError(f"{where}.spec.containers", "a pod needs a list of containers")
        for c_pos, container in enumerate(spec["containers"]):
            if not isinstance(container, dict):
                raise ScenarioError(f"{where}.spec.containers[{c_pos}]", "must be a mapping")
    for position, quota in enumerate(data.get("resourceQuotas") or []):
        _require_name(quota, f"resourceQuotas[{position}]")
    for position, pdb in enumerate(data.get("podDisruptionBudgets") or []):
        _require_name(pdb, f"podDisruptionBudgets[{position}]")
    return data


def _check_bounds(data: Any) -> None:
    """Refuse nesting deeper than ``MAX_NESTING``, more than ``MAX_VALUES`` values (YAML
    aliases counted as often as they are used: the engine copies what they stand for)
    and a structure that contains itself. Iterative: the check must not recurse into what
    it checks."""
    measured: dict[int, tuple[int, int]] = {}  # id -> (height, values), once finished
    open_ids: set[int] = set()  # the containers on the current path
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        item, finished = stack.pop()
        if not isinstance(item, dict | list):
            continue
        key = id(item)
        children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
        if finished:
            height, values = 1, 1
            for child in children:
                child_height, child_values = measured.get(id(child), (0, 1))
                height = max(height, child_height + 1)
                values += child_values
            if height > MAX_NESTING:
                raise ScenarioError("<file>", f"nested deeper than {MAX_NESTING} levels")
            if values > MAX_VALUES:
                raise ScenarioError(
                    "<file>", f"holds more than {MAX_VALUES} values (YAML aliases counted out)"
                )
            measured[key] = (height, values)
            open_ids.discard(key)
            continue
        if key in measured:
            continue
        if key in open_ids:
            raise ScenarioError("<file>", "contains itself (a YAML alias inside its anchor)")
        open_ids.add(key)
        stack.append((item, True))
        stack.extend((child, False) for child in children if id(child) not in measured)


def _require_name(obj: Any, where: str) -> str:
    if not isinstance(obj, dict):
        raise ScenarioError(where, "must be a mapping")
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise ScenarioError(f"{where}.metadata.name", "is required")
    for key in ("labels", "annotations"):
        if key in meta and not isinstance(meta[key], dict | type(None)):
            raise ScenarioError(f"{where}.metadata.{key}", "must be a mapping")
    return str(meta["name"])


def build_state(scenario: Mapping[str, Any], use_index: bool = True) -> ClusterState:
    """The cluster of a scenario, with running pods holding their devices."""
    try:
        config = load_config(scenario.get("config") or {})
    except ConfigError as exc:
        raise ScenarioError(f"config.{exc.field}", exc.message) from exc
    state = ClusterState(config)
    state.use_index = use_index
    state.preemption_enabled = True
    for position, node in enumerate(scenario.get("nodes") or []):
        state.set_node(node)
        name = node["metadata"]["name"]
        where = f"nodes[{position}]"
        error = state.register_errors().get(name)
        if error is not None and "devices" not in node:
            raise ScenarioError(f"{where}.metadata.annotations", error)
        if "devices" in node:
            try:
                devices = codec.decode_node_devices(json.dumps(node["devices"]), f"{where}.devices")
                scores = codec.decode_pair_scores(
                    json.dumps(node.get("pairScores") or []), f"{where}.pairScores"
                )
            except CodecError as exc:
                raise ScenarioError(exc.field, exc.message) from exc
            state.set_inventory(name, devices, scores, heartbeat=None)
    for position, quota in enumerate(scenario.get("resourceQuotas") or []):
        try:
            state.set_quota(quota)
        except CodecError as exc:
            raise ScenarioError(f"resourceQuotas[{position}].{exc.field}", exc.message) from exc
    for pdb in scenario.get("podDisruptionBudgets") or []:
        state.set_budget(pdb)
    simulation_dra.load(scenario, state)
    simulation_gangs.load(scenario, state)
    for pod in scenario.get("pods") or []:
        if (pod.get("spec") or {}).get("nodeName"):
            state.set_pod(_placed_by(pod, config.scheduler.scheduler_name))
    return state


def _placed_by(pod: Pod, scheduler: str) -> Pod:
    """A running pod of a scenario was placed by the scheduler under test unless it names
    another (the books believe only the allocations of schedulers they trust)."""
    spec = pod.get("spec") or {}
    if spec.get("schedulerName"):
        return pod
    return {**pod, "spec": {**spec, "schedulerName": scheduler}}


def simulate(
    scenario: Mapping[str, Any], now: float = 0.0, use_index: bool = True, scores: bool = True
) -> dict[str, Any]:
    """Place the scenario's pending pods in order (``simulation_replay.Replay``, the one
    path: ``simulation_stream.write`` writes the same document as it goes); return
    ``{"decisions": [...]}`` with ``podGroups``, ``defrag`` and ``warnings`` where there
    are any."""
    state = build_state(scenario, use_index)
    replay = simulation_replay.Replay(scenario, state, now, scores)
    decisions = [rendered(item) for item in replay]
    out: dict[str, Any] = {"decisions": decisions}
    if replay.groups:
        out["podGroups"] = replay.groups
    if "defrag" in scenario:
        out["defrag"] = _defragment(scenario, state, decisions, now)
    warnings = state.node_layer_problems()
    if warnings:
        # Node annotations that could not be read and were ignored (the operator reports
        # them as Events on the Node).
        out["warnings"] = {node: list(problems) for node, problems in sorted(warnings.items())}
    return out


def defrag_options(scenario: Mapping[str, Any]) -> tuple[defrag.PlanOptions, bool | None]:
    """The ``defrag`` section as planner options and method (None: by cluster size)."""
    section = scenario.get("defrag")
    if section is True or section is None:
        section = {}
    if not isinstance(section, Mapping):
        raise ScenarioError("defrag", "must be a mapping (or true)")
    unknown = set(section) - {"maxEvictions", "allowBarePods", "ownerKinds", "method"}
    if unknown:
        raise ScenarioError(f"defrag.{sorted(unknown)[0]}", "unknown key")
    limit = section.get("maxEvictions", defrag.PlanOptions().max_evictions)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ScenarioError("defrag.maxEvictions", "must be a whole number of at least 1")
    bare = section.get("allowBarePods", False)
    if not isinstance(bare, bool):
        raise ScenarioError("defrag.allowBarePods", "must be true or false")
    kinds = section.get("ownerKinds", [])
    if not isinstance(kinds, list) or not all(isinstance(k, str) and k for k in kinds):
        raise ScenarioError("defrag.ownerKinds", "must be a list of kinds (kind or group/kind)")
    method = section.get("method", "auto")
    if method not in _DEFRAG_METHODS:
        raise ScenarioError("defrag.method", f"must be one of {', '.join(_DEFRAG_METHODS)}")
    options = defrag.PlanOptions(
        max_evictions=limit, allow_bare_pods=bare, owner_kinds=frozenset(kinds)
    )
    return options, None if method == "auto" else method == "exact"


def _defragment(
    scenario: Mapping[str, Any],
    state: ClusterState,
    decisions: list[dict[str, Any]],
    now: float,
) -> dict[str, Any]:
    """Plans for the pods left waiting (those the decisions did not place), as the
    operator would make them with every decision above carried out."""
    options, exact = defrag_options(scenario)
    placed = {d["pod"] for d in decisions if d["scheduled"]}
    pods = list(scenario.get("pods") or [])
    waiting = [
        p for p in pods if not (p.get("spec") or {}).get("nodeName") and _key(p) not in placed
    ]
    # The running pods as the books read them (placed by the scheduler under test unless
    # they name another): a plan moves only pods this scheduler placed.
    ours = state.config.scheduler.scheduler_name
    running = [_placed_by(p, ours) for p in pods if (p.get("spec") or {}).get("nodeName")]
    report = defrag.plan(state, waiting, running, now, options, exact=exact)
    return {
        "plans": [p.to_json() for p in report.plans],
        "fragmented": list(report.fragmented),
        "unplanned": dict(report.unplanned),
        **({"groupsLeft": dict(report.groups_left)} if report.groups_left else {}),
    }


#: The plans for the pods left waiting, for the streamed simulate (``simulation_stream``).
defragment = _defragment


def _key(pod: Pod) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"


def rendered(item: simulation_replay.Replayed, reasons: bool = True) -> dict[str, Any]:
    """One replayed pod's decision as ``simulate`` prints it (``render``), with the
    PodGroup it was decided with."""
    out = render(item.decision, item.pod, reasons)
    if item.group is not None:
        out["podGroup"] = item.group
    return out


def render(decision: Decision, pod: Pod, reasons: bool = True) -> dict[str, Any]:
    """The decision as ``simulate`` prints it; ``reasons=False`` leaves ``reasons`` empty
    for a caller that writes them itself (``simulation_stream``: from text kept per node)."""
    spec = pod.get("spec") or {}
    n_containers = len(spec.get("initContainers") or []) + len(spec.get("containers") or [])
    containers: list[list[dict[str, Any]]] = [[] for _ in range(n_containers)]
    instances = _mig_instances(decision.annotations)
    for vendor_word, single in decision.devices.items():
        scores = decision.card_scores.get(vendor_word, ())
        for position, devices in enumerate(single[:n_containers]):
            container_scores = scores[position] if position < len(scores) else ()
            for at, d in enumerate(devices):
                card, instance = codec.split_mig_uuid(d.uuid)
                entry: dict[str, Any] = {
                    "uuid": card,
                    "type": d.vendor,
                    "usedmem": d.memory_mib,
                    "usedcores": d.cores,
                }
                if instance is not None:
                    entry["instance"] = d.uuid  # the MIG instance, as the annotation names it
                record = instances.get((position, at))
                if record is not None and record.gpu_uuid == card:
                    entry["profile"] = record.profile
                    entry["placement"] = {"start": record.start, "size": record.size}
                if at < len(container_scores):
                    entry["score"] = as_float32(container_scores[at])
                containers[position].append(entry)
    placed = decision.scheduled or bool(decision.victims)
    out: dict[str, Any] = {
        "pod": decision.pod,
        "scheduled": placed,
        "node": decision.node if decision.scheduled else decision.nominated_node,
        "containers": containers if placed else [],
        "annotations": dict(decision.annotations),
        "reasons": decision.diagnosis.to_json() if decision.diagnosis and reasons else {},
        "scores": {node: as_float32(score) for node, score in decision.node_scores.items()},
    }
    if decision.diagnosis is not None:
        out["message"] = decision.diagnosis.message()
    if decision.rejected is not None:
        out["rejected"] = decision.rejected
    if decision.preemption_blocked is not None:
        out["preemptionBlocked"] = decision.preemption_blocked
    if decision.claim_writes:
        out["claims"] = simulation_dra.render_claims(decision)
    if decision.victims:
        out["victims"] = list(decision.victims)
        out["reasons"] = {}
        out.pop("message", None)
    return out


def _mig_instances(annotations: Mapping[str, str]) -> dict[tuple[int, int], MigAllocation]:
    """The decision's MIG instances (HAMi v2.10's record) by container and device."""
    try:
        records = mig_allocations.decode(annotations.get(mig_allocations.FIELD, ""))
    except CodecError:
        return {}
    return {(r.container_index, r.device_index): r for r in records}


def as_float32(value: float) -> float:
    """A score as HAMi holds it (a Go float32) and prints it: the shortest decimal that
    reads back as the same float32 (10 * (0.1 + 0.1 + 0.1) is 3, not 3.0000000000000004)."""
    try:
        single = _float32(value)
    except OverflowError:  # beyond float32 (huge scoring weights): shown as it is
        return value
    for digits in range(1, 10):
        text = f"{single:.{digits}g}"
        if _float32(float(text)) == single:
            return float(text)
    return single


def _float32(value: float) -> float:
    result: float = struct.unpack("f", struct.pack("f", value))[0]
    return result


def check(scenario: Mapping[str, Any], output: Mapping[str, Any]) -> list[str]:
    """Differences between a scenario's ``expect`` and a simulation's output."""
    by_pod = {d["pod"]: d for d in output.get("decisions", [])}
    plans = {p["pod"]: p for p in (output.get("defrag") or {}).get("plans", [])}
    problems: list[str] = []
    for expected in scenario.get("expect") or []:
        key = expected.get("pod", "")
        got = by_pod.get(key)
        if got is None:
            problems.append(f"{key}: no decision")
            continue
        problems.extend(_compare(key, expected, got))
        if "plan" in expected:
            problems.extend(_compare_plan(key, expected["plan"], plans.get(key)))
    return problems


def _compare_plan(key: str, expected: Any, got: Mapping[str, Any] | None) -> list[str]:
    """``plan``: null (no plan), or any of ``evictions``, ``moved`` (the pods, in
    order), ``node`` (where the waiting pod goes) and ``to`` (per moved pod, its node)."""
    if expected is None:
        return [] if got is None else [f"{key}: a plan {got['moves']} (expected none)"]
    if got is None:
        return [f"{key}: no plan (expected {expected})"]
    problems = []
    moved = [m["pod"] for m in got["moves"]]
    if "evictions" in expected and expected["evictions"] != got["evictions"]:
        problems.append(f"{key}: {got['evictions']} evictions (expected {expected['evictions']})")
    if "moved" in expected and list(expected["moved"]) != moved:
        problems.append(f"{key}: moves {moved} (expected {expected['moved']})")
    if "node" in expected and expected["node"] != got["node"]:
        problems.append(f"{key}: plan for node {got['node']} (expected {expected['node']})")
    if "to" in expected:
        landed = {m["pod"]: m["to"]["node"] for m in got["moves"]}
        if dict(expected["to"]) != landed:
            problems.append(f"{key}: replacements go to {landed} (expected {expected['to']})")
    return problems


def _compare(key: str, expected: Mapping[str, Any], got: Mapping[str, Any]) -> list[str]:
    problems = []
    if "scheduled" in expected and bool(expected["scheduled"]) != got["scheduled"]:
        problems.append(
            f"{key}: scheduled={got['scheduled']} (expected {expected['scheduled']}); "
            f"reasons={got.get('reasons')} rejected={got.get('rejected')}"
        )
    if "node" in expected and expected["node"] != got["node"]:
        problems.append(f"{key}: node={got['node']} (expected {expected['node']})")
    if "node_in" in expected and got["node"] not in expected["node_in"]:
        problems.append(f"{key}: node={got['node']} (expected one of {expected['node_in']})")
    if "devices" in expected:
        want = [sorted(c) for c in expected["devices"]]
        have = [sorted({d["uuid"] for d in c}) for c in got["containers"]]
        if [sorted(set(c)) for c in want] != have[: len(want)]:
            problems.append(f"{key}: devices={have} (expected {want})")
    problems.extend(simulation_dra.check_claims(key, expected, got))
    if "victims" in expected and sorted(expected["victims"]) != sorted(got.get("victims", [])):
        problems.append(f"{key}: victims={got.get('victims', [])} (expected {expected['victims']})")
    if "preemptionBlocked" in expected and str(expected["preemptionBlocked"]) not in str(
        got.get("preemptionBlocked", "")
    ):
        problems.append(
            f"{key}: preemptionBlocked={got.get('preemptionBlocked')!r} "
            f"(expected it to contain {expected['preemptionBlocked']!r})"
        )
    if "reason" in expected:
        seen = {r.lower() for reasons in got["reasons"].values() for r in reasons}
        if str(expected["reason"]).lower() not in seen:
            problems.append(f"{key}: reason {expected['reason']} not in {got['reasons']}")
    if "scores" in expected:
        want_scores, have_scores = dict(expected["scores"]), got.get("scores") or {}
        if want_scores.keys() != have_scores.keys() or not all(
            _close(want_scores[n], have_scores[n]) for n in want_scores
        ):
            problems.append(f"{key}: scores={have_scores} (expected {want_scores})")
    if "cardScores" in expected:
        want_cards = [[(d["uuid"], d["score"]) for d in c] for c in expected["cardScores"]]
        have_cards = [[(d["uuid"], d.get("score")) for d in c] for c in got["containers"]]
        if len(want_cards) != len(have_cards) or not all(
            len(w) == len(h)
            and all(
                wu == hu and hs is not None and _close(ws, hs)
                for (wu, ws), (hu, hs) in zip(w, h, strict=True)
            )
            for w, h in zip(want_cards, have_cards, strict=True)
        ):
            problems.append(f"{key}: card scores={have_cards} (expected {want_cards})")
    return problems


def _close(want: Any, have: Any) -> bool:
    """Scores agree to float32 precision (HAMi computes them in float32)."""
    return math.isclose(float(want), float(have), rel_tol=1e-6, abs_tol=1e-6)
