"""One schedule's story in a finished simulation, for a violation the oracle found: its
versions, its MISSED episodes and home, every stored occurrence, every handler run and every
worker decision on it, in order. ``make simulate`` prints it for the first example of each
kind of violation (a replay may not meet the same one: scripts/simulate.py)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from punctual.dal.common import from_dynamo
from punctual.dal.tables import SCHEDULE_CURRENT
from tests.sim.world import Run

_SCHEDULE = re.compile(r"sch_[a-z0-9]+\.[A-Za-z0-9_-]+?(?=_\d|\b| |$)")


def _t(instant: float) -> str:
    return datetime.fromtimestamp(int(instant), UTC).strftime("%m-%dT%H:%M:%S")


def schedule_of(example: str) -> str | None:
    """The schedule id an example of a violation names first."""
    found = _SCHEDULE.search(example)
    return found.group(0) if found else None


def explain(run: Run, schedule_id: str) -> list[str]:
    services, settings = run.services, run.settings
    lines = [f"schedule {schedule_id}"]
    for version in services.schedules.versions_since(schedule_id, 0):
        s = version.schedule
        lines.append(
            f"  v{s.version} from {_t(version.effective_from)} {s.state.value} {s.spec!r} "
            f"misfire={s.misfire.action.value}/{s.misfire.max_lateness_seconds}s/"
            f"{s.misfire.catchup_limit} overlap={s.overlap.value} "
            f"window={s.flexible_window_seconds}s"
        )
    found = services.dynamodb.get_item(
        TableName=settings.schedules_table,
        Key={"schedule_id": {"S": schedule_id}, "sk": {"S": SCHEDULE_CURRENT}},
        ConsistentRead=True,
    ).get("Item")
    if found:
        item = from_dynamo(found)
        lines.append(
            f"  missed {item.get('missed_ranges')} home {item.get('home_region')} "
            f"generation {item.get('generation')} homed_since {item.get('homed_since')}"
        )
    pages = services.dynamodb.get_paginator("query").paginate(
        TableName=settings.occurrences_table,
        KeyConditionExpression="schedule_id = :s",
        ExpressionAttributeValues={":s": {"S": schedule_id}},
        ConsistentRead=True,
    )
    for page in pages:
        for raw in page["Items"]:
            o = from_dynamo(raw)
            if "scheduled_for" not in o:
                continue
            lines.append(
                f"  occ {str(o.get('occurrence_id'))[-30:]} for {_t(o['scheduled_for'])} "
                f"available {_t(o['available_at'])} {o.get('state')} lane={o.get('lane')} "
                f"local={o.get('local')} {str(o.get('reason') or '')[:70]}"
            )
    for r in run.runs:
        if r.schedule_id == schedule_id:
            lines.append(
                f"  run {r.occurrence_id[-30:]} attempt {r.attempt} {_t(r.started)}-{_t(r.ended)}"
                f" lapsed={r.lapsed} stopped={r.stopped} died={r.died}"
            )
    for e in run.events:
        if e.schedule_id == schedule_id:
            lines.append(f"  worker {_t(e.at)} {e.occurrence_id[-30:]} {e.what} {e.detail[:60]}")
    lines.append(
        f"  (zone rules changed {run.rules_changed_at and _t(run.rules_changed_at)}, "
        f"failed over {run.failed_over_at and _t(run.failed_over_at)})"
    )
    return lines
