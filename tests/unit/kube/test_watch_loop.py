"""The one list-then-watch loop: list, watch from the listing's version, resume a broken
or ended stream from the last version, relist on 410 Gone, wait a bounded backoff after
failures, and never let a handler's error stop it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import pytest

from vgpu_operator.kube import listing
from vgpu_operator.kube.watch_loop import Collection, Delays, WatchLoop
from vgpu_operator.wire import KubeObject, WatchEventType

COLLECTION = Collection("/api/v1/things", field_selector="metadata.name=one")


class ScriptDone(BaseException):
    """The script ran out: ends the loop (not an ``Exception``, which it would retry)."""


def obj(name: str, version: str) -> KubeObject:
    return {"metadata": {"name": name, "resourceVersion": version}}


Event = tuple[WatchEventType, KubeObject]


@dataclass
class Stream:
    """One watch: its events, then how it ends (None: the server closed it)."""

    events: list[Event]
    ends_with: Exception | None = None


@dataclass
class ScriptedSource:
    listings: list[listing.Listing | Exception]
    streams: list[Stream]
    #: What was asked, in order: ("list", None) or ("watch", version).
    calls: list[tuple[str, str | None]] = field(default_factory=list)

    async def list(self, collection: Collection) -> listing.Listing:
        assert collection == COLLECTION
        self.calls.append(("list", None))
        if not self.listings:
            raise ScriptDone
        step = self.listings.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    async def watch(self, collection: Collection, version: str) -> AsyncIterator[Event]:
        assert collection == COLLECTION
        self.calls.append(("watch", version))
        if not self.streams:
            raise ScriptDone
        stream = self.streams.pop(0)
        for event in stream.events:
            yield event
        if stream.ends_with is not None:
            raise stream.ends_with


@dataclass
class Recorder:
    """A handler that records what it was handed, and fails where told to."""

    seen: list[tuple[str, object]] = field(default_factory=list)
    fail_on_event: set[str] = field(default_factory=set)
    fail_listings: int = 0

    async def listed(self, items: Sequence[KubeObject], version: str | None) -> None:
        if self.fail_listings:
            self.fail_listings -= 1
            raise ValueError("cannot apply this listing")
        self.seen.append(("listed", ([i["metadata"]["name"] for i in items], version)))

    async def event(self, event_type: WatchEventType, obj: KubeObject) -> None:
        name = obj["metadata"]["name"]
        if name in self.fail_on_event:
            raise ValueError(f"cannot apply {name}")
        self.seen.append((event_type, name))


@dataclass
class Run:
    source: ScriptedSource
    handler: Recorder = field(default_factory=Recorder)
    slept: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def go(self) -> WatchLoop:
        async def sleep(delay: float) -> None:
            self.slept.append(delay)

        loop = WatchLoop(
            "thing",
            self.source,
            COLLECTION,
            self.handler,
            retry=Delays((1.0, 2.0, 4.0)),
            on_error=self.errors.append,
            sleep=sleep,
            absent_recheck_s=30.0,
        )

        async def main() -> None:
            with pytest.raises(ScriptDone):
                await loop.run()

        asyncio.run(main())
        return loop


def test_lists_then_watches_from_the_listing_version() -> None:
    run = Run(
        ScriptedSource(
            [listing.Listing([obj("a", "5")], "10")],
            [Stream([("ADDED", obj("b", "11")), ("MODIFIED", obj("a", "12"))])],
        )
    )
    loop = run.go()
    assert run.source.calls[:2] == [("list", None), ("watch", "10")]
    assert run.handler.seen == [("listed", (["a"], "10")), ("ADDED", "b"), ("MODIFIED", "a")]
    assert loop.listed.is_set()


def test_an_ended_stream_resumes_from_the_last_version_without_relisting() -> None:
    run = Run(
        ScriptedSource(
            [listing.Listing([], "10")],
            [
                Stream([("ADDED", obj("b", "11")), ("BOOKMARK", obj("", "15"))]),
                Stream([("DELETED", obj("b", "16"))]),
            ],
        )
    )
    run.go()
    assert run.source.calls == [("list", None), ("watch", "10"), ("watch", "15"), ("watch", "16")]
    # A bookmark moves the version on and reaches no handler.
    assert run.handler.seen == [("listed", ([], "10")), ("ADDED", "b"), ("DELETED", "b")]
    assert run.slept == []


def test_a_broken_stream_waits_then_resumes_from_the_last_version() -> None:
    run = Run(
        ScriptedSource(
            [listing.Listing([], "10")],
            [
                Stream([("ADDED", obj("b", "11"))], ends_with=ConnectionResetError("gone")),
                Stream([], ends_with=ConnectionResetError("still gone")),
                Stream([("ADDED", obj("c", "12"))]),
            ],
        )
    )
    run.go()
    assert run.source.calls == [
        ("list", None),
        ("watch", "10"),
        ("watch", "11"),
        ("watch", "11"),
        ("watch", "12"),
    ]
    assert run.slept == [1.0, 2.0]  # bounded backoff, reset by the stream that ended well
    assert run.errors == ["thing_watch", "thing_watch"]


def test_410_gone_relists_and_watches_from_the_new_listing() -> None:
    run = Run(
        ScriptedSource(
            [listing.Listing([obj("a", "5")], "10"), listing.Listing([obj("c", "40")], "41")],
            [
                Stream([], ends_with=listing.WatchExpired("too old")),
                Stream([("ADDED", obj("d", "42"))]),
            ],
        )
    )
    run.go()
    assert run.source.calls[:4] == [
        ("list", None),
        ("watch", "10"),
        ("list", None),
        ("watch", "41"),
    ]
    assert run.handler.seen == [
        ("listed", (["a"], "10")),
        ("listed", (["c"], "41")),
        ("ADDED", "d"),
    ]
    assert run.slept == []


def test_a_handler_error_on_one_event_does_not_stop_the_loop() -> None:
    run = Run(
        ScriptedSource(
            [listing.Listing([], "10")],
            [Stream([("ADDED", obj("bad", "11")), ("ADDED", obj("good", "12"))]), Stream([])],
        ),
        Recorder(fail_on_event={"bad"}),
    )
    run.go()
    assert ("ADDED", "good") in run.handler.seen
    assert run.errors == ["thing_watch"]
    # The loop moved past the event that failed: the next watch starts after both.
    assert run.source.calls[2] == ("watch", "12")


def test_a_listing_the_handler_refuses_is_listed_again_after_the_backoff() -> None:
    run = Run(
        ScriptedSource([listing.Listing([obj("a", "5")], "10")] * 2, [Stream([])]),
        Recorder(fail_listings=1),
    )
    loop = run.go()
    assert run.source.calls[:3] == [("list", None), ("list", None), ("watch", "10")]
    assert run.handler.seen == [("listed", (["a"], "10"))]
    assert run.slept == [1.0]
    assert loop.listed.is_set()


def test_a_failed_listing_is_retried() -> None:
    run = Run(
        ScriptedSource(
            [ConnectionRefusedError("down"), listing.Listing([], "10")],
            [Stream([])],
        )
    )
    run.go()
    assert run.source.calls[:3] == [("list", None), ("list", None), ("watch", "10")]
    assert run.slept == [1.0]


def test_a_kind_not_served_is_looked_for_again_later() -> None:
    run = Run(ScriptedSource([listing.Listing([], None), listing.Listing([], "3")], [Stream([])]))
    loop = run.go()
    assert run.source.calls[:3] == [("list", None), ("list", None), ("watch", "3")]
    assert run.slept == [30.0]
    assert loop.listed.is_set()  # an absent kind counts as listed (empty)


def test_relist_goes_through_the_same_handler() -> None:
    source = ScriptedSource([listing.Listing([obj("a", "5"), obj("b", "6")], "20")], [])
    handler = Recorder()
    loop = WatchLoop("thing", source, COLLECTION, handler)
    assert asyncio.run(loop.relist()) == 2
    assert handler.seen == [("listed", (["a", "b"], "20"))]


def test_delays_are_bounded_and_reset() -> None:
    delays = Delays((1.0, 5.0))
    assert [delays.next_delay_s() for _ in range(4)] == [1.0, 5.0, 5.0, 5.0]
    delays.reset()
    assert delays.next_delay_s() == 1.0
    with pytest.raises(ValueError, match="at least one"):
        Delays(())
