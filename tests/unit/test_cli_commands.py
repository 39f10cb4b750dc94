"""The ``punctual`` API commands as a user meets them at the edges: ids that are not plain
words, endpoints without a scheme, answers that are not the API's (a web page, a port that
does not speak HTTP, JSON of another service), a reader that goes away (``| head``), Ctrl-C;
each one line on stderr and an exit code, never a traceback. Then what the commands print:
an occurrence's attempts, a schedule's occurrences in a window and a state, a reconcile
window not reconciled yet.

Two kinds of API stand in: ``FakeApi`` replaces ``Client.call`` (what the commands ask
and how they print the answers), ``RawServer`` answers on a loopback port with bytes of its
choosing (what the HTTP client meets on the wire)."""

from __future__ import annotations

import json
import os
import signal
import socketserver
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest

from punctual_client.cli import EXIT_FAILURE, EXIT_USAGE, main
from punctual_client.http import Client


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_line(err: str, prefix: str) -> str:
    """The whole of stderr: exactly one line, starting with ``prefix``."""
    assert err.count("\n") == 1, err
    assert err.endswith("\n")
    assert err.startswith(prefix), err
    return err


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "demo")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.delenv("PUNCTUAL_ENDPOINT", raising=False)
    monkeypatch.delenv("PUNCTUAL_DEBUG", raising=False)


# --- a fake API: what the commands ask, and what they print -------------------------------


@dataclass
class FakeApi:
    """Answers by (method, path); a list answers one page per call. Records every call."""

    answers: dict[tuple[str, str], Any] = field(default_factory=dict)
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        query = {k: v for k, v in (query or {}).items() if v is not None}
        self.calls.append((method, path, query))
        answer = self.answers.get((method, path), {"error": "no such route"})
        if isinstance(answer, list):
            return answer.pop(0)
        return answer


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = FakeApi()

    def call(client: Client, *args: Any, **kwargs: Any) -> Any:
        return fake.call(*args, **kwargs)

    monkeypatch.setattr(Client, "call", call)
    return fake


SCHEDULE = {
    "schedule_id": "x",
    "state": "ACTIVE",
    "version": 1,
    "spec": {"kind": "at", "at": "2026-12-06T10:00:00Z", "timezone": "UTC"},
    "target": "default",
}
OCCURRENCE = {
    "occurrence_id": "occ_1",
    "schedule_id": "sch_1",
    "schedule_version": 2,
    "scheduled_for": "2026-12-06T10:00:00Z",
    "available_at": "2026-12-06T10:00:00Z",
    "state": "SUCCEEDED",
    "target": "billing",
    "attempt_count": 2,
    "enqueued_at": "2026-12-06T10:00:01Z",
    "reason": None,
    "manual": False,
}


@pytest.mark.parametrize(
    ("argv", "method", "path"),
    [
        pytest.param(["get", "日本"], "GET", "/v1/schedules/%E6%97%A5%E6%9C%AC", id="non_ascii"),
        pytest.param(["get", "a b"], "GET", "/v1/schedules/a%20b", id="space"),
        pytest.param(["get", "#x"], "GET", "/v1/schedules/%23x", id="fragment"),
        pytest.param(["get", "a/b"], "GET", "/v1/schedules/a%2Fb", id="slash"),
        pytest.param(["get", "%41"], "GET", "/v1/schedules/%2541", id="percent"),
        pytest.param(["trigger", "?"], "POST", "/v1/schedules/%3F/trigger", id="trigger_query"),
        pytest.param(["pause", "a?b"], "POST", "/v1/schedules/a%3Fb/pause", id="pause"),
        pytest.param(["cancel", "../x"], "DELETE", "/v1/schedules/..%2Fx", id="cancel_dots"),
        pytest.param(["versions", "a#"], "GET", "/v1/schedules/a%23/versions", id="versions"),
        pytest.param(["occurrence", "o/1"], "GET", "/v1/occurrences/o%2F1", id="occurrence"),
        pytest.param(
            ["tenants", "worker-policy", "t?"],
            "GET",
            "/v1/admin/tenants/t%3F/worker-policy",
            id="tenant",
        ),
    ],
)
def test_cli_ids_travel_as_one_percent_encoded_path_segment(
    argv: list[str], method: str, path: str, api: FakeApi, capsys: pytest.CaptureFixture[str]
):
    # GIVEN an id holding characters that mean something in a URL (or are not ASCII)
    # WHEN a command names it
    _run(argv, capsys)
    # THEN the request's path carries it whole, as one segment: not a query, not a
    # fragment, not another route (trigger '?' once reached the create route)
    assert (api.calls[0][0], api.calls[0][1]) == (method, path)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["get", ""], "ID: must not be empty", id="empty"),
        pytest.param(["trigger", "."], "ID: '.' is not an id", id="dot"),
        pytest.param(["cancel", ".."], "ID: '..' is not an id", id="dot_dot"),
        pytest.param(["occurrence", ""], "OCC_ID: must not be empty", id="empty_occurrence"),
        pytest.param(["tenants", "worker-policy", ""], "ID: must not be empty", id="tenant"),
    ],
)
def test_cli_an_id_that_cannot_be_a_path_segment_is_a_usage_error(
    argv: list[str], message: str, api: FakeApi, capsys: pytest.CaptureFixture[str]
):
    # GIVEN an empty id, or one a server may resolve as a folder ('.', '..')
    # WHEN a command names it
    code, out, err = _run(argv, capsys)
    # THEN exit 2, one line naming it, and nothing was asked of the API
    assert (code, out) == (EXIT_USAGE, "")
    assert _one_line(err, "punctual: error: ") == f"punctual: error: {message}\n"
    assert api.calls == []


