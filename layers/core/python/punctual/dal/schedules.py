"""The schedules table: the current version of each schedule, its history, the due index."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from punctual.dal.common import (
    Item,
    batch_get,
    decode_token,
    dynamo,
    encode_token,
    from_dynamo,
    to_dynamo,
    values,
)
from punctual.dal.tables import DUE_INDEX, SCHEDULE_CURRENT, SCHEDULES, SHARD_INDEX, TENANT_INDEX
from punctual.domain.errors import Retryable
from punctual.domain.planning import Cursor
from punctual.domain.schedule import (
    OWNS_FIRES,
    SCHEDULE_MOVES,
    MissedEpisode,
    Schedule,
    ScheduleDefinition,
    ScheduleState,
)
from punctual.timing import to_epoch, tzdata_version

_DEFINITION_FIELDS = set(ScheduleDefinition.model_fields)
# In a CURRENT item's ``definition``, in place of the payload: the payload's size (bytes of
# its JSON), only when it is not empty. The payload itself is kept in the version item alone
# (``version_to_item``): the due index projects the whole CURRENT item and every step moves
# it from one key to another, so a payload there would cost its size in index writes on
# every step, on one hot key (docs/capacity.md, *Payloads*). Inside ``definition``, not
# beside it: the by_shard index projects ``definition`` and no other new attribute (an
# index's projection cannot change in place), so every reader sees the mark; and a reader
# of an older release refuses a definition with an unknown field instead of reading "no
# payload" as an empty one.
PAYLOAD_MARK = "payload_bytes"
# What a payload read takes of a version item (its key comes with it).
_PAYLOAD_PATH = "definition.payload"


class PayloadMissing(Retryable):
    """A version item that even a consistent read did not find: written in another region
    a moment ago (a global table replicates items, not transactions), or a bug. Never read
    as an empty payload; the caller tries again later."""


def payload_bytes(payload: Mapping[str, Any]) -> int:
    """The payload's size as its JSON (what the API's 32 KiB limit counts)."""
    return len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def version_sk(version: int) -> str:
    return f"V#{version:010d}"


def _version_of(sk: str) -> int:
    return int(sk.removeprefix("V#"))


def due_bucket(due_at: int, shard: int) -> str:
    """The due index partition: the minute of ``due_at`` and the shard, '202611300915#0007'."""
    minute = datetime.fromtimestamp(due_at, UTC).strftime("%Y%m%d%H%M")
    return f"{minute}#{shard:04d}"


# --- item <-> model -------------------------------------------------------------------


def schedule_to_item(schedule: Schedule, *, shard: int, minute_load: dict[int, int]) -> Item:
    """The CURRENT item. Only an ACTIVE schedule with a next fire carries the due index keys.
    Its definition has no payload, only its size (``PAYLOAD_MARK``) when there is one: the
    payload is in the version item written beside it. PayloadNotRead for a schedule whose
    payload was not read (its mark would be lost)."""
    dumped = _definition(schedule) | _runs_as(schedule)
    payload = dumped.pop("payload")
    if payload:
        dumped[PAYLOAD_MARK] = payload_bytes(payload)
    item: Item = {
        "schedule_id": schedule.schedule_id,
        "sk": SCHEDULE_CURRENT,
        "tenant_id": schedule.tenant_id,
        "created_key": f"{schedule.created_at.isoformat()}#{schedule.schedule_id}",
        "version": schedule.version,
        "state": schedule.state.value,
        "definition": dumped,
        "created_at": schedule.created_at.isoformat(),
        "updated_at": schedule.updated_at.isoformat(),
        "shard": shard,
        "minute_load": {str(m): n for m, n in minute_load.items()},
        "planned_until": schedule.planned_until,
        "next_run_at": schedule.next_run_at,
        "next_available_at": schedule.next_available_at,
        "generation": schedule.generation,
    }
    if schedule.home_region is not None:
        item["home_region"] = schedule.home_region
    if schedule.homed_since is not None:
        # Race: a change (resume, update) written whole after a take-over (``take_over``)
        # keeps where the take-over homed it from: fires due before that are the failed
        # region's, recorded in its table; without it this region's reconciler takes them
        # for missing, and a repair or a backfill would make them a second time.
        item["homed_since"] = schedule.homed_since
    if schedule.zone_name is not None:
        # Every write of the whole item planned it under the rules in use now.
        item["tzdata"] = tzdata_version()
    if schedule.state is ScheduleState.ACTIVE and schedule.next_available_at is not None:
        item["due_at"] = schedule.next_available_at
        item["due_bucket"] = due_bucket(schedule.next_available_at, shard)
    if schedule.missed_total:
        # The materializer's MISSED summary belongs to the schedule, not to one version.
        item["missed_total"] = schedule.missed_total
        item["missed_ranges"] = [e.model_dump() for e in schedule.missed]
    return item


def version_to_item(schedule: Schedule, effective_from: int) -> Item:
    """An immutable history item: what version N said and from when it applied, its payload
    included (the only copy of it; PayloadNotRead for a schedule whose payload was not read).
    Written in the same transaction as every CURRENT item naming version N."""
    item: Item = {
        "schedule_id": schedule.schedule_id,
        "sk": version_sk(schedule.version),
        "tenant_id": schedule.tenant_id,
        "version": schedule.version,
        "state": schedule.state.value,
        "definition": _definition(schedule) | _runs_as(schedule),
        "created_at": schedule.created_at.isoformat(),
        "effective_from": effective_from,
    }
    return item


def _definition(schedule: Schedule) -> dict[str, Any]:
    """The definition fields as stored, payload included (PayloadNotRead if not read)."""
    payload = schedule.known_payload
    return schedule.model_dump(mode="json", include=_DEFINITION_FIELDS - {"payload"}) | {
        "payload": payload
    }


def _runs_as(schedule: Schedule) -> dict[str, int]:
    """The run version and its start (``Schedule.run_version``), where they are not the
    version's own (a rename). Inside ``definition``: the by_shard index projects it, and its
    INCLUDE list cannot change without a new index; a release before them refuses the
    unknown fields instead of taking the fires for the new version's."""
    if schedule.run_version == schedule.version:
        return {}
    return {"runs_as": schedule.run_version, "runs_from": schedule.run_from}


