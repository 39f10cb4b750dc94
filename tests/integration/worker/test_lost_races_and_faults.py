"""Lost races, transient faults and the slot scan in the worker SDK, on moto with the injected
clock. A claim that loses every round leaves the message for a later delivery, and one that
loses a single race reads again and runs. A heartbeat under a fault keeps the lease only
while it is still the worker's, and the heartbeat thread beats on after a failed beat. When
every probed concurrency slot is busy the worker scans them all, it reads the tenant's limit
again once its cache expires, and it says so when the tenant does not exist. A refusal or a
dead verdict that loses its race reads again."""

from __future__ import annotations

import time
from typing import Any

import pytest
from botocore.exceptions import ClientError

from punctual.control.plane import ControlPlane
from punctual.dal.common import ConditionFailed, Label
from punctual.dal.runs import RunLease
from punctual.domain.errors import Retryable
from punctual.domain.occurrence import AttemptOutcome
from punctual.services import Services
from punctual_client.worker import Job, Outcome, Worker
from punctual_client.worker.core import (
    CLAIM_ATTEMPTS,
    SLOT_PROBES,
    TENANT_CACHE_SECONDS,
    THROTTLE_BACKOFF,
)
from tests.integration.conftest import ALICE, Api, Clock, bootstrap
from tests.integration.worker.helpers import (
    Calls,
    S,
    SpySQS,
    abandoned,
    concurrency_slots,
    dead_letters,
    due,
    outcomes,
    receive,
    redeliver,
    state,
    stored,
    with_sqs,
    worker,
)

# --- lost races, transient faults and the slot scan ------------------------------------------


@pytest.mark.parametrize("fault", ["lost race", "throttled"])
def test_worker_claim_that_loses_every_round_leaves_the_message_for_a_later_delivery(
    alice: Api, aws: Services, clock: Clock, fault: str
):
    # GIVEN every claim transaction is refused: a race lost each time (the occurrence moved
    # between the read and the write), or throttled
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    handler = Calls()
    spy = SpySQS(aws.sqs)
    work = worker(with_sqs(aws, spy), handler)
    claims: list[int] = []

    def refused(lease: Any, **_: Any) -> None:
        claims.append(lease.attempt_no)
        raise ConditionFailed(Label.OCCURRENCE, None) if fault == "lost race" else Retryable("slow")

    work.runs.claim = refused  # type: ignore[method-assign]
    # WHEN the worker processes the message
    result = work.process(delivery)
    # THEN it read and tried again CLAIM_ATTEMPTS times, then kept the message (not deleted,
    # not in the DLQ) for a later delivery within the throttle back-off; nothing ran
    assert claims == [1] * CLAIM_ATTEMPTS
    assert (result.outcome, result.detail) == (
        Outcome.IN_PROGRESS,
        "contended; left for a later delivery",
    )
    assert not result.delete
    assert result.visible_in is not None
    assert THROTTLE_BACKOFF[0] <= result.visible_in <= THROTTLE_BACKOFF[1]
    assert spy.visibility == [(delivery.receipt_handle, result.visible_in)]
    assert handler.count == 0
    assert state(aws, occ) is S.SCHEDULED
    assert dead_letters(aws) == []


