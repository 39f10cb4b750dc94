"""What a worker's run costs in write units, counted on the worker's real calls and held to
the cost model `make capacity` prices (issue 21). Apart from test_worker.py, which `make
mutate` runs in a workspace without scripts/."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from punctual.services import Services
from punctual_client.worker import Outcome
from scripts.capacity.cost import worker_ops
from tests.integration.conftest import ALICE, Clock, bootstrap
from tests.integration.test_worker import rate_schedule, receive, relay, worker


class CountedWrites:
    """The client, counting the write units each write costs by DynamoDB's rules for items
    up to 1 KB (a run's are): 2 per action of a transaction (a condition check included),
    1 per single write. (DynamoDB Local's ConsumedCapacity for a transaction is per table,
    not per action: it undercounts.)"""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.units: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if name == "transact_write_items":

            def transaction(**request: Any) -> Any:
                for action in request["TransactItems"]:
                    (kind, body), *_ = action.items()
                    self.units[f"{kind} {body['TableName'].rsplit('-', 1)[-1]}"] += 2
                return attribute(**request)

            return transaction
        if name in ("put_item", "update_item", "delete_item"):

            def single(**request: Any) -> Any:
                self.units[f"{name} {request['TableName'].rsplit('-', 1)[-1]}"] += 1
                return attribute(**request)

            return single
        assert name != "batch_write_item", "count its items too"
        return attribute


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
    # 13 today, 6 the goal): a change to the worker's writes changes this count, and the
    # cost model (scripts/capacity/cost.py, worker_ops) must change with it
    priced = sum(op.units for op in worker_ops())
    assert sum(metered.units.values()) == priced == 13, metered.units
