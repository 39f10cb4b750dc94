"""A schedule's payload lives in its version item alone (issue 45, item 5): the CURRENT item,
and so the due index (ALL) and by_shard, carry only a mark of its size, whatever it is;
every reader that fires, shows or writes the schedule again reads the payload of the exact
version it acts on (the materializer, the reconciler's repairs, a run now, a backfill, a
re-plan, the API), from a CURRENT item written before the change too (payload nested), and
a version item a lagging replica does not show yet is read again, consistently."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.dal.common import from_dynamo, to_dynamo
from punctual.dal.schedules import PAYLOAD_MARK, due_bucket, payload_bytes, version_sk
from punctual.dal.tables import DUE_INDEX, SHARD_INDEX, current_key
from punctual.domain.ids import occurrence_id, shard_of
from punctual.domain.schedule import MAX_PAYLOAD_BYTES, ScheduleDefinition
from punctual.pipeline.materializer import Materializer
from punctual.pipeline.reconciler import Reconciler
from punctual.services import Services
from punctual.settings import Settings
from punctual.timing import ZoneSource, use_zone_source
from scripts.capacity.payloads import item_bytes
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.instants import epoch
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import cron_spec, current_item, make, occurrence_items
from tests.integration.reconciler.helpers import materialize_until, shards_of


def _near_the_limit() -> dict[str, Any]:
    """A payload of exactly MAX_PAYLOAD_BYTES, with every kind of value a payload holds."""
    shape: dict[str, Any] = {
        "n": 7,
        "f": 2.5,
        "flags": [True, False, None],
        "nested": {"deep": {"k": "v", "list": [1, "two", {"three": 3}]}},
        "text": "",
    }
    shape["text"] = "x" * (MAX_PAYLOAD_BYTES - payload_bytes(shape))
    assert payload_bytes(shape) == MAX_PAYLOAD_BYTES
    return shape


LARGE = _near_the_limit()
SMALL = {"report": "daily", "n": 2}
OTHER = {"report": "weekly", "ratio": 0.25}
DAY = "2026-11-19"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Two shards: each test walks its minutes on each shard its schedules land in."""
    return settings.model_copy(update={"shard_count": 2})


def at(hhmm: str, day: str = DAY) -> int:
    return epoch(f"{day}T{hhmm}Z")


def as_written_before(aws: Services, sid: str) -> None:
    """Rewrite the schedule's CURRENT item as Punctual wrote it before 2026-12-06: its
    payload (its version item's) nested in its definition, no mark of its size."""
    item = current_item(aws, sid)
    version = aws.dynamodb.get_item(
        TableName=aws.settings.schedules_table,
        Key=to_dynamo({"schedule_id": sid, "sk": version_sk(item["version"])}),
        ConsistentRead=True,
    )["Item"]
    definition = from_dynamo(version)["definition"]
    aws.dynamodb.put_item(
        TableName=aws.settings.schedules_table,
        Item=to_dynamo(item | {"definition": definition}),
    )
    assert PAYLOAD_MARK not in current_item(aws, sid)["definition"]


def fired_payloads(aws: Services, sid: str) -> dict[str, dict[str, Any]]:
    """The payload of each of the schedule's occurrences that a message is sent for, by
    occurrence id (a MISSED record, which none is, carries none)."""
    return {
        i["occurrence_id"]["S"]: from_dynamo(i)["payload"]
        for i in occurrence_items(aws, sid)
        if i["state"]["S"] != "MISSED"
    }


def index_entry(aws: Services, index: str, sid: str) -> dict[str, Any]:
    """The schedule's entry in an index of the schedules table, as DynamoDB returns it."""
    pages = aws.dynamodb.get_paginator("scan").paginate(
        TableName=aws.settings.schedules_table, IndexName=index
    )
    [entry] = [i for page in pages for i in page["Items"] if i["schedule_id"]["S"] == sid]
    return dict(entry)


def tick(aws: Services, clock: Clock, sid: str) -> None:
    Materializer(aws, f"m{clock.now}").run_shard(int(clock.now), shard_of(sid, 2))


# --- what is stored --------------------------------------------------------------------


