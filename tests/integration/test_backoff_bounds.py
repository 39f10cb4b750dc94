"""Every retry loop is bounded and backs off (punctual.backoff): a fault that lasts turns
into a Retryable answer, never a hung invocation or a stream of calls at once."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.control.tenant_admin import GRANT
from punctual.dal.common import UNPROCESSED
from punctual.domain.errors import Retryable
from punctual.domain.tenancy import Quotas
from punctual.services import Services
from tests.fakes import as_client
from tests.integration.conftest import Clock


def test_granting_is_bounded_when_binds_keep_changing_the_principals(
    aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a tenant whose principals change at every read (binds that never settle)
    paused: list[float] = []
    plane = ControlPlane(dataclasses.replace(aws, sleep=paused.append))
    plane.create_tenant("acme", Quotas())
    reads = itertools.count()
    calls = itertools.count(1)
    real = plane.tenants.get

    def changing(tenant_id: str) -> Any:
        # (one read by the bind itself, then one a round: a read past those is an unbounded
        # loop, failed here instead of hung)
        if next(calls) > GRANT.tries + 1:
            raise AssertionError(f"the tenant was read more than {GRANT.tries + 1} times")
        tenant = real(tenant_id)
        return tenant.model_copy(update={"principals": [f"arn:aws:iam::1:user/u{next(reads)}"]})

    monkeypatch.setattr(plane.tenants, "get", changing)
    # WHEN a principal is bound; THEN it gives up after GRANT's rounds, retryable (503),
    # pausing between them
    with pytest.raises(Retryable):
        plane.bind_principal("arn:aws:iam::111122223333:user/x", "acme")
    assert len(paused) == GRANT.tries - 1


def test_a_workers_read_left_unprocessed_every_time_is_retryable_after_bounded_asks(
    aws: Services,
):
    # GIVEN DynamoDB leaving the claim's read unprocessed every time (throttled keys)
    from punctual.dal.runs import RunStore

    asks: list[int] = []
    paused: list[float] = []

    class Throttled:
        def batch_get_item(self, RequestItems: dict[str, Any]) -> Any:
            # (past one ask more than the bound: an unbounded loop, failed instead of hung)
            if len(asks) > UNPROCESSED.tries:
                raise AssertionError(f"asked more than {UNPROCESSED.tries + 1} times")
            asks.append(1)
            return {"Responses": {}, "UnprocessedKeys": RequestItems}

    from punctual.dal.common import Dynamo

    store = RunStore(Dynamo(as_client(Throttled()), paused.append), aws.settings)
    # WHEN a worker reads an occurrence before its claim; THEN it is Retryable after
    # UNPROCESSED's tries (the message comes back later), each ask after a pause
    with pytest.raises(Retryable):
        store.read("occ_sch_alice.x_1795000000_1", "sch_alice.x")
    assert len(asks) == UNPROCESSED.tries
    assert len(paused) == UNPROCESSED.tries - 1
