"""The API contract, held by an independent client: schemathesis over docs/openapi.json.

Requests go over HTTP through the local gateway (the API handler in this process, one
event at a time as on Lambda) to DynamoDB Local and moto's SQS, signed with SigV4: tenant
operations as tenant ``acme``, ``/v1/admin`` operations as the operator. Every answer must
- not be a 5xx;
- have a status the document lists for the operation, and a body its schema allows;
- take the one error shape when it is an error;
and a request that breaks the document's schema (negative data) must be refused.

Stateless phases first (the document's examples, the coverage phase's boundary and
invalid values, fuzzing), then a stateful run that follows the document's links from a
created schedule to the operations on it. A fixed seed and bounded example counts keep it
deterministic and under two minutes; the last test checks that every operation was reached
past authentication, so that the run cannot pass by being refused everywhere.
"""

from __future__ import annotations

import json
import os
import re
import threading
import uuid
import zoneinfo
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import datetime
from decimal import Decimal
from typing import Any

import boto3
import croniter
import hypothesis
import hypothesis.errors
import pytest
import requests
import schemathesis
from api import context, handler
from api.openapi import DOCUMENT
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import strategies as st
from moto import mock_aws
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    allow_header_conformance,
    content_type_conformance,
    ensure_resource_availability,
    missing_required_header,
    negative_data_rejection,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
    use_after_free,
)

from punctual.dal.tables import ALL_TABLES, create_tables
from punctual.domain.schedule import MAX_PAYLOAD_BYTES, MAX_PAYLOAD_DEPTH, ScheduleDefinition
from punctual.services import Services
from punctual.settings import Settings
from punctual_local.dynamodb import LocalDynamoDB
from punctual_local.gateway import Gateway
from tests.integration.conftest import START
from tests.integration.helpers import ERROR_KEYS

Case = schemathesis.Case[Any]
# (PUNCTUAL_CONTRACT_SEED and PUNCTUAL_CONTRACT_EXAMPLES: another seed, a longer run)
SEED = int(os.environ.get("PUNCTUAL_CONTRACT_SEED", "18"))
# Per operation, in the fuzzing phase (examples and coverage are fixed).
FUZZ_EXAMPLES = int(os.environ.get("PUNCTUAL_CONTRACT_EXAMPLES", "15"))
STATEFUL_SCENARIOS = 50
STATEFUL_RUNS = 5  # at most, each with a new seed (see the stateful test)
OPERATOR_KEY, TENANT_KEY = "operator", "acme"

schema = schemathesis.openapi.from_path(DOCUMENT)
schema.config.seed = SEED
# Requests are signed by SigV4 below; schemathesis does not generate the Authorization header
# (unsigned requests are the gateway's to refuse: tests/unit/test_local_gateway.py).
schema.config.generation.update(
    max_examples=FUZZ_EXAMPLES,
    deterministic=True,
    database="none",
    with_security_parameters=False,
)
# A PATCH without If-Match is answered 428 Precondition Required (RFC 6585), the status for
# exactly that; schemathesis's default list for a missing required header lacks it.
schema.config.checks.missing_required_header.expected_statuses = [
    *schema.config.checks.missing_required_header.expected_statuses,
    "428",
]
# parametrize() runs the first three; the stateful one is the state machine below.
schema.config.phases.update(phases=["examples", "coverage", "fuzzing", "stateful"])


# What the document says in words and JSON Schema cannot express. A generated request that
# breaks one is not schema-valid in the document's sense: the API refuses it with a 400
# naming the field (negative data), so the positive check does not get it. Each rule is
# judged here on its own, not by the API's validators.
def _breaks_a_stated_rule(case: Case) -> str | None:
    body = case.body if isinstance(case.body, dict) else {}
    query = case.query or {}
    for rule in _STATED_RULES:
        broken = rule(case.operation.path, body, query)
        if broken is not None:
            return broken
    return None


# A stated rule: given the operation's path, the request's body and its query, what the
# request breaks, or None.
_Rule = Callable[[str, dict[str, Any], dict[str, Any]], str | None]


