"""Routes under /v1: parse, call the control plane once, shape the answer."""

import math
from datetime import datetime
from typing import Annotated, Any, Literal, TypeVar

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Header, Path, Query
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from api import context
from api.views import (
    BackfillOut,
    ErrorOut,
    LedgerOut,
    MetaOut,
    OccurrenceDetailOut,
    OccurrenceListOut,
    OccurrenceOut,
    PreviewOut,
    SavedOut,
    ScheduleDetailOut,
    ScheduleListOut,
    TargetIn,
    TargetListOut,
    TargetOut,
    TargetPatchIn,
    TenantListOut,
    TenantOut,
    TriggerOut,
    VersionListOut,
    WorkerPolicyOut,
    fires_out,
    ledger_out,
    missed_out,
    next_fires_out,
    occurrence_detail_out,
    occurrence_out,
    recent_out,
    saved_out,
    schedule_out,
    target_out,
    tenant_out,
    version_out,
)
from punctual.control.access import worker_policy
from punctual.control.ledger import MISSING, UPCOMING, LedgerFilter
from punctual.domain.errors import InvalidInput
from punctual.domain.fields import Instant, StrictCount
from punctual.domain.figures import MAX_RECENT_FIRES, RECENT_FIRES
from punctual.domain.findings import Finding, ReconcileReport
from punctual.domain.occurrence import OccurrenceState
from punctual.domain.policies import MisfirePolicy, OverlapPolicy, RetryPolicy
from punctual.domain.principals import PRINCIPAL_ARN_PATTERN
from punctual.domain.schedule import (
    PAYLOAD_RULES,
    SCHEDULE_NAME_PATTERN,
    TARGET_NAME_PATTERN,
    Payload,
    ScheduleDefinition,
    ScheduleState,
    WindowSeconds,
)
from punctual.domain.specs import ScheduleSpec, preview_fires
from punctual.domain.tenancy import TENANT_ID_PATTERN, Quotas
from punctual.observability import logger
from punctual.pipeline.reconciler import default_window, read_reports
from punctual.timing import to_epoch, tzdata_version, utc_text

router = Router()


def answers(
    success: int = 200,
    errors: dict[int, str] | None = None,
    *,
    body: bool = False,
    headers: dict[str, str] | None = None,
) -> dict[int, OpenAPIResponse]:
    """The success answer (its schema from the return type, ``headers`` named with their
    meaning) and every error answer the route gives, each described for this route; those
    every route can give are added."""
    meanings = {
        400: "Invalid input: each bad field is named with its reason",
        403: "Not signed with IAM credentials, or the principal is bound to no tenant",
        **({415: "The body is not application/json"} if body else {}),
        **(errors or {}),
        500: "Unexpected error: details.request_id finds it in the logs",
        503: "DynamoDB is busy (throttled): retry with back-off",
    }
    answer: OpenAPIResponse = {"description": "Created" if success == 201 else "OK"}
    if headers:
        answer["headers"] = {
            name: {"description": meaning, "schema": {"type": "string"}}
            for name, meaning in headers.items()
        }
    return {
        success: answer,
        **{
            status: {**_ERROR_CONTENT, "description": f"{meaning}. {_ERROR_CONTENT['description']}"}
            for status, meaning in sorted(meanings.items())
        },
    }


_ERROR_CONTENT: OpenAPIResponse = {
    "description": "The one error shape: code, message, fields (field and reason), details",
    "content": {"application/json": {"model": ErrorOut}},
}
_NO_SCHEDULE = {404: "No such schedule for this tenant (another tenant's answers the same)"}
_OPERATOR = {403: "Not signed with IAM credentials, or the caller is not an operator"}

Limit = Annotated[int, Query(ge=1, le=100)]
Token = Annotated[str | None, Query(max_length=2048)]
ScheduleId = Annotated[str, Path(max_length=64)]