def test_cli_occurrence_prints_its_attempts(api: FakeApi, capsys: pytest.CaptureFixture[str]):
    # GIVEN an occurrence that failed once (a traceback as its error) and then succeeded
    attempts = [
        {
            "attempt_no": 1,
            "started_at": "2026-12-06T10:00:01Z",
            "finished_at": "2026-12-06T10:00:03Z",
            "outcome": "FAILED",
            "error": "ValueError: bad row\n  at line 3",
        },
        {
            "attempt_no": 2,
            "started_at": "2026-12-06T10:00:33Z",
            "finished_at": "2026-12-06T10:00:34Z",
            "outcome": "SUCCEEDED",
            "error": None,
        },
    ]
    times = {
        "to_receivable_seconds": 1,
        "to_claim_seconds": 0,
        "run_seconds": [2, 1],
        "retry_wait_seconds": [30],
    }
    api.answers[("GET", "/v1/occurrences/occ_1")] = OCCURRENCE | {
        "attempts": attempts,
        "times": times,
    }
    # WHEN `occurrence` prints it for people
    code, out, err = _run(["occurrence", "occ_1"], capsys)
    # THEN its row, where and when it was sent, where its time went, then one line per
    # attempt (the error on it)
    assert (code, err) == (0, "")
    header, row, sent, spent, attempts_header, first, second = out.splitlines()
    assert spent == (
        "  times   due -> receivable 1 s; receivable -> claimed 0 s; runs 2 s, 1 s; "
        "retry waits 30 s"
    )
    assert header.split() == ["OCCURRENCE", "SCHEDULED_FOR", "STATE", "ATTEMPTS"]
    assert row.split() == ["occ_1", "2026-12-06T10:00:00Z", "SUCCEEDED", "2"]
    assert sent == (
        "  schedule sch_1 v2 -> billing; available 2026-12-06T10:00:00Z; sent 2026-12-06T10:00:01Z"
    )
    assert attempts_header.split() == ["ATTEMPT", "STARTED", "FINISHED", "OUTCOME", "ERROR"]
    assert first.split(maxsplit=4) == [
        "1",
        "2026-12-06T10:00:01Z",
        "2026-12-06T10:00:03Z",
        "FAILED",
        "ValueError: bad row at line 3",
    ]
    assert second.split() == ["2", "2026-12-06T10:00:33Z", "2026-12-06T10:00:34Z", "SUCCEEDED"]


def test_cli_occurrence_not_taken_yet_says_so(api: FakeApi, capsys: pytest.CaptureFixture[str]):
    # GIVEN an occurrence no worker took yet
    waiting = OCCURRENCE | {"state": "SCHEDULED", "attempt_count": 0, "enqueued_at": None}
    none: dict[str, Any] = {"run_seconds": [], "retry_wait_seconds": []}
    times = none | {"to_receivable_seconds": None, "to_claim_seconds": None}
    api.answers[("GET", "/v1/occurrences/occ_1")] = waiting | {"attempts": [], "times": times}
    # WHEN printed; THEN it says it was not taken and has no attempts
    code, out, _ = _run(["occurrence", "occ_1"], capsys)
    assert code == 0
    assert out.splitlines()[2:] == [
        "  schedule sch_1 v2 -> billing; available 2026-12-06T10:00:00Z; "
        "sent not taken by a worker yet",
        "  times   due -> receivable not recorded (a worker's first claim records the send)",
        "no attempts yet",
    ]


