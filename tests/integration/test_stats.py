"""`punctual stats` (punctual_local.stats): the figures read from the local tables, here
the delivery backlog after an outage of the workers: its size, oldest due time and drain
time, overall and for the largest tenants."""

from __future__ import annotations

import pytest

from punctual.dal.common import to_dynamo
from punctual.dal.tables import occurrence_key
from punctual.domain.drain import NOT_DRAINING
from punctual.services import Services
from punctual_local.stats import figures
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import cron_spec, make, set_occurrence_state
from tests.integration.reconciler.helpers import at, materialize_until, shards_of, stored


def test_stats_report_the_backlog_its_oldest_due_time_and_drain_time_per_tenant(
    alice: Api, bob: Api, aws: Services, clock: Clock
):
    # GIVEN alice's every-minute and bob's every-five-minutes schedules planned from 09:40
    # to 10:00, and no worker took any until alice's took ten in the last five minutes
    clock.now = at("09:40")
    mine = make(aws, spec=cron_spec("* * * * *"))
    theirs = make(aws, tenant="bob", spec=cron_spec("*/5 * * * *"))
    materialize_until(aws, clock, at("10:00"), shards_of(aws, [mine, theirs]))
    clock.now = at("10:00")
    due = [o for o in stored(aws, until=at("10:00") + 1) if o["available_at"] <= at("10:00")]
    alices = [o for o in due if o["schedule_id"] == mine]
    for n, taken in enumerate(alices[:10]):
        set_occurrence_state(aws, taken["occurrence_id"], "RUNNING")
        attempt = {"attempt_no": 1, "started_at": at("09:56") + n * 20, "outcome": "RUNNING"}
        aws.dynamodb.update_item(
            TableName=aws.settings.occurrences_table,
            Key=to_dynamo(occurrence_key(taken["occurrence_id"])),
            UpdateExpression="SET attempts = :history",
            ExpressionAttributeValues=to_dynamo({":history": [attempt]}),
        )
    # WHEN the stats are read
    found = figures(aws, since=at("09:00"))
    drain = found["drain"]
    # THEN the ten taken waited for a worker from their due minute to their claim: the
    # first, due 09:40, claimed 09:56, waited 16 minutes
    waits = sorted(at("09:56") + n * 20 - o["available_at"] for n, o in enumerate(alices[:10]))
    assert found["waited_for_a_worker_seconds"]["n"] == 10
    assert found["waited_for_a_worker_seconds"]["p99"] == pytest.approx(waits[-1], abs=60)
    # THEN the backlog is every due occurrence not taken, the oldest due first
    left = len(due) - 10
    assert drain["backlog"] == left
    assert drain["oldest_due"] == "2026-11-19T09:40:00Z"
    assert drain["oldest_age_seconds"] == 20 * 60
    # AND alice's drains at ten taken against five falling due in five minutes: one a minute
    alice_left = len(alices) - 10
    [first, second] = drain["largest_tenants"]
    assert (first["tenant_id"], first["backlog"]) == ("alice", alice_left)
    assert first["taken_per_minute"] == 2.0
    assert first["due_per_minute"] == 1.0
    assert first["drain_seconds"] == alice_left * 60
    # AND bob's, which no worker takes, does not drain
    assert (second["tenant_id"], second["backlog"]) == ("bob", len(due) - len(alices))
    assert second["drain_seconds"] == NOT_DRAINING
