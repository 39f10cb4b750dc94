"""`punctual local up`: the whole system on one machine, the same handler code.

Engines (own processes): DynamoDB Local and moto's SQS. Drivers (threads here): the
HTTP gateway (API Gateway), the ticker (EventBridge + the Step Functions Map over shard
groups), the stream poller (the relay's event source mapping) and the reconciler on its
schedule. Everything AWS would keep lives in the engines, so a crash of this process
loses nothing: `local up` again reattaches and carries on from the watermarks.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from punctual.local.engines import ACCOUNT, LOCAL_SHARDS, Engines, ensure_engines
from punctual.local.gateway import Gateway, LambdaContext
from punctual.local.streams import StreamPoller
from punctual.observability import logger
from punctual.timing import utc_text

REPO = Path(__file__).resolve().parents[5]
DATA = REPO / ".data"
OPERATOR_KEY = "operator"
DEMO_KEY = "demo"
DEMO_TENANT = "demo"
GROUP_SIZE = 4


def local_principal(access_key_id: str) -> str:
    return f"arn:aws:iam::{ACCOUNT}:user/{access_key_id}"


@dataclass
class StackOptions:
    port: int = 8766
    data: Path = DATA
    tick_seconds: int = 60
    lookahead_seconds: int = 180
    reconcile_seconds: int = 3600
    poll_seconds: float = 0.5
    dynamodb_port: int | None = None
    sqs_port: int | None = None


def _handler(module: str) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """A Lambda handler from functions/, imported as Lambda imports it."""
    functions = str(REPO / "functions")
    if functions not in sys.path:
        sys.path.insert(0, functions)
    return importlib.import_module(module).lambda_handler  # type: ignore[no-any-return]


def configure_environment(engines: Engines, options: StackOptions) -> None:
    """Point boto3 and the handlers at the engines, as the CDK stack's env vars do on AWS."""
    os.environ.update(engines.environment())
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")
    os.environ.update(
        {
            "PUNCTUAL_SHARD_COUNT": str(LOCAL_SHARDS),
            "PUNCTUAL_TICK_SECONDS": str(options.tick_seconds),
            "PUNCTUAL_LOOKAHEAD_SECONDS": str(options.lookahead_seconds),
            "PUNCTUAL_OPERATOR_PRINCIPALS": local_principal(OPERATOR_KEY),
            "POWERTOOLS_SERVICE_NAME": "punctual",
            "POWERTOOLS_METRICS_NAMESPACE": "Punctual",
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_METRICS_DISABLED": "true",
            "POWERTOOLS_LOG_LEVEL": os.environ.get("POWERTOOLS_LOG_LEVEL", "WARNING"),
        }
    )
    logger.setLevel(os.environ["POWERTOOLS_LOG_LEVEL"])  # created before the variable was set


def bootstrap(services: Any) -> None:
    """Tables, the operator's tenant-free principal, and the demo tenant with `default`."""
    from punctual.dal.common import from_dynamo, values
    from punctual.dal.tables import create_tables
    from punctual.dal.tenants import target_from_item
    from punctual.errors import Conflict
    from punctual.scheduling import ControlPlane
    from punctual.tenancy import Quotas

    create_tables(services.dynamodb, services.settings)
    plane = ControlPlane(services)
    with contextlib.suppress(Conflict):
        plane.create_tenant(DEMO_TENANT, Quotas())
    plane.bind_principal(local_principal(DEMO_KEY), DEMO_TENANT)
    with contextlib.suppress(Conflict):  # a restart on the same data
        plane.create_target(DEMO_TENANT, "default")
    # An SQS engine restarted without its data: re-create every known target's queues
    # (a scan: the local tenants table is small, and this runs once per start).
    pages = services.dynamodb.get_paginator("scan").paginate(
        TableName=services.settings.tenants_table,
        FilterExpression="begins_with(sk, :t)",
        ExpressionAttributeValues=values(t="TARGET#"),
    )
    for page in pages:
        for item in page["Items"]:
            target = target_from_item(from_dynamo(item))
            plane.queues.create(
                target.tenant_id, target.name, plane.tenants.get(target.tenant_id).principals
            )


@dataclass
class LocalStack:
    options: StackOptions
    engines: Engines | None = None
    gateway: Gateway | None = None
    stop_event: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    ticks: int = 0

    def start(self) -> None:
        options = self.options
        self.engines = ensure_engines(
            options.data, dynamodb_port=options.dynamodb_port, sqs_port=options.sqs_port
        )
        configure_environment(self.engines, options)
        from punctual.scheduling import Services
        from punctual.settings import get_settings

        get_settings.cache_clear()
        services = Services.from_environment()
        bootstrap(services)
        self.gateway = Gateway(_handler("api.handler"), options.port, time.time)
        self.gateway.start()
        self._loop("ticker", self._tick, options.tick_seconds, aligned=True)
        poller = StreamPoller(
            services.dynamodb,
            _client("dynamodbstreams"),
            services.settings.occurrences_table,
            lambda event: _handler("relay.handler")(event, LambdaContext("relay", 60, time.time)),
            options.data / "streams.json",
        )
        self._loop("stream-poller", poller.poll_once, options.poll_seconds)
        if _has_reconciler():
            self._loop("reconciler", self._reconcile, options.reconcile_seconds, aligned=True)

    def _loop(
        self, name: str, work: Callable[[], Any], every: float, aligned: bool = False
    ) -> None:
        def run() -> None:
            while not self.stop_event.is_set():
                started = time.time()
                try:
                    work()
                except Exception:
                    logger.exception(f"{name} failed; it runs again next time")
                pause = (
                    every - (time.time() % every) if aligned else every - (time.time() - started)
                )
                self.stop_event.wait(max(0.05, pause))

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _groups(self) -> list[list[int]]:
        return [
            list(range(start, min(start + GROUP_SIZE, LOCAL_SHARDS)))
            for start in range(0, LOCAL_SHARDS, GROUP_SIZE)
        ]

    def _tick(self) -> None:
        """What EventBridge + the Map do each tick: one materializer call per shard group."""
        tick = utc_text(int(time.time()) // self.options.tick_seconds * self.options.tick_seconds)
        handler = _handler("materializer.handler")
        timeout = min(55, self.options.tick_seconds * 0.9)
        with ThreadPoolExecutor(max_workers=len(self._groups())) as pool:
            list(
                pool.map(
                    lambda shards: handler(
                        {"tick": tick, "shards": shards},
                        LambdaContext("materializer", timeout + 10, time.time),
                    ),
                    self._groups(),
                )
            )
        self.ticks += 1

    def _reconcile(self) -> None:
        handler = _handler("reconciler.handler")
        now = utc_text(int(time.time()))
        for shards in self._groups():
            handler({"time": now, "shards": shards}, LambdaContext("reconciler", 900, time.time))

    def stop(self, engines: bool = True) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout=70)
        if self.gateway is not None:
            self.gateway.stop()
        if engines and self.engines is not None:
            self.engines.stop()


def _has_reconciler() -> bool:
    return (REPO / "functions" / "reconciler" / "handler.py").exists()


def _client(service: str) -> Any:
    import boto3

    return boto3.client(service)