def test_cli_occurrences_in_a_window_and_a_state(api: FakeApi, capsys: pytest.CaptureFixture[str]):
    # GIVEN a schedule's occurrences over two pages, in several states, and a misfire episode
    # the API repeats on every page
    missed: list[dict[str, Any]] = [
        {"version": 1, "first": "2026-12-06T03:00:00Z", "last": "2026-12-06T05:00:00Z", "count": 3}
    ]
    rows = [
        OCCURRENCE | {"occurrence_id": f"occ_{n}", "state": state}
        for n, state in enumerate(["SUCCEEDED", "DEAD", "SUCCEEDED", "SCHEDULED"])
    ]
    path = "/v1/schedules/sch_1/occurrences"
    api.answers[("GET", path)] = [
        {"occurrences": rows[:2], "missed": missed, "next_token": "t1"},
        {"occurrences": rows[2:], "missed": missed, "next_token": None},
    ]
    since, until = "2026-12-06T00:00:00Z", "2026-12-07T00:00:00+01:00"
    # WHEN `occurrences` asks for a window and one state
    argv = ["occurrences", "sch_1", "--from", since, "--to", until, "--state", "SUCCEEDED"]
    code, out, err = _run(argv, capsys)
    # THEN the API is asked for the window (its query parameters `from` and `to`), page by
    # page, and only that state's occurrences are printed
    assert (code, err) == (0, "")
    assert api.calls == [
        ("GET", path, {"from": since, "to": until}),
        ("GET", path, {"from": since, "to": until, "next_token": "t1"}),
    ]
    header, *printed = out.splitlines()
    assert header.split() == ["OCCURRENCE", "SCHEDULED_FOR", "STATE", "ATTEMPTS"]
    assert [line.split()[0] for line in printed] == ["occ_0", "occ_2"]

    # WHEN every state is asked for: THEN the MISSED fires follow the table, once
    api.answers[("GET", path)] = [{"occurrences": rows, "missed": missed, "next_token": None}]
    code, out, _ = _run(["occurrences", "sch_1"], capsys)
    assert out.splitlines()[-1] == (
        "  missed  3 fire(s) of v1 2026-12-06T03:00:00Z .. 2026-12-06T05:00:00Z "
        "(misfire policy: no occurrence)"
    )
    assert len(out.splitlines()) == 1 + len(rows) + 1

    # WHEN --json with a state: THEN the API's objects in that state, as a list
    api.answers[("GET", path)] = [{"occurrences": rows, "missed": missed, "next_token": None}]
    code, out, _ = _run(["occurrences", "sch_1", "--state", "DEAD", "--json"], capsys)
    assert [o["occurrence_id"] for o in json.loads(out)] == ["occ_1"]


def test_cli_occurrences_state_must_be_an_occurrence_state(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
):
    code, _, err = _run(["occurrences", "sch_1", "--state", "DONE"], capsys)
    assert code == EXIT_USAGE
    assert "invalid choice: 'DONE'" in _one_line(err, "punctual: error: ")


def test_cli_reconcile_report_of_a_window_not_reconciled_yet(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
):
    # GIVEN a window no shard has reported on (the API sums nothing: 0 and 0)
    api.answers[("GET", "/v1/admin/reconcile")] = {
        "window_start": "2026-12-06T10:00:00Z",
        "window_end": "2026-12-06T11:00:00Z",
        "missing": 0,
        "unexpected": 0,
        "reports": [],
    }
    # WHEN an operator reads it
    code, out, err = _run(["reconcile", "report", "--from", "2026-12-06T10:00:00Z"], capsys)
    # THEN it says the window was not reconciled yet, not that nothing is missing
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "window 2026-12-06T10:00:00Z .. 2026-12-06T11:00:00Z: not reconciled yet "
        "(no shard has reported on it)"
    ]
    assert api.calls == [("GET", "/v1/admin/reconcile", {"from": "2026-12-06T10:00:00Z"})]


def test_cli_reconcile_report_with_an_incomplete_report_says_so_far(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
):
    # GIVEN a window two shards reported on, one of them out of time before its last schedule
    report = {"shard": 0, "complete": True, "counts": {"MISSING": 1, "OK": 5}}
    api.answers[("GET", "/v1/admin/reconcile")] = {
        "window_start": "2026-12-06T10:00:00Z",
        "window_end": "2026-12-06T11:00:00Z",
        "missing": 1,
        "unexpected": 0,
        "reports": [report, report | {"shard": 1, "complete": False, "counts": {"OK": 2}}],
    }
    # WHEN read; THEN the totals are what was found so far, and the shard says incomplete
    code, out, _ = _run(["reconcile", "report"], capsys)
    assert code == 0
    assert out.splitlines() == [
        "window 2026-12-06T10:00:00Z .. 2026-12-06T11:00:00Z: 2 shard reports, MISSING 1, "
        "UNEXPECTED 0 so far (1 of the reports incomplete)",
        "  shard    0: MISSING 1, OK 5",
        "  shard    1 (incomplete): OK 2",
    ]


