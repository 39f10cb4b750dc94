"""Domain records: Schedule, its timing spec and policies, Occurrence, Attempt.

Three records, never one: a Schedule says when things should happen (versioned),
an Occurrence is one definite instant of one schedule version, an Attempt is one
delivery/processing try of an occurrence.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Context, Decimal, DecimalException, Inexact, Rounded
from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    JsonValue,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from punctual.domain.ids import MAX_WINDOW_SECONDS
from punctual.timing import (
    Bounds,
    CronRule,
    OneShotRule,
    Preview,
    RateRule,
    ResolvedAt,
    Rule,
    get_zone,
    in_calendar,
    parse_cron_cached,
    parse_rate,
    preview,
    resolve_at,
    to_epoch,
)

MAX_PAYLOAD_BYTES = 32 * 1024
DEFAULT_CATCHUP_LIMIT = 10
# The payload is stored as a map in the occurrence item (DynamoDB nests at most 32 levels)
# and travels in every message: 16 levels is plenty and leaves the item room.
MAX_PAYLOAD_DEPTH = 16
# Numbers a payload can hold: what DynamoDB stores (at most 38 significant digits, boto3
# refusing to round more away; magnitude from 1e-130) and can be written again as read back.
# DynamoDB returns integral numbers as integers (1e40 comes back as 10**40), which boto3
# writes with all their digits: below 1e38 they fit in 38.
_DYNAMODB_DIGITS = Context(prec=38, traps=[Inexact, Rounded])
_NUMBER_MAGNITUDE = (Decimal("1e-130"), Decimal("1e38"))
# Target names become part of SQS queue names (80 characters, no dots): keep them short.
TARGET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _text_or_datetime(value: Any) -> Any:
    # Pydantic would read a number, or a string holding one, as seconds since the epoch.
    number = isinstance(value, int | float)
    if isinstance(value, str):
        try:
            float(value)
            number = True
        except ValueError:
            pass
    if number:
        raise ValueError("an instant is an ISO-8601 date-time with an offset, not a number")
    return value


def _in_calendar(moment: datetime) -> datetime:
    in_calendar(to_epoch(moment))
    return moment


Instant = Annotated[AwareDatetime, BeforeValidator(_text_or_datetime), AfterValidator(_in_calendar)]
"""An aware date-time within the calendar the time engine computes in."""


# A number is a number: no "60" or true where an integer is due.
def _whole(value: object) -> object:
    """A number JSON writes with a zero fraction (355.0) as the integer it equals: JSON
    Schema's `integer` admits it. 355.5, "355" and true stay refused (strict)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# (The Field before the validator: a constraint added where it is used then shows in the
# schema as minimum/maximum.)
StrictCount = Annotated[int, Field(strict=True), BeforeValidator(_whole)]


# --- timing specs -------------------------------------------------------------------


class _SpecBase(_Record):
    start_at: Instant | None = Field(
        default=None, description="No fire before this instant (inclusive)."
    )
    end_at: Instant | None = Field(
        default=None, description="No fire after this instant (inclusive)."
    )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        # ``kind`` tells the specs apart (the discriminator): an input must carry it, so
        # the schema says it is required, though a spec built in code has it by default.
        schema = handler.resolve_ref_schema(handler(core_schema))
        schema["required"] = ["kind", *(r for r in schema.get("required", []) if r != "kind")]
        return schema

    @model_validator(mode="after")
    def _bounds_in_order(self) -> Self:
        if self.start_at and self.end_at and self.end_at <= self.start_at:
            raise ValueError("end_at must be later than start_at")
        return self

    def bounds(self) -> Bounds:
        return Bounds(
            start=to_epoch(self.start_at) if self.start_at else None,
            end=to_epoch(self.end_at) if self.end_at else None,
        )


# The grammars JSON Schema cannot say, named as a string's "format" (an annotation: a
# client that knows the name can generate or check values; tests/integration/
# test_api_contract.py generates them).
CRON_FORMAT: dict[str, JsonValue] = {"format": "cron"}
RATE_FORMAT: dict[str, JsonValue] = {"format": "rate"}
ZONE_FORMAT: dict[str, JsonValue] = {"format": "iana-time-zone"}


