"""Autoscaling for pods whose GPUs come from ResourceClaims on our DeviceClasses: the
what-if fits their claims by the claims dialect on the slices a new node's agent would
publish (``autoscale.hypothetical``), holds what each trial allocates on the overlay
(``books.overlay_claims``), and judges template claims not made yet as the claim
controller would make them."""

from __future__ import annotations

import dataclasses
from typing import Any

from autoscale_cases import (
    TYPES,
    claim_object,
    claim_pod,
    claim_unit,
    dra_books,
    dra_options,
    instance_type,
)
from builders import resource_quota

from vgpu_operator.devices import dra, dra_mig, model
from vgpu_operator.scheduling.autoscale import search
from vgpu_operator.scheduling.autoscale.whatif import Unit
from vgpu_operator.scheduling.dialects.claims import claim_templates
from vgpu_operator.scheduling.pod_key import pod_key


def test_a_claim_gets_the_cheapest_dra_node_that_holds_it() -> None:
    books = dra_books()
    unit = claim_unit(books, "a", memory_mib=20000)
    plan = search.plan(books, [unit], dra_options(), now=0.0)
    assert plan.summary() == "1 x gpu-1xa100", plan
    assert plan.optimal


def test_claims_share_cards_of_one_node_as_the_claim_fit_allows() -> None:
    books = dra_books()
    units = [claim_unit(books, f"p{i}", memory_mib=40000) for i in range(8)]
    plan = search.plan(books, units, dra_options(), now=0.0)
    assert plan.summary() == "1 x gpu-8xh100"
    assert set(plan.where) == {u.keys[0] for u in units}


def test_a_what_if_leaves_the_live_claims_as_they_were() -> None:
    books = dra_books()
    units = [claim_unit(books, f"p{i}", memory_mib=30000) for i in range(5)]
    before = (dict(books.claims.claim_holds()), dict(books.pods), dict(books.nodes))
    plan = search.plan(books, units, dra_options(), now=0.0)
    assert plan.new
    assert (dict(books.claims.claim_holds()), dict(books.pods), dict(books.nodes)) == before


def test_a_node_pool_not_on_the_dra_path_holds_no_claim() -> None:
    books = dra_books()
    unit = claim_unit(books, "a", memory_mib=20000)
    plan = search.plan(books, [unit], dra_options(dra_path=False), now=0.0)
    assert plan.new == ()
    assert "NodeNotOnDraPath" in plan.unplaceable[unit.key]


def _template(name: str, memory_mib: int) -> dict[str, Any]:
    claim = claim_object("unused", memory_mib)
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"namespace": "team", "name": name},
        "spec": {"metadata": {"labels": {"app": "x"}}, "spec": claim["spec"]},
    }


def _template_pod(name: str, template: str) -> dict[str, Any]:
    pod = claim_pod(name, "unused")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    return pod


def test_a_template_claim_not_made_yet_is_judged_as_the_controller_would_make_it() -> None:
    books = dra_books()
    templates = {"team/big": _template("big", 60000)}
    units = []
    for i in range(2):
        made = claim_templates.with_template_claims(_template_pod(f"t{i}", "big"), templates)
        assert not isinstance(made, str)
        pod, claims = made
        assert pod["status"]["resourceClaimStatuses"] == [
            {"name": "gpu", "resourceClaimName": f"t{i}#gpu"}
        ]
        units.append(Unit(str(pod_key(pod)), (pod,), claims=tuple(claims)))
    plan = search.plan(books, units, dra_options(), now=0.0)
    # 60 GB each: not on an A100 (40 GB) nor an L40S (45 GB); both on one 8xH100.
    assert plan.summary() == "1 x gpu-8xh100", plan.unplaceable
    assert len(plan.where) == 2
    assert books.claims.objects == {}


def test_a_pod_whose_template_is_missing_is_told_which() -> None:
    made = claim_templates.with_template_claims(_template_pod("t", "gone"), {})
    assert made == "ResourceClaimTemplate team/gone not found"


def test_claims_are_held_per_trial_so_two_do_not_take_one_card() -> None:
    books = dra_books()
    units = [claim_unit(books, f"p{i}", memory_mib=30000) for i in range(2)]
    one_a100 = [o for o in dra_options() if o.instance_type.name == "gpu-1xa100"]
    plan = search.plan(books, units, one_a100, now=0.0)
    # Each takes 30 of the card's 40 GB: two nodes, one claim on each.
    assert plan.summary() == "2 x gpu-1xa100"
    assert len(set(plan.where.values())) == 2


def test_the_namespace_quota_counts_the_claims_a_trial_holds() -> None:
    books = dra_books()
    books.set_quota(resource_quota("team", gpumem=50000))
    units = [claim_unit(books, f"p{i}", memory_mib=30000) for i in range(2)]
    plan = search.plan(books, units, dra_options(), now=0.0)
    assert len(plan.where) == 1
    assert len(plan.unplaceable) == 1


def test_a_mig_claim_gets_a_node_of_a_type_in_mig_mode() -> None:
    books = dra_books()
    card = model.DeviceInfo("mig-0", 0, 1, 40960, 100, "NVIDIA-A100", 0, True, mode="mig")
    shape = dra_mig.MigCardShape("mig-0", 0, "NVIDIA A100-SXM4-40GB", "NVIDIA-A100", 40960)
    mig_type = dataclasses.replace(
        instance_type("gpu-1xa100-mig", 1, 40960, "NVIDIA-A100", 4.0),
        devices=(card,),
        dra_cards=(),
        dra_mig_cards=(shape,),
    )
    claim = claim_object("m", None)
    request = claim["spec"]["devices"]["requests"][0]["exactly"]
    request["deviceClassName"] = dra.MIG_CLASS
    expression = f'device.attributes["{dra.DRIVER}"].profile == "3g.20gb"'
    request["selectors"] = [{"cel": {"expression": expression}}]
    books.claims.set_claim(claim)
    pod = claim_pod("m", "m")
    unit = Unit(str(pod_key(pod)), (pod,))
    plan = search.plan(books, [unit], dra_options((*TYPES, mig_type)), now=0.0)
    assert plan.summary() == "1 x gpu-1xa100-mig", plan.unplaceable
