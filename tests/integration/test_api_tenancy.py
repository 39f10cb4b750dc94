"""Who the caller is: principal -> tenant, isolation between tenants, operator endpoints."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from botocore.exceptions import ClientError

from punctual.control.plane import ControlPlane
from punctual.dal.common import to_dynamo
from punctual.dal.tenants import SCAN_PAGES, TenantStore, tenant_to_item
from punctual.domain.errors import Conflict, NotFound
from punctual.domain.schedule import ScheduleDefinition
from punctual.domain.tenancy import Quotas, Tenant
from punctual.services import Services
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.integration.conftest import ALICE, BOB, OPERATOR, Api, Clock, bootstrap
from tests.integration.helpers import all_pages, assert_error, create, cron, delete, patch

ACCOUNT = "111122223333"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/Role"
WORKERS = f"arn:aws:iam::{ACCOUNT}:role/alice-workers"
SESSION = f"arn:aws:sts::{ACCOUNT}:assumed-role/Role/session-x"
MISSING_SCHEDULE = "sch_aaaaaaaaaaaaaaaaaaaaaaaa"
MISSING_OCCURRENCE = "occ_aaaaaaaaaaaaaaaaaaaaaaaaaa"


def _redacted(body: Any, *ids: str) -> str:
    """The body with the ids it names blanked, to compare 'not found' answers."""
    text = json.dumps(body, sort_keys=True)
    for value in ids:
        text = text.replace(value, "<id>")
    return text


# --- who is calling -------------------------------------------------------------------


def test_caller_unknown_principal_is_403(alice: Api, subtests: pytest.Subtests) -> None:
    # GIVEN signed principals bound to no tenant: a stranger, and the operator itself
    for caller in (f"arn:aws:iam::{ACCOUNT}:user/mallory", OPERATOR):
        stranger = Api(caller)

        # WHEN it uses tenant endpoints
        answers = {
            "list": stranger.get("/v1/schedules"),
            "create": stranger.post("/v1/schedules", cron()),
            "tenant": stranger.get("/v1/tenant"),
            "target": stranger.post("/v1/targets", {"name": "default"}),
        }

        # THEN each is a 403
        for name, answer in answers.items():
            with subtests.test(caller=caller, endpoint=name):
                assert_error(answer, 403, "forbidden")
    # AND nothing was written for anyone
    assert alice.get("/v1/tenant").body["schedule_count"] == 0


def test_caller_without_user_arn_is_403(alice: Api) -> None:
    # GIVEN a request that API Gateway did not attribute to an IAM principal
    anonymous = Api(None)

    # WHEN it lists, creates, previews or reads the tenant
    answers = [
        anonymous.get("/v1/schedules"),
        anonymous.post("/v1/schedules", cron()),
        anonymous.post("/v1/preview", {"spec": cron()["spec"]}),
        anonymous.get("/v1/tenant"),
    ]

    # THEN each is a 403 and nothing was written for anyone
    for answer in answers:
        assert_error(answer, 403, "forbidden")
    assert alice.get("/v1/tenant").body["schedule_count"] == 0


def test_caller_assumed_role_session_maps_to_its_bound_role(aws: Services) -> None:
    # GIVEN a tenant bound to the IAM role (not to any one session of it)
    bootstrap("carol", ROLE)

    # WHEN two different sessions of that role call the API
    first = Api(SESSION)
    second = Api(f"arn:aws:sts::{ACCOUNT}:assumed-role/Role/session-y")
    created = first.post("/v1/schedules", cron())

    # THEN both act as the role's tenant and see the same schedules
    assert created.status == 201, created.body
    assert first.get("/v1/tenant").body["tenant_id"] == "carol"
    assert second.get("/v1/tenant").body["tenant_id"] == "carol"
    listed = second.get("/v1/schedules").body["schedules"]
    assert [s["schedule_id"] for s in listed] == [created.body["schedule"]["schedule_id"]]
    # AND a session of another role with the same prefix, or in another account, is not
    for other in (
        f"arn:aws:sts::{ACCOUNT}:assumed-role/RoleTwo/session-x",
        "arn:aws:sts::444455556666:assumed-role/Role/session-x",
    ):
        assert_error(Api(other).get("/v1/tenant"), 403, "forbidden")


def test_bind_principal_with_a_session_arn_binds_its_role(aws: Services) -> None:
    # GIVEN a tenant whose operator binds a session ARN
    operator = Api(OPERATOR)
    assert operator.post("/v1/admin/tenants", {"tenant_id": "carol"}).status == 201
    bound = operator.post("/v1/admin/tenants/carol/principals", {"principal_arn": SESSION})
    assert bound.status == 200, bound.body

    # WHEN that same session calls
    answer = Api(SESSION).get("/v1/tenant")

    # THEN it is the tenant it was bound to
    assert answer.status == 200, answer.body
    assert answer.body["tenant_id"] == "carol"


# --- one tenant cannot see another's --------------------------------------------------


@pytest.fixture
def alices_schedule(alice: Api) -> dict[str, Any]:
    saved = create(alice, cron("* * * * *", name="alice-only"))
    assert saved["materialized"], "a near fire is needed to have an occurrence"
    return saved


def _actions(api: Api, schedule_id: str) -> dict[str, Any]:
    return {
        "get": api.get(f"/v1/schedules/{schedule_id}"),
        "patch": patch(api, schedule_id, {"name": "taken"}, 1),
        "pause": api.post(f"/v1/schedules/{schedule_id}/pause"),
        "resume": api.post(f"/v1/schedules/{schedule_id}/resume"),
        "delete": delete(api, schedule_id),
        "occurrences": api.get(f"/v1/schedules/{schedule_id}/occurrences"),
    }


def test_isolation_other_tenants_schedule_answers_like_a_missing_one(
    alice: Api, bob: Api, alices_schedule: dict[str, Any]
) -> None:
    # GIVEN alice's schedule
    schedule_id = alices_schedule["schedule"]["schedule_id"]

    # WHEN bob reads, patches, pauses, resumes, deletes it or lists its occurrences,
    # and does the same with an id that exists nowhere
    on_alices = _actions(bob, schedule_id)
    on_missing = _actions(bob, MISSING_SCHEDULE)

    # THEN every answer is a 404 identical to the missing id's (no existence leak)
    for action, answer in on_alices.items():
        assert_error(answer, 404, "not_found")
        assert _redacted(answer.body, schedule_id) == _redacted(
            on_missing[action].body, MISSING_SCHEDULE
        ), action
        assert answer.headers == on_missing[action].headers, action
    # AND alice's schedule is untouched
    current = alice.get(f"/v1/schedules/{schedule_id}").body["schedule"]
    assert (current["version"], current["state"], current["name"]) == (1, "ACTIVE", "alice-only")


def test_isolation_other_tenants_occurrence_answers_like_a_missing_one(
    alice: Api, bob: Api, alices_schedule: dict[str, Any]
) -> None:
    # GIVEN an occurrence of alice's schedule
    occurrence_id = alices_schedule["materialized"][0]["occurrence_id"]
    assert alice.get(f"/v1/occurrences/{occurrence_id}").status == 200

    # WHEN bob reads it, and an id that exists nowhere
    answer = bob.get(f"/v1/occurrences/{occurrence_id}")
    missing = bob.get(f"/v1/occurrences/{MISSING_OCCURRENCE}")

    # THEN both are the same 404
    assert_error(answer, 404, "not_found")
    assert _redacted(answer.body, occurrence_id) == _redacted(missing.body, MISSING_OCCURRENCE)


def test_isolation_list_shows_only_own_schedules(
    alice: Api, bob: Api, alices_schedule: dict[str, Any]
) -> None:
    # GIVEN alice's schedule and one of bob's
    bobs = create(bob, cron())["schedule"]["schedule_id"]

    # WHEN each lists schedules (also filtered by state)
    alice_ids = [s["schedule_id"] for s in alice.get("/v1/schedules").body["schedules"]]
    bob_ids = [s["schedule_id"] for s in bob.get("/v1/schedules").body["schedules"]]
    bob_active = bob.get("/v1/schedules", state="ACTIVE").body["schedules"]

    # THEN each sees only its own
    assert alice_ids == [alices_schedule["schedule"]["schedule_id"]]
    assert bob_ids == [bobs]
    assert [s["schedule_id"] for s in bob_active] == [bobs]
    assert bob.get("/v1/tenant").body["schedule_count"] == 1


def test_isolation_other_tenants_next_token_is_400(alice: Api, bob: Api) -> None:
    # GIVEN a next_token issued to alice
    for i in range(3):
        create(alice, cron(name=f"a{i}"))
    create(bob, cron(name="b0"))
    token = alice.get("/v1/schedules", limit=1).body["next_token"]
    assert token is not None

    # WHEN bob presents it
    answer = bob.get("/v1/schedules", limit=1, next_token=token)

    # THEN 400, and none of alice's schedules leak
    error = assert_error(answer, 400, "invalid_input")
    assert error["fields"][0]["field"] == "next_token"
    assert "a0" not in json.dumps(answer.body)


def test_isolation_targets_are_per_tenant(alice: Api, bob: Api) -> None:
    # GIVEN alice creates a target bob does not have
    assert alice.post("/v1/targets", {"name": "alice-jobs"}).status == 201

    # WHEN bob lists targets and tries to schedule onto alice's
    bob_targets = [t["name"] for t in bob.get("/v1/targets").body["targets"]]
    answer = bob.post("/v1/schedules", cron(target="alice-jobs"))

    # THEN he sees only his own, and the name is unknown to him
    assert bob_targets == ["default"]
    assert assert_error(answer, 400, "invalid_input")["fields"][0]["field"] == "target"
    bob_queue = bob.get("/v1/targets").body["targets"][0]["queue_url"]
    alice_queue = alice.get("/v1/targets").body["targets"][0]["queue_url"]
    assert bob_queue != alice_queue


# --- operator endpoints ---------------------------------------------------------------


def _operator_calls(api: Api) -> dict[str, Any]:
    return {
        "create-tenant": api.post("/v1/admin/tenants", {"tenant_id": "eve"}),
        "set-quotas": api.call(
            "PUT", "/v1/admin/tenants/alice/quotas", {"max_schedules": 50_000_000}
        ),
        "bind": api.post(
            "/v1/admin/tenants/alice/principals",
            {"principal_arn": f"arn:aws:iam::{ACCOUNT}:user/eve"},
        ),
        "get-tenant": api.get("/v1/admin/tenants/alice"),
        "list-tenants": api.get("/v1/admin/tenants", limit=1),
    }


def test_operator_endpoints_reject_non_operators(
    alice: Api, bob: Api, subtests: pytest.Subtests
) -> None:
    # GIVEN tenants, and callers that are not operators
    for caller in (ALICE, BOB, f"arn:aws:iam::{ACCOUNT}:user/mallory", None):
        # WHEN each calls every operator endpoint
        answers = _operator_calls(Api(caller))

        # THEN each call is a 403
        for name, answer in answers.items():
            with subtests.test(caller=caller, endpoint=name):
                assert_error(answer, 403, "forbidden")
    # AND nothing changed
    operator = Api(OPERATOR)
    assert operator.get("/v1/admin/tenants/eve").status == 404
    assert alice.get("/v1/tenant").body["quotas"]["max_schedules"] == 10_000
    assert_error(Api(f"arn:aws:iam::{ACCOUNT}:user/eve").get("/v1/tenant"), 403, "forbidden")


def test_operator_endpoints_answer_a_tenant_403_before_reading_its_input(alice: Api) -> None:
    # WHEN a tenant calls operator endpoints with bodies and parameters they would refuse
    answers = {
        "create-tenant": alice.post("/v1/admin/tenants", {"tenant_id": "", "quotas": 7}),
        "set-quotas": alice.call("PUT", "/v1/admin/tenants/alice/quotas", {"max_schedules": "x"}),
        "bind": alice.post("/v1/admin/tenants/alice/principals", {"principal_arn": 1}),
        "not-json": alice.post("/v1/admin/tenants", "[1, 2"),
        "bad-window": alice.get("/v1/admin/reconcile", **{"from": "yesterday"}),
    }
    # THEN each is a 403 that names no field (a 400 would describe what only operators use)
    for name, answer in answers.items():
        error = assert_error(answer, 403, "forbidden")
        assert "fields" not in error or not error["fields"], (name, error)


def test_operator_endpoints_work_for_the_operator(alice: Api) -> None:
    # GIVEN the operator
    operator = Api(OPERATOR)

    # WHEN it creates a tenant, sets alice's quotas, binds a principal and reads a tenant
    answers = _operator_calls(operator)

    # THEN each succeeds and the tenants see the effect
    assert answers["create-tenant"].status == 201
    assert answers["create-tenant"].body["tenant_id"] == "eve"
    assert answers["set-quotas"].status == 200
    assert answers["set-quotas"].body["quotas"]["max_schedules"] == 50_000_000
    assert answers["bind"].status == 200
    assert answers["get-tenant"].status == 200
    assert answers["get-tenant"].body["tenant_id"] == "alice"
    assert answers["list-tenants"].status == 200
    assert len(answers["list-tenants"].body["tenants"]) == 1
    assert alice.get("/v1/tenant").body["quotas"]["max_schedules"] == 50_000_000
    # eve's principal was bound to alice by the 'bind' call
    assert Api(f"arn:aws:iam::{ACCOUNT}:user/eve").get("/v1/tenant").body["tenant_id"] == "alice"


def test_operator_lists_every_tenant_once_page_by_page_and_nothing_else(
    alice: Api, bob: Api, aws: Services
) -> None:
    # GIVEN tenants among the table's other items: targets, principals, a worker's slot
    operator = Api(OPERATOR)
    for tenant in ("carol", "dave", "eve"):
        assert operator.post("/v1/admin/tenants", {"tenant_id": tenant}).status == 201
    aws.dynamodb.put_item(
        TableName=aws.settings.tenants_table,
        Item={"pk": {"S": "R#alice"}, "sk": {"S": "RUN#00001"}, "lease_token": {"S": "x"}},
    )
    # ... and what alice's workers may write under their slots' partition: an item with a
    # tenant record's sort key and nothing a tenant record has
    aws.dynamodb.put_item(
        TableName=aws.settings.tenants_table,
        Item={"pk": {"S": "R#alice"}, "sk": {"S": "TENANT"}, "quotas": {"S": "junk"}},
    )
    # WHEN the operator lists them two at a time
    pages = all_pages(operator, "/v1/admin/tenants", "tenants", limit=2)
    # THEN each tenant comes once, with its usage, on pages of at most two, and nothing else
    listed = [t["tenant_id"] for page in pages for t in page]
    assert sorted(listed) == ["alice", "bob", "carol", "dave", "eve"]
    assert all(len(page) <= 2 for page in pages)
    assert {t["tenant_id"]: t["schedule_count"] for page in pages for t in page}["alice"] == 0
    # AND a token it did not issue is a 400 naming it
    refused = assert_error(
        operator.get("/v1/admin/tenants", next_token="eyJwayI6MX0"), 400, "invalid_input"
    )
    assert refused["fields"][0]["field"] == "next_token"


def test_a_tenant_listing_reads_past_pages_its_filter_emptied_within_a_bound() -> None:
    # GIVEN a table whose Scan answers pages holding no tenant, then one (DynamoDB does this
    # where other items fill a page; the emulators seldom)
    tenant = tenant_to_item(
        Tenant(tenant_id="zed", quotas=Quotas(), created_at=datetime(2026, 11, 18, tzinfo=UTC))
    )
    empty = {"Items": [], "LastEvaluatedKey": {"pk": {"S": "R#a"}, "sk": {"S": "RUN#1"}}}

    class Scans:
        def __init__(self, pages: list[dict[str, Any]]) -> None:
            self.pages, self.asked = pages, 0

        def scan(self, **request: Any) -> dict[str, Any]:
            self.asked += 1
            return self.pages.pop(0)

    few = Scans([empty, empty, {"Items": [to_dynamo(tenant)]}])
    # WHEN the tenants are listed; THEN the empty pages are read past to the tenant
    found, token = TenantStore(few, "t").list_tenants(limit=10, token=None)
    assert ([t.tenant_id for t in found], token, few.asked) == (["zed"], None, 3)
    # AND pages that stay empty end the call after SCAN_PAGES reads, with a token to go on
    many = Scans([dict(empty) for _ in range(SCAN_PAGES + 5)])
    found, token = TenantStore(many, "t").list_tenants(limit=10, token=None)
    assert (found, many.asked) == ([], SCAN_PAGES)
    assert token is not None


def test_operator_binding_one_principal_to_two_tenants_is_409(alice: Api, bob: Api) -> None:
    # GIVEN alice's principal, bound to tenant alice
    operator = Api(OPERATOR)

    # WHEN the operator binds it to bob as well, and again to alice
    twice = operator.post("/v1/admin/tenants/bob/principals", {"principal_arn": ALICE})
    again = operator.post("/v1/admin/tenants/alice/principals", {"principal_arn": ALICE})

    # THEN the second tenant is refused, re-binding the same one is a no-op
    assert_error(twice, 409, "conflict")
    assert again.status == 200
    assert alice.get("/v1/tenant").body["tenant_id"] == "alice"


def test_operator_creating_an_existing_tenant_is_409(alice: Api) -> None:
    # GIVEN tenant alice with a schedule counted
    create(alice, cron())

    # WHEN the operator creates 'alice' again
    answer = Api(OPERATOR).post("/v1/admin/tenants", {"tenant_id": "alice"})

    # THEN 409, and alice's usage is not reset
    assert_error(answer, 409, "conflict")
    assert alice.get("/v1/tenant").body["schedule_count"] == 1


def test_operator_create_tenant_rejects_bad_input(aws: Services, subtests: pytest.Subtests) -> None:
    # GIVEN the operator
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tenant_id": "A"}, "tenant_id"),
        ({"tenant_id": "-lead"}, "tenant_id"),
        ({"tenant_id": "ok-id", "x": 1}, "x"),
        ({"tenant_id": "ok-id", "quotas": {"max_schedules": -1}}, "quotas.max_schedules"),
    ]
    for body, field in cases:
        with subtests.test(field=field, body=body):
            # WHEN it creates a tenant with a bad id, quota or an unknown field
            answer = Api(OPERATOR).post("/v1/admin/tenants", body)

            # THEN 400 naming the field, and no tenant was made
            assert assert_error(answer, 400, "invalid_input")["fields"][0]["field"] == field
    assert Api(OPERATOR).get("/v1/admin/tenants/ok-id").status == 404


def test_operator_bind_principal_to_unknown_tenant_is_404(aws: Services) -> None:
    # GIVEN no tenant 'ghost'
    # WHEN the operator binds a principal to it
    answer = Api(OPERATOR).post("/v1/admin/tenants/ghost/principals", {"principal_arn": ALICE})

    # THEN 404, and the principal stays unbound
    assert_error(answer, 404, "not_found")
    assert_error(Api(ALICE).get("/v1/tenant"), 403, "forbidden")


def test_operator_set_quotas_of_unknown_tenant_is_404(aws: Services) -> None:
    # GIVEN no tenant 'ghost'
    # WHEN the operator sets its quotas
    answer = Api(OPERATOR).call("PUT", "/v1/admin/tenants/ghost/quotas", {"max_schedules": 5})

    # THEN 404 like reading it, and no tenant record appears
    assert_error(answer, 404, "not_found")
    assert Api(OPERATOR).get("/v1/admin/tenants/ghost").status == 404


def test_quotas_set_on_a_tenant_that_vanished_meanwhile_create_nothing(aws: Services) -> None:
    # GIVEN no tenant 'ghost' (the API reads the tenant first; this is the race where it
    # disappears between that read and the write)
    # WHEN its quotas are written
    with pytest.raises(NotFound) as missing:
        aws.tenants.set_quotas("ghost", Quotas())
    # THEN the write is refused, naming the tenant, and no partial tenant record appears
    assert str(missing.value) == "tenant ghost not found"
    with pytest.raises(NotFound):
        aws.tenants.get("ghost")


def _policy_principals(aws: Services, queue_url: str) -> list[str]:
    """The principals a queue policy lets in (each also under any path), checked to be
    matched by aws:PrincipalArn under their accounts' roots."""
    attributes = aws.sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["Policy"])
    policy = json.loads(attributes["Attributes"]["Policy"])
    [statement] = policy["Statement"]
    assert "sqs:ReceiveMessage" in statement["Action"]
    patterns = statement["Condition"]["ArnLike"]["aws:PrincipalArn"]
    exact = sorted(p for p in patterns if "/*/" not in p)
    any_path = [f"{p.rsplit('/', 1)[0]}/*/{p.rsplit('/', 1)[1]}" for p in exact]
    assert sorted(patterns) == sorted(exact + any_path)
    assert statement["Principal"]["AWS"] == sorted(
        {f"arn:aws:iam::{p.split(':')[4]}:root" for p in exact}
    )
    return exact


