"""`punctual local up --demo` as a new user meets it (issue 46), on a data folder of its
own: a target made beside the demo's, a stop by SIGTERM (kill, a service manager, `docker
stop`) as by Ctrl-C, `local env` naming the stack's own port, the demo's worker after a
restart, the CLI at its edges against the real API (ids that are not plain words, an
endpoint without its scheme, a reader that goes away, the occurrence commands), and a
SIGTERM that comes while the stack is still starting."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from punctual.timing import utc_text
from punctual_local.dynamodb import free_port
from punctual_local.engines import recorded
from tests.e2e.conftest import (
    REPO,
    STOP_SECONDS,
    Run,
    Stack,
    launch,
    punctual,
    ready,
    run_punctual,
    stop,
    wait_for,
)

pytestmark = pytest.mark.e2e

ONE_SHOT_PRINTED = re.compile(r"\] one-shot in 10 s: (occ_\S+) scheduled ")


def output(stack: Stack) -> str:
    return stack.log.read_text(errors="replace")


def stopped_cleanly(stack: Stack, data: Path) -> None:
    """As after Ctrl-C: exit 0, the drivers (the demo worker among them) stopped before the
    engines, no engine left, and the same last line."""
    assert stack.process.wait(timeout=STOP_SECONDS) == 0, output(stack)
    assert not [e for e in recorded(data).values() if e.alive()]
    said = output(stack)
    assert "stopping: drivers, then engines...\n" in said
    assert said.endswith(f"stopped; everything is kept in {data}: `local up` carries on from it\n")
    assert " ERROR " not in said, said


@contextlib.contextmanager
def stacks(data: Path) -> Iterator[list[Stack]]:
    """The stacks the test launches on ``data``; whatever is left is stopped at the end."""
    launched: list[Stack] = []
    try:
        yield launched
    finally:
        if launched:
            stop(launched[-1])


def one_line_error(run: Run, code: int, start: str) -> None:
    """Exit ``code``, nothing on stdout, one line on stderr starting with ``start``."""
    assert (run.code, run.out, run.err.count("\n")) == (code, "", 1), run.err
    assert run.err.startswith(start), run.err


def listing_of_at_least(stack: Stack, size: int) -> None:
    """Yearly crons on `billing` until `list --json` is at least ``size`` bytes: more than
    a pipe holds, so a reader that leaves early is met by the writes that follow."""
    client = stack.client()
    spec = {"kind": "cron", "expression": "0 0 1 1 *", "timezone": "UTC"}
    made = client.post("/v1/schedules", {"spec": spec, "target": "billing"})
    one = len(json.dumps(made["schedule"], indent=2))
    for _ in range(size // one):
        client.post("/v1/schedules", {"spec": spec, "target": "billing"})


def test_demo_sigterm_restart_local_env_and_the_cli_at_its_edges(tmp_path: Path):
    with stacks(tmp_path) as launched:
        port = free_port()
        launched.append(ready(launch(tmp_path, port, "--demo")))
        stack = launched[-1]
        wait_for(lambda: "demo: worker polling " in output(stack), 60, "the demo's worker")
        # GIVEN a target made beside the demo's `default`, listed before it
        stack.cli_json("targets", "create", "billing")

        # WHEN `local env` runs with only the data folder, as the README's eval line does
        env = run_punctual("local", "env", "--data", str(tmp_path))
        # THEN it exports the endpoint of the stack running there (not the default port)
        assert (env.code, env.err) == (0, "")
        assert f"export PUNCTUAL_ENDPOINT={stack.url}" in env.out.splitlines()

        # WHEN the stack is sent SIGTERM
        stack.process.send_signal(signal.SIGTERM)
        # THEN it stops as on Ctrl-C: drivers then engines, exit 0, the same last line
        stopped_cleanly(stack, tmp_path)

        # WHEN it starts again on the same data
        launched.append(ready(launch(tmp_path, port, "--demo")))
        stack = launched[-1]
        # THEN the demo's worker polls `default`, where its schedules deliver (it polled the
        # first target in name order, `billing`, and printed nothing), and prints the
        # fresh one-shot when it comes
        queues = {t["name"]: t["queue_url"] for t in stack.cli_json("targets", "list")}
        wait_for(
            lambda: f"demo: worker polling {queues['default']}\n" in output(stack),
            60,
            "the demo's worker on default's queue",
        )
        printed = wait_for(
            lambda: ONE_SHOT_PRINTED.search(output(stack)), 90, "the demo's one-shot printed"
        )
        # (the one-shot of either start: the first one's may come due during the restart)
        occurrence_id = printed.group(1)

        occurrence_commands(stack, occurrence_id)
        ids_endpoints_and_pipes(stack)

        # WHEN this stack is stopped and `local up` is sent SIGTERM while it starts
        stack.process.send_signal(signal.SIGTERM)
        stopped_cleanly(stack, tmp_path)
        launched.append(launch(tmp_path, port, "--demo"))
        stack = launched[-1]
        lock = tmp_path / "stack.lock"
        wait_for(
            lambda: lock.read_text().startswith(f"pid {stack.process.pid},"),
            60,
            "the new `local up` to hold the data folder",
        )
        stack.process.send_signal(signal.SIGTERM)
        # THEN it finishes starting, then stops as on Ctrl-C, and starts no demo
        stopped_cleanly(stack, tmp_path)
        assert "demo:" not in output(stack)


def occurrence_commands(stack: Stack, occurrence_id: str) -> None:
    """The occurrence commands against the real API, on the demo's one-shot."""
    # WHEN `occurrence` prints the one-shot's occurrence for people (once it is done)
    wait_for(
        lambda: stack.cli_json("occurrence", occurrence_id)["state"] == "SUCCEEDED",
        30,
        "the demo's one-shot to succeed",
    )
    shown = stack.cli("occurrence", occurrence_id)
    # THEN its attempt is there, with its outcome
    assert shown.code == 0
    lines = shown.out.splitlines()
    at = next(n for n, line in enumerate(lines) if line.startswith("ATTEMPT "))
    assert lines[at].split() == ["ATTEMPT", "STARTED", "FINISHED", "OUTCOME", "ERROR"]
    assert lines[at + 1].split()[0::3] == ["1", "SUCCEEDED"]
    # AND where its time went: sent, claimed, one run
    times = next(line for line in lines if line.startswith("  times   "))
    assert "due -> receivable" in times, times
    assert "runs" in times, times
    # WHEN `occurrences` asks for a window around it, and for a state
    done = stack.cli_json("occurrence", occurrence_id)
    schedule_id, due = done["schedule_id"], done["scheduled_for"]
    around = ("--from", utc_text(int(time.time()) - 600), "--to", due)
    found = stack.cli_json("occurrences", schedule_id, *around, "--state", "SUCCEEDED")
    before = stack.cli_json("occurrences", schedule_id, "--to", "2026-01-01T00:00:00Z")
    other = stack.cli_json("occurrences", schedule_id, *around, "--state", "DEAD")
    # THEN the API's window and the state filter hold it, or leave it out
    assert [o["occurrence_id"] for o in found] == [occurrence_id]
    assert (before, other) == ([], [])
    # WHEN an operator reads the reconciler's report of the next hour
    next_hour = utc_text((int(time.time()) // 3600 + 1) * 3600)
    report = stack.cli("reconcile", "report", "--from", next_hour, key="operator")
    # THEN it is not reconciled yet (not MISSING 0)
    assert report.code == 0
    assert report.out.endswith(": not reconciled yet (no shard has reported on it)\n")


def ids_endpoints_and_pipes(stack: Stack) -> None:
    """The CLI at its edges: ids that are not plain words, an empty one, an endpoint
    without its scheme, a reader of its output that leaves early."""
    schedules = len(stack.cli_json("list"))
    for odd in ("日本", "a b", "#x", "?"):
        # WHEN `get` or `trigger` names an id that is not a plain word
        for command in ("get", "trigger"):
            done = stack.cli(command, odd)
            # THEN the API answers that no such schedule exists: exit 2, one line
            one_line_error(done, 2, "punctual: error: 404 ")
    # ... and `trigger '?'` created nothing (it once reached POST /v1/schedules)
    assert len(stack.cli_json("list")) == schedules
    # WHEN an id is empty: THEN a usage error, one line
    one_line_error(stack.cli("get", ""), 2, "punctual: error: ID: must not be empty")
    # WHEN the endpoint is written without its scheme: THEN it is the local stack's
    bare = run_punctual(
        *("list", "--json", "--endpoint", stack.url.removeprefix("http://")),
        env=stack.environment("demo"),
    )
    assert len(bare.json()) == schedules
    # WHEN `list --json`, longer than a pipe holds, is read by `head -3`, which leaves
    # after three lines
    listing_of_at_least(stack, 256 * 1024)
    command = " ".join(shlex.quote(part) for part in punctual("list", "--json"))
    piped = subprocess.run(
        ["bash", "-c", f'{command} | head -3; echo "status ${{PIPESTATUS[0]}}" >&2'],
        capture_output=True,
        text=True,
        env=stack.environment("demo") | {"PUNCTUAL_ENDPOINT": stack.url},
        cwd=REPO,
        timeout=120,
        check=False,
    )
    # THEN head prints three lines, and punctual leaves quietly, with the status of a
    # tool ended by SIGPIPE (it once printed a BrokenPipeError traceback)
    assert len(piped.stdout.splitlines()) == 3
    assert piped.stderr == "status 141\n"
