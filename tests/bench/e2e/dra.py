"""The DRA part of the bench (issue 26): the engine against kube-scheduler's DRA allocator,
on one cluster of its own, in the same run.

One control plane (with the write-only audit log), kube-controller-manager's resource
claim controller (templates become claims, claims of deleted pods are released), KWOK
nodes on the DRA path whose ResourceSlices are written as the agent writes them
(``devices.dra.slice_wire``: 40 GiB cards, 8 per node, split 8, NUMA 0 for cards 0-3,
NVLink pairs 0+1, 2+3, 4+5, 6+7 published as ``nvlinkIsland``), the operator as its own
process, and kube-scheduler (client QPS 1000/2000, its strongest setting).

- **Churn** (placement quality): one seeded trace of arrivals (fractional single-card
  claims of 4 to 32 GiB, and two-card claims) and departures, played once by each
  allocator on the same four nodes, one step at a time (each arrival waits until it is
  bound or refused). Reported: pods placed before the first refusal; at that moment, the
  stranded memory (free memory on cards that no request shape of the trace fits); and of
  the two-card claims placed while a free NVLink pair existed, how many got one.
- **Throughput**: the same claims (one ResourceClaim per pod, made before the pods so that
  the claim controller is not in the path) placed by each allocator on the throughput
  nodes; pods per second from the first pod created to the last bound.
- **Writes per pod**: what each scheduler wrote per placed pod in the throughput run
  (the audit log, by user and verb).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import yaml

from e2e import counting, dra_load, procs
from e2e.api import Api
from e2e.tracking import Tracker
from vgpu_operator.control.feed import DEFAULT_CONFIG_KEY
from vgpu_operator.control.options import DEFAULT_CONFIG_MAP
from vgpu_operator.devices import dra
from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.testing.controlplane import ControlPlane, find_tool

RESOURCE: Final = "/apis/resource.k8s.io/v1"
POOL_LABEL: Final = "bench.vgpu-operator.io/dra-pool"
OPERATOR_NAMESPACE: Final = "vgpu-operator"
SCHEDULER: Final = "vgpu-scheduler"
GIB: Final = 2**30
CARD_MIB: Final = 40960
CARDS_PER_NODE: Final = 8
SPLIT: Final = 8
#: The churn's nodes, and its trace's length (long enough to reach a refusal).
CHURN_NODES: Final = 12
CHURN_STEPS: Final = 1100
#: kube-scheduler at its default client QPS (the other runs raise it to 1000/2000).
DEFAULT_QPS: Final = "kube-scheduler (QPS 50/100)"


@dataclass(frozen=True)
class Shape:
    name: str
    memory_gib: int
    cores: int
    count: int = 1


#: The churn's request shapes and how often each arrives.
SHAPES: Final = (
    (Shape("m4", 4, 10), 4),
    (Shape("m8", 8, 20), 4),
    (Shape("m10", 10, 25), 3),
    (Shape("m16", 16, 30), 3),
    (Shape("m20", 20, 40), 2),
    (Shape("m32", 32, 50), 1),
    (Shape("pair", 16, 50, 2), 2),
)


def trace(seed: int, steps: int) -> list[tuple[str, Any]]:
    """Arrivals (a shape) and departures (an index into the live pods, modulo their
    number), seeded: both allocators play the same trace."""
    rng = random.Random(seed)
    shapes = [s for s, _ in SHAPES]
    weights = [w for _, w in SHAPES]
    out: list[tuple[str, Any]] = []
    for _ in range(steps):
        if out and rng.random() < 0.3:
            out.append(("leave", rng.randrange(1_000_000)))
        else:
            out.append(("arrive", rng.choices(shapes, weights)[0]))
    return out


# --- the cluster ------------------------------------------------------------------------


def churn_cards(node: str) -> list[dra.CardShape]:
    """One DRA node's cards: eight A100s of 40 GiB, two NUMA nodes, NVLink pairs (the
    engine-only churn bench builds the same nodes)."""
    return [
        dra.CardShape(
            uuid=f"GPU-{node}-{i:04d}",
            index=i,
            product="A100-SXM4-40GB",
            hami_type="NVIDIA-A100-SXM4-40GB",
            memory_mib=CARD_MIB,
            cores=100,
            split_count=SPLIT,
            mode="hami-core",
            numa_node=i // 4,
            nvlink_island=(i // 2) * 2,
        )
        for i in range(CARDS_PER_NODE)
    ]


def make_nodes(cp: ControlPlane, pool: str, count: int) -> list[str]:
    names = []
    for n in range(count):
        node = f"dra-{pool}-{n}"
        cp.create_fake_gpu_node(
            node, gpus=0, labels={dra.NODE_PATH_LABEL: dra.PATH_DRA, POOL_LABEL: pool}
        )
        cp.create(f"{RESOURCE}/resourceslices", dra.slice_wire(node, churn_cards(node), 1, None))
        names.append(node)
    return names


def claim_spec(shape: Shape) -> dict[str, Any]:
    exactly = {
        "deviceClassName": dra.SHARED_CLASS,
        "count": shape.count,
        "capacity": {"requests": {"memory": f"{shape.memory_gib}Gi", "cores": str(shape.cores)}},
    }
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def pod_body(name: str, pool: str, ours: bool, claim: Mapping[str, str]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}
        ],
        "resourceClaims": [{"name": "gpu", **claim}],
        "nodeSelector": {POOL_LABEL: pool},
        "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
    }
    if ours:
        spec["schedulerName"] = SCHEDULER
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


@dataclass
class Card:
    node: str
    device: str
    island: int
    memory: Fraction
    cores: Fraction
    shares: Fraction


def cards_now(cp: ControlPlane, nodes: Sequence[str]) -> list[Card]:
    """Every card of ``nodes`` with what is free on it, by a recount of every claim."""
    wanted = set(nodes)
    slices = cp.get(f"{RESOURCE}/resourceslices")["items"]
    return free_cards(
        [s for s in slices if s["spec"]["nodeName"] in wanted],
        cp.get(f"{RESOURCE}/resourceclaims")["items"],
    )


def free_cards(slices: Sequence[Mapping[str, Any]], claims: Sequence[Any]) -> list[Card]:
    """Every card of ``slices`` with what ``claims`` (a recount of them) leave free on it:
    the one count the live bench and the engine-only replay both make."""
    used = dra.recount(list(claims))
    out = []
    for item in slices:
        node = item["spec"]["nodeName"]
        for device in item["spec"]["devices"]:
            capacity = {k: parse_quantity(v["value"], k) for k, v in device["capacity"].items()}
            taken = used.get((node, device["name"]))
            island = int(device["attributes"][dra.ATTR_NVLINK_ISLAND]["int"])
            out.append(
                Card(
                    node,
                    device["name"],
                    island,
                    capacity[dra.MEMORY] - (taken.memory_bytes if taken else 0),
                    capacity[dra.CORES] - (taken.cores if taken else 0),
                    capacity[dra.SHARES] - (taken.shares if taken else 0),
                )
            )
    return out


def fits(card: Card, shape: Shape) -> bool:
    return card.memory >= shape.memory_gib * GIB and card.cores >= shape.cores and card.shares >= 1


def stranded_gib(cards: Sequence[Card]) -> tuple[float, float]:
    """(slivers, free) GiB: free memory on cards that no single-card shape of the trace
    fits, and all free memory."""
    singles = [s for s, _ in SHAPES if s.count == 1]
    stranded = sum(c.memory for c in cards if not any(fits(c, s) for s in singles))
    free = sum(c.memory for c in cards)
    return float(stranded / GIB), float(free / GIB)


def stranded_for(cards: Sequence[Card], shape: Shape) -> float:
    """GiB of free memory on cards the pending claim cannot use: a card it does not fit,
    or (several cards) one whose node has too few cards it fits."""
    usable: dict[str, int] = {}
    for card in cards:
        if fits(card, shape):
            usable[card.node] = usable.get(card.node, 0) + 1
    stranded = sum(
        c.memory for c in cards if not fits(c, shape) or usable.get(c.node, 0) < shape.count
    )
    return float(stranded / GIB)


def linked_pair_free(cards: Sequence[Card], shape: Shape) -> bool:
    by_island: dict[tuple[str, int], int] = {}
    for card in cards:
        if fits(card, shape):
            key = (card.node, card.island)
            by_island[key] = by_island.get(key, 0) + 1
    return any(n >= 2 for n in by_island.values())


# --- churn --------------------------------------------------------------------------------


def _outcome(cp: ControlPlane, namespace: str, name: str, timeout_s: float = 60.0) -> str:
    """ "bound", or "refused" once the pod's scheduler said it does not fit."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pod = cp.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        if pod["spec"].get("nodeName"):
            return "bound"
        for condition in (pod.get("status") or {}).get("conditions") or []:
            message = str(condition.get("message", ""))
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("status") == "False"
                and "waiting for" not in message
                and "does not exist" not in message
            ):
                return "refused"
        time.sleep(0.05)
    return "refused"


