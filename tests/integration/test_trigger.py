"""Run now (POST /v1/schedules/{id}/trigger, issue 22): one manual occurrence per
Idempotency-Key, receivable at once, delivered, counted against the tenant's quota, refused
for a paused or canceled schedule and for another tenant, judged by the reconciler by its
state (never UNEXPECTED)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.dal.common import from_dynamo, to_dynamo
from punctual.dal.tables import OCCURRENCES, TRIGGER_PREFIX, occurrence_key
from punctual.domain.findings import Finding
from punctual.domain.ids import occurrence_parts, shard_of
from punctual.domain.message import parse_message
from punctual.domain.occurrence import AttemptOutcome, OccurrenceState
from punctual.pipeline.reconciler import Reconciler
from punctual.pipeline.relay import Relay
from punctual.services import Services
from punctual_client.worker import Outcome
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.integration.conftest import Api, Clock, bootstrap
from tests.integration.helpers import assert_error, create, cron, current_item, table_items
from tests.integration.test_relay import messages, record
from tests.integration.worker.helpers import Calls, consumer, stored, worker

HOURLY = cron("0 * * * *")


def trigger(api: Api, schedule_id: str, key: str | None = "k1") -> Any:
    headers = {"Idempotency-Key": key} if key is not None else None
    return api.post(f"/v1/schedules/{schedule_id}/trigger", headers=headers)


def manual_ids(api: Api, schedule_id: str) -> list[str]:
    listed = api.get(f"/v1/schedules/{schedule_id}/occurrences").body["occurrences"]
    return [o["occurrence_id"] for o in listed if o["manual"]]


def test_trigger_makes_one_manual_occurrence_receivable_now_and_the_relay_sends_it(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an hourly schedule whose next fire is far off
    sid = create(alice, HOURLY | {"payload": {"job": "report"}})["schedule"]["schedule_id"]
    # WHEN its owner runs it now
    answer = trigger(alice, sid)
    # THEN one occurrence of the current version is due and receivable now, marked manual
    assert answer.status == 201, answer.body
    assert answer.body["replayed"] is False
    made = answer.body["occurrence"]
    assert made["manual"] is True
    assert made["state"] == "SCHEDULED"
    assert made["scheduled_for"] == made["available_at"]
    assert occurrence_parts(made["occurrence_id"]) == (sid, 1, int(clock.now))
    assert manual_ids(alice, sid) == [made["occurrence_id"]]
    assert alice.get(f"/v1/occurrences/{made['occurrence_id']}").body["manual"] is True
    # ... and the relay sends it at once, as a message a worker accepts
    report = Relay(aws).relay([record(aws, made["occurrence_id"], 1)])
    assert report.failures == {}
    [body] = messages(aws, "alice")
    message = parse_message(json.dumps(body))
    assert message.occurrence_id == made["occurrence_id"]
    assert message.payload == {"job": "report"}


def test_trigger_with_one_idempotency_key_runs_once_and_another_key_runs_again(
    alice: Api, aws: Services, clock: Clock
):
    sid = create(alice, HOURLY)["schedule"]["schedule_id"]
    first = trigger(alice, sid, "retry-me").body["occurrence"]
    # WHEN the same request comes again, seconds later (a client's retry)
    clock.advance(7)
    again = trigger(alice, sid, "retry-me")
    # THEN it answers with the same occurrence and makes nothing
    assert again.status == 201
    assert again.body == {"occurrence": first, "replayed": True}
    assert manual_ids(alice, sid) == [first["occurrence_id"]]
    # ... while another key, or none at all, runs the schedule again each time
    other = trigger(alice, sid, "another").body["occurrence"]["occurrence_id"]
    loose = [trigger(alice, sid, None).body["occurrence"]["occurrence_id"] for _ in range(2)]
    assert len({first["occurrence_id"], other, *loose}) == 4
    assert sorted(manual_ids(alice, sid)) == sorted({first["occurrence_id"], other, *loose})
    # ... and an empty key is a key like any other
    empty = [trigger(alice, sid, "").body for _ in range(2)]
    assert [e["replayed"] for e in empty] == [False, True]


def test_trigger_retried_a_moment_later_on_a_lagging_replica_answers_with_its_run(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a control plane whose eventually consistent reads lag a minute
    replica = FaultyDynamoDB(aws.dynamodb, Faults(FaultPlan(stale=1.0, stale_seconds=60), clock))
    plane = ControlPlane(dataclasses.replace(aws, dynamodb=replica))
    sid = create(alice, HOURLY)["schedule"]["schedule_id"]
    first = plane.trigger("alice", sid, "retry-me")
    # WHEN the same request comes again a second later (a client's retry after a timeout)
    clock.advance(1)
    again = plane.trigger("alice", sid, "retry-me")
    # THEN it finds its run record and the run itself (strongly consistent reads: a stale
    # one would find no record and be refused by the record's condition on every retry, or
    # find the record and call its run expired) and answers with the same occurrence
    assert again.replayed is True
    assert again.occurrence == first.occurrence
    assert manual_ids(alice, sid) == [first.occurrence.occurrence_id]
    # ... where an eventually consistent read of its run would have found nothing
    lagging = replica.get_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(first.occurrence.occurrence_id)),
    )
    assert "Item" not in lagging


@pytest.mark.parametrize("action", ["pause", "cancel"])
def test_trigger_refuses_a_schedule_not_active_and_writes_nothing(
    alice: Api, aws: Services, action: str
):
    sid = create(alice, HOURLY)["schedule"]["schedule_id"]
    if action == "pause":
        assert alice.post(f"/v1/schedules/{sid}/pause").status == 200
    else:
        assert alice.call("DELETE", f"/v1/schedules/{sid}").status == 200
    before = (
        table_items(aws, aws.settings.occurrences_table),
        table_items(aws, aws.settings.tenants_table),
    )
    error = assert_error(trigger(alice, sid), 409, "conflict")
    assert error["details"]["state"] == ("PAUSED" if action == "pause" else "CANCELED")
    after = (
        table_items(aws, aws.settings.occurrences_table),
        table_items(aws, aws.settings.tenants_table),
    )
    assert after == before


def test_trigger_counts_against_max_manual_runs_per_minute(aws: Services, clock: Clock):
    carol = bootstrap("carol", "arn:aws:iam::111111111111:role/carol", max_manual_runs_per_minute=2)
    sid = create(carol, HOURLY)["schedule"]["schedule_id"]
    clock.now = clock.now - clock.now % 60 + 5
    assert [trigger(carol, sid, f"k{n}").status for n in range(2)] == [201, 201]
    # WHEN a third run comes in the same minute
    third = trigger(carol, sid, "k2")
    error = assert_error(third, 429, "quota_exceeded")
    # THEN it is refused with the quota named, made nothing, and says when to come back: the
    # next minute, when the count starts again (55 s on)
    assert error["details"] == {
        "quota": "max_manual_runs_per_minute",
        "limit": 2,
        "usage": 2,
        "retry_after_seconds": 55,
    }
    assert third.headers["Retry-After"] == "55"
    assert len(manual_ids(carol, sid)) == 2
    # ... a replay of a run already made is no new run, and the next minute counts anew
    assert trigger(carol, sid, "k0").body["replayed"] is True
    # ... in the minute's last second, it says one (the soonest a client may come back)
    clock.now = clock.now - clock.now % 60 + 59
    assert trigger(carol, sid, "k2").headers["Retry-After"] == "1"
    clock.advance(1)
    assert trigger(carol, sid, "k2").status == 201
    assert len(manual_ids(carol, sid)) == 3


@pytest.mark.parametrize("made_before", [0, 1], ids=["opening_the_minute", "counting_on"])
def test_trigger_racing_another_run_of_the_minute_is_held_to_the_quota(
    aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch, made_before: int
):
    # GIVEN a tenant allowed one run now per minute more than it made, and two requests
    # (two keys) of which the other commits between this one's read of the tenant and its
    # commit: it opens the minute's count, or counts on in it
    limit = made_before + 1
    carol = bootstrap(
        "carol", "arn:aws:iam::111111111111:role/carol", max_manual_runs_per_minute=limit
    )
    sid = create(carol, HOURLY)["schedule"]["schedule_id"]
    clock.now = clock.now - clock.now % 60 + 5
    made = [
        trigger(carol, sid, f"before{n}").body["occurrence"]["occurrence_id"]
        for n in range(made_before)
    ]
    real_get = aws.tenants.get
    raced: list[Any] = []

    def get_then_the_other_commits(tenant_id: str) -> Any:
        found = real_get(tenant_id)
        if not raced:
            raced.append(None)
            raced[0] = ControlPlane(aws).trigger("carol", sid, "other").occurrence
        return found

    monkeypatch.setattr(type(aws.tenants), "get", lambda self, t: get_then_the_other_commits(t))
    # WHEN this one commits on the count it read (one short of the limit)
    answer = trigger(carol, sid, "mine")
    # THEN the count's condition refuses it, and the re-read says why: 429, no extra run
    error = assert_error(answer, 429, "quota_exceeded")
    assert error["details"]["usage"] == limit
    assert sorted(manual_ids(carol, sid)) == sorted([*made, raced[0].occurrence_id])


def test_trigger_on_a_host_behind_counts_in_the_minute_a_host_ahead_opened(
    aws: Services, clock: Clock
):
    # GIVEN a tenant allowed two runs now per minute, one of which a host whose clock is a
    # few seconds ahead already counted in the next minute
    carol = bootstrap("carol", "arn:aws:iam::111111111111:role/carol", max_manual_runs_per_minute=2)
    sid = create(carol, HOURLY)["schedule"]["schedule_id"]
    clock.now = clock.now - clock.now % 60 + 58
    clock.advance(3)
    trigger(carol, sid, "ahead")
    clock.advance(-3)
    # WHEN this host, still in the earlier minute, runs it now twice
    second = trigger(carol, sid, "behind")
    third = trigger(carol, sid, "over")
    # THEN its run counts in the later minute (it is not refused on every retry for
    # re-opening an earlier one), and the next one is over the quota
    assert second.status == 201, second.body
    assert assert_error(third, 429, "quota_exceeded")["details"]["usage"] == 2
    tenant = aws.tenants.get("carol")
    assert (tenant.manual_minute, tenant.manual_runs) == (clock.now - clock.now % 60 + 60, 2)


def test_a_run_now_record_expires_with_its_run(alice: Api, aws: Services):
    # GIVEN a run now with an Idempotency-Key
    sid = create(alice, HOURLY)["schedule"]["schedule_id"]
    made = trigger(alice, sid, "k").body["occurrence"]["occurrence_id"]
    # THEN its record carries the occurrences table's TTL attribute, at its run's expiry:
    # TTL deletes the two together and the key is free again, not held forever
    items = [from_dynamo(i) for i in table_items(aws, aws.settings.occurrences_table)]
    (record_item,) = [i for i in items if i["sk"].startswith(TRIGGER_PREFIX)]
    (run,) = [i for i in items if i["occurrence_id"] == made and i is not record_item]
    assert OCCURRENCES.ttl_attribute == "expires_at"
    assert record_item["occurrence_id"] == made
    assert record_item["expires_at"] == run["expires_at"] > 0


def test_trigger_with_the_key_of_an_expired_run_is_a_conflict_not_a_second_run(
    alice: Api, aws: Services
):
    # GIVEN a run now whose occurrence TTL deleted before its run-now record
    sid = create(alice, HOURLY)["schedule"]["schedule_id"]
    made = trigger(alice, sid, "old").body["occurrence"]["occurrence_id"]
    aws.dynamodb.delete_item(
        TableName=aws.settings.occurrences_table, Key=to_dynamo(occurrence_key(made))
    )
    # WHEN the key is used again
    answer = trigger(alice, sid, "old")
    # THEN 409 naming the expired run, nothing made; a new key runs
    assert made in assert_error(answer, 409, "conflict")["message"]
    assert manual_ids(alice, sid) == []
    assert trigger(alice, sid, "new").status == 201


def test_trigger_of_another_tenants_schedule_is_not_found_even_with_its_key(
    alice: Api, bob: Api, aws: Services
):
    # GIVEN alice ran her schedule now with a key bob has learnt
    sid = create(alice, HOURLY)["schedule"]["schedule_id"]
    made = trigger(alice, sid, "known").body["occurrence"]
    before = table_items(aws, aws.settings.occurrences_table)
    # WHEN bob triggers her schedule, with her key and without
    for key in ("known", "fresh"):
        answer = trigger(bob, sid, key)
        # THEN he gets the answer of a missing schedule, not her occurrence, and nothing runs
        assert_error(answer, 404, "not_found")
        assert made["occurrence_id"] not in str(answer.body)
    assert table_items(aws, aws.settings.occurrences_table) == before


def test_trigger_racing_the_same_key_makes_one_occurrence(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN two requests with one key: the other commits while this one is between its
    # reads and its commit, on a host whose clock is a second ahead (so its occurrence id,
    # which holds the instant, differs: only the trigger record can tell the two apart)
    sid = create(alice, HOURLY)["schedule"]["schedule_id"]
    real_get = aws.tenants.get
    raced: list[Any] = []

    def get_and_let_the_other_commit(tenant_id: str) -> Any:
        if not raced:
            raced.append(None)  # (the other request's own read must not race again)
            clock.advance(1)
            # (another Lambda instance: the control plane itself, not this one's handler)
            raced[0] = ControlPlane(aws).trigger("alice", sid, "same").occurrence
            clock.advance(-1)
        return real_get(tenant_id)

    monkeypatch.setattr(type(aws.tenants), "get", lambda self, t: get_and_let_the_other_commit(t))
    # WHEN the first request commits after the other one did
    late = trigger(alice, sid, "same")
    # THEN the trigger record's condition refuses the second run: both answer one occurrence
    assert late.status == 201
    assert late.body["replayed"] is True
    assert late.body["occurrence"]["occurrence_id"] == raced[0].occurrence_id
    assert len(manual_ids(alice, sid)) == 1


def test_trigger_racing_a_pause_is_refused(
    alice: Api, aws: Services, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a trigger whose schedule is paused between its read and its commit
    sid = create(alice, HOURLY)["schedule"]["schedule_id"]
    real_get = aws.tenants.get
    paused: list[int] = []

    def get_while_paused(tenant_id: str) -> Any:
        if not paused:
            paused.append(0)
            paused[0] = ControlPlane(aws).pause("alice", sid).schedule.version
        return real_get(tenant_id)

    monkeypatch.setattr(type(aws.tenants), "get", lambda self, t: get_while_paused(t))
    # WHEN it commits
    answer = trigger(alice, sid)
    # THEN the version check refuses it, the re-read sees PAUSED: 409, no run
    assert paused == [2]
    assert_error(answer, 409, "conflict")
    assert manual_ids(alice, sid) == []


def test_reconciler_judges_a_manual_occurrence_by_its_state_never_unexpected(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a manual run in an hour with no fire of the schedule, left unclaimed
    sid = create(alice, cron("0 0 1 1 *"))["schedule"]["schedule_id"]
    made = trigger(alice, sid).body["occurrence"]["occurrence_id"]
    hour = int(clock.now) - int(clock.now) % 3600
    clock.now = hour + 2 * 3600 + 60
    # WHEN the reconciler checks that hour
    [result] = Reconciler(aws).run([shard_of(sid, aws.settings.shard_count)], hour, hour + 3600)
    # THEN the run is no stray: it counts as in flight, and is sent again as no worker took it
    report = result.report
    assert report.counts.get(Finding.UNEXPECTED, 0) == 0
    assert report.counts[Finding.IN_FLIGHT] == 1
    assert report.examples[Finding.IN_FLIGHT] == [made]
    assert report.redriven == 1


def test_a_run_now_in_an_hour_a_long_standing_schedule_owns_nothing_of_is_still_reconciled(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a yearly schedule made hours ago (the reconciler does not read its occurrences in
    # an hour it owns no fire of), run now at 14:06:40, left unclaimed
    sid = create(alice, cron("0 0 1 1 *"))["schedule"]["schedule_id"]
    clock.advance(3 * 3600)
    made = trigger(alice, sid).body["occurrence"]
    hour = int(clock.now) - int(clock.now) % 3600
    # THEN the run marks the schedule with its instant
    assert current_item(aws, sid)["manual_through"] == int(clock.now)
    # WHEN the hourly run checks that hour, an hour after it ended
    clock.now = hour + 2 * 3600 + 60
    [result] = Reconciler(aws).run([shard_of(sid, aws.settings.shard_count)], hour, hour + 3600)
    # THEN the mark had it read: the run is in flight, and sent again as no worker took it
    assert result.report.counts[Finding.IN_FLIGHT] == 1
    assert result.report.examples[Finding.IN_FLIGHT] == [made["occurrence_id"]]
    assert result.report.redriven == 1


def test_a_run_now_never_lowers_the_mark_a_concurrent_one_on_a_host_ahead_raised(
    aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN two runs now of one schedule in one minute, the other on a host 30 s ahead
    # committing between this one's reads and its commit (both count in the same minute)
    carol = bootstrap("carol", "arn:aws:iam::111111111111:role/carol", max_manual_runs_per_minute=9)
    sid = create(carol, HOURLY)["schedule"]["schedule_id"]
    clock.now = clock.now - clock.now % 60 + 5
    trigger(carol, sid, "first")
    real_get = aws.tenants.get
    raced: list[int] = []

    def get_then_the_host_ahead_commits(tenant_id: str) -> Any:
        found = real_get(tenant_id)
        if not raced:
            raced.append(0)
            clock.advance(30)
            raced[0] = ControlPlane(aws).trigger("carol", sid, "ahead").occurrence.scheduled_for
            clock.advance(-30)
        return found

    monkeypatch.setattr(
        type(aws.tenants), "get", lambda self, t: get_then_the_host_ahead_commits(t)
    )
    # WHEN this one commits
    answer = trigger(carol, sid, "mine")
    # THEN it runs, and the mark stays at the later instant (lowered, the reconciler could
    # leave the later run's hour unread)
    assert answer.status == 201, answer.body
    assert occurrence_parts(answer.body["occurrence"]["occurrence_id"])[2] == raced[0] - 30
    assert current_item(aws, sid)["manual_through"] == raced[0]


def test_a_worker_runs_a_manual_occurrence_and_records_its_attempt(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a run now, relayed into alice's queue
    sid = create(alice, HOURLY | {"payload": {"job": "now"}})["schedule"]["schedule_id"]
    made = trigger(alice, sid).body["occurrence"]["occurrence_id"]
    Relay(aws).relay([record(aws, made, 1)])
    handler = Calls()
    # WHEN a worker polls
    [result] = consumer(worker(aws, handler)).poll_once()
    # THEN it ran once like any occurrence: SUCCEEDED, with its one attempt under its own key
    assert result.outcome is Outcome.SUCCEEDED
    [job] = handler.jobs
    assert (job.occurrence_id, job.payload) == (made, {"job": "now"})
    occurrence, attempts = stored(aws, made)
    assert occurrence.state is OccurrenceState.SUCCEEDED
    assert [(a.attempt_no, a.outcome) for a in attempts] == [(1, AttemptOutcome.SUCCEEDED)]
