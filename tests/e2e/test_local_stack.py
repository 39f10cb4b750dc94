"""End to end: `punctual local up` in a subprocess, driven through the `punctual` CLI and
the HTTP API, with the engines read through their AWS endpoints.

Each test that watches occurrences uses a target (a queue) of its own, so that no other
test's messages land where it looks. The two minute crons are created before every other
test, so that waiting for their minute boundary overlaps the rest of the module, and so is
a one-shot whose completion, a minute and a half later, is checked near the end. Tests run
in file order; the one about an empty payload is last because, while that bug lasts, it
stops the shared stack's relay.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from punctual_client.http import ApiError
from punctual_client.worker import QueueConsumer
from punctual_local.dynamodb import free_port
from punctual_local.engines import LOCAL_SHARDS, recorded
from tests.e2e.conftest import (
    LOOKAHEAD_SECONDS,
    SECRET,
    TICK_SECONDS,
    Run,
    Stack,
    answering,
    eventually,
    local_principal,
    run_punctual,
    wait_for,
)
from tests.instants import epoch, iso

pytestmark = pytest.mark.e2e

ERROR_KEYS = {"code", "message", "fields", "details"}


def until(instant: float) -> float:
    """Seconds from now to ``instant``, 0 if it has passed."""
    return max(0.0, instant - time.time())


def walked_minute(stack: Stack, ahead: int) -> int:
    """The instant ``ahead`` seconds from now, once every shard's materializer has walked its
    minute (it walks whole minutes up to tick + lookahead)."""

    def pick() -> int | None:
        instant = int(time.time()) + ahead
        marks = stack.watermarks()
        return instant if len(marks) == LOCAL_SHARDS and min(marks) > instant else None

    found: int = wait_for(pick, 60, f"the materializer to walk the minute {ahead} s ahead")
    return found


def occurrence(stack: Stack, occurrence_id: str) -> dict[str, Any]:
    found: dict[str, Any] = stack.client().get(f"/v1/occurrences/{occurrence_id}")
    return found


def occurrences_of(stack: Stack, schedule_id: str) -> list[dict[str, Any]]:
    return stack.client().pages(f"/v1/schedules/{schedule_id}/occurrences", "occurrences")


def delayed(stack: Stack, queue: str) -> int:
    """Messages in ``queue`` that SQS still holds back (sent ahead of their time)."""
    found = stack.aws("sqs").get_queue_attributes(
        QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessagesDelayed"]
    )["Attributes"]
    return int(found["ApproximateNumberOfMessagesDelayed"])


def queue_of(stack: Stack, target: str) -> str:
    created = stack.cli_json("targets", "create", target)
    assert created["name"] == target
    queue: str = created["queue_url"]
    return queue


def create(stack: Stack, *flags: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    """`punctual create ... --json`, with a payload that names the test's schedules."""
    payload = payload or {"e2e": True}
    created: dict[str, Any] = stack.cli_json("create", *flags, "--payload", json.dumps(payload))
    return created


def one_shot(stack: Stack, target: str, due: int, **payload: Any) -> dict[str, Any]:
    """A one-shot due within the lookahead: the answer carries its one occurrence, made by
    the API itself."""
    created = create(stack, "--at", iso(due), "--target", target, payload=payload)
    assert [m["scheduled_for"] for m in created["materialized"]] == [iso(due)]
    return created


def settle(
    stack: Stack,
    consumer: QueueConsumer,
    wanted: dict[str, str],
    seconds: float,
    not_before: float = 0,
) -> None:
    """Let the in-process worker take what arrives (1 s long polls) until the occurrences
    are in the ``wanted`` states (occurrence id -> state), and it is ``not_before``."""
    deadline = time.monotonic() + seconds
    while True:
        consumer.poll_once()
        found = {occ: occurrence(stack, occ)["state"] for occ in wanted}
        if found == wanted and time.time() >= not_before:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"after {seconds:.0f} s the occurrences are {found}, not {wanted}")


def one_line_error(run: Run) -> str:
    """A 4xx or bad input: exit 2, nothing on stdout, exactly one line on stderr."""
    assert run.code == 2, (run.code, run.out, run.err)
    assert run.out == ""
    assert run.err.startswith("punctual: error: ")
    assert run.err.endswith("\n")
    assert run.err.count("\n") == 1, run.err
    return run.err


