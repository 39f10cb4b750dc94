"""A schedule's items (punctual.dal.schedules): the CURRENT item carries a mark of the
payload's size, never the payload; the version item carries it whole; a schedule read from
a CURRENT item (or an index's copy) has its payload unread, and nothing writes or fires an
unread payload; an item written before the payload left the CURRENT item still reads whole;
the payloads' read is eventually consistent, and consistent again for what it missed."""

from __future__ import annotations

from typing import Any

import pytest

from punctual.dal.common import Dynamo, to_dynamo
from punctual.dal.occurrences import occurrence_to_item
from punctual.dal.schedules import (
    PAYLOAD_MARK,
    PayloadMissing,
    ScheduleStore,
    current_version_of,
    payload_bytes,
    schedule_from_item,
    schedule_to_item,
    version_from_item,
    version_to_item,
)
from punctual.domain.errors import Retryable
from punctual.domain.occurrence import Occurrence
from punctual.domain.schedule import PayloadNotRead
from scripts.capacity.payloads import item_bytes, sample
from tests.fakes import as_client

PAYLOAD = {"report": "daily", "n": 7, "nested": {"list": [1, 2.5, True, None]}}


def current(payload: dict[str, Any]) -> dict[str, Any]:
    schedule = sample(0).model_copy(update={"payload": payload})
    return schedule_to_item(schedule, shard=3, minute_load={0: 1})


def test_schedule_to_item_keeps_the_payload_out_and_marks_its_size():
    # GIVEN a schedule with a payload
    # WHEN its CURRENT item is made
    item = current(PAYLOAD)
    # THEN its definition has no payload, only the payload's size in bytes
    assert "payload" not in item["definition"]
    assert item["definition"][PAYLOAD_MARK] == payload_bytes(PAYLOAD)
    assert PAYLOAD_MARK not in item


def test_schedule_to_item_of_a_schedule_without_a_payload_has_no_mark():
    item = current({})
    assert "payload" not in item["definition"]
    assert PAYLOAD_MARK not in item["definition"]


def test_version_to_item_keeps_the_payload_whole():
    schedule = sample(0).model_copy(update={"payload": PAYLOAD})
    item = version_to_item(schedule, effective_from=1_796_000_000)
    assert item["definition"]["payload"] == PAYLOAD
    assert PAYLOAD_MARK not in item["definition"]
    assert version_from_item(item).schedule.payload == PAYLOAD


def test_a_renamed_schedule_keeps_its_run_version_in_both_items_and_reads_it_back():
    # GIVEN version 3 of a schedule that runs as version 2 since an instant (a rename)
    base = sample(0).model_copy(update={"payload": PAYLOAD})
    renamed = base.model_copy(update={"version": 3, "runs_as": 2, "runs_from": 1_795_000_000})
    # WHEN its CURRENT and version items are made and read back
    items = [
        schedule_to_item(renamed, shard=3, minute_load={}),
        version_to_item(renamed, effective_from=1_796_000_000),
    ]
    # THEN both carry the run version and when it began inside the definition (the index
    # projects it), and read back as the same run version, owning fires after that instant
    for item in items:
        assert (item["definition"]["runs_as"], item["definition"]["runs_from"]) == (
            2,
            1_795_000_000,
        )
    for read in (schedule_from_item(items[0]), version_from_item(items[1]).schedule):
        assert (read.version, read.run_version, read.fires_after) == (3, 2, 1_795_000_000)
    # AND a version that runs as itself carries neither
    plain = schedule_to_item(base, shard=3, minute_load={})
    assert "runs_as" not in plain["definition"]
    assert "runs_from" not in plain["definition"]
    assert schedule_from_item(plain).run_version == base.version


def test_a_current_item_with_a_mark_reads_as_a_payload_not_read_and_refuses_it():
    # GIVEN a CURRENT item of a schedule with a payload
    item = current(PAYLOAD)
    # WHEN it is read as a schedule, or as the version it records (the shard index's way)
    for schedule in (schedule_from_item(item), current_version_of(item).schedule):
        # THEN its payload is not read, and whatever needs it refuses it
        assert schedule.payload is None
        with pytest.raises(PayloadNotRead):
            schedule.known_payload  # noqa: B018
        with pytest.raises(PayloadNotRead):
            version_to_item(schedule, effective_from=1)
        with pytest.raises(PayloadNotRead):
            schedule_to_item(schedule, shard=3, minute_load={})


