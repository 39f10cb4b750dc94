"""What every server component talks to (the AWS clients, the settings, the clock), and how
a Lambda handler gets it: built once per process from the environment, or handed in by a
test or the local stack.

A package of its own, as ``control``, ``pipeline`` and ``integrations`` are: what only the
server runs is outside the modules of ``punctual`` itself, which the punctual-core
distribution ships to the server and the client alike (docs/decisions.md, 2026-12-07)."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from punctual.backoff import Sleep
from punctual.clients import aws_client
from punctual.dal.common import BadItems, Dynamo, Transactions
from punctual.dal.leases import LeaseStore
from punctual.dal.ledger import LedgerStore
from punctual.dal.occurrences import OccurrenceStore
from punctual.dal.reports import ReportStore
from punctual.dal.schedules import ScheduleStore
from punctual.dal.tenants import TenantStore
from punctual.settings import Settings, get_settings
from punctual.skew import AnswerClock, Offset

Clock = Callable[[], float]
T = TypeVar("T")

# The cyclic garbage collector's thresholds while the materializer walks (Python's before
# 3.13: 700, 10, 10; since: 2,000, 10, 10). A Query page of 1 MB decodes into some 50,000
# dicts and lists that live while the page is walked: at 700 the collector ran over them
# (and over botocore's service models) again and again, a third of a step's CPU (docs/
# decisions.md, 2026-12-04).
COLLECTOR_THRESHOLDS = (20_000, 50, 100)


class Collector:
    """The process's garbage collector, run less often for the length of a materializer
    invocation (``tuned``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._before = gc.get_threshold()

    @contextmanager
    def tuned(self) -> Iterator[None]:
        """The collector at ``COLLECTOR_THRESHOLDS``, then as before, and a full collection:
        a cycle made meanwhile (an exception's traceback holding a page) does not outlive
        the invocation, however long its environment lives. Threads of one process (the
        local stack) share it: the first in sets the thresholds, the last out restores
        them and collects."""
        with self._lock:
            if self._users == 0:
                self._before = gc.get_threshold()
                gc.set_threshold(*COLLECTOR_THRESHOLDS)
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                last = self._users == 0
                if last:
                    gc.set_threshold(*self._before)
            if last:
                gc.collect()


COLLECTOR = Collector()


@dataclass(frozen=True, slots=True)
class Services:
    """The clients, settings and clock one process runs with; the stores over them. ``sleep``
    is how every retry loop pauses (punctual.backoff); ``bad_items`` counts the items its
    readers skipped as not Punctual's (a tenant's bad data)."""

    dynamodb: Any
    sqs: Any
    settings: Settings
    now: Clock
    sleep: Sleep = time.sleep
    bad_items: BadItems = field(default_factory=BadItems)
    # ``now`` against DynamoDB's clock (each answer's Date): the skew the component
    # publishes (docs/operations.md, *Clock skew*). None: one of its own, on ``now``.
    answers: AnswerClock | None = None

    def __post_init__(self) -> None:
        if self.answers is None:
            object.__setattr__(self, "answers", AnswerClock(self.now))

    def clock_offset(self) -> Offset | None:
        """DynamoDB's clock minus ``now``, as the answers so far bound it; None before one."""
        return self.answers.offset() if self.answers is not None else None

    @classmethod
    def from_environment(cls) -> Services:
        """The Lambda wiring: clients from the standard AWS chain, settings from env."""
        return cls(
            dynamodb=aws_client("dynamodb"),
            sqs=aws_client("sqs"),
            settings=get_settings(),
            now=time.time,
        )

    @property
    def db(self) -> Dynamo:
        """The DynamoDB client as the stores use it: every call translated, retries paused
        by ``sleep``."""
        return Dynamo(self.dynamodb, self.sleep, self.answers)

    @property
    def schedules(self) -> ScheduleStore:
        return ScheduleStore(self.db, self.settings.schedules_table)

    @property
    def occurrences(self) -> OccurrenceStore:
        return OccurrenceStore(self.db, self.settings.occurrences_table, self.bad_items)

    @property
    def tenants(self) -> TenantStore:
        return TenantStore(self.db, self.settings.tenants_table)

    @property
    def leases(self) -> LeaseStore:
        return LeaseStore(self.db, self.settings.leases_table)

    @property
    def reports(self) -> ReportStore:
        return ReportStore(self.db, self.settings.leases_table)

    @property
    def ledger(self) -> LedgerStore:
        return LedgerStore(self.db, self.settings.ledger_table, self.bad_items)

    @property
    def transactions(self) -> Transactions:
        """Commits what several stores built, as one transaction."""
        return Transactions(self.db)


class Wiring:
    """A handler module's services, the same way in all of them: built from the
    environment on first use, so a Lambda container reuses its clients (and their
    connections) across invocations; or the ones a test or the local stack configured.
    What a handler builds from them (``built``) is kept alongside and dropped with them."""

    def __init__(self) -> None:
        self._services: Services | None = None
        self._built: dict[Callable[[Services], Any], Any] = {}
        self._lock = threading.Lock()  # the local stack calls a handler from several threads

    def configure(self, services: Services | None) -> None:
        """Use these services; None: build them from the environment on next use."""
        with self._lock:
            self._services = services
            self._built.clear()

    def services(self) -> Services:
        with self._lock:
            if self._services is None:
                self._services = Services.from_environment()
            return self._services

    def built(self, factory: Callable[[Services], T]) -> T:
        """``factory(services)``, made once per configuration."""
        services = self.services()
        with self._lock:
            if factory not in self._built:
                self._built[factory] = factory(services)
            return cast(T, self._built[factory])
