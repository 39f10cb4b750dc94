"""Admission control (schedule count, strict fires per minute) and idempotent create."""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from moto.core.botocore_stubber import BotocoreStubber

from punctual.control.plane import ControlPlane
from punctual.domain.errors import QuotaExceeded
from punctual.domain.ids import shard_of
from punctual.domain.schedule import ScheduleDefinition
from punctual.pipeline.materializer import Materializer
from punctual.services import Services
from tests.instants import iso
from tests.integration.conftest import ALICE, OPERATOR, START, Answer, Api, Clock, bootstrap
from tests.integration.helpers import (
    CountedWrites,
    assert_error,
    create,
    cron,
    delete,
    one_shot,
    overtaken_at_commit,
    patch,
    table_items,
)

HOURLY = "0 * * * *"


def _count(api: Api) -> int:
    count: int = api.get("/v1/tenant").body["schedule_count"]
    return count


def _listed(api: Api) -> list[str]:
    return [s["schedule_id"] for s in api.get("/v1/schedules").body["schedules"]]


# --- max_schedules --------------------------------------------------------------------


def test_quota_max_schedules_refuses_the_one_too_many(aws: Services) -> None:
    # GIVEN a tenant allowed two schedules, which it has
    alice = bootstrap("alice", ALICE, max_schedules=2)
    first = create(alice, cron())["schedule"]["schedule_id"]
    second = create(alice, cron())["schedule"]["schedule_id"]

    # WHEN it creates a third
    answer = alice.post("/v1/schedules", cron())

    # THEN 409 (a cap: waiting does not lift it, no client should retry) with the quota,
    # its limit and the usage; nothing of the third was written
    error = assert_error(answer, 409, "quota_exceeded")
    assert error["details"] == {"quota": "max_schedules", "limit": 2, "usage": 2}
    assert sorted(_listed(alice)) == sorted([first, second])
    assert _count(alice) == 2
    schedule_items = table_items(aws, aws.settings.schedules_table)
    assert len(schedule_items) == 4  # two CURRENT items and two V#0000000001 history items
    assert len(table_items(aws, aws.settings.occurrences_table)) == 2


def test_quota_max_schedules_cancel_frees_a_slot_pause_does_not(aws: Services) -> None:
    # GIVEN a tenant at its limit of two schedules
    alice = bootstrap("alice", ALICE, max_schedules=2)
    first = create(alice, cron())["schedule"]["schedule_id"]
    second = create(alice, cron())["schedule"]["schedule_id"]

    # WHEN one is paused, a create is tried; then the other is canceled and a create tried
    assert alice.post(f"/v1/schedules/{first}/pause").status == 200
    while_paused = alice.post("/v1/schedules", cron())
    assert delete(alice, second).status == 200
    after_cancel = alice.post("/v1/schedules", cron())

    # THEN a paused schedule still holds its slot, a canceled one gives it back
    assert_error(while_paused, 409, "quota_exceeded")
    assert after_cancel.status == 201, after_cancel.body
    assert _count(alice) == 2
    # AND resuming the paused one at the limit is admitted: it never left the count
    resumed = alice.post(f"/v1/schedules/{first}/resume")
    assert resumed.status == 200, resumed.body
    assert _count(alice) == 2


def test_quota_create_overtaken_by_one_that_takes_the_last_slot_names_the_usage_found(
    aws: Services, clock: Clock
) -> None:
    # GIVEN a tenant allowed two schedules, with one, and a create that read it so, overtaken
    # before its commit by another create taking the last slot
    alice = bootstrap("alice", ALICE, max_schedules=2)
    create(alice, cron(HOURLY))
    # (every shard opened first: a shard's first schedule has its commit refused once while
    # the shard is opened, and the rival would then run before the tenant is read)
    for number in range(aws.settings.shard_count):
        aws.leases.open(number, now=int(clock.now))
    plane, rival = overtaken_at_commit(
        aws, clock, lambda: alice.post("/v1/schedules", cron(HOURLY))
    )
    definition = ScheduleDefinition.model_validate({"target": "default", **cron(HOURLY)})
    # WHEN it commits
    with pytest.raises(QuotaExceeded) as refused:
        plane.create("alice", definition)
    # THEN it is refused on the schedule count as the refusal found it (two), not as read
    assert rival[0].status == 201
    assert refused.value.details == {"quota": "max_schedules", "limit": 2, "usage": 2}
    assert _count(alice) == 2