def signed(stack: Stack, method: str, path: str, body: bytes | None, key: str = "demo") -> Any:
    """A raw SigV4-signed request (any body, even one the Client would not send)."""
    url = stack.url + path
    headers = {"Content-Type": "application/json"}
    request = AWSRequest(method=method, url=url, data=body, headers=headers)
    SigV4Auth(Credentials(key, SECRET), "execute-api", "us-east-1").add_auth(request)
    raw = urllib.request.Request(url, data=body, method=method, headers=dict(request.headers))
    try:
        with urllib.request.urlopen(raw, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


# --- created before everything else: the minute crons -------------------------------------


@dataclass(frozen=True)
class MinuteCrons:
    kolkata: dict[str, Any]  # the create answer of `* * * * *` in Asia/Kolkata (active)
    canceled: dict[str, Any]  # the create answer of `* * * * *` in UTC ...
    cancel_answer: dict[str, Any]  # ... canceled right after its creation


@pytest.fixture(scope="module", autouse=True)
def minute_crons(stack: Stack) -> MinuteCrons:
    queue_of(stack, "minutely")
    queue_of(stack, "canceled")
    kolkata = create(
        stack,
        *("--cron", "* * * * *", "--tz", "Asia/Kolkata", "--target", "minutely"),
        *("--name", "every minute in Kolkata"),
    )
    canceled = create(stack, "--cron", "* * * * *", "--tz", "UTC", "--target", "canceled")
    return MinuteCrons(kolkata, canceled, stack.cli_json("cancel", canceled["schedule_id"]))


@dataclass(frozen=True)
class EarlyOneShot:
    due: int
    saved: dict[str, Any]  # the create answer
    counted: int  # the tenant's schedule_count right after it


@pytest.fixture(scope="module", autouse=True)
def early_one_shot(stack: Stack, minute_crons: MinuteCrons) -> EarlyOneShot:
    """A one-shot 3 s ahead, of a tenant of its own (no other test changes its count), made
    at module start: its completion, a minute and a half later, overlaps the other tests."""
    principal = local_principal("completes")
    made = stack.cli("tenants", "create", "completes", "--principal", principal, key="operator")
    assert made.code == 0, made.err
    client = stack.client("completes")
    client.post("/v1/targets", {"name": "default"})
    due = walked_minute(stack, 3)
    saved = client.post(
        "/v1/schedules",
        {"spec": {"kind": "at", "at": iso(due)}, "target": "default", "payload": {"e2e": 1}},
    )
    return EarlyOneShot(due, saved, client.get("/v1/tenant")["schedule_count"])


# --- one-shot: queue, timing, worker ----------------------------------------------------


def test_one_shot_is_queued_at_its_time_and_succeeds_after_the_worker(stack: Stack):
    # GIVEN a target of its own and a one-shot 10 s ahead with a payload (room for the CLI
    # and the relay on a busy machine: the relay must send it before its time)
    queue = queue_of(stack, "oneshot")
    sqs = stack.aws("sqs")
    due = int(time.time()) + 10
    created = one_shot(stack, "oneshot", due, job="e2e")
    assert (created["state"], created["version"]) == ("ACTIVE", 1)
    [made] = created["materialized"]
    assert made["available_at"] == iso(due)  # strict: no flexible window
    occ_id = made["occurrence_id"]
    # (its next fire is that occurrence, made already)
    assert [(f["utc"], f["occurrence_id"]) for f in created["next_fires"]] == [(iso(due), occ_id)]

    # WHEN the relay has sent it ahead of its time (SQS holds it back with a delay; the
    # occurrence stays SCHEDULED, the send is not written back)
    wait_for(
        lambda: delayed(stack, queue) == 1,
        due - time.time(),
        "the relay to send the occurrence before it is due",
    )
    assert occurrence(stack, occ_id)["state"] == "SCHEDULED"
    # ... and the queue is short-polled from then on
    empty_before_due = 0
    while True:
        asked = time.time()
        received = sqs.receive_message(
            QueueUrl=queue, WaitTimeSeconds=0, MessageAttributeNames=["All"]
        ).get("Messages", [])
        answered = time.time()
        if received:
            break
        empty_before_due += answered < due
        assert answered < due + 5, "the message never became receivable"
        time.sleep(0.1)

    # THEN it was not receivable before its time, and was soon after
    assert empty_before_due > 0
    assert due <= answered < due + 3, (asked - due, answered - due)
    # ... its body is the version 1 message (docs/message.md)
    [message] = received
    assert json.loads(message["Body"]) == {
        "version": 1,
        "occurrence_id": occ_id,
        "schedule_id": created["schedule_id"],
        "schedule_version": 1,
        "tenant_id": "demo",
        "target": "oneshot",
        "scheduled_for": iso(due),
        "available_at": iso(due),
        "attempt": 1,
        "payload": {"job": "e2e"},
    }
    attributes = {k: v["StringValue"] for k, v in message["MessageAttributes"].items()}
    assert attributes == {
        "occurrence_id": occ_id,
        "schedule_id": created["schedule_id"],
        "tenant_id": "demo",
        "message_version": "1",
    }
    # (give it back to the queue for the worker)
    sqs.change_message_visibility(
        QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
    )

    # WHEN `punctual worker` runs on the target
    with stack.cli_worker("oneshot") as worker:
        wait_for(
            lambda: occurrence(stack, occ_id)["state"] == "SUCCEEDED",
            20,
            "the worker to finish the occurrence",
        )
        # THEN the occurrence SUCCEEDED in one attempt, the handler saw it, the queue is empty
        done = stack.cli_json("occurrence", occ_id)
        assert (done["state"], done["attempt_count"]) == ("SUCCEEDED", 1)
        assert epoch(done["enqueued_at"]) <= due  # sent ahead (the claim recorded it)
        [attempt] = done["attempts"]
        assert (attempt["attempt_no"], attempt["outcome"], attempt["error"]) == (
            1,
            "SUCCEEDED",
            None,
        )
        assert epoch(attempt["started_at"]) >= due
        assert occ_id in worker.output()
        wait_for(
            lambda: (
                sqs.get_queue_attributes(
                    QueueUrl=queue,
                    AttributeNames=[
                        "ApproximateNumberOfMessages",
                        "ApproximateNumberOfMessagesNotVisible",
                    ],
                )["Attributes"]
                == {
                    "ApproximateNumberOfMessages": "0",
                    "ApproximateNumberOfMessagesNotVisible": "0",
                }
            ),
            # (generous: on a machine busy with the other test processes a worker may take
            # long between its completion and its delete; the wait ends as soon as it is done)
            60,
            "the worker to delete the message",
        )
        # WHEN it is stopped with Ctrl-C while idle
        code, seconds = worker.interrupt()
        # THEN it exits 0 after its current 2 s poll (with room for a busy machine; a 20 s
        # poll took up to 20 s), having printed only its own lines for people: the log
        # records are plain lines too, on stderr
        assert code == 0
        assert seconds < 6
        lines = worker.output().splitlines()
        assert lines[0].startswith("worker for demo/oneshot on ")
        assert lines[-1] == "worker stopped"
        assert not [line for line in lines if line.startswith("{")]


# --- pause, resume, update, cancel ------------------------------------------------------


def test_pause_keeps_the_pending_occurrence_from_running_and_resume_brings_the_fire_back(
    stack: Stack,
):
    # GIVEN a one-shot 30 s ahead (past a pause and a resume through the CLI, on a busy
    # machine) on a target of its own, its occurrence made at once
    queue = queue_of(stack, "pausing")
    due = int(time.time()) + 30
    created = one_shot(stack, "pausing", due)
    schedule_id = created["schedule_id"]
    [first] = created["materialized"]

    # WHEN it is paused
    paused = stack.cli_json("pause", schedule_id)
    # THEN it is PAUSED at version 2 with no next fires, and the answer reports the
    # occurrence CANCELED (whether or not the relay had sent it: a worker drops it)
    assert (paused["state"], paused["version"], paused["next_fires"]) == ("PAUSED", 2, [])
    [affected] = paused["affected"]
    assert affected["occurrence_id"] == first["occurrence_id"]
    assert (affected["state"], affected["note"]) == (
        "CANCELED",
        "canceled: it will not run (a message already sent is dropped)",
    )

    # WHEN it is resumed before its time
    resumed = stack.cli_json("resume", schedule_id)
    # THEN it is ACTIVE at version 3, and the fire is back as a new occurrence of version 3
    assert (resumed["state"], resumed["version"]) == ("ACTIVE", 3)
    [again] = resumed["materialized"]
    assert (again["schedule_version"], again["scheduled_for"]) == (3, iso(due))
    assert again["occurrence_id"] != first["occurrence_id"]

    # WHEN a worker takes what the queue delivers until both are settled
    handled: list[str] = []
    wanted = {again["occurrence_id"]: "SUCCEEDED", first["occurrence_id"]: "CANCELED"}
    settle(stack, stack.consumer(queue, handled), wanted, until(due) + 15)
    # THEN only the resumed occurrence ran; the paused one never did
    assert handled == [again["occurrence_id"]]
    old = occurrence(stack, first["occurrence_id"])
    assert (old["attempt_count"], old["attempts"]) == (0, [])
    assert old["reason"]
    assert sorted(o["schedule_version"] for o in occurrences_of(stack, schedule_id)) == [1, 3]


def test_pause_and_resume_of_a_cron_stop_and_bring_back_its_next_fires(stack: Stack):
    # GIVEN a daily cron in New York
    created = create(
        stack, "--cron", "15 4 * * *", "--tz", "America/New_York", "--target", "default"
    )
    assert len(created["next_fires"]) == 5
    # WHEN it is paused
    paused = stack.cli_json("pause", created["schedule_id"])
    # THEN it has no next fires, and `get` says so too
    assert (paused["state"], paused["next_fires"], paused["next_run_at"]) == ("PAUSED", [], None)
    assert stack.cli_json("get", created["schedule_id"])["state"] == "PAUSED"
    # WHEN it is resumed
    resumed = stack.cli_json("resume", created["schedule_id"])
    # THEN its fires are back, the same instants at 04:15 New York time
    assert (resumed["state"], resumed["version"]) == ("ACTIVE", 3)
    assert resumed["next_fires"] == created["next_fires"]
    assert all(f["local"][10:19] == "T04:15:00" for f in resumed["next_fires"])


def test_cli_trigger_runs_a_schedule_now_once_per_key(stack: Stack):
    # GIVEN a daily cron on a target of its own (no fire for hours)
    queue = queue_of(stack, "runnow")
    created = create(stack, "--cron", "15 4 * * *", "--tz", "UTC", "--target", "runnow")
    sid = created["schedule_id"]
    # WHEN it is run now, twice with one key
    asked = time.time()
    first = stack.cli_json("trigger", sid, "--idempotency-key", "e2e-once")
    again = stack.cli_json("trigger", sid, "--idempotency-key", "e2e-once")
    # THEN one manual occurrence, answered twice, and its message is receivable at once
    made = first["occurrence"]
    assert (first["replayed"], again["replayed"]) == (False, True)
    assert again["occurrence"]["occurrence_id"] == made["occurrence_id"]
    assert made["manual"] is True
    received: list[dict[str, Any]] = []
    while not received and time.time() < asked + 20:
        answer = stack.aws("sqs").receive_message(QueueUrl=queue, WaitTimeSeconds=2)
        received = answer.get("Messages", [])
    assert [json.loads(m["Body"])["occurrence_id"] for m in received] == [made["occurrence_id"]]
    assert [o["occurrence_id"] for o in occurrences_of(stack, sid) if o["manual"]] == [
        made["occurrence_id"]
    ]


def test_cli_backfill_delivers_the_past_fires_once(stack: Stack):
    # GIVEN a daily cron made now on a target of its own: three fires in the last 3 days
    queue = queue_of(stack, "backfill")
    created = create(stack, "--cron", "15 4 * * *", "--tz", "UTC", "--target", "backfill")
    sid = created["schedule_id"]
    now = int(time.time())
    since = datetime.fromtimestamp(now - 3 * 86400, UTC).isoformat()
    until = datetime.fromtimestamp(now, UTC).isoformat()
    # WHEN a dry run, then the backfill, of those 3 days
    dry = stack.cli_json("backfill", sid, "--from", since, "--to", until, "--dry-run")
    done = stack.cli_json("backfill", sid, "--from", since, "--to", until)
    # THEN the dry run counts 3 to make, the backfill makes them, and their messages arrive
    assert (dry["fires"], dry["created"], dry["dry_run"]) == (3, 3, True)
    assert (done["created"], done["existing"]) == (3, 0)
    made = {o["occurrence_id"] for o in done["occurrences"]}
    received: set[str] = set()
    while len(received) < 3 and time.time() < now + 30:
        answer = stack.aws("sqs").receive_message(
            QueueUrl=queue, WaitTimeSeconds=2, MaxNumberOfMessages=10
        )
        received |= {json.loads(m["Body"])["occurrence_id"] for m in answer.get("Messages", [])}
    assert received == made
    # AND a second backfill of the range makes none
    assert stack.cli_json("backfill", sid, "--from", since, "--to", until)["created"] == 0


def test_update_to_a_new_cron_bumps_the_version_and_cancels_the_old_occurrence(stack: Stack):
    # GIVEN a one-shot 8 s ahead on a target of its own (ahead still when the CLI's create
    # reaches the API on a busy machine)
    queue = queue_of(stack, "updating")
    due = int(time.time()) + 8
    created = one_shot(stack, "updating", due)
    [old] = created["materialized"]

    # WHEN it is updated to a daily cron in Berlin
    updated = stack.cli_json(
        "update", created["schedule_id"], "--cron", "30 9 * * *", "--tz", "Europe/Berlin"
    )
    # THEN it is version 2 with the new spec and fires at 09:30 Berlin time
    assert (updated["state"], updated["version"]) == ("ACTIVE", 2)
    assert (updated["spec"]["kind"], updated["spec"]["expression"]) == ("cron", "30 9 * * *")
    assert updated["spec"]["timezone"] == "Europe/Berlin"
    assert len(updated["next_fires"]) == 5
    assert all(f["local"][10:19] == "T09:30:00" for f in updated["next_fires"])
    # ... and the old version's occurrence is reported (canceled, or refused once it arrives)
    assert [a["occurrence_id"] for a in updated["affected"]] == [old["occurrence_id"]]
    assert updated["affected"][0]["state"] == "CANCELED"

    # WHEN a worker takes what the queue delivers until past the old occurrence's time
    handled: list[str] = []
    wanted = {old["occurrence_id"]: "CANCELED"}
    settle(stack, stack.consumer(queue, handled), wanted, until(due) + 15, due + 2)
    # THEN it never ran, and the schedule has no other occurrence (09:30 is not that soon)
    assert handled == []
    assert occurrence(stack, old["occurrence_id"])["attempt_count"] == 0
    assert [o["occurrence_id"] for o in occurrences_of(stack, created["schedule_id"])] == [
        old["occurrence_id"]
    ]


def test_cancel_ends_the_schedule_and_its_pending_occurrence_never_runs(stack: Stack):
    # GIVEN a one-shot 4 s ahead on a target of its own
    queue = queue_of(stack, "canceling")
    due = int(time.time()) + 4
    created = one_shot(stack, "canceling", due)
    schedule_id = created["schedule_id"]
    [pending] = created["materialized"]

    # WHEN it is canceled
    canceled = stack.cli_json("cancel", schedule_id)
    # THEN it is CANCELED at version 2, with no next fires and its occurrence reported
    assert (canceled["state"], canceled["version"], canceled["next_fires"]) == ("CANCELED", 2, [])
    assert [a["occurrence_id"] for a in canceled["affected"]] == [pending["occurrence_id"]]
    # ... it stays readable as CANCELED, cannot be updated again, and a repeated cancel (a
    # retry after a lost answer) succeeds saying it changed nothing
    assert stack.cli_json("get", schedule_id)["state"] == "CANCELED"
    assert schedule_id in {s["schedule_id"] for s in stack.cli_json("list", "--state", "CANCELED")}
    again = stack.cli("cancel", schedule_id)
    assert (again.code, again.err) == (0, ""), again.err
    assert "already CANCELED: nothing changed" in again.out
    assert " 409 " in one_line_error(stack.cli("update", schedule_id, "--name", "again"))

    # WHEN a worker takes what the queue delivers until past its time
    handled: list[str] = []
    wanted = {pending["occurrence_id"]: "CANCELED"}
    settle(stack, stack.consumer(queue, handled), wanted, until(due) + 15, due + 2)
    # THEN it never ran, and no further occurrence was made
    assert handled == []
    assert [o["occurrence_id"] for o in occurrences_of(stack, schedule_id)] == [
        pending["occurrence_id"]
    ]


# --- the materializer's reach with a short tick ------------------------------------------


def test_a_fire_just_beyond_the_api_horizon_is_still_materialized_in_time(stack: Stack):
    # GIVEN an instant a little beyond what the API materializes itself (lookahead + tick)
    # whose minute the materializer has already walked on every shard
    due = walked_minute(stack, LOOKAHEAD_SECONDS + 3 * TICK_SECONDS)
    # WHEN a one-shot is created for it
    saved = stack.client().post(
        "/v1/schedules",
        {"spec": {"kind": "at", "at": iso(due)}, "target": "default", "payload": {"e2e": 1}},
    )
    # THEN its occurrence exists once it is within the lookahead (a tick or two later)
    made = eventually(
        lambda: occurrences_of(stack, saved["schedule"]["schedule_id"]),
        until(due - LOOKAHEAD_SECONDS) + 3 * TICK_SECONDS,
    )
    assert [o["scheduled_for"] for o in made] == [iso(due)]


# --- tenancy ------------------------------------------------------------------------------


def test_another_tenant_gets_404_for_demos_schedule_and_occurrence(stack: Stack):
    # GIVEN a schedule of demo with an occurrence
    created = one_shot(stack, "default", int(time.time()) + 25)
    schedule_id = created["schedule_id"]
    occ_id = created["materialized"][0]["occurrence_id"]

    # WHEN the operator creates tenant `other` bound to its principal (demo may not)
    other = local_principal("other")
    assert " 403 " in one_line_error(stack.cli("tenants", "create", "other", "--principal", other))
    bound = stack.cli("tenants", "create", "other", "--principal", other, key="operator")
    assert (bound.code, bound.out, bound.err) == (0, f"tenant other bound to {other}\n", "")

    # THEN `other` sees none of demo's: 404 exactly like an id that does not exist
    missing = one_line_error(stack.cli("get", "sch_doesnotexist", key="other"))
    for command in ("get", "occurrences", "cancel"):
        error = one_line_error(stack.cli(command, schedule_id, key="other"))
        assert error.replace(schedule_id, "sch_doesnotexist") == missing, command
    error = one_line_error(stack.cli("occurrence", occ_id, key="other"))
    assert error == f"punctual: error: 404 occurrence {occ_id} not found\n"
    assert stack.cli_json("list", key="other") == []
    assert stack.cli_json("targets", "list", key="other") == []
    # ... and demo's schedule is untouched
    assert (stack.cli_json("get", schedule_id)["version"]) == 1


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        pytest.param(
            ["--cron", "* * * * *", "--tz", "Mars/Olympus_Mons"], "spec.timezone", id="zone"
        ),
        pytest.param(["--cron", "0 * * * * *", "--tz", "UTC"], "spec.expression", id="6-field"),
        pytest.param(["--rate", "rate(0 minutes)"], "spec.expression", id="zero-rate"),
        pytest.param(["--at", "2020-01-01T00:00:00Z"], "spec", id="past-one-shot"),
        pytest.param(
            ["--cron", "* * * * *", "--tz", "UTC", "--payload", "{no"], "--payload", id="json"
        ),
        pytest.param(
            ["--cron", "* * * * *", "--tz", "UTC", "--payload", "[1]"], "--payload", id="list"
        ),
        pytest.param(["--cron", "* * * * *"], "--tz", id="cron-without-zone"),
    ],
)
def test_cli_create_with_bad_input_exits_2_naming_the_field(
    stack: Stack, flags: list[str], named: str
):
    # GIVEN a create with one bad value
    # WHEN it is run
    run = stack.cli("create", *flags, "--target", "default")
    # THEN exit 2 with one line on stderr that names the field
    error = one_line_error(run)
    assert re.search(rf"[\s(]{re.escape(named)}[:\s]", error), error


