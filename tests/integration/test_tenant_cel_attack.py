"""Issue 44's first aim, as a hostile tenant with the built-in ``edit`` role, on the install
of ``manifests/`` (the stack of ``test_tenant_attacks``): 4 claims of 32 selectors that
grow a string (a 100-character literal replaced twice a hundredfold, then ``split("")``),
each accepted by the API server, used to freeze the operator's one event loop for minutes.

What must hold: ``/healthz`` answers while they are evaluated, another tenant's GPU pod is
admitted, routed to the operator and bound meanwhile, and the selector claims are refused
with a sentence naming the selector. "Meanwhile" is made certain, not timed: the CEL
evaluator process is stopped (SIGSTOP) before the claims are made, so their evaluation is
in flight (the pods say "selector evaluation pending") for as long as the test looks, and
only then let go. The answers' times are recorded and printed, and held to a bound no
loaded machine misses (the figures themselves come from tests/bench/bench_cel_attack.py).
A second test blocks the scheduling loop itself (a decision that does not end) and
shows that the webhook and the probes answer all the same.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from integration import operator_env as env
from integration import test_tenant_attacks as attacks
from integration.test_tenant_attacks import (
    SCHEDULER,
    Stack,
    Tenant,
    claim_body,
    claim_pod,
    claim_spec,
    claims_path,
    gpu_pod,
    make_tenant,
)

# The stack of test_tenant_attacks (this module builds its own: module scope).
stack = attacks.stack
dra_node = attacks.dra_node
claims_tenant = attacks.claims_tenant

A100 = "a" * 100
CLAIMS = 4
SELECTORS = 32
#: No answer of a probe or the webhook takes this long on a loaded machine unless it
#: waits for the scheduling work (the aim is 1 s: the bench measures it).
GENEROUS_S = 10.0


def growing(n: int) -> str:
    """The issue's selector (357 characters), made distinct by its bound."""
    return f'"{A100}".replace("a", "{A100}").replace("a", "{A100}").split("").size() > {n}'


def _get(stack: Stack, path: str) -> tuple[int, float]:
    server = stack.operator.app.server
    assert server is not None
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=60) as answer:
        answer.read()
        return int(answer.status), time.perf_counter() - started


def _pod_message(stack: Stack, namespace: str, name: str) -> str | None:
    pod = env.get_pod(stack.cp, namespace, name)
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message", ""))
    return None


@pytest.fixture
def other_tenant(stack: Stack) -> Iterator[Tenant]:
    tenant = make_tenant(stack.cp, f"other-{uuid.uuid4().hex[:6]}")
    yield tenant
    attacks._delete_all_pods(stack.cp, tenant.namespace)


@contextlib.contextmanager
def evaluator_stopped(stack: Stack) -> Iterator[int]:
    """The CEL evaluator process stopped (its pid), with a deadline long enough that a
    stopped child is not taken for a slow selector; let go on exit."""
    selectors = stack.operator.app.running.selectors
    pid = env.wait_until("the CEL evaluator to run", lambda: selectors.child_pid, 60)
    saved = selectors.deadline_s
    selectors.deadline_s = 600.0
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGCONT)
        selectors.deadline_s = saved


def _warm_the_evaluator(stack: Stack, tenant: Tenant, node: str) -> None:
    """A claim whose selector is of no inline shape starts the evaluator process."""
    spec = claim_spec(1024, card=None)
    expression = 'device.attributes["gpu.vgpu-operator.io"].productName.matches("L40")'
    spec["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": expression}}]
    tenant.request("POST", claims_path(tenant), claim_body("warm", spec))
    tenant.create_pod(claim_pod("warm", "warm", node))
    selectors = stack.operator.app.running.selectors
    env.wait_until("the evaluator's first verdict", lambda: selectors.evaluated > 0, 60)


