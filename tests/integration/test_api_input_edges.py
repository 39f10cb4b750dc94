"""What an independent client found (issue 18), one test per finding: inputs at the edges
answer a 4xx in the one error shape and write nothing; the resolver's own answers and an
unexpected failure take the same shape; numbers are numbers; a change must change something.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import pytest
from api import handler
from api.openapi import DOCUMENT

from punctual.control.plane import ControlPlane
from punctual.observability import logger
from punctual.services import Services
from tests.instants import epoch, iso
from tests.integration.conftest import (
    OPERATOR,
    START,
    Answer,
    Api,
    Clock,
    LambdaContextStub,
    bootstrap,
    rest_event,
)
from tests.integration.helpers import assert_error, create, cron, one_shot, patch, rate, table_items


def _nothing_written(api: Api, aws: Services) -> None:
    assert api.get("/v1/schedules").body["schedules"] == []
    assert api.get("/v1/tenant").body["schedule_count"] == 0
    assert table_items(aws, aws.settings.schedules_table) == []
    assert table_items(aws, aws.settings.occurrences_table) == []


def _send(event: dict[str, Any]) -> Answer:
    result = handler.lambda_handler(event, LambdaContextStub())
    return Answer(result["statusCode"], json.loads(result["body"]), result.get("headers") or {})


def _raw_post(api: Api, path: str, text: str, **headers: str) -> Answer:
    """A POST whose body is sent exactly as ``text`` (json.dumps would refuse some)."""
    event = rest_event("POST", path, api.principal, headers=headers)
    event["body"] = text
    return _send(event)


def _spec(body: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """``body`` with more fields in its spec."""
    return {**body, "spec": {**body["spec"], **fields}}


# --- 1. unhandled errors: instants past the calendar, payloads DynamoDB cannot store -------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        # year 10000 once an elapsed day is added: saved ACTIVE, then every read failed
        (_spec(rate("rate(1 day)"), anchor="9999-12-31T00:00:00Z"), "spec.anchor"),
        (one_shot("9999-12-31T23:00:00-05:00"), "spec.at"),  # year 10000 in UTC
        (one_shot("0001-01-01T00:00:00+14:00"), "spec.at"),  # year 0 in UTC
        (_spec(cron(), end_at="9999-12-31T23:59:59Z"), "spec.end_at"),
    ],
)
def test_instants_outside_the_calendar_are_refused_before_anything_is_written(
    alice: Api, aws: Services, body: dict[str, Any], field: str
) -> None:
    # WHEN a schedule names an instant past the end (or before the start) of the calendar
    answer = alice.post("/v1/schedules", body)
    # THEN 400 naming the field, and nothing was written or counted
    error = assert_error(answer, 400, "invalid_input")
    assert error["fields"][0]["field"] == field, error
    assert "0002-01-01T00:00:00Z and 9998-12-31T23:59:59Z" in error["fields"][0]["reason"]
    _nothing_written(alice, aws)


def test_a_rate_whose_next_fire_would_leave_the_calendar_has_no_next_fire(alice: Api) -> None:
    # GIVEN a daily rate anchored on the last day of the calendar
    saved = create(alice, _spec(rate("rate(1 day)"), anchor="9998-12-31T00:00:00Z"))
    # THEN its one fire is that day (the next would be year 9999), and it reads back
    assert [f["utc"] for f in saved["next_fires"]] == ["9998-12-31T00:00:00Z"]
    read = alice.get(f"/v1/schedules/{saved['schedule']['schedule_id']}")
    assert read.status == 200, read.body
    assert read.body["next_fires"] == saved["next_fires"]


def test_preview_at_the_edges_of_the_calendar(alice: Api) -> None:
    # WHEN the preview starts before the calendar (year 0 in UTC, OverflowError before)
    spec = {"kind": "cron", "expression": "0 0 1 1 *", "timezone": "Pacific/Kiritimati"}
    before = alice.post("/v1/preview", {"spec": spec, "after": "0001-01-01T00:00:00+14:00"})
    # THEN 400 naming "after"
    assert assert_error(before, 400, "invalid_input")["fields"][0]["field"] == "after"
    # AND at its very start and end in a zone 14 hours ahead, the fires show
    first = alice.post("/v1/preview", {"spec": spec, "after": "0002-01-01T00:00:00Z", "count": 2})
    assert first.status == 200, first.body
    # (Kiritimati kept its local mean time, -10:29:20, until 1901)
    assert [(f["utc"], f["local"]) for f in first.body["fires"]] == [
        ("0002-01-01T10:29:20Z", "0002-01-01T00:00:00-10:29:20"),
        ("0003-01-01T10:29:20Z", "0003-01-01T00:00:00-10:29:20"),
    ]
    last = alice.post("/v1/preview", {"spec": spec, "after": "9997-06-01T00:00:00Z", "count": 5})
    assert [f["local"] for f in last.body["fires"]] == ["9998-01-01T00:00:00+14:00"]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"n": NaN}', "NaN is not a JSON number"),
        ('{"n": Infinity}', "Infinity is not a JSON number"),
        ('{"n": 1e400}', "1e400 is out of range"),
        ('{"n": ' + "9" * 5000 + "}", "an integer of 5000 digits is too long"),
        ('{"n": ' + "[" * 500 + "]" * 500 + "}", "nested deeper than 64 levels"),
        ('{"n": ' + "[" * 5000 + "]" * 5000 + "}", "nested deeper than 64 levels"),
        ('{"n": "\\ud800"}', "unpaired surrogate"),
    ],
)
def test_json_that_python_reads_but_no_field_can_hold_is_400(
    alice: Api, aws: Services, text: str, reason: str
) -> None:
    # WHEN a payload holds NaN, an overflowing float, a 5,000-digit integer, nesting hundreds
    # or thousands deep (RecursionError before), or an unpaired surrogate
    body = (
        text.replace(
            '{"n": ',
            '{"spec": {"kind": "rate", "expression": "rate(1 day)"}, '
            '"target": "default", "payload": {"n": ',
        )
        + "}"
    )
    answer = _raw_post(alice, "/v1/schedules", body)
    # THEN 400: not valid JSON, with the reason; nothing written
    error = assert_error(answer, 400, "invalid_input")
    assert reason in error["fields"][0]["reason"], error
    _nothing_written(alice, aws)


def _nested(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (_nested(17), "payload" + ".a" * 16 + " nests deeper than 16 levels"),
        ({"n": 10**38}, "not a number a payload can hold"),
        ({"n": 1e38}, "not a number a payload can hold"),
        ({"n": 1e-131}, "not a number a payload can hold"),
        ({"n": -(10**38)}, "not a number a payload can hold"),
        ({"list": [{"": 1}]}, "payload.list.0 has an empty key"),
    ],
)
def test_payload_that_dynamodb_cannot_store_is_400(
    alice: Api, aws: Services, payload: dict[str, Any], reason: str
) -> None:
    # WHEN a payload nests past 16 levels (DynamoDB's own limit, 32, failed the write with a
    # ValidationException before), or holds a number or key DynamoDB refuses
    answer = alice.post("/v1/schedules", rate("rate(1 day)", payload=payload))
    # THEN 400 naming the payload and the part of it, nothing written
    error = assert_error(answer, 400, "invalid_input")
    assert error["fields"][0]["field"] == "payload"
    assert reason in error["fields"][0]["reason"], error
    _nothing_written(alice, aws)


def test_payload_at_the_limits_is_stored_and_read_back_on_dynamodb_local(
    local_aws: Services,
) -> None:
    # GIVEN AWS's own engine (moto does not enforce DynamoDB's nesting and number limits)
    alice = bootstrap("alice", "arn:aws:iam::111122223333:user/alice")
    payload = {
        "deep": _nested(15),
        "numbers": [10**38 - 1, -(10**38 - 1), 1e-130, 2.5e-7, 0, 0.1, True, None],
        "text": "\u00e9t\u00e9 \U0001f600",
    }
    # WHEN a one-shot due at once carries it (its occurrence is written with the schedule)
    saved = create(alice, one_shot(iso(START + 5), payload=payload))
    # THEN both items were written, and the schedule reads it back unchanged
    assert len(saved["materialized"]) == 1
    read = alice.get(f"/v1/schedules/{saved['schedule']['schedule_id']}")
    assert read.status == 200, read.body
    assert read.body["schedule"]["payload"] == payload


# --- 3. the one error shape for the resolver's own answers and for the unexpected ------------


def test_unknown_route_is_404_and_a_missing_method_405_in_the_one_error_shape(
    alice: Api,
) -> None:
    # WHEN a path no route serves is called, and a served path with a method it lacks
    unknown = alice.get("/v1/nothing-here")
    wrong_method = alice.call("PUT", "/v1/schedules")
    # THEN 404 and 405 (naming the methods it has) in the one error shape
    assert "no such resource" in assert_error(unknown, 404, "not_found")["message"]
    error = assert_error(wrong_method, 405, "method_not_allowed")
    assert error["details"] == {"allowed": ["GET", "POST"]}
    assert wrong_method.headers["Allow"] == "GET, POST"


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_a_body_that_is_not_json_is_415(alice: Api, aws: Services, content_type: str) -> None:
    # WHEN a create is sent as another media type (multipart once crashed the handler)
    answer = _raw_post(alice, "/v1/targets", "name=other", **{"Content-Type": content_type})
    # THEN 415 in the one error shape, and no target was made
    assert_error(answer, 415, "unsupported_media_type")
    assert [t["name"] for t in alice.get("/v1/targets").body["targets"]] == ["default"]


def test_a_body_that_is_not_utf8_is_400(alice: Api, aws: Services) -> None:
    # WHEN a body arrives base64-encoded and is not UTF-8 (as API Gateway passes binary)
    event = rest_event("POST", "/v1/schedules", alice.principal)
    event.update(body=base64.b64encode(b"\xff\xfe{").decode(), isBase64Encoded=True)
    # THEN 400 saying so
    error = assert_error(_send(event), 400, "invalid_input")
    assert error["message"] == "the body is not UTF-8 text"
    _nothing_written(alice, aws)


def test_an_unexpected_error_is_500_with_the_request_id_and_logged(
    alice: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a control plane that fails in a way nobody planned for, and the log captured
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(ControlPlane, "list_schedules", fail)
    log = io.StringIO()
    monkeypatch.setattr(logger.registered_handler, "stream", log)
    # WHEN a request runs into it
    event = rest_event("GET", "/v1/schedules", alice.principal)
    answer = _send(event)
    # THEN 500 in the one error shape with API Gateway's request id, nothing internal leaked
    error = assert_error(answer, 500, "internal_error")
    request_id = event["requestContext"]["requestId"]
    assert error["details"] == {"request_id": request_id}
    assert "disk on fire" not in json.dumps(answer.body)
    # AND the log line carries the same id and the traceback
    logged = [json.loads(line) for line in log.getvalue().splitlines() if line]
    [line] = [entry for entry in logged if entry.get("level") == "ERROR"]
    assert line["correlation_id"] == request_id
    assert "RuntimeError: disk on fire" in line["exception"]


# --- 5. lax input ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (cron(flexible_window_seconds="60"), "flexible_window_seconds"),
        (cron(flexible_window_seconds=True), "flexible_window_seconds"),
        (cron(flexible_window_seconds=60.5), "flexible_window_seconds"),
        (cron(retry={"max_attempts": "3"}), "retry.max_attempts"),
        (cron(misfire={"max_lateness_seconds": False}), "misfire.max_lateness_seconds"),
        (_spec(cron(), start_at=1_795_000_000), "spec.start_at"),
        (_spec(cron(), start_at="1795000000"), "spec.start_at"),
    ],
)
def test_numbers_are_numbers_and_instants_are_dates(
    alice: Api, aws: Services, body: dict[str, Any], field: str
) -> None:
    # WHEN a number comes as text or a boolean, or an instant as a number
    answer = alice.post("/v1/schedules", body)
    # THEN 400 naming the field, nothing written
    assert assert_error(answer, 400, "invalid_input")["fields"][0]["field"] == field
    _nothing_written(alice, aws)


def test_quotas_are_numbers_and_put_sets_only_those_given(alice: Api) -> None:
    operator = Api(OPERATOR)
    lowered = operator.call("PUT", "/v1/admin/tenants/alice/quotas", {"max_concurrency": 7})
    assert lowered.status == 200, lowered.body
    # WHEN a quota comes as text, or the body names none
    text = operator.call("PUT", "/v1/admin/tenants/alice/quotas", {"max_schedules": "100"})
    empty = operator.call("PUT", "/v1/admin/tenants/alice/quotas", {})
    created = operator.post(
        "/v1/admin/tenants", {"tenant_id": "carol", "quotas": {"max_schedules": "5"}}
    )
    # THEN 400 each, and the quotas are as set before ({} once reset them all to defaults)
    assert assert_error(text, 400, "invalid_input")["fields"][0]["field"] == "max_schedules"
    assert assert_error(empty, 400, "invalid_input")["message"] == "no quota to set"
    assert (
        assert_error(created, 400, "invalid_input")["fields"][0]["field"] == "quotas.max_schedules"
    )
    # AND a fraction is refused, while a whole number written with one (JSON Schema's
    # integer admits 355.0) is that integer
    half = operator.call("PUT", "/v1/admin/tenants/alice/quotas", {"max_concurrency": 355.5})
    assert assert_error(half, 400, "invalid_input")["fields"][0]["field"] == "max_concurrency"
    whole = operator.call("PUT", "/v1/admin/tenants/alice/quotas", {"max_concurrency": 355.0})
    assert whole.status == 200, whole.body
    assert whole.body["quotas"]["max_concurrency"] == 355
    quotas = operator.get("/v1/admin/tenants/alice").body["quotas"]
    assert quotas == {
        "max_schedules": 10_000,
        "max_strict_fires_per_minute": 10_000,
        "max_concurrency": 355,
        "catchup_per_minute": 600,
        "max_manual_runs_per_minute": 60,
        "max_backfill_occurrences": 1_000,
    }


def test_patch_without_a_change_is_400_and_makes_no_version(alice: Api) -> None:
    schedule_id = create(alice, cron())["schedule"]["schedule_id"]
    # WHEN a PATCH names no field
    answer = patch(alice, schedule_id, {}, 1)
    # THEN 400 and the schedule is still version 1
    assert assert_error(answer, 400, "invalid_input")["message"] == "nothing to change"
    assert alice.get(f"/v1/schedules/{schedule_id}").body["schedule"]["version"] == 1


def test_idempotent_create_compares_the_request_as_understood(alice: Api, clock: Clock) -> None:
    # GIVEN a create with a key, defaults left out
    key = {"Idempotency-Key": "nightly"}
    first = create(alice, cron(name="nightly"), headers=key)
    # WHEN it is retried with the defaults spelled out
    clock.advance(5)
    spelled = cron(name="nightly", flexible_window_seconds=0, overlap="ALLOW", payload={})
    again = alice.post("/v1/schedules", spelled, headers=key)
    # THEN it is the same request: the same schedule, not a 409
    assert again.status == 201, again.body
    assert again.body == {**first, "replayed": True}
    assert alice.get("/v1/tenant").body["schedule_count"] == 1


# --- 6. next fires: what happens next, made occurrences included ------------------------


def test_next_fires_include_the_occurrences_already_made(alice: Api, clock: Clock) -> None:
    # GIVEN it is 12:00:20 and an every-two-minutes cron is created
    clock.now = 1_795_003_220  # 2026-11-18T12:00:20Z
    saved = create(alice, cron("*/2 * * * *"))
    made = [o["occurrence_id"] for o in saved["materialized"]]
    # THEN the next fires start at 12:02, not after the made ones, and name them
    fires = saved["next_fires"]
    assert [f["utc"] for f in fires] == [iso(1_795_003_320 + 120 * n) for n in range(5)]
    assert [f["occurrence_id"] for f in fires][: len(made)] == made
    assert all(f["occurrence_id"] is None for f in fires[len(made) :])
    assert 1 <= len(made) < 5
    # AND two minutes later, a read starts at 12:04: 12:02 is no longer ahead
    clock.advance(120)
    read = alice.get(f"/v1/schedules/{saved['schedule']['schedule_id']}").body
    assert read["next_fires"][0] == fires[1]


def test_next_fires_of_a_flexible_schedule_count_until_receivable(alice: Api, clock: Clock) -> None:
    # GIVEN a flexible every-minute schedule: each fire becomes receivable up to 15 min late
    saved = create(alice, cron("* * * * *", flexible_window_seconds=900))
    late = next(f for f in saved["next_fires"] if f["available_at"] != f["utc"])
    # WHEN it is read at one fire's instant, before that fire is receivable
    clock.now = epoch(late["utc"])
    read = alice.get(f"/v1/schedules/{saved['schedule']['schedule_id']}").body
    # THEN that fire is still among the next ones (it has yet to happen)
    assert late["utc"] in [f["utc"] for f in read["next_fires"]]


@pytest.mark.parametrize(
    ("window", "shown"),
    [
        # wholly before 1970: a key range below zero, which DynamoDB refused (a 500)
        ({"from": "1900-01-01T00:00:00Z", "to": "1950-01-01T00:00:00Z"}, False),
        ({"to": "1969-12-31T23:59:59Z"}, False),
        # from before 1970 to after the fire: the fire
        ({"from": "1900-01-01T00:00:00Z"}, True),
    ],
)
def test_a_window_of_occurrences_before_1970_answers_what_is_in_it(
    local_aws: Services, window: dict[str, str], shown: bool
) -> None:
    # GIVEN a one-shot the API made an occurrence of, on AWS's own engine (moto took a key
    # range below zero)
    alice = bootstrap("alice", "arn:aws:iam::111122223333:user/alice")
    saved = create(alice, one_shot(iso(START + 60)))
    schedule_id = saved["schedule"]["schedule_id"]
    # WHEN its occurrences are listed in a window that begins (or ends) before 1970
    answer = alice.get(f"/v1/schedules/{schedule_id}/occurrences", **window)
    # THEN 200, with the fire only if the window holds it
    assert answer.status == 200, answer.body
    found = [o["occurrence_id"] for o in answer.body["occurrences"]]
    assert found == ([saved["materialized"][0]["occurrence_id"]] if shown else [])


@pytest.mark.parametrize("name", ["", "   ", "two\nlines", "tab\there", "bell\x07"])
def test_a_name_is_one_line_with_something_in_it(alice: Api, aws: Services, name: str) -> None:
    # WHEN a schedule is created, or renamed, with a blank name or one with control characters
    created = alice.post("/v1/schedules", cron(name=name))
    kept = create(alice, cron(name="kept"))
    renamed = patch(alice, kept["schedule"]["schedule_id"], {"name": name}, version=1)
    # THEN 400 naming the field, and the name stays as it was
    for answer in (created, renamed):
        assert assert_error(answer, 400, "invalid_input")["fields"][0]["field"] == "name"
    names = [s["name"] for s in alice.get("/v1/schedules").body["schedules"]]
    assert names == ["kept"]


def test_every_schedule_example_of_the_api_document_is_accepted(alice: Api) -> None:
    # GIVEN the examples the API's document gives for a schedule and for a one-shot's spec
    # (clients and fuzzers send them as they are)
    document = json.loads(DOCUMENT.read_text())
    schemas = document["components"]["schemas"]
    definitions = schemas["ScheduleDefinition"]["examples"]
    one_shots = [{"spec": spec, "target": "default"} for spec in schemas["AtSpec"]["examples"]]
    # WHEN each is created; THEN each is (none expired with the calendar, none refused)
    for body in definitions + one_shots:
        answer = alice.post("/v1/schedules", body)
        assert answer.status == 201, (body, answer.body)
