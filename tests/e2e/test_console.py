"""The local console in a real browser: `punctual local up --demo` in a subprocess, its
pages at /console opened in headless Chromium (Debian's, driven by Playwright), each
checked for the demo's data and for a page without console errors. Screenshots are kept
in build/console/ (the README shows one of them).

Chromium comes from `make browser` (apt-get); `make test` installs it in the background and
these tests wait for it. Where it cannot be installed, they are skipped, saying why.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from punctual.scheduling import PREVIEW_COUNT
from punctual_local.console import next_clock_change
from tests.e2e.conftest import REPO, Stack, StackFailed, launch, ready, stop, tail, wait_for

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
            return [o["state"] for o in made] == ["SUCCEEDED"]

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
    change = next_clock_change("America/New_York", int(time.time()))
    assert change is not None
    day = new_york_date(change[0])
    assert text.count(f"next clock change {day}") == 1  # (New York's; Kolkata has none)
    assert ONE_SHOT in text
    # AND every active schedule shows its next fires in local time
    assert page.tab.locator(".fires").count() >= 3


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
    assert page.tab.locator("table").first.inner_text().count("v1") == 1
    assert "ACTIVE" in text
    # AND the page is titled by the schedule's name, and says what it sends and how it retries
    assert page.tab.title().startswith(f"Schedule {NEW_YORK}")
    for label in ("payload", "retry", "created", "updated"):
        assert label in text


def test_console_follows_an_occurrence_through_its_life(page: Page):
    # WHEN the one-shot's occurrence is opened from its schedule's page
    page.open("/console")
    page.tab.get_by_role("link", name=ONE_SHOT).click()
    page.tab.locator("main table").last.get_by_role("link").first.click()
    page.shoot("occurrence")
    # THEN it shows when it was due, sent, received and claimed, and its one attempt
    text = page.text()
    assert "SUCCEEDED" in text
    for label in (
        "scheduled for",
        "receivable",
        "claimed",
        "waited for a worker (claimed - due)",
        "Attempts",
    ):
        assert label in text
    assert page.tab.locator("main table tr").count() == 2  # a header and the attempt
    # AND it links back to its schedule
    page.tab.locator("main dl").get_by_role("link").first.click()
    assert page.tab.title().startswith(f"Schedule {ONE_SHOT}")


def test_console_draws_the_last_hours_occurrences_on_a_timeline(page: Page):
    assert page.open("/console/timeline") == 200
    page.shoot("timeline")
    timeline = page.tab.locator("svg[aria-label='occurrences timeline']")
    assert timeline.locator("circle").count() >= 2
    assert timeline.locator("polygon").count() >= 1  # claimed by the demo's worker
    assert ONE_SHOT in page.text()


def test_console_shows_the_lag_histogram_and_the_backlog(page: Page):
    assert page.open("/console/lag") == 200
    page.shoot("lag")
    text = page.text()
    assert "p99" in text
    # the relay's lateness and the wait for a worker, each named, both from the listings
    assert "Delivery lag (receivable - due)" in text
    assert "Waited for a worker (claimed - due)" in text
    assert "Due and not yet taken by a worker" in text
    histogram = page.tab.locator("svg[aria-label='lag histogram']")
    assert histogram.locator("rect.bar").count() >= 10
    assert histogram.locator("line.p").count() == 3


def test_console_shows_the_reconcilers_last_report(page: Page):
    assert page.open("/console/reconciler") == 200
    page.shoot("reconciler")
    text = page.text()
    assert "MISSING 0" in text
    assert page.tab.locator("main table tr").count() >= 2


def test_console_as_an_unbound_key_shows_the_apis_refusal(page: Page):
    # WHEN the console reads as a key bound to no tenant
    status = page.open("/console?as=stranger")
    # THEN it shows the API's 403 instead of anything of the demo's
    assert status == 403
    assert "The API answered 403" in page.text()
    assert "America/New_York" not in page.text()
    page.errors.clear()  # (the browser logs a failed load for any 4xx page)
