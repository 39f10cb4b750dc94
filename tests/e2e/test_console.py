"""The local console in a real browser: `punctual local up --demo` in a subprocess, its
pages at /console opened in headless Chromium (Debian's, driven by Playwright), each
checked for the demo's data and for a page without console errors. Screenshots are kept
in build/console/ (the README shows one of them).

Chromium comes from `make browser` (apt-get); `make test` installs it in the background and
these tests wait for it. Where it cannot be installed, they are skipped, saying why.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from punctual.control.plane import PREVIEW_COUNT
from punctual_local.console import next_clock_change
from tests.e2e.conftest import (
    REPO,
    Stack,
    StackFailed,
    launch,
    local_principal,
    ready,
    stop,
    tail,
    wait_for,
)
from tests.instants import epoch

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
STATUS = REPO / ".tools" / "browser.status"
INSTALL_LOG = REPO / ".tools" / "browser.log"
INSTALL_SECONDS = 300  # apt-get took about 70 s here
SHOTS = REPO / "build" / "console"
# The flags a sandboxed machine needs (no GPU, no network beyond loopback, root).
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
NEW_YORK = "daily 02:30, America/New_York"
ONE_SHOT = "one-shot in 10 s"


def chromium() -> str | None:
    """Chromium's path, once `make test`'s background installation is done; or why not."""
    installing = INSTALL_LOG.exists() and not STATUS.exists()
    deadline = time.monotonic() + INSTALL_SECONDS
    while installing and not STATUS.exists() and time.monotonic() < deadline:
        time.sleep(1)
    if CHROMIUM.exists():
        return None
    said = (
        INSTALL_LOG.read_text(encoding="utf-8").strip().splitlines() if INSTALL_LOG.exists() else []
    )
    return f"no Chromium at {CHROMIUM} ({said[-1] if said else 'run `make browser` as root'})"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = chromium()
    if missing:
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def demo(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A stack running the demo, once its one-shot has run and the reconciler has reported."""
    stack = launch(tmp_path_factory.mktemp("console"), None, "--demo", "--reconcile-every", "5")
    try:
        ready(stack)
        tenant = stack.client()

        def one_shot_done() -> bool:
            schedules = tenant.pages("/v1/schedules", "schedules")
            shot = [s["schedule_id"] for s in schedules if s["name"] == ONE_SHOT]
            if len(schedules) < 4 or not shot:
                return False
            made = tenant.get(f"/v1/schedules/{shot[0]}/occurrences")["occurrences"]
            # A fire is "due now" through the whole second it is due in (the API counts in
            # whole seconds), so the one-shot has no fire left only once that second is over.
            over = made and time.time() >= epoch(made[0]["scheduled_for"]) + 1
            return bool(over) and [o["state"] for o in made] == ["SUCCEEDED"]

        wait_for(one_shot_done, 90, "the demo's one-shot to run", every=1)
        operator = stack.client("operator")
        wait_for(lambda: operator.get("/v1/admin/reconcile")["reports"], 60, "a reconcile report")
        yield stack
    except StackFailed as failed:
        pytest.fail(str(failed))
    finally:
        stopped = stop(stack)
    assert stopped == (0, []), f"unclean stop {stopped}:\n{tail(stack.log)}"


def new_york_date(instant: int) -> str:
    """The date in New York of an instant, as the console shows it."""
    return str(datetime.fromtimestamp(instant, ZoneInfo("America/New_York")).date())


class Page:
    """A browser tab that records every console error and uncaught page error."""

    def __init__(self, browser: Any, stack: Stack) -> None:
        self.tab = browser.new_page(viewport={"width": 1200, "height": 900})
        self.base = stack.url
        self.errors: list[str] = []

        def console(message: Any) -> None:
            if message.type == "error":
                self.errors.append(message.text)

        self.tab.on("console", console)
        self.tab.on("pageerror", lambda error: self.errors.append(str(error)))

    def open(self, path: str) -> int:
        answer = self.tab.goto(self.base + path)
        status: int = answer.status
        return status

    def text(self) -> str:
        found: str = self.tab.locator("main").inner_text()
        return found

    def titled(self, prefix: str) -> str:
        """The title, once it begins with ``prefix`` (or after 10 s): a click that follows a
        link returns before the next page has loaded on a busy machine."""
        with contextlib.suppress(Exception):  # (a timeout: the title as it is, for the assert)
            self.tab.wait_for_function(
                f"document.title.startsWith({json.dumps(prefix)})", timeout=10_000
            )
        title: str = self.tab.title()
        return title

    def shoot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.tab.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