def test_16_string_growing_selectors_delay_no_probe_and_no_other_tenants_pod(
    stack: Stack, claims_tenant: Tenant, dra_node: str, other_tenant: Tenant
) -> None:
    tenant = claims_tenant
    _warm_the_evaluator(stack, tenant, dra_node)
    selectors = stack.operator.app.running.selectors
    health_s: list[float] = []
    with evaluator_stopped(stack):
        for c in range(CLAIMS):
            spec = claim_spec(1024, card=None)
            spec["devices"]["requests"][0]["exactly"]["selectors"] = [
                {"cel": {"expression": growing(c * SELECTORS + s)}} for s in range(SELECTORS)
            ]
            tenant.request("POST", claims_path(tenant), claim_body(f"grow-{c}", spec))
            tenant.create_pod(claim_pod(f"grow-{c}", f"grow-{c}", dra_node))

        def all_pending() -> bool:
            messages = [_pod_message(stack, tenant.namespace, f"grow-{c}") for c in range(CLAIMS)]
            return all(m is not None and "evaluation pending" in m for m in messages)

        env.wait_until("the selector claims to wait for their verdicts", all_pending, 120)
        assert selectors.busy()
        # Evaluation in flight (the evaluator is stopped): probes and the other tenant.
        for _ in range(10):
            status, took = _get(stack, "/healthz")
            assert status == 200
            health_s.append(took)
        started = time.perf_counter()
        created = other_tenant.create_pod(gpu_pod("neighbour", node=stack.main.name, gpumem=1024))
        admission_s = time.perf_counter() - started
        assert created["spec"]["schedulerName"] == SCHEDULER  # routed to the operator

        def bound() -> bool:
            pod = env.get_pod(stack.cp, other_tenant.namespace, "neighbour")
            return bool(pod["spec"].get("nodeName"))

        env.wait_until("the other tenant's pod to be bound", bound, 120)
        # Still in flight: all of the above happened while the selectors were evaluated.
        assert selectors.busy()
        assert all_pending()
    print(
        f"healthz {max(health_s):.3f} s at most ({len(health_s)} probes), "
        f"admission {admission_s:.3f} s, with {CLAIMS}x{SELECTORS} selectors in flight"
    )
    assert max(health_s) < GENEROUS_S
    assert admission_s < GENEROUS_S

    def refused(c: int) -> str | None:
        message = _pod_message(stack, tenant.namespace, f"grow-{c}")
        return None if message is None or "evaluation pending" in message else message

    for c in range(CLAIMS):
        message = env.wait_until(f"grow-{c}'s refusal", lambda c=c: refused(c), 120)
        assert f"ResourceClaim {tenant.namespace}/grow-{c}, request 'gpu'" in message
        assert "selectors[0]" in message
        assert "ran out of its budget at replace" in message
        assert "make the selector cheaper" in message
        claim = stack.cp.get(f"{claims_path(tenant)}/grow-{c}")
        assert not (claim.get("status") or {}).get("allocation")


def test_17_a_scheduling_loop_that_does_not_turn_delays_no_probe_and_no_admission(
    stack: Stack, other_tenant: Tenant
) -> None:
    """A decision that does not end (here: the scheduling loop blocked on purpose) keeps
    no probe and no admission waiting: they are served on a loop of their own."""
    loop = stack.operator.app.scheduling_loop
    assert loop is not None
    entered, release = threading.Event(), threading.Event()

    def stuck() -> None:
        entered.set()
        release.wait(120)

    loop.call_soon_threadsafe(stuck)
    try:
        assert entered.wait(60)
        answers: list[tuple[str, Any]] = []
        for path in ("/healthz", "/readyz", "/metrics"):
            answers.append((path, _get(stack, path)[0]))
        pod = other_tenant.create_pod(gpu_pod("while-stuck", node=stack.main.name, gpumem=1024))
        answers.append(("admission", pod["spec"]["schedulerName"]))
        blocked_throughout = not release.is_set()
    finally:
        release.set()
    assert blocked_throughout
    assert answers == [
        ("/healthz", 200),
        ("/readyz", 200),
        ("/metrics", 200),
        ("admission", SCHEDULER),
    ]
