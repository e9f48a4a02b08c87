"""`vgpu-operator simulate` from the command line: output, exit status, malformed input.

FORMAT.md: decisions are printed as JSON and the exit status is 0 whether or not pods
fit; ``--check`` exits 1 when an ``expect`` entry is not met; a malformed scenario exits
non-zero with a message that names the bad field.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import pytest
from click.testing import CliRunner, Result

from vgpu_operator import simulation
from vgpu_operator.cli import main

NOW = "1700000000"
DATA = Path(__file__).resolve().parent / "data"
Scenario = dict[str, Any]


#: node-a's one card, as a scenario (and HAMi's register annotation) lists it.
_CARD: Final = {
    "id": "GPU-a0",
    "index": 0,
    "count": 10,
    "devmem": 10240,
    "devcore": 100,
    "type": "NVIDIA A10",
    "numa": 0,
    "health": True,
    "mode": "hami-core",
}


def _base() -> Scenario:
    """One 10240 MiB card, a 4096 MiB pod that fits and a 20000 MiB pod that does not."""
    return {
        "name": "cli base",
        "config": {"nvidia": {"memoryFactor": 1}, "scheduler": {"nodeSchedulerPolicy": "binpack"}},
        "nodes": [
            {
                "metadata": {"name": "node-a", "annotations": {}},
                "devices": [dict(_CARD)],
            }
        ],
        "pods": [
            _pod("fits", 4096),
            _pod("too-big", 20000),
        ],
        "expect": [
            {"pod": "default/fits", "scheduled": True, "node": "node-a", "devices": [["GPU-a0"]]},
            {"pod": "default/too-big", "scheduled": False, "reason": "CardInsufficientMemory"},
        ],
    }


def _pod(name: str, memory_mib: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": memory_mib, "nvidia.com/gpucores": 10}
    return {
        "metadata": {"namespace": "default", "name": name, "annotations": {}},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }


def _run(tmp_path: Path, scenario: Scenario | str, *options: str) -> Result:
    path = tmp_path / "scenario.json"
    path.write_text(scenario if isinstance(scenario, str) else json.dumps(scenario))
    return CliRunner().invoke(main, ["simulate", str(path), "--now", NOW, *options])


def _decisions(result: Result) -> dict[str, Any]:
    return {d["pod"]: d for d in json.loads(result.stdout)["decisions"]}


def test_fitting_and_unfitting_pods_print_json_and_exit_zero(tmp_path: Path) -> None:
    result = _run(tmp_path, _base())

    assert result.exit_code == 0, result.output
    decisions = _decisions(result)
    assert decisions["default/fits"]["scheduled"] is True
    assert decisions["default/fits"]["node"] == "node-a"
    assert decisions["default/fits"]["annotations"]["hami.io/vgpu-node"] == "node-a"
    assert decisions["default/fits"]["annotations"]["hami.io/vgpu-time"] == NOW
    assert decisions["default/too-big"]["scheduled"] is False
    assert decisions["default/too-big"]["node"] is None
    assert decisions["default/too-big"]["reasons"] == {"node-a": {"CardInsufficientMemory": 1}}


def test_only_unfitting_pods_still_exit_zero(tmp_path: Path) -> None:
    scenario = _base()
    scenario["pods"] = [_pod("too-big", 20000)]
    scenario["expect"] = []

    result = _run(tmp_path, scenario)

    assert result.exit_code == 0, result.output
    assert _decisions(result)["default/too-big"]["scheduled"] is False


def test_check_with_met_expectations_exits_zero(tmp_path: Path) -> None:
    result = _run(tmp_path, _base(), "--check")

    assert result.exit_code == 0, result.output
    assert "expectation not met" not in result.output


@pytest.mark.parametrize(
    ("expect", "mentions"),
    [
        pytest.param({"pod": "default/fits", "scheduled": False}, "default/fits", id="scheduled"),
        pytest.param(
            {"pod": "default/fits", "scheduled": True, "node": "node-z"}, "node-z", id="node"
        ),
        pytest.param(
            {"pod": "default/fits", "scheduled": True, "node_in": ["node-y", "node-z"]},
            "node-y",
            id="node-in",
        ),
        pytest.param(
            {"pod": "default/fits", "scheduled": True, "devices": [["GPU-zz"]]},
            "GPU-zz",
            id="devices",
        ),
        pytest.param(
            {"pod": "default/too-big", "scheduled": False, "reason": "CardTypeMismatch"},
            "CardTypeMismatch",
            id="reason",
        ),
        pytest.param({"pod": "default/ghost", "scheduled": True}, "default/ghost", id="no-pod"),
    ],
)
def test_check_with_unmet_expectation_exits_one(
    tmp_path: Path, expect: dict[str, Any], mentions: str
) -> None:
    scenario = _base()
    scenario["expect"] = [expect]

    result = _run(tmp_path, scenario, "--check")

    assert result.exit_code == 1, result.output
    assert mentions in result.stderr
    assert "decisions" in json.loads(result.stdout)


def test_without_check_an_unmet_expectation_exits_zero(tmp_path: Path) -> None:
    scenario = _base()
    scenario["expect"] = [{"pod": "default/fits", "scheduled": False}]

    assert _run(tmp_path, scenario).exit_code == 0


def test_reference_path_gives_the_same_decisions(tmp_path: Path) -> None:
    indexed = _run(tmp_path, _base())
    reference = _run(tmp_path, _base(), "--reference")

    assert reference.exit_code == 0, reference.output
    assert json.loads(reference.stdout) == json.loads(indexed.stdout)


def test_yaml_scenario_is_accepted(tmp_path: Path) -> None:
    yaml_text = """
