"""The local console: read-only pages at ``/console`` on the local API's port.

Every figure comes from the API, through the client the CLI uses, signed with a local
access key id (the ``as`` parameter: a tenant's key, ``demo`` by default; the reconciler's
page signs as the operator). The pages are rendered here as HTML with inline SVG: no
script, nothing to build or download.

Pages: the schedules (state, rule, zone, next fires with their clock changes marked,
MISSED); one schedule (versions, next fires on a timeline, its zone's next clock change and
what it does to the schedule, its occurrences with state and lag); one occurrence (its
life: scheduled, receivable, claimed, attempts, result); the last hour's occurrences on a
timeline; the lag histogram with p50/p95/p99 and the due backlog; the reconciler's report.
"""

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode
from zoneinfo import ZoneInfo

from punctual.timing import utc_text
from punctual_client.http import ApiError, Client, Unreachable
from punctual_local.stats import percentile

PREFIX = "/console"
HOUR = 3600
MAX_SCHEDULES = 100  # shown on a page; the CLI lists every one
_ID = re.compile(r"^[A-Za-z0-9._:#-]{1,128}$")


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def epoch(text: str | None) -> int | None:
    return None if text is None else int(datetime.fromisoformat(text).timestamp())


def _offset(local: str) -> str:
    """The UTC offset an ISO local time carries (``+05:30``)."""
    return datetime.fromisoformat(local).strftime("%z")


def _clock(instant: int | None, zone: str = "UTC") -> str:
    if instant is None:
        return "—"
    moment = datetime.fromtimestamp(instant, ZoneInfo(zone))
    return moment.strftime("%Y-%m-%d %H:%M:%S ") + (moment.tzname() or "")


def next_clock_change(zone: str, after: int, days: int = 400) -> tuple[int, str, str] | None:
    """The zone's next UTC offset change within ``days`` after ``after``: (the first instant
    on the new offset, the old offset, the new one), or None (a zone without one)."""
    tz = ZoneInfo(zone)

    def offset(instant: int) -> timedelta | None:
        return datetime.fromtimestamp(instant, tz).utcoffset()

    start = offset(after)
    low = after
    for day in range(1, days + 1):
        high = after + day * 86400
        if offset(high) != start:
            while high - low > 1:  # the change is in (low, high]: halve it to the second
                middle = (low + high) // 2
                low, high = (middle, high) if offset(middle) == start else (low, middle)
            moment = datetime.fromtimestamp(high, tz)
            before = datetime.fromtimestamp(high - 1, tz)
            return high, before.strftime("%z"), moment.strftime("%z")
        low = high
    return None


@dataclass
class Life:
    """One occurrence as the timeline and the lag figures see it."""

    occurrence: dict[str, Any]
    schedule_name: str
    claimed_at: int | None = None

    @property
    def scheduled(self) -> int:
        return epoch(self.occurrence["scheduled_for"]) or 0

    @property
    def due(self) -> int:
        return epoch(self.occurrence["available_at"]) or 0

    @property
    def receivable(self) -> int | None:
        """When its message could first be received: sent ahead with a delay, at its due
        time; sent late, when sent (SQS's SentTimestamp, recorded by the worker's claim)."""
        sent = epoch(self.occurrence.get("enqueued_at"))
        return None if sent is None else max(sent, self.due)

    @property
    def lag(self) -> int | None:
        """How late its message became receivable (the relay's lateness)."""
        return None if self.receivable is None else self.receivable - self.due

    @property
    def waited(self) -> int | None:
        """How long it waited for a worker once due (claimed - due: schedule-to-start)."""
        return None if self.claimed_at is None else max(0, self.claimed_at - self.due)


