"""Multi-region (docs/multi-region.md, issue 22 item 7): every schedule has a home region and
a generation; only the home region's materializer and reconciler act on it; a take-over by
another region moves the home, bumps the generation (fencing the old region's materializer
off, even mid-step) and rewinds the cursor so the old region's last minutes are planned
again. Two regions are two Services over the same schedules and tenants tables here (global
tables that replicate at once: kinder than AWS, whose replication lags; the doc says what
that costs), each with occurrences and leases tables of its own (regional, as deployed)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.dal.common import to_dynamo
from punctual.dal.tables import create_tables, occurrence_key
from punctual.domain.ids import occurrence_id, shard_of
from punctual.pipeline.failover import main as failover_main
from punctual.pipeline.failover import take_over
from punctual.pipeline.materializer import Materializer
from punctual.pipeline.reconciler import Reconciler
from punctual.services import Services
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import cron_spec, current_item, make, set_occurrence_state
from tests.integration.reconciler.helpers import at, materialize_until, stored

WEST = "us-west-2"


def region(aws: Services, name: str) -> Services:
    """Another region over the same schedules and tenants tables (global), with occurrences
    and leases tables of its own (regional: its occurrences and their stream, its shard
    walks, leases and reconcile reports): what one region made, the other cannot read."""
    # (each read as the deployed table of its setting by tests/aws_calls.py)
    own = {setting: f"{name}-{setting}" for setting in ("occurrences_table", "leases_table")}
    settings = aws.settings.model_copy(update={"region": name, **own})
    create_tables(aws.dynamodb, settings)  # (only those missing: its regional ones)
    return dataclasses.replace(aws, settings=settings)


def home(aws: Services, sid: str) -> tuple[str | None, int]:
    item = current_item(aws, sid)
    return item.get("home_region"), int(item.get("generation", 1))


def every_five(aws: Services, clock: Clock) -> tuple[str, int]:
    """A */5 schedule made at 09:40 (FIRE_ONCE, a week of lateness tolerance), and its shard."""
    clock.now = at("09:40")
    misfire = {"action": "CATCHUP", "max_lateness_seconds": 7 * 86400, "catchup_limit": 10}
    sid = make(aws, spec=cron_spec("*/5 * * * *"), misfire=misfire)
    return sid, shard_of(sid, aws.settings.shard_count)


def test_a_schedule_is_homed_where_it_was_made_and_a_change_keeps_its_home(
    alice: Api, aws: Services, clock: Clock
):
    sid, _ = every_five(aws, clock)
    assert home(aws, sid) == (aws.settings.region, 1)
    ControlPlane(aws).update("alice", sid, if_match=1, changes={"payload": {"v": 2}})
    assert home(aws, sid) == (aws.settings.region, 1)


def test_only_the_home_regions_materializer_plans_a_schedule(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a schedule homed in us-east-1 (the fixtures' region)
    sid, shard = every_five(aws, clock)
    made = {o["occurrence_id"] for o in stored(aws)}
    before = current_item(aws, sid)
    # WHEN us-west-2's materializer walks its shard for half an hour
    west = region(aws, WEST)
    materialize_until(west, clock, at("10:10"), [shard])
    # THEN it made nothing (in either region's table) and left the cursor alone
    assert {o["occurrence_id"] for o in stored(aws)} == made
    assert stored(west) == []
    assert current_item(aws, sid)["planned_until"] == before["planned_until"]
    # AND the home region's materializer plans it
    clock.now = at("10:10")
    Materializer(aws, "east").run_shard(int(clock.now), shard)
    assert occurrence_id(sid, 1, at("10:10")) in {o["occurrence_id"] for o in stored(aws)}


def test_take_over_moves_the_home_bumps_the_generation_and_replans_the_last_minutes(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a schedule us-east-1 planned up to a little past 10:30, then us-east-1 failed:
    # the occurrences of its last 15 minutes never reached a queue (gone with the region)
    sid, shard = every_five(aws, clock)
    materialize_until(aws, clock, at("10:30"), [shard])
    lost = list(range(at("10:20"), at("10:45"), 300))
    for instant in lost:
        aws.dynamodb.delete_item(
            TableName=aws.settings.occurrences_table,
            Key=to_dynamo(occurrence_key(occurrence_id(sid, 1, instant))),
        )
    # WHEN us-west-2 takes over at 10:34 (rewinding 15 minutes, to 10:19)
    clock.now = at("10:34")
    west = region(aws, WEST)
    report = take_over(west, shard, "us-east-1")
    # THEN the schedule is homed there at generation 2, its cursor back at 10:19
    assert (report.taken, report.conflicts) == ([sid], [])
    assert home(aws, sid) == (WEST, 2)
    assert current_item(aws, sid)["planned_until"] == at("10:19")
    # AND us-west-2's materializer plans the lost fires again (same ids, in its own table),
    # the old region's plans nothing any more, and a second take-over changes nothing
    Materializer(aws, "east").run_shard(int(clock.now), shard)
    assert not {occurrence_id(sid, 1, t) for t in lost} & {o["occurrence_id"] for o in stored(aws)}
    Materializer(west, "west").run_shard(int(clock.now), shard)
    remade = {o["scheduled_for"] for o in stored(west, since=at("10:20"))}
    assert remade >= {at("10:20"), at("10:25"), at("10:30")}
    assert take_over(west, shard, "us-east-1").taken == []
    assert home(aws, sid) == (WEST, 2)


def test_the_generation_fences_off_a_step_the_old_region_had_read_before_the_take_over(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN us-east-1's materializer reading the schedule, and us-west-2 taking it over
    # between that read and its commit
    sid, shard = every_five(aws, clock)
    clock.now = at("10:00")
    faults = Faults(FaultPlan.none(), clock)
    east = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    taken: list[list[str]] = []

    def take_over_first(_: str, request: dict[str, Any]) -> None:
        steps = [a for a in request["TransactItems"] if "Update" in a]
        if not taken and any(sid in str(a) for a in steps):
            taken.append(take_over(region(aws, WEST), shard, "us-east-1", rewind=0).taken)

    faults.before["transact_write_items"] = take_over_first
    made = {o["occurrence_id"] for o in stored(aws)}
    # WHEN us-east-1 commits its step
    Materializer(east, "east").run_shard(int(clock.now), shard)
    # THEN the commit is refused (the generation it read is gone): it made nothing
    assert taken == [[sid]]
    assert {o["occurrence_id"] for o in stored(aws)} == made
    assert home(aws, sid) == (WEST, 2)


def test_an_api_change_racing_a_take_over_keeps_the_new_home(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a take-over that lands between an update's read and its write
    sid, shard = every_five(aws, clock)
    faults = Faults(FaultPlan.none(), clock)
    api = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    moved: list[bool] = []

    def take_over_first(_: str, request: dict[str, Any]) -> None:
        if not moved:
            moved.append(bool(take_over(region(aws, WEST), shard, "us-east-1").taken))

    faults.before["transact_write_items"] = take_over_first
    # WHEN the update commits
    saved = ControlPlane(api).update("alice", sid, if_match=1, changes={"payload": {"v": 2}})
    # THEN it was decided again from a fresh read: version 2, still homed in us-west-2
    assert moved == [True]
    assert saved.schedule.version == 2
    assert home(aws, sid) == (WEST, 2)


def test_the_reconciler_checks_only_the_schedules_homed_in_its_region(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a schedule whose 10:15 and 11:50 were lost in us-east-1, taken over by us-west-2
    # at 12:05 (fires due after 11:50 are its own; 11:50 itself is not), whose own
    # materializer then lost 12:20
    sid, shard = every_five(aws, clock)
    lost = {at("10:15"), at("11:50")}
    materialize_until(aws, clock, at("11:55"), [shard], skip=lambda s, t: t in lost)
    clock.now = at("12:05")
    west = region(aws, WEST)
    take_over(west, shard, "us-east-1")
    assert current_item(aws, sid)["homed_since"] == at("11:50")
    materialize_until(west, clock, at("13:00"), [shard], skip=lambda s, t: t == at("12:20"))
    # WHEN each region reconciles [10:00, 11:00), and us-west-2 [11:00, 12:00) and
    # [12:00, 13:00)
    clock.now = at("13:05")
    [east] = Reconciler(aws).run([shard], at("10:00"), at("11:00"))
    [before] = Reconciler(west).run([shard], at("10:00"), at("11:00"))
    [at_take_over] = Reconciler(west).run([shard], at("11:00"), at("12:00"))
    [after] = Reconciler(west).run([shard], at("12:00"), at("13:00"))
    # THEN us-east-1 no longer reads it; us-west-2 does not take the 10:15 gap, nor the one
    # at the take-over's own instant, for its own (their records are in us-east-1's table:
    # a repair here could fire them twice), nor does its materializer plan 11:50; it finds
    # and repairs its own
    assert (east.report.schedules, east.missing) == (0, [])
    assert (before.report.schedules, before.missing) == (1, [])
    assert (at_take_over.missing, at_take_over.fired) == ([], [])
    assert at("11:50") not in {o["scheduled_for"] for o in stored(aws) + stored(west)}
    assert after.missing == [occurrence_id(sid, 1, at("12:20"))]
    assert after.fired == [occurrence_id(sid, 1, at("12:20"))]


@pytest.mark.parametrize("ending", ["completed", "paused"])
def test_take_over_of_a_completed_or_paused_schedule_finds_nothing_missing_or_fires_it_again(
    alice: Api, aws: Services, clock: Clock, ending: str
):
    # GIVEN a */5 schedule made at 09:40 in us-east-1 (CATCHUP, a week of lateness
    # tolerance: a repair would fire), whose fires to 10:30 ran there (recorded in
    # us-east-1's table only), then completed (its end_at was 10:30) or paused at 10:32
    clock.now = at("09:40")
    misfire = {"action": "CATCHUP", "max_lateness_seconds": 7 * 86400, "catchup_limit": 10}
    ends = {"end_at": "2026-11-19T10:30:00Z"} if ending == "completed" else {}
    sid = make(aws, spec=cron_spec("*/5 * * * *") | ends, misfire=misfire)
    shard = shard_of(sid, aws.settings.shard_count)
    materialize_until(aws, clock, at("10:30"), [shard])
    ran = {o["occurrence_id"] for o in stored(aws)}
    assert ran == {occurrence_id(sid, 1, t) for t in range(at("09:40"), at("10:31"), 300)}
    for oid in ran:
        set_occurrence_state(aws, oid, "SUCCEEDED")
    clock.now = at("10:32")
    if ending == "paused":
        ControlPlane(aws).pause("alice", sid)
    assert current_item(aws, sid)["state"] == ending.upper()
    # WHEN us-east-1 fails and us-west-2 takes the shard over at 10:45 (rewinding to 10:30),
    # walks it, and checks the hour those fires were due in
    clock.now = at("10:45")
    west = region(aws, WEST)
    assert take_over(west, shard, "us-east-1").taken == [sid]
    materialize_until(west, clock, at("11:05"), [shard], every=60)
    [checked] = Reconciler(west).run([shard], at("10:00"), at("11:00"))
    # THEN it read the schedule and found nothing MISSING: those fires' records are in
    # us-east-1's table, not its own to find missing or to repair; nothing was made here
    assert checked.report.schedules == 1
    assert (checked.missing, checked.fired, checked.recorded_missed) == ([], [], [])
    assert stored(west) == []
    # AND once the tenant has it fire again through us-west-2 (resumed, or its end moved
    # to 11:30) and us-west-2 walks on, the hour checked again still finds nothing MISSING:
    # only the fires after the change are made, in us-west-2's table
    clock.now = at("11:06")
    if ending == "paused":
        ControlPlane(west).resume("alice", sid)
    else:
        later = cron_spec("*/5 * * * *") | {"end_at": "2026-11-19T11:30:00Z"}
        ControlPlane(west).update("alice", sid, if_match=1, changes={"spec": later})
    materialize_until(west, clock, at("11:31"), [shard], every=60)
    clock.now = at("12:05")
    [again] = Reconciler(west).run([shard], at("10:00"), at("11:00"))
    assert (again.missing, again.fired, again.recorded_missed) == ([], [], [])
    fired_here = sorted(o["scheduled_for"] for o in stored(west))
    assert fired_here == list(range(at("11:10"), at("11:31"), 300))


def test_the_old_regions_reconciler_repairs_nothing_its_lagging_index_still_shows_home(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a schedule whose 10:15 was lost in us-east-1, taken over by us-west-2 at 12:05,
    # and us-east-1's shard index still showing it homed there (an index lags its table)
    sid, shard = every_five(aws, clock)
    materialize_until(aws, clock, at("11:05"), [shard], skip=lambda s, t: t == at("10:15"))
    faults = Faults(FaultPlan(index_lag=1.0, index_lag_seconds=2 * 3600), clock)
    east = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    clock.now = at("12:05")
    take_over(region(east, WEST), shard, "us-east-1")
    # WHEN us-east-1 reconciles [10:00, 11:00) from its lagging index
    clock.now = at("12:10")
    [result] = Reconciler(east).run([shard], at("10:00"), at("11:00"))
    # THEN it checked the schedule (the index said it was its own) and found the gap, but
    # its consistent read before the repair saw the new home: nothing was made here (the
    # fire is the new region's to judge: it would be fired twice otherwise)
    assert result.report.schedules == 1
    assert result.missing == [occurrence_id(sid, 1, at("10:15"))]
    assert result.fired == []
    assert at("10:15") not in {o["scheduled_for"] for o in stored(aws) if o["schedule_id"] == sid}


def test_a_schedule_written_before_homes_existed_is_planned_here_and_taken_over(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a schedule item with neither home_region nor generation
    sid, shard = every_five(aws, clock)
    aws.dynamodb.update_item(
        TableName=aws.settings.schedules_table,
        Key=aws.schedules.key(sid),
        UpdateExpression="REMOVE home_region, generation",
    )
    # THEN the materializer plans it
    materialize_until(aws, clock, at("10:00"), [shard])
    assert occurrence_id(sid, 1, at("10:00")) in {o["occurrence_id"] for o in stored(aws)}
    # AND homing the unhomed (before the table is replicated) homes it here, all of its
    # history kept as this region's
    assert take_over(aws, shard, None).taken == [sid]
    assert home(aws, sid) == (aws.settings.region, 2)
    assert "homed_since" not in current_item(aws, sid)
    assert take_over(aws, shard, None).taken == []
    # AND a take-over from that region homes it elsewhere
    assert take_over(region(aws, WEST), shard, "us-east-1").taken == [sid]
    assert home(aws, sid) == (WEST, 3)


def test_failover_command_refuses_bad_input_with_exit_code_2(
    aws: Services, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setattr(Services, "from_environment", classmethod(lambda cls: aws))
    assert failover_main(["--from", "us-east-1"]) == 2  # this region itself
    assert "cannot take over from itself" in capsys.readouterr().err
    assert failover_main(["--from", WEST, "--shards", "0-99"]) == 2
    assert "shards are 0.." in capsys.readouterr().err
    assert failover_main(["--from", WEST, "--rewind", "-1"]) == 2
    assert failover_main(["--from", WEST]) == 0
    assert "took over 0 schedules from us-west-2" in capsys.readouterr().out
    assert failover_main(["--unhomed"]) == 0
    assert "took over 0 schedules homed nowhere" in capsys.readouterr().out
