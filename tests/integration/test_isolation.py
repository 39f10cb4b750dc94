"""Tenant isolation tried as a hostile tenant would: chosen names, crafted ids, forged
items, principals in every spelling, and the IAM policy its workers get.

The standard (docs/security.md): a tenant holding only its own credentials can neither
read, change, receive nor starve another tenant's schedules, occurrences, messages or
queues, whatever names it picks and however it calls.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
from datetime import datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from punctual.control.access import worker_policy
from punctual.control.plane import ControlPlane
from punctual.dal.common import from_dynamo, to_dynamo
from punctual.dal.tables import ALL_TABLES, occurrence_key
from punctual.domain.ids import schedule_key_prefix, tenant_of_schedule
from punctual.domain.principals import PrincipalError, normalize_principal
from punctual.domain.schedule import TARGET_NAME_PATTERN, ScheduleDefinition
from punctual.domain.tenancy import TENANT_ID_PATTERN
from punctual.integrations.queues import DLQ_RETENTION_SECONDS, OWNER_TAG, queue_name, queue_owner
from punctual.pipeline.relay import Relay
from punctual.services import Services
from punctual.settings import Settings
from tests.aws_calls import read_inventory
from tests.hostile import allows
from tests.integration.conftest import OPERATOR, Api, Clock, bootstrap
from tests.integration.helpers import assert_error, create, cron
from tests.integration.test_relay import messages, record

ACCOUNT = "111122223333"
tenant_ids = st.from_regex(TENANT_ID_PATTERN, fullmatch=True)
target_names = st.from_regex(TARGET_NAME_PATTERN, fullmatch=True)


# --- queue names ---------------------------------------------------------------------------


@given(st.lists(st.tuples(tenant_ids, target_names, st.booleans()), min_size=2, max_size=30))
def test_queue_names_never_collide_over_any_tenants_and_targets(triples):
    # GIVEN any tenants, any target names they pick, main queues and DLQs
    unique = set(triples)
    # WHEN each gets its queue name
    names = {queue_name("punctual", tenant, target, dlq=dlq) for tenant, target, dlq in unique}
    # THEN no two share a name
    assert len(names) == len(unique)


@given(tenant_ids, target_names, st.booleans())
def test_queue_names_read_back_to_their_tenant_target_and_role(tenant, target, dlq):
    # GIVEN any queue name Punctual makes; THEN the drain widget reads back whose it is
    assert queue_owner("punctual", queue_name("punctual", tenant, target, dlq=dlq)) == (
        tenant,
        target,
        dlq,
    )


def test_queue_names_punctual_cannot_have_made_have_no_owner():
    for name in ("punctual-relay-failures", "other-acme_x", "punctual-acme", "punctual-Acme_x"):
        assert queue_owner("punctual", name) is None, name


def test_queue_names_of_the_issues_collisions_are_distinct():
    # GIVEN the pairs that used to share a queue: acme/eu-jobs and acme-eu/jobs, and a target
    # named like another target's DLQ
    assert queue_name("p", "acme", "eu-jobs") != queue_name("p", "acme-eu", "jobs")
    names = {
        queue_name("p", "acme", "x"),
        queue_name("p", "acme", "x", dlq=True),
        queue_name("p", "acme", "x-dlq"),
        queue_name("p", "acme", "x_dlq"),
        queue_name("p", "acme", "x-dlq", dlq=True),
    }
    assert len(names) == 5


def test_two_tenants_whose_names_concatenate_alike_get_their_own_queues(aws: Services):
    # GIVEN tenant acme with target eu-jobs and tenant acme-eu with target jobs
    acme = bootstrap("acme", f"arn:aws:iam::{ACCOUNT}:user/acme")
    acme_eu = bootstrap("acme-eu", f"arn:aws:iam::{ACCOUNT}:user/acme-eu")
    one = acme.post("/v1/targets", {"name": "eu-jobs"})
    two = acme_eu.post("/v1/targets", {"name": "jobs"})
    # THEN each got its own queue, tagged with its owner, granted to its principal only
    assert (one.status, two.status) == (201, 201)
    assert one.body["queue_url"] != two.body["queue_url"]
    for answer, owner in ((one, "acme"), (two, "acme-eu")):
        tags = aws.sqs.list_queue_tags(QueueUrl=answer.body["queue_url"])["Tags"]
        assert tags[OWNER_TAG] == owner
        policy = json.loads(
            aws.sqs.get_queue_attributes(
                QueueUrl=answer.body["queue_url"], AttributeNames=["Policy"]
            )["Attributes"]["Policy"]
        )
        allowed = policy["Statement"][0]["Condition"]["ArnLike"]["aws:PrincipalArn"]
        assert all(arn.endswith(f"/{owner}") for arn in allowed)


def test_a_target_named_like_another_targets_dlq_is_a_target_of_its_own(alice: Api):
    # GIVEN a tenant with target x
    assert alice.post("/v1/targets", {"name": "x"}).status == 201
    # WHEN it creates targets named like x's DLQ
    made = [alice.post("/v1/targets", {"name": name}) for name in ("x-dlq", "x_dlq")]
    # THEN each is created, with queues of its own
    assert [answer.status for answer in made] == [201, 201]
    urls = [t["queue_url"] for t in alice.get("/v1/targets").body["targets"]]
    urls += [t["dlq_url"] for t in alice.get("/v1/targets").body["targets"]]
    assert len(urls) == len(set(urls))


@pytest.mark.parametrize("same_settings", [True, False])
def test_a_queue_another_owner_holds_is_refused_before_any_grant(
    alice: Api, aws: Services, same_settings: bool
):
    # GIVEN a queue with the name alice's next target's DLQ would get, owned by someone else,
    # made with the settings Punctual gives a DLQ (CreateQueue then returns it) or others
    name = queue_name(aws.settings.queue_prefix, "alice", "reports", dlq=True)
    attributes = {
        "MessageRetentionPeriod": str(DLQ_RETENTION_SECONDS),
        "SqsManagedSseEnabled": "true",
    }
    url = aws.sqs.create_queue(
        QueueName=name, Attributes=attributes if same_settings else {}, tags={OWNER_TAG: "mallory"}
    )["QueueUrl"]
    # WHEN alice creates the target
    answer = alice.post("/v1/targets", {"name": "reports"})
    # THEN it is refused and the queue's policy was never set
    assert_error(answer, 409, "conflict")
    attributes = aws.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
    assert "Policy" not in attributes["Attributes"]


# --- principals --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bound", "caller"),
    [
        # IAM Identity Center: the role lives under a path its sessions' ARN do not show
        (
            f"arn:aws:iam::{ACCOUNT}:role/aws-reserved/sso.amazonaws.com/AWSReservedSSO_Dev_1a2b",
            f"arn:aws:sts::{ACCOUNT}:assumed-role/AWSReservedSSO_Dev_1a2b/jane@example.com",
        ),
        (f"arn:aws:iam::{ACCOUNT}:role/teams/ops/Worker", f"arn:aws:iam::{ACCOUNT}:role/Worker"),
        (
            f"arn:aws:sts::{ACCOUNT}:assumed-role/Worker/bound-as-a-session",
            f"arn:aws:sts::{ACCOUNT}:assumed-role/Worker/another-session",
        ),
        (f"arn:aws:iam::{ACCOUNT}:user/division/bob", f"arn:aws:iam::{ACCOUNT}:user/bob"),
    ],
)
def test_a_principal_bound_in_one_spelling_matches_its_callers_in_any(
    aws: Services, bound: str, caller: str
):
    # GIVEN a tenant bound to a principal given with a path or as a role session
    bootstrap("acme", bound)
    # WHEN a caller presents it in another spelling (a session, no path)
    answer = Api(caller).get("/v1/tenant")
    # THEN it is that tenant
    assert answer.status == 200, answer.body
    assert answer.body["tenant_id"] == "acme"


def test_an_operator_configured_as_a_session_or_with_a_path_is_an_operator(
    aws: Services, clock: Clock
):
    # GIVEN operators configured as a role session and as a role with a path
    settings = Settings(
        operator_principals=frozenset(
            {
                f"arn:aws:sts::{ACCOUNT}:assumed-role/Ops/some-session",
                f"arn:aws:iam::{ACCOUNT}:role/aws-reserved/sso.amazonaws.com/AWSReservedSSO_Admin_9",
            }
        )
    )
    plane = ControlPlane(Services(aws.dynamodb, aws.sqs, settings, clock))
    # THEN their callers are operators, in any spelling, and no one else is
    assert plane.is_operator(f"arn:aws:sts::{ACCOUNT}:assumed-role/Ops/other-session")
    assert plane.is_operator(f"arn:aws:iam::{ACCOUNT}:role/Ops")
    assert plane.is_operator(
        f"arn:aws:sts::{ACCOUNT}:assumed-role/AWSReservedSSO_Admin_9/jane@example.com"
    )
    assert not plane.is_operator(f"arn:aws:sts::{ACCOUNT}:assumed-role/Ops2/s")
    assert not plane.is_operator("arn:aws:sts::999999999999:assumed-role/Ops/s")
    assert not plane.is_operator(f"arn:aws:sts::{ACCOUNT}:federated-user/Ops")


def test_a_bad_operator_entry_fails_at_start_not_at_the_first_call():
    with pytest.raises(ValueError, match="not an IAM role"):
        Settings(operator_principals=frozenset({"Ops"}))


def test_principals_that_cannot_be_bound_are_refused_or_forbidden(aws: Services):
    # GIVEN principals no binding can name (a federated user, a service)
    bootstrap("acme", f"arn:aws:iam::{ACCOUNT}:user/acme")
    operator = Api(OPERATOR)
    # WHEN an operator binds one, or one calls
    bound = operator.post(
        "/v1/admin/tenants/acme/principals",
        {"principal_arn": f"arn:aws:sts::{ACCOUNT}:federated-user/eve"},
    )
    called = Api(f"arn:aws:sts::{ACCOUNT}:federated-user/eve").get("/v1/tenant")
    # THEN the binding is a 400 naming the field, the call a 403
    assert assert_error(bound, 400, "invalid_input")["fields"][0]["field"] == "principal_arn"
    assert_error(called, 403, "forbidden")
    with pytest.raises(PrincipalError):
        normalize_principal("arn:aws:iam::111122223333:group/admins")


# --- crafted ids ----------------------------------------------------------------------------


def _crafted(schedule_id: str) -> list[str]:
    """Spellings a hostile tenant might try for another tenant's schedule id."""
    tenant = tenant_of_schedule(schedule_id) or ""
    rest = schedule_id.removeprefix(schedule_key_prefix(tenant))
    return [
        schedule_id,
        schedule_id.upper(),
        f"sch_bob.{rest}",  # the same random part under the attacker's own prefix
        f"sch_bob.{tenant}.{rest}",
        schedule_id + "\u0301",
        schedule_id.replace(".", "%2E"),
        (schedule_id + "x" * 64)[:64],
    ]


