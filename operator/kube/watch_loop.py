"""The one list-then-watch loop: every kind the operator or the agent follows runs it.

``WatchLoop`` lists its collection, hands the listing to its handler, then watches from
the listing's resourceVersion and hands each event over as it arrives. A watch the server
ends, or a broken stream, resumes from the last resourceVersion seen (bookmarks keep it
fresh on quiet kinds); only when the server no longer has that version (410 Gone) is the
collection listed again. Failures wait a bounded backoff before the next try. A kind the
server does not serve (a CRD not installed yet: the listing has no resourceVersion) is
looked for again now and then.

A handler that raises on one event does not stop the loop: the error is logged and
counted (``on_error``), and the next event is handed over (the loop has moved past the
one that failed; retrying it would fail the same way). A handler that raises on a
listing is retried with a new listing after the backoff: a listing half applied leaves
books that only a whole one can put right.

``relist`` lists the collection again on demand, through the same handler (a failover's
resync: the previous leader may have bound pods a moment ago). The handler reconciles a
listing with what it holds, so the watch may go on meanwhile.

Per-kind behaviour lives only in the handler (``KindHandler``); the loop knows paths,
selectors and resourceVersions, nothing of any kind's meaning.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import structlog

from vgpu_operator.kube import listing
from vgpu_operator.kube.requests import ApiClient
from vgpu_operator.wire import KubeObject, WatchEventType

log = structlog.get_logger("vgpu_operator.watch_loop")

#: Waits before trying again after a failure (the last one repeats).
RETRY_S: Final = (0.5, 1.0, 2.0, 5.0, 10.0)
#: How often a kind the API server does not serve is looked for again.
ABSENT_RECHECK_S: Final = 30.0


class KindHandler(Protocol):
    """What one watched kind does with its listings and events."""

    async def listed(self, items: Sequence[KubeObject], version: str | None) -> None:
        """A full listing, consistent with ``version`` (None: the kind is not served)."""

    async def event(self, event_type: WatchEventType, obj: KubeObject) -> None:
        """One watch event: ADDED, MODIFIED or DELETED (bookmarks never reach here)."""


class Retry(Protocol):
    """How long to wait after each failure (``agent.backoff.Backoff`` is one)."""

    def next_delay_s(self) -> float: ...
    def reset(self) -> None: ...


class Delays:
    """A fixed, bounded series of waits; the last one repeats until ``reset``."""

    def __init__(self, delays: Sequence[float] = RETRY_S) -> None:
        if not delays:
            raise ValueError("need at least one delay")
        self._delays = tuple(delays)
        self._failures = 0

    def next_delay_s(self) -> float:
        delay = self._delays[min(self._failures, len(self._delays) - 1)]
        self._failures += 1
        return delay

    def reset(self) -> None:
        self._failures = 0


@dataclass(frozen=True, slots=True)
class Collection:
    """Where a kind is read: its path, and the selectors that narrow it to what we need
    (a field selector on one ConfigMap's name lets RBAC grant that one object)."""

    path: str
    field_selector: str | None = None
    label_selector: str | None = None


class Source(Protocol):
    """The API server as the loop reads it (``ApiSource``; a scripted one in tests)."""

    async def list(self, collection: Collection) -> listing.Listing: ...
    def watch(
        self, collection: Collection, version: str
    ) -> AsyncIterator[tuple[WatchEventType, KubeObject]]: ...


class ApiSource:
    """Reads through our API client (``kube/listing.py``)."""

    def __init__(self, api: ApiClient) -> None:
        self._api = api

    async def list(self, collection: Collection) -> listing.Listing:
        return await listing.list_all(
            self._api,
            collection.path,
            field_selector=collection.field_selector,
            label_selector=collection.label_selector,
        )

    def watch(
        self, collection: Collection, version: str
    ) -> AsyncIterator[tuple[WatchEventType, KubeObject]]:
        return listing.watch(
            self._api,
            collection.path,
            resource_version=version,
            field_selector=collection.field_selector,
            label_selector=collection.label_selector,
            bookmarks=True,
        )


class WatchLoop:
    """See the module docstring. ``name`` names the kind in logs and in ``on_error``'s
    counter (``<name>_watch``); ``listed`` is set once the first listing was handed over."""

    def __init__(
        self,
        name: str,
        source: Source,
        collection: Collection,
        handler: KindHandler,
        *,
        retry: Retry | None = None,
        on_error: Callable[[str], None] = lambda what: None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        absent_recheck_s: float = ABSENT_RECHECK_S,
    ) -> None:
        self.name = name
        self.collection = collection
        self._source = source
        self._handler = handler
        self._retry = retry or Delays()
        self._on_error = on_error
        self._sleep = sleep
        self._absent_recheck_s = absent_recheck_s
        #: One listing at a time: the loop's own and ``relist``'s.
        self._listing = asyncio.Lock()
        self.listed = asyncio.Event()

    async def run(self) -> None:
        """List, then watch, forever (until cancelled)."""
        version: str | None = None
        while True:
            try:
                if version is None:
                    version = await self._list()
                    self.listed.set()
                    if version is None:
                        await self._sleep(self._absent_recheck_s)
                        continue
                async for event_type, obj in self._source.watch(self.collection, version):
                    version = _version_of(obj) or version
                    if event_type == listing.BOOKMARK:
                        continue
                    # Inline, not a helper coroutine: every event of the cluster passes here.
                    try:
                        await self._handler.event(event_type, obj)
                    except Exception as exc:
                        # Moved past: the same event would fail the same way again.
                        log.exception("watch_event_not_applied", kind=self.name, error=str(exc))
                        self._on_error(f"{self.name}_watch")
                self._retry.reset()
            except listing.WatchExpired:
                log.info("watch_expired_relisting", kind=self.name)
                version = None
            except asyncio.CancelledError:
                raise
            except _ListingRefused as refused:
                await self._failed("listing_not_applied", refused.__cause__)
                version = None
            except Exception as exc:
                # The stream broke (or the listing could not be read): resume from the
                # last version seen; a version too old comes back as 410, then we relist.
                await self._failed("watch_failed", exc)

    async def relist(self) -> int:
        """List the collection again through the handler; returns how many objects."""
        async with self._listing:
            found = await self._source.list(self.collection)
            await self._handler.listed(found.items, found.resource_version)
        return len(found.items)

    async def _list(self) -> str | None:
        async with self._listing:
            found = await self._source.list(self.collection)
            try:
                await self._handler.listed(found.items, found.resource_version)
            except Exception as exc:
                raise _ListingRefused from exc
        return found.resource_version

    async def _failed(self, what: str, exc: BaseException | None) -> None:
        delay = self._retry.next_delay_s()
        log.warning(what, kind=self.name, error=str(exc), retry_after_s=round(delay, 3))
        self._on_error(f"{self.name}_watch")
        await self._sleep(delay)


class _ListingRefused(Exception):
    """The handler raised on a listing (the cause): list again after the backoff."""


def _version_of(obj: KubeObject) -> str | None:
    meta = obj.get("metadata")
    return meta.get("resourceVersion") if meta is not None else None
