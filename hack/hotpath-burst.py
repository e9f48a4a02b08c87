"""A small end-to-end burst for profiling the operator's hot path (issue 12).

Starts the test control plane (etcd, kube-apiserver, KWOK), N KWOK nodes with 8-GPU
DeviceInventories, M pending whole-GPU pods named for a scheduler the operator does not
serve yet, then the operator as a process (py-spy attached to it for the burst only,
with ``--py-spy``: collapsed stacks, summarised by package at the end). Once it is synced,
the device-config ConfigMap is switched to the pods' scheduler name, which puts every pod
in the queue at once; the burst ends when all are bound (watched from here).

Reports pods/s, the operator's CPU seconds per pod, its peak RSS, and the API server's
write counts by resource during the burst. Not a test: nothing is asserted but that every
pod ends bound on a card with room.

    .venv/bin/python hack/hotpath-burst.py --nodes 200 --pods 1000 [--py-spy out.txt]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from integration import operator_env as env  # noqa: E402

from vgpu_operator import names  # noqa: E402
from vgpu_operator.devices import nvidia  # noqa: E402
from vgpu_operator.testing.controlplane import ControlPlane  # noqa: E402

NS = "bench"
SCHEDULER = "vgpu-bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_nodes(cp: ControlPlane, count: int) -> None:
    def one(i: int) -> None:
        name = f"gpu-{i:05d}"
        env.gpu_node(cp, name, env.cards(f"{name}", 8, memory_mib=81920, split_count=10), group=NS)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))


#: What an unfittable pod asks for (--unfit-every): 1 TiB of one card, which no card has.
UNFIT_MIB = 1 << 20


def make_pods(
    cp: ControlPlane, count: int, gpus: int, gpumem: int | None, unfit_every: int = 0
) -> None:
    def one(i: int) -> None:
        unfit = unfit_every and i % unfit_every == unfit_every - 1
        name = f"u-{i:06d}" if unfit else f"p-{i:06d}"
        memory = UNFIT_MIB if unfit else gpumem
        pod = env.gpu_pod(NS, name, scheduler=SCHEDULER, group=NS, gpus=gpus, gpumem=memory)
        env.create_pod(cp, pod)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))


def make_bound_pods(cp: ControlPlane, count: int, nodes: int) -> None:
    """Pods already placed (as a restarted operator finds them): 4,000 MiB of one card
    each, spread over every node's cards."""

    def one(i: int) -> None:
        node = f"gpu-{i % nodes:05d}"
        card = f"GPU-{node}-{(i // nodes) % 8}"
        pod = env.gpu_pod(NS, f"b-{i:06d}", scheduler=SCHEDULER, group=NS, gpumem=4000)
        pod["spec"]["nodeName"] = node
        pod["metadata"]["annotations"] = {
            names.ASSIGNED_NODE: node,
            nvidia.ALLOCATED_ANNOTATION: f"{card},NVIDIA,4000,0:;",
            names.BIND_PHASE: "success",
        }
        env.create_pod(cp, pod)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))


class BoundWatch(threading.Thread):
    """Watches the namespace's pods and records when each one is first seen bound."""

    def __init__(self, cp: ControlPlane, version: str) -> None:
        super().__init__(daemon=True)
        self.cp = cp
        self.version = version
        self.bound: dict[str, float] = {}
        self.lock = threading.Lock()

    def run(self) -> None:
        ctx = ssl.create_default_context(cafile=str(self.cp.ca_path))
        creds = self.cp.admin
        ctx.load_cert_chain(str(creds.cert_path), str(creds.key_path))
        while True:
            url = (
                f"{self.cp.server}/api/v1/namespaces/{NS}/pods?watch=true"
                f"&resourceVersion={self.version}&timeoutSeconds=600"
            )
            with urllib.request.urlopen(url, context=ctx, timeout=700) as resp:
                for line in resp:
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    meta = obj.get("metadata") or {}
                    self.version = meta.get("resourceVersion") or self.version
                    placed = str(meta.get("name", "")).startswith("p-")
                    if placed and (obj.get("spec") or {}).get("nodeName"):
                        with self.lock:
                            self.bound.setdefault(meta["name"], time.time())


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def proc_rss_mib(pid: int) -> tuple[float, float]:
    text = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) / 1024  # type: ignore[union-attr]
    hwm = int(re.search(r"VmHWM:\s+(\d+)", text).group(1)) / 1024  # type: ignore[union-attr]
    return rss, hwm


