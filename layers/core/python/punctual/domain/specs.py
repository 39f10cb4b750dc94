"""A schedule's timing: cron, rate and one-shot specs, and the preview of their fires."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal, Self

from pydantic import (
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    JsonValue,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from punctual.domain.fields import Instant, Record
from punctual.timing import (
    DEFAULT_DST,
    Bounds,
    CronRule,
    DstPolicy,
    Gap,
    NoSuchWallTime,
    OneShotRule,
    Preview,
    RateRule,
    Repeat,
    ResolvedAt,
    Rule,
    get_zone,
    parse_cron_cached,
    parse_rate,
    preview,
    resolve_at,
    to_epoch,
)


class _SpecBase(Record):
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


class DstChoice(Record):
    """What the schedule's local wall times do where its zone's clocks skip or repeat them
    (docs/time.md, *Daylight saving: the choice per schedule*)."""

    gap: Gap = Field(
        default=Gap.SKIP,
        description="A wall time that does not exist (spring forward): SKIP it, or SHIFT it "
        "to the first instant after the gap.",
    )
    repeat: Repeat = Field(
        default=Repeat.FIRST,
        description="A wall time that occurs twice (fall back): fire at the FIRST instant, "
        "the LAST one, or at BOTH.",
    )

    def policy(self) -> DstPolicy:
        return DstPolicy(self.gap, self.repeat)


def _canonical(choice: DstChoice | None) -> DstChoice | None:
    # The defaults written out are no choice: the same definition (a change to them from
    # none is no new version, and nothing is re-planned).
    return None if choice == DstChoice() else choice


def dst_policy(choice: DstChoice | None) -> DstPolicy:
    """The engine's policy for a spec's choice (none: the defaults)."""
    return DEFAULT_DST if choice is None else choice.policy()


_DST_DESCRIPTION = (
    "The daylight-saving choice; null: gap SKIP, repeat FIRST. Part of the versioned "
    "definition: a change re-plans the fires."
)


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
    dst: DstChoice | None = Field(default=None, description=_DST_DESCRIPTION)

    @field_validator("expression")
    @classmethod
    def _valid_expression(cls, value: str) -> str:
        parse_cron_cached(value)  # every schedule read validates it: parsed once
        return value

    _valid_zone = field_validator("timezone")(_check_zone)
    _dst = field_validator("dst")(_canonical)

    def rule(self) -> CronRule:
        return CronRule(
            parse_cron_cached(self.expression),
            get_zone(self.timezone),
            self.bounds(),
            dst_policy(self.dst),
        )


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
    dst: None = Field(
        default=None, description="A rate has no daylight-saving choice: always null."
    )

    @field_validator("expression")
    @classmethod
    def _valid_expression(cls, value: str) -> str:
        parse_rate(value)
        return value

    @field_validator("dst", mode="before")
    @classmethod
    def _no_dst(cls, value: object) -> object:
        if value is not None:
            raise ValueError(
                "a rate fires on elapsed time, which daylight saving does not move: it takes "
                "no dst choice (use a cron schedule for wall-clock times)"
            )
        return value

    _valid_zone = field_validator("timezone")(_check_zone)

    def rule(self, created_at: datetime | None = None) -> RateRule:
        anchor = self.anchor or self.start_at or created_at
        if anchor is None:
            raise ValueError("a rate schedule needs an anchor, a start_at or a creation time")
        return RateRule(parse_rate(self.expression), to_epoch(anchor), self.bounds())


# A date-time that names its offset (Z, +01:00, -0530): one an `at` without a zone needs.
_WITH_OFFSET = r"(Z|[+-][0-9]{2}(:?[0-9]{2})?)\s*$"


def _local(text: str) -> bool:
    """Whether an `at` (already read by resolve_at) is a local date-time, with no offset."""
    return datetime.fromisoformat(text.strip().replace("Z", "+00:00")).tzinfo is None


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
    # Declared before ``at`` so that the ``at`` validator can read them.
    timezone: str | None = Field(default=None, max_length=64, json_schema_extra=ZONE_FORMAT)
    dst: DstChoice | None = Field(
        default=None,
        description=_DST_DESCRIPTION + " Only for a local date-time read in timezone.",
    )
    at: str = Field(
        description="An ISO-8601 date-time with its offset, or a local one read in timezone",
        examples=["2030-12-24T17:00:00Z", "2030-12-24T18:00:00+01:00"],
        max_length=64,
    )

    @field_validator("timezone")
    @classmethod
    def _valid_zone(cls, value: str | None) -> str | None:
        return None if value is None else _check_zone(value)

    _dst = field_validator("dst")(_canonical)

    @field_validator("at")
    @classmethod
    def _resolvable(cls, value: str, info: ValidationInfo) -> str:
        if "timezone" in info.data and "dst" in info.data:  # else one failed and is reported
            dst = info.data["dst"]
            try:
                resolve_at(value, info.data["timezone"], dst_policy(dst))
            except NoSuchWallTime as error:
                raise ValueError(
                    f"{error}, or set dst.gap to SHIFT to run at the first instant after the gap"
                ) from None
            if dst is not None and not _local(value):
                raise ValueError(
                    "this date-time names its offset, so no daylight-saving choice applies to "
                    "it: drop dst, or give a local date-time and a timezone"
                )
        return value

    def resolved(self) -> ResolvedAt:
        return resolve_at(self.at, self.timezone, dst_policy(self.dst))

    def rule(self) -> OneShotRule:
        resolved = self.resolved()
        return OneShotRule(resolved.instant, self.bounds(), resolved.second)


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