def test_target_queues_grant_the_tenants_principals_only(alice: Api, bob: Api, aws: Services):
    # GIVEN alice's target created after her principal was bound
    target = alice.get("/v1/targets").body["targets"][0]
    # THEN her queue and its DLQ let exactly her principals consume them
    assert _policy_principals(aws, target["queue_url"]) == [ALICE]
    assert _policy_principals(aws, target["dlq_url"]) == [ALICE]
    # WHEN the operator binds a worker role to alice later
    worker_role = "arn:aws:iam::111122223333:role/alice-workers"
    bound = Api(OPERATOR).post("/v1/admin/tenants/alice/principals", {"principal_arn": worker_role})
    assert bound.status == 200
    # THEN her existing queue's policy includes it, and bob's queue does not
    assert _policy_principals(aws, target["queue_url"]) == sorted([ALICE, worker_role])
    bobs = bob.get("/v1/targets").body["targets"][0]
    assert _policy_principals(aws, bobs["queue_url"]) == [BOB]


def _lagging(aws: Services, clock: Clock) -> tuple[ControlPlane, Faults]:
    """A control plane whose eventually consistent reads lag a minute behind."""
    faults = Faults(FaultPlan(stale=1.0, stale_seconds=60), clock)
    return ControlPlane(
        dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    ), faults