def test_crafted_ids_never_reach_another_tenants_schedule_or_occurrences(
    alice: Api, bob: Api, subtests: pytest.Subtests
):
    # GIVEN alice's schedule with an occurrence made
    saved = create(alice, cron("* * * * *"))
    schedule_id = saved["schedule"]["schedule_id"]
    occ = saved["materialized"][0]["occurrence_id"]
    for crafted in _crafted(schedule_id):
        with subtests.test(crafted=crafted):
            # WHEN bob reads, lists (occurrences, versions), changes or cancels it under a
            # crafted id
            answers = [
                bob.get(f"/v1/schedules/{crafted}"),
                bob.get(f"/v1/schedules/{crafted}/occurrences"),
                bob.get(f"/v1/schedules/{crafted}/versions"),
                bob.call(
                    "PATCH", f"/v1/schedules/{crafted}", {"name": "x"}, headers={"If-Match": "1"}
                ),
                bob.post(f"/v1/schedules/{crafted}/pause"),
                bob.call("DELETE", f"/v1/schedules/{crafted}"),
                bob.get(f"/v1/occurrences/{occ.replace(schedule_id, crafted)}"),
            ]
            # THEN each answers 404 (or 400 for what is not an id at all), never her data
            for answer in answers:
                assert answer.status in (400, 404), answer.body
                text = json.dumps(answer.body, ensure_ascii=False).replace(crafted, "")
                assert schedule_id not in text
    # AND her schedule is untouched
    got = alice.get(f"/v1/schedules/{schedule_id}").body["schedule"]
    assert (got["version"], got["state"]) == (1, "ACTIVE")