def _backoff_order(path: str, body: dict[str, Any], query: dict[str, Any]) -> str | None:
    retry = body.get("retry")
    if isinstance(retry, dict) and _over(retry, "backoff_base_seconds", "backoff_max_seconds"):
        return "retry: backoff_base_seconds after backoff_max_seconds"
    return None


def _window_order(path: str, body: dict[str, Any], query: dict[str, Any]) -> str | None:
    for window in (body, query):
        since, until = _instant(window.get("from")), _instant(window.get("to"))
        if since is not None and until is not None and until <= since:
            return "to is not after from"
    return None


def _foreign_token(path: str, body: dict[str, Any], query: dict[str, Any]) -> str | None:
    return "a next_token the API did not issue" if "next_token" in query else None


def _backfill_retained(path: str, body: dict[str, Any], query: dict[str, Any]) -> str | None:
    since = _instant(body.get("from"))
    if path.endswith("/backfill") and since is not None and since < _RETAINED:
        return "backfill: from older than the retention"
    return None


def _ledger_range(path: str, body: dict[str, Any], query: dict[str, Any]) -> str | None:
    """GET /v1/occurrences: from..to (defaults: the last day and the next hour) at most 7
    days, from within the retention (the operation's description)."""
    if path != "/v1/occurrences":
        return None
    since = _instant(query.get("from"))
    until = _instant(query.get("to"))
    since = START - 86400 if since is None else since
    until = START + 3600 if until is None else until
    if until <= since:
        return "to is not after from (with the defaults)"
    if until - since > 7 * 86400:
        return "from..to: more than 7 days"
    if since < _RETAINED:
        return "from: older than the retention"
    return None


def _storable_payload(path: str, body: dict[str, Any], query: dict[str, Any]) -> str | None:
    if "payload" in body and _unstorable(body["payload"]):
        return "payload: not one DynamoDB can store (the field's description)"
    return None


def _on_calendar(path: str, body: dict[str, Any], query: dict[str, Any]) -> str | None:
    if any(_off_calendar(v) for window in (body, query, spec_of(body)) for v in window.values()):
        return "an instant outside 0002-01-01 .. 9998-12-31"
    return None


def _known_target(path: str, body: dict[str, Any], query: dict[str, Any]) -> str | None:
    if body.get("target") not in (None, "default"):
        return "target: not one of the tenant's targets (acme has default)"
    return None


def _spec_expression(path: str, body: dict[str, Any], query: dict[str, Any]) -> str | None:
    spec = spec_of(body)
    expression = str(spec.get("expression"))
    if spec.get("kind") == "rate" and not _RATE_GRAMMAR.match(expression):
        return "spec.expression: not a rate"
    if spec.get("kind") == "cron" and not _is_cron(expression):
        return "spec.expression: not a cron"
    return None


def _spec_at(path: str, body: dict[str, Any], query: dict[str, Any]) -> str | None:
    spec = spec_of(body)
    if "at" in spec and _instant(str(spec["at"]).strip()) is None:
        return "spec.at: not an ISO-8601 date-time"
    return None


def _spec_zone(path: str, body: dict[str, Any], query: dict[str, Any]) -> str | None:
    spec = spec_of(body)
    if spec.get("timezone") is not None and spec["timezone"] not in _ZONES:
        return "spec.timezone: not an IANA zone"
    return None


def _spec_bounds(path: str, body: dict[str, Any], query: dict[str, Any]) -> str | None:
    spec = spec_of(body)
    since, until = _instant(spec.get("start_at")), _instant(spec.get("end_at"))
    if since is not None and until is not None and until <= since:
        return "spec: end_at not after start_at"
    return None


# In the order they are judged: the first one a request breaks is its reason.
_STATED_RULES: tuple[_Rule, ...] = (
    _backoff_order,
    _window_order,
    _foreign_token,
    _backfill_retained,
    _ledger_range,
    _storable_payload,
    _on_calendar,
    _known_target,
    _spec_expression,
    _spec_at,
    _spec_zone,
    _spec_bounds,
)


_ZONES = zoneinfo.available_timezones()
_RATE_GRAMMAR = re.compile(r"^rate\([1-9][0-9]* (minute|minutes|hour|hours|day|days)\)$")