def test_payload_of_the_largest_size_leaves_the_due_and_shard_index_entries_small(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an hourly schedule with a payload of the largest size the API takes (32 KiB)
    sid = make(aws, spec=cron_spec("0 * * * *"), payload=LARGE)
    # WHEN its due index and by_shard entries are read
    due = index_entry(aws, DUE_INDEX, sid)
    by_shard = index_entry(aws, SHARD_INDEX, sid)
    # THEN each is under 1 KB (one write unit) by DynamoDB's item size rules: no payload
    assert item_bytes(due) < 1024
    assert item_bytes(by_shard) < 1024
    assert due["due_bucket"]["S"] == due_bucket(current_item(aws, sid)["due_at"], shard_of(sid, 2))
    # AND the CURRENT item marks the payload's size only, its version item holds it whole
    definition = current_item(aws, sid)["definition"]
    assert "payload" not in definition
    assert definition[PAYLOAD_MARK] == MAX_PAYLOAD_BYTES
    version = aws.dynamodb.get_item(
        TableName=aws.settings.schedules_table,
        Key=to_dynamo({"schedule_id": sid, "sk": version_sk(1)}),
    )["Item"]
    assert from_dynamo(version)["definition"]["payload"] == LARGE


def test_payload_the_materializer_reads_a_minutes_payloads_in_batches_none_without_one(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN 120 hourly schedules due in the same minute, 110 with a payload, 10 without
    with_payload = [make(aws, spec=cron_spec("0 * * * *"), payload={"i": n}) for n in range(110)]
    without = [make(aws, spec=cron_spec("0 * * * *")) for _ in range(10)]
    assert PAYLOAD_MARK not in current_item(aws, without[0])["definition"]
    reads: list[dict[str, Any]] = []
    faults = Faults(FaultPlan.none(), clock)
    faults.before["batch_get_item"] = lambda _, request: reads.append(request["RequestItems"])
    watched = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    # WHEN the materializer walks their minute
    first = current_item(aws, without[0])["next_run_at"]
    clock.now = first - 120
    for shard in shards_of(aws, with_payload + without):
        Materializer(watched, "m1").run_shard(int(clock.now), shard)
    # THEN each fire carries its schedule's own payload, {} for those without one
    for n, sid in enumerate(with_payload):
        assert fired_payloads(aws, sid) == {occurrence_id(sid, 1, first): {"i": n}}
    for sid in without:
        assert fired_payloads(aws, sid) == {occurrence_id(sid, 1, first): {}}
    # AND the payloads were read in batches of at most 100 version items, never one of a
    # schedule without a payload, each once
    asked = [
        key["sk"]["S"] + key["schedule_id"]["S"]
        for request in reads
        for key in request[aws.settings.schedules_table]["Keys"]
    ]
    assert all(len(r[aws.settings.schedules_table]["Keys"]) <= 100 for r in reads)
    assert sorted(asked) == sorted(version_sk(1) + sid for sid in with_payload)


# --- the materializer ------------------------------------------------------------------


@pytest.mark.parametrize("written", ["now", "before"])
def test_payload_every_fire_the_materializer_makes_carries_its_versions_payload(
    alice: Api, aws: Services, clock: Clock, written: str
):
    # GIVEN an hourly schedule with the largest payload (as written now, or before the
    # payload left the CURRENT item)
    sid = make(aws, spec=cron_spec("0 * * * *"), payload=LARGE)
    if written == "before":
        as_written_before(aws, sid)
    first = current_item(aws, sid)["next_run_at"]
    # WHEN the materializer makes its first fire
    clock.now = first - 120
    tick(aws, clock, sid)
    # THEN it carries the payload exactly
    assert fired_payloads(aws, sid) == {occurrence_id(sid, 1, first): LARGE}
    # WHEN the payload is updated (version 2), the schedule paused and resumed (version 4:
    # a change that keeps the payload), and the next fires are made
    plane = ControlPlane(aws)
    clock.now = first + 60
    plane.update("alice", sid, if_match=1, changes={"payload": SMALL})
    plane.pause("alice", sid)
    plane.resume("alice", sid)
    second = current_item(aws, sid)["next_run_at"]
    clock.now = second - 120
    tick(aws, clock, sid)
    # THEN each fire carries the payload of the version that made it
    assert fired_payloads(aws, sid) == {
        occurrence_id(sid, 1, first): LARGE,
        occurrence_id(sid, 4, second): SMALL,
    }


def test_payload_a_version_item_a_lagging_replica_misses_is_read_again_consistently(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN eventually consistent reads served by a replica ten minutes behind the writes
    faults = Faults(FaultPlan(stale=1.0, stale_seconds=600), clock)
    asked: list[tuple[bool, list[str]]] = []
    faults.before["batch_get_item"] = lambda _, request: asked.extend(
        (part.get("ConsistentRead", False), [k["sk"]["S"] for k in part["Keys"]])
        for table, part in request["RequestItems"].items()
        if table == aws.settings.schedules_table
    )
    lagging = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    # AND an hourly schedule with payload OTHER, whose payload is updated to the largest
    # (version 2) 700 s before its next fire, beyond what the API makes itself
    sid = make(aws, spec=cron_spec("0 * * * *"), payload=OTHER)
    fire = current_item(aws, sid)["next_run_at"]
    clock.now = fire - 700
    ControlPlane(lagging).update("alice", sid, if_match=1, changes={"payload": LARGE})
    # WHEN the materializer walks the fire's minute 550 s later on that replica: the due
    # index still shows version 1 (its step is refused and version 2 read consistently),
    # and version 2's item is not on the replica yet
    clock.now = fire - 150
    report = Materializer(lagging, "m1").run_shard(int(clock.now), shard_of(sid, 2))
    # THEN the fire is version 2's, with version 2's payload exactly
    assert report.conflicts == 1
    assert fired_payloads(aws, sid) == {occurrence_id(sid, 2, fire): LARGE}
    # AND the race happened: version 2's item was asked of the lagging replica, then again
    # consistently
    v2 = version_sk(2)
    assert [consistent for consistent, keys in asked if v2 in keys] == [False, True]
    assert faults.injected["stale_read"] > 0


# --- the reconciler --------------------------------------------------------------------


@pytest.mark.parametrize("written", ["now", "before"])
def test_payload_a_repair_fires_the_payload_of_the_version_owning_the_gap(
    alice: Api, aws: Services, clock: Clock, written: str
):
    # GIVEN a */5 schedule made at 09:40 with payload OTHER, updated at 10:20 to the largest
    # payload (version 2), whose 10:45 fire the materializer passed without a record
    clock.now = at("09:40")
    misfire = {"action": "FIRE_ONCE", "max_lateness_seconds": 7 * 86400}
    sid = make(aws, spec=cron_spec("*/5 * * * *"), misfire=misfire, payload=OTHER)
    shards = shards_of(aws, [sid])
    lost = at("10:45")
    materialize_until(aws, clock, at("10:20"), shards, skip=lambda s, t: t == lost)
    ControlPlane(aws).update("alice", sid, if_match=1, changes={"payload": LARGE})
    if written == "before":
        as_written_before(aws, sid)
    materialize_until(aws, clock, at("11:10"), shards, skip=lambda s, t: t == lost)
    gap = occurrence_id(sid, 2, lost)
    assert gap not in fired_payloads(aws, sid)
    # WHEN the reconciler checks [10:00, 11:00) at 12:05 and repairs it
    clock.now = at("12:05")
    [result] = Reconciler(aws, workers=2).run(shards, at("10:00"), at("11:00"))
    # THEN the repair carries version 2's payload, and every fire its own version's
    assert result.fired == [gap]
    fired = fired_payloads(aws, sid)
    assert fired[gap] == LARGE
    for oid, payload in fired.items():
        assert payload == (LARGE if oid.endswith("_2") else OTHER), oid


# --- the API -----------------------------------------------------------------------------


@pytest.mark.parametrize("written", ["now", "before"])
def test_payload_get_list_and_versions_show_it_and_changes_keep_it(
    alice: Api, aws: Services, written: str
):
    # GIVEN a schedule made with the largest payload
    made = alice.post(
        "/v1/schedules", {"spec": cron_spec("0 * * * *"), "target": "default", "payload": LARGE}
    )
    assert made.status == 201, made.body
    sid = made.body["schedule"]["schedule_id"]
    assert made.body["schedule"]["payload"] == LARGE
    if written == "before":
        as_written_before(aws, sid)
    # WHEN it is read, listed, renamed (version 2), paused and resumed (versions 3, 4)
    got = alice.get(f"/v1/schedules/{sid}")
    listed = alice.get("/v1/schedules")
    renamed = alice.call(
        "PATCH", f"/v1/schedules/{sid}", {"name": "renamed"}, headers={"If-Match": "1"}
    )
    paused = alice.post(f"/v1/schedules/{sid}/pause")
    resumed = alice.post(f"/v1/schedules/{sid}/resume")
    # THEN every answer shows the payload, every version keeps it
    assert got.body["schedule"]["payload"] == LARGE
    assert [s["payload"] for s in listed.body["schedules"]] == [LARGE]
    for answer in (renamed, paused, resumed):
        assert answer.status == 200, answer.body
        assert answer.body["schedule"]["payload"] == LARGE
    versions = alice.get(f"/v1/schedules/{sid}/versions").body["versions"]
    assert [(v["version"], v["payload"]) for v in versions] == [
        (4, LARGE),
        (3, LARGE),
        (2, LARGE),
        (1, LARGE),
    ]
    assert alice.get(f"/v1/schedules/{sid}").body["schedule"]["payload"] == LARGE


def test_payload_a_run_now_right_after_a_create_on_a_lagging_replica_carries_it(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a control plane whose eventually consistent reads lag a minute behind
    faults = Faults(FaultPlan(stale=1.0, stale_seconds=60), clock)
    plane = ControlPlane(dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults)))
    # AND a schedule made through it with the largest payload a moment ago
    definition = ScheduleDefinition.model_validate(
        {"spec": cron_spec("0 * * * *"), "target": "default", "payload": LARGE}
    )
    sid = plane.create("alice", definition).schedule.schedule_id
    clock.advance(1)
    # WHEN it is run now (its version item not on the lagging replica yet)
    made = plane.trigger("alice", sid, "key-1")
    # THEN the run carries the payload
    assert fired_payloads(aws, sid) == {made.occurrence.occurrence_id: LARGE}
    assert faults.injected["stale_read"] > 0


@pytest.mark.parametrize("written", ["now", "before"])
def test_payload_a_backfill_carries_the_current_versions_payload(
    alice: Api, aws: Services, clock: Clock, written: str
):
    # GIVEN a */5 schedule made at 09:40 with payload OTHER, updated at 10:00 to the largest
    # (version 2), whose 10:15 fire was passed without a record
    clock.now = at("09:40")
    sid = make(aws, spec=cron_spec("*/5 * * * *"), payload=OTHER)
    shards = shards_of(aws, [sid])
    materialize_until(aws, clock, at("09:55"), shards)
    ControlPlane(aws).update("alice", sid, if_match=1, changes={"payload": LARGE})
    if written == "before":
        as_written_before(aws, sid)
    lost = at("10:15")
    materialize_until(aws, clock, at("10:30"), shards, skip=lambda s, t: t == lost)
    before = fired_payloads(aws, sid)
    # WHEN its owner backfills [09:00, 10:30) at 10:31
    clock.now = at("10:31")
    done = ControlPlane(aws).backfill("alice", sid, at("09:00"), at("10:30"), dry_run=False)
    # THEN every occurrence it made carries version 2's payload (the current version's)
    made = {o.occurrence_id for o in done.made}
    assert occurrence_id(sid, 2, lost) in made
    fired = fired_payloads(aws, sid)
    assert {fired[oid] == LARGE for oid in made} == {True}
    assert {oid: fired[oid] for oid in before} == before


# --- a re-plan under new zone rules ------------------------------------------------------

OLD = ZoneSource("2025b", Path(__file__).parent.parent / "tzdata_2025b")


@pytest.fixture
def old_rules() -> Iterator[None]:
    use_zone_source(OLD)
    yield
    use_zone_source(None)


@pytest.mark.parametrize("written", ["now", "before"])
def test_payload_a_replan_under_new_zone_rules_fires_with_the_versions_payload(
    alice: Api, aws: Services, clock: Clock, old_rules: None, written: str
):
    # GIVEN a daily 09:00 America/Vancouver schedule with the largest payload, made and
    # planned under IANA 2025b (its 09:00 = 17:00Z occurrence made ahead)
    day = "2026-12-02"
    clock.now = at("15:40", day)
    sid = make(aws, spec=cron_spec("0 9 * * *", "America/Vancouver"), payload=LARGE)
    if written == "before":
        as_written_before(aws, sid)
    shards = shards_of(aws, [sid])
    materialize_until(aws, clock, at("16:57", day), shards, every=60)
    assert occurrence_id(sid, 1, at("17:00", day)) in fired_payloads(aws, sid)
    # WHEN the pinned release (09:00 = 16:00Z) is deployed and the reconciler re-plans it
    use_zone_source(None)
    clock.now = at("16:58", day)
    [result] = Reconciler(aws).run(shards, at("16:00", day), at("16:58", day))
    # THEN the 09:00 it fires at its new instant carries the payload
    assert result.replanned == [sid]
    moved = occurrence_id(sid, 1, at("16:00", day))
    assert fired_payloads(aws, sid)[moved] == LARGE


def test_payload_a_current_item_of_a_schedule_without_one_reads_as_empty(alice: Api, aws: Services):
    # GIVEN a schedule made without a payload
    sid = make(aws, spec=cron_spec("0 * * * *"))
    # WHEN its CURRENT item is read
    item = aws.dynamodb.get_item(
        TableName=aws.settings.schedules_table, Key=to_dynamo(current_key(sid))
    )["Item"]
    stored = aws.schedules.current(sid)
    # THEN it has neither a payload nor a mark, and reads as an empty payload (known)
    assert "payload" not in item["definition"]["M"]
    assert PAYLOAD_MARK not in item["definition"]["M"]
    assert stored is not None
    assert stored.schedule.payload == {}