def test_cli_create_for_an_unknown_target_exits_2_naming_target(stack: Stack):
    # GIVEN a target demo does not have
    # WHEN a schedule is created for it
    error = one_line_error(
        stack.cli("create", "--cron", "* * * * *", "--tz", "UTC", "--target", "nope")
    )
    # THEN the server's 400 names the field
    assert error.startswith("punctual: error: 400 ")
    assert "(target: no target named 'nope'" in error


def test_api_answers_bad_input_with_400_and_the_error_shape(stack: Stack):
    # GIVEN demo's schedule count
    before = len(stack.client().pages("/v1/schedules", "schedules"))
    # WHEN a schedule with an unknown zone is posted over HTTP
    with pytest.raises(ApiError) as raised:
        stack.client().post(
            "/v1/schedules",
            {
                "spec": {"kind": "cron", "expression": "* * * * *", "timezone": "Mars/Base"},
                "target": "default",
            },
        )
    # THEN 400 in the one error shape, naming the field, and nothing was created
    assert raised.value.status == 400
    error = raised.value.body["error"]
    assert set(error) == ERROR_KEYS
    assert error["code"] == "invalid_input"
    assert [f["field"] for f in error["fields"]] == ["spec.timezone"]
    assert "Mars/Base" in error["fields"][0]["reason"]
    assert len(stack.client().pages("/v1/schedules", "schedules")) == before


