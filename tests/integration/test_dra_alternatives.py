"""The engine against kube-scheduler's allocator on generated claims (issue 39).

Seeded generated claims use prioritized alternatives (``firstAvailable``),
``distinctAttribute`` and ``matchAttribute`` constraints, CEL selectors, counts, memory
and cores, some of them past what a card or the node can give. Each is created twice on
the live control plane: once for a pod of kube-scheduler (its allocator, first-fit,
upstream's semantics) pinned to one node, once for a pod of the engine pinned to a
second node of the same machine, both empty. Then:

- the engine allocates exactly when kube-scheduler does (it finds one whenever upstream
  does, and never one upstream would not);
- the engine never takes a later alternative than kube-scheduler did: it takes the first
  combination of alternatives that fits (in order: the first request's alternatives
  first), where upstream's allocator searches depth first, device by device, and may
  settle on a later alternative of a later request rather than move an earlier request
  to another device (seed 7, case 92: a ``matchAttribute`` over two requests). The
  devices may differ too: the engine scores them;
- the engine's allocation, as the API server accepted it, keeps every rule of the claim
  (each device allowed by the chosen alternative's selectors, the counts, the constraints);
- the node's driver prepares every allocation, either allocator's, as kubelet asks it
  (``NodePrepareResources`` over the plugin's socket), and unprepares it after.

``VGPU_DRA_DIFF_CASES`` (default 60) and ``VGPU_DRA_DIFF_SEED`` (default 39) set the trace.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from integration.dra_env import (
    RESOURCE,
    claim_pod,
    dra_operator,
    dra_plane,
    fresh_namespace,
    scheduling_news,
)
from integration.test_agent import AgentThread, wait_for

from vgpu_operator.agent.dra import dra_pb2, dra_pb2_grpc, kubelet_standin
from vgpu_operator.devices import dra
from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing.binaries import Binaries
from vgpu_operator.testing.controlplane import ControlPlane

pytestmark = pytest.mark.integration

KUBE_NODE, ENGINE_NODE = "alt-kube", "alt-engine"  # l40s-pcie-4 each: NUMA 0, 0, 1, 1
SCHEDULER = "vgpu-dra-alternatives"
CASES = int(os.environ.get("VGPU_DRA_DIFF_CASES", "60"))
SEED = int(os.environ.get("VGPU_DRA_DIFF_SEED", "39"))
ATTRS = f'device.attributes["{dra.DRIVER}"]'
NUMA = dra.ATTR_NUMA_NODE
INDEX = f"{dra.DRIVER}/{dra.ATTR_INDEX}"
#: The machine's cards: index -> NUMA node.
CARD_NUMA = {0: 0, 1: 0, 2: 1, 3: 1}
CARD_MEMORY_GIB = 46068 / 1024

Device = dict[str, int]  # index, numa
#: Selectors, and what each says of a card (kept to attributes the test reads itself).
SELECTORS: list[tuple[str, Callable[[Device], bool]]] = [
    (f"{ATTRS}.index == 0", lambda d: d["index"] == 0),
    (f"{ATTRS}.index == 3", lambda d: d["index"] == 3),
    (f"{ATTRS}.index >= 2", lambda d: d["index"] >= 2),
    (f'{ATTRS}.productName.lowerAscii().contains("l40")', lambda d: True),
    (f'{ATTRS}.productName.lowerAscii().contains("h100")', lambda d: False),
    ('device.attributes["resource.kubernetes.io"].numaNode == 1', lambda d: d["numa"] == 1),
]
MEMORY = ["1Gi", "4Gi", "12Gi", "30Gi", "50Gi"]  # 50Gi: more than a card has


@dataclass
class Case:
    spec: dict[str, Any]
    #: Request or ``request/subrequest`` -> (count, GiB, selector predicates).
    asks: dict[str, tuple[int, float, list[Callable[[Device], bool]]]]


def generate(rng: random.Random) -> Case:
    asks: dict[str, tuple[int, float, list[Callable[[Device], bool]]]] = {}

    def exactly(name: str) -> dict[str, Any]:
        count = rng.choice([1, 1, 1, 2, 2, 3])
        memory = rng.choice(MEMORY)
        chosen = rng.sample(SELECTORS, rng.choice([0, 0, 1, 1, 2]))
        out: dict[str, Any] = {
            "deviceClassName": dra.SHARED_CLASS,
            "count": count,
            "capacity": {"requests": {"memory": memory}},
        }
        # Not 100: HAMi's rules, which the engine keeps on the DRA path, refuse 100 cores
        # on a card in use and no cores on a card whose cores are all taken, where
        # upstream's capacity sums allow both (docs/dra-engine.md, the fields' table).
        cores = rng.choice([None, None, 25, 60])
        if cores is not None:
            out["capacity"]["requests"]["cores"] = str(cores)
        if chosen:
            out["selectors"] = [{"cel": {"expression": e}} for e, _ in chosen]
        asks[name] = (count, float(parse_quantity(memory)) / 2**30, [p for _, p in chosen])
        return out

    requests: list[dict[str, Any]] = []
    names: list[str] = []
    for r in range(rng.choice([1, 2, 2])):
        name = f"r{r}"
        if rng.random() < 0.7:
            subs = [f"s{k}" for k in range(rng.choice([2, 3]))]
            requests.append(
                {
                    "name": name,
                    "firstAvailable": [{"name": s, **exactly(f"{name}/{s}")} for s in subs],
                }
            )
            names.extend([name, f"{name}/{rng.choice(subs)}"])
        else:
            requests.append({"name": name, "exactly": exactly(name)})
            names.append(name)
    constraints: list[dict[str, Any]] = []
    for kind in ("distinctAttribute", "matchAttribute"):
        if rng.random() < (0.6 if kind == "distinctAttribute" else 0.25):
            constraint: dict[str, Any] = {kind: rng.choice([NUMA, INDEX])}
            if rng.random() < 0.5:
                constraint["requests"] = [rng.choice(names)]
            constraints.append(constraint)
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return Case({"devices": devices}, asks)


@pytest.fixture(scope="module")
def agents() -> list[AgentThread]:
    return []


@pytest.fixture(scope="module")
def plane(
    control_plane_binaries: Binaries,
    tmp_path_factory: pytest.TempPathFactory,
    agents: list[AgentThread],
) -> Iterator[ControlPlane]:
    work = tmp_path_factory.mktemp("dra-alternatives")
    machines = dict.fromkeys((KUBE_NODE, ENGINE_NODE), "l40s-pcie-4")
    with dra_plane(control_plane_binaries, work, machines, split=10, agents_out=agents) as cp:
        yield cp


@pytest.fixture(scope="module")
def operator(plane: ControlPlane) -> Iterator[OperatorThread]:
    with dra_operator(
        plane,
        "vgpu-dra-alternatives-config",
        SCHEDULER,
        "  gpuSchedulerPolicy: spread\n  nodeSchedulerPolicy: spread\n",
    ) as running:
        yield running


ALLOCATED, REFUSED, EARLIER = "allocated", "refused", "earlier"


def outcome(plane: ControlPlane, namespace: str, name: str) -> str | None:
    bound, message = scheduling_news(plane, namespace, name)
    if bound:
        return ALLOCATED
    if message is not None and "does not exist" not in message and "waiting for" not in message:
        return REFUSED
    return None


def socket_of(agent: AgentThread) -> Path:
    plugins = agent.settings.dra_plugins_dir
    assert plugins is not None
    return Path(plugins) / dra.DRIVER / "dra.sock"


async def unprepare(socket: Path, namespace: str, name: str, uid: str) -> str:
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = dra_pb2_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
        reply = await stub.NodeUnprepareResources(
            dra_pb2.NodeUnprepareResourcesRequest(
                claims=[dra_pb2.Claim(namespace=namespace, name=name, uid=uid)]
            ),
            timeout=10,
        )
    return str(reply.claims[uid].error)


def prepared_by_driver(agent: AgentThread, claim: dict[str, Any]) -> str:
    """Prepare the claim as kubelet would, then unprepare it: the driver's error, if any."""
    meta = claim["metadata"]
    socket = socket_of(agent)
    cdi = Path(agent.settings.cdi_dir or "")
    answer = asyncio.run(
        kubelet_standin.prepare_claim(socket, cdi, meta["namespace"], meta["name"], meta["uid"])
    )
    if answer.error:
        return answer.error
    if not answer.cdi_ids:
        return "no CDI device"
    return asyncio.run(unprepare(socket, meta["namespace"], meta["name"], meta["uid"]))


