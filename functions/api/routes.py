"""Routes under /v1: parse, call the control plane once, shape the answer."""

from datetime import datetime
from typing import Annotated, Any

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Header, Path, Query
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from api import context
from api.views import (
    ErrorOut,
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
    TenantOut,
    fires_out,
    occurrence_detail_out,
    occurrence_out,
    saved_out,
    schedule_out,
    target_out,
    tenant_out,
)
from punctual.errors import InvalidInput, PreconditionRequired
from punctual.models import (
    AtSpec,
    MisfirePolicy,
    OverlapPolicy,
    RateSpec,
    RetryPolicy,
    ScheduleDefinition,
    ScheduleSpec,
    ScheduleState,
)
from punctual.observability import logger
from punctual.reconciler import ReconcileReport, default_window, read_reports
from punctual.tenancy import TENANT_ID_PATTERN, Quotas
from punctual.timing import get_zone, preview, to_epoch, tzdata_version, utc_text

router = Router()


def answers(success: int = 200) -> dict[int, OpenAPIResponse]:
    """The success answer (schema from the return type) and every error answer."""
    return {success: {"description": "Created" if success == 201 else "OK"}, **_ERRORS}


_ERROR_CONTENT: OpenAPIResponse = {
    "description": "The one error shape: code, message, fields (field and reason), details",
    "content": {"application/json": {"model": ErrorOut}},
}
_ERRORS: dict[int, OpenAPIResponse] = {
    status: {**_ERROR_CONTENT, "description": f"{meaning}. {_ERROR_CONTENT['description']}"}
    for status, meaning in [
        (400, "Invalid input"),
        (403, "Not signed, unknown principal, or not an operator"),
        (404, "No such record for this tenant"),
        (409, "Conflict: stale version, duplicate, or wrong state"),
        (428, "If-Match missing"),
        (429, "Over quota"),
    ]
}

Limit = Annotated[int, Query(ge=1, le=100)]
Token = Annotated[str | None, Query(max_length=2048)]
ScheduleId = Annotated[str, Path(max_length=64)]


def _tenant() -> str:
    tenant = context.caller_tenant(router)
    logger.append_keys(tenant_id=tenant)
    return tenant


# --- schedules ------------------------------------------------------------------------


@router.post("/v1/schedules", summary="Create a schedule", responses=answers(201), status_code=201)
def create_schedule(
    definition: ScheduleDefinition,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=128)] = None,
) -> SavedOut:
    tenant = _tenant()
    if idempotency_key is None:
        return saved_out(context.plane().create(tenant, definition))
    request = {
        "key": f"{tenant}#{idempotency_key}",
        "tenant": tenant,
        "body": definition.model_dump(mode="json", exclude_unset=True),
    }
    return SavedOut.model_validate(context.idempotent_create()(request=request))


@router.get("/v1/schedules", summary="List the tenant's schedules", responses=answers())
def list_schedules(
    state: Annotated[ScheduleState | None, Query()] = None,
    limit: Limit = 50,
    next_token: Token = None,
) -> ScheduleListOut:
    plane = context.plane()
    found, token = plane.list_schedules(_tenant(), state=state, limit=limit, token=next_token)
    return ScheduleListOut(schedules=[schedule_out(s) for s in found], next_token=token)


@router.get(
    "/v1/schedules/<schedule_id>", summary="Get a schedule and its next fires", responses=answers()
)
def get_schedule(schedule_id: ScheduleId) -> ScheduleDetailOut:
    plane = context.plane()
    schedule = plane.get(_tenant(), schedule_id)
    fires = plane.next_fires(schedule)
    return ScheduleDetailOut(
        schedule=schedule_out(schedule), next_fires=fires_out(fires), notes=fires.notes
    )


