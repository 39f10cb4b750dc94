"""The local console: read-only pages at ``/console`` on the local API's port.

Every figure comes from the API, through the client the CLI uses, signed with a local
access key id (the ``as`` parameter: a tenant's key, ``demo`` by default; the reconciler's
and the tenants' pages sign as the operator). The pages are rendered here as HTML with
inline SVG: no script, nothing to build or download.

Pages: the schedules (searched by name, filtered by state; each with its rule in words,
its next fire with a clock change marked, MISSED); one schedule (its rule in words,
versions, next fires, its zone's next clock change and what it does to the schedule, its
recent runs with their results); one occurrence (its life: scheduled, receivable, claimed,
attempts, result); the last hour's occurrences on a timeline; the lag histograms with
counts and p50/p95/p99, strict, flexible and manual runs apart, and the due backlog; the
tenants an operator can switch to; the reconciler's report.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol
from urllib.parse import quote, urlencode
from zoneinfo import ZoneInfo

from punctual.timing import utc_text
from punctual_client.http import ApiError, Client, Unreachable
from punctual_local.charts import fires_svg, histogram_svg, timeline_svg
from punctual_local.engines import ACCOUNT
from punctual_local.lives import KINDS, Life, epoch, esc, utc_offset, waited_too_long
from punctual_local.stats import percentile
from punctual_local.words import rule_in_words

PREFIX = "/console"
LEDGER_PAGES = 5  # pages of the ledger one console page reads (100 items each)
LEDGER_UPCOMING = 20  # next fires shown
HOUR = 3600
MAX_SCHEDULES = 100  # rows on the schedules page; the CLI lists every one
MAX_TENANTS = 200  # rows on the tenants page (each asks which key acts as it)
PAGE_SIZE = 100  # the API's largest page: a schedule's hour of minutely fires in one read
RECENT = 100  # the last fires a schedule's page shows figures of (its GET's default)
# Listings read side by side for the last hour's pages. The local gateway runs one API call
# at a time, so more readers overlap only the client's half of each call (signing, HTTP,
# JSON): a few took about a tenth off 167 listings (2.8 s -> 2.4-2.6 s), 8 no more.
READERS = 4
STATES = ("ACTIVE", "PAUSED", "COMPLETED", "CANCELED")
MAX_SEARCH = 128
_ID = re.compile(r"^[A-Za-z0-9._:#-]{1,128}$")


class Api(Protocol):
    """What the pages read through: the CLI's HTTP client signed as one access key id."""

    def get(self, path: str, **query: Any) -> Any: ...

    def post(self, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any: ...

    def pages(self, path: str, key: str, **query: Any) -> list[Any]: ...


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


def _rule(spec: dict[str, Any]) -> str:
    if spec["kind"] == "at":
        return f"at {spec['at']}"
    return f"{spec['kind']} {spec['expression']}"


def _rule_cell(spec: dict[str, Any]) -> str:
    """The rule as written, and in words beneath."""
    words = rule_in_words(spec)
    said = f"<div class=words>{esc(words)}</div>" if words else ""
    return f"<code>{esc(_rule(spec))}</code>{said}"


# --- what the pages show ----------------------------------------------------------------


@dataclass(frozen=True)
class View:
    """Who a page reads as and the schedules filter: every link of the page keeps both."""

    key: str
    search: str = ""  # a part of the name, any case
    state: str = ""  # one of STATES; "" for every state

    def query(self) -> str:
        given = {"as": self.key, "q": self.search, "state": self.state}
        return urlencode({k: v for k, v in given.items() if v})

    def matches(self, schedule: dict[str, Any]) -> bool:
        name = schedule["name"] or schedule["schedule_id"]
        in_state = not self.state or schedule["state"] == self.state
        return in_state and self.search.casefold() in name.casefold()


def _view(query: dict[str, list[str]], default_key: str) -> View:
    def given(name: str) -> str:
        return (query.get(name) or [""])[-1].strip()

    # ``key`` (typed in the header) over ``as`` (the tenant picked, or a link's).
    key = given("key") or given("as") or default_key
    return View(key, given("q"), given("state").upper())


class Console:
    """The console's pages; ``answer`` serves one request as the gateway's pages hook."""

    def __init__(
        self,
        endpoint: str,
        *,
        default_key: str,
        operator_key: str,
        now: Callable[[], float] = time.time,
        api: Callable[[str], Api] | None = None,
    ) -> None:
        """``api``: what reads as an access key id (default: the HTTP client at
        ``endpoint``, which the stack sets once its port is bound)."""
        self.endpoint = endpoint
        self.default_key = default_key
        self.operator_key = operator_key
        self.now = now
        self._api = api or (lambda key: Client(self.endpoint, access_key_id=key))
        # Access key id -> the tenant the API said it acts as. The API lists neither the
        # tenants nor their principals, so the tenant picker offers the keys seen to work;
        # a binding is never undone (first bind wins), so what was seen stays true.
        self._tenants: dict[str, str] = {}

    def answer(self, method: str, path: str, query: dict[str, list[str]]) -> dict[str, Any]:
        """The answer to a request under ``/console``, in the Lambda proxy answer's shape."""
        view = _view(query, self.default_key)
        parts = [p for p in path[len(PREFIX) :].split("/") if p]
        listing = (["timeline"], ["lag"], ["tenants"], ["ledger"])
        here = "/".join(parts) if parts in listing else ""
        if method not in ("GET", "HEAD"):
            body = "<p>The console only reads.</p>"
            return _html(405, self._page("Not allowed", body, view, here))
        try:
            if not _ID.match(view.key):
                raise _NotFound("an access key id is letters, digits and ._:#-")
            if view.state and view.state not in STATES:
                raise _BadRequest(f"state is one of {', '.join(STATES)}, or empty for all")
            if len(view.search) > MAX_SEARCH:
                raise _BadRequest(f"a search is at most {MAX_SEARCH} characters")
            render = self._route(parts, view, query)
            self._tenant_of(view.key)
            title, body = render()
        except _BadRequest as bad:
            return _html(400, self._page("Bad request", f"<p>{esc(bad)}</p>", view, here))
        except _NotFound as missing:
            return _html(404, self._page("Not found", f"<p>{esc(missing)}</p>", view, here))
        except ApiError as error:
            text = f"<p class=error>The API answered {esc(error)}</p>"
            return _html(error.status, self._page("The API refused", text, view, here))
        except Unreachable as error:
            text = f"<p class=error>{esc(error)}</p>"
            return _html(502, self._page("Unreachable", text, view, here))
        return _html(200, self._page(title, body, view, here))

    def _tenant_of(self, key: str) -> str | None:
        """The tenant ``key`` acts as (GET /v1/tenant, once per key), None if none."""
        known = self._tenants.get(key)
        if known is None:
            try:
                known = str(self._api(key).get("/v1/tenant")["tenant_id"])
            except ApiError:  # not bound to a tenant (the operator, a stranger)
                return None
            self._tenants[key] = known
        return known

    def _route(
        self, parts: list[str], view: View, query: dict[str, list[str]]
    ) -> Callable[[], tuple[str, str]]:
        """What renders the page at ``parts`` (its title and body); _NotFound, before any
        read, for a path that is no page."""
        client = self._api(view.key)
        match parts:
            case ["schedules", schedule_id] if _ID.match(schedule_id):
                return lambda: self._schedule(client, view, schedule_id)
            case ["occurrences", occurrence_id] if _ID.match(occurrence_id):
                title = f"Occurrence {occurrence_id}"
                return lambda: (title, self._occurrence(client, view, occurrence_id))
        page = self._named_pages(client, view, query).get("/".join(parts))
        if page is None:
            raise _NotFound(f"no console page at {PREFIX}/{'/'.join(parts)}")
        return page

    def _named_pages(
        self, client: Api, view: View, query: dict[str, list[str]]
    ) -> dict[str, Callable[[], tuple[str, str]]]:
        """The pages whose path names no schedule or occurrence, by path (the schedules'
        listing at the console's root), each with its title."""
        tenant = (query.get("tenant") or [""])[-1].strip()
        return {
            "": lambda: ("Schedules", self._schedules(client, view)),
            "timeline": lambda: ("The last hour", self._timeline(client, view)),
            "lag": lambda: ("Lag and backlog", self._lag(client)),
            "tenants": lambda: ("Tenants", self._tenants_page(view, tenant)),
            "reconciler": lambda: ("Reconciler", self._reconciler(self._api(self.operator_key))),
            "ledger": lambda: ("Ledger", self._ledger(client, view)),
        }

    # --- the pages ----------------------------------------------------------------------

    def _schedules(self, client: Api, view: View) -> str:
        """Every schedule in one listing (its next fire included): no read per schedule."""
        every = client.pages("/v1/schedules", "schedules", limit=PAGE_SIZE)
        if not every:
            return f"<p>No schedules yet for <code>{esc(view.key)}</code>.</p>"
        chosen = [s for s in every if view.matches(s)]
        now = int(self.now())
        changes: dict[str, tuple[int, str, str] | None] = {}  # per zone: one search each
        rows = []
        for schedule in chosen[:MAX_SCHEDULES]:
            zone = _zone(schedule)
            if zone not in changes:
                changes[zone] = next_clock_change(zone, now)
            rows.append(_schedule_row(schedule, view, now, changes[zone]))
        form = _filter_form(view, Counter(s["state"] for s in every), len(every))
        if not rows:
            return form + "<p class=empty>No schedule matches.</p>"
        more = len(chosen) - MAX_SCHEDULES
        tail = (
            f"<p>{more} more: narrow the search, or <code>punctual list</code> shows them all.</p>"
            if more > 0
            else ""
        )
        return (
            form
            + f"<p class=count>{len(chosen)} of {len(every)} schedules.</p>"
            + "<table class=schedules><tr><th>schedule</th><th>state</th><th>rule</th>"
            + "<th>zone</th><th>next fire (local time)</th><th>MISSED</th></tr>"
            + "".join(rows)
            + "</table>"
            + tail
        )

    def _schedule(self, client: Api, view: View, schedule_id: str) -> tuple[str, str]:
        """The page's title (the schedule's name, else its id) and body."""
        detail = client.get(f"/v1/schedules/{schedule_id}", recent=RECENT)
        schedule = detail["schedule"]
        zone = _zone(schedule)
        versions = client.pages(
            f"/v1/schedules/{schedule_id}/versions", "versions", limit=PAGE_SIZE
        )
        now = int(self.now())
        runs = client.pages(
            f"/v1/schedules/{schedule_id}/occurrences",
            "occurrences",
            limit=PAGE_SIZE,
            **{"from": utc_text(now - 24 * HOUR), "to": utc_text(now)},
        )
        summary = _definition_list(
            [
                ("state", _state(schedule["state"])),
                ("rule", _rule_cell(schedule["spec"])),
                ("zone", esc(zone)),
                ("daylight saving", esc(_dst(schedule["spec"]))),
                ("version", esc(_version(schedule))),
                ("target", esc(schedule["target"])),
                ("flexible window", f"{schedule['flexible_window_seconds']} s"),
                ("misfire", esc(schedule["misfire"]["action"])),
                ("overlap", esc(schedule["overlap"])),
                ("retry", esc(_retry(schedule["retry"]))),
                ("payload", f"<code>{esc(json.dumps(schedule['payload']))}</code>"),
                ("created", esc(schedule["created_at"])),
                ("updated", esc(schedule["updated_at"])),
                ("MISSED", _missed_summary(schedule)),
            ]
        )
        version_rows = "".join(
            f"<tr><td>v{v['version']}</td><td>{esc(v['effective_from'])}</td>"
            f"<td>{_state(v['state'])}</td><td>{_rule_cell(v['spec'])}</td>"
            f"<td>{esc(_zone(v))}</td><td>{esc(v['name'] or '')}</td></tr>"
            for v in versions
        )
        fires = detail["next_fires"]
        notes = "".join(f"<li>{esc(n)}</li>" for n in detail["notes"])
        title = f"Schedule {schedule['name'] or schedule_id}"
        past = runs[::-1]  # newest first
        if fires:
            upcoming = fires_svg(fires) + _next_fires_table(fires, view)
        elif schedule["state"] == "ACTIVE":
            upcoming = "<p>None: no fire left.</p>"
        else:
            upcoming = f"<p>None: the schedule is {_state(schedule['state'])}.</p>"
        return title, (
            summary
            + "<h2>Next fires</h2>"
            + upcoming
            + (f"<ul class=notes>{notes}</ul>" if notes else "")
            + self._clock_change(client, schedule, fires, now)
            + f"<h2>How the last {RECENT} fires went</h2>"
            + _recent_figures(detail["recent"], zone)
            + "<h2>Recent runs (the last 24 hours)</h2>"
            + (
                _results_summary(past, zone)
                + _occurrence_table(past, view, zone, now=now, css="runs")
                if past
                else "<p>No run in the last 24 hours.</p>"
            )
            + "<h2>Versions</h2><table class=versions><tr><th>version</th>"
            + "<th>effective from</th><th>state</th><th>rule</th><th>zone</th><th>name</th></tr>"
            + version_rows
            + "</table>"
        )

    def _clock_change(
        self, client: Api, schedule: dict[str, Any], fires: list[dict[str, Any]], now: int
    ) -> str:
        """The zone's next clock change, and the schedule's fires around it (the preview's
        notes say what the change does to them)."""
        zone = _zone(schedule)
        change = next_clock_change(zone, now)
        if change is None:
            return f"<p>{esc(zone)} has no clock change in the coming year.</p>"
        instant, before, after = change
        gap = 2 * max(120, _spacing(fires))
        preview = client.post(
            "/v1/preview",
            {"spec": schedule["spec"], "after": utc_text(instant - gap), "count": 5},
        )
        around = _marked_fires(preview["fires"])
        notes = "".join(f"<li>{esc(n)}</li>" for n in preview["notes"])
        return (
            f"<p class=dst>Next clock change in {esc(zone)}: {esc(_clock(instant, zone))}"
            f" (UTC{before[:3]}:{before[3:]} → UTC{after[:3]}:{after[3:]}). The fires"
            f" around it: {around}</p>" + (f"<ul class=notes>{notes}</ul>" if notes else "")
        )

    def _occurrence(self, client: Api, view: View, occurrence_id: str) -> str:
        found = client.get(f"/v1/occurrences/{quote(occurrence_id, safe='')}")
        attempts = found["attempts"]
        claimed = epoch(attempts[0]["started_at"]) if attempts else None
        life = Life(found, found["schedule_id"], claimed)
        waited = "—" if life.waited is None else f"{life.waited} s"
        schedule = _link(f"schedules/{found['schedule_id']}", view, found["schedule_id"])
        made_by = " (run now or backfill)" if found.get("manual") else ""
        rows = "".join(
            f"<tr><td>{a['attempt_no']}</td><td>{esc(a['started_at'])}</td>"
            f"<td>{esc(a['finished_at'] or '—')}</td><td>{_state(a['outcome'])}</td>"
            f"<td>{esc(a['error'] or '')}</td></tr>"
            for a in attempts
        )
        lag = "—" if life.lag is None else f"{life.lag} s"
        return (
            _definition_list(
                [
                    ("schedule", schedule + f" (v{found['schedule_version']}){made_by}"),
                    ("scheduled for", esc(found["scheduled_for"])),
                    ("due (receivable from)", esc(found["available_at"])),
                    ("sent", esc(found["enqueued_at"] or "not yet claimed")),
                    ("receivable", esc(utc_text(life.receivable) if life.receivable else "—")),
                    ("delivery lag (receivable - due)", lag),
                    ("claimed", esc(utc_text(life.claimed_at) if life.claimed_at else "—")),
                    ("waited for a worker (claimed - due)", waited),
                    *_state_times(found["times"]),
                    ("result", _state(found["state"]) + f" {esc(found['reason'] or '')}"),
                ]
            )
            + timeline_svg([life], int(life.scheduled) - 30, int(self.now()))
            + "<h2>Attempts</h2>"
            + (
                "<table><tr><th>#</th><th>started</th><th>finished</th><th>outcome</th>"
                f"<th>error</th></tr>{rows}</table>"
                if attempts
                else "<p>No attempt yet.</p>"
            )
        )

    def _last_hour(self, client: Api) -> tuple[list[Life], int]:
        """Every occurrence of every schedule of the tenant scheduled in the last hour, each
        with when it was first claimed (the listing says: no read per occurrence), and now.
        One listing per schedule (a page holds an hour of minutely fires), a few at once.
        (Not the tenant's ledger: it pages a live hour's 10,000 occurrences 100 at a time,
        reading every schedule again for each page: 80 s, docs/decisions.md 2026-12-07.)"""
        now = int(self.now())
        window = {"from": utc_text(now - HOUR), "to": utc_text(now)}
        schedules = client.pages("/v1/schedules", "schedules", limit=PAGE_SIZE)

        def read(schedule: dict[str, Any]) -> list[Life]:
            path = f"/v1/schedules/{schedule['schedule_id']}/occurrences"
            name = schedule["name"] or schedule["schedule_id"]
            flexible = schedule["flexible_window_seconds"] > 0
            return [
                Life(o, name, epoch(o.get("claimed_at")), flexible)
                for o in client.pages(path, "occurrences", limit=PAGE_SIZE, **window)
            ]

        with ThreadPoolExecutor(max_workers=READERS) as readers:
            return [life for lives in readers.map(read, schedules) for life in lives], now

    def _timeline(self, client: Api, view: View) -> str:
        lives, now = self._last_hour(client)
        if not lives:
            return "<p>No occurrence was scheduled in the last hour.</p>"
        latest = sorted(lives, key=lambda life: life.scheduled)[-30:][::-1]
        # The hour, or less where the first occurrence is younger (a stack just started).
        start = max(now - HOUR, min(life.scheduled for life in lives) - 60)
        names = {life.occurrence["schedule_id"]: life.schedule_name for life in lives}
        return (
            f"<p>{len(lives):,} occurrences of {len(names)} schedules.</p>"
            + timeline_svg(lives, start, now)
            + "<h2>The latest 30</h2>"
            + _occurrence_table([life.occurrence for life in latest], view, "UTC", names, now)
        )

    def _lag(self, client: Api) -> str:
        lives, now = self._last_hour(client)
        backlog = [
            life for life in lives if life.occurrence["state"] == "SCHEDULED" and life.due <= now
        ]
        waiting = sum(1 for life in lives if life.occurrence["state"] == "RETRY_WAIT")
        oldest = min((life.due for life in backlog), default=None)
        backlog_text = (
            f"<p class=backlog>Due and not yet taken by a worker: <b>{len(backlog)}</b>"
            + (f", the oldest due {esc(utc_text(oldest))} ({now - oldest} s ago)" if oldest else "")
            + f"; waiting for a retry: <b>{waiting}</b>.</p>"
        )
        lags = [(float(life.lag), life.kind) for life in lives if life.lag is not None]
        waits = [(float(life.waited), life.kind) for life in lives if life.waited is not None]
        charts = ""
        if lags:
            charts += "<h2>Delivery lag (receivable - due)</h2>" + histogram_svg(
                lags, "lag histogram", "delivery lag (s), receivable - due"
            )
        if waits:
            charts += "<h2>Waited for a worker (claimed - due)</h2>" + histogram_svg(
                waits, "wait histogram", "waited for a worker (s), claimed - due"
            )
        return (
            f"<p>{len(lives):,} occurrences scheduled in the last hour, {len(waits):,} claimed by"
            " a worker. Strict and flexible fires are apart; runs made by a request (run now,"
            " backfill) are apart from both.</p>"
            + _lag_table(lives)
            + charts
            + "<h2>Backlog</h2>"
            + backlog_text
        )

    def _tenants_page(self, view: View, tenant: str) -> str:
        """Every tenant (GET /v1/admin/tenants, as the operator) with its usage and the key
        to read as it, and one looked up by its id. The API does not say which principals a
        tenant has: a key is found by asking the API which tenant it acts as (GET
        /v1/tenant), for the keys seen so far and for the local stack's habit, a key named
        after its tenant (``demo`` acts as ``demo``)."""
        operator = self._api(self.operator_key)
        found = ""
        if tenant:
            record = operator.get(f"/v1/admin/tenants/{quote(tenant, safe='')}")
            key = self._key_of(record["tenant_id"])
            found = "<h2>Tenant " + esc(record["tenant_id"]) + "</h2>" + _tenant_figures(record)
            if key is None:
                arn = f"arn:aws:iam::{ACCOUNT}:user/{record['tenant_id']}"
                found += (
                    f"<p class=note>No access key known to act as {esc(record['tenant_id'])}:"
                    f" locally, key K signs as arn:aws:iam::{ACCOUNT}:user/K."
                    " Bind one (<code>POST /v1/admin/tenants/"
                    f'{esc(record["tenant_id"])}/principals {{"principal_arn": '
                    f'"{esc(arn)}"}}</code>) and look again, or type its key in the'
                    " header.</p>"
                )
            else:
                switched = View(key)
                link = _link("", switched, f"Open {record['tenant_id']}'s console")
                found += f"<p class=open>{link} (as key <code>{esc(key)}</code>)</p>"
        listed = operator.pages("/v1/admin/tenants", "tenants", limit=PAGE_SIZE)[:MAX_TENANTS]
        rows = "".join(_tenant_row(record, self._key_of(record["tenant_id"])) for record in listed)
        return (
            "<p class=note>Every tenant, as the operator reads them. The API does not say which"
            " access keys act as a tenant: the key shown is one this console has read as, or"
            " the key named after the tenant when it acts as it (the local habit).</p>"
            f"<form method=get action='{PREFIX}/tenants' class=lookup>"
            f"<input type=hidden name=as value='{esc(view.key)}'>"
            f"<label>tenant id <input name=tenant value='{esc(tenant)}' size=20></label>"
            " <button>look up</button></form>"
            + found
            + "<h2>Tenants</h2>"
            + (
                "<table class=tenants><tr><th>tenant</th><th>schedules</th>"
                "<th>busiest strict minute</th><th>access key</th><th></th></tr>"
                + rows
                + "</table>"
                if rows
                else "<p>None yet.</p>"
            )
        )

    def _key_of(self, tenant: str) -> str | None:
        """An access key id that acts as ``tenant``: one seen to, else the key named after
        it, if the API says it acts as the tenant."""
        for key, known in sorted(dict(self._tenants).items()):
            if known == tenant:
                return key
        if _ID.match(tenant) and self._tenant_of(tenant) == tenant:
            return tenant
        return None

    def _ledger(self, client: Api, view: View) -> str:
        """The tenant's last day across its schedules (GET /v1/occurrences): each ended
        hour's counts, the exceptions the reconciler listed, then the next hour's fires."""
        items: list[dict[str, Any]] = []
        hours: list[dict[str, Any]] = []
        token = None
        for _ in range(LEDGER_PAGES):
            page = client.get("/v1/occurrences", next_token=token)
            items += page["occurrences"]
            hours += page["hours"]
            token = page["next_token"]
            if token is None:
                break
        checked = "".join(
            f"<tr><td>{esc(h['hour'])}</td><td>{h['shards_checked']} of {h['shards']}</td>"
            f"<td>{esc(_findings(h['counts']) or '—')}</td><td>{h['retried']}</td></tr>"
            for h in reversed(hours)
        )
        recorded = [i for i in items if i["state"] != "UPCOMING"]
        upcoming = [i for i in items if i["state"] == "UPCOMING"]
        more = "<p>More than the console reads: the CLI's <code>punctual ledger</code>.</p>"
        return (
            "<p>The reconciler checks an hour about two hours after it ends; until then the "
            "hour shows 0 shards checked (a schedule's own page lists its occurrences at "
            "once).</p><h2>Hours</h2><table class=hours><tr><th>hour</th><th>checked</th>"
            f"<th>findings</th><th>retried</th></tr>{checked}</table>"
            f"<h2>Exceptions</h2>{_ledger_table(recorded[::-1], view, 'exceptions')}"
            f"<h2>Next fires</h2>{_ledger_table(upcoming[:LEDGER_UPCOMING], view, 'upcoming')}"
            + (more if token is not None else "")
        )

    def _reconciler(self, operator: Api) -> str:
        found = operator.get("/v1/admin/reconcile")
        rows = "".join(
            f"<tr><td>{r['shard']}</td><td>{esc(_clock(r['run_at']))}</td>"
            f"<td>{'yes' if r['complete'] else 'no'}</td><td>{r['schedules']}</td>"
            f"<td>{esc(_findings(r['counts']))}</td>"
            f"<td>{r['repaired_fired']}</td><td>{r['repaired_missed']}</td><td>{r['deferred']}</td>"
            f"<td>{r['cursors_moved']}</td><td>{r['redriven']}</td></tr>"
            for r in found["reports"]
        )
        head = (
            f"<p>Window {esc(found['window_start'])} .. {esc(found['window_end'])}: "
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

    def _page(self, title: str, body: str, view: View, here: str) -> str:
        """``here``: the page the tenant picker stays on (a list page; a schedule or an
        occurrence is one tenant's, so switching from it goes to the schedules)."""
        nav = " ".join(
            _link(path, view, label)
            for path, label in (
                ("", "Schedules"),
                ("timeline", "Last hour"),
                ("ledger", "Ledger"),
                ("lag", "Lag"),
                ("tenants", "Tenants"),
                ("reconciler", "Reconciler"),
            )
        )
        now = int(self.now())
        tenant = self._tenants.get(view.key)
        acting = f"tenant <code>{esc(tenant)}</code>" if tenant else "no tenant"
        return f"""<!doctype html>
<html lang=en><head><meta charset=utf-8><title>{esc(title)} · Punctual</title>
<link rel=icon href="data:,"><style>{_STYLE}</style></head>
<body><header><b>Punctual</b> local console <nav>{nav}</nav>
<form method=get action="{esc(f"{PREFIX}/{here}".rstrip("/"))}" class=picker>
<label>tenant <select name=as>{self._choices(view.key)}</select></label>
<label>or key <input name=key size=10 placeholder="access key id"></label>
<button>switch</button></form></header>
<main><h1>{esc(title)}</h1>{body}</main>
<footer>Read through the API as <code>{esc(view.key)}</code> ({acting}) at
{esc(utc_text(now))}.</footer>
</body></html>"""

    def _choices(self, key: str) -> str:
        """The picker's options: each tenant read so far with the key that acts as it."""
        known = dict(self._tenants)
        choices = sorted(known.items(), key=lambda item: (item[1], item[0]))
        for unknown in {key, self.default_key} - set(known):
            choices.insert(0, (unknown, ""))
        return "".join(
            f"<option value='{esc(k)}'{' selected' if k == key else ''}>"
            + (f"{esc(t)} (key {esc(k)})" if t else f"key {esc(k)} (no tenant)")
            + "</option>"
            for k, t in choices
        )


class _NotFound(Exception):
    pass


class _BadRequest(Exception):
    pass


def _count(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _html(status: int, page: str) -> dict[str, Any]:
    return {
        "statusCode": status,
        "headers": {"Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-store"},
        "body": page,
    }


def _link(path: str, view: View, label: object) -> str:
    url = f"{PREFIX}/{path}".rstrip("/") + "?" + view.query()
    return f'<a href="{esc(url)}">{esc(label)}</a>'


def _state(state: str) -> str:
    return f"<span class='state {esc(state.lower())}'>{esc(state)}</span>"


def _zone(schedule: dict[str, Any]) -> str:
    return str(schedule["spec"].get("timezone") or "UTC")


_GAP_WORDS = {"SKIP": "skipped", "SHIFT": "run at the gap's end"}
_REPEAT_WORDS = {
    "FIRST": "run at the earlier instant",
    "LAST": "run at the later instant",
    "BOTH": "run at both instants",
}


def _dst(spec: dict[str, Any]) -> str:
    """What its wall times do where the clocks skip or repeat them (docs/time.md)."""
    if spec["kind"] == "rate":
        return "not affected (elapsed time)"
    choice = spec.get("dst") or {}
    gap, repeat = choice.get("gap", "SKIP"), choice.get("repeat", "FIRST")
    return (
        f"a skipped time is {_GAP_WORDS[gap]} ({gap}); "
        f"a repeated time is {_REPEAT_WORDS[repeat]} ({repeat})"
    )


def _version(schedule: dict[str, Any]) -> str:
    """Its version, and the version its occurrences carry when a rename kept an older one."""
    version, runs = schedule["version"], schedule.get("run_version", schedule["version"])
    return str(version) if runs == version else f"{version} (its fires: version {runs}'s)"


def _filter_form(view: View, counts: Counter[str], total: int) -> str:
    """The search and the state filter, as GET parameters (``q``, ``state``)."""
    options = [("", f"all ({total})")] + [(s, f"{s} ({counts.get(s, 0)})") for s in STATES]
    choices = "".join(
        f"<option value='{s}'{' selected' if s == view.state else ''}>{esc(label)}</option>"
        for s, label in options
    )
    clear = " " + _link("", View(view.key), "clear") if view.search or view.state else ""
    return (
        f"<form method=get action='{PREFIX}' class=filter>"
        f"<input type=hidden name=as value='{esc(view.key)}'>"
        f"<label>name contains <input name=q value='{esc(view.search)}' size=24></label> "
        f"<label>state <select name=state>{choices}</select></label> "
        f"<button>filter</button>{clear}</form>"
    )


def _schedule_row(
    schedule: dict[str, Any], view: View, now: int, change: tuple[int, str, str] | None
) -> str:
    """One schedule's row: its next fire from the listing (in its zone's local time, marked
    when a clock change comes before it), and its zone's next clock change."""
    zone = _zone(schedule)
    schedule_id = schedule["schedule_id"]
    name = _link(f"schedules/{schedule_id}", view, schedule["name"] or schedule_id)
    fire = epoch(schedule.get("next_fire_at"))
    notes = ""
    if change is not None and schedule["state"] == "ACTIVE":
        day = datetime.fromtimestamp(change[0], ZoneInfo(zone)).date()
        notes = f"<div class=note>next clock change {day}: see the schedule</div>"
    if fire is None:
        shown = "—"
    else:
        local = datetime.fromtimestamp(fire, ZoneInfo(zone)).isoformat(sep=" ")
        if fire > now:
            when = _until(fire - now)
        elif schedule["flexible_window_seconds"]:
            when = "in its flexible window now"
        else:
            when = "due now"
        text = f"{esc(local)} <span class=in>({esc(when)})</span>"
        if change is not None and change[0] <= fire:
            shown = f"<span class=dst title='after a clock change'>{text} ⚑ DST</span>"
        else:
            shown = f"<span>{text}</span>"
        shown = f"<div class=fires>{shown}</div>"
    return (
        f"<tr><td>{name}<div class=id>{esc(schedule_id)}</div></td>"
        f"<td>{_state(schedule['state'])}</td><td>{_rule_cell(schedule['spec'])}</td>"
        f"<td>{esc(zone)}</td><td>{shown}{notes}</td><td>{_missed_summary(schedule)}</td></tr>"
    )


def _until(seconds: int) -> str:
    """How far ahead, in the largest unit that says it: "in 40 s", "in 3 h 5 min"."""
    if seconds < 60:
        return f"in {seconds} s"
    if seconds < HOUR:
        return f"in {seconds // 60} min"
    if seconds < 2 * 86400:
        return f"in {seconds // HOUR} h {seconds % HOUR // 60} min"
    return f"in {seconds // 86400} days"


def _spacing(fires: list[dict[str, Any]]) -> int:
    instants = [epoch(f["utc"]) or 0 for f in fires[:2]]
    return instants[1] - instants[0] if len(instants) == 2 else 0


def _marked_fires(fires: Iterable[dict[str, Any]]) -> str:
    """Fires in local time; one whose UTC offset differs from the fire before it is marked
    (a clock change lies between them)."""
    out = []
    previous = None
    for fire in fires:
        offset = utc_offset(fire["local"])
        text = esc(fire["local"].replace("T", " "))
        if previous is not None and offset != previous:
            out.append(f"<span class=dst title='clock change from {previous}'>{text} ⚑ DST</span>")
        else:
            out.append(f"<span>{text}</span>")
        previous = offset
    return "<div class=fires>" + "".join(out) + "</div>" if out else "—"


def _next_fires_table(fires: list[dict[str, Any]], view: View) -> str:
    """The next fires: local time (a clock change marked), UTC, when the message becomes
    receivable (later in a flexible window), and the occurrence once it is made."""
    rows = []
    previous = None
    for fire in fires:
        offset = utc_offset(fire["local"])
        local = esc(fire["local"].replace("T", " "))
        if previous is not None and offset != previous:
            local = f"<span class=dst>{local} ⚑ DST</span>"
        previous = offset
        made = fire.get("occurrence_id")
        occurrence = _link(f"occurrences/{made}", view, "made") if made else "planned"
        receivable = fire.get("available_at") or fire["utc"]
        rows.append(
            f"<tr><td>{local}</td><td>{esc(fire['utc'])}</td>"
            f"<td>{esc(receivable if receivable != fire['utc'] else 'at its time')}</td>"
            f"<td>{occurrence}</td></tr>"
        )
    return (
        "<table class=next><tr><th>local time</th><th>UTC</th><th>receivable</th>"
        "<th>occurrence</th></tr>" + "".join(rows) + "</table>"
    )


def _results_summary(runs: list[dict[str, Any]], zone: str) -> str:
    """How the runs ended, counted by result, and the latest one's result."""
    counts = Counter(o["state"] for o in runs)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    said = " · ".join(f"{_state(state)} {count}" for state, count in ranked)
    manual = sum(1 for o in runs if o.get("manual"))
    made = f" ({manual} run now or backfilled)" if manual else ""
    latest = runs[0]
    when = _clock(epoch(latest["scheduled_for"]), zone)
    return (
        f"<p class=results>{_count(len(runs), 'occurrence')}{made}: {said}. The latest, "
        f"{esc(when)}: "
        f"{_state(latest['state'])} {esc(latest['reason'] or '')}</p>"
    )


def _spread(found: dict[str, int] | None) -> str:
    if found is None:
        return "none measured"
    return (
        f"p50 {found['p50_seconds']} s · p99 {found['p99_seconds']} s · "
        f"max {found['max_seconds']} s ({_count(found['count'], 'fire')})"
    )


def _recent_figures(recent: dict[str, Any] | None, zone: str) -> str:
    """How the schedule's last fires went (its GET's ``recent``): lags, outcomes, the last
    failure."""
    if recent is None or not recent["fires"]:
        return "<p>No fire due yet.</p>"
    outcomes = " · ".join(f"{name} {count}" for name, count in recent["outcomes"].items())
    failure = recent["last_failure"]
    failed = (
        "none"
        if failure is None
        else f"{esc(failure['what'])} at {esc(_clock(epoch(failure['at']), zone))}: "
        f"{esc(failure['error'] or '')} <code>{esc(failure['occurrence_id'] or '')}</code>"
    )
    rows = [
        ("fires", f"{recent['fires']} since {esc(_clock(epoch(recent['since']), zone))}"),
        ("receivable lag", _spread(recent["receivable_lag"])),
        ("handler start lag", _spread(recent["start_lag"])),
        ("outcomes", esc(outcomes)),
        ("last failure", failed),
    ]
    if recent["unreadable"]:
        rows.append(("unreadable items", f"<b class=missed>{recent['unreadable']}</b>"))
    return _definition_list(rows)


def _missed_summary(schedule: dict[str, Any]) -> str:
    total = schedule["missed_total"]
    if not total:
        return "none"
    episodes = "".join(
        f"<div>{e['count']} from {esc(e['first'])} to {esc(e['last'])} (v{e['version']})</div>"
        for e in schedule["missed"][-3:]
    )
    return f"<b class=missed>{total}</b>{episodes}"


def _findings(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if v) or "—"


def _state_times(times: dict[str, Any]) -> list[tuple[str, str]]:
    """The occurrence page's rows of where its time went after it became receivable (the
    API's ``times``; the delivery lag is its own row)."""

    def seconds(values: list[int]) -> str:
        return ", ".join(f"{v} s" for v in values) or "—"

    claim = times["to_claim_seconds"]
    return [
        ("receivable → claimed", "—" if claim is None else f"{claim} s"),
        ("each run (claimed → finished)", seconds(times["run_seconds"])),
        ("each retry's wait", seconds(times["retry_wait_seconds"])),
    ]


def _definition_list(items: list[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def _tenant_row(record: dict[str, Any], key: str | None) -> str:
    """A tenant's row: its usage, and the key that reads as it with a link, if one is known."""
    opened = (
        f"<td><code>{esc(key)}</code></td><td>{_link('', View(key), 'open its console')}</td>"
        if key
        else "<td colspan=2>no key known: look it up below</td>"
    )
    return (
        f"<tr><td>{esc(record['tenant_id'])}</td><td>{record['schedule_count']}</td>"
        f"<td>{record['strict_fires_per_minute_peak']}</td>{opened}</tr>"
    )


def _tenant_figures(record: dict[str, Any]) -> str:
    quotas = ", ".join(f"{k} {v}" for k, v in sorted(record["quotas"].items()))
    return _definition_list(
        [
            ("schedules", esc(record["schedule_count"])),
            ("busiest minute", _count(record["strict_fires_per_minute_peak"], "strict fire")),
            ("quotas", esc(quotas)),
        ]
    )


def _lag_table(lives: list[Life]) -> str:
    """Per group (strict, flexible, manual, all): how many, and the delivery lag and the
    wait for a worker, each with how many it was measured on and its p50/p95/p99."""

    def figures(values: list[float]) -> str:
        if not values:
            return "<td>0</td><td>—</td><td>—</td><td>—</td>"
        cells = "".join(f"<td>{percentile(values, p):g} s</td>" for p in (50, 95, 99))
        return f"<td>{len(values)}</td>{cells}"

    rows = []
    groups = [(kind, label, [life for life in lives if life.kind == kind]) for kind, label in KINDS]
    for kind, label, members in [*groups, ("all", "all", lives)]:
        lags = [float(life.lag) for life in members if life.lag is not None]
        waits = [float(life.waited) for life in members if life.waited is not None]
        rows.append(
            f"<tr class='k-{kind}'><th>{esc(label)}</th><td>{len(members)}</td>"
            f"{figures(lags)}{figures(waits)}</tr>"
        )
    return (
        "<table class=lag><tr><th rowspan=2>occurrences</th><th rowspan=2>in the hour</th>"
        "<th colspan=4>Delivery lag (receivable - due)</th>"
        "<th colspan=4>Waited for a worker (claimed - due)</th></tr>"
        "<tr><th>measured</th><th>p50</th><th>p95</th><th>p99</th>"
        "<th>measured</th><th>p50</th><th>p95</th><th>p99</th></tr>" + "".join(rows) + "</table>"
    )


def _occurrence_table(
    occurrences: list[dict[str, Any]],
    view: View,
    zone: str,
    names: dict[str, str] | None = None,
    now: float | None = None,
    css: str = "occurrences",
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
        when = _link(f"occurrences/{o['occurrence_id']}", view, _clock(life.scheduled, zone))
        manual = " <span class=manual>manual</span>" if o.get("manual") else ""
        owner = ""
        if names is not None:
            schedule_id = o["schedule_id"]
            label = names.get(schedule_id) or schedule_id
            owner = f"<td>{_link(f'schedules/{schedule_id}', view, label)}</td>"
        late = " class=late" if waited_too_long(life, now) else ""
        rows.append(
            f"<tr{late}><td>{when}</td>{owner}"
            f"<td>{_state(o['state'])}{manual}</td><td>{esc(o['available_at'])}</td>"
            f"<td>{esc(o['enqueued_at'] or '—')}</td><td>{lag}</td><td>{waited}</td>"
            f"<td>{o['attempt_count']}</td><td>{esc(o['reason'] or '')}</td></tr>"
        )
    schedule_head = "<th>schedule</th>" if names is not None else ""
    more = len(occurrences) - 100
    tail = f"<p>{more} more, older.</p>" if more > 0 else ""
    return (
        f"<table class={css}><tr><th>scheduled for</th>{schedule_head}<th>result</th>"
        "<th>due</th><th>sent</th><th>delivery lag</th><th>waited for a worker</th>"
        "<th>attempts</th><th>reason</th></tr>" + "".join(rows) + "</table>" + tail
    )


def _ledger_table(items: list[dict[str, Any]], view: View, css: str) -> str:
    if not items:
        return "<p>None.</p>"
    rows = []
    for item in items:
        occurrence = "occurrences/" + item["occurrence_id"]
        schedule = "schedules/" + item["schedule_id"]
        rows.append(
            f"<tr><td>{_link(occurrence, view, item['scheduled_for'])}</td>"
            f"<td>{_link(schedule, view, item['schedule_id'])}</td>"
            f"<td>{_state(item['state'])}</td><td>{esc(item['finding'] or '—')}</td>"
            f"<td>{item['attempts']}</td><td>{esc(item['target'] or '')}</td></tr>"
        )
    return (
        f"<table class={css}><tr><th>scheduled for</th><th>schedule</th><th>state</th>"
        "<th>finding</th><th>attempts</th><th>target</th></tr>" + "".join(rows) + "</table>"
    )


def _retry(policy: dict[str, Any]) -> str:
    return (
        f"{policy['max_attempts']} attempts, back-off {policy['backoff_base_seconds']} s "
        f"doubling to {policy['backoff_max_seconds']} s, within "
        f"{policy['deadline_seconds']} s of the fire"
    )


_STYLE = """tr.late td{background:#fff3e0} tr.late td:first-child{border-left:3px solid #e08a00}
.manual{font-size:11px;color:#6a3;border:1px solid #6a3;border-radius:3px;padding:0 3px}

body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#fafbfc}
header{background:#1d2330;color:#fff;padding:8px 16px;display:flex;gap:18px;align-items:center}
header a{color:#cfe0ff;margin-right:12px} header form{margin-left:auto}
header select,header input{max-width:220px}
main{padding:8px 16px} footer{color:#777;padding:8px 16px;font-size:12px}
table{border-collapse:collapse;margin:8px 0} th,td{border-bottom:1px solid #e2e5ea;
padding:4px 8px;text-align:left;vertical-align:top} th{background:#eef1f5}
.id{color:#888;font-size:11px} .note,.notes{color:#8a5a00;font-size:12px}
.words{color:#445;font-size:12px;font-style:italic} .in{color:#777;font-size:12px}
form.filter,form.lookup{margin:8px 0;padding:8px;background:#eef1f5;border-radius:4px}
.count,.results{color:#555}
.fires span{display:block} .dst{color:#b35900;font-weight:600}
.state{padding:1px 6px;border-radius:8px;background:#e6e9ef;font-size:12px}
.state.active,.state.succeeded{background:#d9f2df}
.state.paused,.state.retry_wait{background:#fff0c2}
.state.canceled,.state.dead,.state.missed,.state.lost{background:#fbd9d9}
.state.running,.state.scheduled{background:#dde9ff}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 14px} dt{color:#666}
table.lag td,table.lag th{text-align:right} table.lag tr th:first-child{text-align:left}
table.lag tr.k-all td,table.lag tr.k-all th{font-weight:600;border-top:2px solid #c9ced6}
svg text{font-size:11px;fill:#333} .tick{text-anchor:middle;fill:#666}
.count{font-weight:600;fill:#333}
.axis,.row{stroke:#c9ced6} .span{stroke:#9aa3b2;stroke-width:2}
circle.fire{fill:#3b6fd6} circle.dst{fill:#d97a00} circle.scheduled{fill:#fff;stroke:#555}
rect.receivable{fill:#3b6fd6} polygon.claimed{fill:#2e9d4b} polygon.claimed.dead{fill:#c33}
rect.bar.strict{fill:#3b6fd6} rect.bar.flexible{fill:#8fb3ee} rect.bar.manual{fill:#6a3}
.p{stroke-width:2} .p50{stroke:#2e9d4b} .p95{stroke:#d97a00}
.p99{stroke:#c33} .plabel{font-weight:600} .missed{color:#c33} .error{color:#c33}
rect.m{fill:#7aa2e8} rect.m.succeeded{fill:#2e9d4b}
rect.m.dead,rect.m.missed,rect.m.canceled{fill:#c33} rect.m.late{fill:#e08a00}
.legend .l-scheduled{color:#555} .legend .l-receivable{color:#3b6fd6}
.legend .l-claimed,.legend .l-succeeded{color:#2e9d4b} .legend .l-open{color:#7aa2e8}
.legend .l-dead{color:#c33} .legend .l-late{color:#e08a00}
"""
