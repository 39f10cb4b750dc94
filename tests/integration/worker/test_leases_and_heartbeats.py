"""Leases and heartbeats in the worker SDK, on moto with the injected clock. An expired lease is
taken over, and the late holder's completion or permanent failure is fenced off by its token.
An abandoned run that is stale or out of attempts is refused once, even when a refusal and a
takeover race. A completion that fails transiently is retried and counts once, a lease ending
this second is taken over rather than waited for, and heartbeats extend the lease and both of
the run's slots while the handler runs."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError

from punctual.control.plane import ControlPlane
from punctual.dal.common import ConditionFailed
from punctual.domain.occurrence import AttemptOutcome
from punctual.services import Services
from punctual.timing import utc_text
from punctual_client.worker import Job, Outcome, PermanentError, Result
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import patch
from tests.integration.worker.helpers import (
    Calls,
    S,
    SpySQS,
    abandoned,
    concurrency_slots,
    dead_letters,
    due,
    outcomes,
    rate_schedule,
    receive,
    redeliver,
    relay,
    run_slot,
    state,
    stored,
    with_sqs,
    worker,
)

# --- leases and heartbeats ------------------------------------------------------------------


def test_worker_heartbeat_of_a_run_another_worker_refused_says_the_lease_is_gone(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN worker A running an occurrence; A stalls past its lease, the schedule is paused,
    # and B, given the message again, refuses the abandoned run (CANCELED; the refusal
    # leaves A's token on the item)
    _, [occ, *_] = rate_schedule(aws, "rate(10 minutes)")
    relay(aws, occ)
    [delivery] = receive(aws)
    seen: dict[str, Any] = {}

    def stall(job: Job) -> None:
        clock.advance(61)
        ControlPlane(aws).pause("alice", job.message.schedule_id)
        seen["b"] = worker(aws, Calls(), rng=random.Random(8)).process(redeliver(aws, delivery))
        seen["heartbeat"] = job.heartbeat()

    # WHEN A beats its heart after that
    late = worker(aws, stall).process(delivery)
    # THEN the beat says the lease is gone (the run is no longer RUNNING), and A's
    # completion is rejected: the occurrence stays CANCELED
    assert seen["b"].outcome is Outcome.STALE
    assert seen["heartbeat"] is False
    assert late.outcome is Outcome.LEASE_LOST
    assert state(aws, occ) is S.CANCELED


def test_worker_abandoned_run_is_moved_once_when_a_refusal_and_a_takeover_race(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a run whose lease expired, read RUNNING (with its token) by two workers
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    outcome: dict[str, Any] = {}

    def stall(job: Job) -> None:
        clock.advance(61)
        runs = worker(aws, Calls()).runs
        found, _ = runs.read(occ, job.message.schedule_id)
        assert found is not None
        seen, now = found.seen, int(clock.now)
        # WHEN one refuses it (CANCELED: the refusal keeps the token) and the other then
        # claims it, and a third refusal (DEAD) comes after both, all on what they read
        outcome["refused"] = runs.refuse(occ, seen=seen, state=S.CANCELED, reason="stale", now=now)
        lease = dataclasses.replace(job._lease, token="t-late", attempt_no=2, attempt_index=1)
        try:
            runs.claim(lease, seen=seen, now=now, queued_at=now)
            outcome["claimed"] = True
        except ConditionFailed:
            outcome["claimed"] = False
        outcome["refused_again"] = runs.refuse(
            occ, seen=seen, state=S.DEAD, reason="exhausted", now=now
        )

    worker(aws, stall).process(delivery)
    # THEN only the first move happened: the state it read is gone for the others
    assert outcome == {"refused": True, "claimed": False, "refused_again": False}
    occurrence, attempts = stored(aws, occ)
    assert (occurrence.state, occurrence.reason) == (S.CANCELED, "stale")
    assert [a.outcome for a in attempts] == [AttemptOutcome.LOST]


def test_worker_lease_expiry_b_takes_over_and_a_late_completion_is_rejected(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN worker A running an occurrence under a 60 s lease; B gets the same message
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    b_handler = Calls()
    b = worker(aws, b_handler, rng=random.Random(8))
    seen: dict[str, Any] = {}

    def stall(job: Job) -> None:
        # While A's lease is live, B is told someone else holds it.
        seen["live"] = b.process(redeliver(aws, delivery))
        seen["a_token"] = stored(aws, occ)[0].lease_token
        # A stalls beyond its lease; the message comes back to B, which takes over.
        clock.advance(61)
        seen["b"] = b.process(redeliver(aws, delivery))
        seen["after_b"] = stored(aws, occ)
        seen["heartbeat"] = job.heartbeat()

    a = worker(aws, stall)
    # WHEN A finally returns
    late = a.process(delivery)
    # THEN while A's lease was live B refused (IN_PROGRESS, back when the lease ends); after
    # it expired B claimed with a new token as attempt 2 (attempt 1 LOST) and succeeded
    assert seen["live"].outcome is Outcome.IN_PROGRESS
    assert seen["live"].detail == "another worker holds the lease"
    assert seen["live"].visible_in == 60
    assert seen["b"].outcome is Outcome.SUCCEEDED
    assert [job.attempt for job in b_handler.jobs] == [2]
    occurrence, attempts = seen["after_b"]
    assert occurrence.state is S.SUCCEEDED
    assert [(x.attempt_no, x.outcome) for x in attempts] == [
        (1, AttemptOutcome.LOST),
        (2, AttemptOutcome.SUCCEEDED),
    ]
    assert b_handler.jobs[0]._lease.token != seen["a_token"] is not None
    # AND A's heartbeat after the takeover said the lease is gone, and A's completion was
    # rejected without touching the occurrence or either attempt
    assert seen["heartbeat"] is False
    assert late.outcome is Outcome.LEASE_LOST
    assert late.detail == "attempt 1 lost its lease"
    assert not late.delete
    assert stored(aws, occ) == seen["after_b"]


def test_worker_stale_completion_while_the_new_holder_still_runs_is_fenced_by_the_token(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN worker A stalled past its lease, worker B took the occurrence over, and A returns
    # while B's handler is still running (the occurrence is RUNNING, only the token differs)
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    b_started, a_finished = threading.Event(), threading.Event()

    def b_runs(job: Job) -> None:
        b_started.set()
        assert a_finished.wait(10)

    b = worker(aws, b_runs, rng=random.Random(8))
    box: dict[str, Any] = {}

    def a_stalls(job: Job) -> None:
        clock.advance(61)
        box["b"] = threading.Thread(
            target=lambda: box.__setitem__("b_result", b.process(redeliver(aws, delivery)))
        )
        box["b"].start()
        assert b_started.wait(10)

    # WHEN A's handler returns and A completes
    late = worker(aws, a_stalls).process(delivery)
    during = stored(aws, occ)
    a_finished.set()
    box["b"].join(10)
    # THEN A's completion is refused (LEASE_LOST, saying which attempt): the occurrence stays
    # RUNNING under B's token, attempt 1 LOST and attempt 2 still running
    assert late.outcome is Outcome.LEASE_LOST
    assert late.detail == "attempt 1 lost its lease"
    occurrence, attempts = during
    assert occurrence.state is S.RUNNING
    assert occurrence.attempt_count == 2
    assert occurrence.lease_token is not None
    assert [(x.attempt_no, x.outcome) for x in attempts] == [
        (1, AttemptOutcome.LOST),
        (2, AttemptOutcome.RUNNING),
    ]
    # AND B finishes it SUCCEEDED
    assert box["b_result"].outcome is Outcome.SUCCEEDED
    assert outcomes(aws, occ) == [AttemptOutcome.LOST, AttemptOutcome.SUCCEEDED]
    assert stored(aws, occ)[0].state is S.SUCCEEDED


def test_worker_late_permanent_failure_after_a_takeover_leaves_the_dlq_alone(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN worker A stalls past its lease, B takes over and succeeds
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    seen: dict[str, Result] = {}

    def stall_then_fail(job: Job) -> None:
        clock.advance(61)
        seen["b"] = worker(aws, Calls(), rng=random.Random(8)).process(redeliver(aws, delivery))
        # WHEN A then fails with a permanent error
        raise PermanentError("bad input")

    late = worker(aws, stall_then_fail).process(delivery)
    # THEN A's completion is rejected and the occurrence stays SUCCEEDED; nothing of A's
    # stale attempt should reach the DLQ (it would alarm and be redriven for nothing)
    assert seen["b"].outcome is Outcome.SUCCEEDED
    assert late.outcome is Outcome.LEASE_LOST
    assert state(aws, occ) is S.SUCCEEDED
    assert dead_letters(aws) == []


class FaultOnCompletion:
    """The DynamoDB client; the first completion write fails: throttled before it is made,
    or made and its answer lost (a timeout after the commit, which the SDK or the worker
    sends again)."""

    def __init__(self, real: Any, fault: str) -> None:
        self.real = real
        self.fault = fault
        self.failed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def update_item(self, **kw: Any) -> Any:
        if not self.failed and "finished_at" in kw.get("UpdateExpression", ""):
            self.failed += 1
            if self.fault == "answer lost":
                self.real.update_item(**kw)
                code = "InternalServerError"
            else:
                code = "ProvisionedThroughputExceededException"
            raise ClientError({"Error": {"Code": code, "Message": self.fault}}, "UpdateItem")
        return self.real.update_item(**kw)


@pytest.mark.parametrize("fault", ["throttled", "answer lost"])
def test_worker_completion_that_fails_transiently_is_retried_and_counts_once(
    alice: Api, aws: Services, clock: Clock, fault: str
):
    # GIVEN the first completion write fails transiently: throttled before it is made, or
    # made and its answer lost (fault point: after the handler returned, at the completion)
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    flaky = FaultOnCompletion(aws.dynamodb, fault)
    handler = Calls()
    work = worker(Services(flaky, aws.sqs, aws.settings, aws.now), handler)
    # WHEN the worker completes the run
    result = work.process(delivery)
    # THEN the completion is sent again and succeeds, once: a repeat that meets its own
    # write is not taken for a lost lease; no second run, the slot is free again
    assert flaky.failed == 1
    assert result.outcome is Outcome.SUCCEEDED
    assert result.delete
    assert state(aws, occ) is S.SUCCEEDED
    assert outcomes(aws, occ) == [AttemptOutcome.SUCCEEDED]
    assert handler.count == 1
    assert all("lease_token" not in slot for slot in concurrency_slots(aws))


# RunStore.refuse passes ``now`` twice to values() for a RUNNING occurrence, so every
# refusal of an abandoned run crashes: CPython 3.11 reports the duplicate keyword as a
# TypeError, or as a KeyError when the call happens inside an ``except`` block (the
# overlap refusal is made from Worker._claim_in's ``except ConditionFailed``).
REFUSE_CRASH = (TypeError, KeyError)


@pytest.mark.parametrize("ending", ["canceled", "updated", "paused", "exhausted"])
def test_worker_refuses_an_abandoned_run_that_is_stale_or_exhausted(
    alice: Api, aws: Services, clock: Clock, ending: str
):
    # GIVEN a one-attempt occurrence whose worker died mid-run, and its schedule canceled,
    # updated or paused meanwhile (a RUNNING occurrence is reported by the change, not
    # canceled), or nothing more
    occ, delivery = abandoned(aws, clock, retry={"max_attempts": 1})
    sid = stored(aws, occ)[0].schedule_id
    if ending == "canceled":
        ControlPlane(aws).cancel("alice", sid)
    elif ending == "updated":
        later = {"kind": "at", "at": utc_text(int(clock.now) + 3600)}
        assert patch(alice, sid, {"spec": later}, version=1).status == 200
    elif ending == "paused":
        ControlPlane(aws).pause("alice", sid)
    clock.advance(61)
    handler = Calls()
    # WHEN the message comes back after the lease expired
    result = worker(aws, handler).process(redeliver(aws, delivery))
    # THEN it is refused without running: CANCELED as stale (with why), or DEAD (and in
    # the DLQ once)
    expected = (Outcome.DEAD, S.DEAD) if ending == "exhausted" else (Outcome.STALE, S.CANCELED)
    assert (result.outcome, state(aws, occ)) == expected
    assert handler.count == 0
    assert len(dead_letters(aws)) == (1 if ending == "exhausted" else 0)
    why = {"canceled": "the schedule was canceled", "updated": "version 2", "paused": "version 2"}
    if ending == "canceled":
        assert stored(aws, occ)[0].reason == why[ending]
    elif ending in why:
        assert why[ending] in (stored(aws, occ)[0].reason or "")


@pytest.mark.parametrize("ending", ["canceled", "exhausted"])
def test_worker_refusing_an_abandoned_run_marks_its_attempt_lost(
    alice: Api, aws: Services, clock: Clock, ending: str
):
    # GIVEN a one-attempt occurrence whose worker died mid-run (and maybe a cancel)
    occ, delivery = abandoned(aws, clock, retry={"max_attempts": 1})
    if ending == "canceled":
        ControlPlane(aws).cancel("alice", stored(aws, occ)[0].schedule_id)
    clock.advance(61)
    # WHEN the message comes back and the occurrence is refused
    worker(aws, Calls()).process(redeliver(aws, delivery))
    # THEN the abandoned attempt is closed as LOST, like a takeover closes it
    assert state(aws, occ) in (S.CANCELED, S.DEAD)
    assert outcomes(aws, occ) == [AttemptOutcome.LOST]


def test_worker_lease_ending_this_second_is_taken_over_not_waited_for(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN worker A running an occurrence under a 60 s lease, stalled exactly 60 s
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    b_handler = Calls()
    seen: dict[str, Result] = {}

    def stall(job: Job) -> None:
        clock.advance(60)
        # WHEN the message comes back to B at the very second A's lease ends
        seen["b"] = worker(aws, b_handler).process(redeliver(aws, delivery))

    worker(aws, stall).process(delivery)
    # THEN B takes over at once (the claim's condition allows a lease ending now), rather
    # than waiting a round for a lease that no longer protects anything
    assert seen["b"].outcome is Outcome.SUCCEEDED
    assert [job.attempt for job in b_handler.jobs] == [2]
    assert outcomes(aws, occ) == [AttemptOutcome.LOST, AttemptOutcome.SUCCEEDED]


def test_worker_heartbeat_extends_the_lease_and_both_slots(alice: Api, aws: Services, clock: Clock):
    # GIVEN a SKIP_IF_RUNNING schedule's occurrence running under a 60 s lease
    sid, [occ, *_] = rate_schedule(aws, "rate(5 minutes)", overlap="SKIP_IF_RUNNING")
    relay(aws, occ)
    [delivery] = receive(aws)
    other = worker(aws, Calls(), rng=random.Random(9))
    seen: dict[str, Any] = {}

    def lease_and_slots() -> tuple[int | None, int, int]:
        [slot] = [s for s in concurrency_slots(aws) if s.get("occurrence_id") == occ]
        return (
            stored(aws, occ)[0].lease_expires_at,
            slot["expires_at"],
            run_slot(aws, sid)["expires_at"],
        )

    def long_job(job: Job) -> None:
        seen["claimed_at"] = int(clock.now)
        seen["before"] = lease_and_slots()
        # WHEN 50 s in, the handler heartbeats
        clock.advance(50)
        seen["beat"] = job.heartbeat()
        seen["after"] = lease_and_slots()
        seen["visibility"] = list(spy.visibility)
        # 30 s later the first lease (claimed + 60) has passed, the extended one has not
        clock.advance(30)
        seen["other"] = other.process(redeliver(aws, delivery))

    spy = SpySQS(aws.sqs)
    result = worker(with_sqs(aws, spy), long_job).process(delivery)
    # THEN the occurrence's lease and both slot items moved from claim + 60 to beat + 60
    # together, the message's visibility was extended with them (once at the claim, once
    # at the beat), and another worker still sees IN_PROGRESS (for the 30 s left)
    claimed = seen["claimed_at"]
    assert seen["before"] == (claimed + 60,) * 3
    assert seen["beat"] is True
    assert seen["after"] == (claimed + 50 + 60,) * 3
    assert seen["visibility"] == [(delivery.receipt_handle, 60)] * 2
    assert seen["other"].outcome is Outcome.IN_PROGRESS
    assert seen["other"].visible_in == 30
    assert result.outcome is Outcome.SUCCEEDED
    assert state(aws, occ) is S.SUCCEEDED


def test_worker_heartbeat_thread_keeps_the_lease_while_the_handler_runs(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a worker that heartbeats on a thread every 10 ms
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    seen: dict[str, Any] = {}

    def slow(job: Job) -> None:
        clock.advance(50)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            seen["lease"] = stored(aws, occ)[0].lease_expires_at
            if seen["lease"] == int(clock.now) + 60:
                return
            time.sleep(0.01)

    # WHEN the handler runs 50 s of injected time
    result = worker(aws, slow, heartbeat_seconds=0.01).process(delivery)
    # THEN a beat moved the lease to now + 60 without the handler calling heartbeat()
    assert seen["lease"] == int(clock.now) + 60
    assert result.outcome is Outcome.SUCCEEDED