def test_a_forged_occurrence_naming_another_tenant_is_never_sent_to_its_queue(
    alice: Api, bob: Api, aws: Services, clock: Clock
):
    # GIVEN bob's own occurrence, rewritten by bob's worker (IAM lets it write items under
    # its own schedules' keys, nothing else) to name alice and her target
    definition = ScheduleDefinition.model_validate(
        {"target": "default", "spec": {"kind": "at", "at": _iso(clock.now + 30)}}
    )
    made = ControlPlane(aws).create("bob", definition).materialized[0]
    key = occurrence_key(made.occurrence_id)
    assert key["schedule_id"].startswith(schedule_key_prefix("bob"))
    item = from_dynamo(
        aws.dynamodb.get_item(TableName=aws.settings.occurrences_table, Key=to_dynamo(key))["Item"]
    )
    forged = item | {"tenant_id": "alice", "payload": {"evil": True}}
    aws.dynamodb.put_item(TableName=aws.settings.occurrences_table, Item=to_dynamo(forged))
    # AND alice's own occurrence, due at the same instant
    own = ControlPlane(aws).create("alice", definition).materialized[0]
    clock.advance(30)
    # WHEN their stream records reach the relay in one batch, the forged one first
    report = Relay(aws).relay(
        [record(aws, made.occurrence_id, 1), record(aws, own.occurrence_id, 2)]
    )
    # THEN the forged one is refused and counted, and only alice's own reaches her queue:
    # the refusal skips that record, not the rest of the batch
    assert (report.sent, report.refused) == (1, 1)
    assert [m["occurrence_id"] for m in messages(aws, "alice")] == [own.occurrence_id]