# The schedule's version as an entity tag: what PATCH's If-Match names.
_ETAG = {"ETag": 'The schedule\'s version as an entity tag ("3"): PATCH takes it as If-Match'}
_REPLAYED = {
    "Idempotent-Replayed": "true when this answer is the one remembered for the "
    "Idempotency-Key (nothing was done again), false when the request was carried out now"
}
Tagged = TypeVar("Tagged", SavedOut, ScheduleDetailOut)


def _tagged(answer: Tagged, status: int = 200, **headers: str) -> Response[Tagged]:
    """``answer`` with the schedule's version as its ETag (and ``headers``)."""
    return Response(
        status_code=status,
        content_type="application/json",
        body=answer,
        headers={"ETag": f'"{answer.schedule.version}"', **headers},
    )


def _tenant() -> str:
    tenant = context.caller_tenant(router)
    logger.append_keys(tenant_id=tenant)
    return tenant


# --- schedules ------------------------------------------------------------------------


@router.post(
    "/v1/schedules",
    summary="Create a schedule",
    responses=answers(
        201,
        {
            400: "Invalid input (each bad field named with its reason), an unknown target, "
            "or a schedule that would never fire",
            409: "Over a quota waiting does not lift (code quota_exceeded: max_schedules or "
            "max_strict_fires_per_minute; details give the quota, its limit and the usage), "
            "or the Idempotency-Key was used with another body, or its first request is "
            "still in progress",
        },
        body=True,
        headers={**_ETAG, **_REPLAYED},
    ),
    status_code=201,
)
def create_schedule(
    definition: ScheduleDefinition,
    idempotency_key: Annotated[
        str | None, Header(alias="Idempotency-Key", min_length=1, max_length=128)
    ] = None,
) -> Response[SavedOut]:
    tenant = _tenant()
    if idempotency_key is None:
        made = saved_out(context.plane().create(tenant, definition))
        return _tagged(made, 201, **{"Idempotent-Replayed": "false"})
    # The fingerprint is the definition as understood, defaults filled in: the same request
    # with a default spelled out is the same request.
    request = {
        "key": f"{tenant}#{idempotency_key}",
        "tenant": tenant,
        "body": definition.model_dump(mode="json"),
    }
    answer, replayed = context.create_once(request)
    return _tagged(
        SavedOut.model_validate({**answer, "replayed": replayed}),
        201,
        **{"Idempotent-Replayed": str(replayed).lower()},
    )


@router.get(
    "/v1/schedules",
    summary="List the tenant's schedules",
    responses=answers(errors={400: "Invalid state, limit or next_token"}),
)
def list_schedules(
    state: Annotated[ScheduleState | None, Query()] = None,
    limit: Limit = 50,
    next_token: Token = None,
) -> ScheduleListOut:
    plane = context.plane()
    found, token = plane.list_schedules(_tenant(), state=state, limit=limit, token=next_token)
    return ScheduleListOut(
        schedules=[schedule_out(s, plane.next_fires(s, count=1)) for s in found],
        next_token=token,
    )


@router.get(
    "/v1/schedules/<schedule_id>",
    summary="Get a schedule, its next fires and how its last fires went",
    responses=answers(errors={400: "Invalid recent", **_NO_SCHEDULE}, headers=_ETAG),
)
def get_schedule(
    schedule_id: ScheduleId,
    recent: Annotated[
        int,
        Query(
            ge=0,
            le=MAX_RECENT_FIRES,
            description="How many of the last fires the recent figures cover (0: none, "
            "and no read of them).",
        ),
    ] = RECENT_FIRES,
) -> Response[ScheduleDetailOut]:
    plane = context.plane()
    schedule = plane.get(_tenant(), schedule_id)
    fires = plane.next_fires(schedule)
    return _tagged(
        ScheduleDetailOut(
            schedule=schedule_out(schedule, fires),
            next_fires=next_fires_out(fires),
            notes=fires.notes,
            recent=recent_out(plane.recent(schedule, recent)) if recent else None,
        )
    )