def test_cli_reconcile_report_names_the_shards_not_reconciled_yet(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
):
    # GIVEN a window shard 0 reported on, shards 1-3 and 5 not yet (the API names them)
    report = {"shard": 0, "complete": True, "counts": {"OK": 5}}
    api.answers[("GET", "/v1/admin/reconcile")] = {
        "window_start": "2026-12-06T10:00:00Z",
        "window_end": "2026-12-06T11:00:00Z",
        "missing": 0,
        "unexpected": 0,
        "reconciled": False,
        "unreported_shards": [1, 2, 3, 5],
        "reports": [report],
    }
    # WHEN read; THEN the 0 missing is said to be so far, naming the shards to come
    code, out, _ = _run(["reconcile", "report"], capsys)
    assert code == 0
    assert out.splitlines()[0] == (
        "window 2026-12-06T10:00:00Z .. 2026-12-06T11:00:00Z: 1 shard reports, MISSING 0, "
        "UNEXPECTED 0 so far (shards 1-3, 5 not reconciled yet)"
    )


def test_cli_json_of_another_service_is_one_line_naming_the_endpoint(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
):
    # GIVEN an endpoint that answers JSON, but not the API's (no `schedule` in it)
    api.answers[("GET", "/v1/schedules/x")] = {"Items": []}
    # WHEN `get` prints it
    code, out, err = _run(["get", "x", "--endpoint", "http://127.0.0.1:9"], capsys)
    # THEN exit 1, one line naming the endpoint and what is missing
    assert (code, out) == (EXIT_FAILURE, "")
    assert _one_line(err, "punctual: failed: the API at http://127.0.0.1:9 answered without ")
    assert "KeyError: 'schedule'" in err


def test_cli_ctrl_c_is_one_line_and_exit_130(
    api: FakeApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a command interrupted by Ctrl-C while it waits on the API
    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(FakeApi, "call", interrupted)
    # WHEN it runs
    try:
        code, out, err = _run(["list"], capsys)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C ended in a traceback")
    # THEN exit 130 (as a shell reports Ctrl-C) and one line
    assert (code, out, err) == (130, "", "punctual: interrupted\n")


# Ctrl-C while Python imports the CLI's module: the KeyboardInterrupt a SIGINT raises,
# raised where the import is (a signal's lands at the next bytecode, which a library's bare
# "except:" may swallow: not what this checks).
_INTERRUPTED_IMPORT = """
import importlib.abc, sys

class CtrlC(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "punctual_client.cli":
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, CtrlC())
from punctual_client.launch import entry_point
entry_point()
"""


def test_cli_ctrl_c_while_its_modules_load_is_one_line_and_exit_130():
    # GIVEN the command's entry point; WHEN Ctrl-C comes while its modules are imported
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_IMPORT],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # THEN exit 130 and one line, no traceback
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "punctual: interrupted\n")


def test_cli_an_unexpected_error_is_one_line_and_debug_shows_it(
    api: FakeApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a failure nothing foresaw
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(FakeApi, "call", broken)
    # WHEN a command meets it: THEN one line, exit 1, and how to see where
    code, _, err = _run(["list"], capsys)
    assert code == EXIT_FAILURE
    assert _one_line(err, "punctual: failed: ZeroDivisionError: division by zero ")
    assert "PUNCTUAL_DEBUG=1" in err
    # WHEN PUNCTUAL_DEBUG is set: THEN the traceback is not hidden
    monkeypatch.setenv("PUNCTUAL_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        main(["list"])


# --- endpoints --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            ["--endpoint", "example.com", "list"],
            "--endpoint 'example.com' has no scheme: give the whole URL, "
            "e.g. https://API_ID.execute-api.REGION.amazonaws.com/prod",
            id="no_scheme_remote",
        ),
        pytest.param(
            ["list", "--endpoint", "ftp://127.0.0.1:21"],
            "--endpoint 'ftp://127.0.0.1:21': only http:// and https:// URLs are APIs",
            id="ftp",
        ),
        pytest.param(
            ["list", "--endpoint", "http://127.0.0.1:99999"],
            "--endpoint 'http://127.0.0.1:99999' is not a URL (Port out of range 0-65535)",
            id="port_out_of_range",
        ),
        pytest.param(
            ["list", "--endpoint", "http://"], "--endpoint 'http://' names no host", id="no_host"
        ),
        pytest.param(
            ["list", "--endpoint", "http://h/prod?x=1"],
            "--endpoint 'http://h/prod?x=1': the API's base URL has no query or fragment",
            id="query",
        ),
        pytest.param(
            ["list", "--endpoint", "http://a b"],
            "--endpoint 'http://a b' is not a URL (a space or a control character)",
            id="space",
        ),
    ],
)
def test_cli_an_endpoint_that_is_not_an_api_url_is_a_usage_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
):
    # GIVEN an endpoint that is not an http(s) URL; WHEN a command runs
    code, out, err = _run(argv, capsys)
    # THEN exit 2 and one line that says what is wrong with it
    assert (code, out) == (EXIT_USAGE, "")
    assert err == f"punctual: error: {message}\n"


