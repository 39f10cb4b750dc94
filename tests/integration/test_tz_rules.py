"""Time zone rule changes (issue 22, item 6; docs/time.md, *When the rules change*): plan
with IANA 2025b (tests/tzdata_2025b), then upgrade to the pinned release, where
America/Vancouver keeps UTC-7 all year from November 2026: 09:00 there moves from 17:00Z
to 16:00Z. Each wall time fires once: the occurrence planned at the old instant is
replaced, the cursor follows the new rules, nothing fires twice or is lost, the change is
reported (the schedule's tzdata_version, the canceled occurrence's reason, the reconciler)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.dal.common import to_dynamo
from punctual.dal.tables import SCHEDULE_CURRENT, occurrence_key
from punctual.domain.errors import Retryable
from punctual.domain.ids import occurrence_id, shard_of
from punctual.pipeline import reconciler as reconciler_module
from punctual.pipeline.reconciler import Reconciler, ShardResult
from punctual.pipeline.rezone import Replanned, replan
from punctual.services import Services
from punctual.timing import ZoneSource, tzdata_version, use_zone_source
from tests.instants import epoch
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import cron_spec, current_item, make, set_occurrence_state
from tests.integration.reconciler.helpers import materialize_until, stored
from tests.integration.test_multi_region import WEST, region

OLD = ZoneSource("2025b", Path(__file__).parent.parent / "tzdata_2025b")
NEW = tzdata_version()


def at(text: str) -> int:
    return epoch(f"2026-12-02T{text}Z")


@pytest.fixture
def old_rules() -> Iterator[None]:
    use_zone_source(OLD)
    yield
    use_zone_source(None)


def occurrences_of(aws: Services, sid: str) -> dict[str, dict[str, Any]]:
    return {o["occurrence_id"]: o for o in stored(aws) if o["schedule_id"] == sid}


def daily_nine_in_vancouver(aws: Services, clock: Clock) -> tuple[str, int]:
    """A daily 09:00 America/Vancouver schedule made at 15:40Z under 2025b (09:00 = 17:00Z)
    and planned by the materializer until 16:57Z (its 17:00Z occurrence made ahead)."""
    clock.now = at("15:40")
    sid = make(aws, spec=cron_spec("0 9 * * *", "America/Vancouver"))
    shard = shard_of(sid, aws.settings.shard_count)
    materialize_until(aws, clock, at("16:41"), [shard], every=600)  # then the clock is 16:50
    materialize_until(aws, clock, at("16:57"), [shard], every=60)
    assert occurrence_id(sid, 1, at("17:00")) in occurrences_of(aws, sid)
    assert current_item(aws, sid)["tzdata"] == "2025b"
    return sid, shard


def every_five_in_vancouver_mornings(aws: Services, clock: Clock) -> tuple[str, int]:
    """Every five minutes from 08:00 to 09:55 America/Vancouver, made at 15:40Z under 2025b
    (16:00Z to 17:55Z) and planned by the materializer up to 16:50Z."""
    clock.now = at("15:40")
    sid = make(aws, spec=cron_spec("*/5 8-9 * * *", "America/Vancouver"))
    shard = shard_of(sid, aws.settings.shard_count)
    materialize_until(aws, clock, at("16:50"), [shard], every=60)
    return sid, shard


def test_the_reconciler_replans_a_schedule_whose_zone_rules_changed(
    alice: Api, aws: Services, clock: Clock, old_rules: None
):
    # GIVEN the schedule planned under 2025b, its 17:00Z occurrence not yet receivable
    sid, shard = daily_nine_in_vancouver(aws, clock)
    old = occurrence_id(sid, 1, at("17:00"))
    # WHEN the pinned release is deployed at 16:58Z and the reconciler runs
    use_zone_source(None)
    clock.now = at("16:58")
    [result] = Reconciler(aws).run([shard], at("16:00"), at("16:58"))
    # THEN it re-planned the schedule: the 17:00Z occurrence is canceled with the reason,
    # and 09:00 (now 16:00Z, past) fires at once under its new id
    assert result.replanned == [sid]
    assert result.report.replanned == 1
    found = occurrences_of(aws, sid)
    assert found[old]["state"] == "CANCELED"
    new = occurrence_id(sid, 1, at("16:00"))
    assert (found[new]["state"], found[new]["available_at"]) == ("SCHEDULED", at("16:58"))
    canceled = aws.occurrences.get(old)
    assert canceled is not None
    assert canceled.reason is not None
    assert canceled.reason.startswith(f"time zone rules changed (tzdata 2025b -> {NEW})")
    # AND the schedule records the release, its next fire tomorrow at 09:00 = 16:00Z
    item = current_item(aws, sid)
    assert item["tzdata"] == NEW
    assert item["next_run_at"] == epoch("2026-12-03T16:00:00Z")
    assert alice.get(f"/v1/schedules/{sid}").body["schedule"]["tzdata_version"] == NEW
    # AND nothing more happens: a second run re-plans nothing, the materializer makes no
    # second 09:00 today, and tomorrow's is made at its new instant
    again = Reconciler(aws).run([shard], at("16:00"), at("16:58"))
    assert again[0].replanned == []
    materialize_until(aws, clock, epoch("2026-12-03T16:00:00Z"), [shard], every=1800)
    live = [o for o in occurrences_of(aws, sid).values() if o["state"] != "CANCELED"]
    assert sorted(o["scheduled_for"] for o in live) == [at("16:00"), epoch("2026-12-03T16:00:00Z")]
    # AND the reconciler's check of the day finds neither a gap nor a stray
    clock.now = epoch("2026-12-03T18:05:00Z")
    [day] = Reconciler(aws).run([shard], at("16:00"), at("17:00"))
    assert day.missing == []
    assert day.unexpected == []


def test_a_paused_schedule_is_replanned_to_the_new_release_without_a_cursor_to_move(
    alice: Api, aws: Services, clock: Clock, old_rules: None
):
    # GIVEN the schedule planned under 2025b, then paused (nothing planned ahead to move)
    sid, _ = daily_nine_in_vancouver(aws, clock)
    ControlPlane(aws).pause("alice", sid)
    before = current_item(aws, sid)
    # WHEN the pinned release is deployed and the schedule re-planned
    use_zone_source(None)
    clock.now = at("16:58")
    done = replan(aws, sid)
    # THEN only the release is new: no occurrence made or canceled, the cursor as it was,
    # and the reconciler's mark covers what the old rules planned
    assert done == Replanned(sid, "2025b", NEW)
    after = current_item(aws, sid)
    assert after["tzdata"] == NEW
    assert after["manual_through"] == before["planned_until"]
    unchanged = {k: v for k, v in after.items() if k not in ("tzdata", "manual_through")}
    assert unchanged == {k: v for k, v in before.items() if k not in ("tzdata", "manual_through")}
    # AND it is not stale any more: a second re-plan does nothing
    assert replan(aws, sid) is None


def test_a_schedule_with_no_cursor_at_all_is_replanned_to_the_new_release_with_no_mark(
    alice: Api, aws: Services, clock: Clock, old_rules: None
):
    # GIVEN a paused schedule under 2025b that holds no cursor (as one completed by a change
    # before anything was planned: nothing of it was ever made)
    clock.now = at("15:40")
    sid = make(aws, spec=cron_spec("0 9 * * *", "America/Vancouver"))
    ControlPlane(aws).pause("alice", sid)
    aws.dynamodb.update_item(
        TableName=aws.settings.schedules_table,
        Key=to_dynamo({"schedule_id": sid, "sk": SCHEDULE_CURRENT}),
        UpdateExpression="REMOVE planned_until",
    )
    # WHEN the pinned release is deployed and the schedule re-planned
    use_zone_source(None)
    assert replan(aws, sid) == Replanned(sid, "2025b", NEW)
    # THEN the release is recorded, and no mark: there is nothing old to reconcile
    after = current_item(aws, sid)
    assert after["tzdata"] == NEW
    assert "manual_through" not in after


def test_a_step_records_the_release_a_zoned_schedule_without_one_is_planned_under(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a schedule in a zone whose item records no tzdata release (written before
    # releases were recorded), and one in UTC
    clock.now = at("15:40")
    zoned = make(aws, spec=cron_spec("*/5 * * * *", "America/Vancouver"))
    plain = make(aws, spec=cron_spec("*/5 * * * *"))
    aws.dynamodb.update_item(
        TableName=aws.settings.schedules_table,
        Key=to_dynamo({"schedule_id": zoned, "sk": SCHEDULE_CURRENT}),
        UpdateExpression="REMOVE tzdata",
    )
    before = current_item(aws, plain).get("tzdata")
    # WHEN the materializer steps them
    shards = sorted({shard_of(s, aws.settings.shard_count) for s in (zoned, plain)})
    materialize_until(aws, clock, at("15:50"), shards, every=60)
    # THEN the zoned one records the release it is now planned under (so a later change of
    # the rules re-plans it), and the UTC one, which no release changes, is as it was
    assert current_item(aws, zoned)["tzdata"] == NEW
    assert current_item(aws, plain).get("tzdata") == before


def test_the_materializer_replans_a_stale_schedule_before_it_steps_it(
    alice: Api, aws: Services, clock: Clock, old_rules: None
):
    # GIVEN an every-five-minutes schedule in Vancouver from 08:00 to 09:55 local, planned
    # under 2025b (16:00Z to 17:55Z) up to 16:50Z
    sid, shard = every_five_in_vancouver_mornings(aws, clock)
    planned = sorted(o["scheduled_for"] for o in occurrences_of(aws, sid).values())
    assert planned[0] == at("16:00")  # 08:00 (old)
    assert planned[-1] < at("16:55")
    # WHEN the pinned release is deployed and the materializer ticks on (no reconciler)
    use_zone_source(None)
    materialize_until(aws, clock, at("18:10"), [shard], every=60)
    # THEN it re-planned the schedule when its bucket came up, before stepping it: under
    # the new rules 08:00-09:55 is 15:00Z-16:55Z, so after 16:55Z (09:55) nothing fires
    # today, where the old rules would have gone on to 17:55Z
    assert current_item(aws, sid)["tzdata"] == NEW
    made = sorted(o["scheduled_for"] for o in occurrences_of(aws, sid).values())
    assert made == list(range(at("16:00"), at("17:00"), 300))
    assert current_item(aws, sid)["next_run_at"] == epoch("2026-12-03T15:00:00Z")


def test_another_regions_materializer_leaves_a_stale_schedule_to_its_home(
    alice: Api, aws: Services, clock: Clock, old_rules: None
):
    # GIVEN the every-five-minutes Vancouver schedule planned under 2025b up to 16:50Z in
    # us-east-1, its home (its next fires due in the minutes ahead)
    sid, shard = every_five_in_vancouver_mornings(aws, clock)
    before = {o: (v["state"], v["available_at"]) for o, v in occurrences_of(aws, sid).items()}
    # WHEN the pinned release is deployed and us-west-2's materializer walks the shard
    use_zone_source(None)
    materialize_until(region(aws, WEST), clock, at("17:10"), [shard], every=60)
    # THEN it did not re-plan it (a re-plan moves the cursor and cancels and makes
    # occurrences: the home region's to do): still under 2025b, its occurrences as they were
    assert current_item(aws, sid)["tzdata"] == "2025b"
    after = {o: (v["state"], v["available_at"]) for o, v in occurrences_of(aws, sid).items()}
    assert after == before


def test_another_regions_reconciler_leaves_a_stale_schedule_to_its_home(
    alice: Api, aws: Services, clock: Clock, old_rules: None
):
    # GIVEN the Vancouver schedule planned under 2025b in us-east-1, its home
    sid, shard = every_five_in_vancouver_mornings(aws, clock)
    before = {o: (v["state"], v["available_at"]) for o, v in occurrences_of(aws, sid).items()}
    # WHEN the pinned release is deployed and us-west-2's reconciler checks the shard
    use_zone_source(None)
    [result] = Reconciler(region(aws, WEST)).run([shard], at("16:00"), at("16:50"))
    # THEN it re-planned nothing: the home region's to do
    assert result.replanned == []
    assert current_item(aws, sid)["tzdata"] == "2025b"
    after = {o: (v["state"], v["available_at"]) for o, v in occurrences_of(aws, sid).items()}
    assert after == before


def test_a_schedule_in_a_zone_whose_rules_did_not_change_keeps_its_plan(
    alice: Api, aws: Services, clock: Clock, old_rules: None
):
    # GIVEN a daily 18:00 Berlin schedule planned under 2025b
    clock.now = at("15:40")
    sid = make(aws, spec=cron_spec("0 18 * * *", "Europe/Berlin"))
    shard = shard_of(sid, aws.settings.shard_count)
    materialize_until(aws, clock, at("16:55"), [shard], every=300)
    before = occurrences_of(aws, sid)
    # WHEN the pinned release is deployed and the reconciler runs
    use_zone_source(None)
    [result] = Reconciler(aws).run([shard], at("15:00"), at("16:00"))
    # THEN only the release is recorded: nothing canceled, nothing made
    assert result.replanned == [sid]
    assert occurrences_of(aws, sid) == before
    assert current_item(aws, sid)["tzdata"] == NEW


def fired_then_old_rules(
    aws: Services, clock: Clock, expression: str, fired: list[str]
) -> tuple[str, int]:
    """A Vancouver schedule made at 14:55Z under the pinned rules, fired at ``fired`` (the
    instants of today, asserted), then 2025b's rules in use and the materializer on to
    tomorrow's 17:10Z (the caller restores the pinned rules)."""
    clock.now = at("14:55")
    sid = make(aws, spec=cron_spec(expression, "America/Vancouver"))
    shard = shard_of(sid, aws.settings.shard_count)
    materialize_until(aws, clock, at("16:30"), [shard], every=300)
    assert sorted(occurrences_of(aws, sid)) == sorted(occurrence_id(sid, 1, at(t)) for t in fired)
    use_zone_source(OLD)
    try:
        materialize_until(aws, clock, epoch("2026-12-03T17:10:00Z"), [shard], every=1800)
    except BaseException:
        use_zone_source(None)
        raise
    return sid, shard


