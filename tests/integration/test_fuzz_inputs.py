"""Malformed input thrown at the live operator on the real control plane (bounded).

Hypothesis draws pods with malformed device quantities and scheduling annotations
(created through the API server, so the webhook and the engine both see them), broken
DeviceInventory reports for one node and garbage HAMi register annotations for another.
Examples share one cluster (their pods and reports accumulate, as in a real one).
Whatever comes, the operator keeps running, every refusal names what to change, nothing
is booked on a node whose only report is broken, and no card is booked beyond the
inventory it really has: the books are recounted from the pods on the API server.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from integration import operator_env as env
from integration import test_operator_webhook as webhook_tests
from integration.test_operator_webhook import Webhooked

from vgpu_operator import names
from vgpu_operator.devices import nvidia
from vgpu_operator.devices.quantity import parse_quantity

# The webhook test module's fixture: an operator with its webhook wired into the API server.
webhooked = webhook_tests.webhooked

CARD_MIB = 8000
SPLIT = 4
COUNT = "nvidia.com/gpu"
MEMORY = "nvidia.com/gpumem"
CORES = "nvidia.com/gpucores"
PERCENT = "nvidia.com/gpumem-percentage"

_QUANTITY_SHAPED = st.from_regex(
    r"\A[+-]?[0-9]{1,12}(\.[0-9]{1,3})?([eE][+-]?[0-9]{1,2}|[kMGTPE]|[KMGTPE]i|m)?\Z"
)
_QUANTITIES = st.one_of(
    st.sampled_from(
        ["4Gi", "16G", "1e30", "2147483648", "0.5", "1Mi", "2k", "-1", "1.5Ki", "1000m", "0"]
    ),
    st.integers(-10, 3 * 10**9).map(str),
    _QUANTITY_SHAPED,
    st.text(alphabet="0123456789.eEkKMGi+- x", min_size=1, max_size=8),
)
_WORDS = st.one_of(
    st.sampled_from(["binpack", "spread", "topology-aware", "numa,binpack", "", "bogus"]),
    st.text(alphabet="abcdefgnpsuy,=:.0123456789- ", max_size=16),
)
_WEIGHTS = st.one_of(
    st.sampled_from(["", "memory=1", "cores=2,memory=1", "memory=-1", "x", "memory="]),
    st.text(alphabet="acemnorys=,.0123456789- ", max_size=16),
)


@st.composite
def _pods(draw: st.DrawFn) -> dict[str, Any]:
    """Limits and annotations of one pod; any of them may be malformed."""
    limits: dict[str, str] = {COUNT: draw(st.one_of(st.integers(-1, 3).map(str), _QUANTITIES))}
    for name in (MEMORY, CORES, PERCENT):
        if draw(st.booleans()):
            limits[name] = draw(_QUANTITIES)
    annotations: dict[str, str] = {}
    if draw(st.booleans()):
        annotations[names.GPU_SCHEDULER_POLICY] = draw(_WORDS)
    if draw(st.booleans()):
        annotations[names.NODE_SCHEDULER_POLICY] = draw(_WORDS)
    if draw(st.booleans()):
        annotations[names.DEVICE_SCORING_WEIGHTS] = draw(_WEIGHTS)
    return {"limits": limits, "annotations": annotations}


#: Numbers no card report may carry: negative, past every plausibility bound (2**25 is
#: above the memory, cores and split-count bounds), or not integers at all.
_BAD_NUMBERS = st.one_of(
    st.integers(-(2**40), -1),
    st.integers(2**25, 2**40),
    st.sampled_from(["4096", None, 1.5]),
)
_INVENTORY_FIELDS = ("memoryMiB", "cores", "splitCount")


@st.composite
def _broken_inventories(draw: st.DrawFn) -> Callable[[dict[str, Any]], None]:
    """A change that breaks a valid inventory status (the field and value drawn)."""
    how = draw(st.sampled_from(["value", "duplicate", "other-node", "no-uuid"]))
    field = draw(st.sampled_from(_INVENTORY_FIELDS))
    value = draw(_BAD_NUMBERS)
    other = draw(st.sampled_from(["node-elsewhere", "x" * 300]))

    def breaks(status: dict[str, Any]) -> None:
        devices = status["devices"]
        if how == "value":
            devices[0][field] = value
        elif how == "duplicate":
            devices[1]["uuid"] = devices[0]["uuid"]
        elif how == "other-node":
            status["nodeName"] = other
        else:
            del devices[0]["uuid"]

    return breaks


_REGISTER_ANNOTATIONS = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["[]", "{}", "null", "[{}]", "GPU-x,10,-8000,100,NVIDIA,0,true:"]),
    st.lists(
        st.fixed_dictionaries(
            {
                "id": st.sampled_from(["", "GPU-r0", "GPU-r0"]),
                "count": _BAD_NUMBERS,
                "devmem": _BAD_NUMBERS,
                "devcore": _BAD_NUMBERS,
                "type": st.sampled_from(["NVIDIA-x", "", 7]),
                "health": st.sampled_from([True, "yes", None]),
            }
        ),
        min_size=1,
        max_size=3,
    ).map(json.dumps),
)

_INPUTS = st.one_of(
    _pods().map(lambda p: ("pod", p)),
    _broken_inventories().map(lambda b: ("inventory", b)),
    _REGISTER_ANNOTATIONS.map(lambda a: ("register", a)),
)


_BROKEN_LABEL = "vgpu-test/report-broken"


class _Run:
    """The fuzzed cluster: one sound node, one with a broken inventory, one with a
    garbage register annotation; what was created is remembered for the recount."""

    def __init__(self, w: Webhooked) -> None:
        self.w = w
        self.sound = env.cards(f"{w.namespace}-a", 2, memory_mib=CARD_MIB, split_count=SPLIT)
        env.gpu_node(w.cp, f"{w.namespace}-a", self.sound, group=w.namespace)
        self.broken_node = f"{w.namespace}-b"
        self.broken_cards = env.cards(self.broken_node, 2)
        broken = {env.TEST_LABEL: w.namespace, _BROKEN_LABEL: "yes"}
        w.cp.create_fake_gpu_node(self.broken_node, gpus=2, labels=broken)
        self.garbage_node = f"{w.namespace}-c"
        w.cp.create_fake_gpu_node(self.garbage_node, gpus=2, labels=broken)
        self.pods = 0

    def probe(self) -> None:
        """A sound pod that may go only to the nodes whose reports are broken: it must
        wait, since nothing believable says they have a GPU."""
        self.pods += 1
        pod = env.gpu_pod(
            self.w.namespace,
            f"probe-{self.pods}",
            scheduler=self.w.scheduler,
            group=self.w.namespace,
            gpumem=1000,
        )
        pod["spec"]["nodeSelector"][_BROKEN_LABEL] = "yes"
        env.create_pod(self.w.cp, pod)

    def pod(self, drawn: dict[str, Any]) -> None:
        self.pods += 1
        name = f"fuzz-{self.pods}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.w.namespace,
                "annotations": drawn["annotations"],
            },
            "spec": {
                "nodeSelector": {env.TEST_LABEL: self.w.namespace},
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.invalid/x",
                        "resources": {"limits": drawn["limits"]},
                    }
                ],
            },
        }
        refused = env.refusal(lambda: env.create_pod(self.w.cp, pod))
        if refused is not None:
            assert refused.status in (400, 403, 422), refused
            if refused.status == 400:
                return  # the API server could not decode it: the operator never saw it
            message = str(refused)
            named = [*drawn["limits"], *drawn["annotations"]]
            # The refusal names the value to change (the API server's own validation
            # names the field path, which contains the resource or annotation name).
            assert any(n in message for n in named), message
            if refused.status == 403:
                said = ("must", "write", "expected", "accepted")
                assert any(w in message for w in said), message

    def inventory(self, breaks: Callable[[dict[str, Any]], None]) -> None:
        status = env.inventory_status(self.broken_node, self.broken_cards)
        breaks(status)
        # Never a sound status for this node: the object is created bare, then only
        # broken statuses are written (the CRD may refuse them).
        exists = env.refusal(
            lambda: self.w.cp.create(
                env.INVENTORIES,
                {
                    "apiVersion": f"{names.CRD_GROUP}/{names.CRD_VERSION}",
                    "kind": names.DEVICE_INVENTORY_KIND,
                    "metadata": {"name": self.broken_node},
                    "spec": {},
                },
            )
        )
        assert exists is None or exists.status == 409, exists
        path = f"{env.INVENTORIES}/{self.broken_node}/status"
        refused = env.refusal(lambda: self.w.cp.patch(path, {"status": status}))
        assert refused is None or refused.status in (400, 422), refused

    def register(self, text: str) -> None:
        self.w.cp.patch(
            f"/api/v1/nodes/{self.garbage_node}",
            {"metadata": {"annotations": {nvidia.REGISTER_ANNOTATION: text}}},
        )


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    # The cluster keeps what earlier examples made, so shrinking would replay a
    # different history; a failure is reported as found, within bounded time.
    phases=[Phase.explicit, Phase.generate],
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(inputs=st.lists(_INPUTS, min_size=1, max_size=4))
def test_malformed_inputs_never_crash_or_overbook(
    webhooked: Webhooked, inputs: list[tuple[str, Any]]
) -> None:
    # The fixture is made once for all examples; so is the fuzzed cluster.
    if webhooked.namespace not in _runs:
        _runs[webhooked.namespace] = _Run(webhooked)
    run = _runs[webhooked.namespace]
    for kind, drawn in inputs:
        getattr(run, kind)(drawn)
    run.probe()
    _wait_decided(run)
    assert webhooked.operator.alive
    _recount(run)


_runs: dict[str, _Run] = {}


def _wait_decided(run: _Run) -> None:
    """Until the operator has answered every pod routed to it (bound, or marked)."""

    def decided() -> bool | None:
        for pod in env.list_pods(run.w.cp, run.w.namespace):
            if (pod.get("spec") or {}).get("schedulerName") != run.w.scheduler:
                continue
            if not pod["spec"].get("nodeName") and env.condition(pod) is None:
                return None
        return True

    env.wait_until("the operator to answer every fuzzed pod", decided, 60)


def _recount(run: _Run) -> None:
    """No card beyond its real inventory, nothing on the nodes whose reports are broken."""
    pods = env.list_pods(run.w.cp, run.w.namespace)
    usage = env.usage_by_card(pods)
    sound = {card.uuid for card in run.sound}
    for card, (shares, memory_mib, cores) in usage.items():
        assert card in sound, f"{card} is booked, but only {sorted(sound)} are real"
        assert shares <= SPLIT, f"{card}: {shares} tasks, split count {SPLIT}"
        assert memory_mib <= CARD_MIB, f"{card}: {memory_mib} MiB booked of {CARD_MIB}"
        assert cores <= 100, f"{card}: {cores}% of its compute booked"
    for pod in pods:
        name = pod["metadata"]["name"]
        bound_to = (pod.get("spec") or {}).get("nodeName")
        assert bound_to not in (run.broken_node, run.garbage_node), name
        limits = pod["spec"]["containers"][0]["resources"].get("limits") or {}
        if bound_to and parse_quantity(limits.get(COUNT, "0")) > 0:
            assert env.allocation(pod), f"{name} asked for {limits} and was bound without a GPU"


def test_operator_still_places_a_sound_pod_after_the_fuzz(webhooked: Webhooked) -> None:
    """The fuzz above shares no state with this test; this one shows the recount would
    see a booking (a sound pod on a sound node is bound and counted)."""
    run = _Run(webhooked)
    run.pod({"limits": {COUNT: "1", MEMORY: "3000"}, "annotations": {}})
    bound = env.wait_bound(webhooked.cp, webhooked.namespace, "fuzz-1")
    assert bound["spec"]["nodeName"] == f"{webhooked.namespace}-a"
    _recount(run)
    assert env.usage_by_card([bound])