def rule_breaks(case: Case, claim: dict[str, Any], slice_: dict[str, Any]) -> list[str]:
    """What of the claim's rules the allocation breaks, read with upstream's semantics."""
    cards: dict[str, Device] = {}
    for device in slice_["spec"]["devices"]:
        index = int(device["attributes"][dra.ATTR_INDEX]["int"])
        cards[device["name"]] = {"index": index, "numa": CARD_NUMA[index]}
    results = claim["status"]["allocation"]["devices"]["results"]
    problems: list[str] = []
    by_request: dict[str, list[Device]] = {}
    for result in results:
        by_request.setdefault(result["request"], []).append(cards[result["device"]])
    tops = [r["name"] for r in case.spec["devices"]["requests"]]
    chosen = {name.split("/", 1)[0]: name for name in by_request}
    if sorted(chosen) != sorted(tops):
        problems.append(f"requests allocated {sorted(by_request)}, claim has {tops}")
    for name, devices in by_request.items():
        count, _memory, predicates = case.asks[name]
        if len(devices) != count:
            problems.append(f"{name}: {len(devices)} devices for count {count}")
        for device in devices:
            if not all(p(device) for p in predicates):
                problems.append(f"{name}: card {device['index']} fails a selector")
    for constraint in case.spec["devices"].get("constraints") or []:
        attribute = constraint.get("matchAttribute") or constraint.get("distinctAttribute")
        key = "numa" if attribute == NUMA else "index"
        covered = constraint.get("requests") or tops
        names = [chosen.get(c, c) for c in covered]
        values = [d[key] for n in names if n in by_request for d in by_request[n]]
        if "matchAttribute" in constraint and len(set(values)) > 1:
            problems.append(f"matchAttribute {attribute} over {names}: {values}")
        if "distinctAttribute" in constraint and len(set(values)) < len(values):
            problems.append(f"distinctAttribute {attribute} over {names}: {values}")
    return problems


