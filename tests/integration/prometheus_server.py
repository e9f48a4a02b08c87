"""A real Prometheus server for tests: static scrape targets on loopback, its HTTP API.

Started with a config of its own in a temporary directory, stopped (and its data gone)
on exit. ``query`` answers an instant query, raising ``QueryError`` when Prometheus
refuses it (a bad expression, an unknown function), so a test can tell an error from an
empty answer.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vgpu_operator.testing.processes import free_port


class QueryError(Exception):
    """Prometheus answered the query with an error."""


@dataclass(frozen=True)
class Target:
    """One scrape target: ``127.0.0.1:port`` with extra target labels."""

    port: int
    labels: Mapping[str, str] = field(default_factory=dict)


class PrometheusServer:
    """``prometheus`` scraping ``jobs`` (job name -> targets) every ``interval_s``."""

    def __init__(
        self,
        binary: Path,
        workdir: Path,
        jobs: Mapping[str, Sequence[Target]],
        interval_s: int = 1,
    ) -> None:
        self._binary = binary
        self._workdir = workdir
        self.port = free_port()
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        config = {
            "global": {
                "scrape_interval": f"{interval_s}s",
                "evaluation_interval": f"{interval_s}s",
            },
            "scrape_configs": [
                {
                    "job_name": job,
                    # As the chart's ServiceMonitors: the exported namespace, pod and
                    # container labels stay as they are (not exported_namespace...).
                    "honor_labels": True,
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{t.port}"], "labels": dict(t.labels)}
                        for t in targets
                    ],
                }
                for job, targets in jobs.items()
            ],
        }
        self._config = workdir / "prometheus.yml"
        self._log = workdir / "prometheus.log"
        self._process: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)
        self._config.write_text(yaml.safe_dump(config))

    def __enter__(self) -> PrometheusServer:
        with self._log.open("wb") as log:
            self._process = subprocess.Popen(
                [
                    str(self._binary),
                    f"--config.file={self._config}",
                    f"--storage.tsdb.path={self._workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait_ready(60)
        return self

    def __exit__(self, *exc: object) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])

    def _get(self, path: str, params: Sequence[tuple[str, str]] = ()) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with self._opener.open(url, timeout=30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            body = exc.read().decode(errors="replace")
            exc.close()
            try:
                answer = json.loads(body)
            except ValueError:
                raise QueryError(f"HTTP {exc.code}: {body}") from None
            raise QueryError(f"{answer.get('errorType')}: {answer.get('error')}") from None

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{self.log_tail()}")
            try:
                with self._opener.open(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready after {timeout_s:.0f}s:\n{self.log_tail()}")

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result (vector or scalar as a one-element list)."""
        answer = self._get("/api/v1/query", [("query", expr)])
        if answer.get("status") != "success":
            raise QueryError(str(answer.get("error")))
        data = answer["data"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def label_values(self, label: str, metric: str) -> list[str]:
        """Grafana's ``label_values(metric, label)``, through the same API it uses."""
        answer = self._get(f"/api/v1/label/{label}/values", [("match[]", metric)])
        values: list[str] = answer["data"]
        return values

    def targets_up(self) -> dict[str, int]:
        """Per job, how many of its targets answered the last scrape."""
        return {
            sample["metric"]["job"]: int(float(sample["value"][1]))
            for sample in self.query("sum by (job) (up)")
        }