@pytest.fixture
def page(browser: Any, demo: Stack) -> Iterator[Page]:
    tab = Page(browser, demo)
    yield tab
    # THEN (every page) nothing went wrong in the browser
    assert tab.errors == []
    tab.tab.close()


def test_console_lists_the_demos_schedules_with_their_next_fires(page: Page):
    # WHEN the console's first page is opened
    assert page.open("/console") == 200
    page.shoot("schedules")
    # THEN each demo schedule is listed with its state, rule and zone
    text = page.text()
    for name in ("every minute, Asia/Kolkata", "every 2 minutes, flexible 60 s", NEW_YORK):
        assert name in text
    assert "cron 30 2 * * *" in text
    assert "America/New_York" in text
    # AND each rule is said in words beside its expression
    words = page.tab.locator("table.schedules .words").all_inner_texts()
    for said in ("every minute", "every 2 minutes", "at 02:30 every day", "once"):
        assert said in words
    change = next_clock_change("America/New_York", int(time.time()))
    assert change is not None
    day = new_york_date(change[0])
    assert text.count(f"next clock change {day}") == 1  # (New York's; Kolkata has none)
    assert ONE_SHOT in text
    # AND every active schedule with a fire left shows its next one in local time (the
    # one-shot has run: none left), read from the listing alone
    assert page.tab.locator(".fires").count() == 3
    assert "4 of 4 schedules" in text


def test_console_shows_a_schedules_next_clock_change_and_what_it_does(page: Page):
    # WHEN the New York schedule is opened from the list
    page.open("/console")
    page.tab.get_by_role("link", name=NEW_YORK).click()
    page.shoot("schedule")
    # THEN its versions, its next fires on a timeline, and the zone's next clock change are
    # shown, with what the change does to the 02:30 fire: it does not exist the night the
    # clocks spring forward (when they fall back, 01:00-01:59 repeats and 02:30 is unmoved)
    text = page.text()
    change = next_clock_change("America/New_York", int(time.time()))
    assert change is not None
    _, before, after = change
    assert f"Next clock change in America/New_York: {new_york_date(change[0])}" in text
    springs_forward = int(after) > int(before)
    assert ("02:30 does not exist in America/New_York" in text) == springs_forward
    assert page.tab.locator("svg[aria-label='next fires'] circle").count() == PREVIEW_COUNT
    assert page.tab.locator("table.versions").inner_text().count("v1") == 1
    assert "ACTIVE" in text
    # AND its rule in words, its next fires listed (local, UTC, made yet or planned) and
    # its recent runs (none yet at 02:30 New York time, or one)
    assert "at 02:30 every day" in text
    assert page.tab.locator("table.next tr").count() == PREVIEW_COUNT + 1
    assert "Recent runs (the last 24 hours)" in text
    # AND the page is titled by the schedule's name, and says what it sends and how it retries
    assert page.titled(f"Schedule {NEW_YORK}").startswith(f"Schedule {NEW_YORK}")
    for label in ("payload", "retry", "created", "updated"):
        assert label in text


