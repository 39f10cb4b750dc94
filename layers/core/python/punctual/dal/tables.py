"""Table and index definitions: one source for the CDK stack, the local stack and tests."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from punctual.domain.ids import MANUAL_MARK, occurrence_name
from punctual.settings import Settings

SCHEDULE_CURRENT = "CURRENT"
OCCURRENCE_PREFIX = "OCC#"  # sk of an occurrence item: OCC#<scheduled_for>#<version>
# A manual occurrence (run now) has ".m<tag>" after the version in both (punctual.domain.ids);
# TRG#<tag> records which occurrence a run-now request made (its Idempotency-Key's tag).
TRIGGER_PREFIX = "TRG#"
# BKF#<made_at>#<since>#<until>: a backfill made at ``made_at`` occurrences of fires in
# [since, until) (punctual.control.plane): the reconciler's check of the hour it was made in
# reads them, whatever hours their instants are in (``OccurrenceStore.backfilled``).
BACKFILL_PREFIX = "BKF#"

DUE_INDEX = "due"  # due_bucket ("YYYYMMDDHHMM#SSSS") -> due_at: only ACTIVE schedules
TENANT_INDEX = "by_tenant"  # tenant_id -> created_key: current schedule items only
SHARD_INDEX = "by_shard"  # shard -> created_key: current schedule items, stable attributes only

# What the reconciler reads per shard. Only attributes that change with a new version (or at
# completion, or on a misfire) are projected: the materializer's cursor writes on every step
# (next_run_at, due_at, ...) then never touch this index (docs/decisions.md, 2026-11-30).
SHARD_INDEX_ATTRIBUTES = (
    "tenant_id",
    "version",
    "state",
    "definition",
    "created_at",
    "updated_at",
    "missed_total",
    "missed_ranges",
    # Multi-region: the reconciler leaves another region's schedules alone without a read.
    "home_region",
    "generation",
    "homed_since",
    # Time zone rules: the reconciler re-plans a schedule planned under an older release.
    "tzdata",
    # The latest run now's instant, re-plan's old cursor or backfill's time: the reconciler
    # skips the occurrence query of a schedule owning no fire in an hour, and the query of
    # its backfill records, only after it.
    "manual_through",
)


@dataclass(frozen=True)
class Index:
    name: str
    pk: tuple[str, str]  # (attribute, type S|N)
    sk: tuple[str, str]
    # None: every attribute (ALL); () only the keys (KEYS_ONLY); otherwise the non-key
    # attributes projected (INCLUDE). An index is written only when an update changes a
    # projected attribute, so narrow projections keep frequent updates off the index.
    include: tuple[str, ...] | None = None

    @property
    def projection(self) -> str:
        if self.include is None:
            return "ALL"
        return "INCLUDE" if self.include else "KEYS_ONLY"


@dataclass(frozen=True)
class TableSpec:
    setting: str  # the Settings attribute holding the table name
    pk: tuple[str, str]
    sk: tuple[str, str] | None = None
    indexes: tuple[Index, ...] = ()
    stream: bool = False
    ttl_attribute: str | None = None
    attributes: dict[str, str] = field(default_factory=dict)

    def name(self, settings: Settings) -> str:
        return str(getattr(settings, self.setting))

    def page_key(self, index_name: str | None = None) -> frozenset[str]:
        """The attributes of a LastEvaluatedKey from a query on this index (or the table)."""
        keys = [self.pk] + ([self.sk] if self.sk else [])
        if index_name is not None:
            index = next(i for i in self.indexes if i.name == index_name)
            keys += [index.pk, index.sk]
        return frozenset(name for name, _ in keys)

    def create_request(self, settings: Settings) -> dict[str, Any]:
        """Arguments for DynamoDB CreateTable (on-demand)."""
        keys = [self.pk] + ([self.sk] if self.sk else [])
        for index in self.indexes:
            keys += [index.pk, index.sk]
        request: dict[str, Any] = {
            "TableName": self.name(settings),
            "BillingMode": "PAY_PER_REQUEST",
            "AttributeDefinitions": [
                {"AttributeName": name, "AttributeType": kind} for name, kind in dict(keys).items()
            ],
            "KeySchema": _key_schema(self.pk, self.sk),
        }
        if self.indexes:
            request["GlobalSecondaryIndexes"] = [
                {
                    "IndexName": index.name,
                    "KeySchema": _key_schema(index.pk, index.sk),
                    "Projection": _projection(index),
                }
                for index in self.indexes
            ]
        if self.stream:
            request["StreamSpecification"] = {
                "StreamEnabled": True,
                "StreamViewType": "NEW_IMAGE",
            }
        return request


def _projection(index: Index) -> dict[str, Any]:
    if index.include:
        return {"ProjectionType": "INCLUDE", "NonKeyAttributes": list(index.include)}
    return {"ProjectionType": index.projection}


def _key_schema(pk: tuple[str, str], sk: tuple[str, str] | None) -> list[dict[str, str]]:
    schema = [{"AttributeName": pk[0], "KeyType": "HASH"}]
    if sk:
        schema.append({"AttributeName": sk[0], "KeyType": "RANGE"})
    return schema


SCHEDULES = TableSpec(
    setting="schedules_table",
    pk=("schedule_id", "S"),
    sk=("sk", "S"),  # "CURRENT" or "V#0000000007" (version history)
    indexes=(
        Index(DUE_INDEX, ("due_bucket", "S"), ("due_at", "N")),
        # Only the state (the list's filter): the cursor moves on every step and must not
        # write this index; a page of keys is then read from the table (docs/capacity.md).
        Index(TENANT_INDEX, ("tenant_id", "S"), ("created_key", "S"), include=("state",)),
        Index(SHARD_INDEX, ("shard", "N"), ("created_key", "S"), include=SHARD_INDEX_ATTRIBUTES),
    ),
)
OCCURRENCES = TableSpec(
    setting="occurrences_table",
    # Keyed by schedule: "a schedule's occurrences by time" is a Query on the table, so an
    # occurrence costs no index write (docs/data-model.md, docs/decisions.md 2026-11-30).
    pk=("schedule_id", "S"),
    sk=("sk", "S"),  # OCC#<scheduled_for>#<version>, or TRG#<tag> (a run-now request's record)
    # The occurrence INSERT is the outbox event the relay reads (docs/data-model.md).
    stream=True,
    ttl_attribute="expires_at",
)


def occurrence_sk(scheduled_for: int, version: int, manual: str | None = None) -> str:
    """Fixed width, so the sort order is (scheduled_for, version); a manual occurrence's
    (run now) sorts right after the fire of the same instant and version, if any."""
    suffix = "" if manual is None else MANUAL_MARK + manual
    return f"{OCCURRENCE_PREFIX}{scheduled_for:012d}#{version:010d}{suffix}"


def backfill_sk(made_at: int, since: int, until: int) -> str:
    """Fixed width, so a Query by sort key finds the backfills made in a range of time."""
    return f"{BACKFILL_PREFIX}{made_at:012d}#{since:012d}#{until:012d}"


def current_key(schedule_id: str) -> dict[str, str]:
    """The key of a schedule's CURRENT item (the worker's claim reads and checks it too)."""
    return {"schedule_id": schedule_id, "sk": SCHEDULE_CURRENT}


def occurrence_key(occurrence_id: str) -> dict[str, str]:
    """The item key an occurrence id names; ValueError if it is not an occurrence id."""
    schedule_id, version, scheduled_for, manual = occurrence_name(occurrence_id)
    return {"schedule_id": schedule_id, "sk": occurrence_sk(scheduled_for, version, manual)}


TENANTS = TableSpec(setting="tenants_table", pk=("pk", "S"), sk=("sk", "S"))
# Shard leases and watermarks (never expire), and reconciler reports (expire at purge_at).
LEASES = TableSpec(setting="leases_table", pk=("pk", "S"), ttl_attribute="purge_at")
IDEMPOTENCY = TableSpec(setting="idempotency_table", pk=("id", "S"), ttl_attribute="expiration")
# The reconciler's pages of each tenant's hours (punctual.dal.ledger), kept for the occurrence
# retention. Regional, as the occurrences it describes (docs/multi-region.md).
LEDGER = TableSpec(setting="ledger_table", pk=("pk", "S"), sk=("sk", "S"), ttl_attribute="purge_at")

ALL_TABLES = (SCHEDULES, OCCURRENCES, TENANTS, LEASES, IDEMPOTENCY, LEDGER)


class SchemaMismatch(ValueError):
    """A table exists with another key schema (a local data folder from an older version)."""


def create_tables(client: Any, settings: Settings) -> None:
    """Create every table that does not exist yet (tests, benches, and the local stack on a
    fresh or a persisted data folder; AWS gets them from CDK). An existing table with other
    keys is refused with SchemaMismatch rather than failing later on its first write; one
    whose index projects other attributes gets that index rebuilt, as a deploy replaces it
    (``_rebuild_changed_indexes``)."""
    pages = client.get_paginator("list_tables").paginate()
    existing = {name for page in pages for name in page["TableNames"]}
    for spec in ALL_TABLES:
        name = spec.name(settings)
        if name in existing:
            found = client.describe_table(TableName=name)["Table"]["KeySchema"]
            wanted = spec.create_request(settings)["KeySchema"]
            if found != wanted:
                raise SchemaMismatch(
                    f"table {name} has keys {_keys_text(found)}, this version needs "
                    f"{_keys_text(wanted)}: it was made by an older Punctual; start on a new "
                    "data folder (or delete the old one)"
                )
            _rebuild_changed_indexes(client, spec, settings)
            continue
        client.create_table(**spec.create_request(settings))
        if spec.ttl_attribute:
            client.update_time_to_live(
                TableName=spec.name(settings),
                TimeToLiveSpecification={"Enabled": True, "AttributeName": spec.ttl_attribute},
            )


INDEX_WAIT_SECONDS = 120


def _rebuild_changed_indexes(client: Any, spec: TableSpec, settings: Settings) -> None:
    """An index made by an older Punctual with another projection (a data folder kept
    across an upgrade) is deleted and made again, and DynamoDB fills it from the table: a
    reader of an attribute added to the projection (the reconciler's ``manual_through``)
    would otherwise read it as absent, without an error."""
    name = spec.name(settings)
    request = spec.create_request(settings)
    wanted = {i["IndexName"]: i for i in request.get("GlobalSecondaryIndexes", [])}
    table = client.describe_table(TableName=name)["Table"]
    found = {i["IndexName"]: i for i in table.get("GlobalSecondaryIndexes", [])}
    for index_name, index in wanted.items():
        old = found.get(index_name)
        if old is not None and _same_projection(old["Projection"], index["Projection"]):
            continue
        if old is not None:
            client.update_table(
                TableName=name, GlobalSecondaryIndexUpdates=[{"Delete": {"IndexName": index_name}}]
            )
            _wait_for_index(client, name, index_name, present=False)
        client.update_table(
            TableName=name,
            AttributeDefinitions=request["AttributeDefinitions"],
            GlobalSecondaryIndexUpdates=[{"Create": index}],
        )
        _wait_for_index(client, name, index_name, present=True)


def _same_projection(found: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return found.get("ProjectionType") == wanted["ProjectionType"] and sorted(
        found.get("NonKeyAttributes", [])
    ) == sorted(wanted.get("NonKeyAttributes", []))


def _wait_for_index(client: Any, table: str, index_name: str, *, present: bool) -> None:
    deadline = time.monotonic() + INDEX_WAIT_SECONDS
    while time.monotonic() < deadline:
        indexes = client.describe_table(TableName=table)["Table"].get("GlobalSecondaryIndexes", [])
        status = next((i.get("IndexStatus") for i in indexes if i["IndexName"] == index_name), None)
        if (status == "ACTIVE") if present else (status is None):
            return
        time.sleep(0.2)
    raise TimeoutError(f"index {index_name} of {table} did not become ready")


def _keys_text(schema: list[dict[str, str]]) -> str:
    return "(" + ", ".join(k["AttributeName"] for k in schema) + ")"
