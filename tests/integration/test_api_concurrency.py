"""Several tenants calling the API at once through the local gateway: every answer belongs to
its caller (the gateway gives the handler one event at a time, as Lambda does)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from api import handler

from punctual.services import Services
from punctual_client.http import Client
from punctual_local.gateway import Gateway
from tests.integration.conftest import Clock, bootstrap
from tests.integration.helpers import cron

TENANTS = ("acme", "beta", "gamma", "delta")
CREATES = 5  # per tenant


@pytest.fixture
def gateway(aws: Services, clock: Clock) -> Iterator[Gateway]:
    for tenant in TENANTS:
        bootstrap(tenant, f"arn:aws:iam::000000000000:user/{tenant}")
    server = Gateway(handler.lambda_handler, 0, clock)
    server.start()
    yield server
    server.stop()


def _work(url: str, tenant: str, n: int) -> list[tuple[str, Any]]:
    """One caller's requests and what it got back: a create, its read, the tenant."""
    client = Client(url, access_key_id=tenant)
    saved = client.post("/v1/schedules", cron("*/5 * * * *", name=f"{tenant}-{n}"))
    read = client.get(f"/v1/schedules/{saved['schedule']['schedule_id']}")
    return [("created", saved), ("read", read), ("tenant", client.get("/v1/tenant"))]


def test_concurrent_tenants_each_get_their_own_answers(gateway: Gateway) -> None:
    # GIVEN four tenants
    # WHEN each makes five creates, reads and tenant lookups, all at once
    jobs = [(tenant, n) for n in range(CREATES) for tenant in TENANTS]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        results = list(pool.map(lambda job: _work(gateway.url, *job), jobs))

    # THEN every answer is the caller's own: its new schedule, that schedule, its tenant
    for (tenant, n), answers in zip(jobs, results, strict=True):
        created, read, own = (body for _, body in answers)
        assert created["schedule"]["name"] == f"{tenant}-{n}"
        assert created["schedule"]["version"] == 1
        assert read["schedule"] == created["schedule"]
        assert own["tenant_id"] == tenant
    # AND each tenant holds exactly its five schedules, each made once
    for tenant in TENANTS:
        client = Client(gateway.url, access_key_id=tenant)
        names = sorted(s["name"] for s in client.pages("/v1/schedules", "schedules"))
        assert names == sorted(f"{tenant}-{n}" for n in range(CREATES))
        assert client.get("/v1/tenant")["schedule_count"] == CREATES
