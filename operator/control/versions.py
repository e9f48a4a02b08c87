"""Which version of each object the engine has seen, so stale news never overwrites fresh.

Objects reach the engine along two paths: Kopf's watch events, and our own full listings
(at startup, when this replica becomes the active one, and at the slow periodic resync).
The two race: a listing taken before a deletion can arrive after the DELETED event. The
ledger compares ``metadata.resourceVersion`` (an etcd revision, so the numbers grow) and
keeps a tombstone for every deletion, so an older copy never brings a deleted object back
and an older listing never overwrites a newer event. Objects the engine knows that a
listing no longer contains were deleted while nobody was watching (for example while this
replica was paused by peering): ``reconcile`` names them for removal.

When a version is not a number (a non-etcd storage), the ledger accepts every update.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar


def parse_version(value: object) -> int | None:
    """A resourceVersion as an int, or None when it is absent or not a number."""
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def version_of(obj: Mapping[str, object]) -> int | None:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    return parse_version(meta.get("resourceVersion"))


#: A ledger's key: a name, or ``namespace/name`` (a ``PodKey`` for pods).
_Key = TypeVar("_Key", bound=str)


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """What a full listing changes: keys to (re)apply and keys gone from the cluster."""

    apply: tuple[str, ...]
    remove: tuple[str, ...]


class VersionLedger:
    """Last applied version per object key, and tombstones of deleted keys (one kind)."""

    def __init__(self) -> None:
        self._live: dict[str, int | None] = {}
        self._deleted: dict[str, int | None] = {}
        self._last_list_version: int | None = None

    def __contains__(self, key: object) -> bool:
        return key in self._live

    def __len__(self) -> int:
        return len(self._live)

    def accept_update(self, key: str, version: int | None) -> bool:
        """Record an added/modified object; False if it is not newer than what we have."""
        if version is not None:
            known = self._live.get(key)
            if known is not None and known >= version:
                return False
            tomb = self._deleted.get(key)
            if tomb is not None and tomb >= version:
                return False
        self._deleted.pop(key, None)
        self._live[key] = version
        return True

    def accept_delete(self, key: str, version: int | None) -> bool:
        """Record a deletion; False if the object was not known or the news is stale."""
        if key not in self._live:
            if version is not None:
                tomb = self._deleted.get(key)
                if tomb is None or tomb < version:
                    self._deleted[key] = version
            return False
        known = self._live[key]
        if version is not None and known is not None and known > version:
            return False
        del self._live[key]
        self._deleted[key] = version
        return True

    def reconcile(
        self, listed: Mapping[str, int | None], list_version: int | None
    ) -> Reconciliation:
        """Compare a full listing (key -> version) taken at ``list_version`` with the ledger.

        Records the outcome: the returned ``apply`` keys are marked as seen at their
        listed versions and the ``remove`` keys as deleted.
        """
        apply = tuple(key for key, version in listed.items() if self.accept_update(key, version))
        gone: list[str] = []
        for key, known in list(self._live.items()):
            if key in listed:
                continue
            # Seen only after the listing was taken: the listing cannot know about it.
            if known is not None and list_version is not None and known > list_version:
                continue
            del self._live[key]
            self._deleted[key] = list_version
            gone.append(key)
        self._prune_tombstones(list_version)
        return Reconciliation(apply=apply, remove=tuple(gone))

    def reconcile_listing(
        self, by_key: Mapping[_Key, Mapping[str, object]], list_version: str | None
    ) -> Reconciliation:
        """``reconcile`` for a listing as the API server gives it: the objects by key and
        the list's ``resourceVersion`` (versions read from the objects' metadata)."""
        return self.reconcile(
            {key: version_of(obj) for key, obj in by_key.items()}, parse_version(list_version)
        )

    def _prune_tombstones(self, list_version: int | None) -> None:
        # A tombstone older than the listing before this one can no longer be undercut by
        # a copy still on its way; keeping one generation bounds memory without that risk.
        previous = self._last_list_version
        self._last_list_version = list_version
        if previous is None:
            return
        stale = [k for k, v in self._deleted.items() if v is not None and v < previous]
        for key in stale:
            del self._deleted[key]
