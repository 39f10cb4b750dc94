"""A short seeded simulation under every kind of fault (tests/sim), and the oracle's own
sensitivity: each invariant it checks is shown to fail on a planted violation."""

from __future__ import annotations

import pytest

from punctual.dal.common import from_dynamo, to_dynamo
from punctual.dal.tables import occurrence_key
from punctual.observability import logger
from punctual_local.dynamodb import LocalDynamoDB
from tests.faults import FaultPlan
from tests.sim.oracle import Verdict, check
from tests.sim.world import Run, SimConfig, Simulation

# Rates well above the full run's (scripts/simulate.py), so 3.6 hours meet every kind (with
# seed 7: 5 materializer kills, about 180 fires and runs; a quarter day took twice the CPU).
# Conflicts at 0.05: since a worker's completion is one write, not a transaction (2026-12-03),
# 0.02 of the fewer transactions drew none in one make test run.
HARSH = FaultPlan(
    throttle=0.02,
    conflict=0.05,
    replayed=0.02,
    lost_response=0.01,
    stale=0.2,
    stale_seconds=5,
    index_lag=0.05,
    index_lag_seconds=150,
    send_failure=0.1,
    send_timeout=0.05,
)
EVERY_KIND = {
    "throttled",
    "transaction_conflict",
    "replayed_after_commit",
    "lost_response",
    "stale_read",
    "index_lag",
    "send_failed",
    "message_lost",
    "relay_cut",
    "mapping_gave_up",
}


@pytest.fixture(scope="module")
def simulated(dynamodb_local: LocalDynamoDB) -> tuple[Run, Verdict]:
    level = logger.log_level
    logger.setLevel("CRITICAL")
    config = SimConfig(
        seed=7,
        days=0.15,
        schedules=30,
        shards=2,
        faults=HARSH,
        kill=0.05,
        relay_cut=0.2,
        gives_up=0.6,
        lost_message=0.01,
        outages=2,
    )
    try:
        run = Simulation(config, dynamodb_local.client()).run()
    finally:
        logger.setLevel(level)
    return run, check(run)


def test_simulation_short_run_under_every_fault_keeps_the_contract(
    simulated: tuple[Run, Verdict],
):
    # GIVEN 3.6 hours of 30 schedules with faults of every kind and outages
    run, verdict = simulated
    # THEN every kind was injected, the system did real work ...
    assert set(run.injected) >= EVERY_KIND, run.injected
    assert run.counts["materializer_killed"] > 0
    assert verdict.fires_checked > 100
    assert verdict.runs > 50
    # AND no invariant is violated
    assert not verdict.violations, dict(verdict.examples)


def test_simulation_oracle_catches_each_kind_of_violation(simulated: tuple[Run, Verdict]):
    # GIVEN the clean end state of the run above, altered the way each bug would alter it
    run, clean = simulated
    table = run.settings.occurrences_table
    dynamodb = run.services.dynamodb
    plain = {  # schedules never changed and never missing a fire: every fire required
        i["schedule_id"]["S"]
        for page in dynamodb.get_paginator("scan").paginate(TableName=run.settings.schedules_table)
        for i in page["Items"]
        if i["sk"]["S"] == "CURRENT" and i["version"]["N"] == "1" and "missed_ranges" not in i
    }
    done = next(
        i
        for page in dynamodb.get_paginator("scan").paginate(TableName=table)
        for i in page["Items"]
        if i["sk"]["S"].startswith("OCC#")
        and i["state"]["S"] == "SUCCEEDED"
        and i["schedule_id"]["S"] in plain
        and i["occurrence_id"]["S"] in clean.found  # a fire the oracle requires and checks
    )
    key = occurrence_key(done["occurrence_id"]["S"])
    # WHEN an occurrence goes missing, another is left open, one is planted in a wrong
    # minute, a handler run is recorded ahead of its time, and a tenant's usage drifts
    dynamodb.delete_item(TableName=table, Key=to_dynamo(key))
    version = int(done["schedule_version"]["N"])
    off_minute = int(done["scheduled_for"]["N"]) + 7
    stray_id = f"occ_{key['schedule_id']}_{off_minute}_{version}"
    stray = from_dynamo(done) | {
        "sk": occurrence_key(stray_id)["sk"],
        "occurrence_id": stray_id,
        "scheduled_for": off_minute,
        "state": "SCHEDULED",
    }
    dynamodb.put_item(TableName=table, Item=to_dynamo(stray))
    run.handler_runs.append((done["occurrence_id"]["S"], version, 0.0, 10.0, version, "ACTIVE"))
    tenants = run.settings.tenants_table
    dynamodb.update_item(
        TableName=tenants,
        Key={"pk": {"S": "T#t0"}, "sk": {"S": "TENANT"}},
        UpdateExpression="ADD schedule_count :one",
        ExpressionAttributeValues={":one": {"N": "1"}},
    )
    verdict = check(run)
    # THEN the oracle names each one
    assert {"missing", "unowned", "early", "quota_count"} <= set(verdict.violations), dict(
        verdict.violations
    )
