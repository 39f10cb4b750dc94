"""The reconciler against DynamoDB's eventual consistency (tests/faults.py: every
eventually consistent read and every index page served as of seconds ago), in the race the
reads must survive: a repair right after the materializer's catch-up of an outage."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from punctual.materializer import Materializer
from punctual.models import Finding
from punctual.reconciler import Reconciler
from punctual.services import Services
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import cron_spec, make
from tests.integration.test_reconciler import at, materialize_until, shards_of, stored, total

LAGGING = FaultPlan(stale=1.0, stale_seconds=5, index_lag=1.0, index_lag_seconds=5)


def lagging(aws: Services, clock: Clock) -> Services:
    """The same tables, every eventually consistent read (and index page) 5 s behind."""
    return dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, Faults(LAGGING, clock)))


def late_fires(aws: Services) -> list[int]:
    """The instants of the outage (09:56 to 11:03) fired, late, from 11:04 on."""
    return [
        o["scheduled_for"]
        for o in stored(aws, since=at("09:56"), until=at("11:04"))
        if o["available_at"] >= at("11:04")
    ]


@pytest.mark.parametrize(
    "misfire",
    [
        {"action": "FIRE_ONCE", "max_lateness_seconds": 60},
        {"action": "CATCHUP", "catchup_limit": 1, "max_lateness_seconds": 60},
    ],
)
def test_repair_a_second_after_a_catch_up_adds_no_second_late_fire(
    alice: Api, aws: Services, clock: Clock, misfire: dict[str, Any]
):
    # GIVEN a */5 schedule (FIRE_ONCE, or CATCHUP of 1) made at 09:40 and materialized up to
    # 09:55, then an outage; at 11:04 the materializer recovers: it fires 11:00 late and
    # records 10:00 to 10:55 MISSED (an episode on the schedule), on a DynamoDB whose
    # replicas lag 5 s
    clock.now = at("09:40")
    sid = make(aws, spec=cron_spec("*/5 * * * *"), misfire=misfire)
    shards = shards_of(aws, [sid])
    materialize_until(aws, clock, at("09:55"), shards)
    replicas = lagging(aws, clock)
    clock.now = at("11:04")
    for shard in shards:
        Materializer(replicas, "recovery").run_shard(int(clock.now), shard)
    assert late_fires(aws) == [at("11:00")]
    # WHEN the reconciler checks [10:00, 11:00) a second later, on the same lagging replicas
    # (the shard index and the occurrence reads show neither the episode nor the late fire)
    clock.now = at("11:04") + 1
    results = Reconciler(replicas, workers=1).run(shards, at("10:00"), at("11:00"))
    # THEN it repairs nothing: the twelve are MISSED by the policy, judged again from
    # consistent reads before any put; the outage has its one late fire, one id
    assert total(results, Finding.MISSED) == 12
    assert total(results, Finding.MISSING) == 0
    assert sum(r.report.repaired_fired for r in results) == 0
    assert late_fires(aws) == [at("11:00")]
