"""Metric names and values, including the per-device figures read at scrape time."""

from __future__ import annotations

import asyncio

from vgpu_operator.metrics import OperatorMetrics, PreemptionResult, Result, WebhookResult
from vgpu_operator.metrics.autoscale import ClaimEvent
from vgpu_operator.scheduling.cycle.cluster import DeviceUsageRow

ROW = DeviceUsageRow("n1", "GPU-0", "NVIDIA", "A100", 2, 10, 3000, 40960, 50, 100)


def test_attempts_are_counted_by_result() -> None:
    metrics = OperatorMetrics()
    metrics.attempt(Result.SCHEDULED)
    metrics.attempt(Result.SCHEDULED)
    metrics.attempt(Result.UNSCHEDULABLE)
    get = metrics.registry.get_sample_value
    assert get("vgpu_operator_scheduling_attempts_total", {"result": "scheduled"}) == 2
    assert get("vgpu_operator_scheduling_attempts_total", {"result": "unschedulable"}) == 1
    assert get("vgpu_operator_scheduling_attempts_total", {"result": "error"}) == 0


def test_durations() -> None:
    metrics = OperatorMetrics()
    metrics.decided(0.002)
    metrics.bind_finished(0.01)
    get = metrics.registry.get_sample_value
    assert get("vgpu_operator_decision_duration_seconds_count") == 1
    assert get("vgpu_operator_bind_duration_seconds_sum") == 0.01


def test_queues_reasons_and_stranded_memory_are_read_at_scrape_time() -> None:
    metrics = OperatorMetrics()
    queues = {"active": 4, "backoff": 2, "unschedulable": 3}
    reasons = {"CardInsufficientMemory": 2, "NodeUntoleratedTaint": 1, "made-up": 9}
    stranded = {"n1": 4096, "n2": 0}
    metrics.read_state_from(
        list, dict, waiting=lambda: (queues, reasons), stranded=lambda: stranded
    )
    get = metrics.registry.get_sample_value
    assert get("vgpu_operator_pending_pods", {"queue": "backoff"}) == 2
    assert get("vgpu_operator_unschedulable_pods", {"reason": "CardInsufficientMemory"}) == 2
    # Every known reason has its series (0 when no pod names it); nothing else is a label.
    assert get("vgpu_operator_unschedulable_pods", {"reason": "CardTypeMismatch"}) == 0
    assert get("vgpu_operator_unschedulable_pods", {"reason": "AdmissionRejected"}) == 0
    assert get("vgpu_operator_unschedulable_pods", {"reason": "made-up"}) is None
    assert get("vgpu_operator_stranded_memory_bytes", {"node": "n1"}) == 4096 * 1024 * 1024
    assert get("vgpu_operator_stranded_memory_bytes", {"node": "n2"}) == 0
    queues["active"] = 0
    assert get("vgpu_operator_pending_pods", {"queue": "active"}) == 0


def test_preemptions_by_result_and_victims_per_preemption() -> None:
    metrics = OperatorMetrics()
    metrics.preemption(PreemptionResult.EVICTED, 3)
    metrics.preemption(PreemptionResult.REFUSED, 1)
    get = metrics.registry.get_sample_value
    assert get("vgpu_operator_preemption_attempts_total", {"result": "evicted"}) == 1
    assert get("vgpu_operator_preemption_attempts_total", {"result": "refused"}) == 1
    assert get("vgpu_operator_preemption_attempts_total", {"result": "error"}) == 0
    assert get("vgpu_operator_preemption_victims_count") == 2
    assert get("vgpu_operator_preemption_victims_bucket", {"le": "2.0"}) == 1
    assert get("vgpu_operator_preemption_victims_bucket", {"le": "4.0"}) == 2


def test_device_and_quota_figures_are_read_at_scrape_time() -> None:
    metrics = OperatorMetrics()
    rows = [ROW]
    quotas = {"team-a": {"limits.nvidia.com/gpumem": (3000, 10000)}}
    metrics.read_state_from(lambda: rows, lambda: quotas)
    labels = {"node": "n1", "device": "GPU-0", "vendor": "NVIDIA", "type": "A100"}
    get = metrics.registry.get_sample_value
    assert get("vgpu_operator_device_memory_allocated_bytes", labels) == 3000 * 1024 * 1024
    assert get("vgpu_operator_device_memory_capacity_bytes", labels) == 40960 * 1024 * 1024
    assert get("vgpu_operator_device_cores_allocated_ratio", labels) == 0.5
    assert get("vgpu_operator_device_shares_allocated", labels) == 2
    assert get("vgpu_operator_device_shares_capacity", labels) == 10
    quota_labels = {"namespace": "team-a", "resource": "limits.nvidia.com/gpumem"}
    assert get("vgpu_operator_quota_used", quota_labels) == 3000
    assert get("vgpu_operator_quota_limit", quota_labels) == 10000
    rows.clear()
    assert get("vgpu_operator_device_memory_allocated_bytes", labels) is None


