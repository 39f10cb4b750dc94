"""The time engine: cron on local wall time, rate as elapsed time, one-shot instants."""

from punctual.timing.cron import MACROS, CronError, CronExpr, parse_cron
from punctual.timing.preview import Fire, Preview, preview
from punctual.timing.rules import (
    Bounds,
    CronRule,
    OneShotRule,
    RateRule,
    ResolvedAt,
    Rule,
    parse_rate,
    resolve_at,
)
from punctual.timing.zones import (
    MAX_INSTANT,
    MIN_INSTANT,
    Resolution,
    ZoneError,
    from_epoch,
    get_zone,
    in_calendar,
    local_text,
    resolve_wall,
    to_epoch,
    tzdata_version,
    utc_text,
)

__all__ = [
    "MACROS",
    "MAX_INSTANT",
    "MIN_INSTANT",
    "Bounds",
    "CronError",
    "CronExpr",
    "CronRule",
    "Fire",
    "OneShotRule",
    "Preview",
    "RateRule",
    "Resolution",
    "ResolvedAt",
    "Rule",
    "ZoneError",
    "from_epoch",
    "get_zone",
    "in_calendar",
    "local_text",
    "parse_cron",
    "parse_rate",
    "preview",
    "resolve_at",
    "resolve_wall",
    "to_epoch",
    "tzdata_version",
    "utc_text",
]
