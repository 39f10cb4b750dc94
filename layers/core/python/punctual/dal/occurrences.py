"""The occurrences table: occurrence items and their attempts, listable per schedule."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from punctual.dal.common import (
    UNPARSABLE,
    BadItems,
    ConditionFailed,
    Item,
    batch_get,
    decode_token,
    dynamo,
    encode_token,
    from_dynamo,
    to_dynamo,
    values,
)
from punctual.dal.tables import (
    BACKFILL_PREFIX,
    OCCURRENCE_PREFIX,
    OCCURRENCES,
    TRIGGER_PREFIX,
    backfill_sk,
    occurrence_key,
    occurrence_sk,
)
from punctual.domain.errors import Conflict
from punctual.domain.ids import MANUAL_MARK, occurrence_id
from punctual.domain.occurrence import Attempt, Occurrence, OccurrenceState
from punctual.domain.schedule import PayloadNotRead

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.type_defs import QueryOutputTypeDef

_OPEN = (
    OccurrenceState.SCHEDULED,
    OccurrenceState.RUNNING,
    OccurrenceState.RETRY_WAIT,
)
_LAST = 10**12 - 1  # the largest scheduled_for (and version) a fixed-width sk holds


def occurrence_to_item(occurrence: Occurrence, payload: dict[str, Any]) -> Item:
    """The payload is copied in: the relay then sends without reading the schedule. A
    payload not read (None: a schedule read from its CURRENT item or an index) is refused:
    the message would go out with none."""
    if payload is None:
        raise PayloadNotRead(f"occurrence {occurrence.occurrence_id}: its payload was not read")
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


class Unreadable(ValueError):
    """An occurrence item that is not one Punctual wrote (a tenant's worker wrote it)."""


def occurrence_from_item(item: Item) -> Occurrence:
    """The occurrence an item holds; Unreadable (a ValueError), or another of UNPARSABLE,
    when the item is not one Punctual wrote: the fields must make an Occurrence, and its id
    must be the one its key names (an item under a tenant's key that claims another instant
    or schedule is that tenant's forgery). (One naming another tenant is refused where the
    tenant matters: the relay, the worker.)"""
    occurrence = Occurrence(**{k: v for k, v in item.items() if k in Occurrence.model_fields})
    key = occurrence_key(occurrence.occurrence_id)
    if (item.get("schedule_id"), item.get("sk")) != (key["schedule_id"], key["sk"]):
        raise Unreadable(f"its id {occurrence.occurrence_id} names another key")
    return occurrence


def first_claim(item: Item) -> int | None:
    """When a worker first claimed the occurrence (its first attempt's start), read for
    display only: the attempt history is the tenant's worker's writing, so anything else
    there is no claim, never an error."""
    attempts = item.get("attempts")
    if not isinstance(attempts, list) or not attempts or not isinstance(attempts[0], dict):
        return None
    started = attempts[0].get("started_at")
    if isinstance(started, bool) or not isinstance(started, int | float):
        return None
    return int(started)


def key_occurrence_id(item: Item) -> str | None:
    """The occurrence id an occurrence item's key names, whatever its attributes say (None:
    the key names none)."""
    sk = item.get("sk")
    schedule_id = item.get("schedule_id")
    if not isinstance(sk, str) or not isinstance(schedule_id, str):
        return None
    stamp, _, rest = sk.removeprefix(OCCURRENCE_PREFIX).partition("#")
    version, mark, tag = rest.partition(".m")
    try:
        named = occurrence_id(schedule_id, int(version), int(stamp), tag if mark else None)
    except ValueError:
        return None
    return named if sk.startswith(OCCURRENCE_PREFIX) and occurrence_key(named)["sk"] == sk else None


def stored_occurrence(item: Item) -> StoredOccurrence:
    """As occurrence_from_item, with its payload (a map) and its retry time."""
    payload = item["payload"]  # (every occurrence item has one: {} when the schedule has none)
    if not isinstance(payload, dict):
        raise Unreadable("its payload is not a map")
    retry_at = item.get("retry_at")
    return StoredOccurrence(
        occurrence_from_item(item), payload, int(retry_at) if retry_at is not None else None
    )


def inserted_occurrence(record: dict[str, Any], bad: BadItems) -> StoredOccurrence | None:
    """The occurrence a DynamoDB stream record inserted; None for any other record (a
    run-now tag, a modification, a removal), and for an inserted item that is not an
    occurrence Punctual wrote (counted in ``bad``: a tenant's worker may create one with an
    UpdateItem under its own keys)."""
    if record.get("eventName") != "INSERT":
        return None
    # The table's stream carries NEW_IMAGE (dal.tables, infra/data.py): an insert always
    # has its image, and an image its key.
    image = from_dynamo(record["dynamodb"]["NewImage"])
    if not str(image.get("sk", "")).startswith(OCCURRENCE_PREFIX):
        return None
    try:
        return stored_occurrence(image)
    except UNPARSABLE as error:
        bad.skip("occurrences stream", image, error)
        return None


def attempt_from_item(occurrence_id: str, entry: Item) -> Attempt:
    """One entry of an occurrence's ``attempts`` history."""
    fields = {k: v for k, v in entry.items() if k in Attempt.model_fields}
    return Attempt(**fields, occurrence_id=occurrence_id)


def with_attempts(item: Item) -> tuple[Occurrence, list[Attempt]]:
    """The occurrence an item holds and its attempts, oldest first (its ``attempts``
    history: the worker writes it with each claim and completion); one of UNPARSABLE when
    either is not what Punctual writes."""
    occurrence = occurrence_from_item(item)
    history = item.get("attempts") or []
    if not isinstance(history, list):
        raise Unreadable("its attempts are not a list")
    return occurrence, [attempt_from_item(occurrence.occurrence_id, a) for a in history]


@dataclass(frozen=True, slots=True)
class Window:
    """A schedule's occurrences in a range of instants, and the ids that the keys of the
    unreadable items there name (a tenant's bad data: not an occurrence to judge, but its
    key is taken, so nothing can be put there)."""

    occurrences: list[Occurrence]
    unreadable: list[str]


EXAMINED_PER_FIRE = 4  # items a read of the latest fires examines per fire asked, at most
# Pages a read of the latest fires takes at most: items under a schedule's key may be up to
# 400 KB each (a tenant's worker can write them), and a page is up to 1 MB.
LATEST_PAGES = 4


@dataclass(slots=True)
class LatestFires:
    """A schedule's latest fires, each with its attempts, and how many items there were
    unreadable (counted in BadItems too)."""

    fires: list[tuple[Occurrence, list[Attempt]]] = field(default_factory=list)
    unreadable: int = 0
    reached: bool = False  # the read went back to the schedule's first item

    def add(self, item: Item, bad: BadItems, table: str) -> None:
        try:
            self.fires.append(with_attempts(item))
        except UNPARSABLE as error:
            bad.skip(table, item, error)
            self.unreadable += 1


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
    def __init__(self, client: Any, table: str, bad: BadItems | None = None) -> None:
        self._client = dynamo(client)
        self.table = table
        self._bad = bad or BadItems()

    def _parsed(self, items: list[Item], unreadable: list[str] | None = None) -> list[Occurrence]:
        """The occurrences of ``items``; an unreadable one is skipped and counted, and the id
        its key names added to ``unreadable``."""
        found = []
        for item in items:
            try:
                found.append(occurrence_from_item(item))
            except UNPARSABLE as error:
                self._bad.skip(self.table, item, error)
                if unreadable is not None and (named := key_occurrence_id(item)) is not None:
                    unreadable.append(named)
        return found

    def _page(
        self, page: QueryOutputTypeDef, unreadable: list[str] | None = None
    ) -> list[Occurrence]:
        return self._parsed([from_dynamo(item) for item in page["Items"]], unreadable)

    def put_new_action(self, occurrence: Occurrence, payload: dict[str, Any]) -> dict[str, Any]:
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

    def put_trigger_action(
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

    def put_backfill_action(
        self, schedule_id: str, *, made_at: int, since: int, until: int, expires_at: int
    ) -> dict[str, Any]:
        """Transaction action recording that a backfill made at ``made_at`` made occurrences
        of the schedule's fires in [since, until): the reconciler's check of the hour it was
        made in reads them (``backfilled``), in whatever hour their instants are. (No
        condition: the same backfill asked twice in a second records the same range, and an
        item a tenant's worker made at that key is replaced by ours.)"""
        return {
            "Put": {
                "TableName": self.table,
                "Item": to_dynamo(
                    {
                        "schedule_id": schedule_id,
                        "sk": backfill_sk(made_at, since, until),
                        "expires_at": expires_at,
                    }
                ),
            }
        }

    def backfilled(
        self, schedule_id: str, *, since: int, until: int, unreadable: list[str]
    ) -> list[tuple[int, int]]:
        """The fire ranges [from, to) of the schedule's backfills made in [since, until),
        read from their records' keys, all pages; a record whose key is not one Punctual
        writes is skipped, counted, and its key added to ``unreadable`` (a tenant's worker
        can make one). Strongly consistent: the hour settles on what this read shows, and a
        backfill missed here would leave its occurrences unchecked for good."""
        pages = self._client.query_pages(
            TableName=self.table,
            KeyConditionExpression="schedule_id = :s AND sk BETWEEN :a AND :b",
            ExpressionAttributeValues=values(
                s=schedule_id,
                a=f"{BACKFILL_PREFIX}{max(since, 0):012d}",
                b=f"{BACKFILL_PREFIX}{max(until - 1, 0):012d}#~",  # ('~' sorts after digits)
            ),
            ConsistentRead=True,
        )
        found = []
        for page in pages:
            for item in map(from_dynamo, page["Items"]):
                sk = str(item.get("sk"))
                try:
                    made, first, end = (int(part) for part in sk.split("#")[1:])
                    if backfill_sk(made, first, end) != sk or not first < end:
                        raise ValueError("not a backfill record's key")
                except ValueError as error:
                    self._bad.skip(self.table, item, error)
                    unreadable.append(sk)
                    continue
                found.append((first, end))
        return found

    def triggered(self, schedule_id: str, tag: str) -> tuple[str, Occurrence | None] | None:
        """The id of the occurrence a run-now request with this tag made, and the
        occurrence (None once it expired before its record, or is unreadable); None if no
        request made one. Strongly consistent: a retry a moment after the first request must
        find its run. Conflict when the record is not one Punctual wrote (the key is taken)."""
        found = self._client.get_item(
            TableName=self.table,
            Key=to_dynamo({"schedule_id": schedule_id, "sk": TRIGGER_PREFIX + tag}),
            ConsistentRead=True,
        ).get("Item")
        if not found:
            return None
        item = from_dynamo(found)
        made = item.get("occurrence_id")
        if not isinstance(made, str):
            self._bad.skip(self.table, item, Unreadable("a run-now record without its run"))
            raise Conflict("this Idempotency-Key's record is unreadable; use a new key")
        return made, self.get(made)

    def get_with_attempts(self, occurrence_id: str) -> tuple[Occurrence, list[Attempt]] | None:
        """The occurrence and its attempts, oldest first (its ``attempts`` history: the worker
        writes it with each claim and completion). Strongly consistent, like ``get``. None
        for an unreadable item too (counted)."""
        item = self._item(occurrence_id)
        if item is None:
            return None
        try:
            return with_attempts(item)
        except UNPARSABLE as error:
            self._bad.skip(self.table, item, error)
            return None

    def list_for_schedule(
        self,
        schedule_id: str,
        *,
        since: int,
        until: int,
        limit: int,
        token: str | None,
        claims: dict[str, int] | None = None,
    ) -> tuple[list[Occurrence], str | None]:
        """A page of the schedule's occurrences (an unreadable item left out, counted);
        ``claims``, if given, gets when each claimed one was first claimed (first_claim)."""
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
        found = self._claimed(page, claims)
        return found, encode_token(page.get("LastEvaluatedKey"))

    def _claimed(
        self,
        page: QueryOutputTypeDef,
        claims: dict[str, int] | None,
        unreadable: list[str] | None = None,
    ) -> list[Occurrence]:
        """The page's occurrences; ``claims``, if given, gets when each claimed one was first
        claimed (first_claim)."""
        items = [from_dynamo(item) for item in page["Items"]]
        found = self._parsed(items, unreadable)
        if claims is not None:
            read = {o.occurrence_id for o in found}
            for item in items:
                if item.get("occurrence_id") in read and (claimed := first_claim(item)):
                    claims[item["occurrence_id"]] = claimed
        return found

    def _query_all(
        self,
        unreadable: list[str] | None = None,
        claims: dict[str, int] | None = None,
        **request: Any,
    ) -> list[Occurrence]:
        pages = self._client.query_pages(TableName=self.table, **request)
        return [o for page in pages for o in self._claimed(page, claims, unreadable)]

    def window(
        self,
        schedule_id: str,
        *,
        since: int,
        until: int,
        consistent: bool = False,
        claims: dict[str, int] | None = None,
    ) -> Window:
        """Every occurrence of the schedule (any version, any state) with ``scheduled_for``
        in [since, until], all pages, and the ids of the unreadable items there;
        ``consistent`` for a caller that must see one written a moment ago; ``claims``, if
        given, gets when each claimed one was first claimed."""
        unreadable: list[str] = []
        found = self._query_all(
            unreadable, claims, **_between(schedule_id, since, until), ConsistentRead=consistent
        )
        return Window(found, unreadable)

    def first_after(
        self, schedule_id: str, *, after: int, limit: int, consistent: bool = False
    ) -> list[Occurrence]:
        """Up to ``limit`` of the schedule's occurrences scheduled after ``after``, earliest
        first (one page; ``consistent`` for a caller that must see one written a moment
        ago)."""
        page = self._client.query(
            TableName=self.table,
            **_between(schedule_id, after + 1, _LAST),
            Limit=limit,
            ConsistentRead=consistent,
        )
        return self._page(page)

    def latest_fires(self, schedule_id: str, *, until: int, count: int) -> LatestFires:
        """Up to ``count`` of the schedule's fires scheduled at or before ``until``, latest
        first, each with its attempts; manual runs (run now, backfill) left out, and at most
        ``EXAMINED_PER_FIRE * count`` items examined in at most LATEST_PAGES pages, so a large
        backfill or a tenant's junk under the schedule's key bounds the read rather than
        lengthening it. Eventually
        consistent: these are figures to show, and a fire ended a moment ago may still
        show open (the next read has it)."""
        found = LatestFires()
        request: dict[str, Any] = {
            "TableName": self.table,
            **_between(schedule_id, 0, until),
            "ScanIndexForward": False,
        }
        examined, bound = 0, EXAMINED_PER_FIRE * count
        for _ in range(LATEST_PAGES):
            if len(found.fires) == count or examined == bound:
                break
            page = self._client.query(**request, Limit=min(count, bound - examined))
            for raw in page["Items"]:
                examined += 1
                item = from_dynamo(raw)
                if MANUAL_MARK in str(item.get("sk", "")) or len(found.fires) == count:
                    continue
                found.add(item, self._bad, self.table)
            if "LastEvaluatedKey" not in page:
                found.reached = True
                break
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return found

    def get(self, occurrence_id: str) -> Occurrence | None:
        """The occurrence, strongly consistent; None if there is none (or its item is
        unreadable, counted)."""
        item = self._item(occurrence_id)
        found = self._parsed([item]) if item else []
        return found[0] if found else None

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
        """Those of ``occurrence_ids`` that exist, payload included (an unreadable one left
        out, counted). Strongly consistent: a decision to send one again needs its state as
        it is now (a worker may have just taken it)."""
        keys = [occurrence_key(i) for i in occurrence_ids]
        found = []
        for item in batch_get(self._client, self.table, keys):
            try:
                found.append(stored_occurrence(item))
            except UNPARSABLE as error:
                self._bad.skip(self.table, item, error)
        return found

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

    def cancel_scheduled_action(self, occurrence_id: str, reason: str) -> dict[str, Any]:
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