def test_api_refuses_unsigned_and_unbound_callers_with_403(stack: Stack):
    # GIVEN no signature at all
    # WHEN the API is called
    with pytest.raises(urllib.error.HTTPError) as unsigned:
        urllib.request.urlopen(stack.url + "/v1/schedules", timeout=30)
    # THEN 403, as API Gateway with IAM auth answers (in the one error shape, as the
    # deployed API's gateway responses are)
    assert unsigned.value.code == 403
    refused = json.loads(unsigned.value.read())["error"]
    assert set(refused) == ERROR_KEYS
    assert (refused["code"], refused["message"]) == (
        "MISSING_AUTHENTICATION_TOKEN",
        "Missing Authentication Token",
    )
    # GIVEN a signature of a principal bound to no tenant
    # WHEN the API is called
    status, body = signed(stack, "GET", "/v1/schedules", None, key="stranger")
    # THEN 403 in the error shape
    assert status == 403
    assert set(body["error"]) == ERROR_KEYS
    assert body["error"]["code"] == "forbidden"


def test_api_if_match_is_required_to_update(stack: Stack):
    # GIVEN a schedule
    created = create(stack, "--cron", "0 12 * * *", "--tz", "Asia/Tokyo", "--target", "default")
    path = f"/v1/schedules/{created['schedule_id']}"
    # WHEN it is patched without If-Match
    status, body = signed(stack, "PATCH", path, b'{"name": "x"}')
    # THEN 428, and the schedule is unchanged
    assert (status, body["error"]["code"]) == (428, "precondition_required")
    assert stack.client().get(path)["schedule"]["version"] == 1


