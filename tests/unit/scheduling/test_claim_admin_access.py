"""adminAccess on the DRA path (issue 44): upstream's rule. A request with adminAccess is
allocated only in a namespace labelled ``resource.kubernetes.io/admin-access: "true"``,
on a device its selectors allow whatever others hold of it, consuming nothing; in any
other namespace it is refused with a sentence."""

from __future__ import annotations

from dra_cluster import CARD_MIB
from dra_cluster import DraCluster as Cluster

WHOLE = {"capacity": {"requests": {"memory": f"{CARD_MIB}Mi"}}}


def test_refused_with_a_sentence_where_the_namespace_is_not_labelled() -> None:
    cluster = Cluster()
    decision = cluster.decide("admin", "team", {"adminAccess": True})
    assert not decision.scheduled
    assert decision.diagnosis is not None
    assert decision.diagnosis.error == (
        "ResourceClaim team/admin, request 'gpu' asks adminAccess, which is allowed only in "
        "namespaces an administrator labelled resource.kubernetes.io/admin-access=true, and "
        "namespace team is not: remove adminAccess, or ask an administrator for the label"
    )


def test_allocated_where_labelled_on_a_full_card_consuming_nothing() -> None:
    cluster = Cluster()
    cluster.label_admin("ops", True)
    whole = cluster.decide("whole", "team", WHOLE)  # takes all of the card's memory
    assert whole.scheduled
    cluster.state.confirm(whole.pod)
    admin = cluster.decide("admin", "ops", {"adminAccess": True})
    assert admin.scheduled
    (write,) = admin.claim_writes
    assert write.allocation is not None
    (result,) = write.allocation["devices"]["results"]
    assert result["adminAccess"] is True
    assert "consumedCapacity" not in result
    assert "shareID" not in result


def test_an_admin_claim_leaves_the_card_to_others() -> None:
    cluster = Cluster()
    cluster.label_admin("ops", True)
    admin = cluster.decide("admin", "ops", {"adminAccess": True})
    assert admin.scheduled
    cluster.state.confirm(admin.pod)
    assert cluster.decide("whole", "team", WHOLE).scheduled


def test_a_namespace_that_loses_the_label_is_refused_again() -> None:
    cluster = Cluster()
    cluster.label_admin("ops", True)
    cluster.label_admin("ops", False)
    decision = cluster.decide("admin", "ops", {"adminAccess": True})
    assert not decision.scheduled
    assert decision.diagnosis is not None
    assert "namespace ops is not" in str(decision.diagnosis.error)
