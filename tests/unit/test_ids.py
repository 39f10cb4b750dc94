"""Deterministic occurrence ids and jitter: same inputs, same answers, in every process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from punctual.domain.ids import (
    MAX_WINDOW_SECONDS,
    available_at,
    is_manual,
    jitter_seconds,
    manual_tag,
    occurrence_id,
    occurrence_name,
    occurrence_parts,
)

ID_PATTERN = re.compile(r"^occ_.+_[0-9]+_[0-9]+$")  # occ_<schedule>_<instant>_<version>
SAMPLES = [
    ("sch_1", 1, 1_772_841_600),
    ("sch_1", 2, 1_772_841_600),
    ("sch_1", 1, 1_772_841_660),
    ("tenant/sch-\u00e9", 7, 0),
    ("sch_a_b", 1, 0),
]


def test_occurrence_id_is_deterministic_and_well_formed():
    # GIVEN the same (schedule, version, instant) twice
    first = occurrence_id("sch_1", 3, 1_772_841_600)
    second = occurrence_id("sch_1", 3, 1_772_841_600)
    # WHEN compared; THEN they are equal, and readable: schedule, instant, version
    assert first == second
    assert ID_PATTERN.match(first), first
    assert first == "occ_sch_1_1772841600_3"


@settings(max_examples=300, deadline=None)
@given(
    schedule_id=st.text(min_size=1, max_size=12),
    version=st.integers(0, 10**10 - 1),
    scheduled_for=st.integers(0, 10**12 - 1),
)
def test_occurrence_parts_reverses_occurrence_id(
    schedule_id: str, version: int, scheduled_for: int
):
    # GIVEN any schedule id (underscores, digits, unicode) and any version and instant
    # WHEN the id is made and read back; THEN the triple comes back unchanged
    text = occurrence_id(schedule_id, version, scheduled_for)
    assert occurrence_parts(text) == (schedule_id, version, scheduled_for)


@pytest.mark.parametrize(
    "text",
    [
        "sch_1_100_1",  # no occ_ prefix
        "occ_sch_1",  # parts missing
        "occ__100_1",  # no schedule
        "occ_sch_1_0100_1",  # leading zero: another spelling of occ_sch_1_100_1
        "occ_sch_1_100_01",
        "occ_sch_1_-100_1",
        "occ_sch_1_1e3_1",
        "occ_sch_1_\u0661\u0660_1",  # Arabic-Indic digits pass str.isdigit
        "occ_a2b3c4d5e6f7g2h3i4j5k6l7m2",  # an id of the old, hashed form
    ],
)
def test_occurrence_parts_refuses_what_occurrence_id_never_makes(text: str):
    # GIVEN text that is not an id we make; WHEN parsed; THEN ValueError (a 404, not a read)
    with pytest.raises(ValueError, match="not an occurrence id"):
        occurrence_parts(text)


@pytest.mark.parametrize(
    "bad", [("", 1, 100), ("sch_1", -1, 100), ("sch_1", 1, -5)], ids=["empty", "version", "time"]
)
def test_occurrence_id_refuses_what_it_could_not_read_back(bad: tuple[str, int, int]):
    # GIVEN an empty schedule id or a negative number; WHEN an id is made; THEN ValueError
    with pytest.raises(ValueError, match="non-negative"):
        occurrence_id(*bad)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        pytest.param(("sch_1", 1, 100), ("sch_2", 1, 100), id="schedule"),
        pytest.param(("sch_1", 1, 100), ("sch_1", 2, 100), id="version"),
        pytest.param(("sch_1", 1, 100), ("sch_1", 1, 160), id="instant"),
        pytest.param(("a1", 2, 3), ("a", 12, 3), id="schedule_version_concat"),
        pytest.param(("a", 12, 3), ("a", 1, 23), id="version_instant_concat"),
        pytest.param(("a", 1, 23), ("a1", 2, 3), id="three_way_concat"),
        pytest.param(("a_1", 2, 3), ("a", 1, 2), id="underscore_in_schedule"),
        pytest.param(("sch", 1, 100), ("SCH", 1, 100), id="case"),
    ],
)
def test_occurrence_id_distinct_for_distinct_inputs(
    left: tuple[str, int, int], right: tuple[str, int, int]
):
    # GIVEN two different triples, some of which concatenate to the same text
    # WHEN their ids are computed
    # THEN the ids differ
    assert occurrence_id(*left) != occurrence_id(*right)


@settings(max_examples=200, deadline=None)
@given(
    triples=st.lists(
        st.tuples(
            st.text(alphabet="a1-_", min_size=1, max_size=4),
            st.integers(1, 30),
            st.integers(0, 300),
        ),
        min_size=2,
        max_size=30,
        unique=True,
    )
)
def test_occurrence_id_no_collisions_among_similar_triples(
    triples: list[tuple[str, int, int]],
) -> None:
    # GIVEN distinct triples drawn from a tiny alphabet (many share concatenations)
    # WHEN ids are computed
    ids = [occurrence_id(*t) for t in triples]
    # THEN every id is distinct
    assert len(set(ids)) == len(triples)


@settings(max_examples=200, deadline=None)
@given(
    schedule_id=st.text(min_size=1, max_size=12),
    version=st.integers(0, 10**10 - 1),
    scheduled_for=st.integers(0, 10**12 - 1),
    key=st.text(max_size=20),
)
def test_manual_occurrence_id_reads_back_and_never_equals_a_fires(
    schedule_id: str, version: int, scheduled_for: int, key: str
):
    # GIVEN a run-now request's tag for any schedule and Idempotency-Key
    tag = manual_tag(schedule_id, key)
    # WHEN its occurrence id is made
    text = occurrence_id(schedule_id, version, scheduled_for, tag)
    # THEN it reads back with its tag, is manual, and is no fire's id at the same instant
    assert occurrence_name(text) == (schedule_id, version, scheduled_for, tag)
    assert occurrence_parts(text) == (schedule_id, version, scheduled_for)
    assert is_manual(text)
    fire = occurrence_id(schedule_id, version, scheduled_for)
    assert text != fire
    assert not is_manual(fire)


def test_manual_tag_is_one_per_schedule_and_key_and_random_without_a_key():
    # GIVEN the same key on one schedule, on another, and no key at all
    # THEN the same key on the same schedule gives the same tag; anything else another one
    assert manual_tag("sch_a.x", "k") == manual_tag("sch_a.x", "k")
    assert manual_tag("sch_a.x", "k") != manual_tag("sch_a.y", "k")
    assert manual_tag("sch_a.x", "k") != manual_tag("sch_a.x", "k2")
    assert manual_tag("sch_a.x", None) != manual_tag("sch_a.x", None)


@pytest.mark.parametrize(
    "text",
    [
        "occ_sch_1_100_1.m",  # no tag
        "occ_sch_1_100_1.mABCDEFGHIJKLM",  # upper case: not base32 as made
        "occ_sch_1_100_1.mabcdefghijkl",  # 12 characters
        "occ_sch_1_100_1.mabcdefghijklmn",  # 14
        "occ_sch_1_100_1.mabcdefghijk1m",  # 1 is not in the alphabet
        "occ_sch_1_100_1.xabcdefghijklm",  # another mark
        "occ_sch_1_100_01.mabcdefghijklm",  # leading zero
    ],
)
def test_occurrence_name_refuses_a_manual_id_never_made(text: str):
    with pytest.raises(ValueError, match="not an occurrence id"):
        occurrence_name(text)


def test_jitter_seconds_is_deterministic_and_in_window():
    # GIVEN an id and a range of windows
    occ = occurrence_id("sch_1", 1, 1_772_841_600)
    for window in (1, 2, 7, 60, 300, MAX_WINDOW_SECONDS):
        # WHEN jitter is computed twice
        jitter = jitter_seconds(occ, window)
        # THEN it is the same and lies in [0, window)
        assert jitter == jitter_seconds(occ, window)
        assert 0 <= jitter < window


def test_jitter_seconds_window_one_is_always_zero():
    # GIVEN a one-second window; WHEN computing jitter for many ids
    # THEN the only value in [0, 1) is 0
    assert {jitter_seconds(occurrence_id("s", 1, t), 1) for t in range(50)} == {0}


def test_jitter_seconds_zero_window_is_strict():
    # GIVEN strict scheduling (window 0) for many ids
    # WHEN computing jitter; THEN it is always 0
    assert {jitter_seconds(occurrence_id("s", 1, t), 0) for t in range(50)} == {0}


@pytest.mark.parametrize("window", [-1, -900, MAX_WINDOW_SECONDS + 1, 3600])
def test_jitter_seconds_window_outside_range_rejected(window: int):
    # GIVEN a window outside 0..900
    # WHEN computing jitter; THEN ValueError names the allowed range
    with pytest.raises(ValueError, match=r"0\.\.900"):
        jitter_seconds(occurrence_id("s", 1, 0), window)


def test_jitter_seconds_differs_between_ids():
    # GIVEN many ids of one schedule; WHEN computing jitter over 900 s
    values = {jitter_seconds(occurrence_id("s", 1, 60 * k), 900) for k in range(100)}
    # THEN they do not all land on the same second (spread is the point)
    assert len(values) > 50


@pytest.mark.parametrize("window", [0, 1, 300, 900])
def test_available_at_is_scheduled_for_plus_jitter(window: int):
    # GIVEN an occurrence and a window
    scheduled_for = 1_772_841_600
    occ = occurrence_id("sch_1", 1, scheduled_for)
    # WHEN computing when it becomes available
    at = available_at(occ, scheduled_for, window)
    # THEN it is scheduled_for plus that id's jitter, within [scheduled_for, +window)
    assert at == scheduled_for + jitter_seconds(occ, window)
    assert scheduled_for <= at < scheduled_for + max(window, 1)


def test_available_at_strict_is_exact():
    # GIVEN a strict schedule; WHEN computing availability
    # THEN it is exactly the scheduled instant
    occ = occurrence_id("sch_1", 1, 1_772_841_600)
    assert available_at(occ, 1_772_841_600, 0) == 1_772_841_600


def test_available_at_rejects_bad_window():
    # GIVEN a window over the maximum; WHEN computing availability; THEN ValueError
    with pytest.raises(ValueError, match="window"):
        available_at(occurrence_id("s", 1, 0), 0, MAX_WINDOW_SECONDS + 1)


_CHILD = """
import json, sys
from punctual.domain.ids import occurrence_id, jitter_seconds
samples = json.loads(sys.argv[1])
out = []
for schedule_id, version, scheduled_for in samples:
    occ = occurrence_id(schedule_id, version, scheduled_for)
    out.append([occ, jitter_seconds(occ, 900), jitter_seconds(occ, 37), hash(schedule_id)])