@router.get(
    "/v1/schedules/<schedule_id>/versions",
    summary="A schedule's versions, newest first, each with when it took effect",
    responses=answers(errors={400: "Invalid limit or next_token", **_NO_SCHEDULE}),
)
def list_versions(
    schedule_id: ScheduleId, limit: Limit = 50, next_token: Token = None
) -> VersionListOut:
    found, token = context.plane().versions(_tenant(), schedule_id, limit=limit, token=next_token)
    return VersionListOut(versions=[version_out(v) for v in found], next_token=token)


def _without_null(schema: dict[str, Any]) -> None:
    """An optional field's schema without its null branch."""
    branches = [b for b in schema.pop("anyOf", []) if b.get("type") != "null"]
    if len(branches) == 1:
        schema.update(branches[0])
    elif branches:
        schema["anyOf"] = branches


# An optional field whose None means "not given", never a value (Optional, not a union with
# None: its errors keep plain field names).
_NOT_NULL: Any = Field(default=None, json_schema_extra=_without_null)


class SchedulePatch(BaseModel):
    """Fields to change; each replaces the current value whole (``spec`` included)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "minProperties": 1,
            "examples": [
                {"name": "renamed"},
                {"spec": {"kind": "cron", "expression": "*/10 * * * *", "timezone": "UTC"}},
                {"flexible_window_seconds": 60, "overlap": "SKIP_IF_RUNNING"},
            ],
        },
    )

    # Only the name may be null (none); None for the others only means "not given" (the
    # schema does not offer null for them: it would be refused as the field's value).
    name: str | None = Field(default=None, max_length=128, pattern=SCHEDULE_NAME_PATTERN)
    spec: ScheduleSpec | None = _NOT_NULL
    target: Annotated[str, Field(pattern=TARGET_NAME_PATTERN)] | None = _NOT_NULL
    payload: Payload | None = Field(
        default=None, description=PAYLOAD_RULES, json_schema_extra=_without_null
    )
    flexible_window_seconds: WindowSeconds | None = _NOT_NULL
    misfire: MisfirePolicy | None = _NOT_NULL
    overlap: OverlapPolicy | None = _NOT_NULL
    retry: RetryPolicy | None = _NOT_NULL


# The version as an entity tag: 3, "3" or W/"3".
_IF_MATCH_PATTERN = r'^(W/)?("[0-9]{1,9}"|[0-9]{1,9})$'


@router.patch(
    "/v1/schedules/<schedule_id>",
    summary="Update a schedule (a new version)",
    responses=answers(
        errors={
            400: "Invalid input (each bad field named with its reason), no field to change, "
            "an If-Match that is not a version, an unknown target, or a schedule that would "
            "never fire",
            **_NO_SCHEDULE,
            409: "If-Match names an older version (details.current_version), the schedule "
            "changed meanwhile, or it is CANCELED; or over max_strict_fires_per_minute "
            "(code quota_exceeded, details give the limit and usage)",
            428: "If-Match is missing",
        },
        body=True,
        headers=_ETAG,
    ),
)
def update_schedule(
    schedule_id: ScheduleId,
    patch: SchedulePatch,
    if_match: Annotated[
        str,
        Header(
            alias="If-Match",
            pattern=_IF_MATCH_PATTERN,
            description='The version the change is based on, e.g. 3 or "3" (428 when '
            "missing, 409 when stale).",
        ),
    ],
) -> Response[SavedOut]:
    version = int(if_match.removeprefix("W/").strip('"'))
    changes = patch.model_dump(mode="json", exclude_unset=True)
    if not changes:
        raise InvalidInput(
            "nothing to change", [{"field": "(body)", "reason": "give at least one field"}]
        )
    saved = context.plane().update(_tenant(), schedule_id, if_match=version, changes=changes)
    return _tagged(saved_out(saved))


@router.post(
    "/v1/schedules/<schedule_id>/pause",
    summary="Pause: no fires until resumed",
    responses=answers(
        errors={
            **_NO_SCHEDULE,
            409: "CANCELED or COMPLETED (details.state), or it changed meanwhile (PAUSED "
            "already is a 200 that changes nothing, a note says so)",
        },
        headers=_ETAG,
    ),
)
def pause_schedule(schedule_id: ScheduleId) -> Response[SavedOut]:
    return _tagged(saved_out(context.plane().pause(_tenant(), schedule_id)))


@router.post(
    "/v1/schedules/<schedule_id>/resume",
    summary="Resume: next fire after now",
    responses=answers(
        errors={
            **_NO_SCHEDULE,
            409: "CANCELED or COMPLETED (details.state), or it changed meanwhile (ACTIVE "
            "already is a 200 that changes nothing, a note says so)",
        },
        headers=_ETAG,
    ),
)
def resume_schedule(schedule_id: ScheduleId) -> Response[SavedOut]:
    return _tagged(saved_out(context.plane().resume(_tenant(), schedule_id)))


@router.delete(
    "/v1/schedules/<schedule_id>",
    summary="Cancel: a soft delete (the schedule stays readable as CANCELED, with its "
    "versions and occurrences, until they expire; it never fires again)",
    responses=answers(
        errors={
            **_NO_SCHEDULE,
            409: "It changed meanwhile (CANCELED already is a 200 that changes nothing, a "
            "note says so)",
        },
        headers=_ETAG,
    ),
)
def cancel_schedule(schedule_id: ScheduleId) -> Response[SavedOut]:
    return _tagged(saved_out(context.plane().cancel(_tenant(), schedule_id)))


@router.post(
    "/v1/schedules/<schedule_id>/trigger",
    summary="Run now: one manual occurrence, receivable at once",
    responses=answers(
        201,
        {
            **_NO_SCHEDULE,
            409: "Not ACTIVE (details.state): a PAUSED, CANCELED or COMPLETED schedule does "
            "not run now; or the Idempotency-Key's run has expired (use a new key)",
            429: "Over quota (max_manual_runs_per_minute): details give the quota, its limit "
            "and the usage; Retry-After (and details.retry_after_seconds) say when the next "
            "minute's count starts",
        },
    ),
    status_code=201,
)
def trigger_schedule(
    schedule_id: ScheduleId,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            max_length=128,
            description="The same key (per schedule) answers with the same occurrence "
            "(replayed: true) instead of a second run; without one, every request runs.",
        ),
    ] = None,
) -> TriggerOut:
    triggered = context.plane().trigger(_tenant(), schedule_id, idempotency_key)
    return TriggerOut(
        occurrence=OccurrenceOut(**occurrence_out(triggered.occurrence)),
        replayed=triggered.replayed,
    )


class BackfillIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            # (A window to come: a past one leaves the retention, and is refused, as the
            # calendar moves on.)
            "examples": [
                {"from": "2030-01-01T00:00:00Z", "to": "2030-01-08T00:00:00Z", "dry_run": True}
            ]
        },
    )

    since: Instant = Field(alias="from", description="The first instant (inclusive).")
    until: Instant = Field(alias="to", description="The end (exclusive).")
    dry_run: bool = Field(default=False, description="Count and show; make nothing.")


@router.post(
    "/v1/schedules/<schedule_id>/backfill",
    summary="Backfill: an occurrence for every fire in [from, to) that has none",
    responses=answers(
        errors={
            400: "Invalid from or to (to not after from), or more fires in the range than "
            "the tenant's max_backfill_occurrences",
            **_NO_SCHEDULE,
            409: "Not ACTIVE (details.state): only an ACTIVE schedule is backfilled",
        },
        body=True,
    ),
)
def backfill_schedule(schedule_id: ScheduleId, body: BackfillIn) -> BackfillOut:
    # Whole seconds, rounded up: [09:00:00.5, ...) does not hold the fire at 09:00:00, and
    # [..., 09:05:00.5) holds the one at 09:05:00.
    since, until = math.ceil(body.since.timestamp()), math.ceil(body.until.timestamp())
    if until <= since:
        raise InvalidInput("to is not after from", [{"field": "to", "reason": "not after from"}])
    done = context.plane().backfill(_tenant(), schedule_id, since, until, dry_run=body.dry_run)
    return BackfillOut(
        dry_run=done.dry_run,
        fires=done.fires,
        existing=done.existing,
        planned=done.planned,
        created=len(done.made),
        occurrences=[OccurrenceOut(**occurrence_out(o)) for o in done.shown],
    )


# --- occurrences ----------------------------------------------------------------------


def _instant(value: datetime | None, default: int) -> int:
    return default if value is None else to_epoch(value)


@router.get(
    "/v1/schedules/<schedule_id>/occurrences",
    summary="A schedule's occurrences",
    responses=answers(
        errors={400: "Invalid from, to (or to before from), limit or next_token", **_NO_SCHEDULE}
    ),
)
def list_occurrences(
    schedule_id: ScheduleId,
    since: Annotated[Instant | None, Query(alias="from")] = None,
    until: Annotated[Instant | None, Query(alias="to")] = None,
    limit: Limit = 50,
    next_token: Token = None,
) -> OccurrenceListOut:
    low = _instant(since, -(2**53))
    high = _instant(until, 2**53)
    if high < low:
        raise InvalidInput("to is before from", [{"field": "to", "reason": "before from"}])
    if high < 0:
        # No occurrence is due before 1970 (instants are stored as unsigned epoch seconds,
        # and a key range below zero is one DynamoDB refuses): the window holds none.
        return OccurrenceListOut(occurrences=[], missed=[], next_token=None)
    low = max(low, 0)
    claims: dict[str, int] = {}
    found, missed, token = context.plane().list_occurrences(
        _tenant(), schedule_id, since=low, until=high, limit=limit, token=next_token, claims=claims
    )
    return OccurrenceListOut(
        occurrences=[
            OccurrenceOut(**occurrence_out(o, claims.get(o.occurrence_id))) for o in found
        ],
        missed=missed_out(missed),
        next_token=token,
    )


LEDGER_STATES = frozenset({*(s.value for s in OccurrenceState), MISSING, UPCOMING})
LEDGER_FINDINGS = frozenset(f.value for f in Finding)


def _list_of(values: frozenset[str]) -> str:
    """A comma-separated list of ``values`` (the filters' grammar, in the schema too)."""
    one = "|".join(sorted(values))
    return f"^({one})(,({one}))*$"


def _choices(field: str, text: str | None, allowed: frozenset[str]) -> frozenset[str]:
    """A comma-separated filter's values, each one of ``allowed`` (400 naming the field)."""
    if text is None:
        return frozenset()
    chosen = frozenset(part.strip() for part in text.split(","))
    unknown = sorted(chosen - allowed)
    if unknown:
        reason = f"not one of {', '.join(sorted(allowed))}: {', '.join(unknown)}"
        raise InvalidInput(f"{field} is not valid", [{"field": field, "reason": reason}])
    return chosen


@router.get(
    "/v1/occurrences",
    summary="The tenant's occurrences across its schedules (the ledger)",
    description="The exceptions of the hours the reconciler has checked (every occurrence "
    "that did not succeed at its first attempt, and fires never made), each hour's counts "
    "by finding, and the upcoming fires of the active schedules, in one time order "
    "(docs/data-model.md, *ledger*). from..to: at most 7 days, from no older than the "
    "retention; default the last day and the next hour (after the first page, the "
    "token's).",
    responses=answers(
        errors={
            400: "Invalid from, to (later than from, at most 7 days, within the "
            "retention), state, finding, target, limit or next_token"
        }
    ),
)
def list_ledger(
    since: Annotated[Instant | None, Query(alias="from")] = None,
    until: Annotated[Instant | None, Query(alias="to")] = None,
    state: Annotated[
        str | None,
        Query(
            max_length=256,
            pattern=_list_of(LEDGER_STATES),
            description="Only these states, comma-separated: an occurrence's, MISSING (no "
            "occurrence was made) or UPCOMING (a fire to come).",
        ),
    ] = None,
    finding: Annotated[
        str | None,
        Query(
            max_length=256,
            pattern=_list_of(LEDGER_FINDINGS),
            description="Only these reconciler findings, comma-separated.",
        ),
    ] = None,
    target: Annotated[str | None, Query(pattern=TARGET_NAME_PATTERN)] = None,
    listing: Annotated[
        Literal["exceptions", "all"],
        Query(
            description="exceptions: what did not succeed at its first attempt; all: every "
            "occurrence of the hours read live too (a checked hour's page lists only its "
            "exceptions either way)."
        ),
    ] = "exceptions",
    limit: Limit = 100,
    next_token: Token = None,
) -> LedgerOut:
    wanted = LedgerFilter(
        states=_choices("state", state, LEDGER_STATES),
        findings=frozenset(Finding(f) for f in _choices("finding", finding, LEDGER_FINDINGS)),
        target=target,
        every=listing == "all",
    )
    answer = context.plane().ledger(
        _tenant(),
        since=None if since is None else to_epoch(since),
        until=None if until is None else to_epoch(until),
        wanted=wanted,
        limit=limit,
        token=next_token,
    )
    return ledger_out(answer)


@router.get(
    "/v1/occurrences/<occurrence_id>",
    summary="One occurrence with its attempts",
    responses=answers(
        errors={404: "No such occurrence for this tenant (another tenant's answers the same)"}
    ),
)
def get_occurrence(occurrence_id: Annotated[str, Path(max_length=128)]) -> OccurrenceDetailOut:
    occurrence, attempts = context.plane().occurrence(_tenant(), occurrence_id)
    return occurrence_detail_out(occurrence, attempts)


# --- preview, targets, tenant, meta ---------------------------------------------------


class PreviewIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "spec": {
                        "kind": "cron",
                        "expression": "30 2 * * *",
                        "timezone": "America/New_York",
                    },
                    "after": "2027-03-13T00:00:00Z",
                    "count": 3,
                }
            ]
        },
    )

    spec: ScheduleSpec
    count: StrictCount = Field(default=10, ge=1, le=100)
    after: Instant | None = Field(default=None, description="Default: now.")


