"""The operator is built complete: every part exists once it is constructed (nothing is
filled in by ``start``), and before start-up the webhook answers "not ready"."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from vgpu_operator.control.admission import NotReady, PodAdmission
from vgpu_operator.control.operator import Operator
from vgpu_operator.control.options import AutoscaleOptions, DefragOptions, OperatorOptions
from vgpu_operator.handlers.app import OperatorApp
from vgpu_operator.metrics import OperatorMetrics


def _webhook_answers(metrics: OperatorMetrics, result: str) -> float:
    value = metrics.registry.get_sample_value(
        "vgpu_operator_webhook_requests_total", {"result": result}
    )
    return value or 0.0


def _built(options: OperatorOptions, check: Any) -> None:
    """Build an operator over a client that is never used (no request is made)."""

    async def main() -> None:
        api = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))
        try:
            built = Operator(options, api, identity="test-1", priority=3, metrics=OperatorMetrics())
            await check(built)
            await built.selectors.close()
        finally:
            await api.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    "options",
    [
        OperatorOptions(standalone=True, metrics_port=None),
        OperatorOptions(
            standalone=False,
            metrics_port=0,
            defrag=DefragOptions(),
            autoscale=AutoscaleOptions(instance_types=Path("/nonexistent/instance-types.json")),
        ),
    ],
    ids=["standalone-bare", "peering-with-everything"],
)
def test_every_part_exists_once_constructed(options: OperatorOptions) -> None:
    optional = {"defrag": options.defrag, "autoscaler": options.autoscale}

    async def check(built: Operator) -> None:
        missing = [
            name
            for name, value in vars(built).items()
            if value is None and optional.get(name, "required") is not None
        ]
        assert missing == []
        assert (built.defrag is None) == (options.defrag is None)
        assert (built.autoscaler is None) == (options.autoscale is None)
        assert not built.started.is_set()
        assert not built.synced

    _built(options, check)


def test_a_built_operator_answers_the_webhook_before_it_starts() -> None:
    """Admission needs only the engine: a pod that asks for no GPU passes unchanged."""
    pod = {
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }

    async def check(built: Operator) -> None:
        answers = PodAdmission(lambda: built.state.admission_view, built.api, built.metrics)
        answer = await answers.admit_pod(pod)
        assert answer.allowed
        assert answer.pod is None
        assert _webhook_answers(built.metrics, "passed") == 1

    _built(OperatorOptions(standalone=True, metrics_port=None), check)


def test_before_start_up_the_webhook_lets_pods_through_and_says_not_ready() -> None:
    app = OperatorApp(OperatorOptions(metrics_port=None))
    pod = {"metadata": {"name": "p"}, "spec": {"containers": []}}
    answer = asyncio.run(NotReady(app.metrics).admit_pod(pod))
    assert answer.allowed
    assert answer.pod is None
    assert _webhook_answers(app.metrics, "not_ready") == 1
    assert not app.synced
    with pytest.raises(RuntimeError, match="not started"):
        _ = app.running
