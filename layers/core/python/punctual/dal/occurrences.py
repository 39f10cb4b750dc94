"""The occurrences table: occurrence items and their attempts, listable per schedule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from punctual.dal.common import (
    ConditionFailed,
    Item,
    batch_get,
    decode_token,
    encode_token,
    from_dynamo,
    to_dynamo,
    translated,
    values,
)
from punctual.dal.tables import (
    OCCURRENCE_PREFIX,
    OCCURRENCES,
    TRIGGER_PREFIX,
    occurrence_key,
    occurrence_sk,
)
from punctual.models import Attempt, Occurrence, OccurrenceState

_OPEN = (
    OccurrenceState.SCHEDULED,
    OccurrenceState.RUNNING,
    OccurrenceState.RETRY_WAIT,
)
_LAST = 10**12 - 1  # the largest scheduled_for (and version) a fixed-width sk holds


def occurrence_to_item(occurrence: Occurrence, payload: dict[str, Any]) -> Item:
    """The payload is copied in: the relay then sends without reading the schedule."""
    return {
        "sk": occurrence_key(occurrence.occurrence_id)["sk"],
        **occurrence.model_dump(),
        "payload": payload,
    }


@dataclass(frozen=True, slots=True)
class StoredOccurrence:
    """An occurrence item as the store hands it out to what sends its message: the
    occurrence, its payload, and when a retry is due (RETRY_WAIT)."""

    occurrence: Occurrence
    payload: dict[str, Any]
    retry_at: int | None = None


def occurrence_from_item(item: Item) -> Occurrence:
    return Occurrence(**{k: v for k, v in item.items() if k in Occurrence.model_fields})


def stored_occurrence(item: Item) -> StoredOccurrence:
    retry_at = item.get("retry_at")
    return StoredOccurrence(
        occurrence_from_item(item),
        item["payload"],  # (every occurrence item has one: {} when the schedule has none)
        int(retry_at) if retry_at is not None else None,
    )


def inserted_occurrence(record: dict[str, Any]) -> StoredOccurrence | None:
    """The occurrence a DynamoDB stream record inserted; None for any other record (a
    run-now tag, a modification, a removal)."""
    if record.get("eventName") != "INSERT":
        return None
    # The table's stream carries NEW_IMAGE (dal.tables, infra/data.py): an insert always
    # has its image, and an image its key.
    image = from_dynamo(record["dynamodb"]["NewImage"])
    if not image["sk"].startswith(OCCURRENCE_PREFIX):
        return None
    return stored_occurrence(image)


def attempt_from_item(occurrence_id: str, entry: Item) -> Attempt:
    """One entry of an occurrence's ``attempts`` history."""
    fields = {k: v for k, v in entry.items() if k in Attempt.model_fields}
    return Attempt(**fields, occurrence_id=occurrence_id)


def _occurrences(page: dict[str, Any]) -> list[Occurrence]:
    return [occurrence_from_item(from_dynamo(item)) for item in page["Items"]]


def _sk_range(since: int, until: int) -> tuple[str, str]:
    """The sort keys of the occurrence items with scheduled_for in [since, until]."""
    return (
        occurrence_sk(min(max(since, 0), _LAST), 0),
        occurrence_sk(min(until, _LAST), 10**10 - 1),
    )


def _between(schedule_id: str, since: int, until: int) -> dict[str, Any]:
    """Query arguments for the schedule's occurrence items with scheduled_for in [since, until]."""
    low, high = _sk_range(since, until)
    return {
        "KeyConditionExpression": "schedule_id = :s AND sk BETWEEN :a AND :b",
        "ExpressionAttributeValues": values(s=schedule_id, a=low, b=high),
    }


