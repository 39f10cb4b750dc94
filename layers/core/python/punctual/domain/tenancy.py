"""Tenants, their quotas, targets, and the strict-fire load a schedule puts on each minute."""

from __future__ import annotations

from datetime import UTC, datetime
from math import gcd
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ConfigDict, Field

from punctual.domain.schedule import ScheduleDefinition
from punctual.domain.specs import AtSpec, CronSpec, RateSpec
from punctual.timing import Gap, get_zone, parse_cron_cached, parse_rate

TENANT_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{1,31}$"


class Quotas(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_schedules: int = Field(default=10_000, ge=0, le=50_000_000)
    max_strict_fires_per_minute: int = Field(default=10_000, ge=0, le=1_000_000)
    max_concurrency: int = Field(default=1_000, ge=1, le=100_000)
    catchup_per_minute: int = Field(default=600, ge=1, le=1_000_000)
    max_manual_runs_per_minute: int = Field(default=60, ge=0, le=100_000)
    max_backfill_occurrences: int = Field(default=1_000, ge=0, le=100_000)

    @property
    def catchup_pace(self) -> int:
        """Seconds between one schedule's catch-up occurrences (at least 1)."""
        return max(1, 60 // self.catchup_per_minute)


class Tenant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant_id: str = Field(pattern=TENANT_ID_PATTERN)
    quotas: Quotas = Quotas()
    schedule_count: int = 0
    minute_load: list[int] = Field(default_factory=lambda: [0] * 60)
    created_at: datetime
    principals: list[str] = Field(default_factory=list)  # bound callers and workers
    # Manual runs (run now) counted in one UTC minute, against max_manual_runs_per_minute.
    manual_minute: int = 0
    manual_runs: int = 0


# How long before its instant a message to a target with early delivery may become
# receivable, at most: SQS delays in whole seconds, so a delay rounded down is early by less.
EARLY_DELIVERY_SECONDS = 1


class Target(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant_id: str
    name: str
    queue_url: str
    queue_arn: str
    dlq_url: str
    dlq_arn: str
    created_at: datetime
    # Its consumers run the worker SDK, which holds a message until its instant: the relay
    # may make a message receivable up to EARLY_DELIVERY_SECONDS before it, so that the
    # handler starts at the instant rather than up to a second after (docs/worker.md,
    # *Starting on the instant*). Off by default: a consumer that does not hold would run
    # it early.
    early_delivery: bool = False


def strict_minute_load(definition: ScheduleDefinition, created_at: datetime) -> dict[int, int]:
    """Fires per UTC minute-of-hour this schedule can add at most (conservative).

    Admission control sums these per tenant, so that no minute of any hour can
    get more strict fires than the tenant's quota. Flexible schedules spread over
    their window and add nothing.
    """
    if not definition.strict:
        return {}
    spec = definition.spec
    if isinstance(spec, CronSpec):
        minutes = parse_cron_cached(spec.expression).minutes
        shifts = _minute_shifts(spec.timezone, created_at)
        load = {(m + s) % 60: 1 for m in minutes for s in shifts}
        if spec.dst is not None and spec.dst.gap is Gap.SHIFT:
            # A wall time in a gap fires at the gap's end: the transition's own minute.
            load |= dict.fromkeys(_jump_minutes(spec.timezone, created_at), 1)
        return load
    if isinstance(spec, RateSpec):
        interval = parse_rate(spec.expression)
        anchor = int((spec.anchor or spec.start_at or created_at).timestamp())
        period = 3600 // gcd(interval, 3600)
        return {((anchor + k * interval) % 3600) // 60: 1 for k in range(period)}
    assert isinstance(spec, AtSpec)
    resolved = spec.resolved()
    return {(i % 3600) // 60: 1 for i in (resolved.instant, resolved.second) if i is not None}


def _jump_minutes(zone_name: str, around: datetime) -> set[int]:
    """UTC minutes-of-hour at which the zone's clocks jump ahead in the coming year."""
    zone = get_zone(zone_name)
    start = int(around.timestamp())
    found = set()
    for day in range(400):
        at, then = start + day * 86400, start + (day + 1) * 86400
        if _offset(then, zone) > _offset(at, zone):
            while then - at > 1:  # the instant of the change, to the second
                middle = (at + then) // 2
                at, then = (
                    (at, middle) if _offset(middle, zone) > _offset(at, zone) else (middle, then)
                )
            found.add((then % 3600) // 60)
    return found


def _offset(instant: int, zone: ZoneInfo) -> float:
    offset = datetime.fromtimestamp(instant, zone).utcoffset()
    assert offset is not None
    return offset.total_seconds()


def _minute_shifts(zone_name: str, around: datetime) -> set[int]:
    """Minute-of-hour shifts between local and UTC time the zone uses in the coming year."""
    zone = get_zone(zone_name)
    start = int(around.timestamp())
    shifts = set()
    for day in range(0, 400, 7):
        offset = datetime.fromtimestamp(start + day * 86400, UTC).astimezone(zone).utcoffset()
        assert offset is not None
        shifts.add((-int(offset.total_seconds()) // 60) % 60)
    return shifts