def compare(
    plane: ControlPlane,
    namespace: str,
    n: int,
    case: Case,
    by_node: dict[str, AgentThread],
    slice_: dict[str, Any],
) -> tuple[str, list[str]]:
    """Run case ``n`` through both allocators: kube-scheduler's outcome (``EARLIER`` when
    both allocated and the engine took earlier alternatives), and what differs."""
    claims_path = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"
    for who, node, scheduler in (("kube", KUBE_NODE, None), ("engine", ENGINE_NODE, SCHEDULER)):
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim"}
        plane.create(claims_path, {**body, "metadata": {"name": f"{who}-{n}"}, "spec": case.spec})
        pod = claim_pod(f"{who}-{n}", claim=f"{who}-{n}", scheduler=scheduler, node=node)
        plane.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    kube = wait_for(
        f"kube-scheduler on case {n}", lambda: outcome(plane, namespace, f"kube-{n}"), 60
    )
    engine = wait_for(
        f"the engine on case {n}", lambda: outcome(plane, namespace, f"engine-{n}"), 60
    )
    where = f"case {n} {case.spec}"
    if kube != engine:
        return kube, [f"{where}: kube-scheduler {kube}, engine {engine}"]
    if kube == REFUSED:
        return kube, []
    claims = {who: plane.get(f"{claims_path}/{who}-{n}") for who in ("kube", "engine")}
    chosen = {who: positions(case, c) for who, c in claims.items()}
    problems = []
    if chosen["engine"] > chosen["kube"]:
        problems.append(
            f"{where}: kube-scheduler took alternatives {chosen['kube']}, the engine the later "
            f"{chosen['engine']}"
        )
    problems.extend(f"{where}: engine {p}" for p in rule_breaks(case, claims["engine"], slice_))
    for who, node in (("kube", KUBE_NODE), ("engine", ENGINE_NODE)):
        error = prepared_by_driver(by_node[node], claims[who])
        if error:
            problems.append(f"{where}: the driver refused {who}'s allocation: {error}")
    return (EARLIER if chosen["engine"] < chosen["kube"] else kube), problems


def positions(case: Case, claim: dict[str, Any]) -> tuple[int, ...]:
    """Per request of the claim, the position of the alternative its results name (0 for
    an ``exactly`` request)."""
    named = {r["request"] for r in claim["status"]["allocation"]["devices"]["results"]}
    out = []
    for request in case.spec["devices"]["requests"]:
        subs = [f"{request['name']}/{s['name']}" for s in request.get("firstAvailable") or []]
        out.append(next((k for k, sub in enumerate(subs) if sub in named), 0))
    return tuple(out)


def clean(plane: ControlPlane, namespace: str, n: int) -> None:
    """The case's pods and claims gone, so that the next case finds the nodes empty."""
    claims_path = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"
    for who in ("kube", "engine"):
        plane.request(
            "DELETE", f"/api/v1/namespaces/{namespace}/pods/{who}-{n}?gracePeriodSeconds=0"
        )
        plane.delete(f"{claims_path}/{who}-{n}")
    wait_for("the case's claims to go", lambda: not plane.get(claims_path)["items"], 60)


def test_the_engine_allocates_as_kube_scheduler_does_on_generated_claims(
    plane: ControlPlane, operator: OperatorThread, agents: list[AgentThread]
) -> None:
    rng = random.Random(SEED)
    namespace = fresh_namespace(plane, "alt")
    by_node = dict(zip((KUBE_NODE, ENGINE_NODE), agents, strict=True))
    slices = f"{RESOURCE}/resourceslices?fieldSelector=spec.nodeName%3D{ENGINE_NODE}"
    slice_ = plane.request("GET", slices)["items"][0]
    disagreements: list[str] = []
    tally = {ALLOCATED: 0, REFUSED: 0, EARLIER: 0}
    for n in range(CASES):
        kube, problems = compare(plane, namespace, n, generate(rng), by_node, slice_)
        tally[kube] += 1
        disagreements.extend(problems)
        clean(plane, namespace, n)
    allocated = tally[ALLOCATED] + tally[EARLIER]
    print(
        f"\n{CASES} cases (seed {SEED}): both allocated {allocated} (the engine on earlier "
        f"alternatives in {tally[EARLIER]}), both refused {tally[REFUSED]}; "
        f"{len(disagreements)} disagreements"
    )
    assert disagreements == []
