"""The local stack's guards: one stack per data folder, a busy port named, and recorded
engine pids never taken for another program."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from punctual_client.cli import main
from punctual_client.http import Client
from punctual_local.engines import KINDS, Engine
from punctual_local.stack import StackError, StackOptions, bind_gateway, claim


def test_claim_refuses_a_second_stack_on_the_same_data_naming_the_first(tmp_path: Path):
    # GIVEN a stack holding the data folder
    first = claim(tmp_path, "API http://127.0.0.1:8766")
    # WHEN another one claims it
    with pytest.raises(StackError) as refused:
        claim(tmp_path, "API http://127.0.0.1:9999")
    # THEN it is refused, naming the running one (pid and API)
    assert str(refused.value) == (
        f"a local stack is already running on {tmp_path} (pid {os.getpid()}, API "
        "http://127.0.0.1:8766); stop it with Ctrl-C where it runs, or use it as it is"
    )
    # WHEN the first one ends (its process dies or it stops): THEN the folder is free again
    first.close()
    claim(tmp_path, "API http://127.0.0.1:9999").close()


def test_bind_gateway_on_a_busy_port_names_the_port():
    # GIVEN a port something else listens on
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        # WHEN the stack's API binds it
        with pytest.raises(StackError) as refused:
            bind_gateway(port, StackOptions().functions)
    # THEN the error names the port and what to do
    assert str(refused.value) == (
        f"port {port} is already in use (another program, or a local stack on another data "
        "folder); choose another with --port"
    )


@pytest.mark.parametrize("name", ["sqs", "dynamodb"])
def test_a_recorded_pid_that_another_program_has_now_is_no_engine(name: str):
    # GIVEN an engine record whose pid now belongs to another program (this test process)
    engine = Engine(name, 1, os.getpid(), KINDS[name])
    # WHEN asked whether the engine is alive, and told to stop
    # THEN it is not taken for the engine, and nothing is signalled
    assert not engine.alive()
    engine.stop()


def test_stack_context_runs_out_of_time_once_the_stack_is_stopping():
    # GIVEN the context the local stack hands its materializer and reconciler calls
    import threading

    from punctual_local.stack import _Stoppable

    stopping = threading.Event()
    context = _Stoppable("reconciler", 900, stopping)
    assert context.get_remaining_time_in_millis() > 800_000
    # WHEN the stack is asked to stop; THEN the handler sees no time left, and stops
    # between steps instead of holding up the stop
    stopping.set()
    assert context.get_remaining_time_in_millis() == 0


def test_load_handlers_imports_every_present_handler_in_the_calling_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a functions root with an API and a relay handler, each noting the thread that
    # imports it, and no materializer or reconciler
    import sys
    import threading

    from punctual_local.stack import HANDLERS, load_handlers

    for name in ("api", "relay"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
        (tmp_path / name / "handler.py").write_text(
            "import threading\nimported_by = threading.current_thread().name\n"
            "def lambda_handler(event, context):\n    return {}\n"
        )
    names = {n for module in HANDLERS for n in (module.split(".")[0], module)}
    real = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    monkeypatch.setattr(sys, "path", list(sys.path))
    # WHEN the stack loads its handlers
    try:
        loaded = load_handlers(tmp_path)
        imported = {m: sys.modules[m] for m in loaded}
    finally:  # the real handlers back, for the tests after this one
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(real)
    # THEN both present ones are imported now, by this thread (not later by the stack's
    # threads, racing each other's imports), and the absent ones are skipped
    assert loaded == ["api.handler", "relay.handler"]
    for handler in imported.values():
        assert handler.imported_by == threading.current_thread().name
        assert Path(str(handler.__file__)).parent.parent == tmp_path


# --- the local commands at their edges (issue 46) ----------------------------------------

REPO = Path(__file__).resolve().parents[2]


def _make_run(*assignments: str, env: dict[str, str] | None = None) -> list[str]:
    """The command `make run ASSIGNMENTS` runs, as make prints it (-n), its prerequisites
    (the venv, the tools) taken as made."""
    done = subprocess.run(
        ["make", "-n", "-s", "-o", ".venv/.run-stamp", "-o", "tools", "run", *assignments],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return shlex.split(done.stdout.strip().splitlines()[-1])


def test_make_run_passes_port_data_and_other_flags_to_local_up():
    # GIVEN make run with a port, a data folder (with a space) and another flag of `local up`
    # WHEN make runs it
    argv = _make_run("PORT=8800", "DATA=/tmp/punctual x", "ARGS=--tick 5")
    # THEN `local up` gets each of them (in the foreground: exec, so a signal to make's
    # child reaches `local up` itself)
    assert argv == [
        *("exec", ".venv/bin/punctual", "local", "up", "--demo"),
        *("--port", "8800", "--data", "/tmp/punctual x", "--tick", "5"),
    ]
    # AND without them, the defaults
    assert _make_run() == ["exec", ".venv/bin/punctual", "local", "up", "--demo"]


def test_make_run_ignores_a_port_the_shell_exports():
    # GIVEN a shell that exports PORT for something else (as PaaS shells do)
    # WHEN make run runs there; THEN the stack keeps its own port and data folder (only
    # PORT= and DATA= given to make itself count)
    argv = _make_run(env={"PORT": "3000", "DATA": "/elsewhere"})
    assert argv == ["exec", ".venv/bin/punctual", "local", "up", "--demo"]


def test_demo_worker_polls_the_default_target_whatever_else_the_tenant_has():
    # GIVEN the demo tenant with a target listed before `default` (as the README invites)
    from punctual_local.demo import demo_queue

    targets = [
        {"name": "billing", "queue_url": "http://sqs/punctual-demo_billing"},
        {"name": "default", "queue_url": "http://sqs/punctual-demo_default"},
    ]
    client = SimpleNamespace(get=lambda path: {"targets": targets} if path == "/v1/targets" else {})
    # WHEN the demo picks its queue; THEN it is the one its schedules deliver to
    assert demo_queue(cast(Client, client)) == "http://sqs/punctual-demo_default"
    # AND without a `default`, it says what the tenant has instead of polling another
    client = SimpleNamespace(get=lambda path: {"targets": targets[:1]})
    with pytest.raises(LookupError, match=r"no target default \(it has billing\)"):
        demo_queue(cast(Client, client))


def test_local_env_prints_the_endpoint_of_the_stack_running_on_the_data_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    # GIVEN a stack on tmp_path serving its API on a port that is not the default one
    # (its lock names it), and its engines running
    engines = {"AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:1", "PUNCTUAL_SHARD_COUNT": "8"}
    monkeypatch.setattr("punctual_local.engines.running_environment", lambda data: engines)
    with socket.socket() as api:
        api.bind(("127.0.0.1", 0))
        api.listen()
        url = f"http://127.0.0.1:{api.getsockname()[1]}"
        lock = claim(tmp_path, f"API {url}")
        try:
            # WHEN `local env` runs without --port
            code = main(["local", "env", "--data", str(tmp_path)])
            out, err = capsys.readouterr()
            # THEN it exports that stack's endpoint
            assert (code, err) == (0, "")
            assert out.splitlines() == [
                "export AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:1",
                "export PUNCTUAL_SHARD_COUNT=8",
                f"export PUNCTUAL_ENDPOINT={url}",
            ]
            # AND an explicit --port still wins
            main(["local", "env", "--data", str(tmp_path), "--port", "9"])
            assert capsys.readouterr().out.splitlines()[-1] == (
                "export PUNCTUAL_ENDPOINT=http://127.0.0.1:9"
            )
        finally:
            lock.close()
    # WHEN that stack is gone but its engines run on (its `local up` was killed)
    code = main(["local", "env", "--data", str(tmp_path)])
    out, err = capsys.readouterr()
    # THEN the exports still name the API it served, and stderr says no stack serves it
    assert code == 0
    assert out.splitlines()[-1] == f"export PUNCTUAL_ENDPOINT={url}"
    assert err.count("\n") == 1
    assert err.startswith(f"punctual: note: no `local up` serves the API on {tmp_path} now ")


def test_recorded_api_tells_whether_the_stack_still_serves_it(tmp_path: Path):
    from punctual_local.stack import RecordedApi, recorded_api

    # GIVEN no stack ever ran on the folder: THEN nothing is recorded
    assert recorded_api(tmp_path) is None
    with socket.socket() as api:
        api.bind(("127.0.0.1", 0))
        api.listen()
        url = f"http://127.0.0.1:{api.getsockname()[1]}"
        claim(tmp_path, f"API {url}").close()
        # WHEN its process lives (this one) and the port answers: THEN it serves it
        assert recorded_api(tmp_path) == RecordedApi(url, serving=True)
    # WHEN the port no longer answers (its `local up` was killed): THEN not served
    assert recorded_api(tmp_path) == RecordedApi(url, serving=False)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            ["local", "up", "--port", "70000"],
            "argument --port: must be between 0 and 65535, got 70000",
            id="port",
        ),
        pytest.param(
            ["local", "up", "--tick", "0"], "argument --tick: must be at least 1, got 0", id="tick"
        ),
        pytest.param(
            ["local", "up", "--reconcile-every", "x"],
            "argument --reconcile-every: not an integer: 'x'",
            id="reconcile_every",
        ),
        pytest.param(
            ["stats", "--minutes", "-5"], "argument --minutes: must be at least 1, got -5", id="m"
        ),
    ],
)
def test_local_commands_refuse_numbers_out_of_range_before_starting_anything(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    # GIVEN a number `local up` or `stats` cannot run with; WHEN the command runs
    code = main([*argv, "--data", str(tmp_path)])
    out, err = capsys.readouterr()
    # THEN exit 2 with one line, and nothing was started on the data folder
    assert (code, out) == (2, "")
    assert err == f"punctual: error: {message}\n"
    assert list(tmp_path.iterdir()) == []


FIGURES: dict[str, Any] = {
    "occurrences": {"SCHEDULED": 2, "SUCCEEDED": 9, "DEAD": 1},
    "lag_seconds": {"strict": {"p50": 0.4, "p95": 1.2, "p99": 1.9, "n": 9}},
    "waited_for_a_worker_seconds": {"p50": 3.0, "p95": 146.0, "p99": 146.0, "n": 10},
    "time_in_state_seconds": {
        "strict": {
            "to_receivable": {"p50": 0.0, "p95": 1.0, "p99": 1.0, "n": 9},
            "to_claim": {"p50": 2.0, "p95": 5.0, "p99": 5.0, "n": 9},
            "run": {"p50": 3.0, "p95": 40.0, "p99": 40.0, "n": 10},
            "retry_wait": {"p50": 30.0, "p95": 30.0, "p99": 30.0, "n": 1},
        }
    },
    "schedules": {"ACTIVE": 4, "COMPLETED": 1},
    "missed_summarized": 0,
    "drain": {
        "backlog": 0,
        "oldest_due": None,
        "oldest_age_seconds": None,
        "taken_per_minute": 0.0,
        "due_per_minute": 0.0,
        "drain_seconds": 0,
        "largest_tenants": [],
    },
    "reconcile": {
        "window_start": 1_796_594_400,
        "window_end": 1_796_598_000,
        "shards_reported": 0,
        "missing": 0,
        "unexpected": 0,
    },
}


def test_stats_prints_readable_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    # GIVEN the local figures (read from the engines `local env` exported)
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setattr("punctual_local.stats.figures", lambda services, since: FIGURES)
    # WHEN `punctual stats` prints them for people
    code = main(["stats"])
    out, err = capsys.readouterr()
    # THEN counts read as words (most first), not Python dicts, and a window no shard
    # reported on is not reconciled yet (not MISSING 0)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "occurrences (last 60 min): 9 SUCCEEDED, 2 SCHEDULED, 1 DEAD",
        "schedule lag strict: p50 0 s, p95 1 s, p99 2 s (9 sent)",
        "waited for a worker (claimed - due): p50 3 s, p95 146 s, p99 146 s (10 claimed)",
        "time in each state, strict: due -> receivable p50 0 s, p99 1 s (9); "
        "receivable -> claimed p50 2 s, p99 5 s (9); run p50 3 s, p99 40 s (10); "
        "retry wait p50 30 s, p99 30 s (1)",
        "schedules: 4 ACTIVE, 1 COMPLETED; fires recorded MISSED (misfire policy): 0",
        "backlog (due, not taken): 0",
        "reconciler, last window 2026-12-06T22:00:00Z .. 2026-12-06T23:00:00Z: not reconciled yet",
    ]


def test_stats_without_running_engines_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    # GIVEN no exports from `local env` and no engines on the data folder
    monkeypatch.delenv("AWS_ENDPOINT_URL_DYNAMODB", raising=False)
    # WHEN `punctual stats` runs: THEN it says so (it once scanned AWS's tables, if any)
    code = main(["stats", "--data", str(tmp_path)])
    assert code == 2
    assert capsys.readouterr().err == (
        f"punctual: error: no local engines are running on {tmp_path}; start them with "
        "`punctual local up` (or give the stack's --data)\n"
    )
