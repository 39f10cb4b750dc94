"""The console's own reckoning (no browser, no stack): clock changes, the marks on fires
that cross one, and the answers it gives without the API (tests/e2e/test_console.py opens
its pages in Chromium)."""

from __future__ import annotations

import re

from punctual_local.console import (
    Console,
    View,
    _marked_fires,
    _occurrence_table,
    next_clock_change,
)
from punctual_local.lives import Life
from tests.instants import epoch


def test_the_next_clock_change_is_found_to_the_second_with_both_offsets():
    # New York springs forward at 02:00 EST on 2027-03-14 (07:00 UTC)
    assert next_clock_change("America/New_York", epoch("2026-12-02T12:00:00Z")) == (
        epoch("2027-03-14T07:00:00Z"),
        "-0500",
        "-0400",
    )
    # ... and falls back at 02:00 EDT on 2027-11-07 (06:00 UTC)
    assert next_clock_change("America/New_York", epoch("2027-03-14T07:00:00Z")) == (
        epoch("2027-11-07T06:00:00Z"),
        "-0400",
        "-0500",
    )


def test_a_zone_without_clock_changes_has_none():
    assert next_clock_change("Asia/Kolkata", epoch("2026-12-02T12:00:00Z")) is None
    assert next_clock_change("UTC", epoch("2026-12-02T12:00:00Z")) is None


def test_only_the_fire_after_a_clock_change_is_marked():
    fires = [
        {"local": "2027-03-13T02:30:00-05:00"},
        {"local": "2027-03-15T02:30:00-04:00"},
        {"local": "2027-03-16T02:30:00-04:00"},
    ]
    marked = re.findall(r"<span class=dst[^>]*>([^<]*)</span>", _marked_fires(fires))
    assert marked == ["2027-03-15 02:30:00-04:00 ⚑ DST"]


def test_lag_is_counted_from_the_due_time_to_when_the_message_was_receivable():
    def life(enqueued: str | None) -> Life:
        due = "2026-12-02T12:00:30Z"  # a flexible fire: due 30 s after its time
        occurrence = {
            "scheduled_for": "2026-12-02T12:00:00Z",
            "available_at": due,
            "enqueued_at": enqueued,
        }
        return Life(occurrence, "s")

    # sent ahead with a delay: receivable at its due time, no lag
    assert life("2026-12-02T11:58:00Z").lag == 0
    # sent 4 s late: receivable when sent
    assert life("2026-12-02T12:00:34Z").lag == 4
    # not yet claimed: unknown
    assert life(None).lag is None


def test_waiting_for_a_worker_is_counted_from_the_due_time_to_the_first_claim():
    # GIVEN an occurrence due at 12:00:30, sent ahead (no delivery lag)
    occurrence = {
        "scheduled_for": "2026-12-02T12:00:00Z",
        "available_at": "2026-12-02T12:00:30Z",
        "enqueued_at": "2026-12-02T11:58:00Z",
    }
    # THEN claimed 146 s after it was due, it waited 146 s, though its lag is 0
    claimed = Life(occurrence, "s", epoch("2026-12-02T12:02:56Z"))
    assert (claimed.lag, claimed.waited) == (0, 146)
    # ... and not yet claimed, the wait is unknown
    assert Life(occurrence, "s").waited is None


def test_the_console_answers_what_is_no_page_and_what_is_no_read_itself():
    console = Console("http://127.0.0.1:9", default_key="demo", operator_key="operator")
    assert console.answer("GET", "/console/nothing/here", {})["statusCode"] == 404
    assert console.answer("POST", "/console", {})["statusCode"] == 405
    refused = console.answer("GET", "/console", {"as": ["<script>"]})
    assert refused["statusCode"] == 404
    assert "<script>" not in refused["body"]  # (escaped wherever it is shown)
    # an API that does not answer is named, not a crash
    down = console.answer("GET", "/console", {})
    assert down["statusCode"] == 502
    assert "cannot reach the Punctual API" in down["body"]


def test_a_late_occurrence_stands_out_in_a_table():
    # GIVEN, at 12:10, occurrences due at 12:00: one claimed 5 s after, one 146 s after, one
    # not taken yet, and one due at 12:09:30, not taken yet (30 s: not late)
    def occurrence(n: int, due: str, state: str, claimed: str | None) -> dict[str, object]:
        return {
            "occurrence_id": f"occ_sch_demo.x_{1_796_000_000 + n}_1",
            "schedule_id": "sch_demo.x",
            "scheduled_for": due,
            "available_at": due,
            "state": state,
            "enqueued_at": None,
            "claimed_at": claimed,
            "attempt_count": 1 if claimed else 0,
            "reason": None,
        }

    rows = [
        occurrence(1, "2026-12-02T12:00:00Z", "SUCCEEDED", "2026-12-02T12:00:05Z"),
        occurrence(2, "2026-12-02T12:00:00Z", "SUCCEEDED", "2026-12-02T12:02:26Z"),
        occurrence(3, "2026-12-02T12:00:00Z", "SCHEDULED", None),
        occurrence(4, "2026-12-02T12:09:30Z", "SCHEDULED", None),
    ]
    html = _occurrence_table(rows, View("demo"), "UTC", now=epoch("2026-12-02T12:10:00Z"))
    # THEN the one that waited 146 s and the one not taken for 10 minutes stand out
    marked = [row for row in html.split("<tr")[2:] if row.startswith(" class=late")]
    assert len(marked) == 2
    assert "146 s" in marked[0]
    assert "1796000003" in marked[1]
