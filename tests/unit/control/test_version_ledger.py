"""Stale news never overwrites fresh: watch events and full listings racing."""

from __future__ import annotations

import pytest

from vgpu_operator.control.versions import VersionLedger, parse_version, version_of


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("42", 42, id="number"),
        pytest.param("", None, id="empty"),
        pytest.param("abc", None, id="opaque"),
        pytest.param(None, None, id="absent"),
    ],
)
def test_parse_version(value: object, expected: int | None) -> None:
    assert parse_version(value) == expected


def test_version_of_reads_metadata() -> None:
    assert version_of({"metadata": {"resourceVersion": "7"}}) == 7
    assert version_of({}) is None


def test_older_or_equal_update_is_ignored() -> None:
    ledger = VersionLedger()
    assert ledger.accept_update("a", 10)
    assert not ledger.accept_update("a", 9)
    assert not ledger.accept_update("a", 10)
    assert ledger.accept_update("a", 11)


def test_deleted_object_is_not_brought_back_by_an_older_copy() -> None:
    ledger = VersionLedger()
    ledger.accept_update("a", 10)
    assert ledger.accept_delete("a", 12)
    assert not ledger.accept_update("a", 11)
    assert ledger.accept_update("a", 13)  # re-created under the same name


def test_delete_before_any_update_leaves_a_tombstone() -> None:
    ledger = VersionLedger()
    assert not ledger.accept_delete("a", 12)
    assert not ledger.accept_update("a", 11)


def test_opaque_versions_are_always_accepted() -> None:
    ledger = VersionLedger()
    assert ledger.accept_update("a", None)
    assert ledger.accept_update("a", None)


def test_reconcile_applies_newer_and_removes_vanished() -> None:
    ledger = VersionLedger()
    ledger.accept_update("kept", 5)
    ledger.accept_update("newer-in-list", 5)
    ledger.accept_update("vanished", 6)
    ledger.accept_update("seen-after-list", 30)
    result = ledger.reconcile({"kept": 5, "newer-in-list": 8, "new": 9}, list_version=20)
    assert set(result.apply) == {"newer-in-list", "new"}
    assert result.remove == ("vanished",)
    assert "seen-after-list" in ledger
    assert "vanished" not in ledger
    # The listing's knowledge of the deletion stops an older copy coming back.
    assert not ledger.accept_update("vanished", 7)


def test_a_listing_of_objects_is_read_for_its_versions() -> None:
    """The objects' resourceVersions and the list's own, as the API server gives them."""
    ledger = VersionLedger()
    ledger.accept_update("old", 5)
    ledger.accept_update("gone", 6)
    listed = {
        "old": {"metadata": {"name": "old", "resourceVersion": "5"}},
        "new": {"metadata": {"name": "new", "resourceVersion": "9"}},
    }
    result = ledger.reconcile_listing(listed, "20")
    assert result.apply == ("new",)
    assert result.remove == ("gone",)


def test_listing_does_not_resurrect_an_object_deleted_by_a_later_event() -> None:
    ledger = VersionLedger()
    ledger.accept_update("a", 5)
    ledger.accept_delete("a", 25)
    result = ledger.reconcile({"a": 5}, list_version=20)
    assert result.apply == ()
    assert "a" not in ledger


def test_tombstones_are_pruned_after_two_listings() -> None:
    ledger = VersionLedger()
    ledger.accept_update("a", 5)
    ledger.accept_delete("a", 6)
    ledger.reconcile({}, list_version=10)
    ledger.reconcile({}, list_version=20)
    assert ledger._deleted == {}
