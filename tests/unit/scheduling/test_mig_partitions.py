"""MIG on the DRA path, the engine's side: counters are never over-consumed, overlapping
instances exclude each other, a card's share device and its instances never hold the card
at once, and a request gets its instance by the MIG rules (fewest cards broken, v2.10's
profile and placement order)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from vgpu_operator.devices import dra, dra_mig
from vgpu_operator.scheduling.mig import mig_partitions as mp


def card(index: int, memory_mib: int = 81920) -> dra_mig.MigCardShape:
    return dra_mig.MigCardShape(
        uuid=f"GPU-{index:08x}-aaaa-bbbb-cccc-{index:012x}",
        index=index,
        product="NVIDIA H100 80GB HBM3",
        hami_type="NVIDIA-H100",
        memory_mib=memory_mib,
    )


def pool_of(*cards: dra_mig.MigCardShape, shared: list[Any] | None = None) -> mp.MigPool:
    slices = [dict(s) for s in dra_mig.pool_slices("node-a", [], list(cards), 1, None)]
    if shared is not None:
        slices[0]["spec"]["devices"] = shared
    return mp.read_mig_pool("node-a", slices)


def take(pool: mp.MigPool, ledger: mp.CounterLedger, profile: str) -> mp.MigDevice | None:
    chosen = mp.choose(mp.MigAsk(profile=profile), pool.devices, ledger)
    if chosen is not None:
        ledger.take(chosen.consumes)
    return chosen


def test_overlapping_instances_exclude_each_other() -> None:
    pool = pool_of(card(0))
    by_name = pool.by_name
    three_at_0 = by_name[dra_mig.instance_name(card(0).uuid, "3g.40gb", 0)]
    four_at_0 = by_name[dra_mig.instance_name(card(0).uuid, "4g.40gb", 0)]
    three_at_4 = by_name[dra_mig.instance_name(card(0).uuid, "3g.40gb", 4)]
    ledger = mp.ledger_for(pool, [three_at_0.name])
    assert not ledger.fits(four_at_0.consumes)  # memory slices 0-3 are taken
    assert ledger.fits(three_at_4.consumes)
    with pytest.raises(ValueError, match="exhausted"):
        ledger.take(four_at_0.consumes)
    assert ledger.left[three_at_0.consumes.keys().__iter__().__next__()]["compute-slices"] == 4


def test_counters_are_never_over_consumed_however_many_requests() -> None:
    pool = pool_of(card(0))
    ledger = mp.CounterLedger(pool.counters)
    placed = [take(pool, ledger, "1g.10gb") for _ in range(9)]
    assert sum(p is not None for p in placed) == 7  # seven compute slices, then none
    assert all(v >= 0 for counters in ledger.left.values() for v in counters.values())
    assert take(pool, ledger, "2g.20gb") is None  # the compute slices are all gone


def test_a_request_by_memory_takes_the_smallest_profile_that_holds_it() -> None:
    pool = pool_of(card(0))
    ledger = mp.CounterLedger(pool.counters)
    chosen = mp.choose(mp.MigAsk(memory_mib=15000), pool.devices, ledger)
    assert chosen is not None
    assert chosen.profile == "2g.20gb"
    chosen = mp.choose(mp.MigAsk(memory_mib=30000), pool.devices, ledger)
    assert chosen is not None
    assert chosen.profile == "3g.40gb"  # 3g before 4g: same memory, fewer slices


def test_small_instances_go_to_the_cards_end_leaving_its_start_to_big_ones() -> None:
    pool = pool_of(card(0))
    ledger = mp.CounterLedger(pool.counters)
    first = take(pool, ledger, "1g.10gb")
    assert first is not None
    assert first.start == 6  # v2.10: 1g from the highest start
    assert take(pool, ledger, "4g.40gb") is not None  # 0-3 still free
    # First fit by name would have put the 1g at 0 and refused the 4g.
    ff_ledger = mp.CounterLedger(pool.counters)
    ff = mp.first_fit(mp.MigAsk(profile="1g.10gb"), pool.devices, ff_ledger)
    assert ff is not None
    assert ff.start == 0
    ff_ledger.take(ff.consumes)
    assert mp.first_fit(mp.MigAsk(profile="4g.40gb"), pool.devices, ff_ledger) is None


def test_fewest_cards_broken_a_broken_card_is_filled_before_an_intact_one() -> None:
    pool = pool_of(card(0), card(1))
    ledger = mp.CounterLedger(pool.counters)
    a = take(pool, ledger, "2g.20gb")
    b = take(pool, ledger, "1g.10gb")
    c = take(pool, ledger, "3g.40gb")
    assert a is not None
    assert b is not None
    assert c is not None
    # All three on one card (2g, 1g and 3g fill its 8 memory slices): the other card
    # stays whole for a 7g.
    assert a.card == b.card == c.card
    seven = take(pool, ledger, "7g.80gb")
    assert seven is not None
    assert seven.card != a.card


def test_a_card_offered_as_shares_and_as_mig_is_never_both() -> None:
    share_device: dict[str, Any] = {
        "name": card(0).name,
        "allowMultipleAllocations": True,
        "attributes": {"mode": {"string": "hami-core"}},
        "capacity": {dra.MEMORY: {"value": "81920Mi"}},
        "consumesCounters": dra_mig.shared_device_counters(card(0).uuid),
    }
    pool = pool_of(card(0), shared=[share_device])
    assert card(0).name in pool.other_consumers
    held = mp.ledger_for(pool, [], shares_held=[card(0).name, card(0).name])
    assert take(pool, held, "1g.10gb") is None  # shares held: no instance
    one_instance = mp.ledger_for(pool, [pool.devices[0].name])
    assert not one_instance.fits(pool.other_consumers[card(0).name])  # and no share


def test_a_device_naming_unknown_counters_is_left_out_with_a_problem() -> None:
    slices = [dict(s) for s in dra_mig.pool_slices("node-a", [], [card(0)], 1, None)]
    slices[1]["spec"]["sharedCounters"] = []  # the counter set is missing
    pool = mp.read_mig_pool("node-a", slices)
    assert pool.devices == []
    assert pool.problems
    assert "unknown counters" in pool.problems[0]


def test_an_older_generations_slices_do_not_count() -> None:
    old = [dict(s) for s in dra_mig.pool_slices("node-a", [], [card(0), card(1)], 1, None)]
    new = [dict(s) for s in dra_mig.pool_slices("node-a", [], [card(0)], 2, None)]
    pool = mp.read_mig_pool("node-a", old + new)
    assert {d.card for d in pool.devices} == {card(0).name}
    assert set(pool.counters) == {dra_mig.counter_set_name(card(0).uuid)}
    assert pool.counters[dra_mig.counter_set_name(card(0).uuid)]["memory-slice-7"] == Fraction(1)


def test_the_engines_cards_of_a_mig_node_are_its_share_devices_only() -> None:
    from vgpu_operator.scheduling.dialects.claims import dra_pool

    shared = dra.CardShape(
        "GPU-shared-0", 1, "NVIDIA H100", "NVIDIA-H100", 81920, 100, 4, "hami-core"
    )
    slices = dra_mig.pool_slices("node-a", [shared], [card(0)], 1, None)
    pool = dra_pool.read_pool("node-a", slices)
    assert [c.id for c in pool.cards] == [shared.name]
    assert set(pool.devices) == {shared.name}