def test_a_wall_time_that_fired_is_not_fired_again_when_new_rules_give_it_a_later_instant(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a daily 09:00 Vancouver schedule under the pinned rules (09:00 = 16:00Z) whose
    # fire of today went out at 16:00Z
    sid, shard = fired_then_old_rules(aws, clock, "0 9 * * *", ["16:00"])
    # WHEN rules that put 09:00 at 17:00Z are deployed (2025b's: the mechanism does not
    # care which release is newer), and the materializer goes on to the next day
    try:
        # THEN today's 09:00 is not fired again at 17:00Z (nor late, tomorrow): tomorrow's
        # fires at its instant under these rules
        made = sorted(o["scheduled_for"] for o in occurrences_of(aws, sid).values())
        assert made == [at("16:00"), epoch("2026-12-03T17:00:00Z")]
        # AND the reconciler takes today's 16:00Z for 09:00 (neither a stray, nor a gap)
        clock.now = epoch("2026-12-03T19:05:00Z")
        [day] = Reconciler(aws).run([shard], at("16:00"), at("18:00"))
        assert day.unexpected == []
        assert day.missing == []
    finally:
        use_zone_source(None)


def test_a_backfill_does_not_fire_again_a_wall_time_that_ran_under_other_rules(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a daily 09:00 Vancouver schedule whose 09:00 of today ran at 16:00Z under the
    # pinned rules, then rules that put 09:00 at 17:00Z in use
    sid, _ = fired_then_old_rules(aws, clock, "0 9 * * *", ["16:00"])
    try:
        set_occurrence_state(aws, occurrence_id(sid, 1, at("16:00")), "SUCCEEDED")
        # WHEN the tenant backfills today's 16:30Z to 18:00Z (where these rules put 09:00)
        done = ControlPlane(aws).backfill("alice", sid, at("16:30"), at("18:00"), dry_run=False)
        # THEN nothing is made: 09:00 of today ran already, at the instant the rules of its
        # time gave it (each wall time fires once, docs/time.md)
        assert done.made == []
        assert occurrence_id(sid, 1, at("17:00")) not in occurrences_of(aws, sid)
        assert done.existing == 1
    finally:
        use_zone_source(None)


def test_the_reconciler_takes_a_fire_by_its_wall_time_when_its_instant_is_another_fire_now(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN 08:00 and 09:00 Vancouver under the pinned rules (15:00Z and 16:00Z), both fired
    sid, shard = fired_then_old_rules(aws, clock, "0 8,9 * * *", ["15:00", "16:00"])
    # WHEN rules that put 08:00 at 16:00Z and 09:00 at 17:00Z are deployed: the 16:00Z
    # occurrence's id is now 08:00's, but it fired as 09:00
    try:
        made = sorted(o["scheduled_for"] for o in occurrences_of(aws, sid).values())
        assert made == [
            at("15:00"),
            at("16:00"),
            epoch("2026-12-03T16:00:00Z"),
            epoch("2026-12-03T17:00:00Z"),
        ]
        # THEN the reconciler takes each for the wall time it fired as (15:00Z for 08:00,
        # 16:00Z for 09:00), not 16:00Z for 08:00 by its id with 09:00 (17:00Z) a gap
        clock.now = epoch("2026-12-03T19:05:00Z")
        [day] = Reconciler(aws).run([shard], at("14:00"), at("18:00"))
        assert day.unexpected == []
        assert day.missing == []
        # AND in a window that ends before 09:00's instant now, the 16:00Z occurrence is
        # still its id's fire (08:00's), not a stray
        [hour] = Reconciler(aws).run([shard], at("16:00"), at("17:00"))
        assert hour.unexpected == []
        assert hour.missing == []
    finally:
        use_zone_source(None)


def test_each_wall_time_fires_once_across_a_change_the_materializer_meets_mid_plan(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an every-minute schedule for the 09:00 hour in Vancouver under the pinned rules
    # (16:00Z-16:59Z), planned a few minutes ahead at 16:11Z
    clock.now = at("15:40")
    sid = make(aws, spec=cron_spec("* 9 * * *", "America/Vancouver"))
    shard = shard_of(sid, aws.settings.shard_count)
    materialize_until(aws, clock, at("16:11"), [shard], every=60)
    ahead = [t for t in occurrences_of(aws, sid).values() if t["scheduled_for"] > at("16:12")]
    assert ahead  # planned, not receivable yet
    # WHEN rules that put 09:00 at 17:00Z are deployed, and the materializer goes on
    use_zone_source(OLD)
    try:
        materialize_until(aws, clock, at("18:05"), [shard], every=60)
    finally:
        use_zone_source(None)
    # THEN the occurrences planned ahead were canceled (their instants are no fire now) and
    # every wall time of 09:00-09:59 fired once: 09:00-09:12 at the old instants, the rest
    # at the new ones (17:13Z-17:59Z)
    found = occurrences_of(aws, sid).values()
    canceled = sorted(o["scheduled_for"] for o in found if o["state"] == "CANCELED")
    assert canceled == sorted(o["scheduled_for"] for o in ahead)
    live = sorted(o["scheduled_for"] for o in found if o["state"] != "CANCELED")
    assert live == [*range(at("16:00"), at("16:13"), 60), *range(at("17:13"), at("18:00"), 60)]


def _stale_in_shard(aws: Services, shard: int) -> str:
    """A Vancouver schedule made under 2025b in ``shard`` (made until one lands there)."""
    use_zone_source(OLD)
    while True:
        sid = make(aws, spec=cron_spec("0 9 * * *", "America/Vancouver"))
        if shard_of(sid, aws.settings.shard_count) == shard:
            use_zone_source(None)
            return sid


def test_the_reconciler_replans_a_stale_schedule_listed_after_a_current_one(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a schedule planned under the release in use, made first (first in its shard's
    # pages, which the index sorts by creation)
    clock.now = at("15:30")
    current = make(aws, spec=cron_spec("0 9 * * *", "America/Vancouver"))
    shard = shard_of(current, aws.settings.shard_count)
    # AND after it, in the same shard, one planned under 2025b
    clock.now = at("15:40")
    stale = _stale_in_shard(aws, shard)
    # WHEN the reconciler checks the shard
    clock.now = at("16:05")
    [result] = Reconciler(aws).run([shard], at("15:00"), at("16:00"))
    # THEN it went past the current one and re-planned the stale one
    assert result.replanned == [stale]
    assert current_item(aws, stale)["tzdata"] == NEW
    assert current_item(aws, current)["tzdata"] == NEW


def test_a_replan_that_keeps_losing_races_leaves_the_report_incomplete(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN two schedules in one shard planned under 2025b
    clock.now = at("15:40")
    both = {_stale_in_shard(aws, 0), _stale_in_shard(aws, 0)}
    clock.now = at("16:05")
    losing: list[str] = []

    # AND the re-plan of the first one the reconciler comes to keeps losing races to the API
    # (rezone.replan gives up: Retryable)
    def racing(services: Services, schedule_id: str) -> Replanned | None:
        if not losing or losing == [schedule_id]:
            losing[:] = [schedule_id]
            raise Retryable(f"schedule {schedule_id} kept changing while it was re-planned")
        return replan(services, schedule_id)

    monkeypatch.setattr(reconciler_module, "replan", racing)
    # WHEN the reconciler checks its shard
    [result] = Reconciler(aws).run([0], at("15:00"), at("16:00"))
    # THEN the report says incomplete (the hour is checked again), that one is not
    # re-planned, and the other one is
    [stale] = losing
    [other] = both - {stale}
    assert result.report.complete is False
    assert result.replanned == [other]
    assert current_item(aws, stale)["tzdata"] == "2025b"
    # AND the next run, the race over, re-plans it and completes
    monkeypatch.setattr(reconciler_module, "replan", replan)
    [again] = Reconciler(aws).run([0], at("15:00"), at("16:00"))
    assert (again.report.complete, again.replanned) == (True, [stale])


def test_occurrences_left_by_a_replan_in_hours_the_new_rules_leave_empty_are_reconciled(
    alice: Api, aws: Services, clock: Clock, old_rules: None
):
    # GIVEN the Vancouver mornings planned under 2025b up to 17:12Z (17:00Z to 17:10Z
    # receivable, open: their messages lost), then the pinned release deployed and the
    # schedule re-planned by the materializer's next step, no reconciler run in between:
    # under the new rules the schedule owns no fire in [17:00Z, 18:00Z)
    sid, shard = every_five_in_vancouver_mornings(aws, clock)
    materialize_until(aws, clock, at("17:12"), [shard], every=60)
    use_zone_source(None)
    materialize_until(aws, clock, at("18:10"), [shard], every=60)
    assert current_item(aws, sid)["tzdata"] == NEW
    left = [
        o["occurrence_id"]
        for o in occurrences_of(aws, sid).values()
        if o["state"] == "SCHEDULED" and at("17:00") <= o["scheduled_for"] < at("18:00")
    ]
    assert left
    # THEN the re-plan marked the schedule through its old cursor
    assert current_item(aws, sid)["manual_through"] >= at("17:10")
    # WHEN the hourly run checks that hour, long after it closed (idle schedules skipped)
    clock.now = at("19:05")
    [result] = Reconciler(aws).run([shard], at("17:00"), at("18:00"))
    # THEN the schedule is read all the same: the old rules' open occurrences are found and
    # sent again, not left unread in an hour reported settled
    assert result.report.schedules == 1
    assert result.report.redriven == len(left)


@pytest.fixture
def rules_restored() -> Iterator[None]:
    yield
    use_zone_source(None)


# 01:30 in America/Vancouver: daily, or once on 2026-11-01 (its schedule COMPLETED once its
# one occurrence is made).
NIGHTLY = (cron_spec("30 1 * * *", "America/Vancouver"), "ACTIVE")
ONCE = (
    {"kind": "at", "at": "2026-11-01T01:30:00", "timezone": "America/Vancouver"},
    "COMPLETED",
)


@pytest.mark.parametrize(("spec", "planned"), [NIGHTLY, ONCE], ids=["cron", "one-shot"])
@pytest.mark.parametrize(
    ("repeat", "fired"),
    [("FIRST", ["08:30"]), ("LAST", ["09:30"]), ("BOTH", ["08:30", "09:30"])],
)
def test_a_replan_follows_the_dst_choice_when_new_rules_repeat_an_hour(
    alice: Api,
    aws: Services,
    clock: Clock,
    rules_restored: None,
    spec: dict[str, Any],
    planned: str,
    repeat: str,
    fired: list[str],
):
    # GIVEN 01:30 in America/Vancouver with a repeat choice, planned under the pinned
    # release (UTC-7 all year: 2026-11-01 01:30 is 08:30Z, once), its 08:30Z occurrence made
    def nov1(text: str) -> int:
        return epoch(f"2026-11-01T{text}Z")

    clock.now = nov1("07:40")
    sid = make(aws, spec=spec | {"dst": {"repeat": repeat}})
    shard = shard_of(sid, aws.settings.shard_count)
    materialize_until(aws, clock, nov1("08:27"), [shard], every=60)
    assert occurrence_id(sid, 1, nov1("08:30")) in occurrences_of(aws, sid)
    assert current_item(aws, sid)["state"] == planned
    # WHEN rules under which the clocks fall back that night (2025b: 01:00-02:00 PDT, then
    # again PST; 01:30 is 08:30Z and 09:30Z) are deployed, the reconciler re-plans it, and
    # the materializer goes on through the night
    use_zone_source(OLD)
    clock.now = nov1("08:28")
    [result] = Reconciler(aws).run([shard], nov1("07:00"), nov1("08:28"))
    assert result.replanned == [sid]
    materialize_until(aws, clock, nov1("09:40"), [shard], every=60)
    # THEN 01:30 fires where the choice says under the new rules: once at the earlier
    # instant, once at the later one (the earlier canceled), or at both
    live = [o for o in occurrences_of(aws, sid).values() if o["state"] != "CANCELED"]
    night = sorted(o["scheduled_for"] for o in live if o["scheduled_for"] < nov1("12:00"))
    assert night == [nov1(t) for t in fired]
    # AND the reconciler's check of the night finds neither a gap nor a stray
    clock.now = nov1("11:05")
    [check] = Reconciler(aws).run([shard], nov1("08:00"), nov1("10:00"))
    assert (check.missing, check.unexpected) == ([], [])


def mar14(text: str) -> int:
    return epoch(f"2027-03-14T{text}Z")


def shifted_0230_in_vancouver(
    aws: Services, clock: Clock, made: str, until: str
) -> tuple[str, int]:
    """02:30 daily in America/Vancouver shifted out of gaps (SHIFT), made at ``made`` on
    2027-03-14 and planned by the materializer until ``until``."""
    spec = cron_spec("30 2 * * *", "America/Vancouver") | {"dst": {"gap": "SHIFT"}}
    clock.now = mar14(made)
    sid = make(aws, spec=spec)
    shard = shard_of(sid, aws.settings.shard_count)
    materialize_until(aws, clock, mar14(until), [shard], every=60)
    return sid, shard


def replanned_under(
    aws: Services, clock: Clock, rules: ZoneSource | None, now: str, shard: int
) -> ShardResult:
    """Deploy ``rules`` at ``now`` on 2027-03-14 and run the reconciler of the hour so far."""
    use_zone_source(rules)
    clock.now = mar14(now)
    [result] = Reconciler(aws).run([shard], mar14("09:00"), mar14(now))
    return result


def test_a_replan_keys_a_shifted_fire_on_the_wall_time_it_matched(
    alice: Api, aws: Services, clock: Clock, rules_restored: None
):
    # GIVEN 02:30 daily in America/Vancouver shifted out of gaps (SHIFT), made at 09:10Z on
    # 2027-03-14 under the pinned release (UTC-7 all year: 02:30 is 09:30Z) and fired
    sid, shard = shifted_0230_in_vancouver(aws, clock, "09:10", "09:40")
    # WHEN rules under which the clocks skip 02:00-03:00 that morning (2025b: 02:30 then
    # fires at the gap's end, 10:00Z) are deployed and everything goes on
    assert replanned_under(aws, clock, OLD, "09:45", shard).replanned == [sid]
    materialize_until(aws, clock, mar14("10:10"), [shard], every=60)
    # THEN 02:30, which fired at 09:30Z, does not fire again at the gap's end
    live = [o for o in occurrences_of(aws, sid).values() if o["state"] != "CANCELED"]
    assert sorted(o["scheduled_for"] for o in live) == [mar14("09:30")]
    # AND the reconciler's check finds neither a gap nor a stray
    clock.now = mar14("11:05")
    [check] = Reconciler(aws).run([shard], mar14("09:00"), mar14("11:00"))
    assert (check.missing, check.unexpected) == ([], [])


def test_a_replan_moves_a_shifted_fire_to_its_wall_times_new_instant(
    alice: Api, aws: Services, clock: Clock, rules_restored: None
):
    # GIVEN the same schedule made at 09:00Z under 2025b, its 02:30 shifted to the gap's end
    # (10:00Z) and planned ahead, with the shifted fire's matched wall time recorded
    use_zone_source(OLD)
    sid, shard = shifted_0230_in_vancouver(aws, clock, "09:00", "09:57")
    shifted = occurrence_id(sid, 1, mar14("10:00"))
    assert aws.occurrences.get(shifted) is not None
    # WHEN the pinned release (no gap: 02:30 is 09:30Z, now past) is deployed at 09:58Z
    result = replanned_under(aws, clock, None, "09:58", shard)
    # THEN the shifted occurrence is canceled and 02:30 fires at once at its new instant
    assert result.replanned == [sid]
    found = occurrences_of(aws, sid)
    assert found[shifted]["state"] == "CANCELED"
    moved = found[occurrence_id(sid, 1, mar14("09:30"))]
    assert (moved["state"], moved["available_at"]) == ("SCHEDULED", mar14("09:58"))


def test_a_replan_skips_a_planned_occurrence_whose_wall_time_a_worker_overwrote(
    alice: Api, aws: Services, clock: Clock, old_rules: None
):
    # GIVEN the schedule planned under 2025b, its 17:00Z occurrence's wall time (``local``,
    # what a re-plan keys on) overwritten with something else by the tenant's worker
    sid, shard = daily_nine_in_vancouver(aws, clock)
    old = occurrence_id(sid, 1, at("17:00"))
    aws.dynamodb.update_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(old)),
        UpdateExpression="SET #l = :l",
        ExpressionAttributeNames={"#l": "local"},
        ExpressionAttributeValues={":l": {"S": "not a wall time"}},
    )
    bad_before = aws.bad_items.count
    # WHEN the pinned release is deployed and the reconciler runs
    use_zone_source(None)
    clock.now = at("16:58")
    [result] = Reconciler(aws).run([shard], at("16:00"), at("16:58"))
    # THEN the re-plan went through: the item is the tenant's unreadable one (counted, its
    # instant left alone), and 09:00 fires at its new instant
    assert result.replanned == [sid]
    assert aws.bad_items.count > bad_before
    assert occurrence_id(sid, 1, at("16:00")) in occurrences_of(aws, sid)


def shifted_one_shot_in_vancouver(aws: Services, clock: Clock, made: str, until: str) -> str:
    """A one-shot at 02:30 local on 2027-03-14 in America/Vancouver, shifted out of a gap
    (SHIFT), made at ``made`` that day and planned by the materializer until ``until``."""
    spec = {
        "kind": "at",
        "at": "2027-03-14T02:30:00",
        "timezone": "America/Vancouver",
        "dst": {"gap": "SHIFT"},
    }
    clock.now = mar14(made)
    sid = make(aws, spec=spec)
    shard = shard_of(sid, aws.settings.shard_count)
    materialize_until(aws, clock, mar14(until), [shard], every=60)
    return sid


def test_a_shifted_one_shot_moves_to_its_wall_times_instant_under_new_rules(
    alice: Api, aws: Services, clock: Clock, rules_restored: None
):
    # GIVEN the one-shot made at 09:00Z under 2025b, where 02:30 is in that morning's gap:
    # shifted to the gap's end (03:00 PDT, 10:00Z) and planned ahead
    use_zone_source(OLD)
    sid = shifted_one_shot_in_vancouver(aws, clock, "09:00", "09:57")
    shifted = occurrence_id(sid, 1, mar14("10:00"))
    assert aws.occurrences.get(shifted) is not None
    # WHEN the pinned release (no gap: 02:30 is 09:30Z, now past) is deployed at 09:58Z
    shard = shard_of(sid, aws.settings.shard_count)
    result = replanned_under(aws, clock, None, "09:58", shard)
    # THEN the shifted occurrence is canceled and the one-shot fires once, at once, at its
    # written wall time's new instant
    assert result.replanned == [sid]
    found = occurrences_of(aws, sid)
    assert found[shifted]["state"] == "CANCELED"
    live = [o for o in found.values() if o["state"] != "CANCELED"]
    assert [(o["scheduled_for"], o["available_at"]) for o in live] == [
        (mar14("09:30"), mar14("09:58"))
    ]
    # AND nothing more is made of it, and the reconciler finds neither a gap nor a stray
    materialize_until(aws, clock, mar14("10:20"), [shard], every=60)
    assert len([o for o in occurrences_of(aws, sid).values() if o["state"] != "CANCELED"]) == 1
    clock.now = mar14("11:05")
    [check] = Reconciler(aws).run([shard], mar14("09:00"), mar14("11:00"))
    assert (check.missing, check.unexpected) == ([], [])


def test_a_one_shot_that_fired_does_not_fire_again_when_new_rules_shift_its_wall_time(
    alice: Api, aws: Services, clock: Clock, rules_restored: None
):
    # GIVEN the one-shot made at 09:10Z under the pinned release (no gap: 02:30 is 09:30Z)
    # and fired
    sid = shifted_one_shot_in_vancouver(aws, clock, "09:10", "09:40")
    assert occurrence_id(sid, 1, mar14("09:30")) in occurrences_of(aws, sid)
    # WHEN rules under which 02:30 is in a gap (2025b: shifted, it would fire at 10:00Z)
    # are deployed and everything goes on
    shard = shard_of(sid, aws.settings.shard_count)
    replanned_under(aws, clock, OLD, "09:45", shard)
    materialize_until(aws, clock, mar14("10:10"), [shard], every=60)
    # THEN it does not fire again at the gap's end: its wall time fired
    live = [o for o in occurrences_of(aws, sid).values() if o["state"] != "CANCELED"]
    assert sorted(o["scheduled_for"] for o in live) == [mar14("09:30")]
    clock.now = mar14("11:05")
    [check] = Reconciler(aws).run([shard], mar14("09:00"), mar14("11:00"))
    assert (check.missing, check.unexpected) == ([], [])