print(json.dumps(out))
"""


def _child_values(seed: str) -> list[list[object]]:
    env = os.environ | {"PYTHONHASHSEED": seed}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(SAMPLES)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    result: list[list[object]] = json.loads(done.stdout)
    return result


def test_ids_and_jitter_identical_across_processes_and_hash_seeds():
    # GIVEN the ids and jitters computed in this process
    expected = [
        [occ, jitter_seconds(occ, 900), jitter_seconds(occ, 37)]
        for occ in (occurrence_id(*s) for s in SAMPLES)
    ]
    # WHEN fresh interpreters with different hash seeds compute them
    runs = {seed: _child_values(seed) for seed in ("0", "1", "4242")}
    # THEN every process agrees with this one ...
    for seed, values in runs.items():
        assert [v[:3] for v in values] == expected, seed
    # ... even though built-in hash() really did differ between them (the check has teeth)
    builtin_hashes = {seed: tuple(v[3] for v in values) for seed, values in runs.items()}
    assert len(set(builtin_hashes.values())) == len(runs)


def test_jitter_spread_covers_every_bucket():
    # GIVEN 10,000 occurrences of 100 schedules (100 instants each) with a 300 s window
    jitters = [
        jitter_seconds(occurrence_id(f"sch_{s}", 1, 1_772_841_600 + 60 * k), 300)
        for s in range(100)
        for k in range(100)
    ]
    # WHEN grouped into 30-second buckets
    buckets = Counter(j // 30 for j in jitters)
    # THEN all ten buckets are used, each near its fair share of 1,000
    assert sorted(buckets) == list(range(10))
    assert all(800 <= n <= 1200 for n in buckets.values()), buckets
    # AND almost every single second of the window is hit
    assert len(set(jitters)) >= 295