def _is_cron(expression: str) -> bool:
    """Five fields croniter reads (it reads more than docs/time.md allows, never less), or
    a macro: what a value of another grammar (an example of the other kind) is not."""
    return expression.startswith("@") or (
        len(expression.split()) == 5 and croniter.croniter.is_valid(expression)
    )


_RETAINED = START - Settings().retention_days * 86400  # (the gateway's clock is START)


def spec_of(body: dict[str, Any]) -> dict[str, Any]:
    spec = body.get("spec")
    return spec if isinstance(spec, dict) else {}


def _unstorable(payload: Any) -> bool:
    """Breaks the payload rules its description states (an independent reading)."""
    if not isinstance(payload, dict):
        return False
    size = len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode())
    pending: list[tuple[Any, int]] = [(payload, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict | list):
            if depth > MAX_PAYLOAD_DEPTH or (isinstance(value, dict) and "" in value):
                return True
            children = value.values() if isinstance(value, dict) else value
            pending.extend((child, depth + 1) for child in children)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            number = Decimal(repr(value))  # (exact: no context rounds it)
            digits = "".join(map(str, number.as_tuple().digits)).strip("0")
            magnitude = number.copy_abs()
            if len(digits) > 38 or (number and not 1e-130 <= magnitude < Decimal("1e38")):
                return True
    return size > MAX_PAYLOAD_BYTES


def _off_calendar(value: Any) -> bool:
    if not isinstance(value, str) or len(value) < 10 or value[4:5] != "-":
        return False
    year = value[:4]
    return year.isdigit() and not 2 <= int(year) <= 9998


def _over(values: dict[str, Any], low: str, high: str) -> bool:
    first, second = values.get(low), values.get(high)
    return isinstance(first, int) and isinstance(second, int) and first > second


def _instant(text: object) -> float | None:
    try:
        return datetime.fromisoformat(str(text)).timestamp() if text is not None else None
    except ValueError:
        return None


@schema.hook
def filter_case(context: Any, case: Case) -> bool:
    positive = case.meta is not None and case.meta.generation.mode.is_positive
    return not positive or _breaks_a_stated_rule(case) is None


# The grammars the document names as a string's format (punctual.domain.specs): values drawn from
# them as docs/time.md defines them, written here, not taken from the API's parser. A
# day of the month up to 28 fires in every month (one that never fires is refused).
def _cron_field(low: int, high: int) -> st.SearchStrategy[str]:
    number = st.integers(low, high)
    ranged = st.tuples(number, number).map(lambda p: f"{min(p)}-{max(p)}")
    return st.one_of(
        st.just("*"),
        number.map(str),
        ranged,
        st.integers(1, high - low + 1).map(lambda k: f"*/{k}"),
        st.lists(number, min_size=2, max_size=4, unique=True).map(
            lambda values: ",".join(map(str, sorted(values)))
        ),
    )


_CRON = st.one_of(
    st.sampled_from(["@hourly", "@daily", "@weekly", "@monthly", "30 9 * * mon-fri"]),
    st.tuples(
        _cron_field(0, 59),
        _cron_field(0, 23),
        _cron_field(1, 28),
        _cron_field(1, 12),
        _cron_field(0, 6),
    ).map(" ".join),
)
_RATE = st.one_of(
    st.tuples(st.integers(1, 527040), st.sampled_from(["minute", "minutes"])),
    st.tuples(st.integers(1, 8784), st.sampled_from(["hour", "hours"])),
    st.tuples(st.integers(1, 366), st.sampled_from(["day", "days"])),
).map(lambda p: f"rate({p[0]} {p[1]})")
schemathesis.openapi.format("cron", _CRON)
schemathesis.openapi.format("rate", _RATE)
schemathesis.openapi.format(
    "iana-time-zone", st.sampled_from(sorted(zoneinfo.available_timezones()))
)


class SigV4(requests.auth.AuthBase):
    """Signs as the local stack's callers do: the access key id names the principal."""

    def __init__(self, access_key_id: str) -> None:
        self.credentials = Credentials(access_key_id, "contract-secret")

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        signed = AWSRequest(
            method=request.method, url=request.url, data=request.body, headers=request.headers
        )
        SigV4Auth(self.credentials, "execute-api", "us-east-1").add_auth(signed)
        request.headers.update(dict(signed.headers.items()))
        return request


# Every answer seen, per operation ("POST /v1/schedules") and status, and per phase and status.
ANSWERS: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
PHASES: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
_answers_lock = threading.Lock()


def _caller(case: Case) -> SigV4:
    admin = case.operation.path.startswith("/v1/admin/")
    return SigV4(OPERATOR_KEY if admin else TENANT_KEY)


def _record(case: Case, response: schemathesis.Response) -> None:
    phase = case.meta.phase.name.value if case.meta else "unknown"
    with _answers_lock:
        ANSWERS[case.operation.label][response.status_code] += 1
        PHASES[phase][response.status_code] += 1


@schemathesis.check
def one_error_shape(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: Case
) -> bool | None:
    """Every error answer: {"error": {"code", "message", "fields", "details"}}."""
    if response.status_code < 400:
        return None
    body = response.json()
    assert isinstance(body, dict), f"not an object: {body!r}"
    assert set(body) == {"error"}, f"not the one error shape: {body!r}"
    error = body["error"]
    assert set(error) == ERROR_KEYS, f"not the one error shape: {body!r}"
    assert isinstance(error["code"], str), body
    assert isinstance(error["message"], str), body
    assert error["message"], body
    assert isinstance(error["details"], dict), body
    assert all(set(f) == {"field", "reason"} for f in error["fields"]), body
    return True


# Every check schemathesis has (`--checks all`) but ``ignored_auth``: this harness signs
# every request it sends, the check's unsigned one too. Unsigned and badly signed requests
# are the gateway's to refuse (tests/unit/test_local_gateway.py); on AWS, API Gateway's IAM
# authorization refuses them before the API runs.
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    missing_required_header,
    unsupported_method,
    allow_header_conformance,
    use_after_free,
    ensure_resource_availability,
    one_error_shape,
]


