"""The reconciler on a clean system, on moto with the injected clock. It reports nothing missing
and nothing unexpected, finds the fires on the first and last second of its window, and
counts a run now by its state. It reads no occurrence of a schedule that owes no fire in a
settled hour, but does read a schedule paused after its history margin began, a one-shot
completed after a run now, and a schedule made in its window whatever the host's zone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.dal.occurrences import OccurrenceStore, Window
from punctual.domain.findings import Finding
from punctual.domain.ids import occurrence_id
from punctual.domain.schedule import ScheduleState
from punctual.pipeline.reconciler import INDEX_SETTLED
from punctual.services import Services
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import cron_spec, current_item, make, set_occurrence_state
from tests.integration.reconciler.helpers import (
    DAY,
    at,
    ids,
    materialize_until,
    reconcile,
    shards_of,
    stored,
    total,
)

# --- a clean system --------------------------------------------------------------------


def test_reconciler_clean_run_reports_zero_missing_and_zero_unexpected(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN cron (two zones), rate, flexible, one-shot and hourly-in-New-York schedules,
    # materialized by a healthy materializer through the window [10:00, 11:00)
    clock.now = at("08:50")
    schedules = [
        make(aws, spec=cron_spec("*/5 * * * *")),
        make(aws, spec=cron_spec("0,30 * * * *", "Europe/Berlin")),
        make(aws, spec={"kind": "rate", "expression": "rate(7 minutes)"}),
        make(aws, spec=cron_spec("*/10 * * * *"), flexible_window_seconds=300),
        make(aws, spec={"kind": "at", "at": f"{DAY}T10:20:00Z"}),
        make(aws, spec=cron_spec("@hourly", "America/New_York")),
    ]
    materialize_until(aws, clock, at("11:10"), shards_of(aws, schedules))
    window = stored(aws, since=at("10:00"), until=at("11:00"))
    # AND workers finished some of them in various ways
    outcomes = ["SUCCEEDED"] * 5 + ["DEAD", "SKIPPED_OVERLAP", "CANCELED"]
    for occurrence, state in zip(window, outcomes, strict=False):
        set_occurrence_state(aws, occurrence["occurrence_id"], state)
    # WHEN the reconciler checks that hour at 12:05
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"))
    # THEN every expected instant was found, by its state, and nothing else is stored
    # (*/5: 12, Berlin :00/:30: 2, rate(7 minutes) from 08:50: 9, flexible */10: 6,
    # the one-shot: 1, hourly: 1)
    assert total(results, Finding.MISSING) == 0
    assert total(results, Finding.UNEXPECTED) == 0
    assert len(window) == 31
    assert total(results, Finding.SUCCEEDED) == 5
    assert total(results, Finding.DEAD) == 1
    assert total(results, Finding.SKIPPED_OVERLAP) == 1
    assert total(results, Finding.CANCELED) == 1
    assert total(results, Finding.IN_FLIGHT) == 31 - 8
    assert all(r.report.complete for r in results)
    assert not ids(results, "fired")


def _clean_ten_oclock_hour(aws: Services, clock: Clock, *, in_flight: int) -> None:
    """Reconcile [10:00, 11:00) at 12:05: ``in_flight`` occurrences in flight, nothing
    missing, no stray, nothing repaired."""
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"))
    assert total(results, Finding.IN_FLIGHT) == in_flight
    assert total(results, Finding.MISSING) == 0
    assert total(results, Finding.UNEXPECTED) == 0
    assert not ids(results, "fired")


def test_reconciler_finds_the_fires_on_the_first_and_last_second_of_its_window(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN one-shots at 10:00:00 and 10:59:59, and at 09:59:59 and 11:00:00 just outside
    # the window, fired by a healthy materializer
    clock.now = at("09:50")
    edges = [
        make(aws, spec={"kind": "at", "at": f"{DAY}T{hhmmss}Z"})
        for hhmmss in ("09:59:59", "10:00:00", "10:59:59", "11:00:00")
    ]
    materialize_until(aws, clock, at("11:05"), shards_of(aws, edges))
    assert len(stored(aws, since=at("10:00"), until=at("11:00"))) == 2
    # WHEN the reconciler checks [10:00, 11:00)
    # THEN the two inside are found where they are (in flight), neither missing nor a
    # stray, and nothing is repaired; the two outside are not this window's
    _clean_ten_oclock_hour(aws, clock, in_flight=2)


def test_reconciler_counts_a_run_now_by_its_state_owed_by_no_fire(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */5 schedule fired by a healthy materializer through [10:00, 11:00), and a
    # run now at 10:17
    clock.now = at("09:50")
    sid = make(aws, spec=cron_spec("*/5 * * * *"))
    materialize_until(aws, clock, at("10:15"), shards_of(aws, [sid]))
    clock.now = at("10:17")
    manual = ControlPlane(aws).trigger("alice", sid, None).occurrence
    assert manual.scheduled_for == at("10:17")
    materialize_until(aws, clock, at("11:05"), shards_of(aws, [sid]))
    # WHEN the reconciler checks the hour
    # THEN the run now is counted by its state (in flight: 12 fires and it), neither a
    # stray nor a fire
    _clean_ten_oclock_hour(aws, clock, in_flight=13)


def test_reconciler_reads_no_occurrence_of_a_schedule_owning_no_fire_in_a_settled_hour(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a daily 03:00 and an hourly schedule, unchanged for more than an hour before
    # [10:00, 11:00), materialized through it
    clock.now = at("08:50")
    daily = make(aws, spec=cron_spec("0 3 * * *"))
    hourly = make(aws, spec=cron_spec("0 * * * *"))
    materialize_until(aws, clock, at("12:10"), shards_of(aws, [daily, hourly]))
    read: list[str] = []
    real = OccurrenceStore.window

    def spied(self: OccurrenceStore, schedule_id: str, **window: Any) -> Window:
        read.append(schedule_id)
        return real(self, schedule_id, **window)

    monkeypatch.setattr(OccurrenceStore, "window", spied)
    # WHEN the hourly run checks that hour at 12:05
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"))
    # THEN only the hourly one's occurrences are read (a Query saved per schedule-hour with
    # nothing to find), and only it is counted as examined
    assert read == [hourly]
    assert sum(r.report.schedules for r in results) == 1
    assert total(results, Finding.IN_FLIGHT) == 1
    # WHEN an hour is checked sooner after it closed than the shard index is trusted to show
    # a run now made in it
    read.clear()
    clock.now = at("12:00") + INDEX_SETTLED - 1
    reconcile(aws, at("11:00"), at("12:00"))
    # THEN every schedule's occurrences are read; from INDEX_SETTLED on, only the hourly's
    assert sorted(read) == sorted([daily, hourly])
    read.clear()
    clock.now = at("12:00") + INDEX_SETTLED
    reconcile(aws, at("11:00"), at("12:00"))
    assert read == [hourly]


@pytest.mark.parametrize(("paused_at", "read"), [("09:00:00", False), ("09:00:01", True)])
def test_reconciler_reads_a_schedule_paused_after_its_history_margin_began(
    alice: Api, aws: Services, clock: Clock, paused_at: str, read: bool
):
    # GIVEN an hourly schedule paused an hour before [10:00, 11:00) (where the history margin
    # begins), or a second later
    clock.now = at("08:50")
    sid = make(aws, spec=cron_spec("0 * * * *"))
    clock.now = at(paused_at)
    ControlPlane(aws).pause("alice", sid)
    # WHEN the hourly run checks that hour at 12:05
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"))
    # THEN one paused at the margin's start is dormant and not read (nothing of it can be
    # stored in the hour); one paused within the margin is read, as what an earlier version
    # planned may still trail into the window
    assert sum(r.report.schedules for r in results) == int(read)


def test_reconciler_reads_a_one_shot_completed_after_a_run_now_at_its_windows_first_second(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot at 08:30, made at 08:00 and not fired by 10:00 (the materializer
    # down), run now at 10:00:00, then fired late and completed as the materializer comes back
    clock.now = at("08:00")
    sid = make(aws, spec={"kind": "at", "at": f"{DAY}T08:30:00Z"})
    clock.now = at("10:00")
    manual = ControlPlane(aws).trigger("alice", sid, None).occurrence
    assert manual.scheduled_for == at("10:00")
    materialize_until(aws, clock, at("10:05"), shards_of(aws, [sid]))
    assert current_item(aws, sid)["state"] == ScheduleState.COMPLETED
    # WHEN the reconciler checks [10:00, 11:00)
    # THEN it reads the schedule, though its rule ended before the history margin began (the
    # run now marks it for the window's first second): the run now is counted by its state
    _clean_ten_oclock_hour(aws, clock, in_flight=1)


def test_reconciler_reads_a_schedule_made_in_its_window_whatever_the_hosts_zone(
    alice: Api, aws: Services, clock: Clock, host_zone: Callable[[str], None]
):
    # GIVEN a */5 schedule made at 10:02, its 10:30 fire lost, on a host whose local zone is
    # five hours behind UTC
    clock.now = at("10:02")
    sid = make(aws, spec=cron_spec("*/5 * * * *"), misfire={"max_lateness_seconds": 7 * 86400})
    lost = occurrence_id(sid, 1, at("10:30"))
    materialize_until(
        aws, clock, at("11:10"), shards_of(aws, [sid]), skip=lambda s, t: t == at("10:30")
    )
    host_zone("America/New_York")
    # WHEN the reconciler checks [10:00, 11:00)
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"), repair=False)
    # THEN it reads the schedule (the window's end is compared with creation instants in
    # UTC, not as 06:00 local) and finds the lost fire
    assert [i for r in results for i in r.report.examples.get(Finding.MISSING, [])] == [lost]