class OccurrenceStore:
    def __init__(self, client: Any, table: str) -> None:
        self._client = client
        self.table = table

    def put_new(self, occurrence: Occurrence, payload: dict[str, Any]) -> dict[str, Any]:
        """Transaction action; fails if the occurrence exists (then someone made it already)."""
        return {
            "Put": {
                "TableName": self.table,
                "Item": to_dynamo(occurrence_to_item(occurrence, payload)),
                # Race: the API and a materializer (or two materializers) planning the same
                # (schedule, version, instant); the deterministic id makes the second a no-op.
                "ConditionExpression": "attribute_not_exists(occurrence_id)",
            }
        }

    def put_trigger(
        self, schedule_id: str, tag: str, occurrence_id: str, expires_at: int
    ) -> dict[str, Any]:
        """Transaction action recording which occurrence a run-now request (its tag) made."""
        return {
            "Put": {
                "TableName": self.table,
                "Item": to_dynamo(
                    {
                        "schedule_id": schedule_id,
                        "sk": TRIGGER_PREFIX + tag,
                        "occurrence_id": occurrence_id,
                        "expires_at": expires_at,
                    }
                ),
                # Race: the same request twice at once (a client's retry, or two clients
                # with one Idempotency-Key): the second must not make a second run.
                "ConditionExpression": "attribute_not_exists(sk)",
            }
        }

    def triggered(self, schedule_id: str, tag: str) -> tuple[str, Occurrence | None] | None:
        """The id of the occurrence a run-now request with this tag made, and the
        occurrence (None once it expired before its record); None if no request made one.
        Strongly consistent: a retry a moment after the first request must find its run."""
        found = self._client.get_item(
            TableName=self.table,
            Key=to_dynamo({"schedule_id": schedule_id, "sk": TRIGGER_PREFIX + tag}),
            ConsistentRead=True,
        ).get("Item")
        if not found:
            return None
        made = str(from_dynamo(found)["occurrence_id"])
        return made, self.get(made)

    def get_with_attempts(self, occurrence_id: str) -> tuple[Occurrence, list[Attempt]] | None:
        """The occurrence and its attempts, oldest first (its ``attempts`` history: the worker
        writes it with each claim and completion). Strongly consistent, like ``get``."""
        item = self._item(occurrence_id)
        if item is None:
            return None
        attempts = [attempt_from_item(occurrence_id, a) for a in item.get("attempts") or ()]
        return occurrence_from_item(item), attempts

    def list_for_schedule(
        self, schedule_id: str, *, since: int, until: int, limit: int, token: str | None
    ) -> tuple[list[Occurrence], str | None]:
        request: dict[str, Any] = {
            "TableName": self.table,
            **_between(schedule_id, since, until),
            "Limit": limit,
        }
        start = decode_token(
            token,
            expect={"schedule_id": schedule_id},
            keys=OCCURRENCES.page_key(),
            sk_within=_sk_range(since, until),
        )
        if start:
            request["ExclusiveStartKey"] = start
        page = self._client.query(**request)
        return _occurrences(page), encode_token(page.get("LastEvaluatedKey"))

    def _query_all(self, **request: Any) -> list[Occurrence]:
        pages = self._client.get_paginator("query").paginate(TableName=self.table, **request)
        return [o for page in pages for o in _occurrences(page)]

    def in_window(
        self, schedule_id: str, *, since: int, until: int, consistent: bool = False
    ) -> list[Occurrence]:
        """Every occurrence of the schedule (any version, any state) with ``scheduled_for``
        in [since, until], all pages; ``consistent`` for a caller that must see one written
        a moment ago."""
        return self._query_all(**_between(schedule_id, since, until), ConsistentRead=consistent)

    def first_after(self, schedule_id: str, *, after: int, limit: int) -> list[Occurrence]:
        """Up to ``limit`` of the schedule's occurrences scheduled after ``after``, earliest
        first (one page)."""
        page = self._client.query(
            TableName=self.table, **_between(schedule_id, after + 1, _LAST), Limit=limit
        )
        return _occurrences(page)

    def get(self, occurrence_id: str) -> Occurrence | None:
        item = self._item(occurrence_id)
        return occurrence_from_item(item) if item else None

    def _item(self, occurrence_id: str) -> Item | None:
        try:
            key = occurrence_key(occurrence_id)
        except ValueError:
            return None  # not an id we make: nothing by that name
        found = self._client.get_item(
            TableName=self.table, Key=to_dynamo(key), ConsistentRead=True
        ).get("Item")
        return from_dynamo(found) if found else None

    def stored(self, occurrence_ids: list[str]) -> list[StoredOccurrence]:
        """Those of ``occurrence_ids`` that exist, payload included. Strongly consistent: a
        decision to send one again needs its state as it is now (a worker may have just
        taken it)."""
        keys = [occurrence_key(i) for i in occurrence_ids]
        return [stored_occurrence(item) for item in batch_get(self._client, self.table, keys)]

    def open_for_schedule(self, schedule_id: str, *, since: int) -> list[Occurrence]:
        """Occurrences not yet finished, scheduled at or after ``since``. Strongly consistent:
        a change answers the real state of every occurrence it affects, including one the
        materializer wrote just before the change committed."""
        found = self._query_all(**_between(schedule_id, since, _LAST), ConsistentRead=True)
        return [o for o in found if o.state in _OPEN]

    def settle_scheduled(self, occurrence_id: str, state: OccurrenceState, reason: str) -> bool:
        """SCHEDULED -> ``state`` (CANCELED by a change, DEAD by the relay) with ``reason``;
        False if the occurrence had moved on."""
        try:
            with translated():
                self._client.update_item(
                    TableName=self.table,
                    Key=to_dynamo(occurrence_key(occurrence_id)),
                    UpdateExpression="SET #state = :to, reason = :why",
                    # Race: another writer moved it first (a worker's claim, a cancel, the
                    # relay finding it unsendable); its state stands, the caller is told.
                    ConditionExpression="#state = :scheduled",
                    ExpressionAttributeNames={"#state": "state"},
                    ExpressionAttributeValues=values(
                        to=state.value, scheduled=OccurrenceState.SCHEDULED.value, why=reason
                    ),
                )
        except ConditionFailed:
            return False
        return True

    def cancel_scheduled(self, occurrence_id: str, reason: str) -> dict[str, Any]:
        """Transaction action: SCHEDULED -> CANCELED with ``reason``."""
        return {
            "Update": {
                "TableName": self.table,
                "Key": to_dynamo(occurrence_key(occurrence_id)),
                "UpdateExpression": "SET #state = :to, reason = :why",
                # Race: a worker took it since it was read (RUNNING): it runs as planned,
                # and the caller reads again before deciding anything about it.
                "ConditionExpression": "#state = :scheduled",
                "ExpressionAttributeNames": {"#state": "state"},
                "ExpressionAttributeValues": values(
                    to=OccurrenceState.CANCELED.value,
                    scheduled=OccurrenceState.SCHEDULED.value,
                    why=reason,
                ),
            }
        }

    def cancel_if_scheduled(self, occurrence_id: str, reason: str) -> OccurrenceState:
        """SCHEDULED -> CANCELED; answers the state the occurrence really ends up in."""
        if self.settle_scheduled(occurrence_id, OccurrenceState.CANCELED, reason):
            return OccurrenceState.CANCELED
        found = self.get(occurrence_id)
        assert found is not None  # occurrences are never deleted while open
        return found.state