def test_api_body_that_is_not_json_is_reported_on_the_body(stack: Stack):
    # GIVEN a signed create whose body is not JSON
    # WHEN it is posted
    status, body = signed(stack, "POST", "/v1/schedules", b"{not json")
    # THEN 400 invalid_input naming the body itself
    assert (status, body["error"]["code"]) == (400, "invalid_input")
    assert [f["field"] for f in body["error"]["fields"]] == ["(body)"]


# --- the CLI's two output formats ---------------------------------------------------------


def test_cli_list_get_and_occurrences_print_tables_and_json(stack: Stack):
    # GIVEN a named cron in Tokyo and a one-shot with its occurrence
    cron = create(
        stack,
        "--cron",
        "0 9 * * *",
        "--tz",
        "Asia/Tokyo",
        "--target",
        "default",
        "--name",
        "tokyo-morning",
    )
    due = int(time.time()) + 20
    shot = one_shot(stack, "default", due)
    occ_id = shot["materialized"][0]["occurrence_id"]
    # (`get` prints the one-shot's next fire with the occurrence already made for it)
    shot_fires = stack.cli("get", shot["schedule_id"]).out.splitlines()[1:]
    assert shot_fires == [f"  next  {iso(due)}  ({iso(due)[:-1]}+00:00)  made as {occ_id}"]

    # WHEN `get` prints for people
    got = stack.cli("get", cron["schedule_id"])
    # THEN one line for the schedule, then its next fires in UTC and Tokyo time
    assert got.code == 0
    first, *fires = got.out.splitlines()
    assert first == f"{cron['schedule_id']}  ACTIVE  v1  cron '0 9 * * *' Asia/Tokyo  -> default"
    assert fires == [f"  next  {f['utc']}  ({f['local']})" for f in cron["next_fires"]]
    assert all(f["local"].endswith("T09:00:00+09:00") for f in cron["next_fires"])
    # WHEN `get --json`
    as_json = stack.cli_json("get", cron["schedule_id"])
    # THEN the schedule's fields at the top with its next fires and notes
    assert {k: as_json[k] for k in ("schedule_id", "state", "version", "name", "target")} == {
        "schedule_id": cron["schedule_id"],
        "state": "ACTIVE",
        "version": 1,
        "name": "tokyo-morning",
        "target": "default",
    }
    assert (as_json["next_fires"], as_json["notes"]) == (cron["next_fires"], [])

    # WHEN `list` prints for people and as JSON
    listed = stack.cli("list")
    listed_json = stack.cli_json("list")
    # ... with --json before the command too, as the AWS CLI takes its global options (the
    # same schedules; their cursors and states move on meanwhile in the live stack)
    assert [s["schedule_id"] for s in stack.cli("--json", "list").json()] == [
        s["schedule_id"] for s in listed_json
    ]
    # THEN both schedules are there, one line each
    assert listed.code == 0
    lines = listed.out.splitlines()
    assert f"{cron['schedule_id']}  ACTIVE  v1  cron '0 9 * * *' Asia/Tokyo  -> default" in lines
    assert any(line.startswith(f"{shot['schedule_id']}  ") for line in lines)
    by_id = {s["schedule_id"]: s for s in listed_json}
    assert by_id[cron["schedule_id"]]["name"] == "tokyo-morning"
    assert by_id[shot["schedule_id"]]["spec"]["at"] == iso(due)

    # WHEN `occurrences` and `occurrence` print for people and as JSON
    table = stack.cli("occurrences", shot["schedule_id"])
    rows = stack.cli_json("occurrences", shot["schedule_id"])
    one = stack.cli("occurrence", occ_id)
    # THEN a table with a header and one row, and the API's occurrence objects
    assert table.code == one.code == 0
    header, row = table.out.splitlines()
    assert header.split() == ["OCCURRENCE", "SCHEDULED_FOR", "STATE", "ATTEMPTS"]
    assert row.split()[:2] == [occ_id, iso(due)]
    assert row.split()[2] == "SCHEDULED"
    assert row.split()[3] == "0"
    assert one.out.splitlines()[0] == header
    [only] = rows
    assert {k: only[k] for k in ("occurrence_id", "schedule_id", "scheduled_for")} == {
        "occurrence_id": occ_id,
        "schedule_id": shot["schedule_id"],
        "scheduled_for": iso(due),
    }
    assert {"available_at", "state", "enqueued_at", "attempt_count"} <= set(only)

    # WHEN `versions` prints the cron's history for people and as JSON
    versions = stack.cli("versions", cron["schedule_id"])
    [version] = stack.cli_json("versions", cron["schedule_id"])
    # THEN its one version, with when it took effect
    assert versions.code == 0
    assert versions.out.splitlines() == [
        f"v1  from {version['effective_from']}  ACTIVE  cron '0 9 * * *' Asia/Tokyo  -> default"
    ]
    assert (version["version"], version["name"]) == (1, "tokyo-morning")