def _check_zone(name: str) -> str:
    get_zone(name)  # ZoneError is a ValueError: pydantic reports it on the field
    return name


class CronSpec(_SpecBase):
    """Five-field cron (or a macro) evaluated on local wall time in an IANA zone."""

    kind: Literal["cron"] = "cron"
    expression: str = Field(
        examples=["30 9 * * mon-fri"],
        max_length=256,
        description="Five fields or a macro, as docs/time.md defines them.",
        json_schema_extra=CRON_FORMAT,
    )
    timezone: str = Field(examples=["Europe/Berlin"], max_length=64, json_schema_extra=ZONE_FORMAT)

    @field_validator("expression")
    @classmethod
    def _valid_expression(cls, value: str) -> str:
        parse_cron_cached(value)  # every schedule read validates it: parsed once
        return value

    _valid_zone = field_validator("timezone")(_check_zone)

    def rule(self) -> CronRule:
        return CronRule(parse_cron_cached(self.expression), get_zone(self.timezone), self.bounds())


class RateSpec(_SpecBase):
    """A fixed elapsed interval from an anchor instant, unaffected by DST."""

    kind: Literal["rate"] = "rate"
    expression: str = Field(
        examples=["rate(15 minutes)"],
        max_length=64,
        description="rate(N minute|minutes|hour|hours|day|days), N from 1 up to 366 days.",
        json_schema_extra=RATE_FORMAT,
    )
    anchor: Instant | None = Field(
        default=None,
        description="Fires are anchor + k * interval; defaults to start_at, else creation time.",
    )
    timezone: str = Field(
        default="UTC", description="Only for showing local times.", json_schema_extra=ZONE_FORMAT
    )

    @field_validator("expression")
    @classmethod
    def _valid_expression(cls, value: str) -> str:
        parse_rate(value)
        return value

    _valid_zone = field_validator("timezone")(_check_zone)

    def rule(self, created_at: datetime | None = None) -> RateRule:
        anchor = self.anchor or self.start_at or created_at
        if anchor is None:
            raise ValueError("a rate schedule needs an anchor, a start_at or a creation time")
        return RateRule(parse_rate(self.expression), to_epoch(anchor), self.bounds())


# A schedule's name: one line of text, something in it (no control character: a newline
# would break every listing that prints it).
SCHEDULE_NAME_PATTERN = r"^[^\x00-\x1f\x7f]*[^\s\x00-\x1f\x7f][^\x00-\x1f\x7f]*$"

# A date-time that names its offset (Z, +01:00, -0530): one an `at` without a zone needs.
_WITH_OFFSET = r"(Z|[+-][0-9]{2}(:?[0-9]{2})?)\s*$"


class AtSpec(_SpecBase):
    """One instant: ISO-8601 with an offset, or a local date-time read in ``timezone``."""

    model_config = ConfigDict(
        json_schema_extra={
            # What the validator below holds, said in the schema: a local date-time needs
            # a zone (schema-valid requests are then all accepted: issue 46).
            "anyOf": [
                {"required": ["timezone"], "properties": {"timezone": {"type": "string"}}},
                {"properties": {"at": {"pattern": _WITH_OFFSET}}},
            ],
            "examples": [
                {"kind": "at", "at": "2030-12-24T18:00:00", "timezone": "Europe/Berlin"},
                {"kind": "at", "at": "2030-12-24T17:00:00Z"},
            ],
        }
    )

    kind: Literal["at"] = "at"
    # Declared before ``at`` so that the ``at`` validator can read it.
    timezone: str | None = Field(default=None, max_length=64, json_schema_extra=ZONE_FORMAT)
    at: str = Field(
        description="An ISO-8601 date-time with its offset, or a local one read in timezone",
        examples=["2030-12-24T17:00:00Z", "2030-12-24T18:00:00+01:00"],
        max_length=64,
    )

    @field_validator("timezone")
    @classmethod
    def _valid_zone(cls, value: str | None) -> str | None:
        return None if value is None else _check_zone(value)

    @field_validator("at")
    @classmethod
    def _resolvable(cls, value: str, info: ValidationInfo) -> str:
        if "timezone" in info.data:  # else the zone already failed and is reported
            resolve_at(value, info.data["timezone"])
        return value

    def resolved(self) -> ResolvedAt:
        return resolve_at(self.at, self.timezone)

    def rule(self) -> OneShotRule:
        return OneShotRule(self.resolved().instant, self.bounds())


