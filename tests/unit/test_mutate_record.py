"""`make mutate`'s record in the repo: a fresh workspace starts from it, and a result recorded
for other code is not carried over."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import pytest

from scripts import mutate

FILE = "punctual/pipeline/relay.py"
SEND = "xǁRelayǁ_send_batch"
RELAY = "xǁRelayǁrelay"


def name(function: str, number: int) -> str:
    return f"punctual.pipeline.relay.{function}__mutmut_{number}"


@pytest.fixture
def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(mutate, "RECORDS", tmp_path / "records")
    mutate.write_record(
        "relay",
        {
            "tests_judged": "abc",
            "files": {
                FILE: {
                    "functions": {SEND: "h-send", RELAY: "h-relay"},
                    "mutants": {name(SEND, 1): 1, name(SEND, 2): 0, name(RELAY, 1): 1},
                }
            },
        },
    )
    return tmp_path


def meta_of(workspace: Path) -> dict[str, dict[str, object]]:
    data: dict[str, dict[str, object]] = json.loads(
        (workspace / "mutants" / f"{FILE}.meta").read_text(encoding="utf-8")
    )
    return data


def test_a_fresh_workspace_starts_from_the_recorded_results(records: Path):
    workspace = records / "ws"
    assert mutate.restore("relay", workspace) == 3
    meta = meta_of(workspace)
    # (mutmut reads every key it wrote: a meta file without them fails its load)
    assert set(meta) == {
        "exit_code_by_key",
        "hash_by_function_name",
        "type_check_error_by_key",
        "durations_by_key",
        "estimated_durations_by_key",
    }
    assert meta["exit_code_by_key"] == {name(SEND, 1): 1, name(SEND, 2): 0, name(RELAY, 1): 1}
    assert meta["hash_by_function_name"] == {SEND: "h-send", RELAY: "h-relay"}


def test_a_workspace_takes_only_results_recorded_for_the_same_code(records: Path):
    # GIVEN a workspace whose mutants were made again: _send_batch is unchanged, relay changed
    workspace = records / "ws"
    meta = workspace / "mutants" / f"{FILE}.meta"
    meta.parent.mkdir(parents=True)
    unchecked = {name(SEND, 1): None, name(SEND, 2): None, name(RELAY, 1): None}
    meta.write_text(
        json.dumps(
            {
                "exit_code_by_key": unchecked,
                "hash_by_function_name": {SEND: "h-send", RELAY: "h-relay-2"},
                "type_check_error_by_key": {},
                "durations_by_key": {},
                "estimated_durations_by_key": {},
            }
        ),
        encoding="utf-8",
    )
    # WHEN the record is restored into it
    restored = mutate.restore("relay", workspace)
    # THEN _send_batch's results come back; relay's mutants stay to be checked
    assert restored == 2
    assert meta_of(workspace)["exit_code_by_key"] == {
        name(SEND, 1): 1,
        name(SEND, 2): 0,
        name(RELAY, 1): None,
    }


def test_a_run_is_recorded_and_reported_from_the_record(records: Path):
    # GIVEN a workspace after a run (a mutant of relay checked since)
    workspace = records / "ws"
    mutate.restore("relay", workspace)
    meta = workspace / "mutants" / f"{FILE}.meta"
    data = json.loads(meta.read_text(encoding="utf-8"))
    data["exit_code_by_key"][name(RELAY, 2)] = 0
    meta.write_text(json.dumps(data), encoding="utf-8")
    # WHEN it is recorded
    mutate.record("relay", workspace, "def")
    # THEN the record holds it, with the digest of the tests it was judged against
    assert mutate.read_record("relay")["tests_judged"] == "def"
    assert mutate.results("relay")[name(RELAY, 2)] == 0
    survivors = {n for n, code in mutate.results("relay").items() if mutate.survived(code)}
    assert survivors == {name(SEND, 2), name(RELAY, 2)}


def test_a_result_file_cut_short_by_a_stop_keeps_the_record_and_is_made_again(records: Path):
    # GIVEN a workspace whose mutmut was stopped while writing its result file (empty)
    workspace = records / "ws"
    mutate.restore("relay", workspace)
    meta = workspace / "mutants" / f"{FILE}.meta"
    meta.write_text("", encoding="utf-8")
    # WHEN the run is recorded
    mutate.record("relay", workspace, "def")
    # THEN the record keeps the file's earlier results, and the next restore remakes it
    assert mutate.results("relay") == {name(SEND, 1): 1, name(SEND, 2): 0, name(RELAY, 1): 1}
    assert not meta.exists()
    assert mutate.restore("relay", workspace) == 3


@pytest.mark.parametrize(
    ("code", "killed", "survived"),
    [(1, True, False), (36, True, False), (0, False, True), (5, False, True), (None, False, False)],
)
def test_exit_codes_count_as_mutmut_reports_them(code: int | None, killed: bool, survived: bool):
    assert (mutate.killed(code), mutate.survived(code)) == (killed, survived)


def test_a_mutant_belongs_to_its_function():
    assert mutate.function_of(name(SEND, 12)) == SEND


def test_a_record_made_under_other_settings_is_not_restored(records: Path):
    # GIVEN a record, then other mutmut settings (other lines left alone: the same names
    # would be other mutations)
    mutate.record_path("relay").write_text(
        json.dumps(mutate.read_record("relay") | {"made_under": "made-elsewhere"}),
        encoding="utf-8",
    )
    # WHEN a workspace is restored from it
    restored = mutate.restore("relay", records / "ws")
    # THEN nothing is restored
    assert restored == 0
    assert not (records / "ws" / "mutants" / f"{FILE}.meta").exists()


def test_a_module_over_part_of_a_file_runs_and_counts_only_its_functions():
    quotas = mutate.MODULES["quotas"]
    error = "punctual.control.plane.xǁControlPlaneǁ_quota_error__mutmut_3"
    create = "punctual.control.plane.xǁControlPlaneǁcreate__mutmut_3"
    assert mutate.module_of(error) == "quotas"
    assert mutate.module_of(create) is None
    assert any(fnmatch.fnmatch(error, glob) for glob in quotas.selection(()))
    assert not any(fnmatch.fnmatch(create, glob) for glob in quotas.selection(()))
    # --only narrows it further; a module over whole files runs every mutant by default
    assert quotas.selection(("x*",)) == ["x*"]
    assert mutate.MODULES["relay"].selection(()) == []


def test_an_equivalent_judged_on_other_code_of_its_function_counts_again(
    records: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    # GIVEN two surviving mutants listed equivalent: one judged on _send_batch's recorded
    # code, one on relay's code before a change (its number may now be another mutation),
    # and a third listed without the code it was judged on
    listed = records / "equivalent.txt"
    listed.write_text(
        "# comment\n"
        f"{name(SEND, 2)} @h-send the text of an exception only\n"
        f"{name(RELAY, 2)} @h-relay-old a label nothing reads\n"
        f"{name(RELAY, 3)} a label nothing reads\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(mutate, "EQUIVALENT", listed)
    record = mutate.read_record("relay")
    record["files"][FILE]["mutants"] |= {name(RELAY, 2): 0, name(RELAY, 3): 0}
    mutate.write_record("relay", record)
    equivalents = mutate.equivalent()
    expected = mutate.Equivalent("the text of an exception only", "h-send")
    assert equivalents[name(SEND, 2)] == expected
    assert equivalents[name(RELAY, 3)] == mutate.Equivalent("a label nothing reads", None)
    # WHEN the results are reported
    survived = mutate.report(["relay"], mutate.results("relay"), equivalents)
    # THEN only the entry judged on today's code is equivalent; the other two count as
    # survivors and are listed with the hash to pin once checked again
    assert survived == 2
    out = capsys.readouterr().out
    assert "relay" in out
    assert "50.0%" in out  # 2 killed, 2 survived, 1 equivalent
    assert f"{name(RELAY, 2)} @h-relay" in out
    assert f"{name(RELAY, 3)} @h-relay" in out
    assert f"{name(SEND, 2)} @" not in out
