"""IANA zones from the pinned ``tzdata`` package, and wall time <-> instant mapping.

Zones are loaded from the ``tzdata`` wheel, never from the host's
``/usr/share/zoneinfo``: every process (Lambda, laptop, CI) then applies the same
rules, and the version the API reports is the one actually used.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache, lru_cache
from importlib import resources
from importlib.resources.abc import Traversable
from zoneinfo import ZoneInfo

import tzdata

_UNIX_EPOCH_ORDINAL = datetime(1970, 1, 1).toordinal()

# The calendar Punctual computes in: Python's datetime spans years 1 to 9999 of local time,
# so a year of room on each side lets every instant in it show in every zone (UTC-12 to
# UTC+14) and leaves the cron walk's slack inside the range. Instants outside are refused
# as input, and fires past the end do not exist.
MIN_INSTANT = int(datetime(2, 1, 1, tzinfo=UTC).timestamp())
MAX_INSTANT = int(datetime(9998, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp())


class ZoneError(ValueError):
    """An unknown or unusable time zone name."""


class Resolution(enum.Enum):
    """How a local wall time maps to instants in its zone."""

    EXACT = "exact"  # exists once
    REPEATED = "repeated"  # exists twice (fall-back)
    SKIPPED = "skipped"  # does not exist (spring-forward gap or a skipped day)


@dataclass(frozen=True)
class ZoneSource:
    """Where the zone rules come from: an IANA release's compiled zone files (``zoneinfo``)
    and its list of names (``zones``), as the ``tzdata`` wheel lays them out."""

    version: str
    root: Traversable  # holds ``zones`` and ``zoneinfo/``


_PINNED = ZoneSource(str(tzdata.IANA_VERSION), resources.files("tzdata"))
_source = _PINNED


def use_zone_source(source: ZoneSource | None) -> None:
    """Plan with ``source``'s rules from now on (None: the pinned wheel's). Production runs
    on the pinned wheel only; tests plan with an older release, then upgrade, as a deploy of
    a new ``tzdata`` does (docs/time.md, *When the rules change*)."""
    global _source
    _source = source or _PINNED
    zone_names.cache_clear()
    get_zone.cache_clear()
    for forget in _FORGET:
        forget()


# Caches that hold what a zone's rules computed (punctual.timing.rules registers its own).
_FORGET: list[Callable[[], None]] = []


def tzdata_version() -> str:
    """The IANA release of the rules in use, e.g. '2026f'."""
    return _source.version


@cache
def zone_names() -> frozenset[str]:
    text = _source.root.joinpath("zones").read_text(encoding="utf-8")
    return frozenset(line.strip() for line in text.splitlines() if line.strip())


@cache
def get_zone(name: str) -> ZoneInfo:
    """The zone for an IANA name such as 'Europe/Berlin'; ZoneError if it is not one."""
    if name not in zone_names():
        raise ZoneError(f"{name!r} is not an IANA time zone name (tzdata {tzdata_version()})")
    source = _source.root.joinpath("zoneinfo", *name.split("/"))
    with source.open("rb") as handle:
        return ZoneInfo.from_file(handle, key=name)


@lru_cache(maxsize=4096)
def offset_changes(zone_name: str, start: int, end: int) -> bool:
    """True when the zone's UTC offset is not the same all through [start, end]: a daylight
    saving or other transition lies in it. Read every hour (no zone's rules change twice
    within one)."""
    zone = get_zone(zone_name)
    offsets = {
        datetime.fromtimestamp(instant, zone).utcoffset()
        for instant in [*range(start, end, 3600), end]
    }
    return len(offsets) > 1


_FORGET.append(offset_changes.cache_clear)  # its answers follow the zone rules in use


def wall_seconds(wall: datetime) -> int:
    """Seconds since the epoch of a naive wall time read as if it were UTC."""
    return (
        (wall.toordinal() - _UNIX_EPOCH_ORDINAL) * 86400
        + wall.hour * 3600
        + wall.minute * 60
        + wall.second
    )


def local_wall(instant: int, zone: ZoneInfo) -> datetime:
    """The naive local wall time at an epoch instant."""
    return datetime.fromtimestamp(instant, zone).replace(tzinfo=None)


def _offset(wall: datetime, zone: ZoneInfo, fold: int) -> int:
    offset = wall.replace(tzinfo=zone, fold=fold).utcoffset()
    assert offset is not None  # a ZoneInfo always answers
    return int(offset.total_seconds())


def instants_of(wall: datetime, zone: ZoneInfo) -> list[int]:
    """Every instant whose local wall time is ``wall``: none, one, or two, in order."""
    base = wall_seconds(wall)
    before = _offset(wall, zone, 0)
    after = _offset(wall, zone, 1)
    if before == after:
        # PEP 495: both folds agree exactly when the wall time is not at a transition.
        return [base - before]
    # At a transition one candidate, both, or neither really shows this wall time.
    return sorted(
        instant for instant in {base - before, base - after} if local_wall(instant, zone) == wall
    )


class Gap(enum.Enum):
    """What a wall time that does not exist (a spring-forward gap, a skipped day) does."""

    SKIP = "SKIP"  # it does not fire
    SHIFT = "SHIFT"  # it fires at the first instant after the gap


class Repeat(enum.Enum):
    """What a wall time that occurs twice (a fall-back's repeated hour) does."""

    FIRST = "FIRST"  # it fires once, at the earlier instant
    LAST = "LAST"  # it fires once, at the later instant
    BOTH = "BOTH"  # it fires at both instants


@dataclass(frozen=True, slots=True)
class DstPolicy:
    """A schedule's choice for the wall times a zone's transitions skip or repeat
    (docs/time.md, *Daylight saving: the choice per schedule*)."""

    gap: Gap = Gap.SKIP
    repeat: Repeat = Repeat.FIRST


DEFAULT_DST = DstPolicy()


def chosen_instants(
    wall: datetime, zone: ZoneInfo, policy: DstPolicy
) -> tuple[tuple[int, ...], Resolution]:
    """The instants at which a wall time fires under ``policy`` (in order: none for a
    skipped one, two for a repeated one fired at both), and how the wall time exists."""
    real = instants_of(wall, zone)
    if not real:
        shifted = (gap_end(wall, zone),) if policy.gap is Gap.SHIFT else ()
        return shifted, Resolution.SKIPPED
    if len(real) == 1:
        return (real[0],), Resolution.EXACT
    if policy.repeat is Repeat.FIRST:
        return (real[0],), Resolution.REPEATED
    if policy.repeat is Repeat.LAST:
        return (real[1],), Resolution.REPEATED
    return (real[0], real[1]), Resolution.REPEATED


@lru_cache(maxsize=4096)
def gap_end(wall: datetime, zone: ZoneInfo) -> int:
    """The first instant after the gap holding ``wall`` (a wall time that does not exist):
    the instant of the transition that skipped it, to the second."""
    base = wall_seconds(wall)
    # The two offsets around the transition read the wall time as an instant before it and
    # one after it (PEP 495); the transition is the first instant showing a later wall time.
    lo, hi = sorted((base - _offset(wall, zone, 0), base - _offset(wall, zone, 1)))
    while hi - lo > 1:
        middle = (lo + hi) // 2
        if local_wall(middle, zone) > wall:
            hi = middle
        else:
            lo = middle
    return hi


_FORGET.append(gap_end.cache_clear)  # its answers follow the zone rules in use


def to_epoch(moment: datetime) -> int:
    """Whole seconds since the epoch of an aware datetime (sub-second part dropped)."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("a naive datetime has no instant; give an offset or a zone")
    return int(moment.timestamp() // 1)


def in_calendar(instant: int) -> int:
    """``instant`` if it lies in Punctual's calendar; ValueError with the range otherwise."""
    if not MIN_INSTANT <= instant <= MAX_INSTANT:
        raise ValueError(
            f"must lie between {utc_text(MIN_INSTANT)} and {utc_text(MAX_INSTANT)} (UTC)"
        )
    return instant


def from_epoch(instant: int) -> datetime:
    return datetime.fromtimestamp(instant, UTC)


def utc_text(instant: int) -> str:
    """'2026-03-09T06:30:00Z' (four-digit years also before 1000, unlike strftime's %Y)"""
    return from_epoch(instant).replace(tzinfo=None).isoformat() + "Z"


def local_text(instant: int, zone: ZoneInfo) -> str:
    """'2026-03-09T02:30:00-04:00'"""
    return datetime.fromtimestamp(instant, zone).isoformat()
