"""Relay fairness: one tenant's top-of-hour batch next to another tenant's few strict
occurrences, in one stream batch, on moto (in process).

Prints when the small tenant's last message was accepted by SQS, with queues sent
in parallel (the relay's way) and one after another (the naive way), and the
big tenant's throughput. Run: ``make bench-relay``.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import boto3
from moto import mock_aws

from punctual.dal.common import to_dynamo
from punctual.dal.occurrences import occurrence_to_item
from punctual.dal.tables import create_tables
from punctual.dal.tenants import target_to_item
from punctual.domain.planning import new_occurrence
from punctual.domain.schedule import Schedule
from punctual.domain.tenancy import Target
from punctual.integrations.queues import QueueAdmin
from punctual.pipeline.relay import Relay
from punctual.services import Services
from punctual.settings import Settings


class TimedSQS:
    """Records when each occurrence's message was accepted."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.accepted: dict[str, float] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def send_message_batch(self, **request: Any) -> Any:
        answer = self.real.send_message_batch(**request)
        now = time.perf_counter()
        by_id = {e["Id"]: e for e in request["Entries"]}
        for ok in answer.get("Successful", []):
            attributes = by_id[ok["Id"]]["MessageAttributes"]
            self.accepted[attributes["occurrence_id"]["StringValue"]] = now
        return answer


def seed(services: Services, tenant: str, count: int, due: int) -> list[dict[str, Any]]:
    created = datetime.fromtimestamp(due - 3600, UTC)
    queues = QueueAdmin(services.sqs, "punctual").create(tenant, "default", [])
    target = Target(tenant_id=tenant, name="default", created_at=created, **asdict(queues))
    services.dynamodb.put_item(
        TableName=services.settings.tenants_table, Item=to_dynamo(target_to_item(target))
    )
    records: list[dict[str, Any]] = []
    for n in range(count):
        schedule = Schedule.model_validate(
            {
                "tenant_id": tenant,
                "schedule_id": f"sch_{tenant}_{n}",
                "version": 1,
                "spec": {"kind": "cron", "expression": "0 * * * *", "timezone": "UTC"},
                "target": "default",
                "created_at": created,
                "updated_at": created,
            }
        )
        item = to_dynamo(occurrence_to_item(new_occurrence(schedule, due, 86400), {}))
        services.dynamodb.put_item(TableName=services.settings.occurrences_table, Item=item)
        sequence = str(len(records) + 1)
        records.append(
            {"eventName": "INSERT", "dynamodb": {"NewImage": item, "SequenceNumber": sequence}}
        )
    return records


def run(big: int, small: int, workers: int) -> tuple[float, float, int]:
    with mock_aws():
        settings = Settings()
        due = int(datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp())
        sqs = TimedSQS(boto3.client("sqs", region_name="us-east-1"))
        services = Services(
            dynamodb=boto3.client("dynamodb", region_name="us-east-1"),
            sqs=sqs,
            settings=settings,
            now=lambda: due,
        )
        create_tables(services.dynamodb, settings)
        records = seed(services, "bigcorp", big, due) + seed(services, "smallco", small, due)
        started = time.perf_counter()
        report = Relay(services, workers=workers).relay(records)
        small_ids = {r["dynamodb"]["NewImage"]["occurrence_id"]["S"] for r in records[big:]}
        small_done = max(sqs.accepted[o] for o in small_ids)
        return small_done - started, time.perf_counter() - started, report.sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--big", type=int, default=1000)
    parser.add_argument("--small", type=int, default=10)
    args = parser.parse_args()
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    print(f"one stream batch: {args.big:,} occurrences of bigcorp, {args.small} of smallco")
    for label, workers in (("queues in parallel (relay)", 8), ("queues one by one (naive)", 1)):
        small, total, sent = run(args.big, args.small, workers)
        print(
            f"{label:28} smallco's last message accepted after {small * 1000:8.1f} ms; "
            f"all {sent:,} sent in {total:6.2f} s ({sent / total:,.0f}/s)"
        )


if __name__ == "__main__":
    main()