def _stored_definition(item: Item) -> dict[str, Any]:
    """An item's definition as Schedule's fields. The payload: nested (a version item, or a
    CURRENT item written before payloads left it, 2026-12-06: no migration), None (not read)
    where only its mark is, ``{}`` where neither is (the schedule has none)."""
    definition = dict(item["definition"])
    marked = definition.pop(PAYLOAD_MARK, None)
    if "payload" not in definition:
        definition["payload"] = None if marked is not None else {}
    return definition


def schedule_from_item(item: Item) -> Schedule:
    """A CURRENT item (or an index's copy of it) as its schedule; its payload None when only
    the version item has it (``ScheduleStore.with_payloads`` reads it)."""
    return Schedule(
        **_stored_definition(item),
        tenant_id=item["tenant_id"],
        schedule_id=item["schedule_id"],
        version=item["version"],
        state=item["state"],
        created_at=item["created_at"],
        updated_at=item["updated_at"],
        planned_until=item.get("planned_until"),
        next_run_at=item.get("next_run_at"),
        next_available_at=item.get("next_available_at"),
        missed_total=item.get("missed_total", 0),
        missed=missed_ranges_of(item),
        home_region=item.get("home_region"),
        generation=item.get("generation", 1),
        tzdata_version=item.get("tzdata"),
        homed_since=item.get("homed_since"),
    )


def _cursor_unchanged(schedule: Schedule) -> tuple[str, dict[str, Any]]:
    """A condition that holds while the item's cursor is still ``schedule``'s, its values."""
    if schedule.next_run_at is None:
        return "attribute_not_exists(next_run_at)", {}
    if schedule.planned_until is None:
        return (
            "next_run_at = :old AND attribute_not_exists(planned_until)",
            {"old": schedule.next_run_at},
        )
    return (
        "next_run_at = :old AND planned_until = :handled",
        {"old": schedule.next_run_at, "handled": schedule.planned_until},
    )


def _cursor_sets(cursor: Cursor, placed: int, shard: int) -> tuple[list[str], dict[str, Any]]:
    """SET clauses and values writing ``cursor``, its due bucket at the minute of ``placed``."""
    return (
        [
            "planned_until = :h",
            "next_run_at = :n",
            "next_available_at = :a",
            "due_at = :a",
            "due_bucket = :b",
        ],
        {
            "h": cursor.planned_until,
            "n": cursor.next_run_at,
            "a": cursor.next_available_at,
            "b": due_bucket(placed, shard),
        },
    )


def _raised_mark(stored: StoredSchedule, through: int) -> tuple[int, str]:
    """``manual_through`` raised to ``through`` (never lowered), and the condition that keeps
    it so: a concurrent run now that raised the mark past this one since the read (a host
    whose clock is ahead) must not be overwritten, which would hide that run's hour from the
    reconciler; the writer reads again. The value is ``:mark``."""
    mark = max(through, stored.manual_through or through)
    return mark, "(attribute_not_exists(manual_through) OR manual_through <= :mark)"


def homed_in(schedule: Schedule, region: str) -> bool:
    """The region's materializer and reconciler act on the schedule: its home, or a
    schedule written before homes were recorded (homed nowhere)."""
    return schedule.home_region in (None, region)


