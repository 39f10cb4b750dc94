"""The local stack's guards: one stack per data folder, a busy port named, and recorded
engine pids never taken for another program."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

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
