"""A tenant's worker process wires itself without the server (``WorkerClients``): its clients
and the deployment's settings from its environment, the stores over them. A worker over that
wiring runs an occurrence as one over the server's does."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from punctual.services import Services
from punctual.settings import get_settings
from punctual_client.worker import Outcome, Worker, WorkerClients
from tests.integration.conftest import Api, Clock
from tests.integration.worker.helpers import Calls, S, consumer, due, stored


@pytest.fixture
def fresh_settings() -> Iterator[None]:
    """Settings read anew from the environment this test sets (they are read once a process)."""
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_worker_clients_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, fresh_settings: None
):
    # GIVEN a worker host's environment: its region and the deployment's table names
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setenv("PUNCTUAL_TENANTS_TABLE", "acme-punctual-tenants")
    monkeypatch.setenv("PUNCTUAL_OCCURRENCES_TABLE", "acme-punctual-occurrences")
    # WHEN the worker's wiring is built from it
    wiring = WorkerClients.from_environment()
    # THEN its clients are DynamoDB's and SQS's in that region, its settings the deployment's,
    # its clock and pause the real ones, and its stores read the tables those settings name
    assert wiring.dynamodb.meta.service_model.service_name == "dynamodb"
    assert wiring.sqs.meta.service_model.service_name == "sqs"
    assert wiring.dynamodb.meta.region_name == wiring.sqs.meta.region_name == "eu-west-1"
    assert wiring.settings.occurrences_table == "acme-punctual-occurrences"
    assert (wiring.now, wiring.sleep) == (time.time, time.sleep)
    assert wiring.tenants.table == "acme-punctual-tenants"
    assert wiring.db.raw is wiring.dynamodb
    assert wiring.db.sleep is time.sleep


def test_a_worker_over_its_own_wiring_runs_an_occurrence(alice: Api, aws: Services, clock: Clock):
    # GIVEN an occurrence relayed into alice's queue, and a worker wired as a tenant's process
    # wires itself (the clients and settings it was given, the test's clock and pause)
    [occ] = due(aws, clock, payload={"report": "daily"})
    paused: list[float] = []
    wiring = WorkerClients(aws.dynamodb, aws.sqs, aws.settings, now=clock, sleep=paused.append)
    assert wiring.db.sleep == paused.append  # (its retries pause as the wiring says)
    handler = Calls()
    # WHEN a consumer polls once
    [result] = consumer(Worker(wiring, "alice", handler)).poll_once()
    # THEN the handler ran it and it SUCCEEDED, as under the server's wiring
    assert result.outcome is Outcome.SUCCEEDED
    assert [job.occurrence_id for job in handler.jobs] == [occ]
    occurrence, attempts = stored(aws, occ)
    assert occurrence.state is S.SUCCEEDED
    assert [a.finished_at for a in attempts] == [int(clock.now)]  # (the wiring's clock)