@router.post(
    "/v1/preview",
    summary="Next fires of a spec, nothing saved",
    responses=answers(
        errors={400: "Invalid spec, count or after (each named with its reason)"}, body=True
    ),
)
def preview_spec(body: PreviewIn) -> PreviewOut:
    _tenant()
    after = _instant(body.after, int(context.services().now()))
    result = preview_fires(body.spec, after, body.count)
    return PreviewOut(fires=fires_out(result), notes=result.notes)


@router.post(
    "/v1/targets",
    summary="Create a target: an SQS queue with its DLQ",
    responses=answers(
        201,
        {400: "Invalid name", 409: "The tenant already has a target of this name"},
        body=True,
    ),
    status_code=201,
)
def create_target(body: TargetIn) -> TargetOut:
    plane = context.plane()
    return target_out(plane.create_target(_tenant(), body.name, early_delivery=body.early_delivery))


@router.patch(
    "/v1/targets/<name>",
    summary="Turn a target's early delivery on or off",
    responses=answers(
        errors={400: "Invalid early_delivery", 404: "The tenant has no target of this name"},
        body=True,
    ),
)
def update_target(name: Annotated[str, Path(max_length=64)], body: TargetPatchIn) -> TargetOut:
    return target_out(context.plane().set_early_delivery(_tenant(), name, body.early_delivery))