def test_quota_operator_lowering_the_limit_refuses_new_creates(aws: Services) -> None:
    # GIVEN a tenant with three schedules
    alice = bootstrap("alice", ALICE)
    for _ in range(3):
        create(alice, cron())

    # WHEN the operator lowers max_schedules to 2
    lowered = Api(OPERATOR).call("PUT", "/v1/admin/tenants/alice/quotas", {"max_schedules": 2})
    assert lowered.status == 200

    # THEN existing schedules stay, new ones are refused with the current usage
    error = assert_error(alice.post("/v1/schedules", cron()), 409, "quota_exceeded")
    assert error["details"] == {"quota": "max_schedules", "limit": 2, "usage": 3}
    assert len(_listed(alice)) == 3


def test_quota_lowered_below_use_still_lets_the_tenant_change_what_it_has(
    aws: Services,
) -> None:
    # GIVEN a tenant with three schedules, two of them firing at :00, whose quotas the
    # operator then lowered below what it uses (two schedules, one strict fire a minute)
    alice = bootstrap("alice", ALICE)
    moved = create(alice, cron("0,30 * * * *"))["schedule"]["schedule_id"]
    create(alice, cron(HOURLY))
    create(alice, cron("15 * * * *"))
    lowered = Api(OPERATOR).call(
        "PUT",
        "/v1/admin/tenants/alice/quotas",
        {"max_schedules": 2, "max_strict_fires_per_minute": 1},
    )
    assert lowered.status == 200
    # WHEN it moves one schedule's :30 fire to :45, keeping its :00 one
    answer = patch(alice, moved, {"spec": cron("0,45 * * * *")["spec"]}, 1)
    # THEN the change is admitted: it adds no schedule and grows only a minute within the
    # quota; neither the count nor the full :00 (unchanged by it) is held against it
    assert answer.status == 200, answer.body
    tenant = alice.get("/v1/tenant").body
    assert (tenant["schedule_count"], tenant["strict_fires_per_minute_peak"]) == (3, 2)


# --- max_strict_fires_per_minute ------------------------------------------------------


def test_quota_strict_fires_per_minute_refuses_a_third_fire_in_one_minute(
    aws: Services,
) -> None:
    # GIVEN a tenant allowed two strict fires in any minute, with two hourly crons at :00
    alice = bootstrap("alice", ALICE, max_strict_fires_per_minute=2)
    first = create(alice, cron(HOURLY))["schedule"]["schedule_id"]
    create(alice, cron(HOURLY))

    # WHEN a third strict fire at :00 is created
    answer = alice.post("/v1/schedules", cron(HOURLY))

    # THEN 409 naming the quota; the tenant's peak stays 2
    error = assert_error(answer, 409, "quota_exceeded")
    assert error["details"] == {"quota": "max_strict_fires_per_minute", "limit": 2, "usage": 2}
    tenant = alice.get("/v1/tenant").body
    assert (tenant["schedule_count"], tenant["strict_fires_per_minute_peak"]) == (2, 2)
    # AND canceling one of the two frees the minute again
    assert delete(alice, first).status == 200
    assert alice.get("/v1/tenant").body["strict_fires_per_minute_peak"] == 1
    assert alice.post("/v1/schedules", cron(HOURLY)).status == 201


def test_quota_strict_fires_per_minute_admits_flexible_and_other_minutes(
    aws: Services,
) -> None:
    # GIVEN minute :00 is full (limit 2)
    alice = bootstrap("alice", ALICE, max_strict_fires_per_minute=2)
    create(alice, cron(HOURLY))
    create(alice, cron(HOURLY))

    # WHEN a flexible schedule with the same expression, and a strict one at :30, are created
    flexible = alice.post("/v1/schedules", cron(HOURLY, flexible_window_seconds=300))
    half_past = alice.post("/v1/schedules", cron("30 * * * *"))

    # THEN both are admitted: flexible fires spread, :30 has room
    assert flexible.status == 201, flexible.body
    assert half_past.status == 201, half_past.body
    assert _count(alice) == 4
    assert alice.get("/v1/tenant").body["strict_fires_per_minute_peak"] == 2


def test_quota_strict_fires_per_minute_applies_to_updates(aws: Services) -> None:
    # GIVEN minute :00 is full and a schedule fires at :30
    alice = bootstrap("alice", ALICE, max_strict_fires_per_minute=2)
    create(alice, cron(HOURLY))
    create(alice, cron(HOURLY))
    other = create(alice, cron("30 * * * *"))["schedule"]["schedule_id"]

    # WHEN it is moved to :00, and then made flexible at :00
    moved = patch(alice, other, {"spec": cron(HOURLY)["spec"]}, 1)
    flexible = patch(
        alice, other, {"spec": cron(HOURLY)["spec"], "flexible_window_seconds": 120}, 1
    )

    # THEN the strict move is refused and the flexible one admitted
    error = assert_error(moved, 409, "quota_exceeded")
    assert error["details"]["quota"] == "max_strict_fires_per_minute"
    assert flexible.status == 200, flexible.body
    assert flexible.body["schedule"]["version"] == 2