def test_exposition_is_text_format() -> None:
    body, content_type = OperatorMetrics().render()
    assert content_type.startswith("text/plain")
    assert b"vgpu_operator_scheduling_attempts_total" in body


def test_an_unlimited_quota_resource_exports_no_limit_series() -> None:
    # The engine reports "no limit" as 0: a limit series of 0 would make every
    # `used > limit` alert fire for namespaces that have no limit at all.
    metrics = OperatorMetrics()
    quotas = {"team-a": {"limits.nvidia.com/gpumem": (3000, 0)}}
    metrics.read_state_from(list, lambda: quotas)
    labels = {"namespace": "team-a", "resource": "limits.nvidia.com/gpumem"}
    get = metrics.registry.get_sample_value
    assert get("vgpu_operator_quota_used", labels) == 3000
    assert get("vgpu_operator_quota_limit", labels) is None


def test_webhook_answers_latency_api_errors_and_process_figures() -> None:
    metrics = OperatorMetrics()
    metrics.webhook_answered(WebhookResult.DENIED, 0.001)
    metrics.webhook_answered(WebhookResult.MUTATED, 0.002)
    metrics.bound_after(1.5)
    metrics.api_error("bind")
    get = metrics.registry.get_sample_value
    assert get("vgpu_operator_webhook_requests_total", {"result": "denied"}) == 1
    assert get("vgpu_operator_webhook_requests_total", {"result": "passed"}) == 0
    assert get("vgpu_operator_webhook_duration_seconds_count") == 2
    assert get("vgpu_operator_pod_create_to_bound_seconds_bucket", {"le": "2.5"}) == 1
    assert get("vgpu_operator_pod_create_to_bound_seconds_bucket", {"le": "1.0"}) == 0
    assert get("vgpu_operator_api_errors_total", {"operation": "bind"}) == 1
    assert get("vgpu_operator_api_errors_total", {"operation": "pod_watch"}) == 0
    assert get("process_cpu_seconds_total") is not None


def test_a_scrape_formats_a_copy_while_the_loop_goes_on() -> None:
    """The books are read once, on the loop, when the scrape starts; formatting them
    (thousands of cards) runs beside the loop, which keeps deciding meanwhile."""
    metrics = OperatorMetrics()
    rows = [
        DeviceUsageRow(f"n{i}", f"GPU-{i}", "NVIDIA", "A100", 1, 10, 1000, 40960, 5, 100)
        for i in range(20_000)
    ]
    metrics.read_state_from(lambda: rows, dict)

    async def scrape_while_ticking() -> tuple[bytes, int]:
        ticks = 0
        done = asyncio.Event()

        async def tick() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0)
        scrape = asyncio.create_task(metrics.render_beside_the_loop())
        await asyncio.sleep(0)  # the scrape has taken its copy
        rows.clear()  # the books change while the copy is formatted
        before = ticks
        body, _content_type = await scrape
        done.set()
        await ticker
        return body, ticks - before

    body, ticks_during = asyncio.run(scrape_while_ticking())
    assert body.count(b"vgpu_operator_device_shares_capacity{") == 20_000
    assert ticks_during > 0
    assert metrics.render()[0].count(b"vgpu_operator_device_shares_capacity{") == 0


def _engine_section(body: bytes) -> bytes:
    """The engine's families: from the first per-card one to the end of the text."""
    return body[body.index(b"# HELP vgpu_operator_device_") :]