nodes:
  - metadata: {name: node-a}
    devices:
      - {id: GPU-a0, index: 0, count: 10, devmem: 10240, devcore: 100,
         type: NVIDIA A10, numa: 0, health: true, mode: hami-core}
pods:
  - metadata: {namespace: default, name: p}
    spec:
      containers:
        - name: main
          resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 1024}}
expect:
  - {pod: default/p, scheduled: true, node: node-a}
"""
    result = _run(tmp_path, yaml_text, "--check")

    assert result.exit_code == 0, result.output
    assert _decisions(result)["default/p"]["node"] == "node-a"


#: Every scenario file under tests/scenarios/.
SCENARIOS = sorted(
    p for pattern in ("*.json", "*.yaml", "*.yml") for p in DATA.parent.rglob(pattern)
)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: str(p.relative_to(DATA.parent)))
def test_the_command_decides_every_scenario_as_the_library_does(path: Path) -> None:
    """One path decides a scenario (issue 45): the command, streamed or with ``--check``,
    prints the document ``simulation.simulate`` returns (gangs, claims, preemption,
    defragmentation plans and all)."""
    scenario = simulation.read_scenario(path)
    library = json.loads(json.dumps(simulation.simulate(scenario, now=float(NOW))))

    streamed = CliRunner().invoke(main, ["simulate", str(path), "--now", NOW])
    checked = CliRunner().invoke(main, ["simulate", str(path), "--now", NOW, "--check"])

    assert streamed.exit_code == 0, streamed.output
    assert json.loads(streamed.stdout) == library
    assert checked.exit_code in (0, 1), checked.output  # 1: an expectation not met
    assert json.loads(checked.stdout) == library


def test_a_gang_that_cannot_fit_whole_binds_none_through_the_command() -> None:
    """The command once decided each member of a PodGroup alone (the streamed path knew
    no gangs) and bound two of a gang of three that cannot fit whole."""
    path = DATA / "gangs-05-three-that-cannot-fit-whole.json"

    result = CliRunner().invoke(main, ["simulate", str(path), "--now", NOW])

    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [d["scheduled"] for d in document["decisions"]] == [False, False, False]
    assert document["podGroups"][0]["placed"] == []


Mutation = Callable[[Scenario], None]


def _set_config(section: str, key: str, value: Any) -> Mutation:
    def mutate(scenario: Scenario) -> None:
        scenario["config"].setdefault(section, {})[key] = value

    return mutate


def _drop_node_name(scenario: Scenario) -> None:
    del scenario["nodes"][0]["metadata"]["name"]


def _devices_not_a_list(scenario: Scenario) -> None:
    scenario["nodes"][0]["devices"] = {"id": "GPU-a0"}


def _bad_device_field(scenario: Scenario) -> None:
    scenario["nodes"][0]["devices"][0]["devmem"] = "lots"


def _register_annotation(value: str) -> Mutation:
    def mutate(scenario: Scenario) -> None:
        node = scenario["nodes"][0]
        del node["devices"]
        node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = value

    return mutate


def _pods_not_a_list(scenario: Scenario) -> None:
    scenario["pods"] = {"fits": _pod("fits", 1)}


def _pod_without_containers_list(scenario: Scenario) -> None:
    scenario["pods"][0]["spec"] = {"containers": "main"}


def _defrag(section: Any) -> Mutation:
    def mutate(scenario: Scenario) -> None:
        scenario["defrag"] = section

    return mutate


_REGISTER_JSON_BAD_COUNT = json.dumps([{**_CARD, "count": "ten"}])


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        pytest.param(
            _set_config("nvidia", "defaultMemory", -5),
            "defaultMemory",
            id="negative-default-memory",
        ),
        pytest.param(
            _set_config("nvidia", "memoryFactor", "big"), "memoryFactor", id="memory-factor-text"
        ),
        pytest.param(
            _set_config("scheduler", "nodeSchedulerPolicy", "random"),
            "nodeSchedulerPolicy",
            id="unknown-node-policy",
        ),
        pytest.param(_drop_node_name, "nodes[0].metadata.name", id="node-without-name"),
        pytest.param(_devices_not_a_list, "nodes[0].devices", id="devices-not-a-list"),
        pytest.param(_bad_device_field, "devmem", id="device-devmem-text"),
        pytest.param(_pods_not_a_list, "pods", id="pods-not-a-list"),
        pytest.param(_pod_without_containers_list, "containers", id="containers-not-a-list"),
        pytest.param(
            _register_annotation(_REGISTER_JSON_BAD_COUNT),
            "count",
            id="register-json-count-text",
        ),
        pytest.param(
            _register_annotation("GPU-a0,10,abc,100,NVIDIA-Tesla T4,0,true:"),
            "hami.io/node-nvidia-register",
            id="register-legacy-devmem-text",
        ),
        pytest.param(_defrag([1]), "defrag", id="defrag-not-a-mapping"),
        pytest.param(_defrag({"maxEvictions": 0}), "defrag.maxEvictions", id="defrag-no-moves"),
        pytest.param(_defrag({"maxEvictions": "2"}), "defrag.maxEvictions", id="defrag-text"),
        pytest.param(_defrag({"method": "best"}), "defrag.method", id="defrag-method"),
        pytest.param(_defrag({"ownerKinds": "Job"}), "defrag.ownerKinds", id="defrag-kinds"),
        pytest.param(_defrag({"allowBarePods": 1}), "defrag.allowBarePods", id="defrag-bare"),
        pytest.param(_defrag({"evictions": 2}), "defrag.evictions", id="defrag-unknown-key"),
    ],
)
def test_malformed_scenario_exits_nonzero_naming_the_field(
    tmp_path: Path, mutate: Mutation, field: str
) -> None:
    scenario = copy.deepcopy(_base())
    mutate(scenario)

    result = _run(tmp_path, scenario)

    assert result.exit_code != 0
    assert field in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("[1, 2, 3]", id="a-list"),
        pytest.param("{nodes: [", id="broken-yaml"),
        pytest.param('"just text"', id="a-string"),
    ],
)
def test_unreadable_scenario_exits_nonzero(tmp_path: Path, text: str) -> None:
    result = _run(tmp_path, text)

    assert result.exit_code != 0
    assert "invalid scenario" in result.stderr


def test_missing_file_exits_nonzero(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["simulate", str(tmp_path / "nope.json")])

    assert result.exit_code != 0