def test_cli_punctual_endpoint_from_the_environment_is_checked_too(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PUNCTUAL_ENDPOINT", "abc.execute-api.eu-west-1.amazonaws.com")
    code, _, err = _run(["list"], capsys)
    assert code == EXIT_USAGE
    assert err.startswith("punctual: error: PUNCTUAL_ENDPOINT 'abc.execute-api")


# --- on the wire: a loopback server answering bytes of the test's choosing ----------------


@dataclass
class RawServer:
    port: int
    answers: list[bytes]  # one per request, in order (the last one again once they run out)
    requests: list[str] = field(default_factory=list)  # each request line

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _http(status: str, body: bytes, kind: str = "application/json") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"Connection: close\r\n\r\n" + body


@pytest.fixture
def raw() -> Iterator[RawServer]:
    server_state = RawServer(0, [])

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            line = self.rfile.readline().decode("latin-1").rstrip("\r\n")
            length = 0
            while (header := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = header.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            self.rfile.read(length)
            server_state.requests.append(line)
            answers = server_state.answers
            self.wfile.write(answers.pop(0) if len(answers) > 1 else answers[0])

    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler) as server:
        server.daemon_threads = True
        server_state.port = server.server_address[1]
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield server_state
        finally:
            server.shutdown()


NOT_FOUND = _http(
    "404 Not Found",
    json.dumps({"error": {"code": "not_found", "message": "schedule not found"}}).encode(),
)


@pytest.mark.parametrize("schedule_id", ["日本", "a b", "#x", "é/?"])
def test_cli_get_of_any_id_reaches_the_api_and_its_404_is_one_line(
    schedule_id: str, raw: RawServer, capsys: pytest.CaptureFixture[str]
):
    # GIVEN an API that answers 404 to every request
    raw.answers = [NOT_FOUND]
    # WHEN `get` names an id with spaces, a '#' or another script (these once ended in
    # UnicodeEncodeError or InvalidURL tracebacks, or asked for another path)
    code, out, err = _run(["get", schedule_id, "--endpoint", raw.url], capsys)
    # THEN the request went out for that id, and the 404 is exit 2 with one line
    assert raw.requests == [f"GET /v1/schedules/{quote(schedule_id, safe='')} HTTP/1.1"]
    assert (code, out) == (EXIT_USAGE, "")
    assert err == "punctual: error: 404 schedule not found\n"


def test_cli_endpoint_without_scheme_on_loopback_is_taken_as_http(
    raw: RawServer, capsys: pytest.CaptureFixture[str]
):
    # GIVEN the local stack's endpoint written without its scheme
    raw.answers = [_http("200 OK", b'{"schedules": [], "next_token": null}')]
    # WHEN a command uses it
    code, out, err = _run(["list", "--json", "--endpoint", f"127.0.0.1:{raw.port}"], capsys)
    # THEN it is http:// on that port (once an AttributeError traceback)
    assert (code, err) == (0, "")
    assert json.loads(out) == []
    assert raw.requests == ["GET /v1/schedules HTTP/1.1"]


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        pytest.param(
            _http("200 OK", b"<html>\n<body>Welcome to nginx!</body>\n</html>", "text/html"),
            "the API at {url} answered 200 with text/html that is not JSON "
            "('<html> <body>Welcome to nginx!</body> </html>'): is that the Punctual API? "
            "(check --endpoint or PUNCTUAL_ENDPOINT)",
            id="html_page",
        ),
        pytest.param(
            b"SSH-2.0-OpenSSH_9.2\r\n",
            "the API at {url} did not answer in HTTP (BadStatusLine: SSH-2.0-OpenSSH_9.2): "
            "is that the Punctual API? (check --endpoint or PUNCTUAL_ENDPOINT)",
            id="not_http",
        ),
        pytest.param(
            b"",
            "the API at {url} closed the connection without answering: is that the Punctual "
            "API? (check --endpoint or PUNCTUAL_ENDPOINT)",
            id="closed",
        ),
        pytest.param(
            _http("502 Bad Gateway", b"<html>\n<h1>502 Bad Gateway</h1>\n</html>", "text/html"),
            "502 <html> <h1>502 Bad Gateway</h1> </html>",
            id="html_error",
        ),
    ],
)
def test_cli_an_answer_that_is_not_the_apis_is_one_line_exit_1(
    answer: bytes, message: str, raw: RawServer, capsys: pytest.CaptureFixture[str]
):
    # GIVEN an endpoint where something else answers: a web server's page, a port that
    # does not speak HTTP, one that hangs up, a proxy's error page
    raw.answers = [answer]
    # WHEN a command asks it
    code, out, err = _run(["list", "--endpoint", raw.url], capsys)
    # THEN exit 1 and one line saying what answered (no JSONDecodeError or BadStatusLine
    # traceback)
    assert (code, out) == (EXIT_FAILURE, "")
    assert err == f"punctual: failed: {message.format(url=raw.url)}\n"