def apiserver_writes(cp: ControlPlane) -> dict[str, float]:
    """apiserver_request_total for writes, by verb/resource/subresource."""
    ctx = ssl.create_default_context(cafile=str(cp.ca_path))
    creds = cp.admin
    ctx.load_cert_chain(str(creds.cert_path), str(creds.key_path))
    with urllib.request.urlopen(f"{cp.server}/metrics", context=ctx, timeout=30) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if labels.get("verb") not in ("POST", "PATCH", "PUT", "DELETE", "APPLY"):
            continue
        key = f"{labels['verb']} {labels.get('resource')}/{labels.get('subresource', '')}"
        out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--gpumem", type=int, default=None, help="fractional pods: MiB each")
    parser.add_argument(
        "--unfit-every",
        type=int,
        default=0,
        help="every N-th pod asks for 1 TiB of one card and cannot fit (0: none)",
    )
    parser.add_argument("--py-spy", default=None, help="write a py-spy profile here")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--out", default=None, help="append the result as JSON to this file")
    parser.add_argument("--label", default="")
    parser.add_argument("--bound", type=int, default=0, help="pods already placed at start")
    parser.add_argument("--operator-repo", default=str(REPO), help="whose .venv runs the operator")
    parser.add_argument("--operator-args", default="", help="more options for `run`")
    args = parser.parse_args()

    with ControlPlane(kwok=True) as cp:
        env.install_crd(cp)
        cp.ensure_namespace(NS)
        env.put_config_map(cp, NS, env.config_text("not-yet"))
        t = time.time()
        make_nodes(cp, args.nodes)
        print(f"{args.nodes} nodes in {time.time() - t:.1f}s", flush=True)
        if args.bound:
            t = time.time()
            make_bound_pods(cp, args.bound, args.nodes)
            print(f"{args.bound} bound pods in {time.time() - t:.1f}s", flush=True)
        t = time.time()
        make_pods(cp, args.pods, args.gpus, args.gpumem, args.unfit_every)
        unfit = args.pods // args.unfit_every if args.unfit_every else 0
        print(f"{args.pods} pods in {time.time() - t:.1f}s", flush=True)

        port = free_port()
        log_path = cp.workdir / "operator.log"
        argv = [
            str(Path(args.operator_repo) / ".venv/bin/vgpu-operator"),
            "run",
            "--standalone",
            "--kubeconfig",
            str(cp.kubeconfig_path),
            "--namespace",
            NS,
            "--config-map",
            env.CONFIG_MAP,
            "--metrics-port",
            str(port),
            "--log-format",
            "json",
            "--log-level",
            args.log_level,
            # KWOK nodes run no device plugin that would answer the allocation gate.
            "--allocation-gate",
            "off",
            *args.operator_args.split(),
        ]
        started = time.time()
        with log_path.open("w") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=cp.env())
        pid = proc.pid
        try:
            while "scheduling_active" not in log_path.read_text():
                if proc.poll() is not None:
                    print(log_path.read_text()[-3000:])
                    return 1
                time.sleep(0.2)
            synced_s = time.time() - started
            print(f"operator synced after {synced_s:.1f}s", flush=True)
            listed = cp.get(f"/api/v1/namespaces/{NS}/pods?limit=1")
            watch = BoundWatch(cp, listed["metadata"]["resourceVersion"])
            watch.start()
            writes_before = apiserver_writes(cp)
            spy = None
            if args.py_spy:
                # Attached for the burst only: startup and the final scrape are not in it.
                spy = subprocess.Popen(
                    [
                        str(REPO / ".venv/bin/py-spy"),
                        "record",
                        "--nonblocking",
                        "-r",
                        "100",
                        "-f",
                        "raw",
                        "-o",
                        args.py_spy,
                        "--pid",
                        str(pid),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(1.0)
            cpu_before = proc_cpu_s(pid)
            t0 = time.time()
            env.put_config_map(cp, NS, env.config_text(SCHEDULER))
            last = -1
            peak_rss = 0.0
            while True:
                with watch.lock:
                    n = len(watch.bound)
                rss, _ = proc_rss_mib(pid)
                peak_rss = max(peak_rss, rss)
                if n >= args.pods - unfit:
                    break
                if n == last and time.time() - t0 > 600:
                    print("stalled", n)
                    break
                last = n
                time.sleep(0.2)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=60)
            times = sorted(watch.bound.values())
            t_end = times[-1] if times else time.time()
            if unfit:
                # Unfit pods are told why in the background: their writes count too.
                time.sleep(2.0)
            cpu = proc_cpu_s(pid) - cpu_before
            writes = apiserver_writes(cp)
            delta = {
                k: v - writes_before.get(k, 0.0)
                for k, v in writes.items()
                if v - writes_before.get(k, 0.0) > 0
            }
            _, hwm = proc_rss_mib(pid)
            duration = t_end - t0
            # Steady part: from the 10th to the 90th percentile of bind times.
            lo, hi = times[len(times) // 10], times[(len(times) * 9) // 10]
            steady = (len(times) * 8 // 10) / (hi - lo) if hi > lo else float("nan")
            result = {
                "label": args.label,
                "bound_at_start": args.bound,
                "start_to_synced_s": round(synced_s, 2),
                "nodes": args.nodes,
                "pods": args.pods,
                "gpus": args.gpus,
                "gpumem": args.gpumem,
                "unfit": unfit,
                "bound": len(times),
                "first_bind_s": round(times[0] - t0, 3) if times else None,
                "duration_s": round(duration, 2),
                "pods_per_s": round(len(times) / duration, 1) if duration > 0 else None,
                "steady_pods_per_s": round(steady, 1),
                "cpu_s": round(cpu, 2),
                "cpu_ms_per_pod": round(1000 * cpu / max(1, len(times)), 2),
                "peak_rss_mib": round(max(peak_rss, hwm), 1),
                "writes": {k: int(v) for k, v in sorted(delta.items())},
            }
            result["operator_metrics"] = operator_metrics(port)
            check_overcommit(cp)
            print(json.dumps(result, indent=1), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(result) + "\n")
        finally:
            proc.terminate()
            if args.py_spy and Path(args.py_spy).exists():
                for name, share in profile_summary(args.py_spy):
                    print(f"{share:5.1f} %  {name}")
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
            (REPO / "build").mkdir(exist_ok=True)
            (REPO / "build" / "hotpath-operator.log").write_text(log_path.read_text())
    return 0


def operator_metrics(port: int) -> dict[str, float]:
    """Means of the operator's own histograms (decision, Binding) over the run."""
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("decision_duration_seconds", "bind_duration_seconds"):
            for part in ("sum", "count"):
                if line.startswith(f"vgpu_operator_{name}_{part} "):
                    values[f"{name}_{part}"] = float(line.split()[1])
    out = {}
    for name in ("decision_duration_seconds", "bind_duration_seconds"):
        count = values.get(f"{name}_count", 0.0)
        if count:
            out[f"{name.split('_')[0]}_mean_ms"] = round(1000 * values[f"{name}_sum"] / count, 2)
    return out


#: Where the operator's time goes: a sample counts for every group its stack touches.
PROFILE_GROUPS = {
    "Kopf": r"kopf/",
    "engine (scheduling/)": r"vgpu_operator/scheduling/",
    "feed (control/feed, pod_facts, versions)": r"vgpu_operator/control/(feed|pod_facts|versions)",
    "watch loops (control/watching)": r"vgpu_operator/control/watching",
    "aiohttp": r"aiohttp/",
    "generated client (kubernetes_asyncio)": r"kubernetes_asyncio/",
    "executor threads": r"threading\.py|concurrent/futures",
    "netrc / proxy lookups": r"netrc|getproxies|proxy_bypass",
    "JSON": r"json/",
    "deepcopy": r"copy\.py",
    "logging": r"structlog/|logging/",
    "Events (reporting, kube/events)": r"vgpu_operator/(control/reporting|kube/events)",
    "metrics (prometheus_client)": r"prometheus_client",
}


def profile_summary(path: str) -> list[tuple[str, float]]:
    """Shares of py-spy's samples (raw, collapsed stacks) per group of PROFILE_GROUPS."""
    total = 0
    counts = dict.fromkeys(PROFILE_GROUPS, 0)
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            if not stack:
                continue
            total += int(n)
            for name, pattern in PROFILE_GROUPS.items():
                if re.search(pattern, stack):
                    counts[name] += int(n)
    return sorted(((k, 100 * v / max(1, total)) for k, v in counts.items()), key=lambda x: -x[1])


def check_overcommit(cp: ControlPlane) -> None:
    pods = cp.get(f"/api/v1/namespaces/{NS}/pods").get("items", [])
    usage = env.usage_by_card(pods)
    over = {card: u for card, u in usage.items() if u[1] > 81920 or u[0] > 10 or u[2] > 100}
    unbound = [p["metadata"]["name"] for p in pods if not (p.get("spec") or {}).get("nodeName")]
    print(f"check: {len(pods)} pods, {len(unbound)} unbound, {len(over)} cards over-committed")


if __name__ == "__main__":
    sys.exit(main())
