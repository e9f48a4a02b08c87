"""CEL selectors on the live control plane (issue 33, items 1 and 5).

One control plane of its own, as ``test_dra_engine``: kube-apiserver, kube-scheduler, the
resource claim controller, two KWOK nodes on the DRA path with an agent each publishing
its ResourceSlice, and the operator (its webhook served too). Two things are shown:

- conformance: the same selectors, string-extension edges among them, go through
  kube-scheduler (pods naming no scheduler) and through the engine (pods naming the
  operator); each is allocated by both or refused by both;
- the aim: while 100 claims with issue 33's slow selector wait, the operator's webhook and
  ``/healthz`` keep answering, and every slow claim is refused with a message that says
  what to change.
"""

from __future__ import annotations

import time
import urllib.request
import uuid
from collections.abc import Iterator

import pytest
from integration import dra_env
from integration import operator_env as env
from integration.dra_env import claim_pod, create_claim, dra_plane, scheduling_news
from integration.test_agent import wait_for
from integration.test_operator_webhook import make_pki

from vgpu_operator.control.options import WebhookOptions
from vgpu_operator.devices import dra
from vgpu_operator.handlers.app import WEBHOOK_ID
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing.binaries import Binaries
from vgpu_operator.testing.controlplane import AdminRequestError, ControlPlane
from vgpu_operator.testing.processes import free_port

pytestmark = pytest.mark.integration

NODES = ("cel-one", "cel-two")  # l40s-pcie-4 each: four 46068 MiB cards
SCHEDULER = "vgpu-dra-cel"
WEBHOOKED = "cel-webhooked"
ATTRS = f'device.attributes["{dra.DRIVER}"]'
BIG = "[" + ",".join("0" for _ in range(570)) + "]"

ALLOCATED, REFUSED = "allocated", "refused"
#: Selector -> what kube-scheduler 1.37 (cel-go v0.29) does with it.
CONFORMANCE: list[tuple[str, str]] = [
    ('"abc".charAt(-1) == "c"', REFUSED),  # the issue's: the engine allocated it
    ('"abc".charAt(3) == ""', ALLOCATED),
    ('"abc".charAt(4) == ""', REFUSED),
    ('"ß".upperAscii() == "ß"', ALLOCATED),  # the issue's: the engine refused it
    ('"\u212a".lowerAscii() == "\u212a"', ALLOCATED),
    ('"abc".substring(5) == ""', REFUSED),
    ('"abc".substring(2, 1) == ""', REFUSED),
    ('"abc".substring(3) == ""', ALLOCATED),
    ('"abc".indexOf("a", -1) == -1', REFUSED),
    ('"abc".indexOf("a", 9) == -1', ALLOCATED),
    ('"abc".lastIndexOf("c", 1) == -1', ALLOCATED),
    ('"abc".split("", 2) == ["a", "bc"]', ALLOCATED),
    ('" \\t x ".trim() == "x"', ALLOCATED),
    (f'{ATTRS}.productName.lowerAscii().contains("l40")', ALLOCATED),
    (f'["a100", "h100"].exists(t, {ATTRS}.productName.lowerAscii().contains(t))', REFUSED),
    (f'device.capacity["{dra.DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0', ALLOCATED),
    (f"{ATTRS}.missing == 1", REFUSED),
    ("(" * 20 + f'device.driver == "{dra.DRIVER}"' + ")" * 20, ALLOCATED),
]
#: What a refused pod's PodScheduled condition says, kube-scheduler's or the engine's.
REFUSAL_MARKERS = (
    "cannot allocate all claims",
    "CEL runtime error",
    "DeviceNotSelected",
    "make the selector cheaper",
)


@pytest.fixture(scope="module")
def plane(
    control_plane_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    work = tmp_path_factory.mktemp("dra-cel")
    machines = dict.fromkeys(NODES, "l40s-pcie-4")
    with dra_plane(control_plane_binaries, work, machines, split=4) as cp:
        yield cp


@pytest.fixture(scope="module")
def operator(
    plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorThread]:
    """The operator, its webhook called by the API server for pods of ``WEBHOOKED``."""
    namespace = "vgpu-dra-cel-config"
    plane.ensure_namespace(namespace)
    plane.ensure_namespace(WEBHOOKED)
    env.put_config_map(
        plane,
        namespace,
        env.config_text(SCHEDULER, "  gpuSchedulerPolicy: spread\n  nodeSchedulerPolicy: spread\n"),
    )
    pki = make_pki(tmp_path_factory.mktemp("cel-pki"))
    port = free_port()
    webhook = WebhookOptions(
        port=port, addr="127.0.0.1", certfile=pki.cert, pkeyfile=pki.key, cafile=pki.ca
    )
    with OperatorThread(
        env.options(plane, namespace, inventory_timeout_s=None, webhook=webhook)
    ) as running:
        env.register_pod_webhook(
            plane,
            "vgpu-test-cel",
            WEBHOOKED,
            f"https://127.0.0.1:{port}/{WEBHOOK_ID}",
            pki.ca.read_bytes(),
        )
        wait_for("the webhook to answer", lambda: webhook_answers(plane), 30)
        yield running


def webhook_answers(plane: ControlPlane) -> bool:
    """A dry-run GPU pod in the webhooked namespace: the API server calls our webhook."""
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"probe-{uuid.uuid4().hex[:6]}", "namespace": WEBHOOKED},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/x",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ]
        },
    }
    try:
        made = plane.create(f"/api/v1/namespaces/{WEBHOOKED}/pods?dryRun=All", probe)
    except AdminRequestError:
        return False
    # Routed to us: the webhook answered (a pod it never saw keeps default-scheduler).
    return bool(made["spec"].get("schedulerName") not in (None, "default-scheduler"))