# --- `local up` beside a running stack --------------------------------------------------


def test_local_up_beside_a_running_stack_names_it_or_the_port_and_starts_nothing(
    stack: Stack, tmp_path: Path
):
    # GIVEN the session's stack running on its data folder and port
    engines = stack.engine_pids()
    port = stack.url.rsplit(":", 1)[1]
    # WHEN `local up` runs again on that data folder (on another port)
    same_data = run_punctual("local", "up", "--data", str(stack.data), "--port", str(free_port()))
    # THEN exit 1 with one line naming the running stack: its pid and API
    assert (same_data.code, same_data.out) == (1, "")
    assert same_data.err == (
        f"punctual: failed: a local stack is already running on {stack.data} "
        f"(pid {stack.process.pid}, API {stack.url}); stop it with Ctrl-C where it runs, "
        "or use it as it is\n"
    )
    # WHEN `local up` runs on another data folder but the same port
    same_port = run_punctual("local", "up", "--data", str(tmp_path), "--port", port)
    # THEN exit 1 with one line naming the port, and no engine was started for it
    assert (same_port.code, same_port.out) == (1, "")
    assert same_port.err.startswith(f"punctual: failed: port {port} is already in use ")
    assert same_port.err.count("\n") == 1
    assert recorded(tmp_path) == {}
    # ... and the running stack is untouched
    assert stack.engine_pids() == engines
    assert answering(stack)