def fence(schedule: Schedule, home_region: str | None) -> tuple[str, dict[str, Any]]:
    """A condition that holds while the item still has ``schedule``'s generation and
    ``home_region`` as its home (docs/multi-region.md), with its values. An item written
    before regions were recorded has neither attribute: it is generation 1, homed nowhere."""
    named: dict[str, Any] = {"gen": schedule.generation}
    generation = "generation = :gen"
    if schedule.generation == 1:
        generation = f"(attribute_not_exists(generation) OR {generation})"
    if home_region is None:
        return f"{generation} AND attribute_not_exists(home_region)", named
    return f"{generation} AND home_region = :home", named | {"home": home_region}


@dataclass(frozen=True, slots=True)
class StoredSchedule:
    """A schedule's CURRENT item as the store hands it out: the schedule (its cursor and
    MISSED summary included) and where it is kept: its shard, the due bucket it waits in,
    and its share of the tenant's per-minute strict load."""

    schedule: Schedule
    shard: int
    due_bucket: str | None
    minute_load: dict[int, int]
    # The latest instant a run now was made for, a re-plan's old cursor, or when a backfill
    # was made (``ScheduleStore.manual_run_action``, ``replanned_action``,
    # ``backfill_made_action``): the reconciler reads the occurrences of a schedule that owns
    # no fire in an hour, and its backfill records, only when the hour is not after it. None:
    # none of them since the item was last written whole.
    manual_through: int | None = None
    # When the latest backfill's paced occurrences become receivable (``backfill_made_action``):
    # a later backfill of the schedule is paced on from there. None: none since the item
    # was last written whole.
    paced_until: int | None = None


def stored_schedule(item: Item) -> StoredSchedule:
    paced = item.get("backfill_until")
    return StoredSchedule(
        schedule=schedule_from_item(item),
        shard=int(item["shard"]),
        due_bucket=item.get("due_bucket"),
        minute_load=minute_load_of(item),
        manual_through=_manual_through(item),
        paced_until=None if paced is None else int(paced),
    )


def _manual_through(item: Item) -> int | None:
    found = item.get("manual_through")
    return None if found is None else int(found)


def after_step(stored: StoredSchedule, cursor: Cursor, missed: list[int]) -> StoredSchedule:
    """The record as the materializer's step (``ScheduleStore.step``) leaves it."""
    schedule = stored.schedule
    return replace(
        stored,
        schedule=schedule.model_copy(
            update={
                "planned_until": cursor.planned_until,
                "next_run_at": cursor.next_run_at,
                "next_available_at": cursor.next_available_at,
                "missed_total": schedule.missed_total + len(missed),
                "missed": missed_ranges_after(schedule, missed) if missed else schedule.missed,
            }
        ),
    )


@dataclass(frozen=True, slots=True)
class ScheduleVersion:
    """What version N of a schedule said (its state included) and from when it applied."""

    schedule: Schedule
    effective_from: int  # epoch seconds; version N applies until version N+1's effective_from
    manual_through: int | None = None  # StoredSchedule's (a CURRENT item's only)


def version_from_item(item: Item) -> ScheduleVersion:
    """A history item (``V#...``) back to the version it records."""
    effective_from = int(item["effective_from"])
    schedule = Schedule(
        **_stored_definition(item),
        tenant_id=item["tenant_id"],
        schedule_id=item["schedule_id"],
        version=item["version"],
        state=item["state"],
        created_at=item["created_at"],
        updated_at=datetime.fromtimestamp(effective_from, UTC),
    )
    return ScheduleVersion(schedule, effective_from)


def current_version_of(item: Item) -> ScheduleVersion:
    """The CURRENT item as its version's history record: every change writes both in one
    transaction with ``updated_at`` = ``effective_from``; completion changes neither."""
    schedule = schedule_from_item(item)
    return ScheduleVersion(schedule, to_epoch(schedule.updated_at), _manual_through(item))


MISSED_RANGES = 16  # MISSED episodes kept on a schedule (older ones are only counted)


def missed_ranges_of(item: Item) -> list[MissedEpisode]:
    """The MISSED episodes recorded on a CURRENT item, oldest first (at most MISSED_RANGES)."""
    return [
        MissedEpisode(
            version=int(r["version"]),
            first=int(r["first"]),
            last=int(r["last"]),
            count=int(r["count"]),
        )
        for r in item.get("missed_ranges", [])
    ]


def missed_ranges_after(schedule: Schedule, missed: list[int]) -> list[MissedEpisode]:
    """The schedule's MISSED episodes with one more (``missed``: sorted instants), bounded."""
    episode = MissedEpisode(
        version=schedule.run_version, first=missed[0], last=missed[-1], count=len(missed)
    )
    return [*schedule.missed, episode][-MISSED_RANGES:]