def _wait_released(cp: ControlPlane, namespace: str, claim_prefix: str | None = None) -> None:
    """Until no claim of the namespace (or of one pod) is allocated any more."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        claims = cp.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims")["items"]
        busy = [
            c
            for c in claims
            if (c.get("status") or {}).get("allocation")
            and (claim_prefix is None or c["metadata"]["name"].startswith(claim_prefix))
        ]
        if not busy:
            return
        time.sleep(0.05)
    raise RuntimeError(f"claims of {namespace} were not released")


def churn(
    cp: ControlPlane, namespace: str, ours: bool, steps: list[tuple[str, Any]], nodes: list[str]
) -> dict[str, Any]:
    cp.ensure_namespace(namespace)
    for kind_of_claim, _ in SHAPES:
        cp.create(
            f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates",
            {"metadata": {"name": kind_of_claim.name}, "spec": {"spec": claim_spec(kind_of_claim)}},
        )
    live: list[str] = []
    placed = pairs = linked = pairs_with_a_free_link = 0
    started = time.monotonic()
    refused: Shape | None = None
    for number, (kind, value) in enumerate(steps):
        if kind == "leave":
            if live:
                name = live.pop(value % len(live))
                cp.delete(f"/api/v1/namespaces/{namespace}/pods/{name}?gracePeriodSeconds=0")
                _wait_released(cp, namespace, f"{name}-")
            continue
        shape = value
        assert isinstance(shape, Shape)
        free_link = shape.count == 2 and linked_pair_free(cards_now(cp, nodes), shape)
        name = f"p{number}-{shape.name}"
        cp.create(
            f"/api/v1/namespaces/{namespace}/pods",
            pod_body(name, "churn", ours, {"resourceClaimTemplateName": shape.name}),
        )
        if _outcome(cp, namespace, name) == "refused":
            refused = shape
            break
        placed += 1
        live.append(name)
        if shape.count == 2:
            pairs += 1
            pairs_with_a_free_link += free_link
            if free_link:
                linked += _on_a_link(cp, namespace, name)
    # At the first refusal (the trace's end if none): what the cards hold then.
    cards = cards_now(cp, nodes)
    slivers, free = stranded_gib(cards)
    return {
        "placed_before_refusal": placed,
        "refused": refused.name if refused else None,
        "stranded_gib": round(stranded_for(cards, refused), 1) if refused else 0.0,
        "slivers_gib": round(slivers, 1),
        "free_gib": round(free, 1),
        "pairs_placed": pairs,
        "pairs_with_a_free_link": pairs_with_a_free_link,
        "pairs_linked": linked,
        "seconds": round(time.monotonic() - started, 1),
    }


def _on_a_link(cp: ControlPlane, namespace: str, pod: str) -> bool:
    obj = cp.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    claim = obj["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    found = cp.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{claim}")
    devices = [r["device"] for r in found["status"]["allocation"]["devices"]["results"]]
    # Cards are named ...-<index>; islands pair 0+1, 2+3, ...
    islands = {int(d.rsplit("-", 1)[1]) // 2 for d in devices}
    return len(devices) == 2 and len(islands) == 1


def clean(cp: ControlPlane, namespace: str) -> None:
    for pod in cp.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        cp.delete(
            f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}?gracePeriodSeconds=0"
        )
    _wait_released(cp, namespace)


# --- throughput ---------------------------------------------------------------------------


async def throughput(
    cp: ControlPlane, api: Api, audit: counting.AuditLog, namespace: str, ours: bool, count: int
) -> dict[str, Any]:
    """``count`` pods, each with its claim for an NVLink pair of shares
    (``dra_load.pair_spec``), the claims made first."""
    await api.ensure_namespace(namespace)
    gate = asyncio.Semaphore(32)

    async def make_claim(i: int) -> None:
        async with gate:
            await api.create(
                f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
                {"metadata": {"name": f"c{i}"}, "spec": dra_load.pair_spec()},
            )

    await asyncio.gather(*(make_claim(i) for i in range(count)))
    tracker = Tracker(api, namespace)
    tracker.start()
    audit.skip_to_end()
    started = time.time()

    async def make_pod(i: int) -> None:
        async with gate:
            body = pod_body(f"t{i}", "throughput", ours, {"resourceClaimName": f"c{i}"})
            await api.create(f"/api/v1/namespaces/{namespace}/pods", body)

    await asyncio.gather(*(make_pod(i) for i in range(count)))
    done = await tracker.wait(lambda: len(tracker.bound) >= count, 600)
    await tracker.stop()
    await asyncio.sleep(2.0)  # the audit log's last lines
    writes = audit.writes([namespace])
    last = max(tracker.bound.values(), default=started)
    seconds = last - started
    placed = len(tracker.bound)
    per_pod: dict[str, dict[str, float]] = {}
    for (user, verb), n in sorted(writes.items()):
        if user in ("bench",) or user.startswith("system:"):
            continue
        per_pod.setdefault(user, {})[verb] = round(n / max(placed, 1), 2)
    claims = await api.list_all(f"{RESOURCE}/namespaces/{namespace}/resourceclaims")
    return {
        "pods": count,
        "placed": placed,
        "complete": done,
        "on_one_link": dra_load.on_one_link(claims),
        "seconds": round(seconds, 2),
        "pods_per_s": round(placed / seconds, 1) if seconds > 0 else None,
        "writes_per_pod": per_pod,
    }


# --- the whole part -------------------------------------------------------------------------


def _put_config(cp: ControlPlane) -> None:
    cp.ensure_namespace(OPERATOR_NAMESPACE)
    text = f"scheduler:\n  schedulerName: {SCHEDULER}\n  gpuSchedulerPolicy: binpack\n"
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": DEFAULT_CONFIG_MAP, "namespace": OPERATOR_NAMESPACE},
        "data": {DEFAULT_CONFIG_KEY: text},
    }
    cp.create(f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/configmaps", body)


@contextlib.contextmanager
def _cluster(root: Path) -> Iterator[ControlPlane]:
    from e2e.main import control_plane  # the same control plane as the main part

    with control_plane(root) as cp:
        yield cp


#: kube-scheduler's feature gates in every DRA run: upstream at its best (KEP-6132).
KS_GATES: Final = "SchedulerPreQueueingHints=true"
KS_LABEL: Final = "kube-scheduler"
#: Nodes of the preemption run's pool, whose cards the low-priority claims fill.
PREEMPT_NODES: Final = 4


@dataclass(frozen=True)
class Plan:
    """What the DRA part runs (``main.options``: BENCH_DRA_*)."""

    scale: float = 1.0
    seed: int = 26
    repeats: int = 3
    nodes: int = 500  # the throughput and steady runs' nodes
    pods: int = 0  # pods per throughput run (0: 2,000 x scale)
    steady_rate: float = 50.0
    steady_s: float = 30.0
    churn: bool = True

    @property
    def throughput_pods(self) -> int:
        return self.pods or max(100, round(2000 * self.scale))

    @property
    def steady_pods(self) -> int:
        return max(100, round(self.steady_rate * self.steady_s * self.scale))


def _kube_scheduler(kubeconfig: Path, root: Path, qps: int, burst: int) -> procs.Child:
    child, _ = procs.kube_scheduler(
        find_tool("kube-scheduler"), kubeconfig, root, qps, burst, KS_GATES
    )
    child.start()
    return child


async def run(plan: Plan) -> dict[str, Any]:
    """The DRA part: churn, throughput, steady arrivals and preemption; the figures."""
    root = Path(tempfile.mkdtemp(prefix="vgpu-bench-dra-"))
    print(f"[bench] DRA part: logs, configs and the audit log: {root}", flush=True)
    results: dict[str, Any] = {"seed": plan.seed, "kube_scheduler_gates": KS_GATES}
    with _cluster(root) as cp:
        for doc in yaml.safe_load_all(
            (
                Path(__file__).resolve().parents[3] / "manifests" / "dra-deviceclasses.yaml"
            ).read_text()
        ):
            cp.create(f"{RESOURCE}/deviceclasses", doc)
        cp.start_controller_manager(["resourceclaim-controller", "garbage-collector-controller"])
        churn_nodes = make_nodes(cp, "churn", CHURN_NODES) if plan.churn else []
        started = time.monotonic()
        make_nodes(cp, "throughput", plan.nodes)
        make_nodes(cp, "preempt", PREEMPT_NODES)
        results["nodes"] = {"throughput": plan.nodes, "setup_s": time.monotonic() - started}
        _put_config(cp)
        creds = {
            user: cp.create_client_credentials(user, ("system:masters",))
            for user in ("bench", "vgpu-operator", "kube-scheduler")
        }
        ks_config = creds["kube-scheduler"].kubeconfig_path
        operator, port = procs.operator(
            creds["vgpu-operator"].kubeconfig_path, root, OPERATOR_NAMESPACE,
            ["--inventory-timeout=0"],
        )  # fmt: skip
        operator.start()
        scheduler = _kube_scheduler(ks_config, root, 1000, 2000)
        api = Api.for_plane(cp, creds["bench"], connections=64)
        audit = counting.AuditLog(root / "audit.log")
        try:
            await operator.wait_http(f"http://127.0.0.1:{port}/readyz", 300)
            await asyncio.sleep(5.0)  # kube-scheduler's informers
            if plan.churn:
                await _churn_plays(cp, plan.seed, churn_nodes, results)
            await asyncio.sleep(11.0)  # kube-scheduler's pods no longer count as recent
            count = plan.throughput_pods
            for repeat in range(plan.repeats):
                for label, ours in (("engine", True), (KS_LABEL, False)):
                    print(f"[bench] DRA throughput {repeat + 1}: {label}", flush=True)
                    namespace = f"dra-tp-{label}-{repeat}"
                    figures = await throughput(cp, api, audit, namespace, ours, count)
                    results.setdefault("throughput", {}).setdefault(label, []).append(figures)
                    await asyncio.to_thread(clean, cp, namespace)
                await asyncio.sleep(11.0)
            for label, ours in (("engine", True), (KS_LABEL, False)):
                print(f"[bench] DRA steady {plan.steady_rate:g}/s: {label}", flush=True)
                namespace = f"dra-steady-{label}"
                figures = await dra_load.steady(
                    api, namespace, pod_body, "throughput", ours, plan.steady_rate,
                    plan.steady_pods,
                )  # fmt: skip
                results.setdefault("steady", {})[label] = figures
                await asyncio.to_thread(clean, cp, namespace)
            print("[bench] DRA preemption (engine)", flush=True)
            results["preemption"] = await dra_load.preemption(
                api, "dra-preempt", pod_body, "preempt", PREEMPT_NODES * CARDS_PER_NODE,
                CARD_MIB // 1024, f"http://127.0.0.1:{port}/metrics", procs.http_get,
            )  # fmt: skip
            await asyncio.to_thread(clean, cp, "dra-preempt")
            # kube-scheduler as installed (client QPS 50, burst 100), once.
            await asyncio.to_thread(scheduler.stop)
            scheduler = _kube_scheduler(ks_config, root, 50, 100)
            await asyncio.sleep(5.0)
            print(f"[bench] DRA throughput: {DEFAULT_QPS}", flush=True)
            figures = await throughput(cp, api, audit, "dra-tp-default-qps", False, count)
            results["throughput"][DEFAULT_QPS] = [figures]
        finally:
            await api.close()
            await asyncio.to_thread(operator.stop)
            await asyncio.to_thread(scheduler.stop)
    shutil.rmtree(root, ignore_errors=True)
    return results


async def _churn_plays(
    cp: ControlPlane, seed: int, churn_nodes: list[str], results: dict[str, Any]
) -> None:
    steps = trace(seed, CHURN_STEPS)
    results["trace"] = {
        "steps": len(steps),
        "arrivals": sum(1 for k, _ in steps if k == "arrive"),
        "nodes": len(churn_nodes),
        "cards": len(churn_nodes) * CARDS_PER_NODE,
        "card_gib": CARD_MIB // 1024,
        "shapes": [asdict(s) | {"weight": w} for s, w in SHAPES],
    }
    # The engine first: while kube-scheduler's pods wait, the engine settles each
    # allocation (claim_binding), which is not what its churn should measure.
    # The engine decides alike on every run; kube-scheduler picks among the nodes
    # that fit at random, so its runs differ and it plays the trace three times.
    plays = [("engine", True, 0)] + [(KS_LABEL, False, n) for n in range(3)]
    for label, ours, play in plays:
        print(f"[bench] DRA churn: {label} {play + 1}", flush=True)
        namespace = f"dra-churn-{label}-{play}"
        outcome = await asyncio.to_thread(churn, cp, namespace, ours, steps, churn_nodes)
        results.setdefault("churn", {}).setdefault(label, []).append(outcome)
        await asyncio.to_thread(clean, cp, namespace)


def _mean(values: Sequence[float | None]) -> float | None:
    real = [v for v in values if v is not None]
    return sum(real) / len(real) if real else None


def section(results: Mapping[str, Any]) -> list[str]:
    """The DRA section of docs/benchmarks.md."""
    if not results:
        return []
    out = ["## DRA: the engine against kube-scheduler's DRA allocator", ""]
    out.append(
        "One cluster of its own in the same run (`tests/bench/e2e/dra.py`): KWOK nodes on the "
        "DRA path with the agent's ResourceSlices (eight 40 GiB cards each, split 8, NVLink "
        "pairs 0+1, 2+3, ... published as `nvlinkIsland`), kube-controller-manager's claim "
        "controller, kube-scheduler (client QPS 1000/2000; for throughput also its default "
        f"50/100; always `--feature-gates={KS_GATES}`) and the operator (ConfigMap "
        "`gpuSchedulerPolicy: binpack`). `BENCH_ONLY=dra make bench` runs this part alone "
        "(`BENCH_DRA_NODES`, `BENCH_DRA_PODS`, `BENCH_DRA_RATE`, `BENCH_REPEATS`)."
    )
    trace_facts = results.get("trace") or {}
    churn = results.get("churn") or {}
    if churn:
        out += [
            "",
            f"**Churn** (placement quality): one trace of {trace_facts.get('steps')} steps "
            f"(seed {results.get('seed')}; {trace_facts.get('arrivals')} arrivals of claims of "
            "4, 8, 10, 16, 20 or 32 GiB on one card and of 2 x 16 GiB, and departures) "
            f"played by each allocator on the same {trace_facts.get('nodes')} nodes "
            f"({trace_facts.get('cards')} cards), each arrival waiting until it is bound or "
            "refused. At the first refusal: stranded memory, the free memory on cards that the "
            "pending (refused) claim cannot use (a card it does not fit, or for two cards a "
            "node with fewer than two it fits); slivers, the free memory on cards that no "
            "single-card request of the trace fits; and all free memory.",
            "",
            "| allocator | pods placed before the first refusal | refused | stranded GiB | "
            "slivers GiB | free GiB | two-card claims on an NVLink pair (when one was free) |",
            "|---|---|---|---|---|---|---|",
        ]
        churn_means: dict[str, dict[str, float]] = {}
        for label, plays in churn.items():
            if isinstance(plays, dict):
                plays = [plays]  # a results file from before the repeats
            for number, c in enumerate(plays, 1):
                out.append(
                    f"| {label} ({number}) | {c['placed_before_refusal']} | {c['refused'] or '-'} "
                    f"| {c['stranded_gib']} | {c.get('slivers_gib', '-')} | {c['free_gib']} | "
                    f"{c['pairs_linked']} of {c['pairs_with_a_free_link']} "
                    f"({c['pairs_placed']} placed) |"
                )
            churn_means[label] = {
                key: sum(float(c[key]) for c in plays) / len(plays)
                for key in ("stranded_gib", "placed_before_refusal")
            }
        ours, theirs = churn_means.get("engine"), churn_means.get("kube-scheduler")
        if ours and theirs:
            ratio = (
                f"{ours['stranded_gib'] / theirs['stranded_gib']:.2f}"
                if theirs["stranded_gib"]
                else "-"
            )
            out += [
                "",
                f"Stranded memory, engine over first-fit (means): {ratio} (aim: at most 0.5); "
                f"pods placed before the first refusal: {ours['placed_before_refusal']:.0f} "
                f"against {theirs['placed_before_refusal']:.0f}.",
            ]
    out += _throughput_lines(results)
    out += _steady_lines(results)
    out += _preemption_lines(results)
    out.append("")
    return out


def _throughput_lines(results: Mapping[str, Any]) -> list[str]:
    tp = results.get("throughput") or {}
    if not tp:
        return []
    nodes = (results.get("nodes") or {}).get("throughput", "the throughput")
    out = [
        "",
        f"**Throughput** on {nodes} nodes: the same claims (two shares of 10 GiB and 25 % "
        "on two cards of one NVLink island: a `matchAttribute` on "
        f"`{dra_load.LINK_ATTRIBUTE}`; one ResourceClaim per pod, made before the pods) "
        "placed by each allocator, pods per second from the first pod created to the last "
        f"bound; kube-scheduler with `--feature-gates={results.get('kube_scheduler_gates', '')}`"
        "; each run repeated:",
        "",
        "| allocator | pods | runs: pods/s | median pods/s (min-max, spread) | "
        "claims on one NVLink island (all runs) |",
        "|---|---|---|---|---|",
    ]
    for label, runs_ in tp.items():
        rates = [r["pods_per_s"] for r in runs_]
        found = dra_load.spread(rates)
        linked = [r["on_one_link"] for r in runs_ if "on_one_link" in r]
        link_cell = f"{sum(a for a, _ in linked)} of {sum(b for _, b in linked)}" if linked else "-"
        out.append(
            f"| {label} | {runs_[0]['pods']} | {', '.join(str(r) for r in rates)} | "
            f"{dra_load.spread_text(found, runs=len(rates))} | {link_cell} |"
        )
    engine = [r["pods_per_s"] for r in tp.get("engine", [])]
    upstream = [r["pods_per_s"] for r in tp.get(KS_LABEL, [])]
    # Paired by repeat: each pair ran back to back in the same cluster.
    pairs = dra_load.spread([a / b for a, b in zip(engine, upstream, strict=False) if a and b])
    if pairs:
        line = (
            "Engine ÷ kube-scheduler (QPS 1000/2000, PreQueueingHints), median of the runs "
            f"paired by repeat: {dra_load.spread_text(pairs, 2, len(engine))}"
        )
        installed = _mean([r["pods_per_s"] for r in tp.get(DEFAULT_QPS, [])])
        if installed:
            line += (
                "; the engine's median over kube-scheduler as installed (QPS 50/100, one "
                f"run): {(_median(engine) or 0) / installed:.2f}x"
            )
        out += ["", f"{line} (aim: at least 2x)."]
    out += ["", "API writes per placed pod (audit log, the throughput runs' namespaces):", ""]
    out += ["| allocator | writer | writes per pod |", "|---|---|---|"]
    for label, runs_ in tp.items():
        for user, verbs in (runs_[-1].get("writes_per_pod") or {}).items():
            listed = ", ".join(f"{verb} {n}" for verb, n in verbs.items())
            out.append(f"| {label} | {user} | {listed} |")
    return out


def _median(values: Sequence[float | None]) -> float | None:
    found = dra_load.spread(values)
    return found["median"] if found else None


def _steady_lines(results: Mapping[str, Any]) -> list[str]:
    steady = results.get("steady") or {}
    if not steady:
        return []
    out = [
        "",
        "**Steady arrivals**: claims for an NVLink pair (as above) arriving at a fixed rate, "
        "each created with its pod; from the claim's creation request to the bench seeing "
        "the pod bound (aim: p99 at most 5 s at 50 claims/s).",
        "",
        "| allocator | claims/s asked | arrived/s | pods | placed | p50 s | p99 s |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, f in steady.items():
        out.append(
            f"| {label} | {f['rate']:g} | {f.get('arrived_per_s') or '-'} | {f['pods']} | "
            f"{f['placed']} | {f.get('p50_s') if f.get('p50_s') is not None else '-'} | "
            f"{f.get('p99_s') if f.get('p99_s') is not None else '-'} |"
        )
    return out


def _preemption_lines(results: Mapping[str, Any]) -> list[str]:
    found = results.get("preemption")
    if not found:
        return []
    head = (
        f"**Preemption** (engine): {found['low']} low-priority claims for whole cards fill "
        f"{PREEMPT_NODES} nodes, then {found['high']} high-priority ones arrive."
    )
    if not found.get("complete"):
        return [
            "",
            head + f" {found['bound']} of {found['high']} bound within "
            f"{found['timeout_s']:g} s: the DRA path does not preempt in this build "
            "(the run is the slot its figures fill).",
        ]
    decision = (
        f"decision p50/p99 {found['decision_p50_s']} / {found['decision_p99_s']} s "
        f"(`{dra_load.DECISION_METRIC}`)"
        if found.get("decision_p99_s") is not None
        else f"no decision time (the operator exports no `{dra_load.DECISION_METRIC}`)"
    )
    return [
        "",
        head + " Preemptor create to bound p50/p99 "
        f"{found['create_to_bound_p50_s']} / {found['create_to_bound_p99_s']} s; {decision}.",
    ]