ScheduleSpec = Annotated[CronSpec | RateSpec | AtSpec, Field(discriminator="kind")]


def preview_fires(spec: CronSpec | RateSpec | AtSpec, after: int, count: int) -> Preview:
    """A spec's first ``count`` fires after ``after``, shown in its zone, with what a reader
    should know (an ambiguous one-shot's resolution, DST dates); a rate without an anchor or
    start_at counts from ``after``. The API's and the CLI's preview."""
    if isinstance(spec, RateSpec):
        rule: Rule = spec.rule(datetime.fromtimestamp(after, UTC))
    else:
        rule = spec.rule()
    resolution = spec.resolved().note if isinstance(spec, AtSpec) else None
    result = preview(rule, after, count, get_zone(spec.timezone or "UTC"))
    result.notes[:0] = [resolution] if resolution else []
    return result


# --- policies -----------------------------------------------------------------------


class MisfireAction(StrEnum):
    SKIP = "SKIP"  # record MISSED, fire nothing
    FIRE_ONCE = "FIRE_ONCE"  # fire only the latest missed instant
    CATCHUP = "CATCHUP"  # fire at most catchup_limit latest instants, paced


class MisfirePolicy(_Record):
    model_config = ConfigDict(
        json_schema_extra={
            # What the validator below holds, said in the schema: a catchup_limit only with
            # action CATCHUP (schema-valid requests are then all accepted: issue 46).
            "anyOf": [
                {"properties": {"catchup_limit": {"type": "null"}}},
                {"required": ["action"], "properties": {"action": {"const": "CATCHUP"}}},
            ]
        }
    )

    action: MisfireAction = MisfireAction.FIRE_ONCE
    max_lateness_seconds: StrictCount = Field(
        default=300, ge=0, le=7 * 86400, description="Later than this counts as a misfire."
    )
    catchup_limit: (
        Annotated[int, Field(strict=True, ge=1, le=1000), BeforeValidator(_whole)] | None
    ) = Field(default=None, description="Only for CATCHUP; default 10.")

    @model_validator(mode="after")
    def _limit_only_for_catchup(self) -> Self:
        if self.catchup_limit is not None and self.action is not MisfireAction.CATCHUP:
            raise ValueError("catchup_limit applies only when action is CATCHUP")
        return self

    @property
    def effective_catchup_limit(self) -> int:
        """How many of the latest missed fires CATCHUP fires (1 for FIRE_ONCE, 0 for SKIP)."""
        if self.action is MisfireAction.CATCHUP:
            return self.catchup_limit or DEFAULT_CATCHUP_LIMIT
        return 1 if self.action is MisfireAction.FIRE_ONCE else 0


class OverlapPolicy(StrEnum):
    """What an occurrence does while an earlier one of its schedule runs: run anyway; be
    SKIPPED_OVERLAP; or wait for it, one at a time (a later one that finds another already
    waiting is SKIPPED_OVERLAP)."""

    ALLOW = "ALLOW"
    SKIP_IF_RUNNING = "SKIP_IF_RUNNING"
    QUEUE_ONE = "QUEUE_ONE"