@pytest.fixture(scope="module")
def gateway(dynamodb_local: LocalDynamoDB) -> Iterator[Gateway]:
    """The local gateway over fresh tables, with tenant acme (target default) and the operator."""
    with pytest.MonkeyPatch.context() as env, mock_aws():
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("POWERTOOLS_TRACE_DISABLED", "true")
        prefix = f"c{uuid.uuid4().hex[:10]}"
        settings = Settings(
            operator_principals=frozenset({f"arn:aws:iam::000000000000:user/{OPERATOR_KEY}"}),
            shard_count=8,
        ).model_copy(update={spec.setting: f"{prefix}-{spec.setting}" for spec in ALL_TABLES})
        dynamodb = dynamodb_local.client()
        create_tables(dynamodb, settings)
        sqs = boto3.client("sqs", region_name="us-east-1")
        context.configure(Services(dynamodb, sqs, settings, now=lambda: START))
        server = Gateway(handler.lambda_handler, 0, lambda: START)
        server.start()
        try:
            _bootstrap(server.url)
            yield server
        finally:
            server.stop()
            context.configure(None)


def _bootstrap(url: str) -> None:
    operator = requests.Session()
    operator.auth = SigV4(OPERATOR_KEY)
    made = operator.post(f"{url}/v1/admin/tenants", json={"tenant_id": TENANT_KEY})
    assert made.status_code == 201, made.text
    principal = {"principal_arn": f"arn:aws:iam::000000000000:user/{TENANT_KEY}"}
    bound = operator.post(f"{url}/v1/admin/tenants/{TENANT_KEY}/principals", json=principal)
    assert bound.status_code == 200, bound.text
    tenant = requests.Session()
    tenant.auth = SigV4(TENANT_KEY)
    target = tenant.post(f"{url}/v1/targets", json={"name": "default"})
    assert target.status_code == 201, target.text
    # Schedules of every kind, so that listings have items whose ids the stateful run uses.
    for example in ScheduleDefinition.model_json_schema()["examples"]:
        created = tenant.post(f"{url}/v1/schedules", json=example)
        assert created.status_code == 201, created.text


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as http:
        yield http