class Console:
    """The console's pages; ``answer`` serves one request as the gateway's pages hook."""

    def __init__(
        self,
        endpoint: str,
        *,
        default_key: str,
        operator_key: str,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.endpoint = endpoint
        self.default_key = default_key
        self.operator_key = operator_key
        self.now = now

    def answer(self, method: str, path: str, query: dict[str, list[str]]) -> dict[str, Any]:
        """The answer to a request under ``/console``, in the Lambda proxy answer's shape."""
        key = (query.get("as") or [self.default_key])[-1].strip() or self.default_key
        if method not in ("GET", "HEAD"):
            return _html(405, self._page("Not allowed", "<p>The console only reads.</p>", key))
        parts = [p for p in path[len(PREFIX) :].split("/") if p]
        try:
            if not _ID.match(key):
                raise _NotFound("an access key id is letters, digits and ._:#-")
            title, body = self._route(parts, key)
        except _NotFound as missing:
            return _html(404, self._page("Not found", f"<p>{_esc(missing)}</p>", key))
        except ApiError as error:
            text = f"<p class=error>The API answered {_esc(error)}</p>"
            return _html(error.status, self._page("The API refused", text, key))
        except Unreachable as error:
            return _html(502, self._page("Unreachable", f"<p class=error>{_esc(error)}</p>", key))
        return _html(200, self._page(title, body, key))

    def _route(self, parts: list[str], key: str) -> tuple[str, str]:
        client = Client(self.endpoint, access_key_id=key)
        match parts:
            case []:
                return "Schedules", self._schedules(client, key)
            case ["schedules", schedule_id] if _ID.match(schedule_id):
                return self._schedule(client, key, schedule_id)
            case ["occurrences", occurrence_id] if _ID.match(occurrence_id):
                return f"Occurrence {occurrence_id}", self._occurrence(client, key, occurrence_id)
            case ["timeline"]:
                return "The last hour", self._timeline(client, key)
            case ["lag"]:
                return "Lag and backlog", self._lag(client, key)
            case ["reconciler"]:
                operator = Client(self.endpoint, access_key_id=self.operator_key)
                return "Reconciler", self._reconciler(operator)
        raise _NotFound(f"no console page at {PREFIX}/{'/'.join(parts)}")

    # --- the pages ----------------------------------------------------------------------

    def _schedules(self, client: Client, key: str) -> str:
        rows = []
        schedules = client.pages("/v1/schedules", "schedules")
        for schedule in schedules[:MAX_SCHEDULES]:
            detail = client.get(f"/v1/schedules/{schedule['schedule_id']}")
            zone = _zone(schedule)
            fires = _marked_fires(detail["next_fires"][:3])
            missed = _missed_summary(schedule)
            notes = "".join(f"<div class=note>{_esc(n)}</div>" for n in detail["notes"])
            change = next_clock_change(zone, int(self.now()))
            if change is not None and schedule["state"] == "ACTIVE":
                day = datetime.fromtimestamp(change[0], ZoneInfo(zone)).date()
                notes += f"<div class=note>next clock change {day}: see the schedule</div>"
            schedule_id = schedule["schedule_id"]
            name = _link(f"schedules/{schedule_id}", key, schedule["name"] or schedule_id)
            rows.append(
                f"<tr><td>{name}<div class=id>{_esc(schedule_id)}</div></td>"
                f"<td>{_state(schedule['state'])}</td><td>{_esc(_rule(schedule['spec']))}</td>"
                f"<td>{_esc(zone)}</td><td>{fires}{notes}</td><td>{missed}</td></tr>"
            )
        more = len(schedules) - MAX_SCHEDULES
        tail = f"<p>{more} more: <code>punctual list</code> shows them all.</p>" if more > 0 else ""
        if not rows:
            return f"<p>No schedules yet for <code>{_esc(key)}</code>.</p>"
        return (
            "<table><tr><th>schedule</th><th>state</th><th>rule</th><th>zone</th>"
            "<th>next fires (local time)</th><th>MISSED</th></tr>"
            + "".join(rows)
            + "</table>"
            + tail
        )

    def _schedule(self, client: Client, key: str, schedule_id: str) -> tuple[str, str]:
        """The page's title (the schedule's name, else its id) and body."""
        detail = client.get(f"/v1/schedules/{schedule_id}")
        schedule = detail["schedule"]
        zone = _zone(schedule)
        versions = client.pages(f"/v1/schedules/{schedule_id}/versions", "versions")
        now = int(self.now())
        occurrences = client.pages(
            f"/v1/schedules/{schedule_id}/occurrences",
            "occurrences",
            **{"from": utc_text(now - 24 * HOUR), "to": utc_text(now + HOUR)},
        )
        summary = _definition_list(
            [
                ("state", _state(schedule["state"])),
                ("rule", _esc(_rule(schedule["spec"]))),
                ("zone", _esc(zone)),
                ("version", _esc(schedule["version"])),
                ("target", _esc(schedule["target"])),
                ("flexible window", f"{schedule['flexible_window_seconds']} s"),
                ("misfire", _esc(schedule["misfire"]["action"])),
                ("overlap", _esc(schedule["overlap"])),
                ("retry", _esc(_retry(schedule["retry"]))),
                ("payload", f"<code>{_esc(json.dumps(schedule['payload']))}</code>"),
                ("created", _esc(schedule["created_at"])),
                ("updated", _esc(schedule["updated_at"])),
                ("MISSED", _missed_summary(schedule)),
            ]
        )
        version_rows = "".join(
            f"<tr><td>v{v['version']}</td><td>{_esc(v['effective_from'])}</td>"
            f"<td>{_state(v['state'])}</td><td>{_esc(_rule(v['spec']))}</td>"
            f"<td>{_esc(_zone(v))}</td><td>{_esc(v['name'] or '')}</td></tr>"
            for v in versions
        )
        fires = detail["next_fires"]
        notes = "".join(f"<li>{_esc(n)}</li>" for n in detail["notes"])
        title = f"Schedule {schedule['name'] or schedule_id}"
        return title, (
            summary
            + "<h2>Next fires</h2>"
            + (_fires_svg(fires) if fires else "<p>None: the schedule is not active.</p>")
            + (f"<ul class=notes>{notes}</ul>" if notes else "")
            + self._clock_change(client, schedule, fires, now)
            + "<h2>Versions</h2><table><tr><th>version</th><th>effective from</th>"
            + "<th>state</th><th>rule</th><th>zone</th><th>name</th></tr>"
            + version_rows
            + "</table>"
            + "<h2>Occurrences (the last 24 hours and the next hour)</h2>"
            + _occurrence_table(occurrences[::-1], key, zone, now=now)
        )

    def _clock_change(
        self, client: Client, schedule: dict[str, Any], fires: list[dict[str, Any]], now: int
    ) -> str:
        """The zone's next clock change, and the schedule's fires around it (the preview's
        notes say what the change does to them)."""
        zone = _zone(schedule)
        change = next_clock_change(zone, now)
        if change is None:
            return f"<p>{_esc(zone)} has no clock change in the coming year.</p>"
        instant, before, after = change
        gap = 2 * max(120, _spacing(fires))
        preview = client.post(
            "/v1/preview",
            {"spec": schedule["spec"], "after": utc_text(instant - gap), "count": 5},
        )
        around = _marked_fires(preview["fires"])
        notes = "".join(f"<li>{_esc(n)}</li>" for n in preview["notes"])
        return (
            f"<p class=dst>Next clock change in {_esc(zone)}: {_esc(_clock(instant, zone))}"
            f" (UTC{before[:3]}:{before[3:]} → UTC{after[:3]}:{after[3:]}). The fires"
            f" around it: {around}</p>" + (f"<ul class=notes>{notes}</ul>" if notes else "")
        )

    def _occurrence(self, client: Client, key: str, occurrence_id: str) -> str:
        found = client.get(f"/v1/occurrences/{quote(occurrence_id, safe='')}")
        attempts = found["attempts"]
        claimed = epoch(attempts[0]["started_at"]) if attempts else None
        life = Life(found, found["schedule_id"], claimed)
        waited = "—" if life.waited is None else f"{life.waited} s"
        schedule = _link(f"schedules/{found['schedule_id']}", key, found["schedule_id"])
        made_by = " (run now or backfill)" if found.get("manual") else ""
        rows = "".join(
            f"<tr><td>{a['attempt_no']}</td><td>{_esc(a['started_at'])}</td>"
            f"<td>{_esc(a['finished_at'] or '—')}</td><td>{_state(a['outcome'])}</td>"
            f"<td>{_esc(a['error'] or '')}</td></tr>"
            for a in attempts
        )
        lag = "—" if life.lag is None else f"{life.lag} s"
        return (
            _definition_list(
                [
                    ("schedule", schedule + f" (v{found['schedule_version']}){made_by}"),
                    ("scheduled for", _esc(found["scheduled_for"])),
                    ("due (receivable from)", _esc(found["available_at"])),
                    ("sent", _esc(found["enqueued_at"] or "not yet claimed")),
                    ("receivable", _esc(utc_text(life.receivable) if life.receivable else "—")),
                    ("delivery lag (receivable - due)", lag),
                    ("claimed", _esc(utc_text(life.claimed_at) if life.claimed_at else "—")),
                    ("waited for a worker (claimed - due)", waited),
                    ("result", _state(found["state"]) + f" {_esc(found['reason'] or '')}"),
                ]
            )
            + _timeline_svg([life], int(life.scheduled) - 30, int(self.now()))
            + "<h2>Attempts</h2>"
            + (
                "<table><tr><th>#</th><th>started</th><th>finished</th><th>outcome</th>"
                f"<th>error</th></tr>{rows}</table>"
                if attempts
                else "<p>No attempt yet.</p>"
            )
        )

    def _last_hour(self, client: Client) -> tuple[list[Life], int]:
        """Every occurrence of the tenant's schedules scheduled in the last hour, each with
        when it was first claimed (the listing says: no read per occurrence), and now."""
        now = int(self.now())
        window = {"from": utc_text(now - HOUR), "to": utc_text(now)}
        lives: list[Life] = []
        for schedule in client.pages("/v1/schedules", "schedules")[:MAX_SCHEDULES]:
            path = f"/v1/schedules/{schedule['schedule_id']}/occurrences"
            name = schedule["name"] or schedule["schedule_id"]
            lives += [
                Life(o, name, epoch(o.get("claimed_at")))
                for o in client.pages(path, "occurrences", **window)
            ]
        return lives, now

    def _timeline(self, client: Client, key: str) -> str:
        lives, now = self._last_hour(client)
        if not lives:
            return "<p>No occurrence was scheduled in the last hour.</p>"
        latest = sorted(lives, key=lambda life: life.scheduled)[-30:][::-1]
        # The hour, or less where the first occurrence is younger (a stack just started).
        start = max(now - HOUR, min(life.scheduled for life in lives) - 60)
        names = {life.occurrence["schedule_id"]: life.schedule_name for life in lives}
        return (
            _timeline_svg(lives, start, now)
            + "<h2>The latest 30</h2>"
            + _occurrence_table([life.occurrence for life in latest], key, "UTC", names, now)
        )

    def _lag(self, client: Client, key: str) -> str:
        lives, now = self._last_hour(client)
        lags = [float(life.lag) for life in lives if life.lag is not None]
        waits = [float(life.waited) for life in lives if life.waited is not None]
        backlog = [
            life for life in lives if life.occurrence["state"] == "SCHEDULED" and life.due <= now
        ]
        waiting = sum(1 for life in lives if life.occurrence["state"] == "RETRY_WAIT")
        oldest = min((life.due for life in backlog), default=None)

        def spread(values: list[float]) -> str:
            return ", ".join(f"p{p} {percentile(values, p):g} s" for p in (50, 95, 99))

        figures = (
            f"<p>{len(waits)} occurrences of the last hour were claimed by a worker."
            + (f" Delivery lag (receivable - due): {spread(lags)}." if lags else "")
            + (f" Waited for a worker (claimed - due): {spread(waits)}." if waits else "")
            + "</p>"
        )
        backlog_text = (
            f"<p class=backlog>Due and not yet taken by a worker: <b>{len(backlog)}</b>"
            + (
                f", the oldest due {_esc(utc_text(oldest))} ({now - oldest} s ago)"
                if oldest
                else ""
            )
            + f"; waiting for a retry: <b>{waiting}</b>.</p>"
        )
        return figures + (_histogram_svg(lags) if lags else "") + "<h2>Backlog</h2>" + backlog_text

    def _reconciler(self, operator: Client) -> str:
        found = operator.get("/v1/admin/reconcile")
        rows = "".join(
            f"<tr><td>{r['shard']}</td><td>{_esc(_clock(r['run_at']))}</td>"
            f"<td>{'yes' if r['complete'] else 'no'}</td><td>{r['schedules']}</td>"
            f"<td>{_esc(_findings(r['counts']))}</td>"
            f"<td>{r['repaired_fired']}</td><td>{r['repaired_missed']}</td><td>{r['deferred']}</td>"
            f"<td>{r['cursors_moved']}</td><td>{r['redriven']}</td></tr>"
            for r in found["reports"]
        )
        head = (
            f"<p>Window {_esc(found['window_start'])} .. {_esc(found['window_end'])}: "
            f"{len(found['reports'])} shard reports, MISSING <b>{found['missing']}</b>, "
            f"UNEXPECTED <b>{found['unexpected']}</b>.</p>"
        )
        if not rows:
            return (
                head + "<p>No report for this window yet (the local reconciler runs every"
                " few minutes).</p>"
            )
        return head + (
            "<table><tr><th>shard</th><th>run at</th><th>complete</th><th>schedules</th>"
            "<th>findings</th><th>repaired (fired)</th><th>repaired (MISSED)</th>"
            "<th>deferred</th><th>cursors moved</th><th>re-driven</th></tr>" + rows + "</table>"
        )

    # --- the frame ----------------------------------------------------------------------

    def _page(self, title: str, body: str, key: str) -> str:
        nav = " ".join(
            _link(path, key, label)
            for path, label in (
                ("", "Schedules"),
                ("timeline", "Last hour"),
                ("lag", "Lag"),
                ("reconciler", "Reconciler"),
            )
        )
        now = int(self.now())
        return f"""<!doctype html>
<html lang=en><head><meta charset=utf-8><title>{_esc(title)} · Punctual</title>
<link rel=icon href="data:,"><style>{_STYLE}</style></head>
<body><header><b>Punctual</b> local console <nav>{nav}</nav>
<form method=get><label>as <input name=as value="{_esc(key)}" size=12></label>
<button>switch</button></form></header>
<main><h1>{_esc(title)}</h1>{body}</main>
<footer>Read through the API as <code>{_esc(key)}</code> at {_esc(utc_text(now))}.</footer>
</body></html>"""


class _NotFound(Exception):
    pass


def _html(status: int, page: str) -> dict[str, Any]:
    return {
        "statusCode": status,
        "headers": {"Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-store"},
        "body": page,
    }


def _link(path: str, key: str, label: object) -> str:
    url = f"{PREFIX}/{path}".rstrip("/") + "?" + urlencode({"as": key})
    return f'<a href="{_esc(url)}">{_esc(label)}</a>'


def _state(state: str) -> str:
    return f"<span class='state {_esc(state.lower())}'>{_esc(state)}</span>"


def _zone(schedule: dict[str, Any]) -> str:
    return str(schedule["spec"].get("timezone") or "UTC")


def _rule(spec: dict[str, Any]) -> str:
    if spec["kind"] == "at":
        return f"at {spec['at']}"
    return f"{spec['kind']} {spec['expression']}"


def _spacing(fires: list[dict[str, Any]]) -> int:
    instants = [epoch(f["utc"]) or 0 for f in fires[:2]]
    return instants[1] - instants[0] if len(instants) == 2 else 0


def _marked_fires(fires: Iterable[dict[str, Any]]) -> str:
    """Fires in local time; one whose UTC offset differs from the fire before it is marked
    (a clock change lies between them)."""
    out = []
    previous = None
    for fire in fires:
        offset = _offset(fire["local"])
        text = _esc(fire["local"].replace("T", " "))
        if previous is not None and offset != previous:
            out.append(f"<span class=dst title='clock change from {previous}'>{text} ⚑ DST</span>")
        else:
            out.append(f"<span>{text}</span>")
        previous = offset
    return "<div class=fires>" + "".join(out) + "</div>" if out else "—"


def _missed_summary(schedule: dict[str, Any]) -> str:
    total = schedule["missed_total"]
    if not total:
        return "none"
    episodes = "".join(
        f"<div>{e['count']} from {_esc(e['first'])} to {_esc(e['last'])} (v{e['version']})</div>"
        for e in schedule["missed"][-3:]
    )
    return f"<b class=missed>{total}</b>{episodes}"


def _findings(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if v) or "—"


def _definition_list(items: list[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{_esc(k)}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


# A wait for a worker past this stands out in a table (a backlog, or workers too few).
LATE_SECONDS = 60


def _late(life: Life, now: float) -> bool:
    """Waited for a worker longer than LATE_SECONDS, or due that long ago and not taken."""
    if life.waited is not None:
        return life.waited > LATE_SECONDS
    open_ = life.occurrence["state"] in ("SCHEDULED", "RETRY_WAIT")
    return open_ and now - life.due > LATE_SECONDS


def _occurrence_table(
    occurrences: list[dict[str, Any]],
    key: str,
    zone: str,
    names: dict[str, str] | None = None,
    now: float | None = None,
) -> str:
    """``names``: each schedule's name by id, for a table of several schedules' occurrences
    (a column naming the schedule, linked to it). A late one (``_late``) stands out."""
    if not occurrences:
        return "<p>None.</p>"
    now = time.time() if now is None else now
    rows = []
    for o in occurrences[:100]:
        life = Life(o, "", epoch(o.get("claimed_at")))
        lag = "" if life.lag is None else f"{life.lag} s"
        waited = "" if life.waited is None else f"{life.waited} s"
        when = _link(f"occurrences/{o['occurrence_id']}", key, _clock(life.scheduled, zone))
        manual = " <span class=manual>manual</span>" if o.get("manual") else ""
        owner = ""
        if names is not None:
            schedule_id = o["schedule_id"]
            label = names.get(schedule_id) or schedule_id
            owner = f"<td>{_link(f'schedules/{schedule_id}', key, label)}</td>"
        late = " class=late" if _late(life, now) else ""
        rows.append(
            f"<tr{late}><td>{when}</td>{owner}"
            f"<td>{_state(o['state'])}{manual}</td><td>{_esc(o['available_at'])}</td>"
            f"<td>{_esc(o['enqueued_at'] or '—')}</td><td>{lag}</td><td>{waited}</td>"
            f"<td>{o['attempt_count']}</td><td>{_esc(o['reason'] or '')}</td></tr>"
        )
    schedule_head = "<th>schedule</th>" if names is not None else ""
    return (
        f"<table><tr><th>scheduled for</th>{schedule_head}<th>state</th><th>due</th>"
        "<th>sent</th><th>delivery lag</th><th>waited for a worker</th><th>attempts</th>"
        "<th>reason</th></tr>" + "".join(rows) + "</table>"
    )


def _retry(policy: dict[str, Any]) -> str:
    return (
        f"{policy['max_attempts']} attempts, back-off {policy['backoff_base_seconds']} s "
        f"doubling to {policy['backoff_max_seconds']} s, within "
        f"{policy['deadline_seconds']} s of the fire"
    )


# --- SVG ------------------------------------------------------------------------------

_W, _LEFT, _RIGHT = 940, 170, 50


def _x(instant: float, start: float, end: float) -> float:
    span = max(end - start, 1)
    return _LEFT + (instant - start) / span * (_W - _LEFT - _RIGHT)


def _axis(start: int, end: int, y: int, ticks: int = 6) -> str:
    parts = [f"<line x1={_LEFT} y1={y} x2={_W - _RIGHT} y2={y} class=axis />"]
    for i in range(ticks + 1):
        instant = start + (end - start) * i // ticks
        x = _x(instant, start, end)
        shape = "%m-%d %H:%M" if end - start > 86400 else "%H:%M:%S"
        label = datetime.fromtimestamp(instant, UTC).strftime(shape)
        parts.append(f"<line x1={x:.1f} y1={y} x2={x:.1f} y2={y + 4} class=axis />")
        parts.append(f"<text x={x:.1f} y={y + 16} class=tick>{label}</text>")
    return "".join(parts)


def _fires_svg(fires: list[dict[str, Any]]) -> str:
    instants = [epoch(f["utc"]) or 0 for f in fires]
    start, end = instants[0], max(instants[-1], instants[0] + 60)
    marks: list[str] = []
    previous = None
    for fire, instant in zip(fires, instants, strict=True):
        x = _x(instant, start, end)
        offset = _offset(fire["local"])
        changed = previous is not None and offset != previous
        previous = offset
        local = fire["local"].replace("T", " ")
        label = _esc(local[5:16] if end - start > 86400 else local[11:19])
        label += " DST" if changed else ""
        marks.append(
            f"<circle cx={x:.1f} cy=30 r=5 class='{'dst' if changed else 'fire'}'>"
            f"<title>{_esc(fire['local'])} ({_esc(fire['utc'])})</title></circle>"
            f"<text x={x:.1f} y={18 if len(marks) % 2 else 52} class=tick>{label}</text>"
        )
    return (
        f"<svg width={_W} height=90 role=img aria-label='next fires'>"
        f"<text x=0 y=34>next {len(fires)} fires (UTC axis)</text>"
        + "".join(marks)
        + _axis(start, end, 66)
        + "</svg>"
    )


def _timeline_svg(lives: list[Life], start: int, end: int) -> str:
    """One row per schedule: each occurrence's scheduled time (circle), when it became
    receivable (square) and when a worker claimed it (triangle), joined by a line."""
    rows = sorted({life.schedule_name for life in lives})
    height = 40 + 24 * len(rows)
    parts = [f"<svg width={_W} height={height + 30} role=img aria-label='occurrences timeline'>"]
    for index, name in enumerate(rows):
        y = 30 + 24 * index
        parts.append(f"<text x=0 y={y + 4}>{_esc(name[:22])}</text>")
        parts.append(f"<line x1={_LEFT} y1={y} x2={_W - _RIGHT} y2={y} class=row />")
    for life in lives:
        y = 30 + 24 * rows.index(life.schedule_name)
        points = [life.scheduled, life.receivable, life.claimed_at]
        known = [p for p in points if p is not None]
        x0, x1 = _x(min(known), start, end), _x(max(known), start, end)
        state = life.occurrence["state"].lower()
        title = f"<title>{_esc(life.occurrence['occurrence_id'])}: {_esc(state)}</title>"
        parts.append(f"<line x1={x0:.1f} y1={y} x2={x1:.1f} y2={y} class='span {state}' />")
        x = _x(life.scheduled, start, end)
        parts.append(f"<circle cx={x:.1f} cy={y} r=4 class=scheduled>{title}</circle>")
        if life.receivable is not None:
            x = _x(life.receivable, start, end)
            parts.append(
                f"<rect x={x - 3:.1f} y={y - 3} width=6 height=6 class=receivable>{title}</rect>"
            )
        if life.claimed_at is not None:
            x = _x(life.claimed_at, start, end)
            parts.append(
                f"<polygon points='{x:.1f},{y - 5} {x - 4:.1f},{y + 3} {x + 4:.1f},{y + 3}' "
                f"class='claimed {state}'>{title}</polygon>"
            )
    parts.append(_axis(start, end, height))
    parts.append("</svg>")
    legend = (
        "<p class=legend><span class=l-scheduled>●</span> scheduled "
        "<span class=l-receivable>■</span> receivable <span class=l-claimed>▲</span> claimed "
        "by a worker</p>"
    )
    return "".join(parts) + legend


_LABEL_Y = {50: 16, 95: 30, 99: 44}  # the percentiles' labels, apart when their lines meet


def _histogram_svg(lags: list[float]) -> str:
    top = max(int(max(lags)), 9)  # at least ten bins
    width = max(1, -(-(top + 1) // 30))  # at most 30 bins of whole seconds
    bins = [0] * (top // width + 1)
    for lag in lags:
        bins[int(max(0, lag)) // width] += 1
    height, tallest = 180, max(bins)
    bar = (_W - _LEFT - _RIGHT) / len(bins)
    parts = [f"<svg width={_W} height={height + 60} role=img aria-label='lag histogram'>"]
    for index, count in enumerate(bins):
        h = count / tallest * height
        x = _LEFT + index * bar
        parts.append(
            f"<rect x={x:.1f} y={height - h + 10:.1f} width={bar - 2:.1f} height={h:.1f} "
            f"class=bar><title>{index * width} to {(index + 1) * width} s: {count}</title></rect>"
        )
        parts.append(f"<text x={x:.1f} y={height + 26} class=tick>{index * width}</text>")
    for p in (50, 95, 99):
        value = percentile(lags, p)
        x = _LEFT + value / width * bar
        parts.append(
            f"<line x1={x:.1f} y1=4 x2={x:.1f} y2={height + 10} class='p p{p}' />"
            f"<text x={x + 3:.1f} y={_LABEL_Y[p]} class='plabel'>p{p} {value:g} s</text>"
        )
    parts.append(f"<text x=0 y={height // 2}>occurrences</text>")
    parts.append(f"<text x={_LEFT} y={height + 46}>lag (s), receivable - due</text></svg>")
    return "".join(parts)


_STYLE = """tr.late td{background:#fff3e0} tr.late td:first-child{border-left:3px solid #e08a00}
.manual{font-size:11px;color:#6a3;border:1px solid #6a3;border-radius:3px;padding:0 3px}

body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#fafbfc}
header{background:#1d2330;color:#fff;padding:8px 16px;display:flex;gap:18px;align-items:center}
header a{color:#cfe0ff;margin-right:12px} header form{margin-left:auto}
main{padding:8px 16px} footer{color:#777;padding:8px 16px;font-size:12px}
table{border-collapse:collapse;margin:8px 0} th,td{border-bottom:1px solid #e2e5ea;
padding:4px 8px;text-align:left;vertical-align:top} th{background:#eef1f5}
.id{color:#888;font-size:11px} .note,.notes{color:#8a5a00;font-size:12px}
.fires span{display:block} .dst{color:#b35900;font-weight:600}
.state{padding:1px 6px;border-radius:8px;background:#e6e9ef;font-size:12px}
.state.active,.state.succeeded{background:#d9f2df}
.state.paused,.state.retry_wait{background:#fff0c2}
.state.canceled,.state.dead,.state.missed,.state.lost{background:#fbd9d9}
.state.running,.state.scheduled{background:#dde9ff}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 14px} dt{color:#666}
svg text{font-size:11px;fill:#333} .tick{text-anchor:middle;fill:#666}
.axis,.row{stroke:#c9ced6} .span{stroke:#9aa3b2;stroke-width:2}
circle.fire{fill:#3b6fd6} circle.dst{fill:#d97a00} circle.scheduled{fill:#fff;stroke:#555}
rect.receivable{fill:#3b6fd6} polygon.claimed{fill:#2e9d4b} polygon.claimed.dead{fill:#c33}
rect.bar{fill:#7aa2e8} .p{stroke-width:2} .p50{stroke:#2e9d4b} .p95{stroke:#d97a00}
.p99{stroke:#c33} .plabel{font-weight:600} .missed{color:#c33} .error{color:#c33}
.legend .l-scheduled{color:#555} .legend .l-receivable{color:#3b6fd6}
.legend .l-claimed{color:#2e9d4b}
"""