def test_quota_an_update_of_a_completed_one_shot_counts_its_new_fire_in_full(
    aws: Services, clock: Clock
) -> None:
    # GIVEN a tenant allowed one strict fire per minute, and a strict one-shot the
    # materializer completed (giving its fire back; the item keeps its old minute load)
    alice = bootstrap("alice", ALICE, max_strict_fires_per_minute=1)
    at = START - START % 3600 + 2 * 3600
    schedule_id = create(alice, one_shot(iso(at)))["schedule"]["schedule_id"]
    clock.now = at - 60
    Materializer(aws, "m1").run_shard(
        int(clock.now), shard_of(schedule_id, aws.settings.shard_count)
    )
    assert alice.get(f"/v1/schedules/{schedule_id}").body["schedule"]["state"] == "COMPLETED"
    assert alice.get("/v1/tenant").body["strict_fires_per_minute_peak"] == 0

    # WHEN it is updated to fire again an hour later, in the same minute of the hour
    again = patch(alice, schedule_id, {"spec": one_shot(iso(at + 3600))["spec"]}, 1)

    # THEN it counts that minute in full (not less the load the completion gave back), so
    # a second strict fire in it is refused
    assert again.status == 200, again.body
    assert alice.get("/v1/tenant").body["strict_fires_per_minute_peak"] == 1
    refused = alice.post("/v1/schedules", one_shot(iso(at + 7200)))
    assert assert_error(refused, 409, "quota_exceeded")["details"]["usage"] == 1


def test_quota_refusal_names_the_busiest_minute_the_change_adds_to(aws: Services) -> None:
    # GIVEN a tenant allowed two strict fires per minute, with minute :00 full and one fire
    # at :30
    alice = bootstrap("alice", ALICE, max_strict_fires_per_minute=2)
    create(alice, cron(HOURLY))
    create(alice, cron(HOURLY))
    create(alice, cron("30 * * * *"))

    # WHEN a schedule firing at :15, :30 and :00 is created
    refused = alice.post("/v1/schedules", cron("0,15,30 * * * *"))

    # THEN it is refused naming minute :00, the one over the quota, and its usage
    error = assert_error(refused, 409, "quota_exceeded")
    assert error["details"] == {
        "quota": "max_strict_fires_per_minute",
        "limit": 2,
        "usage": 2,
    }
    assert "minute :00 of every hour already has 2 strict fires" in error["message"]


def test_quota_strict_fires_per_minute_covers_near_one_shots(aws: Services) -> None:
    # GIVEN a tenant allowed two strict fires per minute
    alice = bootstrap("alice", ALICE, max_strict_fires_per_minute=2)
    soon = iso(START + 20)

    # WHEN it creates three strict one-shots for the same instant 20 s ahead
    answers = [alice.post("/v1/schedules", one_shot(soon)) for _ in range(3)]

    # THEN the third is refused, as it would be for the same instant 20 minutes ahead
    assert [a.status for a in answers] == [201, 201, 409]
    error = assert_error(answers[2], 409, "quota_exceeded")
    assert error["details"]["quota"] == "max_strict_fires_per_minute"


# --- concurrency ----------------------------------------------------------------------