def test_console_follows_an_occurrence_through_its_life(page: Page):
    # WHEN the one-shot's occurrence is opened from its schedule's page
    page.open("/console")
    page.tab.get_by_role("link", name=ONE_SHOT).click()
    # (its recent runs: one, with its result)
    page.shoot("schedule-runs")
    assert "1 occurrence: SUCCEEDED 1" in page.text()
    page.tab.locator("table.runs").get_by_role("link").first.click()
    page.shoot("occurrence")
    # THEN it shows when it was due, sent, received and claimed, and its one attempt
    text = page.text()
    assert "SUCCEEDED" in text
    for label in (
        "scheduled for",
        "receivable",
        "claimed",
        "waited for a worker (claimed - due)",
        "receivable → claimed",
        "each run (claimed → finished)",
        "Attempts",
    ):
        assert label in text
    # (its one run's length, and no retry)
    assert re.search(r"each run \(claimed → finished\)\s*-?\d+ s", text), text
    assert re.search(r"each retry's wait\s*—", text), text
    assert page.tab.locator("main table tr").count() == 2  # a header and the attempt
    # AND it links back to its schedule
    page.tab.locator("main dl").get_by_role("link").first.click()
    assert page.titled(f"Schedule {ONE_SHOT}").startswith(f"Schedule {ONE_SHOT}")


def test_console_draws_the_last_hours_occurrences_on_a_timeline(page: Page):
    assert page.open("/console/timeline") == 200
    page.shoot("timeline")
    timeline = page.tab.locator("svg[aria-label='occurrences timeline']")
    assert timeline.locator("circle").count() >= 2
    assert timeline.locator("polygon").count() >= 1  # claimed by the demo's worker
    assert ONE_SHOT in page.text()


def test_console_shows_the_lag_histogram_and_the_backlog(page: Page, demo: Stack):
    # GIVEN a run now of the Kolkata schedule, which the demo's worker runs
    tenant = demo.client()
    kolkata = next(
        s["schedule_id"]
        for s in tenant.pages("/v1/schedules", "schedules")
        if s["name"] == "every minute, Asia/Kolkata"
    )
    made = tenant.post(f"/v1/schedules/{kolkata}/trigger")["occurrence"]["occurrence_id"]

    def ran() -> bool:
        return bool(tenant.get(f"/v1/occurrences/{made}")["state"] == "SUCCEEDED")

    wait_for(ran, 60, "the run now to run")
    # WHEN the lag page is opened
    assert page.open("/console/lag") == 200
    page.shoot("lag")
    text = page.text()
    assert "p99" in text
    # THEN the relay's lateness and the wait for a worker, each named, both from the listings
    assert "Delivery lag (receivable - due)" in text
    assert "Waited for a worker (claimed - due)" in text
    assert "Due and not yet taken by a worker" in text
    # AND strict, flexible and manual occurrences apart, each counted: the run now among
    # the manual ones (claimed: its wait measured), not among the flexible ones
    # (per group: occurrences in the hour, and how many waits for a worker were measured)
    counts = {}
    for kind in ("strict", "flexible", "manual", "all"):
        cells = page.tab.locator(f"table.lag tr.k-{kind} td").all_inner_texts()
        counts[kind] = (int(cells[0]), int(cells[5]))
    assert counts["manual"][0] >= 1
    assert counts["strict"][0] >= 1
    assert sum(counts[k][0] for k in ("strict", "flexible", "manual")) == counts["all"][0]
    # AND each histogram counts its bars and tells the groups apart
    histogram = page.tab.locator("svg[aria-label='wait histogram']")
    assert histogram.locator("rect.bar.manual").count() >= 1
    assert histogram.locator("rect.bar.strict").count() >= 1
    labels = histogram.locator("text.count").all_text_contents()
    assert sum(int(n) for n in labels) == counts["all"][1]
    assert histogram.locator("line.p").count() == 3


def test_console_shows_the_reconcilers_last_report(page: Page):
    # (Just past an hour the window shown is a new one, whose reports the stack's reconciler
    # writes at the end of its pass: 48 earlier hours first. The page is read again until
    # they are there.)
    def reported() -> bool:
        assert page.open("/console/reconciler") == 200
        return bool(page.tab.locator("main table tr").count() >= 2)

    wait_for(reported, 300, "the reconciler's reports of the window shown", every=5)
    page.shoot("reconciler")
    assert "MISSING 0" in page.text()


