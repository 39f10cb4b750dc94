"""Quota given back exactly once when a one-shot completes (issue 15, defect 8), on moto with
the injected clock. The materializer completes a one-shot and gives its quota back, whether
it or the API made the occurrence, and an update racing the completion keeps the count exact.
A crash or a lost lease around the hand-over gives the quota back once, a lease is renewed
during a long bucket, and a step refused by its cursor and a put, or by an old version, is
read again at once."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.dal.common import to_dynamo
from punctual.dal.leases import shard_key
from punctual.dal.tables import DUE_INDEX, occurrence_key
from punctual.domain.ids import occurrence_id
from punctual.domain.occurrence import OccurrenceState
from punctual.domain.schedule import ScheduleState
from punctual.pipeline.materializer import LEASE_SECONDS, RENEW_AFTER, Materializer
from punctual.services import Services
from punctual.timing import utc_text
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import CountedWrites, cron_spec, make
from tests.integration.materializer.helpers import (
    Crash,
    crash_at,
    crowded_bucket,
    current,
    instants,
    occurrences,
    shard,
    tick,
)


def test_materializer_completes_a_one_shot_and_releases_its_quota(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot an hour ahead (beyond the API's horizon)
    at = int(clock.now) + 3600
    sid = make(aws, spec={"kind": "at", "at": datetime.fromtimestamp(at).astimezone().isoformat()})
    assert alice.get("/v1/tenant").body["schedule_count"] == 1
    # WHEN it is materialized
    clock.now = at - 60
    tick(aws, clock, sid)
    # THEN it has its occurrence, is COMPLETED, left the due index and gave its slot back
    assert instants(aws, sid) == [at]
    item = current(aws, sid)
    assert item["state"] == ScheduleState.COMPLETED
    # (no cursor left: nothing for the walk, the API or the reconciler to read as a next fire)
    cursor = {"due_at", "due_bucket", "next_run_at", "next_available_at", "planned_until"}
    assert cursor & set(item) == set()
    due = aws.dynamodb.scan(TableName=aws.settings.schedules_table, IndexName=DUE_INDEX)
    assert due["Count"] == 0
    assert alice.get("/v1/tenant").body["schedule_count"] == 0


def test_materializer_completes_a_one_shot_the_api_made_itself_and_releases_its_quota(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot due in 30 s: the API makes its occurrence itself, and the schedule
    # waits in the due index with no next fire, for the materializer to complete it
    sid, at = _one_shot_in(aws, clock, 30)
    waiting = current(aws, sid)
    assert instants(aws, sid) == [at]
    assert waiting.get("next_run_at") is None
    assert waiting["state"] == ScheduleState.ACTIVE
    assert _usage(alice) == 1
    # WHEN the walk reaches the minute it waits in
    clock.now = waiting["next_available_at"]
    report = tick(aws, clock, sid)
    # THEN it is COMPLETED, its occurrence not made again, and its slot is given back
    assert (report.completed, report.occurrences, report.conflicts) == (1, 0, 0)
    assert instants(aws, sid) == [at]
    assert current(aws, sid)["state"] == ScheduleState.COMPLETED
    assert _usage(alice) == 0


# --- quota given back exactly once (issue 15, defect 8) -------------------------------------


def _one_shot_in(aws: Services, clock: Clock, seconds: int) -> tuple[str, int]:
    at = int(clock.now) + seconds
    when = datetime.fromtimestamp(at).astimezone().isoformat()
    return make(aws, spec={"kind": "at", "at": when}), at


def _usage(alice: Api) -> int:
    count: int = alice.get("/v1/tenant").body["schedule_count"]
    return count


def test_update_racing_the_completion_keeps_the_quota_count_exact(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot an hour ahead, and an update (moving it a day later) read while it
    # was ACTIVE: before the update commits, the materializer fires and completes it
    sid, at = _one_shot_in(aws, clock, 3600)
    clock.now = at - 60
    faults = Faults(FaultPlan.none(), clock)
    racing = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    completed: list[bool] = []

    def complete_first(_: str, request: dict[str, Any]) -> None:
        if not completed:
            completed.append(True)
            tick(aws, clock, sid)
            assert current(aws, sid)["state"] == ScheduleState.COMPLETED
            assert _usage(alice) == 0

    faults.before["transact_write_items"] = complete_first
    later = datetime.fromtimestamp(at + 86400).astimezone().isoformat()
    # WHEN the update lands
    saved = ControlPlane(racing).update(
        "alice", sid, if_match=1, changes={"spec": {"kind": "at", "at": later}}
    )
    # THEN it was decided again from the completed schedule: live again, counted again
    assert saved.schedule.state is ScheduleState.ACTIVE
    assert saved.schedule.version == 2
    assert _usage(alice) == 1


def test_materializer_crash_before_the_hand_over_gives_the_quota_back_exactly_once(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN two one-shots completed by a walk that is killed right after committing, before
    # it hands the released quota over to the tenant
    first, at = _one_shot_in(aws, clock, 3600)
    _one_shot_in(aws, clock, 3600)
    assert _usage(alice) == 2
    clock.now = at - 60
    shards = sorted({shard(aws, s) for s in _schedule_ids(aws)})
    for number in shards:
        with pytest.raises(Crash):
            Materializer(aws, "m1", crash=crash_at("before_hand_over")).run_shard(
                int(clock.now), number
            )
    assert current(aws, first)["state"] == ScheduleState.COMPLETED
    assert _usage(alice) == 2  # released, waiting on the shard
    # WHEN the next ticks run (after the lease expired), twice
    for _ in range(2):
        clock.advance(LEASE_SECONDS + 1)
        for number in shards:
            Materializer(aws, "m2").run_shard(int(clock.now), number)
    # THEN the tenant got both back, once
    assert _usage(alice) == 0


def test_materializer_hands_each_release_over_once_across_walks(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a cron schedule that stays, and two one-shots an hour apart in one shard
    make(aws, spec=cron_spec("0 0 1 1 *"))
    first, at = _one_shot_in(aws, clock, 3600)
    while True:
        second, later = _one_shot_in(aws, clock, 7200)
        if shard(aws, second) == shard(aws, first):
            break
    made = _usage(alice)
    # WHEN one walk completes the first and hands its release over, and a later walk
    # completes the second
    for instant in (at, later):
        clock.now = instant - 60
        tick(aws, clock, first, holder=f"m{instant}")
    # THEN the tenant got exactly those two back: the first walk emptied the shard's tally,
    # so the second did not hand the first's release over again
    assert current(aws, second)["state"] == ScheduleState.COMPLETED
    assert _usage(alice) == made - 2


def test_materializer_hands_a_release_over_whole_on_a_lagging_replica(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot an hour ahead, and a materializer whose eventually consistent reads
    # are served a minute stale
    sid, at = _one_shot_in(aws, clock, 3600)
    made = _usage(alice)
    faults = Faults(FaultPlan(stale=1.0, stale_seconds=60), clock)
    lagging = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    # WHEN one walk completes it and hands the release over (its tally written a moment
    # before, in the walk's own transaction)
    clock.now = at - 60
    Materializer(lagging, "m1").run_shard(int(clock.now), shard(aws, sid))
    # THEN the tenant got its schedule back at once: the tally was read whole (a stale read
    # would hand nothing over and leave the release behind, the tenant no longer pending)
    assert current(aws, sid)["state"] == ScheduleState.COMPLETED
    assert _usage(alice) == made - 1


def test_materializer_that_loses_its_lease_before_moving_the_watermark_stops_walking(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a walk over several buckets that stalls past its lease before moving the
    # watermark over its first one, while m2 takes the shard over
    sid = make(aws, spec=cron_spec("*/5 * * * *"))
    clock.now = current(aws, sid)["next_run_at"] - 300
    number = shard(aws, sid)

    def taken_over(point: str) -> None:
        if point == "before_watermark" and not taken_over.done:  # type: ignore[attr-defined]
            taken_over.done = True  # type: ignore[attr-defined]
            clock.advance(LEASE_SECONDS + 1)
            taken = aws.leases.claim(number, "m2", now=int(clock.now), ttl=60, start_at=0)
            assert taken is not None

    taken_over.done = False  # type: ignore[attr-defined]
    before = aws.leases.watermark(number)
    # WHEN the stalled walk goes on
    report = tick(aws, clock, sid, crash=taken_over)
    # THEN its watermark move is refused: it says it lost the lease and walks no further
    # bucket (m2's walk owns them), and the watermark is not its to move
    assert report.lease_lost
    assert report.buckets == 0
    assert aws.leases.watermark(number) == before


def test_materializer_that_loses_its_lease_before_the_hand_over_leaves_it_to_the_next(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot an hour ahead, and a walk that stalls after completing it, past its
    # lease, while another materializer takes the shard over
    sid, at = _one_shot_in(aws, clock, 3600)
    clock.now = at - 60

    def taken_over(point: str) -> None:
        if point == "before_hand_over":
            clock.advance(LEASE_SECONDS + 1)
            number = shard(aws, sid)
            taken = aws.leases.claim(
                number, "m2", now=int(clock.now), ttl=LEASE_SECONDS, start_at=0
            )
            assert taken is not None

    # WHEN the stalled walk goes on to hand the released quota over
    report = tick(aws, clock, sid, crash=taken_over)
    # THEN it is fenced off and says it lost the lease; the release waits on the shard, and
    # the next walk hands it over
    assert report.lease_lost
    assert _usage(alice) == 1
    clock.advance(LEASE_SECONDS + 1)
    assert tick(aws, clock, sid, holder="m3").claimed
    assert _usage(alice) == 0


@pytest.mark.parametrize("elapsed", [RENEW_AFTER - 1, RENEW_AFTER])
def test_materializer_renews_its_lease_during_a_long_bucket(
    alice: Api, aws: Services, clock: Clock, elapsed: int
):
    # GIVEN two schedules due in one bucket of one shard, stepped one transaction each
    _, [a, *_] = crowded_bucket(aws, cron_spec("*/5 * * * *"), 2)
    clock.now = current(aws, a)["next_run_at"] - 120
    number = shard(aws, a)
    expiries: list[tuple[int, int]] = []

    def slow(point: str) -> None:
        if point == "before_commit":
            found = aws.dynamodb.get_item(
                TableName=aws.settings.leases_table, Key=shard_key(number), ConsistentRead=True
            )["Item"]
            expiries.append((int(clock.now), int(found["expires_at"]["N"])))
            clock.advance(elapsed)

    # WHEN each of the walk's commits takes just under, or exactly, a third of the lease
    Materializer(aws, "m1", crash=slow, max_actions=3).run_shard(int(clock.now), number)
    # THEN the lease is renewed (to a whole lease from then) once a third of it has passed
    # since the last renewal, and not before (a write per commit would be wasted)
    assert len(expiries) >= 2
    (_, first), (now, second) = expiries[:2]
    assert second == (now + LEASE_SECONDS if elapsed >= RENEW_AFTER else first)


def _schedule_ids(aws: Services) -> list[str]:
    return [
        s.schedule_id
        for s in ControlPlane(aws).list_schedules("alice", state=None, limit=100, token=None)[0]
    ]


def test_materializer_a_step_refused_by_its_cursor_and_a_put_is_reread_at_once(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a minutely schedule about to be stepped (several fires a step), its second
    # fire's occurrence made already (a repair)
    sid = make(aws, spec=cron_spec("* * * * *"))
    fire = current(aws, sid)["next_run_at"]
    clock.now = fire - 120
    made = occurrence_id(sid, 1, fire + 60)
    aws.dynamodb.put_item(
        TableName=aws.settings.occurrences_table,
        Item=to_dynamo(
            occurrence_key(made)
            | {
                "occurrence_id": made,
                "tenant_id": "alice",
                "schedule_version": 1,
                "scheduled_for": fire + 60,
                "available_at": fire + 60,
                "target": "default",
                "state": "SUCCEEDED",
            }
        ),
    )
    counting = CountedWrites(aws.dynamodb)
    plane = ControlPlane(aws)

    def cancel_first(point: str) -> None:
        if point == "before_commit" and not cancel_first.done:  # type: ignore[attr-defined]
            cancel_first.done = True  # type: ignore[attr-defined]
            plane.cancel("alice", sid)

    cancel_first.done = False  # type: ignore[attr-defined]
    # WHEN it is canceled between the walk's read and its commit: the transaction is
    # refused by the step's cursor and by the existing occurrence's put
    report = Materializer(
        dataclasses.replace(aws, dynamodb=counting), "m1", crash=cancel_first
    ).run_shard(int(clock.now), shard(aws, sid))
    # THEN the step is re-read at once (a conflict), not tried again without the refused
    # put (which the cursor would refuse again): one transaction, nothing of it written
    assert report.conflicts == 1
    assert counting.transactions == 1
    assert all(o["state"] != OccurrenceState.SCHEDULED for o in occurrences(aws, sid))


def test_materializer_step_of_an_old_version_is_refused_when_neither_version_has_a_cursor(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot due in 30 s: the API made its occurrence, and it waits in the due
    # index with no next fire, its strict fire counted in its minute of the hour
    sid, at = _one_shot_in(aws, clock, 30)
    waiting = current(aws, sid)
    assert waiting.get("next_run_at") is None
    assert aws.tenants.get("alice").minute_load[at % 3600 // 60] == 1
    clock.now = waiting["next_available_at"]
    moved = int(clock.now) + 90  # six minutes after the first: another minute of the hour
    plane = ControlPlane(aws)
    updated: list[int] = []

    def update_first(point: str) -> None:
        if point == "before_commit" and not updated:
            later = {"kind": "at", "at": utc_text(moved)}
            saved = plane.update("alice", sid, if_match=1, changes={"spec": later})
            updated.append(saved.schedule.version)

    # WHEN the walk that read version 1 (to complete it) commits after an update moved the
    # one-shot to that minute: version 2 made by the API too, with no next fire either, so
    # the cursor condition (no next_run_at) holds for both
    report = tick(aws, clock, sid, crash=update_first)
    # THEN the version condition refuses the old step: version 2 is still ACTIVE, waiting
    # to be completed, and the usage moved with the update, to its new minute
    assert updated == [2]
    assert (report.conflicts, report.completed) == (1, 0)
    item = current(aws, sid)
    assert (item["version"], item["state"]) == (2, ScheduleState.ACTIVE)
    assert instants(aws, sid) == [at, moved]
    usage = aws.tenants.get("alice")
    assert usage.schedule_count == 1
    assert {m: n for m, n in enumerate(usage.minute_load) if n} == {moved % 3600 // 60: 1}
    # AND once the walk reaches version 2's minute it completes it, and every count of the
    # tenant's usage is back to zero (none left held, none below zero)
    clock.now = item["next_available_at"]
    assert tick(aws, clock, sid, holder="m2").completed == 1
    assert current(aws, sid)["state"] == ScheduleState.COMPLETED
    usage = aws.tenants.get("alice")
    assert usage.schedule_count == 0
    assert usage.minute_load == [0] * 60
