"""Stale, paused and canceled schedules in the worker SDK, on moto with the injected clock. An
occurrence whose schedule was updated, paused or canceled is refused before its handler runs,
and a claim that meets such a change is undone. Reads of the schedule that are throttled or
fail around a claim spend nothing, the worker reads the occurrence and the schedule strongly
consistent, and a rename or a completed one-shot is not taken for a cancel. The cooperative
cancel, which a running handler sees once the worker's cache of the schedule expires, is
covered here too."""

from __future__ import annotations

import contextlib
import dataclasses
import random
from datetime import datetime
from typing import Any

import pytest
from botocore.exceptions import ClientError

from punctual.control.plane import ControlPlane, Saved
from punctual.dal.common import from_dynamo, to_dynamo
from punctual.dal.tables import current_key, occurrence_key
from punctual.domain.errors import Retryable
from punctual.domain.ids import shard_of
from punctual.domain.occurrence import AttemptOutcome, Occurrence
from punctual.domain.schedule import ScheduleDefinition, ScheduleState
from punctual.pipeline.materializer import Materializer
from punctual.services import Services
from punctual_client.worker import Job, Outcome, Worker
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import patch
from tests.integration.worker.helpers import (
    Calls,
    S,
    abandoned,
    concurrency_slots,
    consumer,
    dead_letters,
    depth,
    due,
    fail_transiently,
    outcomes,
    rate_schedule,
    receive,
    redeliver,
    relay,
    state,
    stored,
    worker,
)

# --- stale, paused and canceled schedules ----------------------------------------------------


@pytest.mark.parametrize("change", ["update", "pause", "cancel"])
def test_worker_stale_or_canceled_occurrence_is_refused_before_the_handler_runs(
    alice: Api, aws: Services, clock: Clock, change: str
):
    # GIVEN an occurrence of version 1 already in the queue
    sid, [occ] = rate_schedule(aws, "rate(10 minutes)")
    relay(aws, occ)
    # WHEN the schedule is updated (PATCH with If-Match), paused or canceled
    if change == "update":
        answer = patch(alice, sid, {"payload": {"v": 2}}, version=1)
        assert answer.status == 200, answer.body
    elif change == "pause":
        ControlPlane(aws).pause("alice", sid)
    else:
        ControlPlane(aws).cancel("alice", sid)
    # (the change canceled the occurrence; its message is still in the queue)
    assert state(aws, occ) is S.CANCELED
    assert depth(aws) == 1
    handler = Calls()
    [result] = consumer(worker(aws, handler)).poll_once()
    # THEN the worker refuses it (STALE) before the handler: CANCELED with the reason, no
    # attempt, message deleted, nothing in the DLQ
    assert result.outcome is Outcome.STALE
    assert handler.count == 0
    occurrence, attempts = stored(aws, occ)
    assert (occurrence.state, occurrence.attempt_count, attempts) == (S.CANCELED, 0, [])
    assert occurrence.reason
    assert result.detail == f"canceled: {occurrence.reason}"
    assert depth(aws) == 0
    assert dead_letters(aws) == []