@pytest.fixture
def atomic_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make each mocked AWS request atomic, as it is in AWS.

    moto applies a TransactWriteItems step by step (and restores whole tables from a copy
    when one fails), so threads interleaving inside moto would corrupt its tables.
    Serializing moto's request processing, and nothing else, keeps the API's own
    read-then-transact races real while each DynamoDB call behaves as in AWS.
    """
    lock = threading.Lock()
    original = BotocoreStubber.process_request

    def process_request(self: BotocoreStubber, request: Any) -> Any:
        with lock:
            return original(self, request)

    monkeypatch.setattr(BotocoreStubber, "process_request", process_request)


def test_quota_concurrent_creates_cannot_exceed_max_schedules(
    aws: Services, atomic_requests: None
) -> None:
    # GIVEN a tenant allowed three schedules, and eight clients released at once
    alice = bootstrap("alice", ALICE, max_schedules=3)
    start = threading.Barrier(8)

    def attempt(_: int) -> Answer:
        start.wait(timeout=10)
        return alice.post("/v1/schedules", cron())

    # WHEN all eight create the same schedule concurrently
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(attempt, range(8)))

    # THEN exactly three were created and five refused with 409, and the usage is exact.
    # (Powertools keeps the request being resolved on the process-wide resolver, which a
    # Lambda never shares between requests; with threads a success may lose its 201 and be
    # rendered 200, so a success is "2xx carrying the created schedule".)
    created = [a for a in answers if a.status in (200, 201) and "schedule" in a.body]
    refused = [a for a in answers if a.status == 409]
    assert len(created) == 3, [a.status for a in answers]
    assert len(refused) == 5, [a.status for a in answers]
    for answer in refused:
        error = assert_error(answer, 409, "quota_exceeded")
        assert error["details"] == {"quota": "max_schedules", "limit": 3, "usage": 3}
    ids = {a.body["schedule"]["schedule_id"] for a in created}
    assert len(ids) == 3
    assert set(_listed(alice)) == ids
    assert _count(alice) == 3
    current = [
        i for i in table_items(aws, aws.settings.schedules_table) if i["sk"]["S"] == "CURRENT"
    ]
    assert len(current) == 3


# --- idempotent create ----------------------------------------------------------------


def test_idempotency_same_key_and_body_returns_the_same_schedule(alice: Api, clock: Clock) -> None:
    # GIVEN a create with an Idempotency-Key
    key = {"Idempotency-Key": "create-report-1"}
    first = alice.post("/v1/schedules", cron(name="report"), headers=key)
    assert first.status == 201, first.body

    # WHEN the client retries it unchanged a little later
    clock.advance(30)
    again = alice.post("/v1/schedules", cron(name="report"), headers=key)

    # THEN the same schedule comes back as 201 and only one exists
    assert again.status == 201, again.body
    assert again.body["schedule"]["schedule_id"] == first.body["schedule"]["schedule_id"]
    assert again.body == {**first.body, "replayed": True}
    assert first.body["replayed"] is False
    assert _listed(alice) == [first.body["schedule"]["schedule_id"]]
    assert _count(alice) == 1
    # AND the answers say which one was carried out and which one remembered
    assert first.headers["Idempotent-Replayed"] == "false"
    assert again.headers["Idempotent-Replayed"] == "true"
    unkeyed = alice.post("/v1/schedules", cron(name="other"))
    assert unkeyed.headers["Idempotent-Replayed"] == "false"


def test_idempotency_an_empty_key_is_refused_not_ignored(alice: Api) -> None:
    # WHEN a create comes with an empty Idempotency-Key (a client's unset variable)
    answer = alice.post("/v1/schedules", cron(name="report"), headers={"Idempotency-Key": ""})
    # THEN 400 naming the header, and nothing was created (not a create without a key)
    error = assert_error(answer, 400, "invalid_input")
    assert error["fields"][0]["field"] == "idempotency-key", error  # (headers: any case)
    assert _count(alice) == 0


def test_every_answer_about_a_schedule_carries_its_version_as_etag(alice: Api) -> None:
    # GIVEN a schedule created, read, updated with the ETag read, paused, resumed, canceled
    created = alice.post("/v1/schedules", cron(name="report"))
    schedule_id = created.body["schedule"]["schedule_id"]
    path = f"/v1/schedules/{schedule_id}"
    read = alice.get(path)
    updated = alice.call(
        "PATCH", path, {"name": "renamed"}, headers={"If-Match": read.headers["ETag"]}
    )
    paused = alice.post(f"{path}/pause")
    resumed = alice.post(f"{path}/resume")
    canceled = alice.call("DELETE", path)
    # THEN each answer's ETag is the version its body shows, as If-Match takes it
    for answer in (created, read, updated, paused, resumed, canceled):
        assert answer.status in (200, 201), answer.body
        assert answer.headers["ETag"] == f'"{answer.body["schedule"]["version"]}"'
    assert updated.body["schedule"]["version"] == 2


def test_idempotency_same_key_different_body_is_409(alice: Api) -> None:
    # GIVEN a create with an Idempotency-Key
    key = {"Idempotency-Key": "create-report-1"}
    first = create(alice, cron(name="report"), headers=key)

    # WHEN the same key comes with a different body
    answer = alice.post("/v1/schedules", cron(name="other"), headers=key)

    # THEN 409 and still only the first schedule
    assert_error(answer, 409, "conflict")
    assert _listed(alice) == [first["schedule"]["schedule_id"]]


def test_idempotency_key_is_scoped_to_the_tenant(alice: Api, bob: Api) -> None:
    # GIVEN alice created a schedule with key K
    key = {"Idempotency-Key": "shared-key"}
    alices = create(alice, cron(name="same"), headers=key)

    # WHEN bob uses the same key with the same body, and retries it
    bobs = bob.post("/v1/schedules", cron(name="same"), headers=key)
    bobs_retry = bob.post("/v1/schedules", cron(name="same"), headers=key)

    # THEN bob gets his own, separate schedule, and his retry repeats his, not alice's
    assert bobs.status == 201, bobs.body
    assert bobs.body["schedule"]["schedule_id"] != alices["schedule"]["schedule_id"]
    assert bobs_retry.body["schedule"]["schedule_id"] == bobs.body["schedule"]["schedule_id"]
    assert _listed(bob) == [bobs.body["schedule"]["schedule_id"]]
    assert _listed(alice) == [alices["schedule"]["schedule_id"]]


def test_idempotency_a_refused_create_does_not_use_up_the_key(aws: Services) -> None:
    # GIVEN a tenant at its limit of one schedule
    alice = bootstrap("alice", ALICE, max_schedules=1)
    existing = create(alice, cron())["schedule"]["schedule_id"]
    key = {"Idempotency-Key": "retry-me"}

    # WHEN a keyed create is refused, a slot is freed, and the same request is retried
    refused = alice.post("/v1/schedules", cron(name="new"), headers=key)
    assert delete(alice, existing).status == 200
    retried = alice.post("/v1/schedules", cron(name="new"), headers=key)

    # THEN the refusal was not remembered: the retry creates the schedule
    assert_error(refused, 409, "quota_exceeded")
    assert retried.status == 201, retried.body
    assert retried.body["schedule"]["name"] == "new"
    assert _count(alice) == 1


def test_idempotency_without_key_creates_each_time(alice: Api) -> None:
    # GIVEN no Idempotency-Key
    # WHEN the same body is posted twice
    first = create(alice, cron(name="twice"))
    second = create(alice, cron(name="twice"))

    # THEN two schedules exist
    assert first["schedule"]["schedule_id"] != second["schedule"]["schedule_id"]
    assert _count(alice) == 2


def test_idempotency_key_too_long_is_400(alice: Api) -> None:
    # GIVEN a key longer than 128 characters
    # WHEN it is used
    answer = alice.post("/v1/schedules", cron(), headers={"Idempotency-Key": "k" * 129})

    # THEN 400 naming the header, nothing created
    field = assert_error(answer, 400, "invalid_input")["fields"][0]["field"]
    assert field.lower() == "idempotency-key"
    assert _count(alice) == 0


class LambdaTimeout(BaseException):
    """What a Lambda timeout amounts to: the process stops, no handler code runs after it."""


def test_idempotency_a_timed_out_create_releases_its_key_when_the_invocation_ends(
    alice: Api, aws: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a keyed create whose invocation is killed mid-way (30 s were left, see conftest)
    key = {"Idempotency-Key": "killed"}

    def killed(*_: Any, **__: Any) -> Any:
        raise LambdaTimeout

    with monkeypatch.context() as patched:
        patched.setattr(ControlPlane, "create", killed)
        with pytest.raises(LambdaTimeout):
            alice.post("/v1/schedules", cron(), headers=key)

    # WHEN the client retries at once
    retry = alice.post("/v1/schedules", cron(), headers=key)

    # THEN it is told the first is still in progress (true), and the in-progress claim
    # ends with the killed invocation (its 30 s) instead of holding the key for a day
    assert_error(retry, 409, "conflict")
    [record] = table_items(aws, aws.settings.idempotency_table)
    assert record["status"]["S"] == "INPROGRESS"
    assert "in_progress_expiration" in record, record
    claim_ends = int(record["in_progress_expiration"]["N"]) / 1000
    assert claim_ends <= time.time() + 30


def test_a_change_that_moves_no_usage_leaves_the_tenant_item_out_of_its_write(
    aws: Services,
) -> None:
    # GIVEN a schedule, and a control plane counting what it writes
    alice = bootstrap("alice", ALICE)
    schedule_id = create(alice, cron(HOURLY))["schedule"]["schedule_id"]
    counting = CountedWrites(aws.dynamodb)
    plane = ControlPlane(dataclasses.replace(aws, dynamodb=counting))
    # WHEN only its name changes
    plane.update("alice", schedule_id, if_match=1, changes={"name": "renamed"})
    # THEN its transaction does not touch the tenant's item: no write unit spent on it, and
    # no conflict with the tenant's other changes at the same moment
    tenants = aws.settings.tenants_table.rsplit("-", 1)[-1]
    assert counting.transactions == 1
    assert not [kind for kind in counting.units if kind.endswith(f" {tenants}")]
    assert counting.units["Put schedules"] + counting.units["Update schedules"] > 0
