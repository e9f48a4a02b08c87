"""MIG in seed form: geometry tables, first allocation, first fit, reset, restore, filter."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vgpu_operator import errors
from vgpu_operator.devices import model
from vgpu_operator.scheduling.mig import mig

ONE_G = model.MigTemplate("1g.5gb", memory_mib=5120, cores=14, count=7)
TWO_G = model.MigTemplate("2g.10gb", memory_mib=10240, cores=28, count=3)
THREE_G = model.MigTemplate("3g.20gb", memory_mib=20480, cores=42, count=2)
SEVEN_G = model.MigTemplate("7g.40gb", memory_mib=40960, cores=100, count=1)

# The table of hami-semantics §12.1 and scenario mig-01.
A100_GEOMETRIES: tuple[model.Geometry, ...] = (
    (ONE_G,),
    (model.MigTemplate("1g.5gb", memory_mib=5120, cores=14, count=1), TWO_G),
    (THREE_G,),
    (SEVEN_G,),
)
A100 = mig.KnownGeometries(models=("A100-SXM4-40GB", "A100-PCIE-40GB"), geometries=A100_GEOMETRIES)
H100_GEOMETRIES: tuple[model.Geometry, ...] = ((SEVEN_G,),)
KNOWN = (A100, mig.KnownGeometries(models=("H100",), geometries=H100_GEOMETRIES))

CARD_ID = "GPU-9eee322d-8b0c-b1d5-d35d-774cebab9757"


def make_card(
    mode: str = model.MODE_MIG, card_type: str = "NVIDIA A100-SXM4-40GB"
) -> model.DeviceUsage:
    card = model.DeviceUsage(
        id=CARD_ID,
        index=0,
        count=7,
        used=0,
        total_memory_mib=40960,
        used_memory_mib=0,
        total_cores=100,
        used_cores=0,
        type=card_type,
        numa=0,
        health=True,
        mode=mode,
    )
    mig.attach(card, KNOWN)
    return card


def in_use_slots(card: model.DeviceUsage) -> list[int]:
    assert card.mig is not None
    return [slot for slot, used in enumerate(card.mig.in_use) if used]


# --- geometry tables -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("card_type", "known", "expected"),
    [
        pytest.param("NVIDIA A100-SXM4-40GB", KNOWN, A100_GEOMETRIES, id="model-substring"),
        pytest.param("NVIDIA A100-PCIE-40GB", KNOWN, A100_GEOMETRIES, id="second-model-of-entry"),
        pytest.param("NVIDIA H100 80GB HBM3", KNOWN, H100_GEOMETRIES, id="second-entry"),
        pytest.param("NVIDIA a100-sxm4-40gb", KNOWN, (), id="case-sensitive"),
        pytest.param("NVIDIA A100-SXM4-80GB", KNOWN, (), id="no-entry-matches"),
        pytest.param(
            "NVIDIA H100-A100-SXM4-40GB",
            (KNOWN[1], KNOWN[0]),
            H100_GEOMETRIES,
            id="first-matching-entry-wins",
        ),
        pytest.param("NVIDIA A100-SXM4-40GB", (), (), id="empty-table"),
    ],
)
def test_geometries_for_matches_first_entry_by_substring(
    card_type: str, known: tuple[mig.KnownGeometries, ...], expected: tuple[model.Geometry, ...]
) -> None:
    assert mig.geometries_for(card_type, known) == expected


@pytest.mark.parametrize(
    ("mode", "card_type", "expected"),
    [
        pytest.param(
            model.MODE_MIG,
            "NVIDIA A100-SXM4-40GB",
            model.MigState(geometries=A100_GEOMETRIES),
            id="mig-card-gets-table-idle",
        ),
        pytest.param(
            model.MODE_MIG, "NVIDIA T4", model.MigState(geometries=()), id="mig-card-unknown-model"
        ),
        pytest.param(model.MODE_HAMI_CORE, "NVIDIA A100-SXM4-40GB", None, id="hami-core-untouched"),
    ],
)
def test_attach_sets_table_only_on_mig_cards(
    mode: str, card_type: str, expected: model.MigState | None
) -> None:
    assert make_card(mode, card_type).mig == expected


def test_flatten_repeats_each_template_count_times_in_order() -> None:
    one = model.MigTemplate("1g.5gb", 5120, 14, 1)
    assert mig.flatten((one, TWO_G)) == [one, TWO_G, TWO_G, TWO_G]
    assert mig.flatten((model.MigTemplate("x", 1, 1, 0), THREE_G)) == [THREE_G, THREE_G]


# --- instance ids ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uuid", "expected"),
    [
        pytest.param("GPU-a[0-2]", ("GPU-a", (0, 2)), id="suffix"),
        pytest.param("GPU-a[12-34]", ("GPU-a", (12, 34)), id="multi-digit"),
        pytest.param("GPU-a", ("GPU-a", None), id="plain"),
    ],
)
def test_split_instance_uuid_reads_suffix(
    uuid: str, expected: tuple[str, tuple[int, int] | None]
) -> None:
    assert mig.split_instance_uuid(uuid) == expected


@pytest.mark.parametrize(
    "uuid",
    [
        pytest.param("GPU-a[0]", id="no-slot"),
        pytest.param("GPU-a[x-1]", id="not-a-number"),
        pytest.param("GPU-a[0-1]x", id="trailing"),
        pytest.param("GPU-a[-1-1]", id="negative"),
        pytest.param("GPU-a0-1]", id="no-opening"),
    ],
)
def test_split_instance_uuid_malformed_raises_codec_error(uuid: str) -> None:
    with pytest.raises(errors.CodecError):
        mig.split_instance_uuid(uuid)


@given(geometry=st.integers(0, 99), slot=st.integers(0, 99))
def test_instance_uuid_round_trips(geometry: int, slot: int) -> None:
    uuid = mig.instance_uuid(CARD_ID, geometry, slot)
    assert uuid == f"{CARD_ID}[{geometry}-{slot}]"
    assert mig.split_instance_uuid(uuid) == (CARD_ID, (geometry, slot))


# --- first allocation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_mib", "geometry", "slot", "instance"),
    [
        pytest.param(4096, 0, 0, ONE_G, id="small-takes-geometry-0"),
        pytest.param(5120, 0, 0, ONE_G, id="equal-memory-fits"),
        pytest.param(8192, 1, 1, TWO_G, id="2g-slot-after-1g-of-geometry-1"),
        pytest.param(20000, 2, 0, THREE_G, id="3g-geometry-2"),
        pytest.param(40000, 3, 0, SEVEN_G, id="full-card-geometry-3"),
    ],
)
def test_first_allocation_picks_first_geometry_with_big_enough_template(
    request_mib: int, geometry: int, slot: int, instance: model.MigTemplate
) -> None:
    card = make_card()
    uuid, memory_mib, cores = mig.allocate(card, request_mib)
    assert uuid == f"{CARD_ID}[{geometry}-{slot}]"
    assert (memory_mib, cores) == (instance.memory_mib, instance.cores)
    assert card.mig is not None
    assert card.mig.active == geometry
    assert card.mig.instances == mig.flatten(A100_GEOMETRIES[geometry])
    assert in_use_slots(card) == [slot]
    # The card's own booking is the caller's job.
    assert (card.used_memory_mib, card.used_cores, card.used) == (0, 0, 0)


def test_first_allocation_larger_than_every_template_fails() -> None:
    card = make_card()
    assert not mig.custom_filter(card, 50000, [])
    with pytest.raises(mig.MigAllocationError):
        mig.allocate(card, 50000)
    assert card.mig == model.MigState(geometries=A100_GEOMETRIES)


@pytest.mark.parametrize(
    "card",
    [
        pytest.param(make_card(model.MODE_HAMI_CORE), id="hami-core"),
        pytest.param(make_card(card_type="NVIDIA T4"), id="mig-without-table"),
    ],
)
def test_allocate_on_card_without_geometries_raises(card: model.DeviceUsage) -> None:
    with pytest.raises(mig.MigAllocationError):
        mig.allocate(card, 1024)
    assert isinstance(mig.MigAllocationError("x"), ValueError)


ONE_G_TWICE = model.MigTemplate("1g.5gb", memory_mib=5120, cores=14, count=2)
NO_TWO_G = model.MigTemplate("2g.10gb", memory_mib=10240, cores=28, count=0)


@pytest.mark.parametrize(
    ("geometry", "expected_uuid"),
    [
        # v2.9 wrote the template's position (1) here instead of the slot (2).
        pytest.param((ONE_G_TWICE, TWO_G), f"{CARD_ID}[0-2]", id="slot-not-template-position"),
        pytest.param((ONE_G_TWICE, NO_TWO_G, TWO_G), f"{CARD_ID}[0-2]", id="zero-count-skipped"),
        pytest.param((ONE_G_TWICE, NO_TWO_G), None, id="only-zero-count-fits"),
    ],
)
def test_first_allocation_slot_counts_instances_before_template(
    geometry: model.Geometry, expected_uuid: str | None
) -> None:
    card = make_card()
    card.mig = model.MigState(geometries=(geometry,))
    assert mig.custom_filter(card, 8192, []) is (expected_uuid is not None)
    if expected_uuid is None:
        with pytest.raises(mig.MigAllocationError):
            mig.allocate(card, 8192)
    else:
        assert mig.allocate(card, 8192)[0] == expected_uuid


# --- filling the active geometry ------------------------------------------------------


def test_seven_small_instances_then_eighth_fails_filter() -> None:
    card = make_card()
    uuids = []
    for _ in range(7):
        assert mig.custom_filter(card, 4096, [])
        uuids.append(mig.allocate(card, 4096)[0])
    assert uuids == [f"{CARD_ID}[0-{slot}]" for slot in range(7)]
    assert not mig.custom_filter(card, 4096, [])
    with pytest.raises(mig.MigAllocationError):
        mig.allocate(card, 4096)


def test_mixed_sizes_first_fit_wastes_big_instances() -> None:
    card = make_card()
    # geometry 1 = [1g.5gb, 2g.10gb, 2g.10gb, 2g.10gb]
    steps = [
        (8192, "[1-1]", 10240),
        (4096, "[1-0]", 5120),
        (4096, "[1-2]", 10240),  # first fit: the small task takes a 2g instance
        (8192, "[1-3]", 10240),
    ]
    for request_mib, suffix, memory_mib in steps:
        uuid, got_memory_mib, _ = mig.allocate(card, request_mib)
        assert (uuid, got_memory_mib) == (CARD_ID + suffix, memory_mib)
    assert not mig.custom_filter(card, 4096, [])


def test_active_geometry_locks_out_larger_requests() -> None:
    card = make_card()
    mig.allocate(card, 4096)
    # Six 1g.5gb instances are free, but geometry 0 has nothing of 8 GiB.
    assert not mig.custom_filter(card, 8192, [])
    with pytest.raises(mig.MigAllocationError):
        mig.allocate(card, 8192)


# --- reset -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        pytest.param(model.MigState(), True, id="idle"),
        pytest.param(model.MigState((), 0, [ONE_G, ONE_G], [False, False]), True, id="all-free"),
        pytest.param(model.MigState((), 0, [ONE_G, ONE_G], [False, True]), False, id="one-used"),
    ],
)
def test_needs_reset_when_no_instance_in_use(state: model.MigState, expected: bool) -> None:
    assert mig.needs_reset(state) is expected


def test_release_of_last_instance_frees_geometry_for_next_choice() -> None:
    card = make_card()
    mig.allocate(card, 4096)
    mig.allocate(card, 4096)
    mig.release(card, 0, 0)
    assert card.mig is not None
    assert card.mig.active == 0
    assert not mig.custom_filter(card, 40000, [])
    mig.release(card, 0, 1)
    assert card.mig == model.MigState(geometries=A100_GEOMETRIES)
    assert mig.custom_filter(card, 40000, [])
    assert mig.allocate(card, 40000)[0] == f"{CARD_ID}[3-0]"


def test_active_geometry_with_all_instances_free_is_reset_on_allocate() -> None:
    card = make_card()
    assert card.mig is not None
    card.mig.active = 0
    card.mig.instances = mig.flatten(A100_GEOMETRIES[0])
    card.mig.in_use = [False] * 7
    assert mig.custom_filter(card, 20000, [])
    assert mig.allocate(card, 20000)[0] == f"{CARD_ID}[2-0]"


@pytest.mark.parametrize(
    ("geometry", "slot"),
    [
        pytest.param(1, 0, id="other-geometry"),
        pytest.param(0, 9, id="slot-out-of-range"),
        pytest.param(0, 3, id="slot-already-free"),
    ],
)
def test_release_of_unknown_instance_changes_nothing(geometry: int, slot: int) -> None:
    card = make_card()
    mig.allocate(card, 4096)
    assert card.mig is not None
    before = card.mig.copy()
    mig.release(card, geometry, slot)
    assert card.mig == before


# --- restore from running pods --------------------------------------------------------


def test_restore_activates_first_geometry_and_marks_slots() -> None:
    card = make_card()
    mig.restore(card, 1, 2)
    mig.restore(card, 1, 3)
    assert card.mig is not None
    assert card.mig.active == 1
    assert in_use_slots(card) == [2, 3]
    assert card.health
    # First fit continues around the restored instances.
    assert mig.allocate(card, 8192)[0] == f"{CARD_ID}[1-1]"
    assert mig.allocate(card, 4096)[0] == f"{CARD_ID}[1-0]"
    assert not mig.custom_filter(card, 1, [])


def test_restore_entry_of_other_geometry_occupies_its_slices() -> None:
    card = make_card()
    mig.restore(card, 0, 4)
    mig.restore(card, 2, 0)  # a 3g.20gb at start 0: slices 0-3
    assert card.mig is not None
    assert card.mig.active == 0
    assert in_use_slots(card) == [4]
    assert card.mig.spots == [(0, 4)]
    assert card.health
    # Geometry 0's 1g.5gb at 0..3 overlap the 3g; 5 and 6 are free.
    assert mig.allocate(card, 4096)[0] == f"{CARD_ID}[0-5]"
    assert mig.allocate(card, 4096)[0] == f"{CARD_ID}[0-6]"
    assert not mig.custom_filter(card, 1, [])


def test_instances_of_no_one_geometry_leave_only_free_slices() -> None:
    # Issue 29: HAMi v2.10 put a 3g.20gb at start 4 and a 2g.10gb at start 0. No
    # geometry holds both; a new 3g.20gb must not land on the 2g (start 0).
    card = make_card()
    mig.restore(card, 2, 1)  # 3g.20gb at 4
    mig.restore(card, 1, 1)  # 2g.10gb at 0
    assert not mig.custom_filter(card, 20000, [])
    # Slices 2-3 are free: a 2g.10gb fits there (geometry 1, slot 2), then nothing.
    assert mig.custom_filter(card, 8192, [])
    assert mig.allocate(card, 8192)[0] == f"{CARD_ID}[1-2]"
    assert not mig.custom_filter(card, 1, [])
    with pytest.raises(mig.MigAllocationError):
        mig.allocate(card, 1)


def test_only_spots_let_any_geometry_take_free_slices() -> None:
    card = make_card()
    mig.occupy(card, 0, 4)  # a 4g.20gb no geometry has
    assert card.mig is not None
    assert not mig.needs_reset(card.mig)
    # The first free slot in geometry order: geometry 0's 1g.5gb at 4.
    assert mig.allocate(card, 4096)[0] == f"{CARD_ID}[0-4]"
    assert card.mig.active == 0
    # A 2g.10gb at 4 would overlap it, at 6 there is none: no 2g.10gb is left.
    assert not mig.custom_filter(card, 8192, [])


def test_spots_on_a_card_not_in_mig_mode_close_it() -> None:
    card = make_card(model.MODE_HAMI_CORE)
    mig.occupy(card, 0, 1)
    assert card.health is False


def test_instance_of_unknown_place_outside_the_geometry_closes_the_card() -> None:
    card = make_card()
    assert card.mig is not None
    card.mig = model.MigState(
        geometries=((model.MigTemplate("small", 5120, 14, 7),), A100_GEOMETRIES[2])
    )
    mig.restore(card, 1, 0)
    mig.restore(card, 0, 3)  # "small" has no known place: its slices are unknown
    assert card.health is False


@pytest.mark.parametrize(
    ("card", "entries"),
    [
        pytest.param(make_card(model.MODE_HAMI_CORE), [(0, 0)], id="hami-core-card"),
        pytest.param(make_card(model.MODE_MPS), [(0, 0)], id="mps-card"),
        pytest.param(make_card(card_type="NVIDIA T4"), [(0, 0)], id="mig-card-without-table"),
        pytest.param(make_card(), [(4, 0)], id="unknown-geometry"),
        pytest.param(make_card(), [(0, 7)], id="slot-past-geometry"),
        pytest.param(make_card(), [(0, 1), (0, 9)], id="later-slot-past-geometry"),
    ],
)
def test_restore_that_cannot_be_placed_marks_card_unhealthy(
    card: model.DeviceUsage, entries: list[tuple[int, int]]
) -> None:
    for geometry, slot in entries:
        mig.restore(card, geometry, slot)
    assert card.health is False


# --- filter ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setup", "request_mib", "picked", "expected"),
    [
        pytest.param([], 20000, [], True, id="idle-3g"),
        pytest.param([], 20000, [20000], True, id="idle-second-3g"),
        pytest.param([], 20000, [20000, 20000], False, id="idle-third-3g"),
        pytest.param([], 4096, [4096] * 6, True, id="idle-seventh-1g"),
        pytest.param([], 4096, [4096] * 7, False, id="idle-eighth-1g"),
        pytest.param([4096], 5120, [5120], True, id="equal-memory-fits-active"),
        pytest.param([4096] * 5, 4096, [4096], True, id="five-used-one-picked"),
        pytest.param([4096] * 5, 4096, [4096, 4096], False, id="five-used-two-picked"),
        pytest.param([8192], 8192, [8192], True, id="geometry-1-second-2g"),
        pytest.param([8192], 8192, [8192, 8192], False, id="geometry-1-fourth-2g"),
        pytest.param([8192], 4096, [8192, 8192], True, id="geometry-1-small-after-2g"),
    ],
)
def test_custom_filter_counts_earlier_picks_on_this_card(
    setup: list[int], request_mib: int, picked: list[int], expected: bool
) -> None:
    card = make_card()
    for request in setup:
        mig.allocate(card, request)
    before = card.copy()
    assert mig.custom_filter(card, request_mib, picked) is expected
    assert card == before


@pytest.mark.parametrize(
    "card",
    [
        pytest.param(make_card(model.MODE_HAMI_CORE), id="hami-core"),
        pytest.param(make_card(model.MODE_MPS), id="mps"),
    ],
)
def test_custom_filter_passes_non_mig_cards(card: model.DeviceUsage) -> None:
    assert mig.custom_filter(card, 10**6, [1, 2, 3])


def test_custom_filter_fails_mig_card_without_table() -> None:
    assert not mig.custom_filter(make_card(card_type="NVIDIA T4"), 1, [])


# --- properties: the filter predicts allocation ----------------------------------------

MEMORIES_MIB = (1, 4096, 5120, 8192, 10240, 20000, 20480, 40000, 40960, 50000)

templates = st.builds(
    model.MigTemplate,
    name=st.just("t"),
    memory_mib=st.sampled_from((5120, 10240, 20480, 40960)),
    cores=st.integers(1, 100),
    count=st.integers(0, 3),
)
geometry_tables = st.lists(st.lists(templates, min_size=1, max_size=3).map(tuple), max_size=4).map(
    tuple
)


@given(
    table=geometry_tables,
    earlier=st.lists(st.sampled_from(MEMORIES_MIB), max_size=6),
    request_mib=st.sampled_from(MEMORIES_MIB),
    repeats=st.integers(1, 4),
)
def test_filter_with_picks_agrees_with_sequential_allocation(
    table: tuple[model.Geometry, ...], earlier: list[int], request_mib: int, repeats: int
) -> None:
    card = make_card()
    card.mig = model.MigState(geometries=table)
    for request in earlier:
        if mig.custom_filter(card, request, []):
            mig.allocate(card, request)
    # One container asking for `repeats` instances of this card: the filter, asked before
    # each pick with the earlier picks, must agree with allocating them one after another.
    trial = card.copy()
    for pick in range(repeats):
        fits = mig.custom_filter(card, request_mib, [request_mib] * pick)
        try:
            _, memory_mib, _ = mig.allocate(trial, request_mib)
        except mig.MigAllocationError:
            assert not fits
            break
        assert fits
        assert memory_mib >= request_mib


@given(table=geometry_tables, requests=st.lists(st.sampled_from(MEMORIES_MIB), max_size=12))
def test_allocations_never_share_an_instance_and_release_restores_idle(
    table: tuple[model.Geometry, ...], requests: list[int]
) -> None:
    card = make_card()
    card.mig = model.MigState(geometries=table)
    taken: list[tuple[int, int]] = []
    for request in requests:
        if not mig.custom_filter(card, request, []):
            continue
        _, suffix = mig.split_instance_uuid(mig.allocate(card, request)[0])
        assert suffix is not None
        assert suffix not in taken
        taken.append(suffix)
    assert card.mig is not None
    assert sorted(slot for _, slot in taken) == in_use_slots(card)
    for geometry, slot in taken:
        mig.release(card, geometry, slot)
    assert card.mig == model.MigState(geometries=table)


# --- placements for HAMi v2.10's record --------------------------------------------------


def _geometry(*shapes: tuple[str, int]) -> model.Geometry:
    return tuple(model.MigTemplate(name, 1, 1, count) for name, count in shapes)


@pytest.mark.parametrize(
    ("shapes", "expected"),
    [
        ((("1g.5gb", 7),), [(i, 1) for i in range(7)]),
        ((("1g.5gb", 1), ("2g.10gb", 3)), [(6, 1), (0, 2), (2, 2), (4, 2)]),
        ((("3g.20gb", 2),), [(0, 4), (4, 4)]),
        ((("4g.20gb", 1), ("2g.10gb", 1), ("1g.5gb", 1)), [(0, 4), (4, 2), (6, 1)]),
        ((("3g.20gb", 1), ("2g.10gb", 1), ("1g.5gb", 2)), [(4, 4), (0, 2), (2, 1), (3, 1)]),
        ((("7g.40gb", 1),), [(0, 8)]),
        ((("1g.5gb", 8),), [None] * 8),
        ((("small", 1),), [None]),
    ],
    ids=["7x1g", "1g+3x2g", "2x3g", "4g+2g+1g", "3g+2g+2x1g", "7g", "too-many", "unknown"],
)
def test_placements_follow_nvidias_rules(
    shapes: tuple[tuple[str, int], ...], expected: list[tuple[int, int] | None]
) -> None:
    assert mig.placements(_geometry(*shapes)) == expected


def test_find_instance_prefers_the_named_geometry() -> None:
    geometries = mig.MigTable((_geometry(("1g.5gb", 7)), _geometry(("1g.5gb", 1), ("2g.10gb", 3))))
    assert mig.find_instance(geometries, "1g.5gb", 6, 1) == (0, 6)
    assert mig.find_instance(geometries, "1g.5gb", 6, 1, prefer=1) == (1, 0)
    assert mig.find_instance(geometries, "2g.10gb", 2, 2) == (1, 2)
    assert mig.find_instance(geometries, "3g.20gb", 0, 4) is None
    assert mig.describe(geometries, 1, 3) == ("2g.10gb", 4, 2)
    assert mig.describe(geometries, 2, 0) is None


# --- HAMi v2.10's profiles and placements ----------------------------------------------


def _spots(*starts: int, size: int = 1) -> tuple[model.MigPlacement, ...]:
    return tuple((start, size) for start in starts)


# HAMi v2.10's a100MigProfiles (mig_capability_test.go).
A100_PROFILES = (
    model.MigProfile("1g.5gb", 5120, 14, 1, _spots(0, 1, 2, 3, 4, 5, 6)),
    model.MigProfile("2g.10gb", 10240, 28, 2, _spots(0, 2, 4, size=2)),
    model.MigProfile("3g.20gb", 20480, 42, 3, _spots(0, 4, size=4)),
)


def profile_card(*profiles: model.MigProfile) -> model.DeviceUsage:
    card = make_card()
    mig.attach(card, KNOWN, profiles or A100_PROFILES)
    return card


def _place(card: model.DeviceUsage, memory_mib: int) -> tuple[str, model.MigPlacement]:
    uuid, _, _ = mig.allocate(card, memory_mib)
    _, instance = mig.split_instance_uuid(uuid)
    assert instance is not None
    described = mig.describe(mig.MigTable(profiles=A100_PROFILES), *instance)
    assert described is not None
    return described[0], described[1:]


def test_published_profiles_win_over_the_models_geometries() -> None:
    card = profile_card()
    assert card.mig is not None
    assert card.mig.profiles == A100_PROFILES
    assert card.mig.geometries == ()


def test_smallest_profile_holding_the_request_in_balanced_places() -> None:
    # TestSelectMigPlacementUsesBalancedPacking and AddResourceUsage: 1g and 3g from the
    # highest start, the others from the lowest; the profile's memory and cores booked.
    card = profile_card()
    assert mig.allocate(card, 10000) == (f"{CARD_ID}[1-0]", 10240, 28)
    assert _place(card, 20000) == ("3g.20gb", (4, 4))
    assert _place(card, 4096) == ("1g.5gb", (3, 1))
    assert _place(card, 4096) == ("1g.5gb", (2, 1))
    assert not mig.custom_filter(card, 1, [])


def test_a_larger_profile_serves_when_the_smallest_has_no_room() -> None:
    card = profile_card()
    for start in (0, 2, 4):
        mig.occupy(card, start, 2)
    # TestCustomFilterUsesReportedPlacementCapacity: no fourth 2g, a 1g at 6 remains.
    assert not mig.custom_filter(card, 10000, [])
    assert mig.custom_filter(card, 5000, [])
    assert not mig.custom_filter(card, 5000, [5000])
    assert _place(card, 5000) == ("1g.5gb", (6, 1))


def test_restore_by_profile_and_placement() -> None:
    card = profile_card()
    mig.restore(card, 2, 1)  # 3g.20gb at 4
    mig.restore(card, 1, 0)  # 2g.10gb at 0
    assert card.health
    assert not mig.custom_filter(card, 20000, [])
    assert _place(card, 8192) == ("2g.10gb", (2, 2))


@pytest.mark.parametrize(("first", "second"), [(3, 0), (0, 7), (-1, 0)])
def test_restore_of_an_unpublished_instance_closes_the_card(first: int, second: int) -> None:
    card = profile_card()
    mig.restore(card, first, second)
    assert card.health is False


def test_find_and_describe_published_instances() -> None:
    table = mig.MigTable(profiles=A100_PROFILES)
    assert mig.find_instance(table, "2g.10gb", 4, 2) == (1, 2)
    assert mig.find_instance(table, "2g.10gb", 3, 2) is None
    assert mig.find_instance(table, "4g.20gb", 0, 4) is None
    assert mig.describe(table, 0, 6) == ("1g.5gb", 6, 1)
    assert mig.describe(table, 0, 7) is None


@given(requests=st.lists(st.sampled_from(MEMORIES_MIB), max_size=12))
def test_published_instances_never_overlap(requests: list[int]) -> None:
    card = profile_card()
    taken: list[model.MigPlacement] = []
    for request in requests:
        fits = mig.custom_filter(card, request, [])
        try:
            _, place = _place(card, request)
        except mig.MigAllocationError:
            assert not fits
            continue
        assert fits
        start, size = place
        assert all(start + size <= s or s + n <= start for s, n in taken)
        taken.append(place)


@given(
    spots=st.lists(
        st.sampled_from([(0, 1), (3, 1), (6, 1), (0, 2), (2, 2), (4, 2), (0, 4), (4, 4)]),
        max_size=3,
    ),
    requests=st.lists(st.sampled_from(MEMORIES_MIB), max_size=8),
)
def test_geometry_card_with_spots_never_overlaps(
    spots: list[model.MigPlacement], requests: list[int]
) -> None:
    card = make_card()
    for start, size in spots:
        mig.occupy(card, start, size)
    taken = list(spots)
    for request in requests:
        try:
            uuid, _, _ = mig.allocate(card, request)
        except mig.MigAllocationError:
            continue
        _, instance = mig.split_instance_uuid(uuid)
        assert instance is not None
        described = mig.describe(mig.MigTable(A100_GEOMETRIES), *instance)
        assert described is not None
        start, size = described[1:]
        assert all(start + size <= s or s + n <= start for s, n in taken), (spots, requests)
        taken.append((start, size))