@pytest.mark.parametrize(
    "window",
    ["its commit and its settling", "a retry's read and claim", "a commit the API died after"],
)
def test_worker_claim_that_meets_a_change_of_the_schedule_is_undone_before_the_handler(
    alice: Api, aws: Services, clock: Clock, window: str
):
    # GIVEN an occurrence of version 1 whose message a worker has read, and an update of the
    # schedule that commits after that read, its settling of version 1's occurrences:
    # - after the claim (which checks no version), so the update's answer reports it running
    # - before the claim, where it only reports a retry waiting (RETRY_WAIT is not canceled)
    # - never (the API died after its commit)
    sid, [occ, *_] = rate_schedule(aws, "rate(10 minutes)")
    relay(aws, occ)
    [delivery] = receive(aws)
    before = 0
    if window == "a retry's read and claim":
        assert worker(aws, Calls(fail_transiently)).process(delivery).outcome is Outcome.RETRY
        clock.advance(3600)
        delivery, before = redeliver(aws, delivery), 1
    saved: list[Saved] = []
    handler = Calls()
    work = worker(aws, handler)
    real_claim = work.runs.claim

    def claim_as_an_update_commits(lease: Any, **kwargs: Any) -> None:
        plane = ControlPlane(aws)
        listing = plane.occurrences.open_for_schedule

        def settle(*args: Any, **kw: Any) -> list[Occurrence]:
            if window == "a commit the API died after":
                raise RuntimeError("the API's Lambda died after the commit")
            if window == "its commit and its settling":
                real_claim(lease, **kwargs)
            return listing(*args, **kw)

        plane.occurrences.open_for_schedule = settle  # type: ignore[method-assign]
        with contextlib.suppress(RuntimeError):  # the API's death after the commit
            saved.append(plane.update("alice", sid, if_match=1, changes={"payload": {"v": 2}}))
        if window != "its commit and its settling":
            real_claim(lease, **kwargs)

    work.runs.claim = claim_as_an_update_commits  # type: ignore[method-assign]
    # WHEN the worker processes the message
    result = work.process(delivery)
    # THEN its check after the claim (strongly consistent) finds version 2 and undoes the
    # claim: the handler never ran, CANCELED with the reason, the attempts as they were
    # before the claim, the slot free, the message dropped
    assert result.outcome is Outcome.STALE
    assert result.detail == "stale: the schedule runs as version 2, this occurrence is of version 1"
    assert handler.count == 0
    occurrence, attempts = stored(aws, occ)
    assert (occurrence.state, occurrence.reason) == (S.CANCELED, result.detail)
    raw = aws.dynamodb.get_item(
        TableName=aws.settings.occurrences_table, Key=to_dynamo(occurrence_key(occ))
    )["Item"]
    assert from_dynamo(raw)["finished_at"] == int(clock.now)
    assert occurrence.attempt_count == len(attempts) == before
    assert [a.outcome for a in attempts] == [AttemptOutcome.RETRY] * before
    assert all("lease_token" not in slot for slot in concurrency_slots(aws))
    assert result.delete
    # AND the update's answer said what it found, and is now true: running (it stops before
    # its handler), or a retry the worker refuses
    notes = [a.note for answer in saved for a in answer.affected]
    assert (
        notes
        == {
            "its commit and its settling": ["running: it can only stop cooperatively"],
            "a retry's read and claim": ["in the queue for a retry: the worker will refuse it"],
            "a commit the API died after": [],
        }[window]
    )


def throttled_schedule_reads(aws: Services, monkeypatch: pytest.MonkeyPatch, *, consistent: bool):
    """DynamoDB refuses (throttles) every read of a schedule item of that consistency."""
    real = aws.dynamodb.get_item

    def get_item(**request: Any) -> Any:
        if request["TableName"] == aws.settings.schedules_table and (
            request.get("ConsistentRead", False) is consistent
        ):
            raise ClientError(
                {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "busy"}},
                "GetItem",
            )
        return real(**request)

    monkeypatch.setattr(aws.dynamodb, "get_item", get_item)
    return real