class SchedulePatch(BaseModel):
    """Fields to change; each replaces the current value whole (``spec`` included)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, max_length=128)
    spec: ScheduleSpec | None = None
    target: str | None = None
    payload: dict[str, Any] | None = None
    flexible_window_seconds: int | None = None
    misfire: MisfirePolicy | None = None
    overlap: OverlapPolicy | None = None
    retry: RetryPolicy | None = None


def _version(if_match: str | None) -> int:
    if if_match is None:
        raise PreconditionRequired("If-Match with the schedule's current version is required")
    text = if_match.strip().removeprefix("W/").strip('"')
    if not text.isascii() or not text.isdigit():
        raise InvalidInput(
            "If-Match must be the schedule's version number",
            [{"field": "If-Match", "reason": f"{if_match!r} is not a version number"}],
        )
    return int(text)


@router.patch(
    "/v1/schedules/<schedule_id>", summary="Update a schedule (a new version)", responses=answers()
)
def update_schedule(
    schedule_id: ScheduleId,
    patch: SchedulePatch,
    if_match: Annotated[str | None, Header(alias="If-Match", max_length=32)] = None,
) -> SavedOut:
    version = _version(if_match)
    changes = patch.model_dump(mode="json", exclude_unset=True)
    saved = context.plane().update(_tenant(), schedule_id, if_match=version, changes=changes)
    return saved_out(saved)


@router.post(
    "/v1/schedules/<schedule_id>/pause",
    summary="Pause: no fires until resumed",
    responses=answers(),
)
def pause_schedule(schedule_id: ScheduleId) -> SavedOut:
    return saved_out(context.plane().pause(_tenant(), schedule_id))


@router.post(
    "/v1/schedules/<schedule_id>/resume", summary="Resume: next fire after now", responses=answers()
)
def resume_schedule(schedule_id: ScheduleId) -> SavedOut:
    return saved_out(context.plane().resume(_tenant(), schedule_id))


@router.delete(
    "/v1/schedules/<schedule_id>",
    summary="Cancel (stays readable as CANCELED)",
    responses=answers(),
)
def cancel_schedule(schedule_id: ScheduleId) -> SavedOut:
    return saved_out(context.plane().cancel(_tenant(), schedule_id))


# --- occurrences ----------------------------------------------------------------------


def _instant(value: datetime | None, default: int) -> int:
    return default if value is None else to_epoch(value)


@router.get(
    "/v1/schedules/<schedule_id>/occurrences",
    summary="A schedule's occurrences",
    responses=answers(),
)
def list_occurrences(
    schedule_id: ScheduleId,
    since: Annotated[AwareDatetime | None, Query(alias="from")] = None,
    until: Annotated[AwareDatetime | None, Query(alias="to")] = None,
    limit: Limit = 50,
    next_token: Token = None,
) -> OccurrenceListOut:
    low = _instant(since, 0)
    high = _instant(until, 2**53)
    if high < low:
        raise InvalidInput("to is before from", [{"field": "to", "reason": "before from"}])
    found, token = context.plane().list_occurrences(
        _tenant(), schedule_id, since=low, until=high, limit=limit, token=next_token
    )
    return OccurrenceListOut(
        occurrences=[OccurrenceOut(**occurrence_out(o)) for o in found], next_token=token
    )


@router.get(
    "/v1/occurrences/<occurrence_id>",
    summary="One occurrence with its attempts",
    responses=answers(),
)
def get_occurrence(occurrence_id: Annotated[str, Path(max_length=64)]) -> OccurrenceDetailOut:
    occurrence, attempts = context.plane().occurrence(_tenant(), occurrence_id)
    return occurrence_detail_out(occurrence, attempts)


# --- preview, targets, tenant, meta ---------------------------------------------------


class PreviewIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: ScheduleSpec
    count: int = Field(default=10, ge=1, le=100)
    after: AwareDatetime | None = Field(default=None, description="Default: now.")


@router.post("/v1/preview", summary="Next fires of a spec, nothing saved", responses=answers())
def preview_spec(body: PreviewIn) -> PreviewOut:
    _tenant()
    after = _instant(body.after, int(context.services().now()))
    spec = body.spec
    notes: list[str] = []
    if isinstance(spec, RateSpec):
        rule: Any = spec.rule(datetime.fromtimestamp(after).astimezone())
    else:
        rule = spec.rule()
        if isinstance(spec, AtSpec) and spec.resolved().note:
            notes.append(str(spec.resolved().note))
    result = preview(rule, after, body.count, get_zone(spec.timezone or "UTC"))
    return PreviewOut(fires=fires_out(result), notes=notes + result.notes)


@router.post(
    "/v1/targets",
    summary="Create a target: an SQS queue with its DLQ",
    responses=answers(201),
    status_code=201,
)
def create_target(body: TargetIn) -> TargetOut:
    return target_out(context.plane().create_target(_tenant(), body.name))


@router.get("/v1/targets", summary="The tenant's targets", responses=answers())
def list_targets() -> TargetListOut:
    targets = context.plane().tenants.list_targets(_tenant())
    return TargetListOut(targets=[target_out(t) for t in targets])


@router.get("/v1/tenant", summary="The caller's tenant: quotas and usage", responses=answers())
def get_tenant() -> TenantOut:
    return tenant_out(context.plane().tenants.get(_tenant()))


@router.get(
    "/v1/meta", summary="Service version and the time zone rules in use", responses=answers()
)
def meta() -> MetaOut:
    return MetaOut(version=context.services().settings.version, tzdata=tzdata_version())


# --- operators ------------------------------------------------------------------------


class TenantIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant_id: str = Field(pattern=TENANT_ID_PATTERN)
    quotas: Quotas = Quotas()


class PrincipalIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    principal_arn: str = Field(pattern=r"^arn:aws[a-z-]*:(iam|sts)::\d{12}:.+$", max_length=2048)


TenantId = Annotated[str, Path(pattern=TENANT_ID_PATTERN)]


@router.post(
    "/v1/admin/tenants",
    summary="Operator: create a tenant",
    responses=answers(201),
    status_code=201,
)
def create_tenant(body: TenantIn) -> TenantOut:
    context.require_operator(router)
    return tenant_out(context.plane().create_tenant(body.tenant_id, body.quotas))


@router.get(
    "/v1/admin/tenants/<tenant_id>",
    summary="Operator: a tenant's quotas and usage",
    responses=answers(),
)
def admin_get_tenant(tenant_id: TenantId) -> TenantOut:
    context.require_operator(router)
    return tenant_out(context.plane().tenants.get(tenant_id))


@router.put(
    "/v1/admin/tenants/<tenant_id>/quotas",
    summary="Operator: set a tenant's quotas",
    responses=answers(),
)
def set_quotas(tenant_id: TenantId, quotas: Quotas) -> TenantOut:
    context.require_operator(router)
    tenants = context.plane().tenants
    tenants.set_quotas(tenant_id, quotas)
    return tenant_out(tenants.get(tenant_id))


@router.post(
    "/v1/admin/tenants/<tenant_id>/principals",
    summary="Operator: bind a principal to a tenant",
    responses=answers(),
)
def bind_principal(tenant_id: TenantId, body: PrincipalIn) -> TenantOut:
    context.require_operator(router)
    return tenant_out(context.plane().bind_principal(body.principal_arn, tenant_id))


class ReconcileReportsOut(BaseModel):
    window_start: str
    window_end: str
    missing: int = Field(description="Expected occurrences with no record, over the shards.")
    unexpected: int = Field(description="Stored occurrences no schedule version owns.")
    reports: list[ReconcileReport]


@router.get(
    "/v1/admin/reconcile",
    summary="Operator: the reconciler's reports of one window (default: the last one)",
    responses=answers(),
)
def reconcile_reports(
    window_start: Annotated[AwareDatetime | None, Query(alias="from")] = None,
    window_end: Annotated[AwareDatetime | None, Query(alias="to")] = None,
) -> ReconcileReportsOut:
    context.require_operator(router)
    services = context.services()
    default_start, default_end = default_window(int(services.now()))
    start = to_epoch(window_start) if window_start else default_start
    end = to_epoch(window_end) if window_end else (start + 3600 if window_start else default_end)
    if end <= start:
        raise InvalidInput("to is not after from", [{"field": "to", "reason": "not after from"}])
    reports = read_reports(services, start, end)
    return ReconcileReportsOut(
        window_start=utc_text(start),
        window_end=utc_text(end),
        missing=sum(r.missing for r in reports),
        unexpected=sum(r.unexpected for r in reports),
        reports=reports,
    )