def _before_jobs_is_stored(faults: Faults, action: Callable[[], Any]) -> list[Any]:
    """Run ``action`` once, just before the target "jobs" is stored; what it returned."""
    done: list[Any] = []

    def hook(_: str, request: dict[str, Any]) -> None:
        if request["Item"]["sk"]["S"] == "TARGET#jobs":
            del faults.before["put_item"]  # (once: the action may store one itself)
            done.append(action())

    faults.before["put_item"] = hook
    return done


def test_a_schedule_on_a_target_made_a_second_ago_is_accepted_on_a_lagging_replica(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a control plane on a lagging replica, and alice's target made a second ago
    plane, _ = _lagging(aws, clock)
    plane.create_target("alice", "jobs")
    clock.advance(1)
    # WHEN she creates a schedule on it
    definition = ScheduleDefinition.model_validate(
        {"target": "jobs", "spec": {"kind": "rate", "expression": "rate(5 minutes)"}}
    )
    saved = plane.create("alice", definition)
    # THEN it is accepted on that target (its check of the target was not served from before
    # the target existed: no 400 for an unknown target)
    assert saved.schedule.target == "jobs"


def test_a_principal_bound_just_after_a_target_is_made_is_granted_on_it(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a control plane on a lagging replica, and alice's target made a second ago
    plane, _ = _lagging(aws, clock)
    jobs = plane.create_target("alice", "jobs")
    clock.advance(1)
    # WHEN the operator binds her worker role
    plane.bind_principal(WORKERS, "alice")
    # THEN the new target's queues let it in, as the older one's do: neither the listing of
    # her targets nor the read of her principals was served from before the change
    for target in (jobs, aws.tenants.get_target("alice", "default")):
        assert target is not None
        assert _policy_principals(aws, target.queue_url) == sorted([ALICE, WORKERS])
        assert _policy_principals(aws, target.dlq_url) == sorted([ALICE, WORKERS])


def test_a_principal_bound_while_a_target_is_being_made_is_granted_on_it(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN alice's target being made: its queues granted to the principals read, and the
    # operator binding her worker role before the target is stored (so the bind's listing
    # of her targets does not hold it)
    plane, faults = _lagging(aws, clock)
    bound = _before_jobs_is_stored(faults, lambda: plane.bind_principal(WORKERS, "alice"))
    # WHEN the target is made
    jobs = plane.create_target("alice", "jobs")
    # THEN its queues let the worker role in all the same
    assert bound
    assert _policy_principals(aws, jobs.queue_url) == sorted([ALICE, WORKERS])
    assert _policy_principals(aws, jobs.dlq_url) == sorted([ALICE, WORKERS])


def test_two_creates_of_one_target_racing_leave_the_first_and_answer_the_second_409(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN two creates of the target "jobs", the second checking for it before the first
    # stored it
    plane, faults = _lagging(aws, clock)
    first = _before_jobs_is_stored(faults, lambda: plane.create_target("alice", "jobs"))
    # WHEN both store it
    with pytest.raises(Conflict) as refused:
        plane.create_target("alice", "jobs")
    # THEN the later one is refused, naming the target, and the first one's stands
    assert str(refused.value) == "target jobs already exists"
    assert aws.tenants.get_target("alice", "jobs", consistent=True) == first[0]


def test_two_principals_bound_at_once_are_both_granted(alice: Api, aws: Services):
    # GIVEN two binds to alice at once: the second one stores its principal and grants
    # both just after the first one read her principals (its own only) and before it
    # replaced her queues' policies with them
    others = ControlPlane(aws)

    class BindSecondMeanwhile:
        def __init__(self, sqs: Any) -> None:
            self._sqs, self.done = sqs, False

        def __getattr__(self, name: str) -> Any:
            return getattr(self._sqs, name)

        def set_queue_attributes(self, **request: Any) -> Any:
            if not self.done:
                self.done = True
                others.bind_principal(WORKERS, "alice")
            return self._sqs.set_queue_attributes(**request)

    interleaved = BindSecondMeanwhile(aws.sqs)
    plane = ControlPlane(dataclasses.replace(aws, sqs=interleaved))
    # WHEN the first bind finishes
    plane.bind_principal(ROLE, "alice")
    # THEN her queues let all three principals in: the first bind read again after its grant
    # and granted what it had not seen
    assert interleaved.done
    target = aws.tenants.get_target("alice", "default")
    assert target is not None
    for url in (target.queue_url, target.dlq_url):
        assert _policy_principals(aws, url) == sorted([ALICE, ROLE, WORKERS])


class _NewQueuesSettle:
    """SQS as it is in a new queue's first second: each call on a queue created a moment
    ago says it does not exist, ``misses`` times per queue and operation."""

    def __init__(self, sqs: Any, misses: int) -> None:
        self._sqs = sqs
        self._misses = misses
        self._new: set[str] = set()
        self.refused: dict[tuple[str, str], int] = {}

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._sqs, name)

        def settling(**request: Any) -> Any:
            url = request.get("QueueUrl")
            key = (str(url), name)
            if url in self._new and self.refused.get(key, 0) < self._misses:
                self.refused[key] = self.refused.get(key, 0) + 1
                raise ClientError(
                    {"Error": {"Code": "AWS.SimpleQueueService.NonExistentQueue"}}, name
                )
            answer = call(**request)
            if name == "create_queue":
                self._new.add(answer["QueueUrl"])
            return answer

        return settling


def test_a_target_is_made_though_its_new_queues_are_not_usable_for_their_first_second(
    alice: Api, aws: Services
):
    # GIVEN SQS answering "does not exist" twice per operation on each queue just created
    slept: list[float] = []
    settling = _NewQueuesSettle(aws.sqs, misses=2)
    plane = ControlPlane(dataclasses.replace(aws, sqs=settling, sleep=slept.append))
    # WHEN alice's second target is made
    made = plane.create_target("alice", "jobs")
    # THEN it is made, its queues tagged and granted to her principal, after short waits
    assert made.name == "jobs"
    assert _policy_principals(aws, made.queue_url) == [ALICE]
    assert _policy_principals(aws, made.dlq_url) == [ALICE]
    assert settling.refused
    assert set(settling.refused.values()) == {2}
    assert slept
    assert max(slept) <= 2.0
    # AND a queue that never becomes usable fails the request after about 6 s of waits
    slept.clear()
    never = ControlPlane(
        dataclasses.replace(aws, sqs=_NewQueuesSettle(aws.sqs, misses=99), sleep=slept.append)
    )
    with pytest.raises(ClientError):
        never.create_target("alice", "other")
    assert sum(slept) == pytest.approx(5.75)