def test_worker_claim_whose_schedule_cannot_be_read_after_it_is_undone_without_spending_it(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a one-attempt occurrence whose message a worker claims, and DynamoDB throttling
    # the strongly consistent read of the schedule that must follow the claim
    [occ] = due(aws, clock, retry={"max_attempts": 1})
    [delivery] = receive(aws)
    real = throttled_schedule_reads(aws, monkeypatch, consistent=True)
    handler = Calls()
    # WHEN the worker processes it
    result = worker(aws, handler).process(delivery)
    # THEN the handler does not run on a guess: the claim is undone (SCHEDULED, no attempt
    # spent, the slots free) and the message comes back soon, not after the lease
    assert result.outcome is Outcome.IN_PROGRESS
    assert result.visible_in is not None
    assert result.visible_in < 60
    assert not result.delete
    assert handler.count == 0
    occurrence, attempts = stored(aws, occ)
    assert (occurrence.state, occurrence.attempt_count, attempts) == (S.SCHEDULED, 0, [])
    assert all("lease_token" not in slot for slot in concurrency_slots(aws))
    # WHEN the reads succeed again and the message comes back
    monkeypatch.setattr(aws.dynamodb, "get_item", real)
    clock.advance(result.visible_in)
    again = worker(aws, handler).process(redeliver(aws, delivery))
    # THEN its one attempt runs it
    assert again.outcome is Outcome.SUCCEEDED
    assert handler.count == 1
    occurrence, attempts = stored(aws, occ)
    assert occurrence.state is S.SUCCEEDED
    assert [a.outcome for a in attempts] == [AttemptOutcome.SUCCEEDED]


def test_worker_retry_whose_schedule_cannot_be_read_after_its_claim_keeps_its_history(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a two-attempt occurrence whose first attempt failed transiently (RETRY_WAIT)
    [occ] = due(aws, clock, retry={"max_attempts": 2})
    [delivery] = receive(aws)
    assert worker(aws, Calls(fail_transiently)).process(delivery).outcome is Outcome.RETRY
    clock.advance(3600)
    delivery = redeliver(aws, delivery)
    real = throttled_schedule_reads(aws, monkeypatch, consistent=True)
    # WHEN its retry's claim cannot read the schedule after it
    result = worker(aws, Calls()).process(delivery)
    # THEN the claim is undone back to RETRY_WAIT with its first attempt's record only
    assert result.outcome is Outcome.IN_PROGRESS
    occurrence, attempts = stored(aws, occ)
    assert (occurrence.state, occurrence.attempt_count) == (S.RETRY_WAIT, 1)
    assert [a.outcome for a in attempts] == [AttemptOutcome.RETRY]
    # AND its second attempt still runs it
    monkeypatch.setattr(aws.dynamodb, "get_item", real)
    handler = Calls()
    clock.advance(3600)
    assert worker(aws, handler).process(redeliver(aws, delivery)).outcome is Outcome.SUCCEEDED
    assert handler.count == 1
    assert outcomes(aws, occ) == [AttemptOutcome.RETRY, AttemptOutcome.SUCCEEDED]


def test_worker_takeover_whose_schedule_cannot_be_read_after_it_keeps_the_lease(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN an occurrence whose worker died mid-run, delivered again after its lease
    occ, delivery = abandoned(aws, clock)
    clock.advance(61)
    delivery = redeliver(aws, delivery)
    real = throttled_schedule_reads(aws, monkeypatch, consistent=True)
    handler = Calls()
    # WHEN the takeover's read of the schedule after its claim is throttled
    result = worker(aws, handler).process(delivery)
    # THEN the expired lease cannot be put back: the new one is kept until it runs out,
    # and the handler did not run
    assert (result.outcome, result.visible_in) == (Outcome.IN_PROGRESS, 60)
    assert handler.count == 0
    assert stored(aws, occ)[0].state is S.RUNNING
    # WHEN it comes back after that lease, with the reads working again
    monkeypatch.setattr(aws.dynamodb, "get_item", real)
    clock.advance(61)
    again = worker(aws, handler).process(redeliver(aws, delivery))
    # THEN it runs once: the dead worker's attempt and the takeover that never ran are LOST
    assert again.outcome is Outcome.SUCCEEDED
    assert handler.count == 1
    outcomes = [a.outcome for a in stored(aws, occ)[1]]
    assert outcomes == [AttemptOutcome.LOST, AttemptOutcome.LOST, AttemptOutcome.SUCCEEDED]


def delivered(aws: Services) -> tuple[str, str, Any]:
    """A rate schedule's first occurrence, relayed and received: (schedule, occurrence, its
    delivery)."""
    sid, [occ, *_] = rate_schedule(aws, "rate(10 minutes)")
    relay(aws, occ)
    [delivery] = receive(aws)
    return sid, occ, delivery


def update_whose_api_dies(services: Services, sid: str) -> None:
    """Version 2 of the schedule committed; its API dies before settling version 1's
    occurrences (they stay as they were)."""
    plane = ControlPlane(services)

    def died(*args: Any, **kw: Any) -> list[Occurrence]:
        raise RuntimeError("the API's Lambda died after the commit")

    plane.occurrences.open_for_schedule = died  # type: ignore[method-assign]
    with contextlib.suppress(RuntimeError):
        plane.update("alice", sid, if_match=1, changes={"payload": {"v": 2}})


def test_worker_stale_claim_that_cannot_be_withdrawn_is_refused_after_its_lease(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence of version 1, and an update of its schedule that commits between
    # the worker's read and its claim (its API died before settling version 1's occurrences)
    sid, occ, delivery = delivered(aws)
    handler = Calls()
    work = worker(aws, handler)
    real_claim, real_withdraw = work.runs.claim, work.runs.withdraw

    def claim_after_an_update(lease: Any, **kwargs: Any) -> None:
        update_whose_api_dies(aws, sid)
        real_claim(lease, **kwargs)

    def withdraw_throttled(*args: Any, **kwargs: Any) -> None:
        raise Retryable("DynamoDB is busy")

    work.runs.claim = claim_after_an_update  # type: ignore[method-assign]
    work.runs.withdraw = withdraw_throttled  # type: ignore[method-assign]
    # WHEN the worker finds the change after its claim but cannot undo the claim
    result = work.process(delivery)
    # THEN the handler does not run; the message comes back when the lease runs out
    assert (result.outcome, result.visible_in) == (Outcome.IN_PROGRESS, 60)
    assert handler.count == 0
    # WHEN it comes back after the lease, to a worker that can write again
    work.runs.claim, work.runs.withdraw = real_claim, real_withdraw  # type: ignore[method-assign]
    clock.advance(61)
    again = work.process(redeliver(aws, delivery))
    # THEN the stale run is refused (version 2 now), never run, and the message dropped
    assert again.outcome is Outcome.STALE
    assert handler.count == 0
    assert stored(aws, occ)[0].state is S.CANCELED
    assert again.delete


def test_worker_reads_its_occurrence_and_schedule_strongly_consistent_before_a_claim(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a DynamoDB that serves every eventually consistent read a minute stale, and an
    # occurrence of version 1 whose schedule was updated through it a moment before the
    # worker reads (the update's API died before settling version 1's occurrences)
    faults = Faults(FaultPlan(stale=1.0, stale_seconds=60), clock)
    stale = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    sid, _, delivery = delivered(aws)
    update_whose_api_dies(stale, sid)
    claims: list[str] = []  # a claim's transaction takes a concurrency slot (tenants table)

    def transaction(params: dict[str, Any], **_: Any) -> None:
        for action in params["TransactItems"]:
            for body in action.values():
                if body["TableName"] == aws.settings.tenants_table:
                    claims.append(str(body["Key"]))

    aws.dynamodb.meta.events.register(
        "before-parameter-build.dynamodb.TransactWriteItems", transaction
    )
    handler = Calls()
    # WHEN a worker on that DynamoDB processes the message
    result = Worker(stale, "alice", handler, rng=random.Random(7)).process(delivery)
    # THEN its read saw version 2: refused before any claim (a stale read would have
    # claimed, then found the change and undone the claim), never run
    assert result.outcome is Outcome.STALE
    assert claims == []
    assert handler.count == 0


def test_worker_check_after_its_claim_sees_a_change_committed_a_moment_before_it(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a DynamoDB that serves every eventually consistent read a minute stale, an
    # occurrence of version 1 whose message a worker on it has read, and an update of the
    # schedule committed through it between that read and the claim (its API died before
    # settling version 1's occurrences, so only the worker's check can refuse the run)
    faults = Faults(FaultPlan(stale=1.0, stale_seconds=60), clock)
    stale = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    sid, occ, delivery = delivered(aws)
    handler = Calls()
    work = worker(stale, handler)
    real_claim = work.runs.claim

    def claim_a_moment_after_an_update(lease: Any, **kwargs: Any) -> None:
        update_whose_api_dies(stale, sid)
        clock.advance(1)
        real_claim(lease, **kwargs)

    work.runs.claim = claim_a_moment_after_an_update  # type: ignore[method-assign]
    # WHEN the worker processes the message
    result = work.process(delivery)
    # THEN its check after the claim saw version 2 (a stale read would show version 1 and
    # run a superseded occurrence): the claim undone, the handler never ran
    assert result.outcome is Outcome.STALE
    assert handler.count == 0
    assert stored(aws, occ)[0].state is S.CANCELED


def test_worker_claim_whose_schedule_is_gone_by_the_check_after_it_is_withdrawn(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence whose schedule's record is deleted between the worker's claim and
    # its check after the claim (a purge of the item, as its retention ends)
    sid, occ, delivery = delivered(aws)
    handler = Calls()
    work = worker(aws, handler)
    real_claim = work.runs.claim

    def claim_then_the_schedule_goes(lease: Any, **kwargs: Any) -> None:
        real_claim(lease, **kwargs)
        aws.dynamodb.delete_item(
            TableName=aws.settings.schedules_table, Key=to_dynamo(current_key(sid))
        )

    work.runs.claim = claim_then_the_schedule_goes  # type: ignore[method-assign]
    # WHEN the worker processes the message
    result = work.process(delivery)
    # THEN the claim is undone and the run refused as stale: never run, the message dropped
    assert (result.outcome, result.detail) == (Outcome.STALE, "the schedule no longer exists")
    assert handler.count == 0
    assert stored(aws, occ)[0].state is S.CANCELED
    assert result.delete


def test_worker_runs_an_occurrence_made_before_a_rename_and_the_rename_is_no_cancel(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence of version 1 in the queue, and its schedule renamed (version 2,
    # running as version 1); then renamed again while its handler runs
    sid, [occ] = rate_schedule(aws, "rate(10 minutes)")
    relay(aws, occ)
    answer = patch(alice, sid, {"name": "renamed"}, version=1)
    assert answer.status == 200, answer.body
    checks: list[bool] = []

    def cooperative(job: Job) -> None:
        again = patch(alice, sid, {"name": "again"}, version=2)
        assert again.status == 200, again.body
        clock.advance(60)  # (past the cancel check's cache)
        checks.append(job.canceled())

    [result] = consumer(worker(aws, cooperative)).poll_once()
    # THEN the worker runs it (not stale), the cooperative check says "not canceled", and it
    # SUCCEEDED
    assert result.outcome is Outcome.SUCCEEDED, result
    assert checks == [False]
    assert stored(aws, occ)[0].state is S.SUCCEEDED


def test_worker_cooperative_cancel_check_that_is_throttled_is_not_a_cancel(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a running handler that checks job.canceled(), and the (eventually consistent)
    # read of its schedule throttled
    [occ] = due(aws, clock)
    checks: list[bool] = []

    def cooperative(job: Job) -> None:
        throttled_schedule_reads(aws, monkeypatch, consistent=False)
        checks.append(job.canceled())

    [result] = consumer(worker(aws, cooperative)).poll_once()
    # THEN the check says "not canceled" (not known), and the run goes on to succeed
    assert checks == [False]
    assert result.outcome is Outcome.SUCCEEDED
    assert stored(aws, occ)[0].state is S.SUCCEEDED


def test_worker_last_occurrence_of_a_completed_one_shot_still_runs(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot an hour ahead, which the materializer plans and marks COMPLETED
    at = int(clock.now) + 3600
    definition = ScheduleDefinition.model_validate(
        {
            "target": "default",
            "spec": {"kind": "at", "at": datetime.fromtimestamp(at).astimezone().isoformat()},
        }
    )
    sid = ControlPlane(aws).create("alice", definition).schedule.schedule_id
    clock.now = at - 60
    Materializer(aws, "m1").run_shard(int(clock.now), shard_of(sid, aws.settings.shard_count))
    assert ControlPlane(aws).get("alice", sid).state is ScheduleState.COMPLETED
    [occ] = [o.occurrence_id for o in aws.occurrences.open_for_schedule(sid, since=0)]
    clock.now = at
    relay(aws, occ)
    handler = Calls()
    # WHEN its message is delivered
    [result] = consumer(worker(aws, handler)).poll_once()
    # THEN it is not refused as stale: a completed schedule keeps its version
    assert result.outcome is Outcome.SUCCEEDED
    assert handler.count == 1


# --- cooperative cancel ------------------------------------------------------------------------


@pytest.mark.parametrize("change", ["cancel", "pause", "update"])
def test_worker_cooperative_cancel_is_seen_once_the_cache_expires(
    alice: Api, aws: Services, clock: Clock, change: str
):
    # GIVEN a running handler that checks job.canceled() (cached for 5 s)
    sid, [occ] = rate_schedule(aws, "rate(10 minutes)")
    relay(aws, occ)
    checks: list[bool] = []
    plane = ControlPlane(aws)

    def cooperative(job: Job) -> None:
        checks.append(job.canceled())
        # WHEN the schedule is canceled, paused or updated while it runs (each makes this
        # occurrence one the schedule no longer wants)
        if change == "cancel":
            plane.cancel("alice", sid)
        elif change == "pause":
            plane.pause("alice", sid)
        else:
            plane.update("alice", sid, if_match=1, changes={"payload": {"v": 2}})
        checks.append(job.canceled())  # within the cache: the old answer
        clock.advance(5)
        checks.append(job.canceled())
        checks.append(job.canceled())  # stays canceled

    [result] = consumer(worker(aws, cooperative)).poll_once()
    # THEN the handler sees it once the cache (5 s unless the worker says otherwise) has
    # expired, and stopped on its own
    assert checks == [False, False, True, True]
    assert result.outcome is Outcome.SUCCEEDED


@pytest.mark.parametrize("claim", ["first", "takeover"])
def test_worker_claim_whose_schedule_cannot_be_read_after_it_says_what_became_of_the_claim(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch, claim: str
):
    # GIVEN an occurrence's first claim, or a takeover of an expired lease, and DynamoDB
    # throttling the strongly consistent read of the schedule that must follow the claim
    if claim == "first":
        due(aws, clock)
        [delivery] = receive(aws)
    else:
        _, delivery = abandoned(aws, clock)
        clock.advance(61)
        delivery = redeliver(aws, delivery)
    throttled_schedule_reads(aws, monkeypatch, consistent=True)
    # WHEN the worker processes it
    result = worker(aws, Calls()).process(delivery)
    # THEN the result says whether the claim was undone or is kept until its lease runs out,
    # in the words the simulation's oracle reads (tests/sim/oracle.py, _UNDONE: such an
    # occurrence was claimed, so it no longer waits)
    assert (result.outcome, result.detail) == {
        "first": (Outcome.IN_PROGRESS, "the schedule could not be read"),
        "takeover": (
            Outcome.IN_PROGRESS,
            "the schedule could not be read after the claim; the lease runs out",
        ),
    }[claim]
