"""What a worker runs with, built without the server: its AWS clients, the settings of the
deployment it works for (table names, queue prefix: the ``PUNCTUAL_*`` environment, as the
functions read it), the clock, and the stores the run protocol needs.

``WorkerServices`` is what the worker asks for. ``WorkerClients`` builds it in a tenant's
process (``punctual worker``, a tenant's own Lambda); the server's wiring
(``punctual.services.Services``) has the same members, so the tests and the local stack
hand theirs in."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from punctual.backoff import Sleep
from punctual.clients import aws_client
from punctual.dal.common import BadItems, Dynamo
from punctual.dal.tenants import TenantStore
from punctual.settings import Settings, get_settings

Clock = Callable[[], float]


class WorkerServices(Protocol):
    """The clients, settings and clock a worker runs with, and the stores over them."""

    @property
    def sqs(self) -> Any: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def now(self) -> Clock: ...

    @property
    def sleep(self) -> Sleep: ...

    @property
    def bad_items(self) -> BadItems: ...

    @property
    def db(self) -> Dynamo: ...

    @property
    def tenants(self) -> TenantStore: ...


@dataclass(frozen=True, slots=True)
class WorkerClients:
    """A tenant's worker process's own wiring: clients from the standard AWS chain (the
    worker role's credentials), settings from the environment. ``bad_items`` counts the
    items its reads skipped as unreadable."""

    dynamodb: Any
    sqs: Any
    settings: Settings
    now: Clock = time.time
    sleep: Sleep = time.sleep
    bad_items: BadItems = field(default_factory=BadItems)

    @classmethod
    def from_environment(cls) -> WorkerClients:
        return cls(dynamodb=aws_client("dynamodb"), sqs=aws_client("sqs"), settings=get_settings())

    @property
    def db(self) -> Dynamo:
        """The DynamoDB client as the stores use it: every call translated, retries paused
        by ``sleep``."""
        return Dynamo(self.dynamodb, self.sleep)

    @property
    def tenants(self) -> TenantStore:
        return TenantStore(self.db, self.settings.tenants_table)
