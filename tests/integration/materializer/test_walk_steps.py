"""The materializer's walk, step by step, on moto with the injected clock. A step that some
schedules refuse goes on with the others, a schedule deleted or changed between the read and
the commit is dropped or replanned, an occurrence already made is left, and a full step
continues up to the walk's very last second. The walk's report counts every completion and
every bucket, transactions stay within DynamoDB's limit on actions, a cursor written before
planned_until existed is followed, an update after a step cancels the old version's
occurrence, and the fault hook drops exactly the instant it chose."""

from __future__ import annotations

import dataclasses

import pytest

from punctual.control.plane import ControlPlane
from punctual.dal.common import to_dynamo
from punctual.dal.tables import current_key, occurrence_key
from punctual.domain.ids import occurrence_id
from punctual.domain.occurrence import OccurrenceState
from punctual.domain.schedule import ScheduleState
from punctual.pipeline.materializer import STEP_LIMIT, Materializer
from punctual.services import Services
from punctual.timing import utc_text
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import CountedWrites, cron_spec, make
from tests.integration.materializer.helpers import (
    crowded_bucket,
    current,
    instants,
    occurrences,
    shard,
    tick,
)


def test_materializer_cancel_racing_a_step_leaves_no_stale_scheduled_occurrence(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a schedule about to be materialized
    sid = make(aws, spec=cron_spec("*/5 * * * *"))
    clock.now = current(aws, sid)["next_run_at"] - 120

    def cancel_first(point: str) -> None:
        if point == "before_commit" and not cancel_first.done:  # type: ignore[attr-defined]
            cancel_first.done = True  # type: ignore[attr-defined]
            ControlPlane(aws).cancel("alice", sid)

    cancel_first.done = False  # type: ignore[attr-defined]
    # WHEN a cancel lands between the materializer's read and its commit
    report = tick(aws, clock, sid, crash=cancel_first)
    # THEN the stale step is refused, and no occurrence of the old version is SCHEDULED
    assert report.conflicts == 1
    assert all(o["state"] != OccurrenceState.SCHEDULED for o in occurrences(aws, sid))
    assert current(aws, sid)["state"] == ScheduleState.CANCELED


def test_materializer_a_batch_refused_by_some_schedules_goes_on_with_the_others(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN four schedules due in one bucket of one shard, stepped in one transaction
    minute, [a, b, c, d, *_] = crowded_bucket(aws, cron_spec("*/5 * * * *"), 4)
    fire = current(aws, a)["next_run_at"]
    clock.now = fire - 120
    plane = ControlPlane(aws)

    def cancel_two(point: str) -> None:
        if point == "before_commit" and not cancel_two.done:  # type: ignore[attr-defined]
            cancel_two.done = True  # type: ignore[attr-defined]
            plane.cancel("alice", b)
            plane.cancel("alice", d)

    cancel_two.done = False  # type: ignore[attr-defined]
    # WHEN the second and the fourth are canceled between the walk's read and its commit
    report = tick(aws, clock, a, crash=cancel_two)
    # THEN exactly those two are conflicts; the others (before, between and after them in
    # the transaction) got their occurrence in the same tick, and the bucket is done
    assert report.conflicts == 2
    for stepped in (a, c):
        assert [f for f in instants(aws, stepped) if f >= fire] == [fire]  # (the API: before)
    for canceled in (b, d):
        assert all(o["state"] != OccurrenceState.SCHEDULED for o in occurrences(aws, canceled))
    assert report.watermark is not None
    assert report.watermark > minute


def test_materializer_drops_the_step_of_a_schedule_deleted_between_read_and_commit(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN three schedules due in one bucket of one shard, stepped in one transaction
    minute, [a, b, c, *_] = crowded_bucket(aws, cron_spec("*/5 * * * *"), 3)
    fire = current(aws, a)["next_run_at"]
    clock.now = fire - 120

    def delete_second(point: str) -> None:
        if point == "before_commit" and not delete_second.done:  # type: ignore[attr-defined]
            delete_second.done = True  # type: ignore[attr-defined]
            # (an operator's clean-up: the schedule's item is gone, not canceled)
            aws.dynamodb.delete_item(
                TableName=aws.settings.schedules_table, Key=to_dynamo(current_key(b))
            )

    delete_second.done = False  # type: ignore[attr-defined]
    # WHEN the second's item is deleted between the walk's read and its commit
    report = tick(aws, clock, a, crash=delete_second)
    # THEN its step is a conflict and is dropped (the re-read finds nothing to plan), without
    # failing the walk: the others got their occurrence and the bucket is done
    assert report.conflicts == 1
    for stepped in (a, c):
        assert [f for f in instants(aws, stepped) if f >= fire] == [fire]
    assert [f for f in instants(aws, b) if f >= fire] == []
    assert report.watermark is not None
    assert report.watermark > minute


def test_materializer_an_occurrence_already_made_is_left_and_the_step_goes_on(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN three minutely schedules due in one bucket of one shard, the second of which
    # already has its second fire's occurrence (a repair made it, and it ran)
    minute, [a, b, c, *_] = crowded_bucket(aws, cron_spec("* * * * *"), 3)
    fire = current(aws, a)["next_run_at"]
    clock.now = fire - 120
    made = occurrence_id(b, 1, fire + 60)
    aws.dynamodb.put_item(
        TableName=aws.settings.occurrences_table,
        Item={
            **to_dynamo(occurrence_key(made)),
            "occurrence_id": {"S": made},
            "state": {"S": "SUCCEEDED"},
        },
    )
    # WHEN the materializer steps the bucket (each step makes several fires)
    report = tick(aws, clock, a)
    # THEN the second's refused put is no conflict: its other fires are made, its cursor
    # moved on, the existing occurrence is untouched; the third's step was not dropped
    assert report.conflicts == 0
    steps = [f for f in instants(aws, a) if f >= fire]  # (the API made the ones before)
    assert steps[:2] == [fire, fire + 60]
    assert [f for f in instants(aws, c) if f >= fire] == steps
    assert current(aws, b)["next_run_at"] == current(aws, a)["next_run_at"] > fire
    states = {
        f: aws.dynamodb.get_item(
            TableName=aws.settings.occurrences_table,
            Key=to_dynamo(occurrence_key(occurrence_id(b, 1, f))),
        )["Item"]["state"]["S"]
        for f in steps
    }
    assert states == {f: "SUCCEEDED" if f == fire + 60 else "SCHEDULED" for f in steps}
    assert report.watermark is not None
    assert report.watermark > minute


def test_materializer_replans_a_refused_schedule_at_once_where_the_index_lags(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a minutely schedule the walk is about to step, on a due index that serves
    # every query 100 s behind (its creation is older: the walk sees it)
    sid = make(aws, spec=cron_spec("* * * * *"))
    fire = current(aws, sid)["next_run_at"]
    clock.now = fire - 120
    faults = Faults(FaultPlan(index_lag=1.0, index_lag_seconds=100), clock)
    lagging = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    # (an API whose clock is 170 s behind the ticker's: its cursor lands inside this walk)
    behind = ControlPlane(dataclasses.replace(lagging, now=lambda: clock.now - 170))

    def update_first(point: str) -> None:
        if point == "before_commit" and not update_first.done:  # type: ignore[attr-defined]
            update_first.done = True  # type: ignore[attr-defined]
            behind.update("alice", sid, if_match=1, changes={"payload": {"v": 2}})

    update_first.done = False  # type: ignore[attr-defined]
    # WHEN the schedule is updated between the walk's read and its commit
    report = Materializer(lagging, "m1", crash=update_first).run_shard(
        int(clock.now), shard(aws, sid)
    )
    # THEN the refused step is re-read and version 2 is planned at once, through the end of
    # the walk: the bucket its cursor moved to is read later in this walk from the lagging
    # index, which does not show it there yet (and the next walk starts past it)
    assert report.conflicts == 1
    cursor = current(aws, sid)
    assert (cursor["version"], cursor["next_run_at"]) == (2, fire + 120)
    v2 = [o["scheduled_for"] for o in occurrences(aws, sid) if o["schedule_version"] == 2]
    assert fire + 60 in v2


def test_materializer_continues_a_full_step_up_to_the_walks_very_last_second(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a minutely rate fired at second 59 of each minute, from an hour ahead, and a walk
    # whose window ends exactly on its 21st fire (the step limit is 20), over a due index
    # that serves every query 100 s behind (the schedule is older: the walk sees it)
    assert STEP_LIMIT == 20
    first = (int(clock.now) + 3600) // 60 * 60 + 59
    rate = {"kind": "rate", "expression": "rate(1 minute)", "start_at": utc_text(first)}
    sid = make(aws, spec=rate)
    clock.now = first - 59 - 60
    wide = aws.settings.model_copy(update={"lookahead_seconds": 21 * 60})
    faults = Faults(FaultPlan(index_lag=1.0, index_lag_seconds=100), clock)
    lagging = dataclasses.replace(aws, settings=wide, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    # WHEN one walk runs: the first step makes 20 fires and leaves its cursor on the 21st,
    # receivable at the walk's last second
    report = Materializer(lagging, "m1").run_shard(int(clock.now), shard(aws, sid))
    # THEN the step is continued in the same walk (the lagging index would not show the
    # schedule in the last bucket, and the next walk starts past it): all 21 are made and
    # the cursor is past the window
    assert report.watermark == first - 59 + 21 * 60
    assert instants(aws, sid) == [first + 60 * k for k in range(21)]
    assert current(aws, sid)["next_run_at"] == first + 21 * 60


def test_materializer_reports_every_completion_of_a_transaction(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN three one-shots at the same instant an hour ahead, in one bucket of one shard
    at = int(clock.now) + 3600
    spec = {"kind": "at", "at": utc_text(at)}
    _, ids = crowded_bucket(aws, spec, 3)
    # WHEN the materializer steps them (one transaction)
    clock.now = at - 60
    report = tick(aws, clock, ids[0])
    # THEN its report counts each completion and each occurrence
    assert (report.completed, report.occurrences) == (len(ids), len(ids))
    assert all(current(aws, sid)["state"] == ScheduleState.COMPLETED for sid in ids)


def test_materializer_update_after_step_cancels_the_old_versions_occurrence(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a materialized occurrence of version 1
    sid = make(aws, spec=cron_spec("*/5 * * * *"))
    clock.now = current(aws, sid)["next_run_at"] - 120
    tick(aws, clock, sid)
    # WHEN the schedule is updated before it fires
    saved = ControlPlane(aws).update("alice", sid, if_match=1, changes={"payload": {"v": 2}})
    # THEN the version-1 occurrence is CANCELED and version 2 has its own occurrences
    old = [o for o in occurrences(aws, sid) if o["schedule_version"] == 1]
    assert old
    assert all(o["state"] == OccurrenceState.CANCELED for o in old)
    assert {a.occurrence.state for a in saved.affected} == {OccurrenceState.CANCELED}


def test_materializer_reports_the_schedules_of_every_bucket_it_walked(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN one-shots in one shard due in two consecutive minutes an hour ahead (made
    # alternately in the two minutes until one shard has both)
    minute = int(clock.now) // 60 * 60 + 3600
    by_shard: dict[int, dict[int, list[str]]] = {}
    while not any(len(minutes) == 2 for minutes in by_shard.values()):
        at = minute + 60 * (sum(len(v) for m in by_shard.values() for v in m.values()) % 2)
        sid = make(aws, spec={"kind": "at", "at": utc_text(at)})
        by_shard.setdefault(shard(aws, sid), {}).setdefault(at, []).append(sid)
    both = next(minutes for minutes in by_shard.values() if len(minutes) == 2)
    ids = [sid for group in both.values() for sid in group]
    # WHEN one walk covers both minutes
    clock.now = minute - 60
    report = tick(aws, clock, ids[0])
    # THEN its report counts the schedules of both buckets, not only the last one's
    assert report.buckets >= 2
    assert report.schedules == report.completed == len(ids)


@pytest.mark.parametrize("limit", [5, 6, 7, 8])
def test_materializer_counts_the_fence_and_every_tenants_tally_within_the_action_limit(
    alice: Api, bob: Api, aws: Services, clock: Clock, limit: int
):
    # GIVEN one-shots of two tenants due in one minute of one shard an hour ahead (made for
    # each in turn until one shard has two of each): each completion gives its tenant's
    # quota back through a tally, one per tenant a transaction, besides the fence
    at = int(clock.now) // 60 * 60 + 3600
    by_shard: dict[int, dict[str, list[str]]] = {}
    while not any(min(len(v) for v in t.values()) >= 2 for t in by_shard.values() if len(t) == 2):
        tenant = ("alice", "bob")[sum(len(v) for t in by_shard.values() for v in t.values()) % 2]
        sid = make(aws, tenant, spec={"kind": "at", "at": utc_text(at)})
        by_shard.setdefault(shard(aws, sid), {}).setdefault(tenant, []).append(sid)
    number = next(n for n, t in by_shard.items() if len(t) == 2 and min(map(len, t.values())) >= 2)
    ids = [sid for group in by_shard[number].values() for sid in group]
    usage = ("schedule_count", "strict_fires_per_minute_peak")  # (all fire in one minute)
    before = {
        t: [api.get("/v1/tenant").body[u] for u in usage]
        for t, api in (("alice", alice), ("bob", bob))
    }
    # WHEN one walk completes them, DynamoDB's limit on a transaction's actions (100) here
    # ``limit``
    sizes = CountedWrites(aws.dynamodb)
    clock.now = at - 60
    report = Materializer(
        dataclasses.replace(aws, dynamodb=sizes), "m1", max_actions=limit
    ).run_shard(int(clock.now), number)
    # THEN no transaction holds more actions than the limit, and every one-shot fired once,
    # completed, and gave its tenant's slot and its minute's strict fire back
    assert sizes.sizes
    assert max(sizes.sizes) <= limit
    assert report.completed == len(ids)
    assert all(instants(aws, sid) == [at] for sid in ids)
    for tenant, api in (("alice", alice), ("bob", bob)):
        completed = len(by_shard[number][tenant])
        after = [api.get("/v1/tenant").body[u] for u in usage]
        assert after == [n - completed for n in before[tenant]]


def test_materializer_goes_on_from_a_cursor_written_before_planned_until_existed(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an hourly schedule (misfires SKIPped) whose first fire was made, and whose
    # CURRENT item then lost planned_until, as one written before the attribute existed
    sid = make(aws, spec=cron_spec("0 * * * *"), misfire={"action": "SKIP"})
    first = current(aws, sid)["next_run_at"]
    clock.now = first - 120
    tick(aws, clock, sid)
    assert current(aws, sid)["next_run_at"] == first + 3600
    aws.dynamodb.update_item(
        TableName=aws.settings.schedules_table,
        Key=to_dynamo(current_key(sid)),
        UpdateExpression="REMOVE planned_until",
    )
    # WHEN the next fire comes within the lookahead
    clock.now = first + 3600 - 120
    report = tick(aws, clock, sid)
    # THEN the legacy cursor means "every fire before next_run_at is handled": the next fire
    # is made, the first is neither made again nor judged missed, and the cursor moves on
    assert instants(aws, sid) == [first, first + 3600]
    assert (report.occurrences, report.missed, report.conflicts) == (1, 0, 0)
    after = current(aws, sid)
    assert after["next_run_at"] == first + 7200
    assert after["planned_until"] >= first + 3600


def test_materializer_fault_hook_drops_exactly_the_chosen_instant_and_moves_on(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN two minutely schedules, and the fault layer's hook set to drop one instant of
    # one of them (the silent loss the reconciler must find, in the simulations)
    a, b = (make(aws, spec=cron_spec("* * * * *")) for _ in range(2))
    first = current(aws, a)["next_run_at"]
    clock.now = first - 120
    lost = first + 60
    # WHEN each one's shard is walked with that hook
    for sid in (a, b):
        tick(aws, clock, sid, skip=lambda s, t: s == a and t == lost)
    # THEN only that instant of that schedule is missing, and both cursors moved past it
    made_a, made_b = instants(aws, a), instants(aws, b)
    assert lost not in made_a
    assert lost in made_b
    assert set(made_b) - set(made_a) == {lost}
    assert current(aws, a)["next_run_at"] == current(aws, b)["next_run_at"] > lost


def test_materializer_skips_an_occurrence_that_already_exists_instead_of_stalling(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a minutely schedule whose next fire was already written (e.g. by a repair)
    sid = make(aws, spec=cron_spec("* * * * *"))
    item = current(aws, sid)
    stored = aws.schedules.current(sid)
    assert stored is not None
    from punctual.domain.planning import new_occurrence

    ahead = new_occurrence(stored.schedule, item["next_run_at"], 86400)
    aws.dynamodb.put_item(**aws.occurrences.put_new_action(ahead, {})["Put"])
    # WHEN the materializer ticks once that fire is within its lookahead
    clock.now = item["next_run_at"] - 120
    report = tick(aws, clock, sid)
    # THEN the shard is not stalled: the cursor moved past it and no duplicate exists
    assert report.watermark is not None
    assert current(aws, sid)["next_run_at"] > item["next_run_at"]
    fires = instants(aws, sid)
    assert len(fires) == len(set(fires))
    assert item["next_run_at"] in fires