@router.get("/v1/targets", summary="The tenant's targets", responses=answers())
def list_targets() -> TargetListOut:
    targets = context.plane().tenants.list_targets(_tenant())
    return TargetListOut(targets=[target_out(t) for t in targets])


@router.get("/v1/tenant", summary="The caller's tenant: quotas and usage", responses=answers())
def get_tenant() -> TenantOut:
    return tenant_out(context.plane().tenants.get(_tenant()))


@router.get(
    "/v1/tenant/worker-policy",
    summary="The IAM policy for the role the tenant's workers run as",
    responses=answers(),
)
def get_worker_policy() -> WorkerPolicyOut:
    return WorkerPolicyOut(policy=worker_policy(_tenant(), context.plane().settings))


@router.get(
    "/v1/meta", summary="Service version and the time zone rules in use", responses=answers()
)
def meta() -> MetaOut:
    return MetaOut(version=context.services().settings.version, tzdata=tzdata_version())


# --- operators ------------------------------------------------------------------------


class StrictQuotas(Quotas):
    """Quotas as a request gives them: a number is a number ("100" is refused); a number
    JSON writes with a zero fraction (100.0) is the integer it equals, as JSON Schema's
    `integer` admits it; 100.5 is refused."""

    model_config = ConfigDict(strict=True)

    @model_validator(mode="before")
    @classmethod
    def _integral(cls, given: Any) -> Any:
        if not isinstance(given, dict):
            return given
        return {
            k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in given.items()
        }