# --- a reader that goes away --------------------------------------------------------------


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "punctual_client.cli", *args]


def test_cli_output_into_a_closed_pipe_ends_quietly():
    # GIVEN a command whose stdout is a pipe nobody reads any more (`punctual ... | head`
    # after head has exited)
    read_end, write_end = os.pipe()
    os.close(read_end)
    # WHEN it prints
    argv = _cli("preview", "--cron", "* * * * *", "--tz", "UTC", "--count", "1000", "--json")
    done = subprocess.run(
        argv, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60, check=False
    )
    os.close(write_end)
    # THEN it ends quietly, with the status a shell gives a tool ended by SIGPIPE
    # (`yes | head`), not a traceback or an error line
    assert (done.returncode, done.stderr) == (128 + signal.SIGPIPE, "")


# --- stop signals -------------------------------------------------------------------------


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_stops_even_while_the_main_thread_holds_the_events_lock(number: int):
    # GIVEN a process waiting on its stop event (`local up`, `worker`) whose main thread is
    # inside the event's lock (as in each `stop.wait(...)`) when a stop signal comes
    script = textwrap.dedent(
        f"""
        import os, sys, time
        from punctual_client.commands import stop_on_signals
        stop = stop_on_signals()
        with stop._cond:
            os.kill(os.getpid(), {int(number)})
            time.sleep(0.2)
        sys.exit(0 if stop.wait(10) else 3)
        """
    )
    # WHEN the signal is handled
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, timeout=30, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the handler waited forever for the lock its own thread held")
    # THEN the event is set and the process goes on (a handler calling stop.set() there
    # waited forever for its own thread)
    assert done.returncode == 0, done.stderr


