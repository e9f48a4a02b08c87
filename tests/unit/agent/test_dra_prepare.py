"""Prepare: a claim's allocation on this node becomes a CDI spec carrying exactly its share's
HAMi-core settings; a claim that is not this node's, or asks more than the card has, is
refused with a message that says why. Unprepare's file is found by the claim's uid alone."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from vgpu_operator.agent.deviceplugin.allocation import HostPaths, NodeSettings
from vgpu_operator.agent.dra import dra_pb2, prepare
from vgpu_operator.agent.dra.plugin import DraPlugin
from vgpu_operator.devices import dra

NODE = "node-a"
UUID = "GPU-0a1b2c3d-0000-1111-2222-333344445555"
SETTINGS = NodeSettings(host=HostPaths(hook_dir="/usr/local/vgpu"))


def card(uuid: str = UUID, index: int = 0, memory_mib: int = 81920) -> dra.CardShape:
    return dra.CardShape(
        uuid=uuid,
        index=index,
        product="NVIDIA H100 80GB HBM3",
        hami_type="NVIDIA H100 80GB HBM3",
        memory_mib=memory_mib,
        cores=100,
        split_count=10,
        mode="hami-core",
    )


CARDS = {card().name: card(), card("GPU-ffff", 1).name: card("GPU-ffff", 1)}


def result(
    device: str = UUID.lower(),
    *,
    request: str = "gpu",
    pool: str = NODE,
    driver: str = dra.DRIVER,
    consumed: Mapping[str, str] | None = None,
    share: str | None = "5f0c-share",
) -> dict[str, Any]:
    body: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if consumed is not None:
        body["consumedCapacity"] = dict(consumed)
    if share is not None:
        body["shareID"] = share
    return body


def claim(
    *results: dict[str, Any],
    node: str | None = NODE,
    config: list[dict[str, Any]] | None = None,
    device_class: str = dra.SHARED_CLASS,
) -> dict[str, Any]:
    allocation: dict[str, Any] = {"devices": {"results": list(results), "config": config or []}}
    if node is not None:
        allocation["nodeSelector"] = {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        }
    return {
        "metadata": {"namespace": "team-a", "name": "train-gpu", "uid": "c1a2-uid"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}
        },
        "status": {"allocation": allocation},
    }


TEN_GIB_QUARTER = {"memory": "10Gi", "cores": "25", "shares": "1"}


def env_of(spec: Mapping[str, Any]) -> dict[str, str]:
    pairs = [*spec["containerEdits"]["env"]]
    for device in spec["devices"]:
        pairs += device["containerEdits"]["env"]
    return dict(p.split("=", 1) for p in pairs)


def test_a_share_becomes_hami_cores_settings() -> None:
    done = prepare.prepare(claim(result(consumed=TEN_GIB_QUARTER)), NODE, CARDS, SETTINGS)
    assert env_of(done.spec) == {
        "NVIDIA_VISIBLE_DEVICES": UUID,
        "CUDA_DEVICE_MEMORY_LIMIT_0": "10240m",
        "CUDA_DEVICE_SM_LIMIT": "25",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/c1a2-uid.cache",
    }
    mounts = {m["containerPath"]: m for m in done.spec["containerEdits"]["mounts"]}
    assert mounts["/usr/local/vgpu"]["hostPath"] == "/usr/local/vgpu/claims/c1a2-uid"
    assert mounts["/usr/local/vgpu/libvgpu.so"]["hostPath"] == "/usr/local/vgpu/libvgpu.so"
    assert "ro" in mounts["/usr/local/vgpu/libvgpu.so"]["options"]
    assert mounts["/etc/ld.so.preload"]["hostPath"] == "/usr/local/vgpu/ld.so.preload"
    assert mounts["/tmp/vgpulock"]["hostPath"] == "/tmp/vgpulock"
    assert done.spec["kind"] == "vgpu-operator.io/gpu"
    assert [d.cdi_ids for d in done.devices] == [("vgpu-operator.io/gpu=c1a2-uid-0",)]
    assert done.devices[0].share_id == "5f0c-share"
    assert done.devices[0].requests == ("gpu",)
    assert prepare.spec_file_name("c1a2-uid") == "vgpu-operator.io-gpu_c1a2-uid.json"


def test_two_cards_get_a_memory_limit_each() -> None:
    done = prepare.prepare(
        claim(
            result(consumed={"memory": "8Gi", "cores": "30"}),
            result("gpu-ffff", consumed={"memory": "4Gi", "cores": "30"}, share="s2"),
        ),
        NODE,
        CARDS,
        SETTINGS,
    )
    env = env_of(done.spec)
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{UUID},GPU-ffff"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8192m"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_1"] == "4096m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"


def test_hami_core_off_by_opaque_config_drops_the_preload_only() -> None:
    config = [
        {
            "source": "FromClaim",
            "opaque": {"driver": dra.DRIVER, "parameters": {"hamiCore": False}},
        }
    ]
    done = prepare.prepare(
        claim(result(consumed=TEN_GIB_QUARTER), config=config), NODE, CARDS, SETTINGS
    )
    paths = {m["containerPath"] for m in done.spec["containerEdits"]["mounts"]}
    assert "/etc/ld.so.preload" not in paths
    assert env_of(done.spec)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "10240m"


def test_node_settings_reach_the_container() -> None:
    settings = NodeSettings(device_memory_scaling=2.0, core_policy="disable")
    env = env_of(
        prepare.prepare(claim(result(consumed=TEN_GIB_QUARTER)), NODE, CARDS, settings).spec
    )
    assert env["CUDA_OVERSUBSCRIBE"] == "true"
    assert env["GPU_CORE_UTILIZATION_POLICY"] == "disable"


def test_a_result_without_consumed_capacity_is_the_whole_card() -> None:
    env = env_of(prepare.prepare(claim(result(share=None)), NODE, CARDS, SETTINGS).spec)
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "81920m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "100"


@pytest.mark.parametrize(
    ("the_claim", "message"),
    [
        (claim(result(consumed=TEN_GIB_QUARTER), node="node-b"), "not to node-a"),
        (claim(result(pool="node-b", consumed=TEN_GIB_QUARTER), node=None), "pool 'node-b'"),
        (claim(result(driver="gpu.nvidia.com")), "no device allocated by driver"),
        ({"metadata": {"namespace": "n", "name": "c", "uid": "u"}, "status": {}}, "not allocated"),
        (claim(result("gpu-unknown", consumed=TEN_GIB_QUARTER)), "not a card this node publishes"),
        (claim(result(consumed={"memory": "100Gi", "cores": "25"})), "which has 81920 MiB"),
        (claim(result(consumed={"memory": "1Gi", "cores": "101"})), "which has 100"),
        (claim(result(consumed={"memory": "1Gi", "cores": "12.5"})), "not a whole percent"),
        (claim(result(consumed={"memory": "1Gi", "shares": "11"})), "which has 10"),
        (claim(result(consumed={"memory": "bogus"})), "consumedCapacity.memory"),
        (
            claim(result(consumed=TEN_GIB_QUARTER), device_class=dra.EXCLUSIVE_CLASS),
            "exclusive request names no memory",
        ),
    ],
)
def test_refusals_say_why(the_claim: dict[str, Any], message: str) -> None:
    with pytest.raises(prepare.PrepareError, match=message):
        prepare.prepare(the_claim, NODE, CARDS, SETTINGS)


def test_an_exclusive_claim_with_the_whole_card_is_prepared() -> None:
    whole = {"memory": "80Gi", "cores": "0", "shares": "1"}
    done = prepare.prepare(
        claim(result(consumed=whole), device_class=dra.EXCLUSIVE_CLASS), NODE, CARDS, SETTINGS
    )
    assert env_of(done.spec)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "81920m"


def test_recount_sums_what_claims_consume_per_device() -> None:
    claims = [
        claim(result(consumed=TEN_GIB_QUARTER)),
        claim(result(consumed=TEN_GIB_QUARTER, share="other")),
        claim(result("gpu-ffff", consumed={"memory": "1Gi", "cores": "5", "shares": "1"})),
        {"metadata": {}, "status": {}},
    ]
    totals = dra.recount(claims)
    first = totals[(NODE, UUID.lower())]
    assert (first.memory_bytes, first.cores, first.shares, first.claims) == (20 * 2**30, 50, 2, 2)
    assert totals[(NODE, "gpu-ffff")].claims == 1


class Ctx:
    pass


def test_plugin_prepare_and_unprepare_are_idempotent(tmp_path: Path) -> None:
    stored = claim(result(consumed=TEN_GIB_QUARTER))
    settings = NodeSettings(host=HostPaths(hook_dir=str(tmp_path / "vgpu")))

    async def claims(namespace: str, name: str) -> Mapping[str, Any] | None:
        return stored if (namespace, name) == ("team-a", "train-gpu") else None

    plugin = DraPlugin(NODE, lambda: CARDS, claims, settings, tmp_path / "cdi")
    ref = dra_pb2.Claim(namespace="team-a", name="train-gpu", uid="c1a2-uid")
    spec_file = tmp_path / "cdi" / "vgpu-operator.io-gpu_c1a2-uid.json"

    async def scenario() -> None:
        ctx: Any = Ctx()
        request = dra_pb2.NodePrepareResourcesRequest(claims=[ref])
        first = await plugin.NodePrepareResources(request, ctx)
        written = spec_file.read_text()
        again = await plugin.NodePrepareResources(request, ctx)
        assert first == again
        assert spec_file.read_text() == written
        answer = first.claims["c1a2-uid"]
        assert answer.error == ""
        assert list(answer.devices[0].cdi_device_ids) == ["vgpu-operator.io/gpu=c1a2-uid-0"]
        assert (tmp_path / "vgpu" / "claims" / "c1a2-uid").is_dir()
        # A claim made again under the same name is not the one kubelet means.
        stale = dra_pb2.Claim(namespace="team-a", name="train-gpu", uid="older-uid")
        refused = await plugin.NodePrepareResources(
            dra_pb2.NodePrepareResourcesRequest(claims=[stale]), ctx
        )
        assert "deleted and made again" in refused.claims["older-uid"].error
        undo = dra_pb2.NodeUnprepareResourcesRequest(claims=[ref])
        for _ in range(2):
            done = await plugin.NodeUnprepareResources(undo, ctx)
            assert done.claims["c1a2-uid"].error == ""
            assert not spec_file.exists()
        assert not (tmp_path / "vgpu" / "claims" / "c1a2-uid").exists()

    asyncio.run(scenario())


def test_each_cdi_device_records_what_it_holds() -> None:
    done = prepare.prepare(claim(result(consumed=TEN_GIB_QUARTER)), NODE, CARDS, SETTINGS)
    assert done.holds == (prepare.CardHold(UUID.lower(), 10240, 25, 1),)
    assert prepare.holds_of(done.spec) == done.holds
    assert prepare.holds_of({"devices": [{"annotations": {prepare.HOLDS_ANNOTATION: "["}}]}) == ()


def test_check_room_refuses_what_would_over_commit_a_card() -> None:
    card_name = UUID.lower()
    held = [prepare.CardHold(card_name, 40960, 50, 1), prepare.CardHold("gpu-ffff", 81920, 100, 10)]
    prepare.check_room("claim a/b", [prepare.CardHold(card_name, 40960, 50, 1)], held, CARDS)
    for wanted, what in (
        (prepare.CardHold(card_name, 40961, 0, 1), "81920 MiB of memory"),
        (prepare.CardHold(card_name, 1, 51, 1), "100 cores"),
        (prepare.CardHold(card_name, 1, 0, 10), "10 shares"),
    ):
        with pytest.raises(prepare.PrepareError, match=f"has {what} and the claims prepared"):
            prepare.check_room("claim a/b", [wanted], held, CARDS)


def test_a_claim_that_over_commits_a_card_with_prepared_claims_is_refused_even_after_a_restart(
    tmp_path: Path,
) -> None:
    half = {"memory": "40Gi", "cores": "50", "shares": "1"}
    stored = {
        "first": claim(result(consumed=half)),
        "second": claim(result(consumed=half, share="s2")),
        "third": claim(result(consumed=half, share="s3")),
    }
    for name, body in stored.items():
        body["metadata"] = {"namespace": "team-a", "name": name, "uid": f"{name}-uid"}
    settings = NodeSettings(host=HostPaths(hook_dir=str(tmp_path / "vgpu")))

    async def claims(namespace: str, name: str) -> Mapping[str, Any] | None:
        return stored.get(name)

    def plugin() -> DraPlugin:
        return DraPlugin(NODE, lambda: CARDS, claims, settings, tmp_path / "cdi")

    def ref(name: str) -> dra_pb2.Claim:
        return dra_pb2.Claim(namespace="team-a", name=name, uid=f"{name}-uid")

    async def errors(p: DraPlugin, *names: str) -> dict[str, str]:
        request = dra_pb2.NodePrepareResourcesRequest(claims=[ref(n) for n in names])
        reply = await p.NodePrepareResources(request, Ctx())  # type: ignore[arg-type]
        return {uid: answer.error for uid, answer in reply.claims.items()}

    async def scenario() -> None:
        first = plugin()
        assert await errors(first, "first", "second") == {"first-uid": "", "second-uid": ""}
        refused = (await errors(first, "third"))["third-uid"]
        assert "over-commits the card" in refused
        # Preparing a held claim again is no over-commit.
        assert await errors(first, "first") == {"first-uid": ""}
        # An agent restart reads the holdings back from the CDI directory.
        assert "over-commits" in (await errors(plugin(), "third"))["third-uid"]
        undo = dra_pb2.NodeUnprepareResourcesRequest(claims=[ref("second")])
        await first.NodeUnprepareResources(undo, Ctx())  # type: ignore[arg-type]
        assert await errors(first, "third") == {"third-uid": ""}

    asyncio.run(scenario())