def healthz(operator: OperatorThread) -> bool:
    server = operator.app.server
    assert server is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=10) as answer:
        return bool(answer.status == 200)


def fresh_namespace(plane: ControlPlane) -> str:
    return dra_env.fresh_namespace(plane, "cel")


def claim(plane: ControlPlane, namespace: str, name: str, selector: str) -> None:
    exactly = {
        "deviceClassName": dra.SHARED_CLASS,
        "capacity": {"requests": {"memory": "1Gi", "cores": "1"}},
        "selectors": [{"cel": {"expression": selector}}],
    }
    create_claim(plane, namespace, name, exactly)


def pod(plane: ControlPlane, namespace: str, name: str, claim_name: str, *, ours: bool) -> None:
    body = claim_pod(name, claim=claim_name, scheduler=SCHEDULER if ours else None)
    plane.create(f"/api/v1/namespaces/{namespace}/pods", body)


def outcome(plane: ControlPlane, namespace: str, name: str) -> str | None:
    """ALLOCATED once bound, REFUSED once its PodScheduled condition says a refusal."""
    bound, message = scheduling_news(plane, namespace, name)
    if bound:
        return ALLOCATED
    if message is not None and any(marker in message for marker in REFUSAL_MARKERS):
        return REFUSED
    return None


def test_kube_scheduler_and_the_engine_agree_on_each_selector(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    ns = fresh_namespace(plane)
    for n, (selector, _) in enumerate(CONFORMANCE):
        for allocator in ("kube", "engine"):
            claim(plane, ns, f"{allocator}-{n}", selector)
            pod(plane, ns, f"{allocator}-{n}", f"{allocator}-{n}", ours=allocator == "engine")
    disagreements = []
    for n, (selector, expected) in enumerate(CONFORMANCE):
        kube = wait_for(
            f"kube-scheduler on {selector!r}", lambda n=n: outcome(plane, ns, f"kube-{n}"), 90
        )
        engine = wait_for(
            f"the engine on {selector!r}", lambda n=n: outcome(plane, ns, f"engine-{n}"), 90
        )
        if (kube, engine) != (expected, expected):
            disagreements.append(f"{selector!r}: kube-scheduler {kube}, engine {engine}")
    assert disagreements == []


def test_while_100_slow_claims_wait_the_webhook_and_healthz_answer(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    ns = fresh_namespace(plane)
    count = 100
    # Ten distinct expressions (a verdict is cached per expression and device).
    slow = [f"{BIG}.all(x, {BIG}.all(y, true)) && {k} >= 0" for k in range(10)]
    for n in range(count):
        claim(plane, ns, f"slow-{n}", slow[n % len(slow)])
        pod(plane, ns, f"slow-{n}", f"slow-{n}", ours=True)
    cpu_started = time.process_time()
    answers = 0
    waiting = set(range(count))
    deadline = time.monotonic() + 600
    while waiting and time.monotonic() < deadline:
        # Each probe must be answered (within its own generous timeout) while they wait.
        assert healthz(operator)
        assert webhook_answers(plane)
        answers += 2
        for n in sorted(waiting):
            if outcome(plane, ns, f"slow-{n}") is not None:
                waiting.discard(n)
    assert waiting == set(), f"{len(waiting)} slow claims neither refused nor allocated"
    for n in range(count):
        obj = plane.get(f"/api/v1/namespaces/{ns}/pods/slow-{n}")
        assert not obj["spec"].get("nodeName")
        message = next(
            c["message"] for c in obj["status"]["conditions"] if c["type"] == "PodScheduled"
        )
        assert "make the selector cheaper" in message, message
    selectors = operator.app.running.selectors
    assert selectors is not None
    print(
        f"\n{count} slow claims ({len(slow)} expressions): evaluator CPU "
        f"{selectors.cpu_s:.2f} s ({selectors.cpu_s / len(slow):.3f} s per expression), "
        f"{selectors.evaluated} verdicts, test process CPU (operator thread included) "
        f"{time.process_time() - cpu_started:.2f} s, {answers} probes answered"
    )
