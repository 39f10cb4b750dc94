"""A schedule: its definition, its states and the moves between them, its payload."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from decimal import Context, Decimal, DecimalException, Inexact, Rounded
from enum import StrEnum
from typing import Annotated

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
)

from punctual.domain.fields import Record, whole
from punctual.domain.ids import MAX_WINDOW_SECONDS
from punctual.domain.policies import MisfirePolicy, OverlapPolicy, RetryPolicy
from punctual.domain.specs import AtSpec, CronSpec, RateSpec, ScheduleSpec, dst_policy
from punctual.timing import DstPolicy, Rule

MAX_PAYLOAD_BYTES = 32 * 1024
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


# A schedule's name: one line of text, something in it (no control character: a newline
# would break every listing that prints it).
SCHEDULE_NAME_PATTERN = r"^[^\x00-\x1f\x7f]*[^\s\x00-\x1f\x7f][^\x00-\x1f\x7f]*$"


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
    int, Field(strict=True, ge=0, le=MAX_WINDOW_SECONDS), BeforeValidator(whole)
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


class ScheduleDefinition(Record):
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

    @property
    def dst(self) -> DstPolicy:
        """What its wall times do where the zone's clocks skip or repeat them (the defaults
        for a rate, whose fires no wall time places)."""
        return dst_policy(self.spec.dst)

    def rule(self) -> Rule:
        if isinstance(self.spec, RateSpec):
            return self.spec.rule(self.created_at)
        return self.spec.rule()