def test_an_occurrence_is_never_made_with_a_payload_not_read():
    occurrence = Occurrence(
        occurrence_id="occ_sch_acme.k3xq7fz2m9a4tw8bn6c5pd1e_1796000400_3",
        tenant_id="acme",
        schedule_id="sch_acme.k3xq7fz2m9a4tw8bn6c5pd1e",
        schedule_version=3,
        scheduled_for=1_796_000_400,
        available_at=1_796_000_400,
        target="default",
    )
    with pytest.raises(PayloadNotRead):
        occurrence_to_item(occurrence, None)  # type: ignore[arg-type]
    assert occurrence_to_item(occurrence, {})["payload"] == {}


def test_a_current_item_written_before_the_payload_left_it_reads_its_nested_payload():
    # GIVEN a CURRENT item as written before 2026-12-06: the payload nested, no mark
    item = current({})
    item["definition"] = item["definition"] | {"payload": PAYLOAD}
    # WHEN it is read
    schedule = schedule_from_item(item)
    # THEN the nested payload is the schedule's (no version item is read for it)
    assert schedule.payload == PAYLOAD
    assert schedule.known_payload == PAYLOAD


def test_a_current_item_without_payload_or_mark_reads_as_an_empty_payload():
    schedule = schedule_from_item(current({}))
    assert schedule.payload == {}
    assert schedule.known_payload == {}


def test_the_current_item_of_the_largest_payload_is_under_one_write_unit():
    # (The due index projects the whole CURRENT item: every step writes it twice.)
    assert item_bytes(to_dynamo(current(sample(32 * 1024).known_payload))) < 1024


# --- the read of the payloads ------------------------------------------------------------


class Replica:
    """A schedules table's BatchGetItem whose eventually consistent answers lack the version
    items in ``lagging`` (written a moment ago); consistent ones have every item."""

    def __init__(self, items: list[dict[str, Any]], lagging: set[str]) -> None:
        self.items = {(i["schedule_id"], i["sk"]): i for i in items}
        self.lagging = lagging
        self.requests: list[dict[str, Any]] = []

    def batch_get_item(self, RequestItems: dict[str, Any]) -> dict[str, Any]:
        ((table, part),) = RequestItems.items()
        self.requests.append(part)
        found = []
        for key in part["Keys"]:
            wanted = (key["schedule_id"]["S"], key["sk"]["S"])
            if wanted in self.items and (part["ConsistentRead"] or wanted[0] not in self.lagging):
                found.append(to_dynamo(self.items[wanted]))
        return {"Responses": {table: found}}


def _versions(count: int) -> list[dict[str, Any]]:
    return [
        version_to_item(
            sample(0).model_copy(update={"schedule_id": f"sch_acme.{n:024d}", "payload": {"n": n}}),
            effective_from=1,
        )
        for n in range(count)
    ]


def test_payloads_are_read_eventually_consistent_and_what_a_replica_missed_again_consistently():
    # GIVEN 150 version items, two of them written a moment ago (not on the replica yet)
    items = _versions(150)
    lagging = {items[3]["schedule_id"], items[120]["schedule_id"]}
    table = Replica(items, lagging)
    store = ScheduleStore(Dynamo(as_client(table)), "schedules")
    # WHEN the payloads of their schedules are read (as the CURRENT items left them unread)
    unread = [
        schedule_from_item(current({"n": n}) | {"schedule_id": i["schedule_id"]})
        for n, i in enumerate(items)
    ]
    assert {s.payload is None for s in unread} == {True}
    read = store.with_payloads(unread)
    # THEN every one has its own payload
    assert [s.payload for s in read] == [{"n": n} for n in range(150)]
    # AND they were read eventually consistent, 100 a request, only the payload's path, and
    # the two the replica missed once more, consistently
    assert [(len(r["Keys"]), r["ConsistentRead"]) for r in table.requests] == [
        (100, False),
        (50, False),
        (2, True),
    ]
    names = table.requests[0]["ExpressionAttributeNames"]
    assert table.requests[0]["ProjectionExpression"].count(".") == 1
    assert set(names.values()) == {"schedule_id", "sk", "definition", "payload"}


def test_a_version_item_not_found_even_consistently_is_retryable_never_an_empty_payload():
    # GIVEN a CURRENT item whose version item is not in the table at all (another region's
    # write not replicated yet)
    store = ScheduleStore(Dynamo(as_client(Replica([], set()))), "schedules")
    unread = schedule_from_item(current(PAYLOAD))
    # WHEN its payload is read
    # THEN the read is refused, to be tried again
    with pytest.raises(PayloadMissing) as refused:
        store.with_payloads([unread])
    assert isinstance(refused.value, Retryable)


def test_schedules_whose_payloads_are_known_need_no_read():
    table = Replica([], set())
    store = ScheduleStore(Dynamo(as_client(table)), "schedules")
    known = [schedule_from_item(current({})), sample(100)]
    assert store.with_payloads(known) == known
    assert table.requests == []
