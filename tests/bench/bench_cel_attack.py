"""Probe and admission latencies while a tenant's costly selectors are evaluated (issue 44).

On a local control plane (kube-apiserver, etcd, kwok), the operator with its webhook on
loopback, one DRA node of four L40S cards (its ResourceSlice written directly) and one
device-plugin node for another namespace's GPU pods. Three phases, each measuring
``/healthz`` (``--probes`` requests) and the webhook (``--admissions`` dry-run creations
of a GPU pod in the other namespace, each answered by the webhook and routed):

- ``quiet``: nothing else happens;
- ``grow``: 4 claims of 32 selectors that grow a string (the issue's, 357 characters,
  accepted by the API server), with their pods, made at the start of the phase; the
  phase also times until every such pod is refused (``refused_s``);
- ``slow``: the same with selectors that run the evaluator to its step budget (about half
  a second of CPU each: the evaluator stays busy while the probes run).

Reports, asserts nothing. Run (after ``make dev`` and the control-plane binaries):
``PYTHONSAFEPATH=1 .venv/bin/python tests/bench/bench_cel_attack.py``; the figures of a
run are in docs/benchmarks.md with the machine's load.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
for path in (TESTS, TESTS / "integration"):
    if str(path) not in sys.path:
        sys.path.append(str(path))

from integration import dra_env  # noqa: E402
from integration import operator_env as env  # noqa: E402
from integration.test_operator_webhook import _free_port, make_pki  # noqa: E402

from vgpu_operator.control.options import WebhookOptions  # noqa: E402
from vgpu_operator.devices import dra  # noqa: E402
from vgpu_operator.handlers.app import WEBHOOK_ID  # noqa: E402
from vgpu_operator.handlers.runtime import OperatorThread  # noqa: E402
from vgpu_operator.testing.binaries import find_binaries  # noqa: E402
from vgpu_operator.testing.controlplane import ControlPlane  # noqa: E402

A100 = "a" * 100
BIG = "[" + ",".join("0" for _ in range(570)) + "]"
CLAIMS, SELECTORS = 4, 32


def growing(n: int) -> str:
    return f'"{A100}".replace("a", "{A100}").replace("a", "{A100}").split("").size() > {n}'


def slow(n: int) -> str:
    return f"{n} < 0 || {BIG}.all(x, {BIG}.all(y, true))"


def _stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "n": len(ordered),
        "p50_ms": round(1000 * statistics.median(ordered), 1),
        "p99_ms": round(1000 * p99, 1),
        "max_ms": round(1000 * ordered[-1], 1),
    }


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


class Bench:
    def __init__(self, cp: ControlPlane, work: Path) -> None:
        self.cp = cp
        self.claims_ns = env.unique("attacker")
        self.other_ns = env.unique("neighbour")
        for namespace in (self.claims_ns, self.other_ns):
            cp.ensure_namespace(namespace)
        env.install_crd(cp)
        self.scheduler = env.new_scheduler(cp, self.claims_ns)
        for device_class in dra.device_classes():
            env.create_unless_present(cp, dra_env.RESOURCE + "/deviceclasses", device_class)
        self.dra_node = f"{self.claims_ns}-dra"
        cp.create_fake_gpu_node(self.dra_node, gpus=0, labels={dra.NODE_PATH_LABEL: dra.PATH_DRA})
        cards = [
            dra.CardShape(f"GPU-{i}", i, "L40S", "NVIDIA-L40S", 46068, 100, 4, "hami-core")
            for i in range(4)
        ]
        published = copy.deepcopy(dict(dra.slice_wire(self.dra_node, cards, 1, None)))
        cp.create(dra_env.RESOURCE + "/resourceslices", published)
        gpu_node = f"{self.other_ns}-gpu"
        env.gpu_node(cp, gpu_node, env.cards(gpu_node, 4), group=self.other_ns)
        pki = make_pki(work)
        port = _free_port()
        webhook = WebhookOptions(
            port=port, addr="127.0.0.1", certfile=pki.cert, pkeyfile=pki.key, cafile=pki.ca
        )
        self.operator = OperatorThread(env.options(cp, self.claims_ns, webhook=webhook)).start()
        env.register_pod_webhook(
            cp,
            f"bench-{self.other_ns}",
            self.other_ns,
            f"https://127.0.0.1:{port}/{WEBHOOK_ID}",
            pki.ca.read_bytes(),
        )
        self.gpu_pod = env.plain_pod(self.other_ns, "neighbour", {"nvidia.com/gpu": "1"})
        env.wait_until("the webhook to route", lambda: self._admit() == self.scheduler, 60)

    def _admit(self) -> str | None:
        path = f"/api/v1/namespaces/{self.other_ns}/pods?dryRun=All"
        try:
            created = self.cp.create(path, self.gpu_pod)
        except Exception:
            return None
        return str(created["spec"].get("schedulerName"))

    def _admit_routed(self) -> None:
        routed = self._admit()
        if routed != self.scheduler:
            raise RuntimeError(f"the webhook answered schedulerName {routed!r}")

    def _healthz(self) -> None:
        server = self.operator.app.server
        assert server is not None
        url = f"http://127.0.0.1:{server.port}/healthz"
        with urllib.request.urlopen(url, timeout=60) as answer:
            assert answer.status == 200

    def _attack(self, prefix: str, expression: Callable[[int], str]) -> None:
        for c in range(CLAIMS):
            selectors = [
                {"cel": {"expression": expression(c * SELECTORS + s)}} for s in range(SELECTORS)
            ]
            exactly = {"deviceClassName": dra.SHARED_CLASS, "selectors": selectors}
            dra_env.create_claim(self.cp, self.claims_ns, f"{prefix}-{c}", exactly)
            pod = dra_env.claim_pod(
                f"{prefix}-{c}", claim=f"{prefix}-{c}", scheduler=self.scheduler, node=self.dra_node
            )
            env.create_pod(
                self.cp, {**pod, "metadata": {**pod["metadata"], "namespace": self.claims_ns}}
            )

    def _refused(self, prefix: str) -> bool:
        for c in range(CLAIMS):
            pod = env.get_pod(self.cp, self.claims_ns, f"{prefix}-{c}")
            condition = env.condition(pod) or {}
            message = str(condition.get("message", ""))
            if not message or "evaluation pending" in message or "does not exist" in message:
                return False
        return True

    def phase(
        self, name: str, probes: int, admissions: int, attack: Callable[[int], str] | None
    ) -> dict[str, Any]:
        selectors = self.operator.app.running.selectors
        cpu_before = selectors.cpu_s
        started = time.perf_counter()
        if attack is not None:
            self._attack(name, attack)
        health, admission, busy_seen = [], [], 0
        for i in range(max(probes, admissions)):
            busy_seen += selectors.busy()
            if i < probes:
                health.append(_timed(self._healthz))
            if i < admissions:
                admission.append(_timed(self._admit_routed))
        row: dict[str, Any] = {
            "phase": name,
            "healthz": _stats(health),
            "admission": _stats(admission),
            "evaluator_busy_at_probes": busy_seen,
        }
        if attack is not None:
            env.wait_until(f"the {name} pods' refusals", lambda: self._refused(name), 600)
            row["refused_s"] = round(time.perf_counter() - started, 2)
        row["evaluator_cpu_s"] = round(selectors.cpu_s - cpu_before, 2)
        return row

    def close(self) -> None:
        self.operator.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--admissions", type=int, default=50)
    args = parser.parse_args()
    rows = []
    cpu_started = time.process_time()
    with (
        tempfile.TemporaryDirectory() as work,
        ControlPlane(kwok=True, binaries=find_binaries(need_kwok=True)) as cp,
    ):
        bench = Bench(cp, Path(work))
        try:
            for name, attack in (("quiet", None), ("grow", growing), ("slow", slow)):
                rows.append(bench.phase(name, args.probes, args.admissions, attack))
        finally:
            bench.close()
    report = {
        "load_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "bench_process_cpu_s": round(time.process_time() - cpu_started, 1),
        "phases": rows,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
