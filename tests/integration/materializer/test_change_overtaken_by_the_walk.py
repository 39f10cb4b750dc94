"""A change overtaken by the materializer's walk (issue 15, defect 2), on moto with the injected
clock. A schedule change whose commit lands after the walk passed its minute still fires, a
schedule made before its shard was ever walked fires when the materializer comes up, and a
late opener of a shard leaves the walk as it stands. The reconciler moves a cursor left
behind the walk so that it fires, goes on past one it must leave, and does so even right
after a catch-up on a lagging replica."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.dal.common import to_dynamo
from punctual.dal.leases import LeaseStore
from punctual.dal.schedules import due_bucket
from punctual.dal.tables import current_key
from punctual.domain.findings import Finding
from punctual.domain.ids import shard_of
from punctual.domain.schedule import ScheduleDefinition, ScheduleState
from punctual.pipeline.materializer import LEASE_SECONDS, Materializer
from punctual.pipeline.reconciler import Reconciler
from punctual.services import Services
from punctual.timing import utc_text
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import cron_spec, make
from tests.integration.materializer.helpers import crowded_bucket, current, instants, shard, tick

# --- a change overtaken by the walk (issue 15, defect 2) ------------------------------------


def test_api_change_whose_commit_lands_after_the_walk_still_fires(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a create whose commit is held up (throttle retries, a slow call): before it
    # lands, the materializer walks the schedule's shard past the bucket its cursor goes to
    faults = Faults(FaultPlan.none(), clock)
    slow = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    walked: list[int] = []

    def walk_first(_: str, request: dict[str, Any]) -> None:
        if walked:
            return
        put = next(a["Put"]["Item"] for a in request["TransactItems"] if "Put" in a)
        number = shard_of(put["schedule_id"]["S"], aws.settings.shard_count)
        walked.append(number)
        Materializer(aws, "m0").run_shard(int(clock.now) + 180, number)

    faults.before["transact_write_items"] = walk_first
    definition = ScheduleDefinition.model_validate(
        {"target": "default", "spec": cron_spec("* * * * *")}
    )
    sid = ControlPlane(slow).create("alice", definition).schedule.schedule_id
    assert walked
    start = int(clock.now)
    # WHEN the materializer ticks every minute after that
    for _ in range(10):
        clock.advance(60)
        tick(aws, clock, sid, holder=f"m{clock.now}")
    # THEN every minute fires, with no gap: the cursor was never left behind the walk
    fired = instants(aws, sid)
    assert fired[0] == start - start % 60 + 60
    assert fired == list(range(fired[0], fired[-1] + 60, 60))
    assert fired[-1] >= clock.now


def test_schedule_made_before_its_shard_was_ever_walked_fires_when_the_materializer_comes_up(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a schedule created in a shard no materializer has claimed yet (a new deployment
    # whose ticker is down), every 15 minutes, catching up what it misses
    sid = make(
        aws,
        spec=cron_spec("*/15 * * * *"),
        misfire={"action": "CATCHUP", "max_lateness_seconds": 86400, "catchup_limit": 100},
    )
    number = shard(aws, sid)
    first = current(aws, sid)["next_run_at"]
    bucket = int(current(aws, sid)["due_at"])
    # THEN the create gave the shard a watermark before the schedule's bucket
    opened = LeaseStore(aws.dynamodb, aws.settings.leases_table).watermark(number)
    assert opened is not None
    assert opened < bucket
    # WHEN the materializer first runs three hours later (past its one-hour bootstrap)
    clock.now = first + 3 * 3600
    Materializer(aws, "m1").run_shard(int(clock.now), number)
    # THEN it walks from that watermark and makes every fire, none lost with the schedule
    # stranded in a bucket behind its first walk
    fired = instants(aws, sid)
    assert fired[0] == first
    assert fired == list(range(first, fired[-1] + 1, 900))
    assert fired[-1] >= clock.now - 900


def test_a_late_opener_of_a_shard_leaves_its_walk_and_its_holder_as_they_stand(
    aws: Services, clock: Clock
):
    # GIVEN a shard opened by one create, claimed by m1 and walked ten minutes on
    now = int(clock.now)
    aws.leases.open(5, now=now)
    lease = aws.leases.claim(5, "m1", now=now, ttl=LEASE_SECONDS, start_at=0)
    assert lease is not None
    walked = lease.watermark + 600
    assert aws.leases.advance(lease, walked, expires_at=now + LEASE_SECONDS)
    # WHEN another create, which found the shard unopened a moment before, opens it now
    aws.leases.open(5, now=now + 1)
    # THEN the walk stands where m1 left it (not an hour back, re-walked), and m1 still
    # holds the lease under its fence: m2 cannot claim it, m1 walks on
    assert aws.leases.watermark(5) == walked
    assert aws.leases.claim(5, "m2", now=now + 1, ttl=LEASE_SECONDS, start_at=0) is None
    assert aws.leases.advance(lease, walked + 60, expires_at=now + LEASE_SECONDS)


def _walk_past_unseen(aws: Services, clock: Clock, ids: list[str], until: int) -> None:
    """The ids' shard walked up to ``until`` while their due-index entries were out of its
    sight (the index lagged past every margin), then put back: each cursor is left behind
    the walk, in a bucket no walk reads again."""

    def place(sid: str, bucket: str) -> None:
        aws.dynamodb.update_item(
            TableName=aws.settings.schedules_table,
            Key=to_dynamo(current_key(sid)),
            UpdateExpression="SET due_bucket = :b",
            ExpressionAttributeValues={":b": {"S": bucket}},
        )

    hidden = {sid: current(aws, sid)["due_bucket"] for sid in ids}
    for sid in ids:
        place(sid, "elsewhere")
    clock.now = until
    Materializer(aws, "m").run_shard(int(clock.now), shard(aws, ids[0]))
    for sid, bucket in hidden.items():
        place(sid, bucket)


@pytest.mark.parametrize("window", ["hour", "from mid-minute", "two hours"])
def test_reconciler_moves_a_cursor_left_behind_the_walk_and_it_fires(
    alice: Api, aws: Services, clock: Clock, window: str
):
    # GIVEN a one-shot whose due-index entry the walk passed without seeing it (the index
    # lagged past every margin): it would never be completed, and would hold its quota
    at = int(clock.now) + 3600
    sid = make(aws, spec={"kind": "at", "at": datetime.fromtimestamp(at).astimezone().isoformat()})
    number = shard(aws, sid)
    stash = dict(current(aws, sid))
    _walk_past_unseen(aws, clock, [sid], until=at + 120)
    assert instants(aws, sid) == []
    assert alice.get("/v1/tenant").body["schedule_count"] == 1
    # WHEN the reconciler checks the hour that holds its fire; or an hour from the middle of
    # the fire's minute (the bucket holding the window's start is read too); or two hours
    # whose 61st minute is the fire's (every minute's bucket is read)
    clock.now = at - at % 3600 + 2 * 3600 + 60
    first, hours = {
        "hour": (at - at % 3600, 1),
        "from mid-minute": (at - at % 60 + 30, 1),
        "two hours": (at - at % 60 - 3600, 2),
    }[window]
    walked = aws.leases.watermark(number)
    assert walked is not None
    [result] = Reconciler(aws).run([number], first, first + hours * 3600)
    # THEN it reports the fire MISSING, moves the schedule two minutes ahead of the walk or
    # of now (the walk reads it at its next tick), and the next tick makes its occurrence
    # (late, under its FIRE_ONCE policy) and completes it
    assert result.moved == [sid]
    assert result.report.cursors_moved == 1
    ahead = max(walked, int(clock.now) // 60 * 60) + 120
    assert current(aws, sid)["due_bucket"] == due_bucket(ahead, number)
    tick(aws, clock, sid)
    assert instants(aws, sid) == [stash["next_run_at"]]
    assert current(aws, sid)["state"] == ScheduleState.COMPLETED
    assert alice.get("/v1/tenant").body["schedule_count"] == 0


def test_a_check_only_reconcile_leaves_a_cursor_left_behind_the_walk_where_it_is(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot whose due-index entry the walk passed without seeing it
    at = int(clock.now) + 3600
    sid = make(aws, spec={"kind": "at", "at": utc_text(at)})
    _walk_past_unseen(aws, clock, [sid], until=at + 120)
    stuck = current(aws, sid)["due_bucket"]
    # WHEN a check-only reconcile (repair off) checks the hour that holds its fire
    hour = at - at % 3600
    clock.now = hour + 2 * 3600 + 60
    [result] = Reconciler(aws, repair=False).run([shard(aws, sid)], hour, hour + 3600)
    # THEN it reports the fire MISSING and writes nothing: the cursor stays where it is
    assert result.report.counts[Finding.MISSING] == 1
    assert result.moved == []
    assert result.report.cursors_moved == 0
    assert current(aws, sid)["due_bucket"] == stuck


@pytest.mark.parametrize("first", ["moved since", "another region's", "refused"])
def test_reconciler_moving_cursors_left_behind_goes_on_past_one_it_must_leave(
    alice: Api, aws: Services, clock: Clock, first: str
):
    # GIVEN two one-shots of one shard due in one minute an hour ahead, a second apart (made
    # until one shard has two), both left behind the walk; the index lists first one that the
    # reconciler must not move: one whose time its tenant changed a moment ago, which an index
    # lagging a minute still lists in the old bucket; one homed in another region (taken
    # over); one its tenant pauses between the reconciler's read and its move
    at = int(clock.now) // 60 * 60 + 3600
    _, [left, stuck] = crowded_bucket(
        aws, lambda made: {"kind": "at", "at": utc_text(at + made)}, 2
    )
    assert current(aws, left)["next_run_at"] < current(aws, stuck)["next_run_at"]
    _walk_past_unseen(aws, clock, [left, stuck], until=at + 120)
    hour = at - at % 3600
    clock.now = hour + 2 * 3600 + 60
    faults = Faults(FaultPlan(index_lag=1.0, index_lag_seconds=60), clock)
    lagging = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    if first == "moved since":
        later = {"spec": {"kind": "at", "at": utc_text(int(clock.now) + 3600)}}
        ControlPlane(lagging).update("alice", left, if_match=1, changes=later)
    elif first == "another region's":
        aws.dynamodb.update_item(
            TableName=aws.settings.schedules_table,
            Key=to_dynamo(current_key(left)),
            UpdateExpression="SET home_region = :west",
            ExpressionAttributeValues={":west": {"S": "us-west-2"}},
        )
    else:
        moving = to_dynamo(current_key(left))

        def pause_first(_: str, request: dict[str, Any]) -> None:
            updates = [a["Update"]["Key"] for a in request["TransactItems"] if "Update" in a]
            if moving in updates and current(aws, left)["state"] == ScheduleState.ACTIVE:
                ControlPlane(aws).pause("alice", left)

        faults.before["transact_write_items"] = pause_first
    number = shard(aws, left)
    walked = aws.leases.watermark(number)
    assert walked is not None
    ahead = due_bucket(max(walked, int(clock.now) // 60 * 60) + 120, number)
    # WHEN the reconciler checks the hour that holds their fires
    [result] = Reconciler(lagging).run([number], hour, hour + 3600)
    # THEN it leaves that one where it is and still moves the other ahead of the walk: one it
    # must leave is no reason to stop reading the bucket
    assert result.moved == [stuck]
    assert current(aws, stuck)["due_bucket"] == ahead
    assert current(aws, left).get("due_bucket") != ahead


def test_reconciler_right_after_a_catch_up_on_a_lagging_replica_still_moves_a_stranded_cursor(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot whose due-index entry a catch-up walk passed without seeing it, the
    # walk done half a minute before the reconciler runs, on a replica a minute behind
    replica = dataclasses.replace(
        aws,
        dynamodb=FaultyDynamoDB(
            aws.dynamodb, Faults(FaultPlan(stale=1.0, stale_seconds=60), clock)
        ),
    )
    at = int(clock.now) + 3600
    sid = make(aws, spec={"kind": "at", "at": datetime.fromtimestamp(at).astimezone().isoformat()})
    number = shard(aws, sid)
    Materializer(replica, "m").run_shard(int(clock.now), number)  # the walk behind its bucket
    hidden = current(aws, sid)["due_bucket"]
    key = to_dynamo({"schedule_id": sid, "sk": "CURRENT"})
    aws.dynamodb.update_item(
        TableName=aws.settings.schedules_table,
        Key=key,
        UpdateExpression="SET due_bucket = :elsewhere",
        ExpressionAttributeValues={":elsewhere": {"S": "elsewhere"}},
    )
    reconcile_at = at - at % 3600 + 2 * 3600 + 60
    clock.now = reconcile_at - 30
    Materializer(replica, "m").run_shard(int(clock.now), number)  # catches up past it, unseen
    aws.dynamodb.update_item(
        TableName=aws.settings.schedules_table,
        Key=key,
        UpdateExpression="SET due_bucket = :b",
        ExpressionAttributeValues={":b": {"S": hidden}},
    )
    # WHEN the reconciler checks the hour that holds its fire, through that replica
    clock.now = reconcile_at
    window = (at - at % 3600, at - at % 3600 + 3600)
    [result] = Reconciler(replica).run([number], *window)
    # THEN it reads where the walk stands now (strongly consistent: the watermark of a
    # minute ago is behind the bucket, which it would not look in, and no later run looks
    # at this hour's buckets again) and moves the schedule ahead of the walk
    assert result.moved == [sid]