class QuotasChange(StrictQuotas):
    """The quotas a PUT sets: at least one (the others keep their value)."""

    model_config = ConfigDict(strict=True, json_schema_extra={"minProperties": 1})


class TenantIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant_id: str = Field(pattern=TENANT_ID_PATTERN)
    quotas: StrictQuotas = StrictQuotas()


class PrincipalIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    principal_arn: str = Field(pattern=PRINCIPAL_ARN_PATTERN, max_length=2048)


TenantId = Annotated[str, Path(pattern=TENANT_ID_PATTERN)]


@router.post(
    "/v1/admin/tenants",
    summary="Operator: create a tenant",
    responses=answers(
        201,
        {400: "Invalid tenant_id or quotas", **_OPERATOR, 409: "The tenant exists already"},
        body=True,
    ),
    status_code=201,
)
def create_tenant(body: TenantIn) -> TenantOut:
    context.require_operator(router)
    return tenant_out(context.plane().create_tenant(body.tenant_id, body.quotas))


@router.get(
    "/v1/admin/tenants",
    summary="Operator: the tenants with their quotas and usage, a page at a time (in no "
    "particular order; a tenant made a moment ago may show only on the next listing)",
    responses=answers(errors={400: "Invalid limit or next_token", **_OPERATOR}),
)
def admin_list_tenants(limit: Limit = 50, next_token: Token = None) -> TenantListOut:
    context.require_operator(router)
    found, token = context.plane().tenants.list_tenants(limit=limit, token=next_token)
    return TenantListOut(tenants=[tenant_out(t) for t in found], next_token=token)


