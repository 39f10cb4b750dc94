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
        started = at("09:56") + n * 20
        attempt = {
            "attempt_no": 1,
            "started_at": started,
            "lease_expires_at": started + 60,
            "outcome": "RUNNING",
        }
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


def test_stats_split_the_occurrences_time_by_state_per_lane(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN alice's every-minute schedule planned from 09:40 to 09:45, and what workers
    # recorded of four of its occurrences: sent ahead, claimed 2 s after its due time, a run
    # of 3 s that failed, 30 s of back-off, a run of 4 s; and three sent 5 s late, claimed
    # at once, run 1 s
    clock.now = at("09:40")
    mine = make(aws, spec=cron_spec("* * * * *"))
    materialize_until(aws, clock, at("09:45"), shards_of(aws, [mine]))
    first, *others = sorted(stored(aws, until=at("09:45") + 1), key=lambda o: o["available_at"])
    due = first["available_at"]
    _record(aws, first["occurrence_id"], due - 60, [(due + 2, due + 5), (due + 35, due + 39)])
    for o in others[:3]:
        due = o["available_at"]
        _record(aws, o["occurrence_id"], due + 5, [(due + 5, due + 6)])
    # ... and one whose attempts a tenant's worker mangled
    aws.dynamodb.update_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(others[3]["occurrence_id"])),
        UpdateExpression="SET attempts = :junk",
        ExpressionAttributeValues=to_dynamo({":junk": "not a list"}),
    )
    # WHEN the stats are read
    read = figures(aws, since=at("09:00"))
    found = read["time_in_state_seconds"]
    # THEN each step's figures are those of the occurrences that reached it, in the strict
    # lane; the mangled one is counted unreadable, left out of every figure
    assert read["unreadable"] == 1
    strict = found["strict"]
    assert strict["to_receivable"] == {"p50": 5.0, "p95": 5.0, "p99": 5.0, "n": 4}
    assert strict["to_claim"] == {"p50": 0.0, "p95": 2.0, "p99": 2.0, "n": 4}
    assert strict["run"] == {"p50": 1.0, "p95": 4.0, "p99": 4.0, "n": 5}
    assert strict["retry_wait"] == {"p50": 30.0, "p95": 30.0, "p99": 30.0, "n": 1}
    assert set(found) == {"strict"}


def _record(aws: Services, occurrence_id: str, sent: int, runs: list[tuple[int, int]]) -> None:
    """What a worker records of an occurrence: its send (from SentTimestamp) and attempts."""
    history = [
        {
            "attempt_no": n,
            "started_at": start,
            "lease_expires_at": start + 60,
            "finished_at": end,
            "outcome": "RETRY" if n < len(runs) else "SUCCEEDED",
        }
        for n, (start, end) in enumerate(runs, 1)
    ]
    aws.dynamodb.update_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(occurrence_id)),
        UpdateExpression="SET attempts = :history, enqueued_at = :sent",
        ExpressionAttributeValues=to_dynamo({":history": history, ":sent": sent}),
    )
