"""Versions and their occurrences: near-horizon materialization, what a change does to the
occurrences of older versions (answered with their real states), and the version history."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.dal.common import ConditionFailed, Label, to_dynamo
from punctual.dal.tables import occurrence_key
from punctual.domain.errors import Conflict
from punctual.domain.ids import shard_of
from punctual.domain.occurrence import OccurrenceState
from punctual.pipeline.materializer import Materializer
from punctual.services import Services
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.instants import epoch, iso
from tests.integration.conftest import START, Answer, Api, Clock
from tests.integration.helpers import (
    all_pages,
    assert_error,
    create,
    cron,
    current_item,
    delete,
    one_shot,
    overtaken_at_commit,
    patch,
    set_occurrence_state,
)


def _occurrence(api: Api, occurrence_id: str) -> dict[str, Any]:
    answer = api.get(f"/v1/occurrences/{occurrence_id}")
    assert answer.status == 200, answer.body
    found: dict[str, Any] = answer.body
    return found


def _stored_item(aws: Services, occurrence_id: str) -> dict[str, Any]:
    item: dict[str, Any] = aws.dynamodb.get_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(occurrence_id)),
    )["Item"]
    return item


# --- near-horizon materialization -----------------------------------------------------


def test_materialize_one_shot_inside_the_horizon_is_created_by_the_api(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a one-shot 5 s after the clock (the materializer may already be past it)
    when = iso(START + 5)

    # WHEN it is created
    saved = create(alice, one_shot(when, payload={"job": "now", "n": 3}))

    # THEN the API itself created its occurrence, and no fire is left to plan
    [occurrence] = saved["materialized"]
    assert occurrence["scheduled_for"] == when
    assert occurrence["available_at"] == when
    assert occurrence["state"] == "SCHEDULED"
    assert occurrence["schedule_version"] == 1
    schedule = saved["schedule"]
    assert schedule["next_run_at"] is None
    # AND its next fire is that occurrence, made already
    [fire] = saved["next_fires"]
    assert (fire["utc"], fire["occurrence_id"]) == (when, occurrence["occurrence_id"])
    unclaimed: dict[str, Any] = {"to_receivable_seconds": None, "to_claim_seconds": None}
    times = unclaimed | {"run_seconds": [], "retry_wait_seconds": []}
    assert _occurrence(alice, occurrence["occurrence_id"]) == {
        **occurrence,
        "attempts": [],
        "times": times,
    }
    # AND the payload was copied into the occurrence, so the relay needs no schedule read
    item = _stored_item(aws, occurrence["occurrence_id"])
    assert item["payload"] == {"M": {"job": {"S": "now"}, "n": {"N": "3"}}}
    assert item["tenant_id"] == {"S": "alice"}
    # AND it holds its quota until the materializer's pass over its fire completes it
    assert schedule["state"] == "ACTIVE"
    assert alice.get("/v1/tenant").body["schedule_count"] == 1
    # (it waits in the due index past the planned horizon, clear of the next walk, so the
    # tick two minutes later reaches it)
    clock.advance(125)
    shard = shard_of(schedule["schedule_id"], aws.settings.shard_count)
    Materializer(aws, "m1").run_shard(int(clock.now), shard)
    got = alice.get(f"/v1/schedules/{schedule['schedule_id']}").body
    assert (got["schedule"]["state"], got["schedule"]["version"]) == ("COMPLETED", 1)
    assert got["next_fires"] == []
    assert alice.get("/v1/tenant").body["schedule_count"] == 0
    listed = alice.get(f"/v1/schedules/{schedule['schedule_id']}/occurrences").body
    assert [o["occurrence_id"] for o in listed["occurrences"]] == [occurrence["occurrence_id"]]


def test_materialize_cron_far_ahead_is_left_to_the_materializer(alice: Api) -> None:
    # GIVEN a yearly cron whose next fire is at New Year
    # WHEN it is created
    saved = create(alice, cron("0 0 1 1 *"))

    # THEN nothing is materialized and the cursor points at the fire
    assert saved["materialized"] == []
    assert saved["schedule"]["state"] == "ACTIVE"
    assert saved["schedule"]["next_run_at"] == "2027-01-01T00:00:00Z"
    schedule_id = saved["schedule"]["schedule_id"]
    listed = alice.get(f"/v1/schedules/{schedule_id}/occurrences").body
    assert listed == {"occurrences": [], "missed": [], "next_token": None}


def test_materialize_just_past_the_horizon_is_not_created(alice: Api) -> None:
    # GIVEN a one-shot 301 s ahead (the horizon is lookahead 180 s + tick 60 s + the due
    # index's margin 60 s = 300 s)
    # WHEN it is created
    saved = create(alice, one_shot(iso(START + 301)))

    # THEN it waits for the materializer; at 300 s it would have been created
    assert saved["materialized"] == []
    assert saved["schedule"]["next_run_at"] == iso(START + 301)
    edge = create(alice, one_shot(iso(START + 300)))
    assert [o["scheduled_for"] for o in edge["materialized"]] == [iso(START + 300)]


# --- what a change does to older versions' occurrences --------------------------------


@pytest.fixture
def in_flight(alice: Api, aws: Services) -> dict[str, Any]:
    """A '* * * * *' cron with occurrences 11:07..11:11 (SCHEDULED as materialized), of
    which 11:08 waits for a retry, 11:09 is running and 11:10 already succeeded."""
    saved = create(alice, cron("* * * * *", payload={"v": 1}))
    occurrences = saved["materialized"]
    minutes = [o["scheduled_for"][11:16] for o in occurrences]
    assert minutes == ["11:07", "11:08", "11:09", "11:10", "11:11"]
    assert {o["state"] for o in occurrences} == {"SCHEDULED"}
    scheduled, retrying, running, succeeded, later = (o["occurrence_id"] for o in occurrences)
    set_occurrence_state(aws, retrying, "RETRY_WAIT")
    set_occurrence_state(aws, running, "RUNNING")
    set_occurrence_state(aws, succeeded, "SUCCEEDED")
    return {
        "schedule_id": saved["schedule"]["schedule_id"],
        "scheduled": scheduled,
        "retrying": retrying,
        "running": running,
        "succeeded": succeeded,
        "later": later,
    }


def _pause(api: Api, schedule_id: str) -> Answer:
    return api.post(f"/v1/schedules/{schedule_id}/pause")


def _update_payload(api: Api, schedule_id: str) -> Answer:
    return patch(api, schedule_id, {"payload": {"v": 2}}, 1)


CHANGES: dict[str, Callable[[Api, str], Answer]] = {
    "cancel": delete,
    "pause": _pause,
    "update": _update_payload,
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_invalidate_change_answers_the_real_state_of_each_open_occurrence(
    alice: Api, in_flight: dict[str, Any], change: str
) -> None:
    # GIVEN open occurrences of version 1: SCHEDULED (sent or not), RETRY_WAIT and RUNNING
    # (and one done)
    # WHEN the schedule is canceled, paused or updated
    answer = CHANGES[change](alice, in_flight["schedule_id"])

    # THEN version 2 is saved and 'affected' reports each open one with its real state
    assert answer.status == 200, answer.body
    assert answer.body["schedule"]["version"] == 2
    affected = {a["occurrence_id"]: a for a in answer.body["affected"]}
    assert set(affected) == {
        in_flight[name] for name in ("scheduled", "retrying", "running", "later")
    }
    assert affected[in_flight["scheduled"]]["state"] == "CANCELED"
    assert affected[in_flight["later"]]["state"] == "CANCELED"
    assert "will not run" in affected[in_flight["scheduled"]]["note"]
    assert affected[in_flight["retrying"]]["state"] == "RETRY_WAIT"
    assert "worker will refuse it" in affected[in_flight["retrying"]]["note"]
    assert affected[in_flight["running"]]["state"] == "RUNNING"
    assert "cooperatively" in affected[in_flight["running"]]["note"]
    assert all(a["schedule_version"] == 1 for a in affected.values())
    # AND the stored states agree: only the one no worker had taken was canceled
    stored = {
        name: _occurrence(alice, in_flight[name])["state"]
        for name in ("scheduled", "retrying", "running", "succeeded")
    }
    assert stored == {
        "scheduled": "CANCELED",
        "retrying": "RETRY_WAIT",
        "running": "RUNNING",
        "succeeded": "SUCCEEDED",
    }
    reason = _occurrence(alice, in_flight["scheduled"])["reason"]
    assert reason is not None
    assert "version 2" in reason


def test_invalidate_a_change_records_what_it_canceled_after_its_time(
    alice: Api, clock: Clock, in_flight: dict[str, Any]
) -> None:
    # GIVEN the 11:07 fire is due and no worker has taken it (its workers are slow), while
    # 11:11 is still ahead
    clock.now = epoch(_occurrence(alice, in_flight["scheduled"])["available_at"]) + 30
    # WHEN the schedule's payload is updated
    answer = _update_payload(alice, in_flight["schedule_id"])
    # THEN the due one is canceled and says so: in the answer, and in its stored reason,
    # with when it was due; the one ahead is canceled as any superseded one
    assert answer.status == 200, answer.body
    affected = {a["occurrence_id"]: a for a in answer.body["affected"]}
    due, ahead = affected[in_flight["scheduled"]], affected[in_flight["later"]]
    assert due["note"].startswith("canceled after its time"), due
    assert not ahead["note"].startswith("canceled after its time"), ahead
    reason = _occurrence(alice, in_flight["scheduled"])["reason"]
    assert reason.startswith("superseded by version 2 (ACTIVE) after its time: due "), reason
    assert "after its time" not in _occurrence(alice, in_flight["later"])["reason"]


def test_invalidate_affected_entry_matches_the_stored_occurrence(
    alice: Api, in_flight: dict[str, Any]
) -> None:
    # GIVEN a SCHEDULED occurrence of version 1
    # WHEN the schedule is canceled
    answer = delete(alice, in_flight["schedule_id"])

    # THEN the answer's entry for it is the occurrence as stored (plus the note)
    [entry] = [a for a in answer.body["affected"] if a["occurrence_id"] == in_flight["scheduled"]]
    stored = _occurrence(alice, in_flight["scheduled"])
    del stored["attempts"], stored["times"]  # (the detail's own)
    assert {k: v for k, v in entry.items() if k != "note"} == stored


def test_invalidate_cancel_that_loses_the_race_answers_the_state_that_won(
    aws: Services, in_flight: dict[str, Any]
) -> None:
    # GIVEN an occurrence read as SCHEDULED that a worker claims before the cancel lands
    occurrence_id = in_flight["scheduled"]
    set_occurrence_state(aws, occurrence_id, "RUNNING")
    # WHEN the change tries to cancel it
    answered = aws.occurrences.cancel_if_scheduled(occurrence_id, "superseded")
    # THEN the cancel changed nothing and the answer is the state that won
    assert answered is OccurrenceState.RUNNING
    stored = aws.occurrences.get(occurrence_id)
    assert stored is not None
    assert (stored.state, stored.reason) == (OccurrenceState.RUNNING, None)


def test_invalidate_update_replaces_scheduled_occurrences_with_new_version_ones(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a '* * * * *' cron with five SCHEDULED occurrences of version 1
    saved = create(alice, cron("* * * * *", payload={"v": 1}))
    schedule_id = saved["schedule"]["schedule_id"]
    old = {o["occurrence_id"]: o for o in saved["materialized"]}

    # WHEN its payload is updated half a minute later
    clock.advance(30)
    answer = patch(alice, schedule_id, {"payload": {"v": 2}}, 1)

    # THEN the old ones are canceled and the same instants are planned again as version 2
    assert answer.status == 200, answer.body
    assert {a["occurrence_id"] for a in answer.body["affected"]} == set(old)
    assert {a["state"] for a in answer.body["affected"]} == {"CANCELED"}
    new = {o["occurrence_id"]: o for o in answer.body["materialized"]}
    assert not set(new) & set(old)
    assert [o["scheduled_for"] for o in new.values()] == [
        f"2026-11-18T11:{minute:02d}:00Z" for minute in (8, 9, 10, 11, 12)
    ]
    assert {o["schedule_version"] for o in new.values()} == {2}
    assert {_occurrence(alice, i)["state"] for i in old} == {"CANCELED"}
    assert {_occurrence(alice, i)["state"] for i in new} == {"SCHEDULED"}
    # AND each new occurrence carries the new payload
    for occurrence_id in new:
        assert _stored_item(aws, occurrence_id)["payload"] == {"M": {"v": {"N": "2"}}}
    # AND the listing shows both generations, old canceled and new scheduled
    listed = alice.get(f"/v1/schedules/{schedule_id}/occurrences").body["occurrences"]
    by_version = {(o["schedule_version"], o["state"]) for o in listed}
    assert by_version == {(1, "CANCELED"), (2, "SCHEDULED")}
    assert len(listed) == len(old) + len(new)


def test_invalidate_update_of_a_paused_schedule_materializes_nothing(alice: Api) -> None:
    # GIVEN a paused '* * * * *' cron (its occurrences already canceled by the pause)
    saved = create(alice, cron("* * * * *"))
    schedule_id = saved["schedule"]["schedule_id"]
    assert alice.post(f"/v1/schedules/{schedule_id}/pause").status == 200

    # WHEN it is updated
    answer = patch(alice, schedule_id, {"name": "still paused"}, 2)

    # THEN it stays paused at version 3, nothing is planned, and nothing is left open
    assert answer.status == 200, answer.body
    schedule = answer.body["schedule"]
    assert (schedule["state"], schedule["version"], schedule["next_run_at"]) == (
        "PAUSED",
        3,
        None,
    )
    assert answer.body["materialized"] == []
    assert answer.body["affected"] == []


# --- version history ------------------------------------------------------------------


def test_version_history_keeps_one_immutable_item_per_version(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a schedule that is created, updated, paused, resumed and canceled, a minute apart
    saved = create(alice, cron("*/5 * * * *", name="v1"))
    schedule_id = saved["schedule"]["schedule_id"]
    steps: list[Callable[[], Answer]] = [
        lambda: patch(alice, schedule_id, {"name": "v2"}, 1),
        lambda: alice.post(f"/v1/schedules/{schedule_id}/pause"),
        lambda: alice.post(f"/v1/schedules/{schedule_id}/resume"),
        lambda: delete(alice, schedule_id),
    ]
    for step in steps:
        clock.advance(60)
        assert step().status == 200

    # WHEN the schedules table is queried for the schedule's items
    items = aws.dynamodb.query(
        TableName=aws.settings.schedules_table,
        KeyConditionExpression="schedule_id = :s",
        ExpressionAttributeValues={":s": {"S": schedule_id}},
        ConsistentRead=True,
    )["Items"]

    # THEN there is CURRENT (at version 5) and one history item per version, in order
    by_sk = {item["sk"]["S"]: item for item in items}
    assert sorted(by_sk) == ["CURRENT"] + [f"V#{n:010d}" for n in range(1, 6)]
    assert by_sk["CURRENT"]["version"] == {"N": "5"}
    assert by_sk["CURRENT"]["state"] == {"S": "CANCELED"}
    history = [by_sk[f"V#{n:010d}"] for n in range(1, 6)]
    assert [int(h["version"]["N"]) for h in history] == [1, 2, 3, 4, 5]
    assert [h["state"]["S"] for h in history] == [
        "ACTIVE",
        "ACTIVE",
        "PAUSED",
        "ACTIVE",
        "CANCELED",
    ]
    assert [int(h["effective_from"]["N"]) for h in history] == [START + 60 * n for n in range(5)]
    assert [h["definition"]["M"]["name"]["S"] for h in history] == ["v1"] + ["v2"] * 4


def test_versions_are_listed_newest_first_with_when_each_took_effect(
    alice: Api, bob: Api, clock: Clock
) -> None:
    # GIVEN a schedule created, renamed and paused, a minute apart
    schedule_id = create(alice, cron("*/5 * * * *", name="v1"))["schedule"]["schedule_id"]
    clock.advance(60)
    assert patch(alice, schedule_id, {"name": "v2"}, 1).status == 200
    clock.advance(60)
    assert alice.post(f"/v1/schedules/{schedule_id}/pause").status == 200

    # WHEN its versions are listed, one to a page
    pages = all_pages(alice, f"/v1/schedules/{schedule_id}/versions", "versions", limit=1)

    # THEN every version comes once, newest first, with its own state, definition and time
    versions = [v for page in pages for v in page]
    assert [len(page) for page in pages[:3]] == [1, 1, 1]
    assert [v["version"] for v in versions] == [3, 2, 1]
    assert [v["state"] for v in versions] == ["PAUSED", "ACTIVE", "ACTIVE"]
    assert [v["name"] for v in versions] == ["v2", "v2", "v1"]
    assert [v["effective_from"] for v in versions] == [
        iso(START + 120),
        iso(START + 60),
        iso(START),
    ]
    assert versions[-1]["spec"]["expression"] == "*/5 * * * *"
    # AND another tenant is answered as if the schedule did not exist
    assert bob.get(f"/v1/schedules/{schedule_id}/versions").status == 404


def test_versions_list_a_change_made_a_moment_ago_on_a_lagging_replica(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a control plane whose eventually consistent reads lag a minute
    faults = Faults(FaultPlan(stale=1.0, stale_seconds=60), clock)
    plane = ControlPlane(dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults)))
    schedule_id = create(alice, cron(name="v1"))["schedule"]["schedule_id"]
    clock.advance(120)
    # WHEN it is changed, and its versions are listed a second later
    plane.update("alice", schedule_id, if_match=1, changes={"name": "v2"})
    clock.advance(1)
    found, _ = plane.versions("alice", schedule_id, limit=10, token=None)
    # THEN the new version is there (the caller has just been answered with it)
    assert [v.schedule.version for v in found] == [2, 1]


def test_listing_a_moment_after_a_change_on_a_lagging_replica_shows_the_change(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a control plane whose eventually consistent reads (and indexes) lag a minute
    plan = FaultPlan(stale=1.0, stale_seconds=60, index_lag=1.0, index_lag_seconds=60)
    faults = Faults(plan, clock)
    plane = ControlPlane(dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults)))
    schedule_id = create(alice, cron(name="v1"))["schedule"]["schedule_id"]
    clock.advance(120)
    # WHEN it is changed, and the tenant's schedules are listed a second later
    plane.update("alice", schedule_id, if_match=1, changes={"name": "v2"})
    clock.advance(1)
    found, _ = plane.list_schedules("alice", state=None, limit=10, token=None)
    # THEN the listing shows the change (the caller has just been answered with it): the
    # index gives the keys, the items are read from the table consistently
    assert [(s.schedule_id, s.version, s.name) for s in found] == [(schedule_id, 2, "v2")]


def test_versions_refuse_a_token_minted_for_another_schedule(alice: Api) -> None:
    # GIVEN a page token of one schedule's versions
    first = create(alice, cron(name="a"))["schedule"]["schedule_id"]
    second = create(alice, cron(name="b"))["schedule"]["schedule_id"]
    assert patch(alice, first, {"name": "a2"}, 1).status == 200
    token = alice.get(f"/v1/schedules/{first}/versions", limit=1).body["next_token"]
    assert token
    # WHEN it is sent with another schedule's listing
    answer = alice.get(f"/v1/schedules/{second}/versions", next_token=token)
    # THEN it is refused, naming the field and why
    error = assert_error(answer, 400, "invalid_input")
    assert error["message"] == "next_token is not valid"
    assert error["fields"] == [{"field": "next_token", "reason": "not a token we issued"}]


@pytest.mark.parametrize(
    ("listing", "sk"),
    [
        ("versions", "CURRENT"),
        ("versions", "W#0000000001"),
        ("occurrences", "CURRENT"),
        ("occurrences", "V#0000000001"),
    ],
)
def test_a_token_naming_a_key_outside_the_listing_is_refused_not_a_500(
    alice: Api, listing: str, sk: str
) -> None:
    # GIVEN a token crafted for the schedule (the tenant's own) with a sort key the
    # listing's query does not cover (DynamoDB refuses such a start key: a ValidationException)
    schedule_id = create(alice, cron(name="a"))["schedule"]["schedule_id"]
    key = json.dumps({"schedule_id": schedule_id, "sk": sk}).encode()
    token = base64.urlsafe_b64encode(key).decode().rstrip("=")
    # WHEN it is sent
    answer = alice.get(f"/v1/schedules/{schedule_id}/{listing}", next_token=token)
    # THEN it is a 400 naming the field
    assert answer.status == 400, answer.body
    assert answer.body["error"]["fields"][0]["field"] == "next_token"


def test_version_history_is_not_rewritten_by_a_refused_change(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a schedule at version 2
    schedule_id = create(alice, cron(name="v1"))["schedule"]["schedule_id"]
    assert patch(alice, schedule_id, {"name": "v2"}, 1).status == 200

    # WHEN a stale update (If-Match 1) and an invalid one are refused
    clock.advance(60)
    assert patch(alice, schedule_id, {"name": "stale"}, 1).status == 409
    assert patch(alice, schedule_id, {"target": "nowhere"}, 2).status == 400

    # THEN the history still holds exactly versions 1 and 2, unchanged
    items = aws.dynamodb.query(
        TableName=aws.settings.schedules_table,
        KeyConditionExpression="schedule_id = :s AND begins_with(sk, :v)",
        ExpressionAttributeValues={":s": {"S": schedule_id}, ":v": {"S": "V#"}},
    )["Items"]
    assert [(i["sk"]["S"], i["definition"]["M"]["name"]["S"]) for i in items] == [
        ("V#0000000001", "v1"),
        ("V#0000000002", "v2"),
    ]


def test_invalidate_sees_an_occurrence_made_just_before_the_change(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN eventually consistent reads lagging a minute, and a version-1 occurrence the
    # materializer wrote a moment before the change
    faults = Faults(FaultPlan(stale=1.0, stale_seconds=60), clock)
    lagging = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    schedule_id = create(alice, cron("0 * * * *"))["schedule"]["schedule_id"]
    clock.now = 1_795_003_200 - 120  # two minutes before 12:00
    Materializer(lagging, "m1").run_shard(
        int(clock.now), shard_of(schedule_id, aws.settings.shard_count)
    )
    [made] = alice.get(f"/v1/schedules/{schedule_id}/occurrences").body["occurrences"]
    # WHEN the schedule is paused right after
    saved = ControlPlane(lagging).pause("alice", schedule_id)
    # THEN the answer names it, CANCELED, as stored
    assert [(a.occurrence.occurrence_id, a.occurrence.state) for a in saved.affected] == [
        (made["occurrence_id"], OccurrenceState.CANCELED)
    ]
    assert _occurrence(alice, made["occurrence_id"])["state"] == "CANCELED"


def test_a_pause_overtaken_at_its_commit_by_an_update_is_409_naming_the_version_that_won(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a schedule at version 1, and a pause that read it, overtaken before its commit
    # by an update (version 2)
    schedule_id = create(alice, cron(name="v1"))["schedule"]["schedule_id"]

    def update() -> object:
        return ControlPlane(aws).update("alice", schedule_id, if_match=1, changes={"name": "v2"})

    plane, _ = overtaken_at_commit(aws, clock, update)
    # WHEN the pause commits
    with pytest.raises(Conflict) as refused:
        plane.pause("alice", schedule_id)
    # THEN it is refused, naming the version now current, and the update stands: the pause
    # was meant for a version that no longer is, so it is not applied to the new one
    assert refused.value.details == {"current_version": 2}
    assert "changed meanwhile (now version 2)" in refused.value.message
    schedule = alice.get(f"/v1/schedules/{schedule_id}").body["schedule"]
    assert (schedule["version"], schedule["state"], schedule["name"]) == (2, "ACTIVE", "v2")


def _completed_at_the_first_commit(
    alice: Api, aws: Services, clock: Clock
) -> tuple[str, ControlPlane]:
    """A one-shot due in a minute, and a control plane whose first commit is overtaken by
    the materializer completing it (same version, state COMPLETED)."""
    at = START - START % 3600 + 2 * 3600
    schedule_id = create(alice, one_shot(iso(at)))["schedule"]["schedule_id"]
    clock.now = at - 60

    def complete() -> object:
        number = shard_of(schedule_id, aws.settings.shard_count)
        return Materializer(aws, "m1").run_shard(int(clock.now), number)

    plane, _ = overtaken_at_commit(aws, clock, complete)
    return schedule_id, plane


def test_a_pause_overtaken_at_its_commit_by_the_completion_is_decided_again_on_a_fresh_read(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a one-shot due in a minute, and a pause that read it ACTIVE, overtaken before its
    # commit by the materializer completing it (same version, state COMPLETED)
    schedule_id, plane = _completed_at_the_first_commit(alice, aws, clock)
    # WHEN the pause commits
    with pytest.raises(Conflict) as refused:
        plane.pause("alice", schedule_id)
    # THEN it is decided again on what is stored now: a COMPLETED schedule cannot be paused
    # (not a version conflict: the version is the one the pause read)
    assert refused.value.details == {"state": "COMPLETED"}
    schedule = alice.get(f"/v1/schedules/{schedule_id}").body["schedule"]
    assert (schedule["version"], schedule["state"]) == (1, "COMPLETED")


def test_versions_since_an_instant_start_at_the_version_in_effect_then(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a schedule changed at an instant
    schedule_id = create(alice, cron(name="v1"))["schedule"]["schedule_id"]
    clock.advance(60)
    changed = int(clock.now)
    assert patch(alice, schedule_id, {"name": "v2"}, 1).status == 200
    # THEN the history since that instant starts at the new version (in effect from it);
    # a second earlier, at the old one
    since = aws.schedules.versions_since
    assert [v.schedule.version for v in since(schedule_id, changed)] == [2]
    assert [v.schedule.version for v in since(schedule_id, changed - 1)] == [1, 2]


def test_a_second_change_a_moment_after_the_first_on_a_lagging_replica_is_applied(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a control plane whose eventually consistent reads lag a minute
    replica = FaultyDynamoDB(aws.dynamodb, Faults(FaultPlan(stale=1.0, stale_seconds=60), clock))
    plane = ControlPlane(dataclasses.replace(aws, dynamodb=replica))
    schedule_id = create(alice, cron(name="v1"))["schedule"]["schedule_id"]
    clock.advance(120)
    plane.update("alice", schedule_id, if_match=1, changes={"name": "v2"})
    # WHEN the caller, answered with version 2, changes it again a second later
    clock.advance(1)
    saved = plane.update("alice", schedule_id, if_match=2, changes={"name": "v3"})
    # THEN the change reads the schedule as committed (strongly consistent: a stale read
    # would see version 1 and refuse If-Match 2) and is applied
    assert (saved.schedule.version, saved.schedule.name) == (3, "v3")
    assert plane.get("alice", schedule_id).version == 3


# --- a change of nothing that runs: a rename (issue 46, item 6) ------------------------


def test_a_rename_cancels_nothing_and_keeps_its_run_version(
    alice: Api, clock: Clock, in_flight: dict[str, Any]
) -> None:
    # GIVEN open occurrences of version 1 (SCHEDULED, RETRY_WAIT, RUNNING), the first due
    # and not taken yet
    schedule_id = in_flight["schedule_id"]
    clock.now = epoch(_occurrence(alice, in_flight["scheduled"])["available_at"]) + 30
    before = {o["occurrence_id"]: o["state"] for o in _listed(alice, schedule_id)}
    # WHEN it is renamed (the rest of its definition sent again as it is counts the same)
    current = alice.get(f"/v1/schedules/{schedule_id}").body["schedule"]
    definition = {k: current[k] for k in ("spec", "target", "retry", "misfire", "overlap")}
    answer = patch(alice, schedule_id, {**definition, "name": "renamed"}, 1)
    # THEN version 2 runs as version 1: nothing canceled, nothing planned again
    assert answer.status == 200, answer.body
    schedule = answer.body["schedule"]
    assert (schedule["version"], schedule["run_version"], schedule["name"]) == (2, 1, "renamed")
    assert (answer.body["affected"], answer.body["materialized"]) == ([], [])
    assert answer.headers["ETag"] == '"2"'
    assert {o["occurrence_id"]: o["state"] for o in _listed(alice, schedule_id)} == before
    # AND the history has both versions, the second running as the first
    versions = alice.get(f"/v1/schedules/{schedule_id}/versions").body["versions"]
    assert [(v["version"], v["run_version"], v["name"]) for v in versions] == [
        (2, 1, "renamed"),
        (1, 1, None),
    ]
    # AND what happens next is still version 1's fires: the occurrences made already
    fires = alice.get(f"/v1/schedules/{schedule_id}").body["next_fires"]
    made = [f["occurrence_id"] for f in fires if f["occurrence_id"] is not None]
    assert made
    assert set(made) <= set(before)


def _listed(api: Api, schedule_id: str) -> list[dict[str, Any]]:
    return [
        o
        for page in all_pages(api, f"/v1/schedules/{schedule_id}/occurrences", "occurrences")
        for o in page
    ]


@pytest.mark.parametrize(
    ("change", "run_version"),
    [({"name": "renamed", "payload": {"v": 2}}, 2), ({"name": "renamed", "target": "other"}, 2)],
)
def test_a_rename_with_any_other_change_supersedes_as_any_change(
    alice: Api, in_flight: dict[str, Any], change: dict[str, Any], run_version: int
) -> None:
    # GIVEN open occurrences of version 1; WHEN the name and something that runs change
    if "target" in change:
        assert alice.post("/v1/targets", {"name": "other"}).status == 201
    answer = patch(alice, in_flight["schedule_id"], change, 1)
    # THEN it is a change of what runs: its own run version, and version 1's open ones no
    # worker took are canceled
    assert answer.status == 200, answer.body
    assert answer.body["schedule"]["run_version"] == run_version
    canceled = {a["occurrence_id"] for a in answer.body["affected"] if a["state"] == "CANCELED"}
    assert canceled == {in_flight["scheduled"], in_flight["later"]}


def test_a_rename_of_a_paused_schedule_keeps_it_paused_and_its_resume_is_a_new_run(
    alice: Api,
) -> None:
    # GIVEN a paused cron (version 2)
    schedule_id = create(alice, cron("* * * * *"))["schedule"]["schedule_id"]
    assert alice.post(f"/v1/schedules/{schedule_id}/pause").status == 200
    # WHEN it is renamed, then resumed
    renamed = patch(alice, schedule_id, {"name": "renamed"}, 2)
    resumed = alice.post(f"/v1/schedules/{schedule_id}/resume")
    # THEN the rename keeps it paused and plans nothing; the resume runs as itself
    assert renamed.status == 200, renamed.body
    schedule = renamed.body["schedule"]
    assert (schedule["state"], schedule["version"], schedule["run_version"]) == ("PAUSED", 3, 2)
    assert renamed.body["materialized"] == []
    assert resumed.status == 200, resumed.body
    schedule = resumed.body["schedule"]
    assert (schedule["state"], schedule["version"], schedule["run_version"]) == ("ACTIVE", 4, 4)
    assert {o["schedule_version"] for o in resumed.body["materialized"]} == {4}


def test_a_rename_overtaken_at_its_commit_by_a_materializer_step_keeps_the_new_cursor(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a */5 cron the API planned a few minutes ahead, and a rename that read it,
    # overtaken before its commit by the materializer planning further
    schedule_id = create(alice, cron("*/5 * * * *"))["schedule"]["schedule_id"]
    before = current_item(aws, schedule_id)
    clock.advance(20 * 60)

    def step() -> object:
        number = shard_of(schedule_id, aws.settings.shard_count)
        return Materializer(aws, "m1").run_shard(int(clock.now), number)

    plane, _ = overtaken_at_commit(aws, clock, step)
    # WHEN the rename commits
    saved = plane.update("alice", schedule_id, if_match=1, changes={"name": "renamed"})
    # THEN it is applied, and the cursor is the materializer's, not the one the rename read
    # (written back, it would plan those fires again, or strand the schedule behind the walk)
    after = current_item(aws, schedule_id)
    assert after["planned_until"] > before["planned_until"]
    assert (after["version"], after["definition"]["name"]) == (2, "renamed")
    assert saved.schedule.run_version == 1
    for key in ("planned_until", "next_run_at", "next_available_at", "due_bucket"):
        assert after[key] != before[key], key


def test_a_rename_overtaken_at_its_commit_by_an_update_is_409_naming_the_version_that_won(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a rename that read version 1, overtaken before its commit by a payload update
    schedule_id = create(alice, cron())["schedule"]["schedule_id"]

    def update() -> object:
        plane = ControlPlane(aws)
        return plane.update("alice", schedule_id, if_match=1, changes={"payload": {"v": 2}})

    plane, _ = overtaken_at_commit(aws, clock, update)
    # WHEN the rename commits
    with pytest.raises(Conflict) as refused:
        plane.update("alice", schedule_id, if_match=1, changes={"name": "renamed"})
    # THEN it is refused, naming the version now current, and the update stands
    assert refused.value.details == {"current_version": 2}
    schedule = alice.get(f"/v1/schedules/{schedule_id}").body["schedule"]
    assert (schedule["version"], schedule["run_version"], schedule["name"]) == (2, 2, None)


def test_a_rename_overtaken_at_its_commit_by_the_completion_renames_the_completed_schedule(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a one-shot due in a minute, and a rename that read it ACTIVE, overtaken before its
    # commit by the materializer completing it
    schedule_id, plane = _completed_at_the_first_commit(alice, aws, clock)
    # WHEN the rename commits
    saved = plane.update("alice", schedule_id, if_match=1, changes={"name": "renamed"})
    # THEN it is decided again on a fresh read: the completed schedule is renamed, and stays
    # COMPLETED (a rename does not revive it, nor give its quota back a second time)
    assert (saved.schedule.state.value, saved.schedule.version) == ("COMPLETED", 2)
    schedule = alice.get(f"/v1/schedules/{schedule_id}").body["schedule"]
    assert (schedule["state"], schedule["name"], schedule["run_version"]) == (
        "COMPLETED",
        "renamed",
        1,
    )
    usage = alice.get("/v1/tenant").body
    assert usage["schedule_count"] == 0, usage


def test_an_update_to_what_the_schedule_says_already_changes_nothing(
    alice: Api, in_flight: dict[str, Any]
) -> None:
    # GIVEN a schedule at version 1 with open occurrences
    schedule_id = in_flight["schedule_id"]
    current = alice.get(f"/v1/schedules/{schedule_id}").body["schedule"]
    # WHEN a PATCH gives it what it says already (a retry after a lost answer)
    answer = patch(alice, schedule_id, {"spec": current["spec"], "payload": {"v": 1}}, 1)
    again = patch(alice, schedule_id, {"name": None, "overlap": current["overlap"]}, 1)
    # THEN both answer 200, saying so: no new version, nothing canceled
    for done in (answer, again):
        assert done.status == 200, done.body
        assert done.body["schedule"]["version"] == 1
        assert (done.body["affected"], done.body["materialized"]) == ([], [])
        assert "the schedule says this already" in done.body["notes"]
    versions = alice.get(f"/v1/schedules/{schedule_id}/versions").body["versions"]
    assert [v["version"] for v in versions] == [1]


def test_a_change_refused_on_its_version_item_is_a_conflict_to_read_again(
    alice: Api, aws: Services
) -> None:
    # GIVEN a change whose transaction was refused on an action that names no schedule or
    # tenant state (its version item: another writer made that version first)
    schedule_id = create(alice, cron())["schedule"]["schedule_id"]
    plane = ControlPlane(aws)
    stored = plane.schedules.current(schedule_id)
    # WHEN the refusal is read; THEN it is a 409 that says to read the schedule again
    refusal = plane._refusal(ConditionFailed(Label.VERSION, None), stored, None, {})
    assert isinstance(refusal, Conflict)
    assert refusal.message == "a concurrent change won; read the schedule again"
