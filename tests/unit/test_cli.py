"""The ``punctual`` command: preview's output formats, the injected clock and usage errors;
global options anywhere, and the line for an API that does not answer."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from punctual_client.cli import EXIT_FAILURE, EXIT_USAGE, main
from punctual_client.http import Unreachable
from punctual_local.dynamodb import free_port

NOW = 1_772_841_600  # 2026-03-07T00:00:00Z


def _run(
    argv: list[str], capsys: pytest.CaptureFixture[str], now: float = NOW
) -> tuple[int, str, str]:
    code = main(argv, now=lambda: now)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _json(argv: list[str], capsys: pytest.CaptureFixture[str], now: float = NOW) -> dict[str, Any]:
    code, out, err = _run([*argv, "--json"], capsys, now)
    assert (code, err) == (0, "")
    body: dict[str, Any] = json.loads(out)
    return body


# --- successful previews ------------------------------------------------------------


def test_cli_preview_cron_json_across_spring_gap(capsys: pytest.CaptureFixture[str]):
    # GIVEN a daily 02:30 New York cron previewed across the 2026-03-08 spring-forward
    argv = ["preview", "--cron", "30 2 * * *", "--tz", "America/New_York"]
    argv += ["--after", "2026-03-07T00:00:00Z", "--count", "3"]
    # WHEN printed as JSON
    body = _json(argv, capsys)
    # THEN 03-08 is skipped (02:30 does not exist), local offsets change, and a note says why
    assert body["fires"] == [
        {"utc": "2026-03-07T07:30:00Z", "local": "2026-03-07T02:30:00-05:00"},
        {"utc": "2026-03-09T06:30:00Z", "local": "2026-03-09T02:30:00-04:00"},
        {"utc": "2026-03-10T06:30:00Z", "local": "2026-03-10T02:30:00-04:00"},
    ]
    assert len(body["notes"]) == 1
    assert "2026-03-08" in body["notes"][0]
    assert "does not exist" in body["notes"][0]
    assert body["timezone"] == "America/New_York"
    assert re.fullmatch(r"\d{4}[a-z]", body["tzdata"])


def test_cli_preview_after_defaults_to_injected_now(capsys: pytest.CaptureFixture[str]):
    # GIVEN the same preview with and without --after, the clock injected at NOW
    argv = ["preview", "--cron", "30 2 * * *", "--tz", "America/New_York", "--count", "3"]
    explicit = _json([*argv, "--after", "2026-03-07T00:00:00Z"], capsys)
    # WHEN --after is left out
    implicit = _json(argv, capsys, now=NOW + 0.75)
    # THEN the injected clock (whole seconds) is used as the start
    assert implicit == explicit


def test_cli_preview_after_now_is_strict(capsys: pytest.CaptureFixture[str]):
    # GIVEN the clock at exactly a fire (2026-03-07T07:30:00Z)
    argv = ["preview", "--cron", "30 2 * * *", "--tz", "America/New_York", "--count", "1"]
    # WHEN previewing without --after
    body = _json(argv, capsys, now=NOW + 7.5 * 3600)
    # THEN that fire is not shown: the next one is 03-09
    assert [f["utc"] for f in body["fires"]] == ["2026-03-09T06:30:00Z"]


def test_cli_preview_text_output(capsys: pytest.CaptureFixture[str]):
    # GIVEN the spring-gap preview without --json
    argv = ["preview", "--cron", "30 2 * * *", "--tz", "America/New_York", "--count", "3"]
    # WHEN run
    code, out, err = _run(argv, capsys)
    # THEN each fire is a 'UTC  local' line, followed by the note
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "2026-03-07T07:30:00Z  2026-03-07T02:30:00-05:00",
        "2026-03-09T06:30:00Z  2026-03-09T02:30:00-04:00",
        "2026-03-10T06:30:00Z  2026-03-10T02:30:00-04:00",
        "note: 2026-03-08: 02:30 does not exist in America/New_York "
        "(the clocks skip ahead); skipped",
    ]


def test_cli_preview_count_default_is_ten(capsys: pytest.CaptureFixture[str]):
    # GIVEN a cron preview without --count; WHEN run
    body = _json(["preview", "--cron", "@hourly", "--tz", "UTC"], capsys)
    # THEN ten fires are listed, starting with the next hour after NOW
    assert len(body["fires"]) == 10
    assert body["fires"][0]["utc"] == "2026-03-07T01:00:00Z"
    assert body["notes"] == []


def test_cli_preview_count_edges_accepted(capsys: pytest.CaptureFixture[str]):
    # GIVEN --count at its edges 1 and 1000; WHEN run
    one = _json(["preview", "--cron", "* * * * *", "--tz", "UTC", "--count", "1"], capsys)
    many = _json(["preview", "--cron", "* * * * *", "--tz", "UTC", "--count", "1000"], capsys)
    # THEN exactly that many fires are listed
    assert len(one["fires"]) == 1
    assert len(many["fires"]) == 1000


def test_cli_preview_rate_keeps_interval_across_dst(capsys: pytest.CaptureFixture[str]):
    # GIVEN a daily rate in Berlin anchored (by default) at --after, across 2026-03-29
    argv = ["preview", "--rate", "rate(1 day)", "--tz", "Europe/Berlin"]
    argv += ["--after", "2026-03-27T12:00:00Z", "--count", "3"]
    # WHEN previewed
    body = _json(argv, capsys)
    # THEN UTC stays 24 h apart, the local hour shifts, and a note names the date
    assert body["fires"] == [
        {"utc": "2026-03-28T12:00:00Z", "local": "2026-03-28T13:00:00+01:00"},
        {"utc": "2026-03-29T12:00:00Z", "local": "2026-03-29T14:00:00+02:00"},
        {"utc": "2026-03-30T12:00:00Z", "local": "2026-03-30T14:00:00+02:00"},
    ]
    assert len(body["notes"]) == 1
    assert body["notes"][0].startswith("2026-03-29")


def test_cli_preview_rate_with_anchor_and_default_utc(capsys: pytest.CaptureFixture[str]):
    # GIVEN a 15-minute rate with an explicit anchor and no --tz
    argv = ["preview", "--rate", "rate(15 minutes)", "--anchor", "2026-03-06T23:50:00Z"]
    argv += ["--count", "2"]
    # WHEN previewed at NOW
    body = _json(argv, capsys)
    # THEN fires follow the anchor's grid, shown in UTC
    assert body["fires"] == [
        {"utc": "2026-03-07T00:05:00Z", "local": "2026-03-07T00:05:00+00:00"},
        {"utc": "2026-03-07T00:20:00Z", "local": "2026-03-07T00:20:00+00:00"},
    ]
    assert body["timezone"] == "UTC"


def test_cli_preview_rate_anchored_at_start(capsys: pytest.CaptureFixture[str]):
    # GIVEN a 7-minute rate with --start and no --anchor
    argv = ["preview", "--rate", "rate(7 minutes)", "--start", "2026-03-06T23:58:00Z"]
    argv += ["--count", "2"]
    # WHEN previewed at NOW
    body = _json(argv, capsys)
    # THEN the grid is anchored at --start: 23:58 + 7, + 14 minutes
    assert [f["utc"] for f in body["fires"]] == ["2026-03-07T00:05:00Z", "2026-03-07T00:12:00Z"]


def test_cli_preview_rate_anchored_at_epoch_start(capsys: pytest.CaptureFixture[str]):
    # GIVEN a 7-minute rate starting at the Unix epoch, previewed from 00:10
    argv = ["preview", "--rate", "rate(7 minutes)", "--start", "1970-01-01T00:00:00Z"]
    argv += ["--after", "1970-01-01T00:10:00Z", "--count", "2"]
    # WHEN previewed
    body = _json(argv, capsys)
    # THEN the grid is anchored at --start (0, 7, 14, 21 minutes), like any other start
    assert [f["utc"] for f in body["fires"]] == ["1970-01-01T00:14:00Z", "1970-01-01T00:21:00Z"]


def test_cli_preview_cron_end_bound(capsys: pytest.CaptureFixture[str]):
    # GIVEN a daily cron with an inclusive --end on the second fire
    argv = ["preview", "--cron", "0 12 * * *", "--tz", "UTC", "--end", "2026-03-08T12:00:00Z"]
    # WHEN previewed at NOW
    body = _json(argv, capsys)
    # THEN only the two fires up to the end are listed, though ten were allowed
    assert [f["utc"] for f in body["fires"]] == ["2026-03-07T12:00:00Z", "2026-03-08T12:00:00Z"]


def test_cli_preview_no_dst_note_after_end(capsys: pytest.CaptureFixture[str]):
    # GIVEN a 02:30 New York cron that ends before the 2026-03-08 spring gap
    argv = ["preview", "--cron", "30 2 * * *", "--tz", "America/New_York", "--count", "3"]
    argv += ["--end", "2026-03-08T00:00:00Z"]
    # WHEN previewed at NOW
    body = _json(argv, capsys)
    # THEN there is one fire and no note about a date past the end
    assert [f["utc"] for f in body["fires"]] == ["2026-03-07T07:30:00Z"]
    assert body["notes"] == []


def test_cli_preview_at_with_offset(capsys: pytest.CaptureFixture[str]):
    # GIVEN a one-shot with an explicit offset, shown in Tokyo
    argv = ["preview", "--at", "2026-04-01T09:00:00-04:00", "--tz", "Asia/Tokyo"]
    # WHEN previewed
    body = _json(argv, capsys)
    # THEN there is exactly one fire, in UTC and Tokyo time, and no note
    assert body["fires"] == [{"utc": "2026-04-01T13:00:00Z", "local": "2026-04-01T22:00:00+09:00"}]
    assert body["notes"] == []


def test_cli_preview_at_ambiguous_adds_note(capsys: pytest.CaptureFixture[str]):
    # GIVEN a local one-shot in New York's repeated hour
    argv = ["preview", "--at", "2026-11-01T01:30:00", "--tz", "America/New_York"]
    # WHEN previewed
    body = _json(argv, capsys)
    # THEN it fires once at the earlier instant and a note explains the choice
    assert body["fires"] == [{"utc": "2026-11-01T05:30:00Z", "local": "2026-11-01T01:30:00-04:00"}]
    assert len(body["notes"]) == 1
    assert "twice" in body["notes"][0]
    assert "2026-11-01T06:30:00Z" in body["notes"][0]


def test_cli_preview_at_in_the_past_text(capsys: pytest.CaptureFixture[str]):
    # GIVEN a one-shot before NOW
    argv = ["preview", "--at", "2026-03-01T00:00:00Z"]
    # WHEN previewed as text
    code, out, err = _run(argv, capsys)
    # THEN it succeeds and says there are no fires after NOW
    assert (code, err) == (0, "")
    assert out.splitlines() == ["no fires after 2026-03-07T00:00:00+00:00"]


# --- usage errors -------------------------------------------------------------------

CRON_UTC = ["preview", "--cron", "@daily", "--tz", "UTC"]


@pytest.mark.parametrize(
    ("argv", "message_part"),
    [
        pytest.param(
            ["preview", "--cron", "@daily", "--tz", "Mars/Base"],
            "'Mars/Base' is not an IANA time zone name",
            id="unknown_zone",
        ),
        pytest.param(
            ["preview", "--rate", "rate(1 hour)", "--tz", "Nowhere"],
            "not an IANA time zone name",
            id="unknown_zone_rate",
        ),
        pytest.param(
            ["preview", "--cron", "0 0 * * * *", "--tz", "UTC"],
            "expected 5 fields",
            id="six_field_cron",
        ),
        pytest.param(
            ["preview", "--cron", "0 0 30 2 *", "--tz", "UTC"],
            "can never fire",
            id="never_firing_cron",
        ),
        pytest.param(["preview", "--cron", "@daily"], "--tz is required", id="cron_without_tz"),
        pytest.param([*CRON_UTC, "--count", "0"], "between 1 and 1000", id="count_0"),
        pytest.param([*CRON_UTC, "--count", "1001"], "between 1 and 1000", id="count_1001"),
        pytest.param([*CRON_UTC, "--count", "-5"], "between 1 and 1000", id="count_negative"),
        pytest.param([*CRON_UTC, "--count", "abc"], "invalid int value", id="count_abc"),
        pytest.param([*CRON_UTC, "--after", "yesterday"], "--after", id="after_not_iso"),
        pytest.param(
            [*CRON_UTC[:3], "--after", "2026-03-07T00:00:00"],
            "no UTC offset",
            id="after_naive_without_tz",
        ),
        pytest.param([], "required", id="no_subcommand"),
        pytest.param(["schedule"], "invalid choice", id="unknown_subcommand"),
        pytest.param(["preview", "--tz", "UTC"], "one of the arguments", id="no_kind"),
        pytest.param([*CRON_UTC, "--rate", "rate(1 day)"], "not allowed with", id="cron_and_rate"),
        pytest.param(
            ["preview", "--rate", "rate(1 day)", "--at", "2026-04-01T00:00:00Z"],
            "not allowed with",
            id="rate_and_at",
        ),
        pytest.param(
            ["preview", "--at", "2026-03-08T02:30:00", "--tz", "America/New_York"],
            "does not exist",
            id="nonexistent_at",
        ),
        pytest.param(["preview", "--at", "2026-04-01T09:00:00"], "no UTC offset", id="naive_at"),
        pytest.param(["preview", "--rate", "rate(5 seconds)"], "is not a rate", id="bad_rate"),
        pytest.param([*CRON_UTC, "--start", "soon"], "--start", id="bad_start"),
        pytest.param(
            [*CRON_UTC, "--start", "2026-04-01T00:00:00Z", "--end", "2026-03-01T00:00:00Z"],
            "end_at must be later than start_at",
            id="end_before_start",
        ),
        pytest.param([*CRON_UTC, "--bogus"], "unrecognized arguments", id="unknown_flag"),
    ],
)
def test_cli_bad_input_one_error_line_exit_2(
    argv: list[str], message_part: str, capsys: pytest.CaptureFixture[str]
):
    # GIVEN invalid command-line input
    # WHEN the CLI runs
    code, out, err = _run(argv, capsys)
    # THEN it exits 2 with exactly one 'punctual: error:' line on stderr and no stdout
    assert code == EXIT_USAGE == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert err.endswith("\n")
    assert lines[0].startswith("punctual: error: ")
    assert message_part in lines[0]


def test_cli_help_exits_zero_without_error_line(capsys: pytest.CaptureFixture[str]):
    # GIVEN --help; WHEN the CLI runs
    with pytest.raises(SystemExit) as caught:
        main(["preview", "--help"], now=lambda: NOW)
    # THEN argparse prints usage to stdout and exits 0, without the error prefix
    captured = capsys.readouterr()
    assert caught.value.code == 0
    assert "--cron" in captured.out
    assert "punctual: error" not in captured.err


# --- the installed console script ---------------------------------------------------


def _console_script() -> str:
    beside = Path(sys.executable).parent / "punctual"
    found = shutil.which("punctual", path=str(beside.parent)) or shutil.which("punctual")
    assert found is not None, "the 'punctual' console script is not installed"
    return found


def test_cli_console_script_bad_input_exit_2_single_line():
    # GIVEN the installed 'punctual' console script
    script = _console_script()
    # WHEN run with a six-field cron in a separate process
    done = subprocess.run(
        [script, "preview", "--cron", "0 0 * * * *", "--tz", "UTC"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # THEN the process exits 2 with a single error line and nothing on stdout
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("punctual: error: ")
    assert "expected 5 fields" in done.stderr


def test_cli_console_script_success_exit_0():
    # GIVEN the installed console script and a fully specified preview (no clock needed)
    script = _console_script()
    argv = ["preview", "--cron", "30 2 * * *", "--tz", "America/New_York"]
    argv += ["--after", "2026-03-07T00:00:00Z", "--count", "1"]
    # WHEN run in a separate process
    done = subprocess.run([script, *argv], capture_output=True, text=True, timeout=60, check=False)
    # THEN it exits 0 and prints the fire line, with nothing on stderr
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == ["2026-03-07T07:30:00Z  2026-03-07T02:30:00-05:00"]


# --- global options and an API that does not answer ----------------------------------


def test_cli_json_before_the_command_is_the_same_as_after_it(capsys: pytest.CaptureFixture[str]):
    # GIVEN a preview with --json after the command, as the command's own flag
    argv = ["preview", "--cron", "@hourly", "--tz", "UTC", "--count", "2"]
    after = _json(argv, capsys)
    # WHEN --json is given before the command instead, as the AWS CLI allows
    code, out, err = _run(["--json", *argv], capsys)
    # THEN the output is the same JSON
    assert (code, err) == (0, "")
    assert json.loads(out) == after


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--endpoint", "{url}", "--json", "list"], id="before"),
        pytest.param(["list", "--json", "--endpoint", "{url}"], id="after"),
        pytest.param(["--json", "targets", "list", "--endpoint", "{url}"], id="around"),
    ],
)
def test_cli_global_options_anywhere_reach_the_client(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    # GIVEN an endpoint where nothing listens (a free loopback port), and credentials
    url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "demo")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.delenv("PUNCTUAL_ENDPOINT", raising=False)
    # WHEN a client command runs with --endpoint and --json before, after or around it
    code, out, err = _run([a.replace("{url}", url) for a in argv], capsys)
    # THEN that endpoint was called (not the default): exit 1 with one line that names it,
    # says why, and what to do when it is the local stack
    assert (code, out) == (EXIT_FAILURE, "")
    assert err == (
        f"punctual: failed: cannot reach the Punctual API at {url} (connection refused): "
        "is the local stack running? Start it with `make run` (or `punctual local up`)\n"
    )


def test_unreachable_api_elsewhere_points_at_the_endpoint_setting():
    # GIVEN a deployed stage's URL that did not answer
    error = Unreachable("https://abc.execute-api.eu-west-1.amazonaws.com/prod", "timed out")
    # THEN the message names it and the settings that choose it, not the local stack
    assert str(error) == (
        "cannot reach the Punctual API at https://abc.execute-api.eu-west-1.amazonaws.com/prod "
        "(timed out): check --endpoint or PUNCTUAL_ENDPOINT, and the network"
    )
