"""The worker SDK's plain path, on moto with the injected clock. A worker runs an occurrence
relayed into the tenant's queue and deletes its message, its claim records how long the
occurrence waited for a worker, and attempts that a tenant's worker wrote badly into the
table show no claim and make nothing fail."""

from __future__ import annotations

from punctual.dal.common import to_dynamo
from punctual.dal.tables import occurrence_key
from punctual.domain.occurrence import AttemptOutcome
from punctual.services import Services
from punctual.timing import utc_text
from punctual_client.worker import Outcome
from tests.integration.conftest import Api, Clock
from tests.integration.worker.helpers import (
    Calls,
    S,
    concurrency_slots,
    consumer,
    depth,
    due,
    stored,
    worker,
)

# --- the plain path -------------------------------------------------------------------


def test_worker_runs_an_enqueued_occurrence_and_deletes_its_message(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence relayed into alice's queue
    [occ] = due(aws, clock, payload={"report": "daily"})
    handler = Calls()
    # WHEN a consumer polls once
    [result] = consumer(worker(aws, handler)).poll_once()
    # THEN the handler ran once with the message, attempt 1; the occurrence SUCCEEDED with
    # one SUCCEEDED attempt, its concurrency slot was released, and the message is gone
    assert result.outcome is Outcome.SUCCEEDED
    [job] = handler.jobs
    assert (job.occurrence_id, job.attempt, job.payload) == (occ, 1, {"report": "daily"})
    assert job.message.tenant_id == "alice"
    occurrence, attempts = stored(aws, occ)
    assert occurrence.state is S.SUCCEEDED
    assert occurrence.attempt_count == 1
    assert occurrence.lease_token is None
    assert [(a.attempt_no, a.outcome) for a in attempts] == [(1, AttemptOutcome.SUCCEEDED)]
    assert (attempts[0].started_at, attempts[0].finished_at) == (int(clock.now),) * 2
    assert all("lease_token" not in slot for slot in concurrency_slots(aws))
    assert depth(aws) == 0


def test_worker_claim_shows_how_long_the_occurrence_waited_for_a_worker(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence relayed on time into alice's queue, whose workers were down
    [occ] = due(aws, clock)
    due_at = int(clock.now)
    clock.advance(146)
    # WHEN a worker takes it 146 s after it was due
    [result] = consumer(worker(aws, Calls())).poll_once()
    assert result.outcome is Outcome.SUCCEEDED
    # THEN the API shows when it was claimed and that it waited 146 s for a worker (the
    # relay's lag, sent ahead of its time, being none), listed and read alone
    schedule_id = occ.split("_", 1)[1].rsplit("_", 2)[0]
    [listed] = alice.get(f"/v1/schedules/{schedule_id}/occurrences").body["occurrences"]
    read = alice.get(f"/v1/occurrences/{occ}").body
    for shown in (listed, read):
        assert shown["claimed_at"] == utc_text(due_at + 146)
        assert shown["waited_seconds"] == 146


def test_worker_attempts_a_tenant_wrote_badly_show_no_claim_and_fail_nothing(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence whose attempt history its tenant's worker wrote as garbage
    [occ] = due(aws, clock)
    aws.dynamodb.update_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(occ)),
        UpdateExpression="SET attempts = :junk",
        ExpressionAttributeValues={":junk": {"L": [{"S": "not a map"}]}},
    )
    # WHEN its schedule's occurrences are listed
    schedule_id = occ.split("_", 1)[1].rsplit("_", 2)[0]
    answer = alice.get(f"/v1/schedules/{schedule_id}/occurrences")
    # THEN it is listed, without a claim (display only: no error)
    assert answer.status == 200, answer.body
    [listed] = answer.body["occurrences"]
    assert (listed["claimed_at"], listed["waited_seconds"]) == (None, None)
