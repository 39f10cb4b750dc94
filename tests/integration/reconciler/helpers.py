"""Shared steps of the reconciler's integration tests. They give the instants of the test day,
tick a healthy materializer up to an instant, read the occurrences stored, run the reconciler
and count what it found, plant occurrences that no planner made, forget a schedule's missed
episodes, and read the metrics a handler printed. Other integration test modules import them
too."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from punctual.dal.common import to_dynamo
from punctual.dal.tables import current_key, occurrence_key
from punctual.domain.findings import Finding
from punctual.domain.ids import occurrence_id, shard_of
from punctual.pipeline.materializer import Materializer
from punctual.pipeline.reconciler import Reconciler, ShardResult
from punctual.services import Services
from tests.instants import epoch
from tests.integration.conftest import Clock
from tests.integration.helpers import table_items

DAY = "2026-11-19"  # after the fixtures' tenants exist (START is 2026-11-18T11:06:40Z)


def at(hhmm: str, day: str = DAY) -> int:
    return epoch(f"{day}T{hhmm}Z")


def shards_of(aws: Services, ids: Iterable[str]) -> list[int]:
    return sorted({shard_of(sid, aws.settings.shard_count) for sid in ids})


def materialize_until(
    aws: Services,
    clock: Clock,
    until: int,
    shards: list[int],
    *,
    every: int = 300,
    skip: Callable[[str, int], bool] | None = None,
) -> None:
    """The healthy materializer: a tick every ``every`` seconds on each shard up to ``until``."""
    while clock.now <= until:
        for shard in shards:
            Materializer(aws, f"m{clock.now}", skip=skip).run_shard(int(clock.now), shard)
        clock.advance(every)


def stored(aws: Services, *, since: int = 0, until: int = 2**40) -> list[dict[str, Any]]:
    """Every occurrence item (not attempts) scheduled in [since, until)."""
    items = [
        i
        for i in table_items(aws, aws.settings.occurrences_table)
        if i["sk"]["S"].startswith("OCC#")
    ]
    found = [
        {
            "occurrence_id": i["occurrence_id"]["S"],
            "schedule_id": i["schedule_id"]["S"],
            "schedule_version": int(i["schedule_version"]["N"]),
            "scheduled_for": int(i["scheduled_for"]["N"]),
            "available_at": int(i["available_at"]["N"]),
            "state": i["state"]["S"],
            "lane": i.get("lane", {}).get("S"),
        }
        for i in items
    ]
    return sorted(
        (o for o in found if since <= o["scheduled_for"] < until),
        key=lambda o: (o["scheduled_for"], o["schedule_id"]),
    )


def reconcile(
    aws: Services, start: int, end: int, *, repair: bool = True, shards: list[int] | None = None
) -> list[ShardResult]:
    every = list(range(aws.settings.shard_count)) if shards is None else shards
    return Reconciler(aws, repair=repair, workers=4).run(every, start, end)


def total(results: list[ShardResult], finding: Finding) -> int:
    return sum(r.report.counts[finding] for r in results)


def ids(results: list[ShardResult], name: str) -> set[str]:
    return {oid for r in results for oid in getattr(r, name)}


def plant(aws: Services, sid: str, version: int, instant: int, *, local: str = "") -> str:
    """Store an occurrence of ``version`` at ``instant`` that no planner made (SCHEDULED,
    showing the wall time ``local`` when given): its id."""
    oid = occurrence_id(sid, version, instant)
    aws.dynamodb.put_item(
        TableName=aws.settings.occurrences_table,
        Item={
            **to_dynamo(occurrence_key(oid)),
            "occurrence_id": {"S": oid},
            **({"local": {"S": local}} if local else {}),
            "schedule_version": {"N": str(version)},
            "scheduled_for": {"N": str(instant)},
            "available_at": {"N": str(instant)},
            "tenant_id": {"S": "alice"},
            "target": {"S": "default"},
            "state": {"S": "SCHEDULED"},
        },
    )
    return oid


def forget_missed_episodes(aws: Services, schedule_id: str) -> None:
    """Drop the schedule's MISSED episodes (only the latest few are kept)."""
    aws.dynamodb.update_item(
        TableName=aws.settings.schedules_table,
        Key=to_dynamo(current_key(schedule_id)),
        UpdateExpression="SET missed_ranges = :none",
        ExpressionAttributeValues={":none": {"L": []}},
    )


def _emitted_metrics(output: str) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for line in output.splitlines():
        if '"_aws"' not in line:
            continue
        blob = json.loads(line)
        for directive in blob["_aws"]["CloudWatchMetrics"]:
            assert directive["Namespace"] == "Punctual"
            assert directive["Dimensions"] == [["service"]]  # no per-tenant dimension
            for metric in directive["Metrics"]:
                value = blob[metric["Name"]]
                metrics[metric["Name"]] = sum(value) if isinstance(value, list) else value
    return metrics