def test_console_searches_the_schedules_by_name_and_filters_them_by_state(page: Page):
    # WHEN a part of a name, in another case, and a state are given in the form
    page.open("/console")
    page.tab.fill("input[name=q]", "new_YORK")
    page.tab.select_option("select[name=state]", "ACTIVE")
    page.tab.get_by_role("button", name="filter").click()
    page.shoot("schedules-search")
    # THEN only that schedule is listed, and the query is the page's address
    assert "q=new_YORK" in page.tab.url
    assert "state=ACTIVE" in page.tab.url
    rows = page.tab.locator("table.schedules tr")
    assert rows.count() == 2  # a header and New York's
    assert NEW_YORK in rows.last.inner_text()
    assert "1 of 4 schedules" in page.text()
    # AND the links keep it: the schedule, then the Schedules link, lead back to it
    # (Each link's page read once it has loaded: a busy machine may not have its title yet
    # when the click returns.)
    rows.last.get_by_role("link", name=NEW_YORK).click()
    page.tab.wait_for_load_state()
    assert page.titled(f"Schedule {NEW_YORK}").startswith(f"Schedule {NEW_YORK}")
    page.tab.locator("header nav").get_by_role("link", name="Schedules").click()
    page.tab.wait_for_load_state()
    assert page.tab.locator("table.schedules tr").count() == 2
    assert page.tab.input_value("input[name=q]") == "new_YORK"
    # AND a state no schedule is in lists none
    assert page.open("/console?state=PAUSED") == 200
    assert "No schedule matches" in page.text()
    assert page.tab.locator("table.schedules").count() == 0


def test_console_lets_an_operator_pick_another_tenant(page: Page, demo: Stack):
    # GIVEN tenant acme, whose principal is the local key acme, with a schedule of its own,
    # and tenant beta, with no principal bound yet
    operator = demo.client("operator")
    for tenant_id in ("acme", "beta"):
        operator.post("/v1/admin/tenants", {"tenant_id": tenant_id})
    operator.post("/v1/admin/tenants/acme/principals", {"principal_arn": local_principal("acme")})
    acme = demo.client("acme")
    acme.post("/v1/targets", {"name": "jobs"})
    spec = {"kind": "cron", "expression": "0 9 * * 1-5", "timezone": "Europe/Paris"}
    acme.post("/v1/schedules", {"name": "acme weekdays", "spec": spec, "target": "jobs"})
    # WHEN the operator looks acme up on the tenants page and opens its console
    page.open("/console/tenants")
    page.tab.fill("input[name=tenant]", "acme")
    page.tab.get_by_role("button", name="look up").click()
    page.shoot("tenants")
    assert "schedules" in page.text()
    assert "quotas" in page.text()
    page.tab.get_by_role("link", name="Open acme's console").click()
    # THEN the console reads as acme: its schedule (in words), none of the demo's
    text = page.text()
    assert "acme weekdays" in text
    assert "at 09:00, Monday through Friday" in text
    assert NEW_YORK not in text
    # AND the header's picker offers both tenants, with the key that acts as each
    picker = page.tab.locator("header select[name=as]")
    options = picker.locator("option").all_inner_texts()
    assert {"acme (key acme)", "demo (key demo)"} <= set(options)
    assert picker.input_value() == "acme"
    # AND picking demo there switches back, on the same page
    page.tab.locator("header nav").get_by_role("link", name="Lag").click()
    picker.select_option("demo")
    page.tab.get_by_role("button", name="switch").click()
    assert page.titled("Lag and backlog").startswith("Lag and backlog")
    assert "as=demo" in page.tab.url
    # AND a tenant no key is known to act as says so, and how to bind one
    page.open("/console/tenants?tenant=beta")
    assert "No access key known to act as beta" in page.text()
    assert local_principal("beta") in page.text()


def test_console_as_an_unbound_key_shows_the_apis_refusal(page: Page):
    # WHEN the console reads as a key bound to no tenant
    status = page.open("/console?as=stranger")
    # THEN it shows the API's 403 instead of anything of the demo's
    assert status == 403
    assert "The API answered 403" in page.text()
    assert "America/New_York" not in page.text()
    page.errors.clear()  # (the browser logs a failed load for any 4xx page)
