"""What a worker's run costs in write units, counted on the worker's real calls and held to
the cost model `make capacity` prices (issue 21). Apart from the tests in worker/, which
`make mutate` runs in a workspace without scripts/."""

from __future__ import annotations

import dataclasses

from punctual.services import Services
from punctual_client.worker import Outcome
from scripts.capacity.cost import worker_ops
from tests.integration.conftest import ALICE, Clock, bootstrap
from tests.integration.helpers import CountedWrites
from tests.integration.worker.helpers import rate_schedule, receive, relay, worker


def test_worker_a_successful_run_writes_the_units_the_cost_model_prices(
    local_aws: Services, clock: Clock
):
    # GIVEN DynamoDB Local and one due occurrence in alice's queue
    aws = local_aws
    bootstrap("alice", ALICE)
    _, occurrences = rate_schedule(aws, "rate(1 minute)")
    clock.advance(60)
    relay(aws, occurrences[0])
    (delivery,) = receive(aws)
    # WHEN a worker runs it to success, its writes counted
    metered = CountedWrites(aws.dynamodb)
    result = worker(dataclasses.replace(aws, dynamodb=metered), lambda job: None).process(delivery)
    assert result.outcome is Outcome.SUCCEEDED
    # THEN it wrote the write units `make capacity` prices for a successful run (issue 21:
    # 13 before the attempt history moved onto the occurrence, 6 the goal): the claim's
    # transaction (the occurrence and the concurrency slot, 2 each), the completion and the
    # slot's release (1 each). A change to the worker's writes changes this count, and the
    # cost model (scripts/capacity/cost.py, worker_ops) must change with it
    priced = sum(op.units for op in worker_ops())
    assert sum(metered.units.values()) == priced == 6, metered.units
    assert metered.units == {
        "Update occurrences_table": 2,
        "Update tenants_table": 2,
        "update_item occurrences_table": 1,
        "update_item tenants_table": 1,
    }