def test_worker_claim_that_loses_one_race_reads_again_and_runs(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN the first claim transaction loses a race, the second does not
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    handler = Calls()
    work = worker(aws, handler)
    real = work.runs.claim
    claims: list[int] = []

    def first_refused(lease: Any, **kwargs: Any) -> None:
        claims.append(lease.attempt_no)
        if len(claims) == 1:
            raise ConditionFailed(Label.OCCURRENCE, None)
        real(lease, **kwargs)

    work.runs.claim = first_refused  # type: ignore[method-assign]
    # WHEN the worker processes the message; THEN the second round claims it and it runs once
    assert work.process(delivery).outcome is Outcome.SUCCEEDED
    assert claims == [1, 1]
    assert handler.count == 1
    assert outcomes(aws, occ) == [AttemptOutcome.SUCCEEDED]


@pytest.mark.parametrize(("fault", "ours"), [("throttled", True), ("taken over", False)])
def test_worker_heartbeat_under_a_fault_keeps_the_lease_only_if_it_is_still_ours(
    alice: Api, aws: Services, clock: Clock, fault: str, ours: bool
):
    # GIVEN a running job whose heartbeat's write is throttled, or refused (another worker
    # took the lease over)
    due(aws, clock)
    [delivery] = receive(aws)
    spy = SpySQS(aws.sqs)
    work = worker(with_sqs(aws, spy), Calls())
    seen: dict[str, Any] = {}

    def refused(lease: Any, expires_at: int) -> None:
        raise Retryable("slow") if fault == "throttled" else ConditionFailed(Label.OCCURRENCE, None)

    def job(job: Job) -> None:
        work.runs.extend = refused  # type: ignore[method-assign]
        clock.advance(30)
        # WHEN the handler heartbeats twice
        seen["beats"] = [job.heartbeat(), job.heartbeat()]
        seen["lost"] = job.lease_lost
        seen["visibility"] = list(spy.visibility)

    work.handler = job
    work.process(delivery)
    # THEN a throttled beat says the lease is still ours (the next beat tries again) and a
    # refused one says it is lost, for good; neither extends the message's visibility
    # (only the claim set it)
    assert seen["beats"] == [ours, ours]
    assert seen["lost"] is (not ours)
    assert seen["visibility"] == [(delivery.receipt_handle, 60)]


def test_worker_heartbeat_thread_beats_on_after_a_failed_beat(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a worker heartbeating on a thread every 10 ms, whose first beat fails with an
    # SQS error (the visibility change), the lease extension having been written
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    failures: list[int] = []

    class FailOnce(SpySQS):
        def change_message_visibility(self, **kwargs: Any) -> Any:
            if len(self.visibility) == 1 and not failures:  # the claim's change went through
                failures.append(1)
                raise ClientError({"Error": {"Code": "InternalError"}}, "ChangeMessageVisibility")
            return super().change_message_visibility(**kwargs)

    spy = FailOnce(aws.sqs)
    seen: dict[str, Any] = {}

    def slow(job: Job) -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(spy.visibility) < 3:
            time.sleep(0.01)
        seen["visibility"] = len(spy.visibility)
        seen["lost"] = job.lease_lost

    # WHEN the handler runs while the thread beats
    result = worker(with_sqs(aws, spy), slow, heartbeat_seconds=0.01).process(delivery)
    # THEN the thread beat again after the failure: the message's visibility was extended
    # by later beats, the lease is still ours, and the run succeeded
    assert failures == [1]
    assert seen["visibility"] >= 3
    assert seen["lost"] is False
    assert result.outcome is Outcome.SUCCEEDED
    assert state(aws, occ) is S.SUCCEEDED


@pytest.mark.parametrize(("limit", "scanned"), [(SLOT_PROBES + 4, True), (SLOT_PROBES, False)])
def test_worker_slots_all_probed_busy_are_followed_by_a_scan_of_every_slot(
    aws: Services, clock: Clock, limit: int, scanned: bool
):
    # GIVEN alice may run ``limit`` at a time, and every slot the worker probes first looks
    # busy (the others are free)
    bootstrap("alice", ALICE, max_concurrency=limit)
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    held: list[dict[str, Any]] = []
    work = worker(aws, Calls(lambda job: held.extend(concurrency_slots(aws))))
    real = work.runs.busy_slots
    asked: list[list[int]] = []

    def probed_busy(tenant_id: str, candidates: list[int], now: int) -> set[int]:
        assert (tenant_id, now) == ("alice", int(clock.now))
        asked.append(list(candidates))
        return set(asked[0]) & set(candidates) | real(tenant_id, candidates, now)

    work.runs.busy_slots = probed_busy  # type: ignore[method-assign]
    # WHEN the worker looks for a slot
    result = work.process(delivery)
    # THEN with more slots than probes it reads them all and claims one it had not probed;
    # with no slot left unprobed it is throttled at once
    assert len(asked[0]) == SLOT_PROBES
    if scanned:
        assert asked[1:] == [list(range(limit))]
        assert result.outcome is Outcome.SUCCEEDED
        [slot] = [s for s in held if s.get("occurrence_id") == occ]
        assert int(str(slot["sk"]).removeprefix("RUN#")) not in asked[0]
    else:
        assert asked[1:] == []
        assert result.outcome is Outcome.THROTTLED


def test_worker_reads_the_tenant_limit_again_once_its_cache_expires(aws: Services, clock: Clock):
    # GIVEN alice may run 1 at a time and a worker that has read that limit
    bootstrap("alice", ALICE, max_concurrency=1)
    work = worker(aws, Calls())
    assert work._concurrency_limit() == 1
    # WHEN the operator raises it to 5
    aws.tenants.set_quotas(
        "alice", aws.tenants.get("alice").quotas.model_copy(update={"max_concurrency": 5})
    )
    # THEN the worker keeps the cached limit for TENANT_CACHE_SECONDS, then reads the new one
    clock.advance(TENANT_CACHE_SECONDS)
    assert work._concurrency_limit() == 1
    clock.advance(1)
    assert work._concurrency_limit() == 5


def test_worker_of_a_tenant_that_does_not_exist_says_so(aws: Services, clock: Clock):
    # GIVEN a worker for a tenant that was never created; WHEN it needs the tenant's limit
    # THEN it fails naming the tenant, instead of running without a limit
    with pytest.raises(ValueError, match="tenant ghost does not exist"):
        Worker(aws, "ghost", Calls())._concurrency_limit()


def test_worker_refusal_that_loses_its_race_reads_again(alice: Api, aws: Services, clock: Clock):
    # GIVEN an abandoned run whose schedule was paused meanwhile (the worker must refuse it
    # once its lease expired), and whose refusal write loses a race every time
    occ, delivery = abandoned(aws, clock)
    ControlPlane(aws).pause("alice", stored(aws, occ)[0].schedule_id)
    clock.advance(61)
    delivery = redeliver(aws, delivery)
    work = worker(aws, Calls())
    real = work.runs.refuse
    refusals: list[str] = []

    def lost(occurrence_id: str, **kwargs: Any) -> bool:
        refusals.append(kwargs["reason"])
        return False

    work.runs.refuse = lost  # type: ignore[method-assign]
    # WHEN the worker processes the message
    result = work.process(delivery)
    # THEN each lost refusal is a lost race, read again: no verdict is reported on a write
    # that did not happen, and after CLAIM_ATTEMPTS the message is left for a later delivery
    assert len(refusals) == CLAIM_ATTEMPTS
    assert result.outcome is Outcome.IN_PROGRESS
    assert not result.delete
    assert state(aws, occ) is S.RUNNING
    # AND once the refusal is written, the verdict carries its reason
    work.runs.refuse = real  # type: ignore[method-assign]
    refused = work.process(delivery)
    assert refused.outcome is Outcome.STALE
    assert refused.detail == refusals[0]
    assert "version 2" in refused.detail
    assert state(aws, occ) is S.CANCELED


def test_worker_dead_verdict_that_loses_its_race_to_a_late_completion_is_not_dead_lettered(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-attempt occurrence whose worker stalled mid-run; after its lease expired
    # the next worker reads it and finds its attempts exhausted
    occ, delivery = abandoned(aws, clock, retry={"max_attempts": 1})
    clock.advance(61)
    again = redeliver(aws, delivery)
    item = stored(aws, occ)[0]
    assert item.lease_token is not None
    stalled = RunLease(
        occ, "alice", item.schedule_id, 1, item.lease_token, item.lease_expires_at or 0, 0, False
    )
    work = worker(aws, Calls())
    real = work.runs.refuse
    returned: list[bool] = []

    def late_completion_first(occurrence_id: str, **kwargs: Any) -> bool:
        if not returned:
            # WHEN the stalled worker returns and completes between that read and the
            # DEAD refusal's write
            work.runs.finish(
                stalled, state=S.SUCCEEDED, outcome=AttemptOutcome.SUCCEEDED, now=int(clock.now)
            )
        returned.append(real(occurrence_id, **kwargs))
        return returned[-1]

    work.runs.refuse = late_completion_first  # type: ignore[method-assign]
    result = work.process(again)
    # THEN the refusal's write is refused, the worker reads again and finds it done: it
    # reports no DEAD and sends nothing to the DLQ
    assert returned == [False]
    assert result.outcome is Outcome.ALREADY_DONE
    assert state(aws, occ) is S.SUCCEEDED
    assert dead_letters(aws) == []
