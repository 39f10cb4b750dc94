"""The console's pages over a fake API (no stack, no network): what each page reads and
shows. The answers have the API's shapes (functions/api/views.py); tests/e2e/test_console.py
opens the same pages in Chromium against the local stack."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from punctual.timing import utc_text
from punctual_client.http import ApiError
from punctual_local.console import HOUR, Console
from tests.instants import epoch

NOW = epoch("2026-12-02T12:00:00Z")


def schedule(n: int, name: str | None, **given: Any) -> dict[str, Any]:
    found: dict[str, Any] = {
        "schedule_id": f"sch_demo.s{n:04d}",
        "name": name,
        "state": "ACTIVE",
        "spec": {"kind": "cron", "expression": "* * * * *", "timezone": "UTC"},
        "target": "default",
        "payload": {},
        "flexible_window_seconds": 0,
        "misfire": {"action": "FIRE_ONCE"},
        "overlap": "ALLOW",
        "retry": {
            "max_attempts": 3,
            "backoff_base_seconds": 10,
            "backoff_max_seconds": 900,
            "deadline_seconds": 86400,
        },
        "version": 1,
        "run_version": 1,
        "created_at": "2026-12-01T00:00:00+00:00",
        "updated_at": "2026-12-01T00:00:00+00:00",
        "next_fire_at": utc_text(NOW + 60),
        "next_run_at": utc_text(NOW + 180),
        "missed_total": 0,
        "missed": [],
    }
    return found | given


def occurrence(
    schedule_id: str, at: int, state: str = "SUCCEEDED", *, due: int | None = None, **given: Any
) -> dict[str, Any]:
    due = at if due is None else due
    claimed = due + 2 if state == "SUCCEEDED" else None
    found: dict[str, Any] = {
        "occurrence_id": f"occ_{schedule_id}_{at}_1",
        "schedule_id": schedule_id,
        "schedule_version": 1,
        "scheduled_for": utc_text(at),
        "available_at": utc_text(due),
        "state": state,
        "target": "default",
        "attempt_count": 1 if claimed else 0,
        "enqueued_at": utc_text(due - 60) if claimed else None,
        "claimed_at": utc_text(claimed) if claimed else None,
        "reason": None,
        "manual": False,
    }
    return found | given


class FakeApi:
    """The API as the console reads it, from memory, for every access key id: ``keys``
    maps the keys bound to a tenant; ``operator`` reads the admin routes. Every read is
    recorded (path, query)."""

    def __init__(self) -> None:
        self.keys = {"demo": "demo"}
        self.tenants = {"demo": 0}
        self.operator = "operator"
        self.schedules: list[dict[str, Any]] = []
        self.occurrences: list[dict[str, Any]] = []
        self.next_fires: dict[str, list[dict[str, Any]]] = {}
        self.recent: dict[str, dict[str, Any]] = {}  # each schedule's GET's ``recent``
        self.ledger: list[dict[str, Any]] = []  # GET /v1/occurrences's pages, in order
        self.reads: list[tuple[str, str, dict[str, Any]]] = []

    def as_key(self, key: str) -> Reader:
        return Reader(self, key)


class Reader:
    def __init__(self, api: FakeApi, key: str) -> None:
        self.api, self.key = api, key

    def _tenant(self) -> str:
        if self.key not in self.api.keys:
            raise ApiError(403, {"error": {"message": "no tenant"}})
        return self.api.keys[self.key]

    def get(self, path: str, **query: Any) -> Any:
        self.api.reads.append((self.key, path, query))
        if path == "/v1/tenant":
            return {"tenant_id": self._tenant()}
        if path.startswith("/v1/admin/tenants/"):
            self._operator()
            tenant = unquote(path.rsplit("/", 1)[1])
            if tenant not in self.api.tenants:
                raise ApiError(404, {"error": {"message": f"no tenant {tenant}"}})
            return self._tenant_record(tenant)
        if path == "/v1/occurrences":
            self._tenant()
            at = int(query.get("next_token") or 0)
            return self.api.ledger[at]
        if path.startswith("/v1/schedules/"):
            self._tenant()
            schedule_id = path.rsplit("/", 1)[1]
            found = next(s for s in self.api.schedules if s["schedule_id"] == schedule_id)
            fires = self.api.next_fires.get(schedule_id, [])
            assert query == {"recent": 100}
            recent = self.api.recent.get(schedule_id)
            return {"schedule": found, "next_fires": fires, "notes": [], "recent": recent}
        raise AssertionError(f"the fake API has no GET {path}")

    def post(self, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        assert path == "/v1/preview"
        return {"fires": [], "notes": []}

    def _operator(self) -> None:
        if self.key != self.api.operator:
            raise ApiError(403, {"error": {"message": "operator only"}})

    def _tenant_record(self, tenant: str) -> dict[str, Any]:
        return {
            "tenant_id": tenant,
            "quotas": {"max_schedules": 10000},
            "schedule_count": self.api.tenants[tenant],
            "strict_fires_per_minute_peak": 1,
        }

    def pages(self, path: str, key: str, **query: Any) -> list[Any]:
        self.api.reads.append((self.key, path, query))
        if path == "/v1/admin/tenants":
            self._operator()
            return [self._tenant_record(t) for t in self.api.tenants]
        self._tenant()
        if path == "/v1/schedules":
            return [s for s in self.api.schedules if query.get("state") in (None, s["state"])]
        if path.endswith("/versions"):
            return []
        schedule_id = path.split("/")[3]
        low, high = epoch(query["from"]), epoch(query["to"])
        return [
            o
            for o in self.api.occurrences
            if o["schedule_id"] == schedule_id and low <= epoch(o["scheduled_for"]) <= high
        ]


@pytest.fixture
def api() -> FakeApi:
    return FakeApi()


@pytest.fixture
def console(api: FakeApi) -> Console:
    return Console("", default_key="demo", operator_key="operator", now=lambda: NOW, api=api.as_key)


def page(console: Console, path: str, **query: str) -> tuple[int, str]:
    answer = console.answer("GET", path, {k: [v] for k, v in query.items()})
    return answer["statusCode"], answer["body"]


def rows(body: str, table: str) -> list[str]:
    found = re.search(rf"<table class={table}>(.*?)</table>", body, re.S)
    return found[1].split("<tr")[2:] if found else []


def links(body: str) -> list[dict[str, list[str]]]:
    return [
        parse_qs(urlsplit(href.replace("&amp;", "&")).query)
        for href in re.findall(r'href="([^"]*)"', body)
        if href.startswith("/console")
    ]


# --- the schedules: search, state, one listing ------------------------------------------


def test_schedules_are_searched_by_a_part_of_the_name_in_any_case(console: Console, api: FakeApi):
    # GIVEN three schedules, one unnamed
    api.schedules = [
        schedule(1, "Billing daily"),
        schedule(2, "nightly BILLING export"),
        schedule(3, None),
    ]
    # WHEN searched for "billing"
    status, body = page(console, "/console", q="billing")
    # THEN the two whose names hold it, in any case, are listed, and counted
    assert status == 200
    listed = rows(body, "schedules")
    assert len(listed) == 2
    assert "2 of 3 schedules" in body
    # AND an unnamed one is found by its id
    assert "sch_demo.s0003" in rows(page(console, "/console", q="S0003")[1], "schedules")[0]


def test_schedules_are_filtered_by_state_and_every_link_keeps_the_filter(
    console: Console, api: FakeApi
):
    # GIVEN schedules in each state
    api.schedules = [
        schedule(n, f"job {state.lower()}", state=state)
        for n, state in enumerate(["ACTIVE", "PAUSED", "PAUSED", "COMPLETED", "CANCELED"])
    ]
    # WHEN filtered to PAUSED, with a search
    status, body = page(console, "/console", state="paused", q="job")
    # THEN only the paused ones are listed, and the select counts each state
    assert status == 200
    assert len(rows(body, "schedules")) == 2
    assert "PAUSED (2)" in body
    assert "all (5)" in body
    assert "<option value='PAUSED' selected>" in body
    # AND every link of the page but "clear" carries the key, the search and the state
    kept = [q for q in links(body) if q.get("q") == ["job"] and q.get("state") == ["PAUSED"]]
    cleared = [q for q in links(body) if "q" not in q]
    assert len(kept) == len(links(body)) - len(cleared)
    assert len(kept) >= 5 + 2  # the menu and both schedules
    assert all(q["as"] == ["demo"] for q in links(body))


def test_a_search_is_shown_as_text_wherever_it_appears(console: Console, api: FakeApi):
    api.schedules = [schedule(1, "a")]
    status, body = page(console, "/console", q="'><script>x</script>")
    assert status == 200
    assert "<script>" not in body
    assert "value='&#x27;&gt;&lt;script&gt;x&lt;/script&gt;'" in body
    assert "No schedule matches" in body


def test_an_unknown_state_is_refused_and_said(console: Console, api: FakeApi):
    status, body = page(console, "/console", state="SLEEPING")
    assert status == 400
    assert "state is one of ACTIVE, PAUSED, COMPLETED, CANCELED" in body


def test_the_schedules_page_reads_one_listing_not_each_schedule(console: Console, api: FakeApi):
    # GIVEN 150 schedules
    api.schedules = [schedule(n, f"s{n}") for n in range(150)]
    # WHEN the schedules page is opened
    status, body = page(console, "/console")
    # THEN it read the listing once, in the API's largest pages, and no schedule by itself
    assert status == 200
    reads = [path for _, path, _ in api.reads if path != "/v1/tenant"]
    assert reads == ["/v1/schedules"]
    assert api.reads[-1][2]["limit"] == 100
    # AND shows the first 100, each with its next fire from the listing, in its zone
    assert len(rows(body, "schedules")) == 100
    assert "50 more" in body
    assert "2026-12-02 12:01:00+00:00" in body


def test_a_next_fire_after_a_clock_change_is_marked(console: Console, api: FakeApi):
    # GIVEN, on 2027-03-13, a New York schedule whose next fire is after the spring change
    now = epoch("2027-03-13T12:00:00Z")
    console.now = lambda: now
    spec = {"kind": "cron", "expression": "30 2 * * 1", "timezone": "America/New_York"}
    api.schedules = [schedule(1, "weekly", spec=spec, next_fire_at="2027-03-15T06:30:00Z")]
    # THEN the fire is in New York time, marked, and the change is named
    body = page(console, "/console")[1]
    assert "2027-03-15 02:30:00-04:00" in body
    assert "⚑ DST" in body
    assert "next clock change 2027-03-14" in body
    assert "at 02:30 every Monday" in body


# --- one schedule: its rule in words, next fires, recent runs ----------------------------


def test_a_schedules_page_shows_its_next_fires_and_its_recent_runs_with_results(
    console: Console, api: FakeApi
):
    # GIVEN a schedule with runs in the last day (one dead, one manual) and its next fires,
    # the first already made
    api.schedules = [schedule(1, "billing", spec={"kind": "rate", "expression": "rate(1 hour)"})]
    sid = "sch_demo.s0001"
    api.occurrences = [
        occurrence(sid, NOW - 3 * HOUR),
        occurrence(sid, NOW - 2 * HOUR, "DEAD", reason="failed 3 times: boom"),
        occurrence(sid, NOW - HOUR),
        occurrence(sid, NOW - 600, manual=True, occurrence_id=f"occ_{sid}_1_1.mabc"),
    ]
    api.next_fires[sid] = [
        {
            "utc": utc_text(NOW + 60),
            "local": "2026-12-02T12:01:00+00:00",
            "available_at": utc_text(NOW + 60),
            "occurrence_id": f"occ_{sid}_{NOW + 60}_1",
        },
        {
            "utc": utc_text(NOW + 3660),
            "local": "2026-12-02T13:01:00+00:00",
            "available_at": utc_text(NOW + 3660),
            "occurrence_id": None,
        },
    ]
    # WHEN its page is opened
    status, body = page(console, f"/console/schedules/{sid}")
    assert status == 200
    # THEN its rule is said in words
    assert "every hour" in body
    # AND its next fires are listed, the made one linked to its occurrence
    fires = rows(body, "next")
    assert len(fires) == 2
    assert f"occurrences/occ_{sid}_{NOW + 60}_1" in fires[0]
    assert "planned" in fires[1]
    # AND its recent runs, newest first, with their results counted and the dead one's why
    runs = rows(body, "runs")
    assert len(runs) == 4
    assert "manual" in runs[0]
    assert "failed 3 times: boom" in runs[2]
    summary = re.search(r"<p class=results>(.*?)</p>", body, re.S)
    assert summary is not None
    text = re.sub(r"<[^>]+>", "", summary[1])
    assert text.startswith("4 occurrences (1 run now or backfilled): SUCCEEDED 3 · DEAD 1.")


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        (
            {"kind": "cron", "expression": "30 1 * * *", "timezone": "America/New_York"},
            "a skipped time is skipped (SKIP); a repeated time is run at the earlier instant "
            "(FIRST)",
        ),
        (
            {
                "kind": "cron",
                "expression": "30 1 * * *",
                "timezone": "America/New_York",
                "dst": {"gap": "SHIFT", "repeat": "BOTH"},
            },
            "a skipped time is run at the gap&#x27;s end (SHIFT); a repeated time is run at "
            "both instants (BOTH)",
        ),
        ({"kind": "rate", "expression": "rate(1 hour)"}, "not affected (elapsed time)"),
    ],
)
def test_a_schedules_page_says_its_daylight_saving_choice(
    console: Console, api: FakeApi, spec: dict[str, Any], said: str
):
    # GIVEN a schedule with (or without) a DST choice; WHEN its page is opened
    api.schedules = [schedule(1, "nightly", spec=spec)]
    status, body = page(console, "/console/schedules/sch_demo.s0001")
    # THEN the choice is said in words
    assert status == 200
    assert f"<dt>daylight saving</dt><dd>{said}</dd>" in body


def test_a_schedules_page_shows_how_its_last_fires_went(console: Console, api: FakeApi):
    # GIVEN a schedule whose GET says how its last fires went, a failure among them
    api.schedules = [schedule(1, "nightly")]
    spread = {"count": 40, "p50_seconds": 0, "p99_seconds": 2, "max_seconds": 3}
    api.recent["sch_demo.s0001"] = {
        "fires": 42,
        "since": "2026-11-18T10:00:00Z",
        "receivable_lag": spread,
        "start_lag": spread | {"p50_seconds": 1, "max_seconds": 9},
        "outcomes": {"succeeded": 39, "retried": 2, "dead": 1, "missed": 2, "open": 0},
        "last_failure": {
            "occurrence_id": "occ_x",
            "scheduled_for": "2026-11-18T10:30:00Z",
            "at": "2026-11-18T10:31:00Z",
            "what": "DEAD",
            "error": "permanent: <refused>",
        },
        "unreadable": 1,
    }
    # WHEN its page is opened
    status, body = page(console, "/console/schedules/sch_demo.s0001")
    # THEN the figures are there, the worker's error escaped
    assert status == 200
    assert "<h2>How the last 100 fires went</h2>" in body
    assert "<dt>fires</dt><dd>42 since 2026-11-18 10:00:00 UTC</dd>" in body
    assert "<dt>receivable lag</dt><dd>p50 0 s · p99 2 s · max 3 s (40 fires)</dd>" in body
    assert "<dt>handler start lag</dt><dd>p50 1 s · p99 2 s · max 9 s (40 fires)</dd>" in body
    assert "<dd>succeeded 39 · retried 2 · dead 1 · missed 2 · open 0</dd>" in body
    assert "DEAD at 2026-11-18 10:31:00 UTC: permanent: &lt;refused&gt; <code>occ_x</code>" in body
    assert "<dt>unreadable items</dt>" in body
    # AND a schedule with no fire due yet says so
    api.recent["sch_demo.s0001"] = api.recent["sch_demo.s0001"] | {"fires": 0}
    assert "<p>No fire due yet.</p>" in page(console, "/console/schedules/sch_demo.s0001")[1]


# --- the last hour: every schedule, and the lag page's groups ---------------------------


def test_the_last_hour_reads_every_schedule_in_the_apis_largest_pages(
    console: Console, api: FakeApi
):
    # GIVEN 150 schedules with one occurrence each in the last hour
    api.schedules = [schedule(n, f"s{n}") for n in range(150)]
    api.occurrences = [occurrence(s["schedule_id"], NOW - 300) for s in api.schedules]
    # WHEN the lag page is opened
    status, body = page(console, "/console/lag")
    # THEN all 150 are counted (not only the first page of schedules)
    assert status == 200
    assert "150 occurrences scheduled in the last hour" in body
    listings = [q for _, path, q in api.reads if path.endswith("/occurrences")]
    assert len(listings) == 150
    assert {q["limit"] for q in listings} == {100}


def test_the_lag_page_counts_strict_flexible_and_manual_runs_apart(console: Console, api: FakeApi):
    # GIVEN a strict schedule and a flexible one (a 60 s window), each with runs in the last
    # hour, and a run now of the flexible one (manual: neither strict nor flexible)
    api.schedules = [
        schedule(1, "strict"),
        schedule(2, "flexible", flexible_window_seconds=60),
    ]
    strict, flexible = "sch_demo.s0001", "sch_demo.s0002"
    api.occurrences = [
        occurrence(strict, NOW - 600),
        occurrence(strict, NOW - 540),
        occurrence(strict, NOW - 480, "SCHEDULED"),  # due, not taken: the backlog
        occurrence(flexible, NOW - 600, due=NOW - 570),
        occurrence(flexible, NOW - 300, manual=True, occurrence_id=f"occ_{flexible}_1_1.mx"),
    ]
    # WHEN the lag page is opened
    body = page(console, "/console/lag")[1]

    # THEN each group is counted beside its percentiles: in the hour, lags and waits measured
    def cells(kind: str) -> list[str]:
        found = re.search(rf"<tr class='k-{kind}'><th>[^<]*</th>(.*?)</tr>", body)
        assert found is not None
        return re.findall(r"<td>([^<]*)</td>", found[1])

    # (sent ahead: no delivery lag; claimed 2 s after due: waited 2 s)
    assert cells("strict") == ["3", "2", "0 s", "0 s", "0 s", "2", "2 s", "2 s", "2 s"]
    assert cells("flexible")[:2] == ["1", "1"]
    assert cells("manual")[:2] == ["1", "1"]
    assert cells("all")[:2] == ["5", "4"]
    # AND the histograms stack the groups, each bar counted
    for label in ("lag histogram", "wait histogram"):
        chart = body.split(f"aria-label='{label}'")[1].split("</svg>")[0]
        kinds = Counter(re.findall(r"class='bar (\w+)'", chart))
        assert set(kinds) == {"strict", "flexible", "manual"}
        assert sum(int(n) for n in re.findall(r"class='tick count'>(\d+)<", chart)) == 4
    # AND the backlog is the strict one due and not taken
    assert "Due and not yet taken by a worker: <b>1</b>" in body


def test_a_dense_timeline_draws_one_mark_per_occurrence(console: Console, api: FakeApi):
    # GIVEN 40 schedules with a run every minute of the last hour, one of them late
    api.schedules = [schedule(n, f"s{n:02d}") for n in range(40)]
    api.occurrences = [
        occurrence(s["schedule_id"], NOW - 60 * m) for s in api.schedules for m in range(1, 61)
    ]
    api.occurrences[0]["claimed_at"] = utc_text(NOW - 60 + 200)
    # WHEN the timeline is opened
    body = page(console, "/console/timeline")[1]
    # THEN each occurrence is one mark (no spans, no per-mark titles), the late one apart
    chart = body.split("aria-label='occurrences timeline'")[1].split("</svg>")[0]
    assert chart.count("class='m ") == 2400
    assert chart.count(" late'") == 1
    assert "<circle" not in chart
    assert "2,400 occurrences of 40 schedules" in body


# --- the tenant picker -------------------------------------------------------------------


def test_an_operator_looks_a_tenant_up_and_its_key_joins_the_picker(console: Console, api: FakeApi):
    # GIVEN tenant acme, whose principal is the local key acme, and tenant beta, with none
    api.tenants |= {"acme": 3, "beta": 0}
    api.keys["acme"] = "acme"
    # WHEN acme is looked up on the tenants page
    status, body = page(console, "/console/tenants", tenant="acme")
    # THEN its figures are shown (read as the operator), and the key that acts as it
    assert status == 200
    assert ("operator", "/v1/admin/tenants/acme", {}) in api.reads
    assert "Open acme&#x27;s console" in body
    assert any(q == {"as": ["acme"]} for q in links(body))
    # AND every page's picker now offers acme with its key, beside demo
    body = page(console, "/console")[1]
    picker = re.search(r"<select name=as>(.*?)</select>", body, re.S)
    assert picker is not None
    assert re.findall(r">([^<]+)</option>", picker[1]) == ["acme (key acme)", "demo (key demo)"]
    assert "<option value='demo' selected>" in picker[1]
    # AND a tenant no key is known to act as is said so, with how to bind one
    body = page(console, "/console/tenants", tenant="beta")[1]
    assert "No access key known to act as beta" in body
    assert "arn:aws:iam::000000000000:user/beta" in body
    # AND a tenant that does not exist is the API's 404
    assert page(console, "/console/tenants", tenant="nobody")[0] == 404


def test_the_tenants_page_lists_every_tenant_with_its_usage_and_key(console: Console, api: FakeApi):
    # GIVEN tenants the console never read as: acme (its key acme), beta (no key)
    api.tenants |= {"acme": 3, "beta": 0}
    api.keys["acme"] = "acme"
    # WHEN the operator's tenants page is read
    status, body = page(console, "/console/tenants")
    # THEN every tenant is listed from the API (as the operator), with its schedules, and
    # a link to its console where a key acts as it
    assert status == 200
    assert ("operator", "/v1/admin/tenants", {"limit": 100}) in api.reads
    rows = re.findall(r"<tr><td>(\w+)</td><td>(\d+)</td>", body)
    assert rows == [("demo", "0"), ("acme", "3"), ("beta", "0")]
    assert any(q == {"as": ["acme"]} for q in links(body))
    assert "no key known" in body.split("<td>beta</td>", 1)[1].split("</tr>", 1)[0]


def test_a_key_typed_in_the_header_wins_over_the_picked_tenant(console: Console, api: FakeApi):
    api.keys["acme"] = "acme"
    status, body = page(console, "/console", **{"as": "demo", "key": "acme"})
    assert status == 200
    assert "Read through the API as <code>acme</code> (tenant <code>acme</code>)" in body
    assert {"acme"} == {key for key, _, _ in api.reads}


def test_a_key_bound_to_no_tenant_is_offered_as_itself(console: Console, api: FakeApi):
    status, body = page(console, "/console", **{"as": "stranger"})
    assert status == 403
    assert "<option value='stranger' selected>key stranger (no tenant)</option>" in body
    assert "<option value='demo'>key demo (no tenant)</option>" in body  # (not read yet)


# --- the ledger -------------------------------------------------------------------------


def ledger_item(n: int, at: int, state: str, finding: str | None) -> dict[str, Any]:
    return {
        "occurrence_id": f"occ_sch_demo.s{n:04d}_{at}_1",
        "schedule_id": f"sch_demo.s{n:04d}",
        "scheduled_for": utc_text(at),
        "state": state,
        "finding": finding,
        "attempts": 3 if state == "DEAD" else 0,
        "target": "default",
    }


def ledger_page(items: list[dict[str, Any]], hours: list[int], token: str | None) -> dict[str, Any]:
    return {
        "occurrences": items,
        "hours": [
            {
                "hour": utc_text(h),
                "shards": 4,
                "shards_checked": 4 if h < NOW - 2 * HOUR else 0,
                "checked_at": None,
                "counts": {"SUCCEEDED": 10, "DEAD": 1} if h < NOW - 2 * HOUR else {},
                "retried": 1,
                "unlisted": 0,
                "unreadable": 0,
            }
            for h in hours
        ],
        "upcoming_complete": True,
        "next_token": token,
    }


def test_ledger_page_shows_each_hours_counts_the_exceptions_and_the_next_fires(
    console: Console, api: FakeApi
):
    # GIVEN a ledger of two pages: a checked hour with a DEAD one, an unchecked hour, and
    # then two upcoming fires
    dead = ledger_item(1, NOW - 3 * HOUR + 60, "DEAD", "DEAD")
    later = [ledger_item(2, NOW + 60 * k, "UPCOMING", None) for k in (1, 2)]
    api.ledger = [
        ledger_page([dead], [NOW - 3 * HOUR, NOW - 2 * HOUR], "1"),
        ledger_page(later, [], None),
    ]
    # WHEN the ledger page is opened
    status, body = page(console, "/console/ledger")
    # THEN both pages were read, following the token
    assert [q.get("next_token") for _, p, q in api.reads if p == "/v1/occurrences"] == [None, "1"]
    assert status == 200
    # AND each hour is a row, newest first, with how many shards checked it and its findings
    hours = rows(body, "hours")
    assert len(hours) == 2
    assert "0 of 4" in hours[0]
    assert "4 of 4" in hours[1]
    assert "DEAD 1" in hours[1]
    # AND the DEAD one is listed, linked to its occurrence and its schedule
    [listed] = rows(body, "exceptions")
    assert "DEAD" in listed
    assert "occurrences/occ_sch_demo.s0001" in listed
    assert "schedules/sch_demo.s0001" in listed
    # AND the upcoming fires are listed in order
    assert len(rows(body, "upcoming")) == 2


def test_ledger_page_stops_after_its_pages_and_says_there_is_more(console: Console, api: FakeApi):
    many = [
        ledger_page([ledger_item(1, NOW - 3 * HOUR, "DEAD", "DEAD")], [], str(k + 1))
        for k in range(9)
    ]
    api.ledger = many
    status, body = page(console, "/console/ledger")
    assert status == 200
    assert len([r for r in api.reads if r[1] == "/v1/occurrences"]) == 5
    assert "punctual ledger" in body