# --- the minute crons (created first; their minute boundary has usually passed by now) ----


def test_minute_cron_in_kolkata_fires_on_the_minute_and_succeeds_after_the_worker(
    stack: Stack, minute_crons: MinuteCrons
):
    # GIVEN `* * * * *` in Asia/Kolkata (UTC+05:30), created at module start
    created = minute_crons.kolkata
    assert (created["state"], created["name"]) == ("ACTIVE", "every minute in Kolkata")
    started = epoch(created["created_at"])
    minute = -(-started // 60) * 60  # the first minute boundary at or after creation
    planned = [m["scheduled_for"] for m in created["materialized"]]
    planned += [f["utc"] for f in created["next_fires"]]
    assert planned[0] == iso(minute)
    for fire in created["next_fires"]:
        local = datetime.fromisoformat(fire["local"])
        assert local == datetime.fromisoformat(fire["utc"].replace("Z", "+00:00"))
        assert local.utcoffset() == timedelta(hours=5, minutes=30)

    # WHEN that minute comes: its occurrence is made and sent to the target's queue
    def made() -> dict[str, Any] | None:
        for found in occurrences_of(stack, created["schedule_id"]):
            if found["scheduled_for"] == iso(minute):
                return found
        return None

    sent = wait_for(made, until(minute) + 10, f"the occurrence of {iso(minute)}")
    assert (sent["schedule_version"], sent["available_at"]) == (1, iso(minute))

    # WHEN `punctual worker` runs on the target
    with stack.cli_worker("minutely") as worker:
        wait_for(
            lambda: occurrence(stack, sent["occurrence_id"])["state"] == "SUCCEEDED",
            until(minute) + 20,
            "the worker to finish the minute's occurrence",
        )
        # THEN it SUCCEEDED in one attempt, not before its minute
        done = stack.cli_json("occurrence", sent["occurrence_id"])
        [attempt] = done["attempts"]
        assert (done["attempt_count"], attempt["outcome"]) == (1, "SUCCEEDED")
        assert epoch(attempt["started_at"]) >= minute
        assert sent["occurrence_id"] in worker.output()


def test_canceled_minute_cron_gets_no_further_occurrences(stack: Stack, minute_crons: MinuteCrons):
    # GIVEN `* * * * *` in UTC canceled right after its creation at module start
    created, canceled = minute_crons.canceled, minute_crons.cancel_answer
    made_before = {m["occurrence_id"] for m in created["materialized"]}
    # THEN the cancel answered CANCELED, a new version, no next fires, its occurrences reported
    assert (canceled["state"], canceled["version"], canceled["next_fires"]) == ("CANCELED", 2, [])
    assert {a["occurrence_id"] for a in canceled["affected"]} == made_before
    assert all(a["state"] == "CANCELED" for a in canceled["affected"])

    # WHEN the next fire it had is near enough that the materializer would have made it,
    # as it did for the active Kolkata cron created beside it (the control)
    upcoming = epoch(created["next_run_at"])
    control = minute_crons.kolkata["schedule_id"]
    wait_for(
        lambda: iso(upcoming) in {o["scheduled_for"] for o in occurrences_of(stack, control)},
        until(upcoming - LOOKAHEAD_SECONDS) + 10 * TICK_SECONDS,
        f"the control cron's occurrence of {iso(upcoming)}",
    )
    # THEN the canceled cron has no occurrence beyond those made before the cancel
    after = occurrences_of(stack, created["schedule_id"])
    assert {o["occurrence_id"] for o in after} == made_before
    assert stack.cli_json("get", created["schedule_id"])["next_run_at"] is None


def test_a_one_shot_made_at_create_completes_after_its_time(
    stack: Stack, early_one_shot: EarlyOneShot
):
    # GIVEN a one-shot 3 s ahead (a minute the materializer has walked), its only occurrence
    # made by the API itself, the tenant's only schedule; created at module start
    due, saved = early_one_shot.due, early_one_shot.saved
    assert [m["scheduled_for"] for m in saved["materialized"]] == [iso(due)]
    assert early_one_shot.counted == 1
    client = stack.client("completes")
    # WHEN the materializer reaches the minute it waits in (past the planned horizon:
    # lookahead + a minute), plus a few ticks (and a minute more for a busy machine)
    path = f"/v1/schedules/{saved['schedule']['schedule_id']}"
    state = eventually(
        lambda: (found := client.get(path)["schedule"]["state"]) == "COMPLETED" and found,
        until(due) + LOOKAHEAD_SECONDS + 2 * 60 + 4 * TICK_SECONDS,
    )
    # THEN it is COMPLETED and no longer counts against the tenant's schedules
    assert state == "COMPLETED"
    assert client.get("/v1/tenant")["schedule_count"] == 0


# --- last: it stops the shared stack's relay for as long as the bug lasts ------------------


def test_an_occurrence_without_payload_is_relayed_and_blocks_nothing(stack: Stack):
    # GIVEN a target of its own
    queue = queue_of(stack, "bare")
    due = int(time.time()) + 10
    # WHEN a one-shot without a payload is created, then one with a payload
    made = [
        stack.client().post(
            "/v1/schedules", {"spec": {"kind": "at", "at": iso(due)}, "target": "bare"} | extra
        )["materialized"][0]["occurrence_id"]
        for extra in ({}, {"payload": {"x": 1}})
    ]
    # THEN both are sent to the queue ahead of their time, and both arrive at it
    assert eventually(lambda: delayed(stack, queue) == 2, until(due))
    sqs, received = stack.aws("sqs"), set[str]()
    deadline = time.time() + until(due) + 10
    while received != set(made) and time.time() < deadline:
        for message in sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get(
            "Messages", []
        ):
            received.add(json.loads(message["Body"])["occurrence_id"])
        time.sleep(0.25)
    assert received == set(made)


# --- reconciler -------------------------------------------------------------------------


def test_the_stack_runs_the_reconciler_and_operators_read_its_reports(stack: Stack):
    # GIVEN the stack, which runs the reconciler when it starts and then hourly
    # WHEN an operator asks for the last window's reports, once every shard reported (the
    # stack reconciles its shard groups one after the other: the answer names those to come)
    found = eventually(
        lambda: (
            not (r := stack.cli_json("reconcile", "report", key="operator"))["unreported_shards"]
            and r
        ),
        90,
    )
    # THEN every local shard reported it, with nothing MISSING or UNEXPECTED
    assert len(found["reports"]) == 8
    assert (found["missing"], found["unexpected"]) == (0, 0)
    # AND a tenant may not read them
    denied = stack.cli("reconcile", "report")
    assert denied.code == 2


def test_cli_ledger_lists_the_upcoming_fires_across_schedules_and_refuses_a_bad_state(
    stack: Stack,
):
    # GIVEN a minutely cron of the tenant's on a target of its own
    queue_of(stack, "ledger")
    created = create(stack, "--cron", "* * * * *", "--tz", "UTC", "--target", "ledger")
    sid = created["schedule_id"]
    now = int(time.time())
    until = iso(now - now % 60 + 300)
    # WHEN the ledger of the next five minutes is read for that target
    ledger = stack.cli_json("ledger", "--to", until, "--target", "ledger", "--state", "UPCOMING")
    # THEN it lists the schedule's fires to come, in time order, each with its id
    upcoming = ledger["occurrences"]
    assert {o["schedule_id"] for o in upcoming} == {sid}
    assert [o["scheduled_for"] for o in upcoming] == sorted(o["scheduled_for"] for o in upcoming)
    assert 4 <= len(upcoming) <= 5
    assert all(o["state"] == "UPCOMING" for o in upcoming)
    # AND for people, a table with a line per fire
    table = stack.cli("ledger", "--to", until, "--target", "ledger", "--state", "UPCOMING")
    assert table.code == 0
    assert table.out.splitlines()[0].split() == [
        "SCHEDULED_FOR",
        "STATE",
        "FINDING",
        "ATTEMPTS",
        "OCCURRENCE",
    ]
    # (the same fires, but for one that became due if a minute ended between the two reads
    # on a slow machine: the upcoming part starts at each read's now)
    listed = [line.split()[-1] for line in table.out.splitlines() if sid in line]
    assert set(listed) <= {o["occurrence_id"] for o in upcoming}
    assert len(upcoming) - 1 <= len(listed) <= len(upcoming)
    # AND a state that is not one exits 2 naming the field, on one line
    bad = stack.cli("ledger", "--state", "LOST")
    assert bad.code == 2
    assert "state" in bad.err
    assert len(bad.err.strip().splitlines()) == 1