class RetryPolicy(_Record):
    """Transient failures back off exponentially with full jitter within these bounds."""

    # At most 20, below the target queue's redrive count (25): see integrations/queues.py.
    max_attempts: StrictCount = Field(default=3, ge=1, le=20)
    backoff_base_seconds: StrictCount = Field(default=10, ge=1, le=3600)
    backoff_max_seconds: StrictCount = Field(default=900, ge=1, le=43200)
    deadline_seconds: StrictCount = Field(
        default=86400,
        ge=60,
        le=14 * 86400,
        description="No attempt starts later than available_at + deadline (when the "
        "occurrence became receivable: a late fire released by the misfire policy counts "
        "from its release).",
    )

    @model_validator(mode="after")
    def _base_below_max(self) -> Self:
        if self.backoff_base_seconds > self.backoff_max_seconds:
            raise ValueError("backoff_base_seconds must not exceed backoff_max_seconds")
        return self


# --- schedule -----------------------------------------------------------------------


def _storable(payload: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """The payload if DynamoDB can store it and it fits; else ValueError naming the first
    part that cannot: nesting deeper than MAX_PAYLOAD_DEPTH, an empty key, a number it
    cannot hold. Iterative, so that no nesting makes it recurse."""
    pending: list[tuple[str, JsonValue, int]] = [("payload", payload, 1)]
    while pending:
        path, value, depth = pending.pop()
        if isinstance(value, dict | list):
            if depth > MAX_PAYLOAD_DEPTH:
                raise ValueError(f"{path} nests deeper than {MAX_PAYLOAD_DEPTH} levels")
            if isinstance(value, dict) and "" in value:
                raise ValueError(f"{path} has an empty key")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            pending.extend((f"{path}.{key}", item, depth + 1) for key, item in items)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            _check_number(path, value)
    size = len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    if size > MAX_PAYLOAD_BYTES:
        raise ValueError(f"payload is {size} bytes; at most {MAX_PAYLOAD_BYTES} allowed")
    return payload


def _check_number(path: str, value: float) -> None:
    problem = ValueError(
        f"{path}: {value!r} is not a number a payload can hold (at most 38 significant "
        "digits, magnitude 1e-130 to below 1e38)"
    )
    if isinstance(value, float) and not math.isfinite(value):
        raise problem
    number = Decimal(repr(value))
    low, high = _NUMBER_MAGNITUDE
    if number and not low <= number.copy_abs() < high:  # abs() would round to 28 digits
        raise problem
    try:
        _DYNAMODB_DIGITS.create_decimal(number)
    except DecimalException:
        raise problem from None


Payload = Annotated[dict[str, JsonValue], AfterValidator(_storable)]
PAYLOAD_RULES = (
    f"Any JSON object DynamoDB can store: at most {MAX_PAYLOAD_BYTES} bytes as compact "
    f"UTF-8 JSON, nested at most {MAX_PAYLOAD_DEPTH} levels, no empty key, numbers of at most "
    "38 significant digits with a magnitude from 1e-130 to below 1e38 (or 0)."
)
WindowSeconds = Annotated[
    int, Field(strict=True, ge=0, le=MAX_WINDOW_SECONDS), BeforeValidator(_whole)
]
"""A payload as a tenant writes it: stored with the schedule and each occurrence."""


class ScheduleState(StrEnum):
    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    CANCELED = "CANCELED"
    COMPLETED = "COMPLETED"  # no fire left (one-shot done, end_at passed)


# A schedule's states in one table, as the occurrence's TRANSITIONS below: every move and
# the states it may start from (each a conditional write from the state read), and what
# each state means for quota and fires. The API, the materializer, the reconciler, the
# worker and the store's conditions read these, not sets of their own.
@dataclass(frozen=True, slots=True)
class ScheduleMove:
    to: ScheduleState
    allowed_from: frozenset[ScheduleState]


_S = ScheduleState
SCHEDULE_MOVES: dict[str, ScheduleMove] = {
    "pause": ScheduleMove(_S.PAUSED, frozenset({_S.ACTIVE})),
    # The next fire is strictly after the resume: the paused period is not caught up.
    "resume": ScheduleMove(_S.ACTIVE, frozenset({_S.PAUSED})),
    "cancel": ScheduleMove(_S.CANCELED, frozenset({_S.ACTIVE, _S.PAUSED, _S.COMPLETED})),
    # An update keeps a PAUSED schedule paused, and makes any other ACTIVE (a COMPLETED one
    # given fires again).
    "update": ScheduleMove(_S.ACTIVE, frozenset({_S.ACTIVE, _S.PAUSED, _S.COMPLETED})),
    # The materializer's, when no fire is left: no new version.
    "complete": ScheduleMove(_S.COMPLETED, frozenset({_S.ACTIVE})),
}
# Counted in the tenant's usage (max_schedules, the strict fires of each minute).
HOLDS_QUOTA = frozenset({_S.ACTIVE, _S.PAUSED})
# Owns its fires: the reconciler expects them and the worker runs them (a COMPLETED
# schedule's last fires still run).
OWNS_FIRES = frozenset({_S.ACTIVE, _S.COMPLETED})


class ScheduleDefinition(_Record):
    """What a tenant writes: when, where to, what, and how to behave when things go wrong."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "name": "nightly report",
                    "spec": {
                        "kind": "cron",
                        "expression": "30 2 * * *",
                        "timezone": "Europe/Berlin",
                    },
                    "target": "default",
                    "payload": {"report": "daily"},
                },
                {
                    "spec": {"kind": "rate", "expression": "rate(15 minutes)"},
                    "target": "default",
                    "flexible_window_seconds": 300,
                    "misfire": {"action": "CATCHUP", "catchup_limit": 3},
                },
                {
                    "spec": {"kind": "at", "at": "2030-01-15T09:00:00", "timezone": "Asia/Tokyo"},
                    "target": "default",
                    "retry": {"max_attempts": 5},
                },
            ]
        }
    )

    name: str | None = Field(
        default=None,
        max_length=128,
        pattern=SCHEDULE_NAME_PATTERN,
        description="A label for people: one line, not blank (null: none).",
    )
    spec: ScheduleSpec
    target: str = Field(
        pattern=TARGET_NAME_PATTERN,
        description="Name of one of the tenant's targets.",
        examples=["default"],
    )
    payload: Payload = Field(default_factory=dict, description=PAYLOAD_RULES)
    flexible_window_seconds: WindowSeconds = Field(
        default=0,
        description="0 = strict; otherwise fires spread deterministically over this window.",
    )
    misfire: MisfirePolicy = MisfirePolicy()
    overlap: OverlapPolicy = OverlapPolicy.ALLOW
    retry: RetryPolicy = RetryPolicy()

    @property
    def strict(self) -> bool:
        return self.flexible_window_seconds == 0


class MissedEpisode(BaseModel):
    """One misfire episode: fires of one version that the misfire policy recorded MISSED
    (none of them became an occurrence), from the earliest to the latest one."""

    model_config = ConfigDict(frozen=True)

    version: int
    first: int  # scheduled_for of the earliest and the latest one
    last: int
    count: int

    def covers(self, version: int, scheduled_for: int) -> bool:
        return version == self.version and self.first <= scheduled_for <= self.last


class PayloadNotRead(RuntimeError):
    """A schedule read from its CURRENT item or an index, whose payload (kept only in its
    version item) was not read, used where the payload is needed: never as an empty one."""


class Schedule(ScheduleDefinition):
    # As stored: judged by the input rules when it was written, not again on every read.
    # None: not read. The CURRENT item and the indexes do not carry a payload (it lives in the
    # version item, docs/data-model.md): a schedule read from them has None until
    # ``ScheduleStore.with_payloads`` reads it, and ``known_payload`` refuses it before then.
    # (Wider than a definition's on purpose: code that takes a schedule's payload as a dict
    # must say it was read, so mypy flags every ``schedule.payload`` used as one.)
    payload: dict[str, JsonValue] | None = Field(default_factory=dict)  # type: ignore[assignment]
    tenant_id: str
    schedule_id: str
    version: int = Field(ge=1)
    # A rename's (``run_version``): the version its fires belong to and when that one took
    # effect. None: its own version, from ``updated_at``.
    runs_as: int | None = Field(default=None, ge=1)
    runs_from: int | None = None
    state: ScheduleState = ScheduleState.ACTIVE
    created_at: AwareDatetime
    updated_at: AwareDatetime
    # The cursor (punctual.domain.planning): every fire due (available) by planned_until is
    # handled; the next fire not handled yet, and the soonest one of them to be due.
    planned_until: int | None = None
    next_run_at: int | None = None
    next_available_at: int | None = None
    # The materializer's misfire record, kept across versions: every fire recorded MISSED,
    # and the latest episodes (older ones are only counted).
    missed_total: int = 0
    missed: list[MissedEpisode] = Field(default_factory=list)
    # Multi-region (docs/multi-region.md): the region whose materializer plans it, and the
    # generation a take-over by another region increments; the materializer's step and the
    # API's writes are fenced by both. None: written before regions were recorded (the
    # region it was made in plans it; a take-over writes both).
    home_region: str | None = None
    generation: int = Field(default=1, ge=1)
    # Fires due by this instant were the region's it was taken over from (its occurrences
    # are in that region's table): not this region's to find missing, repair or backfill.
    homed_since: int | None = None
    # Time zone rules (docs/time.md, *When the rules change*): the tzdata release its cursor
    # and occurrences were planned with (None: not zone-based, or written before it was).
    tzdata_version: str | None = None

    @property
    def run_version(self) -> int:
        """The version its fires belong to (their occurrence ids, a worker's staleness check,
        the reconciler's ownership): the latest version that changed when or what runs. A
        change that does not (a new name) makes a version and keeps this one, so it cancels
        nothing."""
        return self.version if self.runs_as is None else self.runs_as

    @property
    def run_from(self) -> int:
        """When the run version took effect."""
        return int(self.updated_at.timestamp()) if self.runs_from is None else self.runs_from

    @property
    def known_payload(self) -> dict[str, JsonValue]:
        """The payload, for what puts an occurrence or writes the schedule again;
        PayloadNotRead when it was not read (a message must never carry an empty payload
        in place of the schedule's)."""
        if self.payload is None:
            raise PayloadNotRead(
                f"schedule {self.schedule_id} version {self.version}: its payload was not read"
            )
        return self.payload

    @property
    def zone_name(self) -> str | None:
        """The zone whose rules place its fires: a cron's, a one-shot's local time's; None
        for a rate or a one-shot written with an offset."""
        if isinstance(self.spec, CronSpec | AtSpec):
            return self.spec.timezone
        return None

    @property
    def fires_after(self) -> int:
        """Its run version owns the fires strictly after this instant: the first version from
        its creation instant on (a rate anchored there fires at once), a later one strictly
        after the change (a resumed schedule does not catch up its paused time)."""
        return self.run_from - (1 if self.run_version == 1 else 0)

    def rule(self) -> Rule:
        if isinstance(self.spec, RateSpec):
            return self.spec.rule(self.created_at)
        return self.spec.rule()


# --- occurrence and attempt ---------------------------------------------------------


class OccurrenceState(StrEnum):
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    RETRY_WAIT = "RETRY_WAIT"
    SUCCEEDED = "SUCCEEDED"
    DEAD = "DEAD"
    MISSED = "MISSED"
    CANCELED = "CANCELED"
    SKIPPED_OVERLAP = "SKIPPED_OVERLAP"


class Lane(StrEnum):
    """Which relay delivers an occurrence; an occurrence without one goes in the on-time lane.

    CATCHUP: a fire made after its time (a misfire's catch-up, a reconciler's repair, a
    backfill). Its stream record is read by a relay of its own (its own event source
    mapping, with bounded concurrency), so a catch-up of any size never queues ahead of
    fires due now (docs/operations.md, *Catch-up lane*)."""

    CATCHUP = "CATCHUP"


# Every allowed move. Each is carried out as a conditional write from the expected state.
TRANSITIONS: dict[OccurrenceState, frozenset[OccurrenceState]] = {
    # SCHEDULED covers "sent and waiting in the queue": the relay does not mark the send
    # (one write unit per occurrence saved, docs/decisions.md 2026-11-30); the worker's claim
    # moves it on and records enqueued_at from the message's SentTimestamp.
    OccurrenceState.SCHEDULED: frozenset(
        {
            OccurrenceState.RUNNING,
            OccurrenceState.SKIPPED_OVERLAP,
            OccurrenceState.CANCELED,
            OccurrenceState.MISSED,
            OccurrenceState.DEAD,
        }
    ),
    # RUNNING -> RUNNING: another worker takes over an expired lease (new token).
    # RUNNING -> SKIPPED_OVERLAP: an abandoned run (lease expired) whose schedule's run slot
    # another occurrence took meanwhile.
    OccurrenceState.RUNNING: frozenset(
        {
            OccurrenceState.RUNNING,
            OccurrenceState.SUCCEEDED,
            OccurrenceState.RETRY_WAIT,
            OccurrenceState.DEAD,
            OccurrenceState.CANCELED,
            OccurrenceState.SKIPPED_OVERLAP,
        }
    ),
    OccurrenceState.RETRY_WAIT: frozenset(
        {
            OccurrenceState.RUNNING,
            OccurrenceState.CANCELED,
            OccurrenceState.SKIPPED_OVERLAP,
            OccurrenceState.DEAD,
        }
    ),
    OccurrenceState.SUCCEEDED: frozenset(),
    OccurrenceState.DEAD: frozenset(),
    OccurrenceState.MISSED: frozenset(),
    OccurrenceState.CANCELED: frozenset(),
    OccurrenceState.SKIPPED_OVERLAP: frozenset(),
}
TERMINAL = frozenset(state for state, moves in TRANSITIONS.items() if not moves)


def can_transition(current: OccurrenceState, target: OccurrenceState) -> bool:
    return target in TRANSITIONS[current]


class Occurrence(_Record):
    occurrence_id: str
    tenant_id: str
    schedule_id: str
    schedule_version: int = Field(ge=1)
    scheduled_for: int = Field(description="Epoch seconds, UTC.")
    available_at: int = Field(description="scheduled_for plus the deterministic jitter.")
    target: str
    state: OccurrenceState = OccurrenceState.SCHEDULED
    attempt_count: int = Field(default=0, ge=0)
    lease_token: str | None = None
    lease_expires_at: int | None = None
    enqueued_at: int | None = Field(
        default=None,
        description="When the relay sent its message (SQS SentTimestamp), recorded by the "
        "worker's first claim.",
    )
    reason: str | None = Field(default=None, description="Why it is DEAD, MISSED or CANCELED.")
    expires_at: int | None = Field(default=None, description="TTL: when retention ends.")
    local: str | None = Field(
        default=None,
        description="The fire's local wall time in its schedule's zone, as planned (a "
        "zone-based schedule's): what a change of the zone's rules keeps.",
    )
    lane: Lane | None = Field(
        default=None, description="CATCHUP: made after its time, relayed in the catch-up lane."
    )


class AttemptOutcome(StrEnum):
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    RETRY = "RETRY"  # transient failure, another attempt follows
    DEAD = "DEAD"  # permanent failure or retries exhausted
    LOST = "LOST"  # the lease expired and another worker took over


class Attempt(_Record):
    occurrence_id: str
    attempt_no: int = Field(ge=1)
    started_at: int
    lease_expires_at: int
    finished_at: int | None = None
    outcome: AttemptOutcome = AttemptOutcome.RUNNING
    error: str | None = None


# --- validation errors --------------------------------------------------------------

_UNION_TAGS = frozenset({"cron", "rate", "at"})
# Where API Gateway request errors come from; the field path starts after it.
_REQUEST_PARTS = frozenset({"body", "query", "path", "header"})


_SCHEMA_STEP = re.compile(r"^[a-z-]+\[.*\]$")


def field_errors(errors: ValidationError | Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Pydantic errors as [{'field': 'spec.expression', 'reason': '...'}], one per problem."""
    items = errors.errors(include_url=False) if isinstance(errors, ValidationError) else errors
    result = []
    for item in items:
        if item.get("type") == "none_required":
            continue  # an optional field's null branch: its value was not null, said below
        # (A request validated field by field names the schema steps of a union in its
        # path: "retry.function-after[_base_below_max(), RetryPolicy]". Not fields: dropped.)
        loc = [part for part in item["loc"] if not _SCHEMA_STEP.match(str(part))]
        if loc and loc[0] in _REQUEST_PARTS:
            loc = loc[1:]
        reason = str(item["msg"]).removeprefix("Value error, ")
        if item.get("type") == "json_invalid":
            loc = []  # its location is a character position in the body, not a field
            reason = f"not valid JSON: {item.get('ctx', {}).get('error', 'unreadable')}"
        # A discriminated union puts its tag after the field ('spec', 'cron', ...): drop it.
        parts = [
            str(part)
            for i, part in enumerate(loc)
            if not (i > 0 and loc[i - 1] == "spec" and part in _UNION_TAGS)
        ]
        result.append({"field": ".".join(parts) or "(body)", "reason": reason})
    return result


# --- the reconciler's findings ----------------------------------------------------------


class Finding(StrEnum):
    """What the reconciler concluded about one instant or one stored occurrence."""

    SUCCEEDED = "SUCCEEDED"
    DEAD = "DEAD"
    CANCELED = "CANCELED"
    MISSED = "MISSED"  # by the misfire policy: a MISSED item or the materializer's summary
    SKIPPED_OVERLAP = "SKIPPED_OVERLAP"
    IN_FLIGHT = "IN_FLIGHT"  # SCHEDULED, RUNNING, RETRY_WAIT
    MISSING = "MISSING"  # expected, and no record of it at all
    UNEXPECTED = "UNEXPECTED"  # stored, and no version owns it
    SUPERSEDED = "SUPERSEDED"  # stored ahead of time, then a newer version took over


class ReconcileReport(BaseModel):
    """The summary of one reconcile run over one shard and one window."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    shard: int
    window_start: int
    window_end: int
    run_at: int
    complete: bool  # False: the run ran out of time before the last schedule
    repair: bool
    schedules: int  # schedules whose occurrences were read (not dormant or idle)
    counts: dict[Finding, int]
    examples: dict[Finding, list[str]]  # up to EXAMPLES occurrence ids per class
    repaired_fired: int  # MISSING ones materialized to fire now
    repaired_missed: int  # MISSING ones recorded MISSED (policy, or a superseded version)
    deferred: int  # MISSING ones the materializer has not passed yet: left to it
    repair_conflicts: int  # MISSING ones whose repair lost a race twice: next run
    cursors_moved: int = 0  # schedules left in a due bucket the walk had passed, moved ahead
    redriven: int = 0  # open occurrences no worker took long after they were due: re-sent
    replanned: int = 0  # schedules planned under older zone rules, re-planned (rezone.py)
    # Items not judged: not occurrences Punctual wrote (a tenant's bad data, docs/security.md)
    malformed: int = 0

    @property
    def missing(self) -> int:
        return self.counts.get(Finding.MISSING, 0)

    @property
    def settled(self) -> bool:
        """Nothing in the window needs another look: fully checked, every gap repaired, none
        left to the materializer, none in flight. A later loss (a message lost after the
        send, a materializer that never makes a deferred fire because the version changed)
        can only happen to what is still open, so a window stays unsettled, and a scheduled
        run checks it again (and re-drives what became overdue), until all of it is done."""
        return (
            self.complete
            and self.deferred == 0
            and self.repair_conflicts == 0
            and self.repaired_fired == 0  # (made just now: in flight, not yet delivered)
            and self.missing == self.repaired_missed
            and self.counts.get(Finding.IN_FLIGHT, 0) == 0
        )

    @property
    def unexpected(self) -> int:
        return self.counts.get(Finding.UNEXPECTED, 0)