def minute_load_of(item: Item) -> dict[int, int]:
    return {int(m): int(n) for m, n in item["minute_load"].items()}  # (every CURRENT item has one)


# --- reads ----------------------------------------------------------------------------


class ScheduleStore:
    def __init__(self, client: Any, table: str) -> None:
        self._client = dynamo(client)
        self.table = table

    def key(self, schedule_id: str, sk: str = SCHEDULE_CURRENT) -> dict[str, Any]:
        return to_dynamo({"schedule_id": schedule_id, "sk": sk})

    def current(self, schedule_id: str) -> StoredSchedule | None:
        """The CURRENT item, strongly consistent: every caller acts on it (a change's
        conditions, a step re-planned after a refused commit, a schedule found in a stale
        index), and a read that missed the last write would act on an older version. Its
        payload is unread when it has one (``with_payload`` reads it)."""
        found = self._client.get_item(
            TableName=self.table, Key=self.key(schedule_id), ConsistentRead=True
        ).get("Item")
        return stored_schedule(from_dynamo(found)) if found else None

    def list_for_tenant(
        self,
        tenant_id: str,
        *,
        state: ScheduleState | None,
        limit: int,
        token: str | None,
        payloads: bool = True,
    ) -> tuple[list[Schedule], str | None]:
        """One page, newest last. A state filter reads on until the page is full. Without
        ``payloads``, a schedule's payload kept in its version item is left unread (None)."""
        request: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": TENANT_INDEX,
            "KeyConditionExpression": "tenant_id = :t",
            "ExpressionAttributeValues": values(t=tenant_id),
        }
        if state is not None:
            request["FilterExpression"] = "#state = :s"
            request["ExpressionAttributeNames"] = {"#state": "state"}
            request["ExpressionAttributeValues"] |= values(s=state.value)
        start = decode_token(
            token, expect={"tenant_id": tenant_id}, keys=SCHEDULES.page_key(TENANT_INDEX)
        )
        found: list[Schedule] = []
        while True:
            page_request = dict(request, Limit=limit - len(found))
            if start:
                page_request["ExclusiveStartKey"] = start
            page = self._client.query(**page_request)
            # The index holds keys and state only: the page's items come from the table.
            keys = [
                {"schedule_id": i["schedule_id"]["S"], "sk": SCHEDULE_CURRENT}
                for i in page["Items"]
            ]
            items = batch_get(self._client, self.table, keys)
            # (As the API shows them: with their payloads, from their version items.)
            schedules = [schedule_from_item(i) for i in items]
            found += self.with_payloads(schedules) if payloads else schedules
            start = page.get("LastEvaluatedKey")
            if not start or len(found) >= limit:
                return found, encode_token(start)

    def payloads(
        self, versions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], dict[str, Any]]:
        """The payloads of the versions (schedule_id, version) named, from their version
        items, one BatchGetItem per 100 (what DynamoDB leaves unprocessed asked again).

        Eventually consistent first, at half the read units: a version item is immutable and
        is written in the same transaction as the CURRENT item naming its version, so a
        lagging replica serves either exactly its payload or, written a moment ago, nothing
        at all; never another one. What that read misses is read again, consistently.
        What even that misses (``PayloadMissing`` for ``with_payloads``) is left out of the
        answer: a missing item is never an empty payload."""
        keys = [
            {"schedule_id": schedule_id, "sk": version_sk(version)}
            for schedule_id, version in dict.fromkeys(versions)
        ]
        found = self._payloads(keys, consistent=False)
        # Race: the version item was written a moment ago and the replica that answered has
        # not got it yet (the CURRENT item or index copy that named it was read after it).
        missed = [k for k in keys if (k["schedule_id"], _version_of(k["sk"])) not in found]
        if missed:
            found |= self._payloads(missed, consistent=True)
        return found

    def _payloads(
        self, keys: list[dict[str, Any]], *, consistent: bool
    ) -> dict[tuple[str, int], dict[str, Any]]:
        found: dict[tuple[str, int], dict[str, Any]] = {}
        for item in batch_get(
            self._client, self.table, keys, consistent=consistent, attributes=[_PAYLOAD_PATH]
        ):
            payload = item.get("definition", {}).get("payload")
            if isinstance(payload, dict):  # (every version item has one)
                found[(item["schedule_id"], _version_of(item["sk"]))] = payload
        return found

    def with_payloads(self, schedules: Sequence[Schedule]) -> list[Schedule]:
        """``schedules`` with every payload not read yet read from its version item
        (``payloads``), in the same order; PayloadMissing (Retryable) when a version item
        cannot be found even by a consistent read."""
        unread = [(s.schedule_id, s.version) for s in schedules if s.payload is None]
        if not unread:
            return list(schedules)
        found = self.payloads(unread)
        lost = [f"{sid} version {v}" for sid, v in unread if (sid, v) not in found]
        if lost:
            raise PayloadMissing(
                f"the version item of {', '.join(lost[:5])} was not found; retry", count=len(lost)
            )
        return [
            s
            if s.payload is not None
            else s.model_copy(update={"payload": found[(s.schedule_id, s.version)]})
            for s in schedules
        ]

    def with_payload(self, stored: StoredSchedule) -> StoredSchedule:
        """``stored`` with its schedule's payload read (``with_payloads``)."""
        if stored.schedule.payload is not None:
            return stored
        return replace(stored, schedule=self.with_payloads([stored.schedule])[0])

    def due_in(self, minute: int, shard: int) -> Iterator[StoredSchedule]:
        """The schedules in one due bucket, read from the due index: eventually consistent
        (an index cannot be read otherwise), so a schedule moved here a moment ago may be
        missing and one that left may still show (its cursor condition then refuses it).
        Payloads unread (the index holds only their mark): ``with_payloads``."""
        pages = self._client.query_pages(
            TableName=self.table,
            IndexName=DUE_INDEX,
            KeyConditionExpression="due_bucket = :b",
            ExpressionAttributeValues=values(b=due_bucket(minute, shard)),
        )
        for page in pages:
            yield from (stored_schedule(from_dynamo(raw)) for raw in page["Items"])

    def list_for_shard(self, shard: int, *, created_before: str) -> Iterator[list[ScheduleVersion]]:
        """Pages of the shard's schedules, each as the version its CURRENT item records,
        whose ``created_key`` sorts before ``created_before`` (an ISO instant): one Query, no
        scan. The index projects the stable attributes only (SHARD_INDEX_ATTRIBUTES): the
        cursor (``planned_until``, ``next_run_at``...) reads as unset; the MISSED summary is
        there. Eventually consistent, as every index read: a schedule created a moment ago
        may be absent, and the window's ``created_before`` is older than any such one.
        Payloads unread (the index holds only their mark)."""
        pages = self._client.query_pages(
            TableName=self.table,
            IndexName=SHARD_INDEX,
            KeyConditionExpression="#shard = :s AND created_key < :c",
            ExpressionAttributeNames={"#shard": "shard"},
            ExpressionAttributeValues=values(s=shard, c=created_before),
        )
        for page in pages:
            yield [current_version_of(from_dynamo(i)) for i in page["Items"]]

    def any_in_shard(self, shard: int, *, created_before: str) -> bool:
        """Whether the shard holds any schedule created before ``created_before`` (one item
        read)."""
        page = self._client.query(
            TableName=self.table,
            IndexName=SHARD_INDEX,
            KeyConditionExpression="#shard = :s AND created_key < :c",
            ExpressionAttributeNames={"#shard": "shard"},
            ExpressionAttributeValues=values(s=shard, c=created_before),
            Limit=1,
        )
        return bool(page["Items"])

    def versions_since(self, schedule_id: str, since: int) -> list[ScheduleVersion]:
        """The history from the version in effect at ``since`` on, oldest first. Read newest
        first, so a long history costs only the versions that matter."""
        pages = self._client.query_pages(
            TableName=self.table,
            KeyConditionExpression="schedule_id = :s AND begins_with(sk, :v)",
            ExpressionAttributeValues=values(s=schedule_id, v="V#"),
            ScanIndexForward=False,
            ConsistentRead=True,
            # Small pages: a query is billed for what it reads, and most reads stop after
            # the newest one or two versions.
            PaginationConfig={"PageSize": 8},
        )
        found: list[ScheduleVersion] = []
        for page in pages:
            for raw in page["Items"]:
                found.append(version_from_item(from_dynamo(raw)))
                if found[-1].effective_from <= since:
                    return found[::-1]
        return found[::-1]

    def versions(
        self, schedule_id: str, *, limit: int, token: str | None
    ) -> tuple[list[ScheduleVersion], str | None]:
        """One page of the schedule's history, newest first. Consistent: an update answered
        a moment ago must be listed (its history item is written in the same transaction
        as the CURRENT item the caller has just read)."""
        request: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "schedule_id = :s AND begins_with(sk, :v)",
            "ExpressionAttributeValues": values(s=schedule_id, v="V#"),
            "ScanIndexForward": False,
            "ConsistentRead": True,
            "Limit": limit,
        }
        start = decode_token(
            token,
            expect={"schedule_id": schedule_id},
            keys=SCHEDULES.page_key(),
            sk_within=("V#", "V#\uffff"),
        )
        if start:
            request["ExclusiveStartKey"] = start
        page = self._client.query(**request)
        found = [version_from_item(from_dynamo(item)) for item in page["Items"]]
        return found, encode_token(page.get("LastEvaluatedKey"))

    # --- transaction actions ----------------------------------------------------------

    def put_new_action(self, item: Item) -> dict[str, Any]:
        return {
            "Put": {
                "TableName": self.table,
                "Item": to_dynamo(item),
                # Race: a retried create reusing the id must not overwrite the first one.
                "ConditionExpression": "attribute_not_exists(schedule_id)",
            }
        }

    def move_due_action(self, stored: StoredSchedule, minute: int) -> dict[str, Any]:
        """A transaction action moving a schedule to another due bucket, cursor unchanged."""
        return {
            "Update": {
                "TableName": self.table,
                "Key": self.key(stored.schedule.schedule_id),
                "UpdateExpression": "SET due_bucket = :to",
                # Race: the materializer stepped the schedule, or a change replaced it, since
                # it was found stuck: then it is no longer stuck, and must not be moved.
                "ConditionExpression": "version = :v AND due_bucket = :from",
                "ExpressionAttributeValues": values(
                    v=stored.schedule.version,
                    to=due_bucket(minute, stored.shard),
                    **{"from": stored.due_bucket},
                ),
            }
        }

    def step_action(
        self, stored: StoredSchedule, cursor: Cursor | None, missed: list[int]
    ) -> dict[str, Any]:
        """A transaction action: the materializer's step of a schedule from the cursor it
        read (``stored``) to ``cursor``, or to COMPLETED when ``cursor`` is None; the
        ``missed`` instants are added to its MISSED summary (``after_step``). The caller
        steps only a schedule homed in its region (or homed nowhere)."""
        schedule = stored.schedule
        fenced, named = fence(schedule, schedule.home_region)
        # (A step, and the completion, start from ACTIVE: SCHEDULE_MOVES["complete"].)
        [steppable] = SCHEDULE_MOVES["complete"].allowed_from
        named |= {"v": schedule.version, "active": steppable.value}
        cursor_unchanged, was = _cursor_unchanged(schedule)
        named |= was
        sets: list[str] = []
        removes: list[str] = []
        if cursor is None:
            sets.append("#state = :completed")
            removes = ["due_at", "due_bucket", "next_run_at", "next_available_at", "planned_until"]
            named["completed"] = SCHEDULE_MOVES["complete"].to.value
        else:
            assert cursor.next_available_at is not None
            clauses, written = _cursor_sets(cursor, cursor.next_available_at, stored.shard)
            sets += clauses
            named |= written
            if schedule.zone_name is not None:
                # The caller plans a schedule only under the rules it was planned with
                # (punctual.pipeline.rezone re-plans it first): the release stays, or is recorded.
                sets.append("tzdata = if_not_exists(tzdata, :tz)")
                named["tz"] = tzdata_version()
        if missed:
            # MISSED is a bounded summary on the schedule, never an item per instant.
            sets += ["missed_total = if_not_exists(missed_total, :zero) + :m", "missed_ranges = :r"]
            named |= {
                "zero": 0,
                "m": len(missed),
                "r": [e.model_dump() for e in missed_ranges_after(schedule, missed)],
            }
        expression = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
        return {
            "Update": {
                "TableName": self.table,
                "Key": self.key(schedule.schedule_id),
                "UpdateExpression": expression,
                # Race: an update, pause or cancel bumped the version (the old version must not
                # fire), or another materializer already moved this cursor (no double step),
                # or another region took the schedule over (a new generation: this region's
                # materializer must not plan it any more).
                "ConditionExpression": (
                    f"version = :v AND {cursor_unchanged} AND #state = :active AND {fenced}"
                ),
                "ExpressionAttributeNames": {"#state": "state"},
                "ExpressionAttributeValues": values(**named),
            }
        }

    def take_over_action(
        self,
        stored: StoredSchedule,
        region: str,
        *,
        since: int | None,
        cursor: Cursor | None = None,
        placed: int | None = None,
    ) -> dict[str, Any]:
        """A transaction action homing the schedule in ``region`` at the next generation
        (punctual.pipeline.failover), its fires due after ``since`` this region's (None: all
        of them, a schedule homed nowhere until now); with ``cursor``, its cursor set to it
        and its due bucket to the minute of ``placed``."""
        schedule = stored.schedule
        fenced, named = fence(schedule, schedule.home_region)
        cursor_unchanged, was = _cursor_unchanged(schedule)
        named |= was | {
            "v": schedule.version,
            "region": region,
            "next": schedule.generation + 1,
            "s": schedule.state.value,
        }
        sets = ["home_region = :region", "generation = :next"]
        if since is not None:
            sets.append("homed_since = :since")
            named["since"] = since
        if cursor is not None and cursor.next_available_at is not None:
            assert placed is not None
            sets += ["next_run_at = :n", "next_available_at = :a", "due_at = :a", "due_bucket = :b"]
            named |= {
                "n": cursor.next_run_at,
                "a": cursor.next_available_at,
                "b": due_bucket(placed, stored.shard),
            }
            if schedule.planned_until is not None:
                sets.append("planned_until = :h")
                named["h"] = cursor.planned_until
        return {
            "Update": {
                "TableName": self.table,
                "Key": self.key(schedule.schedule_id),
                "UpdateExpression": "SET " + ", ".join(sets),
                # Race: an API change since the read (its new version would get a cursor
                # planned for the old one), another take-over of the same schedule (a
                # second generation bump would fence the first taker off its own schedule),
                # or the old region's last step or completion (a cursor or state written
                # back from the read would undo it: a completed schedule back in the index).
                "ConditionExpression": (
                    f"version = :v AND {fenced} AND #state = :s AND {cursor_unchanged}"
                ),
                "ExpressionAttributeNames": {"#state": "state"},
                "ExpressionAttributeValues": values(**named),
            }
        }

    def replanned_action(
        self, stored: StoredSchedule, cursor: Cursor | None, placed: int | None, version: str
    ) -> dict[str, Any]:
        """A transaction action recording a re-plan under tzdata ``version``
        (punctual.pipeline.rezone): the new cursor (its due bucket at the minute of ``placed``), or
        only the version for a schedule with no cursor to move."""
        schedule = stored.schedule
        fenced, named = fence(schedule, schedule.home_region)
        named |= {"v": schedule.version, "tz": version}
        sets = ["tzdata = :tz"]
        if cursor is not None and cursor.next_available_at is not None:
            assert placed is not None
            assert schedule.planned_until is not None
            clauses, written = _cursor_sets(cursor, placed, stored.shard)
            sets += clauses
            named |= written | {"old": schedule.planned_until}
            moved = " AND planned_until = :old"
        else:
            moved = ""
        # (only a schedule planned under a recorded release is re-planned: rezone.stale)
        assert schedule.tzdata_version is not None
        named["was"] = schedule.tzdata_version
        marked = ""
        if schedule.planned_until is not None:
            # Occurrences made under the old rules stay where those put them (the receivable
            # ones), up to the old cursor: hours the rules in use may give no fire of. The
            # mark has the reconciler read them (ownership.idle), as for a run now.
            named["mark"], raised = _raised_mark(stored, schedule.planned_until)
            sets.append("manual_through = :mark")
            marked = f" AND {raised}"
        return {
            "Update": {
                "TableName": self.table,
                "Key": self.key(schedule.schedule_id),
                "UpdateExpression": "SET " + ", ".join(sets),
                # Race: an API change (a new version, planned under the new rules already),
                # the materializer's step (the cursor moved on from what was re-planned), or
                # another re-plan of the same schedule since the read: read it again.
                "ConditionExpression": (
                    f"version = :v AND {fenced} AND tzdata = :was{moved}{marked}"
                ),
                "ExpressionAttributeValues": values(**named),
            }
        }

    def unchanged_action(self, schedule: Schedule, *, stepped_past: int | None) -> dict[str, Any]:
        """A transaction action that fails unless the schedule is still at ``schedule``'s
        version; with ``stepped_past``, also owning its fires (ACTIVE or COMPLETED) with
        the materializer's cursor past that instant."""
        fenced, named = fence(schedule, schedule.home_region)
        condition = f"version = :v AND {fenced}"
        named["v"] = schedule.version
        check: dict[str, Any] = {"TableName": self.table, "Key": self.key(schedule.schedule_id)}
        if stepped_past is not None:
            owning = {f"owns{n}": state.value for n, state in enumerate(sorted(OWNS_FIRES))}
            condition += (
                f" AND #state IN ({', '.join(':' + name for name in owning)})"
                " AND (attribute_not_exists(next_run_at) OR planned_until >= :last)"
            )
            named |= owning | {"last": stepped_past}
            check["ExpressionAttributeNames"] = {"#state": "state"}
        # Race: an update, pause or cancel since the read (a SCHEDULED occurrence of the old
        # version put after the new version's invalidation swept would escape it), or the
        # materializer's cursor not yet past these instants (its own put of the same id
        # would then fail and stall its whole shard), or a take-over by another region
        # since the read (a repair here would materialize beside that region's).
        check["ConditionExpression"] = condition
        check["ExpressionAttributeValues"] = values(**named)
        return {"ConditionCheck": check}

    def manual_run_action(self, stored: StoredSchedule, *, through: int) -> dict[str, Any]:
        """A transaction action for a run now scheduled for ``through``: ``unchanged_action`` (no
        cursor condition) that also raises the item's ``manual_through`` to ``through``,
        never lowering it. The reconciler skips the occurrence query of a schedule that owns
        no fire in an hour only when this mark is before the hour (``ownership.idle``). A
        change that writes the item whole drops the mark: the reconciler then reads every
        hour near the change anyway (a new ``effective_from``)."""
        check = self.unchanged_action(stored.schedule, stepped_past=None)["ConditionCheck"]
        mark, raised = _raised_mark(stored, through)
        return {
            "Update": check
            | {
                "UpdateExpression": "SET manual_through = :mark",
                # Races: ``unchanged_action``'s, and the mark's (``_raised_mark``).
                "ConditionExpression": f"{check['ConditionExpression']} AND {raised}",
                "ExpressionAttributeValues": check["ExpressionAttributeValues"] | values(mark=mark),
            }
        }

    def backfill_made_action(
        self, stored: StoredSchedule, *, at: int, paced_until: int | None
    ) -> dict[str, Any]:
        """A transaction action for a backfill made at ``at``: ``manual_run_action``'s (the mark
        raised to ``at``: the reconciler reads the schedule's backfill records in the hours
        up to it, ``OccurrenceStore.backfilled``) that, when some of its occurrences are
        paced, also records when the last becomes receivable (``backfill_until``): a later
        backfill is paced on from there. Conditional on the pace end it was paced from."""
        action = self.manual_run_action(stored, through=at)
        if paced_until is None:
            return action
        update = action["Update"]
        if stored.paced_until is None:
            seen, named = "attribute_not_exists(backfill_until)", {}
        else:
            seen, named = "backfill_until = :seen", {"seen": stored.paced_until}
        return {
            "Update": update
            | {
                "UpdateExpression": f"{update['UpdateExpression']}, backfill_until = :until",
                # Races: ``manual_run_action``'s, and a concurrent backfill of the schedule paced
                # from the same start: the second reads again and is paced after the first.
                "ConditionExpression": f"{update['ConditionExpression']} AND {seen}",
                "ExpressionAttributeValues": update["ExpressionAttributeValues"]
                | values(until=paced_until, **named),
            }
        }

    def put_version_action(self, item: Item) -> dict[str, Any]:
        return {
            "Put": {
                "TableName": self.table,
                "Item": to_dynamo(item),
                # Race: two writers producing the same version number; history is immutable.
                "ConditionExpression": "attribute_not_exists(schedule_id)",
            }
        }

    def rename_action(self, stored: StoredSchedule, renamed: Schedule) -> dict[str, Any]:
        """A transaction action: ``renamed``'s name, version and run version on the CURRENT
        item, its cursor and everything else left as they are (``ControlPlane._rename``)."""
        expected = stored.schedule
        fenced, named = fence(expected, expected.home_region)
        runs_as = _runs_as(renamed)
        return {
            "Update": {
                "TableName": self.table,
                "Key": self.key(expected.schedule_id),
                "UpdateExpression": "SET #d.#name = :name, version = :new, updated_at = :at, "
                "#d.runs_as = :runs, #d.runs_from = :from",
                # Race: as for replace_current (a concurrent change, the materializer's
                # completion, a take-over): the loser re-reads. A materializer step in
                # between is no conflict: the cursor is not written here.
                "ConditionExpression": f"version = :v AND #state = :s AND {fenced}",
                "ExpressionAttributeNames": {
                    "#state": "state",
                    "#d": "definition",
                    "#name": "name",
                },
                "ExpressionAttributeValues": values(
                    name=renamed.name,
                    new=renamed.version,
                    at=renamed.updated_at.isoformat(),
                    runs=runs_as["runs_as"],
                    **{"from": runs_as["runs_from"]},
                    v=expected.version,
                    s=expected.state.value,
                    **named,
                ),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    def replace_current_action(self, item: Item, *, expected: StoredSchedule) -> dict[str, Any]:
        fenced, named = fence(expected.schedule, expected.schedule.home_region)
        return {
            "Put": {
                "TableName": self.table,
                "Item": to_dynamo(item),
                # Race: a concurrent update, pause or cancel moved the version first, or the
                # materializer completed the schedule (same version, state COMPLETED, quota
                # given back): the loser must re-read instead of overwriting it, or the
                # tenant's usage would count a live schedule as released. Or another region
                # took it over (generation, home): the put would hand it back to the old one.
                "ConditionExpression": f"version = :v AND #state = :s AND {fenced}",
                "ExpressionAttributeNames": {"#state": "state"},
                "ExpressionAttributeValues": values(
                    v=expected.schedule.version, s=expected.schedule.state.value, **named
                ),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