def test_the_scrape_text_equals_the_generic_formatter_as_cards_change() -> None:
    """/metrics writes the per-card lines itself and keeps unchanged cards' lines between
    scrapes; what it serves must be what prometheus_client writes for the same books,
    hostile label values included, after cards change, appear and go."""
    metrics = OperatorMetrics()
    rows = [
        ROW,
        DeviceUsageRow('n"2', "GPU\\1", "NVIDIA", "A100\nfake 1", 0, 10, 0, 81920, 0, 100),
        DeviceUsageRow("ノード", "GPU-3", "", "", 10, 10, 81920, 81920, 100, 100),
        DeviceUsageRow("n4", "GPU-4", "NVIDIA", "T4", 1, 4, 1, 2**40, 33, 300),
    ]
    quotas = {"team-a": {"limits.nvidia.com/gpumem": (3000, 10000)}}
    waiting = ({"active": 1, "backoff": 0, "unschedulable": 2}, {"CardCordoned": 2})
    metrics.read_state_from(
        lambda: rows, lambda: quotas, waiting=lambda: waiting, stranded=lambda: {'n"2': 81920}
    )

    def scrape() -> bytes:
        return asyncio.run(metrics.render_beside_the_loop())[0]

    assert _engine_section(scrape()) == _engine_section(metrics.render()[0])
    rows[0] = DeviceUsageRow("n1", "GPU-0", "NVIDIA", "A100", 3, 10, 4000, 40960, 60, 100)
    rows[1] = DeviceUsageRow('n"2', "GPU\\1", "NVIDIA", "A100\nfake 2", 0, 10, 0, 81920, 0, 100)
    del rows[3]
    rows.append(DeviceUsageRow("n5", "GPU-5", "NVIDIA", "H100", 0, 7, 0, 81559, 0, 100))
    after = scrape()
    assert _engine_section(after) == _engine_section(metrics.render()[0])
    assert b'vgpu_operator_device_shares_allocated{device="GPU-0",node="n1"' in after
    assert b"GPU-4" not in after
    assert b'type="A100\\nfake 2"' in after
    assert b"fake 1" not in after


def test_what_the_fragmentation_policy_has_learned_is_a_gauge_of_few_series() -> None:
    """Issue 44: no metric showed what the fragmentation policy had learned."""
    from vgpu_operator.scheduling.policies import fragmentation

    mix = fragmentation.WorkloadMix(refresh_every=16)
    for _ in range(400):  # a workload of fifth-of-a-card shares
        mix.observe(("NVIDIA", 1, 0, 20, 20, 2.0, 8.0 * 2**30, ()))
    learned = fragmentation.learned_shares(mix.classes)
    assert len(learned) <= 48
    assert abs(sum(learned.values()) - 1.0) < 1e-9
    top = max(learned, key=lambda labels: learned[labels])
    assert top == ("NVIDIA", "1", "20%", "20")
    metrics = OperatorMetrics()
    metrics.read_state_from(list, dict, learned=lambda: learned)
    text = metrics.render()[0].decode()
    line = (
        'vgpu_operator_fragmentation_learned_share{cards="1",cores="20",memory="20%",'
        'vendor="NVIDIA"}'
    )
    assert line in text
    shapes = [s for s in text.splitlines() if s.startswith("vgpu_operator_fragmentation_learned")]
    assert len(shapes) == len(learned)


def test_the_autoscalers_series_exist_at_zero_and_follow_its_rounds() -> None:
    metrics = OperatorMetrics()
    autoscale = metrics.autoscale()
    assert metrics.autoscale() is autoscale  # registered once
    get = metrics.registry.get_sample_value
    assert get("vgpu_operator_autoscale_rounds_total", {"result": "planned"}) == 0
    assert get("vgpu_operator_autoscale_claims_total", {"event": "withdrawn"}) == 0
    autoscale.planned(0.03, unplaceable_pods=2)
    autoscale.in_flight([("gpu-8xh100", 98.32), ("gpu-4xl40s", 12.0), ("gpu-4xl40s", 12.0)])
    autoscale.claim(ClaimEvent.CREATED)
    assert get("vgpu_operator_autoscale_rounds_total", {"result": "planned"}) == 1
    assert get("vgpu_operator_autoscale_search_cpu_seconds_sum") == 0.03
    assert get("vgpu_operator_autoscale_unplaceable_pods") == 2
    assert get("vgpu_operator_autoscale_planned_nodes", {"instance_type": "gpu-4xl40s"}) == 2
    assert get("vgpu_operator_autoscale_planned_price_per_hour") == 98.32 + 24.0
    assert get("vgpu_operator_autoscale_claims_total", {"event": "created"}) == 1
    # The claims arrived: every type goes back to 0, none is left at its last count.
    autoscale.round_idle()
    autoscale.in_flight(())
    assert get("vgpu_operator_autoscale_planned_nodes", {"instance_type": "gpu-4xl40s"}) == 0
    assert get("vgpu_operator_autoscale_planned_nodes", {"instance_type": "gpu-8xh100"}) == 0
    assert get("vgpu_operator_autoscale_planned_price_per_hour") == 0
    assert get("vgpu_operator_autoscale_rounds_total", {"result": "idle"}) == 1