def test_cli_list_shows_each_schedules_next_fire(api: FakeApi, capsys: pytest.CaptureFixture[str]):
    # GIVEN two schedules, one with a fire to come and one paused (none)
    api.answers[("GET", "/v1/schedules")] = {
        "schedules": [
            SCHEDULE | {"next_fire_at": "2030-01-01T09:00:00Z"},
            SCHEDULE | {"schedule_id": "y", "state": "PAUSED", "next_fire_at": None},
        ],
        "next_token": None,
    }
    # WHEN listed; THEN each line is followed by its next fire, when it has one
    code, out, _ = _run(["list"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("x  ACTIVE")
    assert lines[1] == "  next  2030-01-01T09:00:00Z"
    assert lines[2].startswith("y  PAUSED")
    assert len(lines) == 3


def test_cli_tenants_list_shows_every_tenant_over_its_pages(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
):
    # GIVEN two tenants, on two pages of the operator's listing
    quotas = {"max_schedules": 10000, "max_strict_fires_per_minute": 500}
    tenant = {"quotas": quotas, "schedule_count": 3, "strict_fires_per_minute_peak": 2}
    api.answers[("GET", "/v1/admin/tenants")] = [
        {"tenants": [tenant | {"tenant_id": "acme"}], "next_token": "t1"},
        {"tenants": [tenant | {"tenant_id": "beta", "schedule_count": 0}], "next_token": None},
    ]
    # WHEN listed; THEN one line each, with its usage against its quotas
    code, out, _ = _run(["tenants", "list"], capsys)
    assert code == 0
    assert out.splitlines() == [
        "acme  schedules 3 of 10000  busiest strict minute 2 of 500",
        "beta  schedules 0 of 10000  busiest strict minute 2 of 500",
    ]
    assert [q.get("next_token") for _, _, q in api.calls] == [None, "t1"]


def test_cli_versions_show_what_each_change_changed(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
):
    # GIVEN three versions: made, its payload changed, then paused
    first = {
        "version": 1,
        "effective_from": "2026-12-06T10:00:00Z",
        "state": "ACTIVE",
        "spec": {"kind": "cron", "expression": "0 9 * * *", "timezone": "UTC"},
        "target": "default",
        "payload": {"v": 1},
    }
    second = first | {"version": 2, "effective_from": "2026-12-06T11:00:00Z", "payload": {"v": 2}}
    third = second | {"version": 3, "effective_from": "2026-12-06T12:00:00Z", "state": "PAUSED"}
    api.answers[("GET", "/v1/schedules/x/versions")] = {
        "versions": [third, second, first],
        "next_token": None,
    }
    # WHEN listed; THEN oldest first, each followed by what it changed
    code, out, _ = _run(["versions", "x"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert [line.split()[0] for line in lines if not line.startswith(" ")] == ["v1", "v2", "v3"]
    assert lines[2] == '  payload: {"v": 1} -> {"v": 2}'
    assert lines[4] == '  state: "ACTIVE" -> "PAUSED"'
    assert len(lines) == 5


def _writes_recorded(
    api: FakeApi, monkeypatch: pytest.MonkeyPatch, current: dict[str, Any]
) -> list[tuple[Any, Any]]:
    """Schedule ``x`` answers as ``current``; what the CLI then writes (a PATCH or a POST),
    as (body, headers), in order."""
    for key in (
        ("GET", "/v1/schedules/x"),
        ("PATCH", "/v1/schedules/x"),
        ("POST", "/v1/schedules"),
    ):
        api.answers[key] = {"schedule": current, "next_fires": []}
    sent: list[tuple[Any, Any]] = []
    answer = FakeApi.call

    def recorded(self: FakeApi, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        if method in ("PATCH", "POST"):
            sent.append((body, kwargs.get("headers")))
        return answer(self, method, path, body, **kwargs)

    monkeypatch.setattr(FakeApi, "call", recorded)
    return sent


def test_cli_update_of_one_spec_field_keeps_the_rest_of_the_spec(
    api: FakeApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a cron at 9:00 in Tokyo, ending in 2031, at version 3
    spec = {
        "kind": "cron",
        "expression": "0 9 * * *",
        "timezone": "Asia/Tokyo",
        "start_at": None,
        "end_at": "2031-01-01T00:00:00Z",
    }
    sent = _writes_recorded(api, monkeypatch, SCHEDULE | {"version": 3, "spec": spec})
    # WHEN only its zone is changed, then only its expression
    assert _run(["update", "x", "--tz", "Europe/Paris"], capsys)[0] == 0
    assert _run(["update", "x", "--cron", "0 10 * * *"], capsys)[0] == 0
    # THEN each sends the whole spec with the one field changed, at the version read
    kept = {"kind": "cron", "end_at": "2031-01-01T00:00:00Z"}
    assert sent == [
        (
            {"spec": kept | {"expression": "0 9 * * *", "timezone": "Europe/Paris"}},
            {"If-Match": "3"},
        ),
        (
            {"spec": kept | {"expression": "0 10 * * *", "timezone": "Asia/Tokyo"}},
            {"If-Match": "3"},
        ),
    ]


def test_cli_dst_flags_set_and_keep_the_schedules_dst_choice(
    api: FakeApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a cron in New York that fires a repeated wall time at both instants
    spec = {
        "kind": "cron",
        "expression": "30 1 * * *",
        "timezone": "America/New_York",
        "dst": {"gap": "SKIP", "repeat": "BOTH"},
    }
    sent = _writes_recorded(api, monkeypatch, SCHEDULE | {"version": 2, "spec": spec})
    # WHEN the gap choice alone is changed, then the expression alone, then it becomes a rate
    assert _run(["update", "x", "--dst-gap", "SHIFT"], capsys)[0] == 0
    assert _run(["update", "x", "--cron", "0 2 * * *"], capsys)[0] == 0
    assert _run(["update", "x", "--rate", "rate(1 hour)"], capsys)[0] == 0
    assert _run(["update", "x", "--at", "2030-12-24T17:00:00Z"], capsys)[0] == 0
    # AND a schedule is created with a choice
    create = ["create", "--cron", "0 2 * * *", "--tz", "UTC", "--target", "default"]
    assert _run([*create, "--dst-repeat", "LAST"], capsys)[0] == 0
    # THEN the choice is laid over the current one, kept with a new expression, dropped for
    # a rate and an instant with its offset (which take none), and sent as given at creation
    base = {"kind": "cron", "timezone": "America/New_York"}
    assert [body for body, _ in sent] == [
        {"spec": base | {"expression": "30 1 * * *", "dst": {"gap": "SHIFT", "repeat": "BOTH"}}},
        {"spec": base | {"expression": "0 2 * * *", "dst": {"gap": "SKIP", "repeat": "BOTH"}}},
        {"spec": {"kind": "rate", "expression": "rate(1 hour)", "timezone": "America/New_York"}},
        {"spec": {"kind": "at", "at": "2030-12-24T17:00:00Z", "timezone": "America/New_York"}},
        {
            "spec": {"kind": "cron", "expression": "0 2 * * *", "timezone": "UTC"}
            | {"dst": {"repeat": "LAST"}},
            "target": "default",
        },
    ]


RECENT = {
    "fires": 3,
    "since": "2026-12-06T10:00:00Z",
    "receivable_lag": {"count": 2, "p50_seconds": 0, "p99_seconds": 1, "max_seconds": 1},
    "start_lag": None,
    "outcomes": {"succeeded": 1, "retried": 1, "dead": 1, "missed": 0, "open": 1},
    "last_failure": {
        "occurrence_id": "occ_2",
        "scheduled_for": "2026-12-06T10:01:00Z",
        "at": "2026-12-06T10:01:05Z",
        "what": "DEAD",
        "error": "Traceback\n  boom",
    },
    "unreadable": 0,
}


def test_cli_get_asks_for_the_recent_fires_and_says_how_they_went(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
):
    # GIVEN a schedule whose GET says how its last fires went
    answer = {"schedule": SCHEDULE, "next_fires": [], "notes": [], "recent": RECENT}
    api.answers[("GET", "/v1/schedules/x")] = answer
    # WHEN `get` asks for its last 5 fires' figures
    code, out, err = _run(["get", "x", "--recent", "5"], capsys)
    # THEN the API was asked for 5, and the figures are three lines, the error on one
    assert (code, err) == (0, "")
    assert api.calls == [("GET", "/v1/schedules/x", {"recent": 5})]
    assert out.splitlines()[1:] == [
        "  recent  3 fires since 2026-12-06T10:00:00Z: succeeded 1, retried 1, dead 1, "
        "missed 0, open 1",
        "  lag     receivable p50 0 s, p99 1 s, max 1 s; handler start none measured",
        "  failed  DEAD at 2026-12-06T10:01:05Z (occ_2): Traceback boom",
    ]
    # AND without the flag the API's default applies; with 0 none is shown
    _run(["get", "x"], capsys)
    assert api.calls[-1] == ("GET", "/v1/schedules/x", {})
    api.answers[("GET", "/v1/schedules/x")] = answer | {"recent": None}
    code, out, _ = _run(["get", "x", "--recent", "0"], capsys)
    assert (code, out.count("\n")) == (0, 1)
    # AND a schedule with no fire due yet gets no figures' lines either
    no_fire = RECENT | {"fires": 0, "since": None, "receivable_lag": None, "last_failure": None}
    api.answers[("GET", "/v1/schedules/x")] = answer | {"recent": no_fire}
    code, out, _ = _run(["get", "x"], capsys)
    assert (code, out.count("\n")) == (0, 1)


def test_cli_targets_take_early_delivery_at_creation_and_by_update(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
):
    target = {"name": "fast", "queue_url": "https://q/fast", "early_delivery": True}
    api.answers[("POST", "/v1/targets")] = target
    api.answers[("PATCH", "/v1/targets/fast")] = target | {"early_delivery": False}
    # WHEN a target is created with early delivery, then turned off
    code, out, _ = _run(["targets", "create", "fast", "--early-delivery"], capsys)
    assert (code, out) == (0, "fast  https://q/fast  early delivery\n")
    code, out, _ = _run(["targets", "update", "fast", "--early-delivery", "off"], capsys)
    assert (code, out) == (0, "fast  https://q/fast\n")
    # THEN the API was asked exactly that; a create without the flag asks for none
    _run(["targets", "create", "fast"], capsys)
    assert [(c[0], c[1]) for c in api.calls] == [
        ("POST", "/v1/targets"),
        ("PATCH", "/v1/targets/fast"),
        ("POST", "/v1/targets"),
    ]
    # AND an update needs on or off: exit 2, one line
    code, _, err = _run(["targets", "update", "fast", "--early-delivery", "yes"], capsys)
    assert code == 2
    _one_line(err, "punctual: error: argument --early-delivery: invalid choice: 'yes'")