@schema.parametrize()
@hypothesis.settings(deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
def test_api_contract_every_operation(
    case: Case, gateway: Gateway, session: requests.Session
) -> None:
    # GIVEN a generated request (valid or not) for one operation, signed as its caller
    # WHEN it is sent through the gateway
    response = case.call(base_url=gateway.url, session=session, auth=_caller(case), timeout=30)
    _record(case, response)
    # THEN the answer keeps the contract
    case.validate_response(response, checks=CHECKS)


class _Scenarios(schema.as_state_machine()):  # type: ignore[misc]
    """Chains of calls along the document's links, each signed as its caller."""

    base_url: str
    http: requests.Session
    completed = 0

    def get_call_kwargs(self, case: Case) -> dict[str, Any]:
        return {
            "base_url": self.base_url,
            "session": self.http,
            "auth": _caller(case),
            "timeout": 30,
        }

    def after_call(self, response: schemathesis.Response, case: Case) -> None:
        _record(case, response)

    def validate_response(self, response: schemathesis.Response, case: Case, **kwargs: Any) -> None:
        checks = CHECKS
        if _over_the_backfill_quota(case, response):
            # How many fires a range holds is the schedule's rule's, and how many a backfill
            # may make is the tenant's quota, which the scenario may have set a step before:
            # state no schema can say. The refusal must still be the documented 400.
            checks = [check for check in CHECKS if check is not positive_data_acceptance]
        case.validate_response(response, checks=checks)

    def teardown(self) -> None:
        type(self).completed += 1
        super().teardown()


def _over_the_backfill_quota(case: Case, response: schemathesis.Response) -> bool:
    """A backfill refused because its range holds more fires than the tenant's
    max_backfill_occurrences (the error names that field and the quota)."""
    if not case.operation.path.endswith("/backfill") or response.status_code != 400:
        return False
    error = response.json().get("error", {})
    fields = [f.get("field") for f in error.get("fields", [])]
    return fields == ["to"] and "(max_backfill_occurrences)" in str(error.get("message"))


def test_api_contract_stateful_scenarios(gateway: Gateway, session: requests.Session) -> None:
    # GIVEN the links of the document (create -> get, update, pause, resume, cancel, ...)
    _Scenarios.base_url = gateway.url
    _Scenarios.http = session
    # WHEN schemathesis follows them with generated data, THEN every answer keeps the contract
    for run in range(STATEFUL_RUNS):
        if _Scenarios.completed >= STATEFUL_SCENARIOS:
            break
        settings = hypothesis.settings(
            # No shrinking: a scenario cannot be replayed against a server whose state moved on.
            phases=[hypothesis.Phase.generate],
            max_examples=STATEFUL_SCENARIOS - _Scenarios.completed,
            stateful_step_count=8,
            database=None,
            deadline=None,
            suppress_health_check=list(hypothesis.HealthCheck),
        )
        try:
            hypothesis.seed(SEED + run)(_Scenarios).run(settings=settings)
        except hypothesis.errors.Flaky:
            # Hypothesis met a choice sequence again and the server answered differently (its
            # state moved on): not a contract failure. schemathesis's own runner starts a new
            # suite here too; so does this loop, with the next seed.
            continue
        break
    # AND the scenarios did run (a run cut short by the above cannot pass unnoticed)
    assert _Scenarios.completed >= STATEFUL_SCENARIOS, _Scenarios.completed


def test_api_contract_reached_every_operation() -> None:
    # GIVEN the answers of the runs above (this test runs after them)
    operations = {r.ok().label for r in schema.get_all_operations() if isinstance(r, Ok)}
    # THEN every operation was reached past authentication (the contract was not held by
    # refusing every caller) ...
    reached = {label for label, statuses in ANSWERS.items() if set(statuses) - {403}}
    assert operations <= reached, sorted(operations - reached)
    # AND the stateful run acted on real schedules: successes along the links
    stateful = PHASES["stateful"]
    assert sum(count for status, count in stateful.items() if status < 300) >= 10, dict(stateful)
    total = sum(sum(statuses.values()) for statuses in ANSWERS.values())
    phases = {phase: sum(statuses.values()) for phase, statuses in PHASES.items()}
    print(f"\nschemathesis: {len(operations)} operations, {total} requests by phase {phases}")
