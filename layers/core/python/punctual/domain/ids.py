"""Deterministic identifiers, jitter and shards.

An occurrence id is plain text built from its (schedule, version, instant), and
reversible. Jitter and shards hash with BLAKE2b, never with ``hash()``: the same
inputs give the same answer in every process, on every host and Python version, so
a retry, a second materializer and the reconciler all agree.
"""

from __future__ import annotations

import base64
import hashlib
import secrets

MAX_WINDOW_SECONDS = 900


def _digest(text: str, size: int, person: bytes) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=size, person=person).digest()


MANUAL_MARK = ".m"  # before a manual occurrence's tag in its id and its sort key
_TAG_LENGTH = 13  # base32 of 8 bytes, no padding
_TAG_ALPHABET = frozenset("abcdefghijklmnopqrstuvwxyz234567")


def manual_tag(schedule_id: str, idempotency_key: str | None) -> str:
    """What tells a manual occurrence (run now) apart: a digest of the request's
    Idempotency-Key (per schedule), or random when the request has none."""
    if idempotency_key is None:
        raw = secrets.token_bytes(8)
    else:
        raw = _digest(f"{schedule_id}\0{idempotency_key}", 8, b"punctual-manual")
    return base64.b32encode(raw).decode("ascii").lower().rstrip("=")


def backfill_tag(schedule_id: str) -> str:
    """The manual tag of the schedule's backfilled occurrences: one per schedule, so a
    backfill asked again (a retry, an overlapping range) names the same occurrences and its
    conditional puts make none twice."""
    raw = _digest(schedule_id, 8, b"punctual-bfill")
    return base64.b32encode(raw).decode("ascii").lower().rstrip("=")


def occurrence_id(
    schedule_id: str, version: int, scheduled_for: int, manual: str | None = None
) -> str:
    """The id of the occurrence of ``schedule_id`` at ``version`` due at ``scheduled_for``:
    ``occ_<schedule_id>_<scheduled_for>_<version>``, and ``.m<tag>`` after it for a manual
    one (run now), which no fire's id can equal.

    Reversible on purpose: the occurrences table is keyed by schedule (docs/data-model.md),
    so the id itself names the item's key and no index maps ids to schedules."""
    if not schedule_id or scheduled_for < 0 or version < 0:
        raise ValueError("an occurrence needs a schedule id and a non-negative version and time")
    if manual is not None and not _is_tag(manual):
        raise ValueError(f"not a manual tag: {manual!r}")
    suffix = "" if manual is None else MANUAL_MARK + manual
    return f"occ_{schedule_id}_{scheduled_for}_{version}{suffix}"


def _is_tag(text: str) -> bool:
    return len(text) == _TAG_LENGTH and set(text) <= _TAG_ALPHABET


def occurrence_name(text: str) -> tuple[str, int, int, str | None]:
    """``(schedule_id, version, scheduled_for, manual tag or None)`` of an occurrence id;
    ValueError if the text is not one this module would make (so two spellings never name
    one item)."""
    body = text.removeprefix("occ_")
    parts = body.rsplit("_", 2)
    if body == text or len(parts) != 3 or not parts[0]:
        raise ValueError(f"not an occurrence id: {text!r}")
    schedule_id, when, version = parts
    version, mark, tag = version.partition(MANUAL_MARK)
    if not (when.isascii() and when.isdigit() and version.isascii() and version.isdigit()):
        raise ValueError(f"not an occurrence id: {text!r}")
    manual = tag if mark else None
    if manual is not None and not _is_tag(manual):
        raise ValueError(f"not an occurrence id: {text!r}")
    named = (schedule_id, int(version), int(when), manual)
    if occurrence_id(*named) != text:  # leading zeros: another spelling
        raise ValueError(f"not an occurrence id: {text!r}")
    return named


def occurrence_parts(text: str) -> tuple[str, int, int]:
    """``(schedule_id, version, scheduled_for)`` of an occurrence id (a manual one's too);
    ValueError if the text is not an occurrence id."""
    schedule_id, version, scheduled_for, _ = occurrence_name(text)
    return schedule_id, version, scheduled_for


def is_manual(occurrence_id: str) -> bool:
    """Made by a request to run now, not by the schedule's timing."""
    return occurrence_name(occurrence_id)[3] is not None


def jitter_seconds(occurrence_id: str, window_seconds: int) -> int:
    """A deterministic offset in [0, window) spreading flexible occurrences."""
    if not 0 <= window_seconds <= MAX_WINDOW_SECONDS:
        raise ValueError(f"window must be 0..{MAX_WINDOW_SECONDS} seconds")
    if window_seconds == 0:
        return 0
    value = int.from_bytes(_digest(occurrence_id, 8, b"punctual-jit"), "big")
    return value % window_seconds


def available_at(occurrence_id: str, scheduled_for: int, window_seconds: int) -> int:
    """When the occurrence becomes receivable: strict = scheduled_for, flexible = + jitter."""
    return scheduled_for + jitter_seconds(occurrence_id, window_seconds)


def minute_of(instant: int) -> int:
    """The start of the UTC minute holding ``instant``: a due bucket's time."""
    return instant - instant % 60


def shard_of(schedule_id: str, shard_count: int) -> int:
    """The schedule's shard: a stable hash, so every process puts it in the same bucket."""
    return int.from_bytes(_digest(schedule_id, 8, b"punctual-shard"), "big") % shard_count


def shard_groups(shard_count: int, group_size: int) -> list[list[int]]:
    """Shards 0..shard_count-1 in consecutive groups of ``group_size`` (the last one may be
    smaller): what one materializer or reconciler invocation takes, in AWS and locally."""
    return [
        list(range(start, min(start + group_size, shard_count)))
        for start in range(0, shard_count, group_size)
    ]


SCHEDULE_PREFIX = "sch_"


def schedule_key_prefix(tenant_id: str) -> str:
    """What every id of the tenant's schedules begins with, and so every partition key of
    their items and occurrences: ``sch_<tenant>.``. A tenant id has no ``.``, so no tenant's
    prefix is a prefix of another's (``sch_acme.`` vs ``sch_acme-eu.``). IAM policies scope
    a tenant's workers to it (``dynamodb:LeadingKeys``), and the relay checks it."""
    return f"{SCHEDULE_PREFIX}{tenant_id}."


def new_schedule_id(tenant_id: str) -> str:
    """A random, URL-safe schedule id that names its tenant."""
    random_part = base64.b32encode(secrets.token_bytes(15)).decode("ascii").lower()
    return schedule_key_prefix(tenant_id) + random_part


def tenant_of_schedule(schedule_id: str) -> str | None:
    """The tenant a schedule id names, or None if it names none."""
    if not schedule_id.startswith(SCHEDULE_PREFIX) or "." not in schedule_id:
        return None
    return schedule_id[len(SCHEDULE_PREFIX) :].split(".", 1)[0] or None