def _iso(instant: float) -> str:
    return datetime.fromtimestamp(int(instant)).astimezone().isoformat()


# --- the workers' IAM policy -------------------------------------------------------------


def _statements(policy: dict[str, Any]) -> list[dict[str, Any]]:
    return list(policy["Statement"])


def test_worker_policy_scopes_every_statement_to_the_tenants_own_keys_and_queues():
    # GIVEN the policy Punctual writes for tenant acme's workers
    settings = Settings(account_id=ACCOUNT, region="eu-west-1")
    policy = worker_policy("acme", settings)
    dynamo = [s for s in _statements(policy) if s["Action"][0].startswith("dynamodb:")]
    sqs = [s for s in _statements(policy) if s["Action"][0].startswith("sqs:")]
    # THEN every DynamoDB statement names one table and only acme's partitions, with the
    # vacuous-truth guard; no Scan, DeleteItem or BatchWriteItem anywhere
    assert all(s["Effect"] == "Allow" for s in _statements(policy))
    for statement in dynamo:
        assert isinstance(statement["Resource"], str)
        assert "*" not in statement["Resource"]
        condition = statement["Condition"]
        assert condition["Null"] == {"dynamodb:LeadingKeys": "false"}
        [keys] = [v for k, v in condition.items() if k.startswith("ForAllValues")]
        for key in keys["dynamodb:LeadingKeys"]:
            assert key in ("sch_acme.*", "T#acme", "R#acme"), key
    actions = {a for s in _statements(policy) for a in s["Action"]}
    assert not actions & {"dynamodb:Scan", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem"}
    writes = {
        (a, s["Resource"].rsplit("/", 1)[1])
        for s in dynamo
        for a in s["Action"]
        if a in ("dynamodb:PutItem", "dynamodb:UpdateItem")
    }
    # (updates of its own occurrences and slots; it creates no item of ours)
    assert writes == {
        ("dynamodb:UpdateItem", settings.occurrences_table),
        ("dynamodb:UpdateItem", settings.tenants_table),
    }
    # AND the tenant record (quotas, usage) is readable, never writable
    [slots] = [
        s
        for s in dynamo
        if "dynamodb:UpdateItem" in s["Action"] and s["Resource"].endswith(settings.tenants_table)
    ]
    assert slots["Condition"]["ForAllValues:StringEquals"]["dynamodb:LeadingKeys"] == ["R#acme"]
    # AND the queue statement matches acme's queues and no other tenant's
    [queues] = sqs
    pattern = queues["Resource"].rsplit(":", 1)[1]
    mine = [
        queue_name("punctual", "acme", t, dlq=d)
        for t, d in itertools.product(["a", "x-dlq"], [False, True])
    ]
    theirs = [
        queue_name("punctual", t, "jobs", dlq=d)
        for t, d in itertools.product(["acme-eu", "acmex", "acm"], [False, True])
    ]
    assert all(fnmatch.fnmatchcase(name, pattern) for name in mine)
    assert not any(fnmatch.fnmatchcase(name, pattern) for name in theirs)


def test_worker_policy_served_to_the_tenant_and_to_operators(alice: Api, bob: Api):
    # WHEN alice asks for her workers' policy, and an operator for bob's
    mine = alice.get("/v1/tenant/worker-policy")
    operator = Api(OPERATOR).get("/v1/admin/tenants/bob/worker-policy")
    # THEN each names its own tenant's keys only; a tenant cannot ask for another's
    assert mine.status == 200
    assert "sch_alice.*" in json.dumps(mine.body)
    assert "bob" not in json.dumps(mine.body)
    assert "sch_bob.*" in json.dumps(operator.body)
    assert "alice" not in json.dumps(operator.body)
    assert_error(alice.get("/v1/admin/tenants/bob/worker-policy"), 403, "forbidden")
    assert_error(Api(OPERATOR).get("/v1/admin/tenants/nobody/worker-policy"), 404, "not_found")


def test_worker_policy_denies_what_a_hostile_tenant_would_try():
    # GIVEN bob's workers' policy, and the calls bob might make with it
    settings = Settings(account_id=ACCOUNT)
    policy = worker_policy("bob", settings)

    def table(name: str) -> str:
        return f"arn:aws:dynamodb:us-east-1:{ACCOUNT}:table/{name}"

    occurrences, schedules, tenants = (
        table(settings.occurrences_table),
        table(settings.schedules_table),
        table(settings.tenants_table),
    )
    own, theirs = "sch_bob.k3aaaa", "sch_alice.k3aaaa"
    allowed = [
        ("dynamodb:UpdateItem", occurrences, [own]),
        ("dynamodb:BatchGetItem", occurrences, [own]),
        ("dynamodb:BatchGetItem", schedules, [own]),
        ("dynamodb:GetItem", tenants, ["T#bob"]),
        ("dynamodb:UpdateItem", tenants, ["R#bob"]),
        ("sqs:ReceiveMessage", f"arn:aws:sqs:us-east-1:{ACCOUNT}:punctual-bob_default", []),
    ]
    denied = [
        ("dynamodb:UpdateItem", occurrences, [theirs]),
        ("dynamodb:BatchGetItem", occurrences, [own, theirs]),
        ("dynamodb:Query", occurrences, ["sch_bob"]),  # not under its prefix
        ("dynamodb:PutItem", occurrences, [own]),  # a forged occurrence of its own
        ("dynamodb:ConditionCheckItem", schedules, [own]),
        ("dynamodb:UpdateItem", schedules, [own]),  # its own schedules: the API's to change
        ("dynamodb:UpdateItem", tenants, ["T#bob"]),  # its usage and quotas
        ("dynamodb:GetItem", tenants, ["T#alice"]),
        ("dynamodb:UpdateItem", tenants, ["R#alice"]),
        ("dynamodb:Scan", occurrences, []),
        ("dynamodb:DeleteItem", occurrences, [own]),
        ("dynamodb:GetItem", table(settings.leases_table), ["SHARD#0001"]),
        ("sqs:ReceiveMessage", f"arn:aws:sqs:us-east-1:{ACCOUNT}:punctual-bobby_default", []),
        ("sqs:SendMessage", f"arn:aws:sqs:us-east-1:{ACCOUNT}:punctual-alice_default", []),
    ]
    # THEN IAM would allow exactly the first list
    assert [call for call in allowed if not allows(policy, *call)] == []
    assert [call for call in denied if allows(policy, *call)] == []


def test_worker_policy_allows_every_call_the_worker_sdk_makes():
    # GIVEN every call the worker SDK made in the integration tests (the inventory), as the
    # tenant's own worker makes it: on its own partitions and queues
    calls = [c for c in read_inventory()[0] if c.function == "worker"]
    settings = Settings(account_id=ACCOUNT)
    policy = worker_policy("acme", settings)
    ours = {spec.name(settings) for spec in ALL_TABLES}
    own_keys = {
        settings.schedules_table: [["sch_acme.k3aaaa"]],
        settings.occurrences_table: [["sch_acme.k3aaaa"]],
        settings.tenants_table: [["T#acme"], ["R#acme"]],
    }
    checked = 0
    for call in calls:
        service, _ = call.action.split(":")
        if service == "sqs":
            resource = f"arn:aws:sqs:us-east-1:{ACCOUNT}:punctual-acme_default"
            keys_options: list[list[str]] = [[]]
        else:
            table = call.resource.removeprefix("table/").split("/")[0]
            if table not in ours:
                continue  # the tenant's own tables (the effect ledger): not ours to grant
            resource = f"arn:aws:dynamodb:us-east-1:{ACCOUNT}:table/{table}"
            keys_options = own_keys[table]
            if call.action == "dynamodb:UpdateItem" and table == settings.tenants_table:
                keys_options = [["R#acme"]]  # its slots: the only tenants-table writes
        # THEN the generated policy allows it (for at least the partition it targets)
        assert any(allows(policy, call.action, resource, keys) for keys in keys_options), call
        checked += 1
    assert checked >= 12
