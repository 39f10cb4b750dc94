"""Every schedule, occurrence, preview, target, tenant and meta endpoint: success and errors.

The clock starts at START = 2026-11-18T11:06:40Z and only moves when a test moves it;
the materialization horizon is lookahead + tick + the due index's margin = 300 s, so fires
up to 11:11:40 are created by the API itself.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest

from punctual.dal.common import to_dynamo
from punctual.dal.tables import occurrence_key
from punctual.services import Services
from tests.instants import epoch, iso
from tests.integration.conftest import START, Answer, Api, Clock
from tests.integration.helpers import (
    all_pages,
    assert_error,
    create,
    cron,
    delete,
    one_shot,
    patch,
    rate,
    table_items,
)

MINUTE = 60


def _assert_nothing_written(api: Api, aws: Services) -> None:
    listed = api.get("/v1/schedules")
    assert listed.status == 200
    assert listed.body == {"schedules": [], "next_token": None}
    assert api.get("/v1/tenant").body["schedule_count"] == 0
    assert api.get("/v1/tenant").body["strict_fires_per_minute_peak"] == 0
    assert table_items(aws, aws.settings.schedules_table) == []
    assert table_items(aws, aws.settings.occurrences_table) == []


# --- POST /v1/schedules ---------------------------------------------------------------


def test_create_cron_returns_schedule_next_fires_and_materialized(alice: Api) -> None:
    # GIVEN a tenant with its default target
    # WHEN it creates an every-5-minutes UTC cron at 11:06:40
    answer = alice.post(
        "/v1/schedules", cron("*/5 * * * *", name="report", payload={"report": "daily"})
    )

    # THEN it is saved as version 1 and the first fire inside the horizon is materialized
    assert answer.status == 201, answer.body
    schedule = answer.body["schedule"]
    assert schedule["schedule_id"].startswith("sch_")
    assert schedule["version"] == 1
    assert schedule["state"] == "ACTIVE"
    assert schedule["name"] == "report"
    assert schedule["spec"]["expression"] == "*/5 * * * *"
    assert schedule["spec"]["timezone"] == "UTC"
    assert schedule["target"] == "default"
    assert schedule["payload"] == {"report": "daily"}
    assert schedule["flexible_window_seconds"] == 0
    assert schedule["created_at"] == "2026-11-18T11:06:40+00:00"
    assert schedule["next_run_at"] == "2026-11-18T11:15:00Z"
    # AND the next fires are what will happen next: 11:10, made already, then the planned ones
    assert [f["utc"] for f in answer.body["next_fires"]] == [
        "2026-11-18T11:10:00Z",
        "2026-11-18T11:15:00Z",
        "2026-11-18T11:20:00Z",
        "2026-11-18T11:25:00Z",
        "2026-11-18T11:30:00Z",
    ]
    [occurrence] = answer.body["materialized"]
    assert [f["occurrence_id"] for f in answer.body["next_fires"]] == [
        occurrence["occurrence_id"],
        None,
        None,
        None,
        None,
    ]
    assert answer.body["notes"] == []
    assert answer.body["affected"] == []
    assert occurrence["scheduled_for"] == "2026-11-18T11:10:00Z"
    assert occurrence["available_at"] == "2026-11-18T11:10:00Z"
    assert occurrence["state"] == "SCHEDULED"
    assert occurrence["schedule_id"] == schedule["schedule_id"]
    assert occurrence["schedule_version"] == 1
    assert occurrence["target"] == "default"
    assert alice.get("/v1/tenant").body["schedule_count"] == 1


def test_create_cron_in_a_zone_shows_local_and_utc_times(alice: Api) -> None:
    # GIVEN a daily 09:00 cron in Berlin (UTC+1 in November)
    # WHEN it is created
    saved = create(alice, cron("0 9 * * *", "Europe/Berlin"))

    # THEN the fires are 08:00 UTC / 09:00 local and nothing is due inside the horizon
    first = saved["next_fires"][0]
    assert first == {
        "utc": "2026-11-19T08:00:00Z",
        "local": "2026-11-19T09:00:00+01:00",
        "available_at": "2026-11-19T08:00:00Z",
        "occurrence_id": None,
    }
    assert saved["schedule"]["next_run_at"] == "2026-11-19T08:00:00Z"
    assert saved["materialized"] == []


def test_create_rate_fires_from_the_creation_instant(alice: Api) -> None:
    # GIVEN a rate of 2 minutes without an anchor (anchored at creation)
    # WHEN it is created
    saved = create(alice, rate("rate(2 minutes)"))

    # THEN the creation instant itself fires and every fire within 240 s is materialized
    assert [o["scheduled_for"] for o in saved["materialized"]] == [
        iso(START),
        iso(START + 2 * MINUTE),
        iso(START + 4 * MINUTE),
    ]
    assert saved["schedule"]["next_run_at"] == iso(START + 6 * MINUTE)
    # AND the next fires start with the made ones, the creation instant's included
    made = [(f["utc"], f["occurrence_id"]) for f in saved["next_fires"][:3]]
    assert made == [(o["scheduled_for"], o["occurrence_id"]) for o in saved["materialized"]]
    assert saved["next_fires"][3]["utc"] == iso(START + 6 * MINUTE)
    assert saved["next_fires"][3]["occurrence_id"] is None


def test_create_one_shot_far_ahead_is_active_with_one_fire(alice: Api) -> None:
    # GIVEN a one-shot at a local time in Berlin on Christmas Eve
    # WHEN it is created
    saved = create(alice, one_shot("2026-12-24T18:00:00", "Europe/Berlin"))

    # THEN its single fire is 17:00 UTC and it waits for it
    assert saved["schedule"]["state"] == "ACTIVE"
    assert saved["schedule"]["next_run_at"] == "2026-12-24T17:00:00Z"
    assert saved["next_fires"] == [
        {
            "utc": "2026-12-24T17:00:00Z",
            "local": "2026-12-24T18:00:00+01:00",
            "available_at": "2026-12-24T17:00:00Z",
            "occurrence_id": None,
        }
    ]
    assert saved["materialized"] == []


def test_create_one_shot_ambiguous_local_time_says_which_instant(alice: Api) -> None:
    # GIVEN 02:30 on the night Berlin falls back in 2027 (it occurs twice)
    # WHEN a one-shot is created for it
    saved = create(alice, one_shot("2027-10-31T02:30:00", "Europe/Berlin"))

    # THEN the earlier instant is used and the response's notes say so
    assert saved["schedule"]["next_run_at"] == "2027-10-31T00:30:00Z"
    assert any("occurs twice" in note for note in saved["notes"]), saved["notes"]


# (case, body, the field the 400 must name first)
BAD_DEFINITIONS: list[tuple[str, dict[str, Any], str]] = [
    ("invalid-cron", cron("61 * * * *"), "spec.expression"),
    ("cron-never-fires", cron("0 0 30 2 *"), "spec.expression"),
    ("unknown-zone", cron("0 9 * * *", "Mars/Olympus_Mons"), "spec.timezone"),
    ("nonexistent-local-time", one_shot("2027-03-14T02:30:00", "America/New_York"), "spec.at"),
    ("local-time-without-zone", one_shot("2027-01-01T09:00:00"), "spec.at"),
    ("zero-rate", rate("rate(0 minutes)"), "spec.expression"),
    ("payload-over-32-kib", cron(payload={"blob": "x" * (32 * 1024)}), "payload"),
    ("unknown-target", cron(target="nowhere"), "target"),
    ("one-shot-in-the-past", one_shot("2026-11-18T11:06:00Z"), "spec"),
    ("unknown-extra-field", cron(colour="blue"), "colour"),
    ("window-too-wide", cron(flexible_window_seconds=901), "flexible_window_seconds"),
    ("unknown-kind", {"spec": {"kind": "weekly"}, "target": "default"}, "spec"),
]


def test_create_schedule_rejects_bad_input_and_writes_nothing(
    alice: Api, aws: Services, subtests: pytest.Subtests
) -> None:
    # GIVEN a tenant with no schedules
    for case, body, field in BAD_DEFINITIONS:
        with subtests.test(case):
            # WHEN it posts an invalid definition
            answer = alice.post("/v1/schedules", body)

            # THEN it gets a 400 naming the field, and nothing at all was written
            error = assert_error(answer, 400, "invalid_input")
            assert error["fields"][0]["field"] == field, error
            assert error["fields"][0]["reason"]
            _assert_nothing_written(alice, aws)


def test_create_schedule_accepts_a_payload_of_exactly_32_kib(alice: Api) -> None:
    # GIVEN a payload whose compact JSON is exactly 32 KiB: {"x":"…"} is 8 bytes + the value
    payload = {"x": "a" * (32 * 1024 - 8)}
    assert len(json.dumps(payload, separators=(",", ":"))) == 32 * 1024

    # WHEN a schedule carries it
    saved = create(alice, cron(payload=payload))

    # THEN it is accepted and stored whole
    got = alice.get(f"/v1/schedules/{saved['schedule']['schedule_id']}")
    assert got.body["schedule"]["payload"] == payload


# --- GET /v1/schedules/{id} -----------------------------------------------------------


def test_get_schedule_returns_it_with_next_fires(alice: Api) -> None:
    # GIVEN a saved cron
    saved = create(alice, cron("*/5 * * * *", name="five"))
    schedule_id = saved["schedule"]["schedule_id"]

    # WHEN it is read back
    answer = alice.get(f"/v1/schedules/{schedule_id}")

    # THEN it is the same schedule, and its next fires start at the cursor
    assert answer.status == 200
    assert answer.body["schedule"] == saved["schedule"]
    assert answer.body["next_fires"] == saved["next_fires"]
    assert answer.body["notes"] == []


def test_next_fire_is_what_happens_next_while_the_cursor_lags(alice: Api, clock: Clock) -> None:
    # GIVEN a cron every minute, and then ten minutes in which nothing planned it (an
    # outage of the materializer)
    saved = create(alice, cron("* * * * *", name="every minute"))
    schedule_id = saved["schedule"]["schedule_id"]
    clock.advance(10 * MINUTE)
    now = int(clock.now)
    # WHEN it is read, and listed
    read = alice.get(f"/v1/schedules/{schedule_id}").body
    [listed] = alice.get("/v1/schedules").body["schedules"]
    # THEN its next fire is the next minute to come, the first of its next fires, while the
    # cursor (next_run_at) stays where planning stopped (the API planned the first five
    # minutes itself), behind the clock
    expected = iso(now - now % MINUTE + MINUTE)
    assert read["schedule"]["next_fire_at"] == expected == read["next_fires"][0]["utc"]
    assert listed["next_fire_at"] == expected
    assert epoch(read["schedule"]["next_run_at"]) < now - 4 * MINUTE
    # AND a paused schedule has no next fire
    paused = alice.post(f"/v1/schedules/{schedule_id}/pause").body
    assert paused["schedule"]["next_fire_at"] is None


# --- GET /v1/schedules ----------------------------------------------------------------


def test_list_schedules_filters_by_state(alice: Api) -> None:
    # GIVEN one active, one paused and one canceled schedule
    active, paused, canceled = (create(alice, cron())["schedule"]["schedule_id"] for _ in "abc")
    assert alice.post(f"/v1/schedules/{paused}/pause").status == 200
    assert delete(alice, canceled).status == 200

    # WHEN the list is filtered by each state
    found = {
        state: [s["schedule_id"] for s in alice.get("/v1/schedules", state=state).body["schedules"]]
        for state in ("ACTIVE", "PAUSED", "CANCELED", "COMPLETED")
    }

    # THEN each state lists exactly its schedule; unfiltered lists all three
    assert found == {
        "ACTIVE": [active],
        "PAUSED": [paused],
        "CANCELED": [canceled],
        "COMPLETED": [],
    }
    everything = alice.get("/v1/schedules").body["schedules"]
    assert {s["schedule_id"] for s in everything} == {active, paused, canceled}


def test_list_schedules_paginates_every_schedule_exactly_once(alice: Api) -> None:
    # GIVEN seven schedules
    created = [create(alice, cron(name=f"s{i}"))["schedule"]["schedule_id"] for i in range(7)]

    # WHEN they are listed three at a time, following next_token
    pages = all_pages(alice, "/v1/schedules", "schedules", limit=3)

    # THEN no page is larger than the limit and every schedule appears exactly once
    assert all(len(page) <= 3 for page in pages)
    assert len(pages) >= 3
    listed = [s["schedule_id"] for page in pages for s in page]
    assert sorted(listed) == sorted(created)
    assert len(listed) == len(set(listed)) == 7


def test_list_schedules_by_state_fills_pages_across_the_ones_filtered_out(alice: Api) -> None:
    # GIVEN nine schedules, every third one paused (the index holds all of them, so a page
    # of ACTIVE ones takes more than one read of the index)
    created = [create(alice, cron(name=f"s{i}"))["schedule"]["schedule_id"] for i in range(9)]
    for paused in created[1::3]:
        assert alice.post(f"/v1/schedules/{paused}/pause").status == 200
    active = [sid for sid in created if sid not in created[1::3]]

    # WHEN the ACTIVE ones are listed two at a time
    pages = all_pages(alice, "/v1/schedules", "schedules", limit=2, state="ACTIVE")

    # THEN every page but the last is full and none is larger, and each ACTIVE schedule
    # appears exactly once (none lost between the reads of one page)
    assert [len(page) for page in pages[:-1]] == [2] * (len(pages) - 1)
    assert len(pages[-1]) <= 2
    listed = [s["schedule_id"] for page in pages for s in page]
    assert sorted(listed) == sorted(active)
    assert len(listed) == len(set(listed)) == 6


MANGLED_TOKENS = {
    "garbage": "not a token!!",
    "json-list": base64.urlsafe_b64encode(b"[1, 2]").decode(),
    "no-tenant": base64.urlsafe_b64encode(b"{}").decode(),
    "not-utf8": base64.urlsafe_b64encode(b"\xff\xfe").decode(),
}


def test_list_schedules_rejects_a_mangled_next_token(alice: Api, subtests: pytest.Subtests) -> None:
    # GIVEN a tenant with schedules
    create(alice, cron())
    for case, token in MANGLED_TOKENS.items():
        with subtests.test(case):
            # WHEN it lists with a token the API never issued
            answer = alice.get("/v1/schedules", next_token=token)

            # THEN 400 naming next_token
            error = assert_error(answer, 400, "invalid_input")
            assert error["fields"][0]["field"] == "next_token"


def test_list_schedules_rejects_a_tampered_token_of_the_own_tenant(alice: Api) -> None:
    # GIVEN a real token, decoded and stripped down to the tenant id only
    for i in range(3):
        create(alice, cron(name=f"s{i}"))
    token = alice.get("/v1/schedules", limit=1).body["next_token"]
    assert token is not None
    key = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    forged = base64.urlsafe_b64encode(json.dumps({"tenant_id": key["tenant_id"]}).encode())

    # WHEN it is used
    answer = alice.get("/v1/schedules", next_token=forged.decode().rstrip("="))

    # THEN it is refused as a token the API did not issue
    error = assert_error(answer, 400, "invalid_input")
    assert error["fields"][0]["field"] == "next_token"


def test_list_schedules_rejects_bad_query(alice: Api, subtests: pytest.Subtests) -> None:
    # GIVEN a tenant
    cases: list[tuple[dict[str, Any], str]] = [
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        ({"state": "SLEEPING"}, "state"),
    ]
    for query, field in cases:
        with subtests.test(**query):
            # WHEN it lists with an out-of-range limit or an unknown state
            answer = alice.get("/v1/schedules", **query)

            # THEN 400 naming the query parameter
            error = assert_error(answer, 400, "invalid_input")
            assert error["fields"][0]["field"] == field


# --- PATCH /v1/schedules/{id} ---------------------------------------------------------


def test_update_schedule_if_match_is_required_and_must_be_a_version_number(
    alice: Api, subtests: pytest.Subtests
) -> None:
    # GIVEN a schedule
    schedule_id = create(alice, cron())["schedule"]["schedule_id"]
    with subtests.test("missing"):
        # WHEN it is patched without If-Match
        answer = patch(alice, schedule_id, {"name": "renamed"}, None)

        # THEN 428 and the schedule is unchanged
        assert_error(answer, 428, "precondition_required")
        assert alice.get(f"/v1/schedules/{schedule_id}").body["schedule"]["version"] == 1
    for if_match in ("abc", "1.0", "-1", "*", '"v1"', "\uff11"):
        with subtests.test(if_match=if_match):
            # WHEN If-Match is not a version number
            answer = patch(alice, schedule_id, {"name": "renamed"}, if_match)

            # THEN 400 naming the header (as the document spells it), and nothing changed
            error = assert_error(answer, 400, "invalid_input")
            assert error["fields"][0]["field"] == "if-match"
            assert alice.get(f"/v1/schedules/{schedule_id}").body["schedule"]["name"] is None


def test_update_schedule_with_stale_version_is_409(alice: Api, clock: Clock) -> None:
    # GIVEN a schedule already updated once (now version 2)
    schedule_id = create(alice, cron())["schedule"]["schedule_id"]
    assert patch(alice, schedule_id, {"name": "first"}, 1).status == 200

    # WHEN a client still holding version 1 patches it
    clock.advance(10)
    answer = patch(alice, schedule_id, {"name": "second"}, 1)

    # THEN 409 with the current version, and the first update stands
    error = assert_error(answer, 409, "conflict")
    assert error["details"] == {"current_version": 2}
    current = alice.get(f"/v1/schedules/{schedule_id}").body["schedule"]
    assert (current["version"], current["name"]) == (2, "first")


def test_update_schedule_bumps_version_and_returns_new_next_fires(alice: Api, clock: Clock) -> None:
    # GIVEN an every-5-minutes cron
    saved = create(alice, cron("*/5 * * * *"))
    schedule_id = saved["schedule"]["schedule_id"]

    # WHEN, a minute later, its spec becomes hourly (If-Match as a weak ETag)
    clock.advance(MINUTE)
    answer = patch(
        alice,
        schedule_id,
        {"spec": {"kind": "cron", "expression": "0 * * * *", "timezone": "UTC"}},
        'W/"1"',
    )

    # THEN version 2 with hourly fires, and a read shows the same
    assert answer.status == 200, answer.body
    schedule = answer.body["schedule"]
    assert schedule["version"] == 2
    assert schedule["spec"]["expression"] == "0 * * * *"
    assert schedule["updated_at"] == "2026-11-18T11:07:40+00:00"
    assert schedule["created_at"] == saved["schedule"]["created_at"]
    assert schedule["next_run_at"] == "2026-11-18T12:00:00Z"
    assert [f["utc"] for f in answer.body["next_fires"]] == [
        f"2026-11-18T{hour}:00:00Z" for hour in (12, 13, 14, 15, 16)
    ]
    assert alice.get(f"/v1/schedules/{schedule_id}").body["schedule"] == schedule


def test_update_schedule_rejects_invalid_changes_and_keeps_the_version(alice: Api) -> None:
    # GIVEN a schedule at version 1
    schedule_id = create(alice, cron())["schedule"]["schedule_id"]

    # WHEN patches carry a bad cron, an unknown target, or an unknown field
    bad_cron = patch(
        alice, schedule_id, {"spec": {"kind": "cron", "expression": "x", "timezone": "UTC"}}, 1
    )
    bad_target = patch(alice, schedule_id, {"target": "nowhere"}, 1)
    unknown = patch(alice, schedule_id, {"colour": "blue"}, 1)

    # THEN each is a 400 naming its field, and the schedule is still version 1
    assert assert_error(bad_cron, 400, "invalid_input")["fields"][0]["field"] == "spec.expression"
    assert assert_error(bad_target, 400, "invalid_input")["fields"][0]["field"] == "target"
    assert assert_error(unknown, 400, "invalid_input")["fields"][0]["field"] == "colour"
    assert alice.get(f"/v1/schedules/{schedule_id}").body["schedule"]["version"] == 1


def test_update_schedule_to_a_spec_that_never_fires_is_400(alice: Api) -> None:
    # GIVEN an active cron with a pending occurrence
    schedule_id = create(alice, cron())["schedule"]["schedule_id"]

    # WHEN its spec is replaced by a one-shot in the past
    answer = patch(alice, schedule_id, {"spec": {"kind": "at", "at": "2020-01-01T00:00:00Z"}}, 1)

    # THEN it is refused like on create, and the schedule stays active at version 1
    error = assert_error(answer, 400, "invalid_input")
    assert error["fields"][0]["field"] == "spec"
    current = alice.get(f"/v1/schedules/{schedule_id}").body["schedule"]
    assert (current["version"], current["state"]) == (1, "ACTIVE")


def test_update_schedule_of_a_canceled_schedule_is_409(alice: Api) -> None:
    # GIVEN a canceled schedule (version 2)
    schedule_id = create(alice, cron())["schedule"]["schedule_id"]
    assert delete(alice, schedule_id).status == 200

    # WHEN it is patched with its current version
    answer = patch(alice, schedule_id, {"name": "revived"}, 2)

    # THEN 409 and it stays canceled
    assert_error(answer, 409, "conflict")
    current = alice.get(f"/v1/schedules/{schedule_id}").body["schedule"]
    assert (current["state"], current["version"], current["name"]) == ("CANCELED", 2, None)


# --- pause / resume / cancel ----------------------------------------------------------


def test_pause_schedule_stops_fires_and_cancels_pending_occurrences(alice: Api) -> None:
    # GIVEN a cron with one materialized occurrence
    saved = create(alice, cron("*/5 * * * *"))
    schedule_id = saved["schedule"]["schedule_id"]
    [pending] = saved["materialized"]

    # WHEN it is paused
    answer = alice.post(f"/v1/schedules/{schedule_id}/pause")

    # THEN it is PAUSED without a cursor or next fires, and the pending one is canceled
    assert answer.status == 200, answer.body
    assert answer.body["schedule"]["state"] == "PAUSED"
    assert answer.body["schedule"]["version"] == 2
    assert answer.body["schedule"]["next_run_at"] is None
    assert answer.body["next_fires"] == []
    assert answer.body["materialized"] == []
    assert [(a["occurrence_id"], a["state"]) for a in answer.body["affected"]] == [
        (pending["occurrence_id"], "CANCELED")
    ]
    got = alice.get(f"/v1/schedules/{schedule_id}").body
    assert (got["schedule"]["state"], got["next_fires"]) == ("PAUSED", [])
    assert alice.get(f"/v1/occurrences/{pending['occurrence_id']}").body["state"] == "CANCELED"


def test_resume_schedule_fires_strictly_after_resume_without_catching_up(
    alice: Api, clock: Clock
) -> None:
    # GIVEN a '*/5' cron paused at 11:06:40
    schedule_id = create(alice, cron("*/5 * * * *"))["schedule"]["schedule_id"]
    paused_at = clock.now
    assert alice.post(f"/v1/schedules/{schedule_id}/pause").status == 200

    # WHEN it is resumed an hour later (12:06:40)
    clock.advance(3600)
    resumed_at = clock.now
    answer = alice.post(f"/v1/schedules/{schedule_id}/resume")

    # THEN it is ACTIVE again and every fire it plans is after the resume instant
    assert answer.status == 200, answer.body
    schedule = answer.body["schedule"]
    assert (schedule["state"], schedule["version"]) == ("ACTIVE", 3)
    assert epoch(schedule["next_run_at"]) > resumed_at
    assert schedule["next_run_at"] == "2026-11-18T12:15:00Z"
    assert [o["scheduled_for"] for o in answer.body["materialized"]] == ["2026-11-18T12:10:00Z"]
    assert all(epoch(f["utc"]) > resumed_at for f in answer.body["next_fires"])
    # AND nothing live exists for the paused hour: only the pre-pause fire, canceled
    during = alice.get(
        f"/v1/schedules/{schedule_id}/occurrences",
        **{"from": iso(paused_at), "to": iso(resumed_at)},
    ).body["occurrences"]
    assert [(o["scheduled_for"], o["state"]) for o in during] == [
        ("2026-11-18T11:10:00Z", "CANCELED")
    ]


def test_cancel_schedule_keeps_it_readable_as_canceled(alice: Api) -> None:
    # GIVEN an active schedule counted in the tenant's usage
    schedule_id = create(alice, cron())["schedule"]["schedule_id"]
    assert alice.get("/v1/tenant").body["schedule_count"] == 1

    # WHEN it is deleted
    answer = delete(alice, schedule_id)

    # THEN it is CANCELED (version 2), still readable, and no longer counted
    assert answer.status == 200, answer.body
    assert answer.body["schedule"]["state"] == "CANCELED"
    assert answer.body["schedule"]["version"] == 2
    assert answer.body["next_fires"] == []
    got = alice.get(f"/v1/schedules/{schedule_id}")
    assert got.status == 200
    assert got.body["schedule"]["state"] == "CANCELED"
    assert got.body["schedule"]["next_run_at"] is None
    assert got.body["next_fires"] == []
    assert alice.get("/v1/tenant").body["schedule_count"] == 0


def test_schedule_transitions_from_the_wrong_state_are_409_and_repeats_succeed(
    alice: Api, subtests: pytest.Subtests
) -> None:
    # GIVEN an active schedule
    schedule_id = create(alice, cron())["schedule"]["schedule_id"]
    steps = [
        ("resume while ACTIVE", "resume", "already", 1),
        ("pause", "pause", None, 2),
        ("pause while PAUSED", "pause", "already", 2),
        ("resume", "resume", None, 3),
        ("resume again", "resume", "already", 3),
        ("cancel", "cancel", None, 4),
        ("cancel while CANCELED", "cancel", "already", 4),
        ("resume while CANCELED", "resume", "CANCELED", 4),
        ("pause while CANCELED", "pause", "CANCELED", 4),
    ]
    for case, action, outcome, version in steps:
        with subtests.test(case):
            # WHEN it is paused, resumed or canceled from a state that allows it, from the
            # state it asks for (a retried request), or from another
            if action == "cancel":
                answer = delete(alice, schedule_id)
            else:
                answer = alice.post(f"/v1/schedules/{schedule_id}/{action}")

            # THEN a change is a 200; a repeat is a 200 that says it changed nothing; a
            # refusal is a 409 naming the current state; neither adds a version
            if outcome is None:
                assert answer.status == 200, answer.body
                assert not any(n.startswith("already") for n in answer.body["notes"])
            elif outcome == "already":
                assert answer.status == 200, answer.body
                assert answer.body["notes"][0].endswith(": nothing changed"), answer.body
            else:
                error = assert_error(answer, 409, "conflict")
                assert error["details"] == {"state": outcome}
            got = alice.get(f"/v1/schedules/{schedule_id}").body["schedule"]
            assert got["version"] == version


def test_unknown_ids_are_404_on_every_endpoint(alice: Api, subtests: pytest.Subtests) -> None:
    # GIVEN ids that name nothing
    missing = "sch_doesnotexist"
    calls: dict[str, Callable[[], Answer]] = {
        "get": lambda: alice.get(f"/v1/schedules/{missing}"),
        "patch": lambda: patch(alice, missing, {"name": "x"}, 1),
        "pause": lambda: alice.post(f"/v1/schedules/{missing}/pause"),
        "resume": lambda: alice.post(f"/v1/schedules/{missing}/resume"),
        "delete": lambda: delete(alice, missing),
        "occurrences": lambda: alice.get(f"/v1/schedules/{missing}/occurrences"),
        "occurrence": lambda: alice.get("/v1/occurrences/occ_doesnotexist"),
    }
    for name, call in calls.items():
        with subtests.test(name):
            # WHEN an endpoint is called with one
            answer = call()

            # THEN 404 naming the id
            error = assert_error(answer, 404, "not_found")
            assert "doesnotexist" in error["message"]


# --- occurrences ----------------------------------------------------------------------


def _every_minute(alice: Api) -> tuple[str, list[dict[str, Any]]]:
    """A '* * * * *' cron created at 11:06:40: fires 11:07..11:11 are materialized."""
    saved = create(alice, cron("* * * * *"))
    assert [o["scheduled_for"] for o in saved["materialized"]] == [
        f"2026-11-18T11:{minute:02d}:00Z" for minute in (7, 8, 9, 10, 11)
    ]
    return saved["schedule"]["schedule_id"], saved["materialized"]


def test_list_occurrences_within_a_range(alice: Api) -> None:
    # GIVEN occurrences at 11:07, 11:08, 11:09, 11:10 and 11:11
    schedule_id, _ = _every_minute(alice)

    # WHEN the range 11:08..11:09 (inclusive) is asked for
    answer = alice.get(
        f"/v1/schedules/{schedule_id}/occurrences",
        **{"from": "2026-11-18T11:08:00Z", "to": "2026-11-18T12:09:00+01:00"},
    )

    # THEN exactly those two come back, in order
    assert answer.status == 200, answer.body
    assert [o["scheduled_for"] for o in answer.body["occurrences"]] == [
        "2026-11-18T11:08:00Z",
        "2026-11-18T11:09:00Z",
    ]
    assert answer.body["next_token"] is None


def test_list_occurrences_paginates_each_exactly_once(alice: Api) -> None:
    # GIVEN five occurrences
    schedule_id, materialized = _every_minute(alice)

    # WHEN they are listed three at a time
    pages = all_pages(alice, f"/v1/schedules/{schedule_id}/occurrences", "occurrences", limit=3)

    # THEN every occurrence appears exactly once, in time order, pages within the limit
    assert all(len(page) <= 3 for page in pages)
    assert len(pages) >= 2
    listed = [o["occurrence_id"] for page in pages for o in page]
    assert listed == [o["occurrence_id"] for o in materialized]


BAD_OCCURRENCE_QUERIES: list[tuple[dict[str, Any], str]] = [
    ({"from": "2026-11-18T11:09:00Z", "to": "2026-11-18T11:08:00Z"}, "to"),
    ({"from": "2026-11-18T11:08:00"}, "from"),
    ({"to": "yesterday"}, "to"),
    ({"limit": 0}, "limit"),
    ({"next_token": "@@@"}, "next_token"),
]


def test_list_occurrences_rejects_bad_query(alice: Api, subtests: pytest.Subtests) -> None:
    # GIVEN a schedule with occurrences
    schedule_id, _ = _every_minute(alice)
    for query, field in BAD_OCCURRENCE_QUERIES:
        with subtests.test(**query):
            # WHEN the range is reversed, naive or not a time, or the token is junk
            answer = alice.get(f"/v1/schedules/{schedule_id}/occurrences", **query)

            # THEN 400 naming the parameter
            assert assert_error(answer, 400, "invalid_input")["fields"][0]["field"] == field


def test_list_occurrences_refuses_a_token_of_another_schedule(alice: Api) -> None:
    # GIVEN two schedules, and a next_token issued for the first one
    first, _ = _every_minute(alice)
    second, _ = _every_minute(alice)
    token = alice.get(f"/v1/schedules/{first}/occurrences", limit=1).body["next_token"]
    assert token is not None

    # WHEN the token is used to list the second one
    answer = alice.get(f"/v1/schedules/{second}/occurrences", limit=1, next_token=token)

    # THEN 400
    assert assert_error(answer, 400, "invalid_input")["fields"][0]["field"] == "next_token"


def test_get_occurrence_returns_it_with_its_attempts(alice: Api, aws: Services) -> None:
    # GIVEN an occurrence that a worker tried twice (written as the worker would)
    _, materialized = _every_minute(alice)
    occurrence_id = materialized[0]["occurrence_id"]
    table = aws.settings.occurrences_table
    history = []
    tries = ((1, 23, "RETRY", 40, "boom"), (2, 50, "RUNNING", None, None))
    for number, started, outcome, finished, error in tries:
        entry: dict[str, Any] = {
            "attempt_no": number,
            "started_at": START + started,
            "lease_expires_at": START + started + 300,
            "outcome": outcome,
        }
        if finished is not None:
            entry["finished_at"] = START + finished
        if error is not None:
            entry["error"] = error
        history.append(entry)
    aws.dynamodb.update_item(
        TableName=table,
        Key=to_dynamo(occurrence_key(occurrence_id)),
        # (sent 1 s after its due time, 11:07:00)
        UpdateExpression="SET attempts = :history, enqueued_at = :sent",
        ExpressionAttributeValues=to_dynamo({":history": history, ":sent": START + 21}),
    )

    # WHEN the occurrence is read
    answer = alice.get(f"/v1/occurrences/{occurrence_id}")

    # THEN it comes with both attempts, in attempt order
    assert answer.status == 200, answer.body
    assert answer.body["occurrence_id"] == occurrence_id
    assert answer.body["scheduled_for"] == "2026-11-18T11:07:00Z"
    assert answer.body["state"] == "SCHEDULED"
    assert answer.body["attempts"] == [
        {
            "attempt_no": 1,
            "started_at": iso(START + 23),
            "finished_at": iso(START + 40),
            "outcome": "RETRY",
            "error": "boom",
        },
        {
            "attempt_no": 2,
            "started_at": iso(START + 50),
            "finished_at": None,
            "outcome": "RUNNING",
            "error": None,
        },
    ]
    # AND where its time went: receivable 1 s after due, claimed 2 s after that, a run of
    # 17 s, 10 s of back-off (the running attempt's run not counted yet)
    assert answer.body["times"] == {
        "to_receivable_seconds": 1,
        "to_claim_seconds": 2,
        "run_seconds": [17],
        "retry_wait_seconds": [10],
    }


# --- preview --------------------------------------------------------------------------


def test_preview_notes_a_skipped_dst_wall_time(alice: Api, aws: Services) -> None:
    # GIVEN 02:30 daily in New York, which does not exist on 2026-03-08
    body = {
        "spec": cron("30 2 * * *", "America/New_York")["spec"],
        "after": "2026-03-07T12:00:00Z",
        "count": 3,
    }

    # WHEN it is previewed
    answer = alice.post("/v1/preview", body)

    # THEN the 8th is skipped and a note names it; nothing is saved
    assert answer.status == 200, answer.body
    assert [f["local"] for f in answer.body["fires"]] == [
        "2026-03-09T02:30:00-04:00",
        "2026-03-10T02:30:00-04:00",
        "2026-03-11T02:30:00-04:00",
    ]
    assert any("2026-03-08" in note for note in answer.body["notes"]), answer.body["notes"]
    _assert_nothing_written(alice, aws)


def test_preview_and_schedule_follow_a_dst_choice(alice: Api, clock: Clock) -> None:
    # GIVEN 01:30 daily in New York fired at BOTH instants of the fall-back's repeated hour
    clock.now = epoch("2026-10-30T12:00:00Z")
    spec = cron("30 1 * * *", "America/New_York")["spec"] | {"dst": {"repeat": "BOTH"}}
    # WHEN it is previewed
    answer = alice.post("/v1/preview", {"spec": spec, "count": 4})
    # THEN 2026-11-01's 01:30 fires twice, in time order, and the note says so
    assert answer.status == 200, answer.body
    assert [f["utc"] for f in answer.body["fires"]] == [
        "2026-10-31T05:30:00Z",
        "2026-11-01T05:30:00Z",
        "2026-11-01T06:30:00Z",
        "2026-11-02T06:30:00Z",
    ]
    assert answer.body["notes"] == [
        "2026-11-01: 01:30 occurs twice in America/New_York (the clocks fall back); "
        "fired at both instants"
    ]
    # WHEN it is created, read, and changed to the LAST instant only
    saved = create(alice, {"spec": spec, "target": "default"})
    sid = saved["schedule"]["schedule_id"]
    assert alice.get(f"/v1/schedules/{sid}").body["schedule"]["spec"]["dst"] == {
        "gap": "SKIP",
        "repeat": "BOTH",
    }
    changed = patch(
        alice, sid, {"spec": spec | {"dst": {"repeat": "LAST"}}}, saved["schedule"]["version"]
    )
    # THEN the change is a new version that runs (its fires are re-planned), firing once
    assert changed.status == 200, changed.body
    assert changed.body["schedule"]["run_version"] == 2
    assert [f["utc"] for f in changed.body["next_fires"][:3]] == [
        "2026-10-31T05:30:00Z",
        "2026-11-01T06:30:00Z",
        "2026-11-02T06:30:00Z",
    ]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (rate("rate(1 hour)")["spec"] | {"dst": {"gap": "SHIFT"}}, "spec.dst"),
        (cron("0 2 * * *")["spec"] | {"dst": {"gap": "LATER"}}, "spec.dst.gap"),
        (cron("0 2 * * *")["spec"] | {"dst": {"repeat": "TWICE"}}, "spec.dst.repeat"),
        (cron("0 2 * * *")["spec"] | {"dst": "SHIFT"}, "spec.dst"),
        (one_shot("2030-03-10T07:00:00Z")["spec"] | {"dst": {"gap": "SHIFT"}}, "spec.at"),
        (one_shot("2030-03-10T02:30:00", "America/New_York")["spec"], "spec.at"),
    ],
)
def test_a_dst_choice_that_cannot_apply_is_400_naming_the_field(
    alice: Api, aws: Services, spec: dict[str, Any], field: str
) -> None:
    # WHEN a schedule gives a DST choice where none applies, a malformed one, or a local
    # one-shot in a gap without SHIFT
    answer = alice.post("/v1/schedules", {"spec": spec, "target": "default"})
    # THEN 400 naming the field, and nothing was written
    error = assert_error(answer, 400, "invalid_input")
    assert error["fields"][0]["field"] == field, error
    _assert_nothing_written(alice, aws)


def test_preview_notes_an_ambiguous_one_shot(alice: Api) -> None:
    # GIVEN a local one-shot inside Berlin's repeated hour
    body = {"spec": one_shot("2027-10-31T02:30:00", "Europe/Berlin")["spec"]}

    # WHEN it is previewed
    answer = alice.post("/v1/preview", body)

    # THEN the earlier instant is shown and the note says the time occurs twice
    assert answer.status == 200, answer.body
    assert answer.body["fires"] == [
        {"utc": "2027-10-31T00:30:00Z", "local": "2027-10-31T02:30:00+02:00"}
    ]
    assert any("occurs twice" in note for note in answer.body["notes"])


def test_preview_defaults_to_ten_fires_after_now(alice: Api) -> None:
    # GIVEN an hourly cron and no 'after'
    # WHEN it is previewed
    answer = alice.post("/v1/preview", {"spec": cron("0 * * * *")["spec"]})

    # THEN ten fires from the next hour after the clock
    assert answer.status == 200
    fires = [f["utc"] for f in answer.body["fires"]]
    assert len(fires) == 10
    assert fires[0] == "2026-11-18T12:00:00Z"
    assert fires[-1] == "2026-11-18T21:00:00Z"


def test_preview_rejects_bad_input(alice: Api, subtests: pytest.Subtests) -> None:
    # GIVEN invalid preview requests
    cases: list[tuple[dict[str, Any], str]] = [
        ({"spec": cron("99 * * * *")["spec"]}, "spec.expression"),
        ({"spec": cron()["spec"], "count": 101}, "count"),
        ({"spec": cron()["spec"], "after": "2026-03-07T12:00:00"}, "after"),
    ]
    for body, field in cases:
        with subtests.test(field=field):
            # WHEN one is posted
            answer = alice.post("/v1/preview", body)

            # THEN 400 naming the field
            assert assert_error(answer, 400, "invalid_input")["fields"][0]["field"] == field


# --- targets, tenant, meta ------------------------------------------------------------


def test_targets_list_and_create_make_real_queues(alice: Api, aws: Services) -> None:
    # GIVEN the bootstrap's 'default' target
    # WHEN another target is created
    created = alice.post("/v1/targets", {"name": "orders"})

    # THEN both are listed, each with a queue and a DLQ that exist in SQS
    assert created.status == 201, created.body
    assert created.body["name"] == "orders"
    listed = alice.get("/v1/targets")
    assert listed.status == 200
    targets = {t["name"]: t for t in listed.body["targets"]}
    assert set(targets) == {"default", "orders"}
    assert targets["orders"] == created.body
    for target in targets.values():
        for url in (target["queue_url"], target["dlq_url"]):
            assert aws.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
        assert target["queue_arn"] != target["dlq_arn"]


def test_targets_duplicate_or_invalid_name_is_refused(alice: Api) -> None:
    # GIVEN the target 'default'
    # WHEN it is created again, and a target with a name SQS cannot carry is created
    duplicate = alice.post("/v1/targets", {"name": "default"})
    invalid = alice.post("/v1/targets", {"name": "bad.name"})

    # THEN 409 and 400 (naming the field), and still a single target
    assert_error(duplicate, 409, "conflict")
    assert assert_error(invalid, 400, "invalid_input")["fields"][0]["field"] == "name"
    assert [t["name"] for t in alice.get("/v1/targets").body["targets"]] == ["default"]


def test_tenant_shows_quotas_and_usage(alice: Api) -> None:
    # GIVEN two strict schedules at minute :00 and one flexible
    create(alice, cron("0 * * * *"))
    create(alice, cron("0 9 * * *"))
    create(alice, cron("0 * * * *", flexible_window_seconds=300))

    # WHEN the tenant is read
    answer = alice.get("/v1/tenant")

    # THEN it counts three schedules and a peak of two strict fires in one minute
    assert answer.status == 200
    assert answer.body == {
        "tenant_id": "alice",
        "quotas": {
            "max_schedules": 10_000,
            "max_strict_fires_per_minute": 10_000,
            "max_concurrency": 1_000,
            "catchup_per_minute": 600,
            "max_manual_runs_per_minute": 60,
            "max_backfill_occurrences": 1_000,
        },
        "schedule_count": 3,
        "strict_fires_per_minute_peak": 2,
    }


def test_meta_reports_version_and_tzdata(alice: Api) -> None:
    # GIVEN the service
    # WHEN meta is read
    answer = alice.get("/v1/meta")

    # THEN it names the pinned IANA release
    assert answer.status == 200
    assert answer.body == {"version": "0.1.0", "tzdata": "2026f"}