@router.get(
    "/v1/admin/tenants/<tenant_id>",
    summary="Operator: a tenant's quotas and usage",
    responses=answers(errors={400: "Invalid tenant_id", **_OPERATOR, 404: "No such tenant"}),
)
def admin_get_tenant(tenant_id: TenantId) -> TenantOut:
    context.require_operator(router)
    return tenant_out(context.plane().tenants.get(tenant_id))


@router.get(
    "/v1/admin/tenants/<tenant_id>/worker-policy",
    summary="Operator: the IAM policy for the role a tenant's workers run as",
    responses=answers(errors={400: "Invalid tenant_id", **_OPERATOR, 404: "No such tenant"}),
)
def admin_worker_policy(tenant_id: TenantId) -> WorkerPolicyOut:
    context.require_operator(router)
    plane = context.plane()
    plane.tenants.get(tenant_id)  # 404 for a tenant that does not exist
    return WorkerPolicyOut(policy=worker_policy(tenant_id, plane.settings))


@router.put(
    "/v1/admin/tenants/<tenant_id>/quotas",
    summary="Operator: set a tenant's quotas (those given; the others keep their value)",
    responses=answers(
        errors={
            400: "Invalid tenant_id or quotas, or no quota given",
            **_OPERATOR,
            404: "No such tenant",
        },
        body=True,
    ),
)
def set_quotas(tenant_id: TenantId, quotas: QuotasChange) -> TenantOut:
    context.require_operator(router)
    # Only what the body names: an empty body once reset every quota to its default.
    given = quotas.model_dump(include=quotas.model_fields_set)
    if not given:
        raise InvalidInput("no quota to set", [{"field": "(body)", "reason": "give a quota"}])
    tenants = context.plane().tenants
    tenants.set_quotas(tenant_id, tenants.get(tenant_id).quotas.model_copy(update=given))
    return tenant_out(tenants.get(tenant_id))


