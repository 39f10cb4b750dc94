"""Misfire policies, catch-up, missed fires, DST days and flexible windows in the materializer,
on moto with the injected clock. A ten-minute outage applies the schedule's misfire policy,
long-due fires go by the catch-up lane at the tenant's pace, even when they are more than one
step holds, and a New York schedule skips the spring-forward day and fires once per wall time
across fall-back. The missed summary survives an update and is shown to the tenant, and a
flexible fire's availability is deterministic within its window and is what its lateness is
judged by."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.dal.common import Label, Transactions
from punctual.dal.schedules import schedule_from_item
from punctual.domain.ids import available_at, occurrence_id
from punctual.domain.planning import CATCHUP_AFTER
from punctual.pipeline.materializer import STEP_LIMIT, Materializer
from punctual.services import Services
from punctual.timing import utc_text
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.instants import epoch
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import cron_spec, make
from tests.integration.materializer.helpers import (
    Crash,
    crash_at,
    current,
    instants,
    occurrences,
    shard,
    tick,
)


def _outage(aws: Services, clock: Clock, misfire: dict[str, Any]) -> tuple[str, int, Any]:
    sid = make(aws, spec=cron_spec("* * * * *"), misfire=misfire)
    cursor = current(aws, sid)["next_run_at"]
    before = len(instants(aws, sid))
    clock.now = cursor + 600  # ten minutes with no tick at all
    report = tick(aws, clock, sid)
    return sid, before, report


@pytest.mark.parametrize(
    ("misfire", "late_fired", "missed"),
    [
        ({"action": "SKIP", "max_lateness_seconds": 60}, 0, 9),
        ({"action": "FIRE_ONCE", "max_lateness_seconds": 60}, 1, 8),
        ({"action": "CATCHUP", "max_lateness_seconds": 60, "catchup_limit": 3}, 3, 6),
    ],
)
def test_materializer_ten_minute_outage_applies_the_misfire_policy(
    alice: Api, aws: Services, clock: Clock, misfire: dict[str, Any], late_fired: int, missed: int
):
    # GIVEN a minutely schedule and ten minutes without any tick: its cursor is 600 s old,
    # so the 9 fires before now - max_lateness are misfires
    sid, before, report = _outage(aws, clock, misfire)
    now = int(clock.now)
    fired = instants(aws, sid)[before:]
    # THEN fires older than max_lateness (60 s) are handled by the policy: exactly
    # `late_fired` of the latest ones fire, the rest are counted MISSED on the schedule
    late = [f for f in fired if f < now - 60]
    assert len(late) == late_fired
    assert report.missed == missed
    assert current(aws, sid)["missed_total"] == missed
    # AND everything from now - max_lateness to the lookahead fires as usual, without a gap
    recent = [f for f in fired if f >= now - 60]
    assert recent == list(range(recent[0], recent[-1] + 1, 60))
    assert recent[0] == now - 60


def test_materializer_a_missed_only_step_reads_no_payload_and_commits(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a daily schedule with a payload whose fire an outage made late: its misfire
    # policy (SKIP) records it MISSED, and its next fire is a day away
    sid = make(
        aws,
        spec=cron_spec("0 9 * * *"),
        payload={"report": "daily"},
        misfire={"action": "SKIP", "max_lateness_seconds": 60},
    )
    first = current(aws, sid)["next_run_at"]
    reads: list[str] = []
    faults = Faults(FaultPlan.none(), clock)
    faults.before["batch_get_item"] = lambda operation, _: reads.append(operation)
    watched = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    # WHEN the materializer walks its minute ten minutes late
    clock.now = first + 600
    report = tick(watched, clock, sid)
    # THEN the step (the MISSED record and the cursor, no occurrence) committed without
    # reading the payload, which nothing it writes carries
    assert (report.missed, report.occurrences) == (1, 0)
    assert occurrences(aws, sid) == []
    assert current(aws, sid)["next_run_at"] == first + 86400
    assert reads == []


def test_materializer_fires_long_due_within_max_lateness_go_by_the_catchup_lane(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a minutely schedule tolerating a day of lateness, and ten minutes with no tick
    sid, before, _ = _outage(aws, clock, {"action": "FIRE_ONCE", "max_lateness_seconds": 86400})
    now = int(clock.now)
    made = occurrences(aws, sid)[before:]
    # THEN every late fire fired (none is a misfire), at its own time; those due more than
    # CATCHUP_AFTER ago go by the catch-up lane, the last minutes' and the coming ones on time
    assert [o["scheduled_for"] for o in made] == sorted(o["scheduled_for"] for o in made)
    lanes = {o["scheduled_for"]: o.get("lane") for o in made}
    assert {lane for t, lane in lanes.items() if t < now - CATCHUP_AFTER} == {"CATCHUP"}
    assert {lane for t, lane in lanes.items() if t >= now - CATCHUP_AFTER} == {None}
    assert min(lanes) < now - CATCHUP_AFTER <= max(lanes)


def test_materializer_catchup_is_paced_by_the_tenant_rate(aws: Services, clock: Clock):
    # GIVEN a tenant allowed 2 catch-up fires a minute, and an outage
    from tests.integration.conftest import ALICE, bootstrap

    bootstrap("alice", ALICE, catchup_per_minute=2)
    misfire = {"action": "CATCHUP", "max_lateness_seconds": 60, "catchup_limit": 3}
    sid, before, _ = _outage(aws, clock, misfire)
    # THEN the three catch-up occurrences become receivable 30 s apart from now
    now = int(clock.now)
    made = occurrences(aws, sid)[before:]
    late = [o for o in made if o["scheduled_for"] < now - 60]
    assert sorted(o["available_at"] for o in late) == [now, now + 30, now + 60]
    # AND they go by the catch-up lane, apart from the fires due now, which go on time
    assert {o.get("lane") for o in late} == {"CATCHUP"}
    assert {o.get("lane") for o in made if o not in late} == {None}


def test_materializer_daily_0230_new_york_skips_spring_forward_day(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a daily 02:30 America/New_York schedule created at 01:50 EST on 2026-03-08
    # (its shard's walk starts an hour before: each minute walked is a moto update)
    clock.now = epoch("2026-03-08T06:50:00Z")
    sid = make(aws, spec=cron_spec("30 2 * * *", "America/New_York"))
    # WHEN the materializer ticks through the night of 2026-03-08 and the next morning
    for at in ("2026-03-08T06:58:00Z", "2026-03-08T07:28:00Z", "2026-03-09T06:28:00Z"):
        clock.now = epoch(at)
        tick(aws, clock, sid, holder=at)
    # THEN there is no occurrence on 2026-03-08 (02:30 does not exist that day)
    assert instants(aws, sid) == [epoch("2026-03-09T06:30:00Z")]


def test_materializer_every_15_minutes_fires_once_per_wall_time_across_fall_back(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */15 America/New_York schedule before the 2026-11-01 fall-back
    clock.now = epoch("2026-11-01T04:50:00Z")
    sid = make(aws, spec=cron_spec("*/15 * * * *", "America/New_York"))
    # WHEN the materializer ticks every minute until 02:20 EST
    while clock.now < epoch("2026-11-01T07:20:00Z"):
        tick(aws, clock, sid)
        clock.advance(60)
    # THEN 01:00-01:45 fire once (EDT) and the repeated hour adds nothing
    fired = [f for f in instants(aws, sid) if f <= epoch("2026-11-01T07:15:00Z")]
    expected = ["05:00", "05:15", "05:30", "05:45", "07:00", "07:15"]
    assert fired == [epoch(f"2026-11-01T{t}:00Z") for t in expected]


def test_materializer_flexible_available_at_is_deterministic_within_window(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN flexible schedules with a 300 s window
    ids = [
        make(aws, spec=cron_spec("*/10 * * * *"), flexible_window_seconds=300, name=f"f{i}")
        for i in range(5)
    ]
    clock.now = min(current(aws, sid)["next_available_at"] for sid in ids) - 60
    # WHEN the materializer runs (after a crash, so the work is redone)
    for number in sorted({shard(aws, sid) for sid in ids}):
        with pytest.raises(Crash):
            Materializer(aws, "m1", crash=crash_at("before_watermark")).run_shard(
                int(clock.now), number
            )
        Materializer(aws, "m1").run_shard(int(clock.now), number)
    # THEN each available_at is scheduled_for + the id's jitter, inside the window
    for sid in ids:
        for o in occurrences(aws, sid):
            assert o["scheduled_for"] <= o["available_at"] < o["scheduled_for"] + 300
            assert o["available_at"] == available_at(o["occurrence_id"], o["scheduled_for"], 300)


def test_materializer_catchup_larger_than_one_step_fires_all_kept_at_one_pace(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a minutely CATCHUP schedule keeping 50 late fires, and an hour without ticks
    # (more kept fires than one transaction step holds)
    misfire = {"action": "CATCHUP", "max_lateness_seconds": 60, "catchup_limit": 50}
    sid = make(aws, spec=cron_spec("* * * * *"), misfire=misfire)
    cursor = current(aws, sid)["next_run_at"]
    before = len(instants(aws, sid))
    clock.now = cursor + 3600
    commit = Transactions.commit
    puts: list[int] = []

    def counting(self: Transactions, actions: list[tuple[Label, dict[str, Any]]]) -> None:
        puts.append(sum("Put" in action and label == Label.STEP for label, action in actions))
        commit(self, actions)

    monkeypatch.setattr(Transactions, "commit", counting)
    # WHEN one tick runs
    report = tick(aws, clock, sid)
    # THEN it terminates with the 50 latest late fires, paced evenly from now (the
    # compressed pace keeps the last within SQS's delay limit), the rest counted MISSED,
    # in steps of at most STEP_LIMIT occurrences
    assert max(puts) == STEP_LIMIT
    now = int(clock.now)
    late = sorted(
        (o for o in occurrences(aws, sid)[before:] if o["scheduled_for"] < now - 60),
        key=lambda o: o["scheduled_for"],
    )
    assert len(late) == 50
    assert report.missed == 60 - 1 - 50
    offsets = [o["available_at"] - now for o in late]
    assert offsets == sorted(offsets)
    assert len({b - a for a, b in itertools.pairwise(offsets)}) == 1
    assert offsets[-1] <= 900


def test_materializer_missed_summary_survives_an_update(alice: Api, aws: Services, clock: Clock):
    # GIVEN an outage recorded as MISSED on the schedule
    sid, _, _ = _outage(aws, clock, {"action": "SKIP", "max_lateness_seconds": 60})
    assert current(aws, sid)["missed_total"] == 9
    # WHEN the schedule is paused (a new version)
    ControlPlane(aws).pause("alice", sid)
    # THEN the MISSED summary is still there
    assert current(aws, sid)["missed_total"] == 9


def test_api_shows_the_tenant_its_missed_fires_on_the_schedule_and_in_the_listing(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a minutely SKIP schedule whose ten-minute outage recorded 9 fires MISSED
    sid, before, _ = _outage(aws, clock, {"action": "SKIP", "max_lateness_seconds": 60})
    made = set(instants(aws, sid))
    schedule = schedule_from_item(current(aws, sid))
    skipped = [
        f for f in schedule.rule().fires(schedule.fires_after, int(clock.now)) if f not in made
    ]
    assert len(skipped) == 9
    first, last = utc_text(skipped[0]), utc_text(skipped[-1])
    # WHEN the tenant reads the schedule
    body = alice.get(f"/v1/schedules/{sid}").body["schedule"]
    # THEN it sees every missed fire: the total and the episode from the first to the last
    assert body["missed_total"] == 9
    assert body["missed"] == [{"version": 1, "first": first, "last": last, "count": 9}]
    # AND the occurrence listing names the episode where the occurrences are missing,
    listing = alice.get(f"/v1/schedules/{sid}/occurrences", **{"from": last, "to": last})
    assert listing.body == {"occurrences": [], "missed": body["missed"], "next_token": None}
    # but not for a window it does not overlap (the fires made before the outage)
    early = alice.get(
        f"/v1/schedules/{sid}/occurrences", to=utc_text(skipped[0] - 1), limit=100
    ).body
    assert early["missed"] == []
    assert len(early["occurrences"]) == before
    # AND a later version still shows what happened to the earlier one
    alice.post(f"/v1/schedules/{sid}/pause")
    paused = alice.get(f"/v1/schedules/{sid}").body["schedule"]
    assert (paused["version"], paused["missed"]) == (2, body["missed"])


# --- flexible windows: lateness is judged by availability (issue 15, defect 1) ------------


@pytest.mark.parametrize("action", ["SKIP", "FIRE_ONCE", "CATCHUP"])
def test_materializer_healthy_ticks_never_judge_a_flexible_fire_late(
    alice: Api, aws: Services, clock: Clock, action: str
):
    # GIVEN a minutely flexible schedule whose window (900 s) is far wider than the
    # lookahead plus max_lateness (180 + 300 s): a later fire is often due before an
    # earlier one
    misfire: dict[str, Any] = {"action": action, "max_lateness_seconds": 300}
    sid = make(
        aws,
        spec={"kind": "rate", "expression": "rate(1 minute)"},
        flexible_window_seconds=900,
        misfire=misfire,
    )
    schedule = schedule_from_item(current(aws, sid))
    lookahead = aws.settings.lookahead_seconds
    # WHEN the materializer ticks every minute for an hour, as it does when healthy
    for _ in range(60):
        clock.advance(60)
        tick(aws, clock, sid, holder=f"m{clock.now}")
        # THEN after each tick every fire due (available) within the lookahead exists, so
        # none ever waits past its time
        due = [
            f
            for f in schedule.rule().fires(schedule.fires_after, int(clock.now) + lookahead)
            if available_at(occurrence_id(sid, 1, f), f, 900) <= clock.now + lookahead
        ]
        assert set(due) <= set(instants(aws, sid)), clock.now
    # AND nothing was judged a misfire: none MISSED, none released early at "now"
    assert "missed_total" not in current(aws, sid)
    for o in occurrences(aws, sid):
        assert o["available_at"] == available_at(o["occurrence_id"], o["scheduled_for"], 900)


def test_materializer_flexible_outage_releases_by_availability_and_keeps_the_rest(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a minutely flexible FIRE_ONCE schedule (window 600 s) and a 30-minute outage
    misfire = {"action": "FIRE_ONCE", "max_lateness_seconds": 120}
    sid = make(
        aws,
        spec={"kind": "rate", "expression": "rate(1 minute)"},
        flexible_window_seconds=600,
        misfire=misfire,
    )
    made_before = set(instants(aws, sid))
    clock.advance(1800)
    now = int(clock.now)
    # WHEN one tick runs
    report = tick(aws, clock, sid)
    # THEN exactly one late fire (the latest to have become available before now - 120 s)
    # is released at now; the fires whose availability is within max_lateness keep their
    # own jittered time; every other unmade fire due before now - 120 s is MISSED
    schedule = schedule_from_item(current(aws, sid))
    made = {o["scheduled_for"]: o for o in occurrences(aws, sid)}
    late = [
        f
        for f in schedule.rule().fires(schedule.fires_after, now)
        if f not in made_before and available_at(occurrence_id(sid, 1, f), f, 600) < now - 120
    ]
    released = [f for f, o in made.items() if o["available_at"] == now and f in late]
    assert len(released) == 1
    # (fires due at the same second are ordered by scheduled time: the later one is kept)
    assert released[0] == max(
        late, key=lambda f: (available_at(occurrence_id(sid, 1, f), f, 600), f)
    )
    assert report.missed == len(late) - 1
    assert current(aws, sid)["missed_total"] == len(late) - 1
    for f, o in made.items():
        if f not in late:
            assert o["available_at"] == available_at(o["occurrence_id"], f, 600)