@router.post(
    "/v1/admin/tenants/<tenant_id>/principals",
    summary="Operator: bind a principal to a tenant",
    responses=answers(
        errors={
            400: "Invalid tenant_id or principal_arn",
            **_OPERATOR,
            404: "No such tenant",
            409: "The principal is bound to another tenant",
        },
        body=True,
    ),
)
def bind_principal(tenant_id: TenantId, body: PrincipalIn) -> TenantOut:
    context.require_operator(router)
    return tenant_out(context.plane().bind_principal(body.principal_arn, tenant_id))


class ReconcileReportsOut(BaseModel):
    window_start: str
    window_end: str
    missing: int = Field(
        description="Expected occurrences with no record, over the shards reported (0 when "
        "none is: see `reconciled`)."
    )
    unexpected: int = Field(description="Stored occurrences no schedule version owns.")
    reconciled: bool = Field(
        description="Every shard has a report of this window, each of a run that checked "
        "every schedule. False: the counts cover only `reports` (the window was not "
        "reconciled yet, or partly: the next hourly run checks it again)."
    )
    unreported_shards: list[int] = Field(
        description="Shards with no report of this window yet (not reconciled)."
    )
    reports: list[ReconcileReport]


@router.get(
    "/v1/admin/reconcile",
    summary="Operator: the reconciler's reports of one window (default: the last one; from "
    "or to alone: the hour after or before it)",
    responses=answers(errors={400: "Invalid from or to, or to not after from", **_OPERATOR}),
)
def reconcile_reports(
    window_start: Annotated[Instant | None, Query(alias="from")] = None,
    window_end: Annotated[Instant | None, Query(alias="to")] = None,
) -> ReconcileReportsOut:
    context.require_operator(router)
    services = context.services()
    # One bound alone names the hour after (from) or before (to) it; neither, the last one.
    start, end = default_window(int(services.now()))
    if window_start:
        start = to_epoch(window_start)
        end = to_epoch(window_end) if window_end else start + 3600
    elif window_end:
        end = to_epoch(window_end)
        start = end - 3600
    if end <= start:
        raise InvalidInput("to is not after from", [{"field": "to", "reason": "not after from"}])
    reports = read_reports(services, start, end)
    reported = {r.shard for r in reports}
    unreported = [n for n in range(services.settings.shard_count) if n not in reported]
    return ReconcileReportsOut(
        window_start=utc_text(start),
        window_end=utc_text(end),
        missing=sum(r.missing for r in reports),
        unexpected=sum(r.unexpected for r in reports),
        reconciled=not unreported and all(r.complete for r in reports),
        unreported_shards=unreported,
        reports=reports,
    )
