"""`make mutate`: mutation testing (mutmut 3) of the modules that carry correctness.

The modules live in three source roots (layers/, clients/, devtools/) and are installed in
editable mode, which mutmut's copy-and-import scheme cannot see through. So the script
mirrors what the tests need into a flat workspace per module (``.mutate/relay/``...:
``punctual/``, ``punctual_client/``, ``functions/``, ``infra/``, ``tests/``, a
``pyproject.toml`` with mutmut's settings: the module's files and the tests aimed at it),
runs mutmut there, and prints the kill rate per module and each survivor.

The workspaces are kept between runs: mutmut remembers each mutant's result and re-tests only
the functions that changed (and their callers), so a rerun after a fix is quick. Every
result is also recorded in the repo (``tests/mutation/results/<module>.json``: per file, each
function's hash and each mutant's exit code), and a new workspace (a fresh clone) starts from
that record: a run goes on where the last one, on any machine, stopped, and ``--report``
prints the recorded figures without running anything. Mutants listed in
``tests/mutation/equivalent.txt`` (each with its reason and the hash of the function's code
it was judged on) are equivalent: they cannot change behaviour, count as neither killed nor
survived, and are not printed; an entry judged on other code counts again until re-checked.

    python -m scripts.mutate                  # every module
    python -m scripts.mutate relay worker     # some of them
    python -m scripts.mutate --list           # the modules and the files they cover
    python -m scripts.mutate dal --only 'punctual.dal.runs.*'   # some mutants of a module
"""

from __future__ import annotations

import argparse
import filecmp
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from punctual_local.dynamodb import SHARED_PORT
from punctual_local.dynamodb import start as start_dynamodb_local

REPO = Path(__file__).resolve().parent.parent
WORKSPACE = REPO / ".mutate"
EQUIVALENT = REPO / "tests" / "mutation" / "equivalent.txt"
RECORDS = REPO / "tests" / "mutation" / "results"

# What goes into the workspace (its path there: where it is in the repo).
MIRRORED = {
    "punctual": REPO / "layers/core/python/punctual",
    "punctual_client": REPO / "clients/python/punctual_client",
    "functions": REPO / "functions",
    # (the relay's start handler, which tests/integration/test_handlers.py runs)
    "infra": REPO / "infra",
    "tests": REPO / "tests",
}


@dataclass(frozen=True)
class Module:
    """A module under mutation: its files (workspace globs), the mutant name prefixes mutmut
    gives their functions, and the unit and integration tests aimed at it (not the
    end-to-end ones, not the seeded simulation): per mutant, mutmut runs those of them that
    call the mutated function. ``part``: the prefixes name some functions of the files, not
    all of them; only those functions' mutants are run (and counted)."""

    files: tuple[str, ...]
    prefixes: tuple[str, ...]
    tests: tuple[str, ...]
    part: bool = False

    def selection(self, only: tuple[str, ...]) -> list[str]:
        """The mutant name globs of a run: ``only``, else the module's functions when it
        covers part of its files, else every mutant (an empty list)."""
        if only or not self.part:
            return list(only)
        return [f"{prefix}*" for prefix in self.prefixes]


def _tests(folder: str, *names: str) -> tuple[str, ...]:
    """Each name's tests: the folder of that name (``tests/integration/worker``), else its
    ``test_<name>.py``."""
    return tuple(
        f"tests/{folder}/{name}"
        if (REPO / "tests" / folder / name).is_dir()
        else f"tests/{folder}/test_{name}.py"
        for name in names
    )


MODULES = {
    "timing": Module(
        ("punctual/timing/*.py",),
        ("punctual.timing.",),
        _tests(
            "unit",
            "cron_parse",
            "rules_rate_and_at",
            "calendar",
            "time_vectors",
            "models",
            "preview",
            "timing_edges",
            "dst_policy",
        ),
    ),
    "dal": Module(
        ("punctual/dal/*.py",),
        ("punctual.dal.",),
        _tests(
            "integration",
            "tables",
            "materializer",
            "relay",
            "redrive",
            "reconciler",
            "worker",
            "isolation",
            "api_schedules",
            "api_versioning",
            "api_quotas_and_idempotency",
            "api_tenancy",
            # what calls the rest of the stores: a take-over, run now's mark, a backfill, a
            # re-plan under new zone rules
            "multi_region",
            "trigger",
            "backfill",
            "tz_rules",
            "run_protocol",
            "reconciler_races",
            "hostile_items",
            "backoff_bounds",
            "api_retryable",
        )
        + _tests(
            "unit",
            "runs",
            "responses",
            "page_tokens",
            "index_wait",
            "reports",
            "batch_get",
            "occurrence_range",
            "transactions",
            "keys",
        ),
    ),
    "materializer": Module(
        ("punctual/pipeline/materializer.py", "punctual/domain/planning.py"),
        ("punctual.pipeline.materializer.", "punctual.domain.planning."),
        _tests(
            "integration",
            "materializer",
            "handlers",
            "tz_rules",
            "hostile_items",
            "backoff_bounds",
        )
        + _tests("unit", "planning")
        # (the reconciler's findings under each DST choice: what shows_wall decides)
        + ("tests/integration/reconciler/test_dst.py",),
    ),
    "relay": Module(
        (
            "punctual/pipeline/relay.py",
            "punctual/pipeline/redrive.py",
            "punctual/domain/message.py",
        ),
        ("punctual.pipeline.relay.", "punctual.pipeline.redrive.", "punctual.domain.message."),
        _tests(
            "integration",
            "relay",
            "redrive",
            "isolation",
            "handlers",
            "hostile_items",
            "stream_lanes",
            "prompt_send",
        )
        + _tests("unit", "message"),
    ),
    # A clock's offset from a server's: the worker's from SQS's stamps, each server
    # component's from DynamoDB's answers (its own module: the worker module's tests take
    # an hour a run; these are the ones that reach it).
    "clock": Module(
        ("punctual/skew.py",),
        ("punctual.skew.",),
        (
            *_tests("unit", "worker_clock", "answer_clock"),
            "tests/integration/worker/test_start_on_instant.py",
        ),
    ),
    "worker": Module(
        ("punctual_client/worker/*.py",),
        ("punctual_client.worker.",),
        # (the consumer's polls, back-off and log lines: tests/unit/test_queue_consumer.py)
        _tests("integration", "worker", "run_protocol", "hostile_items")
        + _tests("unit", "queue_consumer", "worker_clock"),
    ),
    "reconciler": Module(
        ("punctual/pipeline/reconciler.py", "punctual/pipeline/ownership.py"),
        ("punctual.pipeline.reconciler.", "punctual.pipeline.ownership."),
        # (tests/integration/materializer holds how a cursor left behind the walk is moved
        # ahead)
        _tests(
            "integration",
            "reconciler",
            "handlers",
            "redrive",
            "tz_rules",
            "multi_region",
            "materializer",
            "reconciler_races",
            "hostile_items",
            # (the backfill's records: the reconciler's check of the hour it was made in)
            "backfill",
        )
        + _tests("unit", "reconciler_rules", "transactions"),
    ),
    # The tenant-wide ledger: the reconciler's pages (its ``_enter`` and ``_write_ledger``
    # are the reconciler module's, the table's store dal's) and the API's reading of them.
    "ledger": Module(
        ("punctual/domain/ledger.py", "punctual/control/ledger.py"),
        ("punctual.domain.ledger.", "punctual.control.ledger."),
        ("tests/integration/reconciler/test_ledger.py", *_tests("unit", "ledger")),
    ),
    # A schedule's recent figures: what GET /v1/schedules/{id} says of its last fires.
    "figures": Module(
        ("punctual/domain/figures.py",),
        ("punctual.domain.figures.",),
        _tests("unit", "figures") + _tests("integration", "recent_figures"),
    ),
    "tenancy": Module(
        ("punctual/domain/tenancy.py",),
        ("punctual.domain.tenancy.",),
        _tests("integration", "api_quotas_and_idempotency", "api_tenancy", "isolation")
        + _tests("unit", "models", "tenancy"),
    ),
    # The control plane's quota checks (the usage conditions themselves are dal's, the
    # strict-fire arithmetic tenancy's): the usage a change moves, the refusal it turns into,
    # and run-now's count of the minute.
    "quotas": Module(
        ("punctual/control/plane.py", "punctual/control/manual.py"),
        (
            *(
                f"punctual.control.plane.xǁControlPlaneǁ{function}__mutmut_"
                for function in ("_usage_action", "_refusal", "_quota_error")
            ),
            "punctual.control.manual.xǁManualRunsǁ_manual_run_minute__mutmut_",
        ),
        _tests("integration", "api_quotas_and_idempotency", "trigger", "api_versioning"),
        part=True,
    ),
}

LOG_CALL = r"\blogger\.(debug|info|warning|error|exception)\("
# mutmut's exit codes for a mutant's run (mutmut/stats.py, `status_by_exit_code`), and what
# each means for the kill rate: pytest failed (1), errored (3), ran out of time (36, 24, -24,
# 152, 255), crashed (-11, -9), or the type checker refused the mutant (37); it passed (0), no
# test reached the mutant (5, 33), or something else happened (mutmut's "suspicious").
# None: not checked; 2: interrupted; 34: skipped. Neither counts.
KILLED_CODES = frozenset({1, 3, 24, -24, 36, 37, 152, 255, -11, -9})
UNJUDGED_CODES = frozenset({None, 2, 34})


def killed(code: int | None) -> bool:
    return code in KILLED_CODES


def survived(code: int | None) -> bool:
    return code not in KILLED_CODES | UNJUDGED_CODES


def sync(source: Path, target: Path) -> int:
    """Mirror ``source`` into ``target``, rewriting only files whose content differs (so
    mutmut sees unchanged files as unchanged); returns how many were written."""
    written = 0
    wanted: set[Path] = set()
    for path in source.rglob("*"):
        if "__pycache__" in path.parts or path.suffix == ".pyc" or not path.is_file():
            continue
        relative = path.relative_to(source)
        wanted.add(relative)
        copy = target / relative
        if copy.exists() and filecmp.cmp(path, copy, shallow=False):
            continue
        copy.parent.mkdir(parents=True, exist_ok=True)
        # A fresh mtime, not the source's (copy2): mutmut takes a source file older than
        # its mutated copy for unchanged, and would keep mutants of the old code.
        shutil.copy(path, copy)
        written += 1
    if target.exists():
        for path in list(target.rglob("*")):
            stale = path.is_file() and path.relative_to(target) not in wanted
            if stale and "__pycache__" not in path.parts:
                path.unlink()
    return written


def settings(module: Module) -> str:
    """A workspace's pyproject.toml: the repo's pytest settings and mutmut's."""
    with (REPO / "pyproject.toml").open("rb") as handle:
        pytest_options = tomllib.load(handle)["tool"]["pytest"]["ini_options"]
    lines = [
        "[tool.pytest.ini_options]",
        *(f"{key} = {_toml(value)}" for key, value in pytest_options.items()),
        "",
        "[tool.mutmut]",
        'source_paths = ["punctual", "punctual_client"]',
        f"only_mutate = {_toml(module.files)}",
        'also_copy = ["functions", "infra", "tests"]',
        f"pytest_add_cli_args_test_selection = {_toml([*module.tests, '-m', 'not slow'])}",
        # A mutant's tests run fastest first (tests/mutation/fastest_first.py).
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-p", "tests.mutation.fastest_first"]',
        # A log call's text and fields are for operators, not behaviour: not mutated.
        f"do_not_mutate_patterns = {_toml([LOG_CALL])}",
        "use_git_change_detection = false",
        # A mutant that loops forever is killed after six times its tests' CPU time on the
        # clean code (mutmut's default, thirty times, let one hold a worker for half an hour).
        "timeout_multiplier = 3.0",
        "",
    ]
    return "\n".join(lines)


def _toml(value: object) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(value)


@dataclass(frozen=True)
class Equivalent:
    """A triaged mutant: why it cannot change behaviour, and the hash of its function's code
    it was judged on (mutmut's, as recorded): a change to the function renumbers its
    mutants, so the name may now be another mutant; judged on other code, it counts again
    until someone checks it (``mutmut show``) and pins it to the hash ``--report`` prints."""

    reason: str
    judged_on: str | None


def equivalent() -> dict[str, Equivalent]:
    """The mutants triaged as equivalent, by name: ``NAME @HASH reason`` a line."""
    found = {}
    for line in EQUIVALENT.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, rest = line.partition(" ")
            pin, _, reason = rest.strip().partition(" ")
            judged_on = pin[1:] if pin.startswith("@") else None
            reason = reason if judged_on is not None else rest
            if not reason.strip():
                raise SystemExit(f"{EQUIVALENT}: {name} has no reason")
            found[name] = Equivalent(reason.strip(), judged_on)
    return found


def function_hashes(module: str) -> dict[str, str]:
    """Each recorded mutant's function's hash (the code it was made from): mutant -> hash."""
    return {
        name: entry["functions"].get(function_of(name), "")
        for entry in read_record(module)["files"].values()
        for name in entry["mutants"]
    }


def confirmed(equivalents: dict[str, Equivalent], hashes: dict[str, str]) -> set[str]:
    """The entries that still name the mutant they were judged on (same function code)."""
    return {n for n, e in equivalents.items() if e.judged_on and hashes.get(n) == e.judged_on}


def record_path(module: str) -> Path:
    return RECORDS / f"{module}.json"


def read_record(module: str) -> dict[str, Any]:
    """The module's recorded results: ``tests_judged`` (the digest of the tests the last
    complete run was judged against, or None) and, per file, its functions' hashes and its
    mutants' exit codes."""
    path = record_path(module)
    if not path.exists():
        return {"tests_judged": None, "files": {}}
    found: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return found


def write_record(module: str, record: dict[str, Any]) -> None:
    RECORDS.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, indent=1, sort_keys=True, ensure_ascii=False)
    record_path(module).write_text(text + "\n", encoding="utf-8")


def results(module: str) -> dict[str, int | None]:
    """Every mutant's recorded exit code."""
    return {
        name: code
        for entry in read_record(module)["files"].values()
        for name, code in entry["mutants"].items()
    }


def function_of(mutant: str) -> str:
    """The (mangled) function a mutant of mutmut's belongs to:
    ``punctual.pipeline.relay.xǁRelayǁrelay__mutmut_3`` -> ``xǁRelayǁrelay``."""
    return mutant.rpartition("__mutmut_")[0].rpartition(".")[2]


def metas(module: str, workspace: Path) -> dict[str, Path]:
    """The module's files (as mutmut names them) and where mutmut keeps their results."""
    found = {}
    for meta in (workspace / "mutants").rglob("*.py.meta"):
        file = meta.relative_to(workspace / "mutants").as_posix().removesuffix(".meta")
        if any(fnmatch.fnmatch(file, glob) for glob in MODULES[module].files):
            found[file] = meta
    return found


# The settings that decide which mutants mutmut makes (the files, the lines left alone).
MAKING = ("source_paths", "only_mutate", "do_not_mutate_patterns")


def settings_digest(module: str) -> str:
    """Which mutants mutmut makes depends on some of its settings (``MAKING``): a mutant's
    name (its function and number) means the same mutation only under the same ones. The
    tests selected are not among them: a test added to a module's selection keeps every
    kill (the survivors are tried again, as after any change of the tests); a test taken
    out of it would leave the kills it made standing (remove a test by hand: run again)."""
    lines = [
        line for line in settings(MODULES[module]).splitlines() if line.split(" = ")[0] in MAKING
    ]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def restore(module: str, workspace: Path) -> int:
    """Bring the recorded results into the workspace where it has none of its own (a fresh
    clone, or mutants made again); returns how many. mutmut keeps a result only while its
    function's hash is the one recorded, so a result recorded for other code is dropped when
    mutmut makes the mutants; none is restored from a record made under other settings."""
    restored = 0
    found = read_record(module)
    if found.get("made_under", settings_digest(module)) != settings_digest(module):
        print(f"== {module}: the record was made under other settings: every mutant again")
        return 0
    for file, entry in found["files"].items():
        meta = workspace / "mutants" / f"{file}.meta"
        if meta.exists():
            data = json.loads(meta.read_text(encoding="utf-8"))
            same = {
                f
                for f, h in entry["functions"].items()
                if data["hash_by_function_name"].get(f) == h
            }
            for name, code in entry["mutants"].items():
                mine = data["exit_code_by_key"].get(name, 0)
                if code is not None and mine is None and function_of(name) in same:
                    data["exit_code_by_key"][name] = code
                    restored += 1
        else:
            data = {
                "exit_code_by_key": entry["mutants"],
                "hash_by_function_name": entry["functions"],
                "type_check_error_by_key": {},
                "durations_by_key": {},
                "estimated_durations_by_key": {},
            }
            restored += sum(1 for code in entry["mutants"].values() if code is not None)
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps(data, indent=4), encoding="utf-8")
    return restored


def record(module: str, workspace: Path, tests_judged: str | None) -> None:
    """Record the workspace's results in the repo (after every run, a stopped one too)."""
    files = {}
    earlier = read_record(module)["files"]
    for file, meta in sorted(metas(module, workspace).items()):
        try:
            data = json.loads(meta.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            # mutmut was stopped while it wrote this file (it holds nothing): keep what the
            # record had, and let the next run make the file again from it.
            print(f"== {module}: {meta.name} was cut short (a stop mid-write): record kept")
            meta.unlink()
            if file in earlier:
                files[file] = earlier[file]
            continue
        files[file] = {
            "functions": data["hash_by_function_name"],
            "mutants": data["exit_code_by_key"],
        }
    if files:
        write_record(
            module,
            {"made_under": settings_digest(module), "tests_judged": tests_judged, "files": files},
        )


def module_of(name: str) -> str | None:
    return next((m for m, spec in MODULES.items() if name.startswith(spec.prefixes)), None)


def report(
    chosen: list[str], statuses: dict[str, int | None], equivalents: dict[str, Equivalent]
) -> int:
    """Print the kill rate per module and the survivors; returns how many survived."""
    survivors = []
    hashes = {n: h for module in chosen for n, h in function_hashes(module).items()}
    settled = confirmed(equivalents, hashes)
    print(f"{'module':<14}{'mutants':>9}{'killed':>9}{'survived':>10}{'equivalent':>12}  kill rate")
    for module in chosen:
        mine = {n: s for n, s in statuses.items() if module_of(n) == module}
        counts = Counter(
            "equivalent" if n in settled else "killed" if killed(s) else "survived"
            for n, s in mine.items()
            if killed(s) or survived(s)
        )
        judged = counts["killed"] + counts["survived"]
        rate = f"{100 * counts['killed'] / judged:.1f}%" if judged else "-"
        print(
            f"{module:<14}{len(mine):>9}{counts['killed']:>9}{counts['survived']:>10}"
            f"{counts['equivalent']:>12}  {rate}"
        )
        survivors += sorted(n for n, s in mine.items() if survived(s) and n not in settled)
        unchecked = sum(1 for s in mine.values() if not (killed(s) or survived(s)))
        if unchecked:
            print(f"  ({unchecked} not checked yet)")
    if survivors:
        print("\nsurvivors (`cd .mutate/MODULE && ../../.venv/bin/mutmut show NAME`: the change):")
        for name in survivors:
            again = " (listed equivalent, judged on other code)" if name in equivalents else ""
            print(f"  {name}  [exit code {statuses[name]}]{again}")
    # Only the entries of chosen modules with results: another module's mutants, or those
    # of a module never run here, are not in ``statuses``.
    checked = {module_of(n) for n in statuses}
    listed = {n for n in equivalents if module_of(n) in checked & set(chosen)}
    stale = sorted(n for n in listed if n not in statuses)
    if stale:
        print(f"\n{len(stale)} entries of {EQUIVALENT.name} name no mutant now (code changed):")
        for name in stale:
            print(f"  {name}")
    repin = sorted(n for n in listed if n in statuses and n not in settled)
    if repin:
        print(
            f"\n{len(repin)} entries of {EQUIVALENT.name} were judged on other code of their "
            "function (or on none recorded): check each (`mutmut show NAME`), then pin it to "
            "the hash shown or remove it:"
        )
        for name in repin:
            print(f"  {name} @{hashes.get(name, '')}")
    return len(survivors)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make mutate", description=__doc__.split("\n")[0])
    parser.add_argument("modules", nargs="*", metavar="MODULE", help=", ".join(MODULES))
    parser.add_argument("--list", action="store_true", help="the modules and their files")
    parser.add_argument("--report", action="store_true", help="only print the last results")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="GLOB",
        help="only the mutants whose names match (e.g. 'punctual.dal.runs.*'); repeatable",
    )
    args = parser.parse_args(argv)
    if args.list:
        for name, spec in MODULES.items():
            print(f"{name:<14}{' '.join(spec.files)}")
        return 0
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        print(f"make mutate: unknown module {unknown[0]} (one of {', '.join(MODULES)})")
        return 2
    chosen = args.modules or list(MODULES)
    equivalents = equivalent()
    statuses: dict[str, int | None] = {}
    for name in chosen:
        if not args.report:
            mutate(name, WORKSPACE / name, args.max_children, equivalents, tuple(args.only))
        statuses |= results(name)
    survived = report(chosen, statuses, equivalents)
    return 1 if survived else 0


def tests_digest(workspace: Path) -> str:
    """A digest of the workspace's tests: what the last complete run was judged against."""
    digest = hashlib.sha256()
    for path in sorted((workspace / "tests").rglob("*.py")):
        digest.update(str(path.relative_to(workspace)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def mutate(
    name: str,
    workspace: Path,
    max_children: int,
    equivalents: dict[str, Equivalent],
    only: tuple[str, ...] = (),
) -> None:
    """Bring the module's workspace up to date with the repo and run mutmut there: if the
    tests changed since the last complete run, the survivors of earlier runs first (mutmut
    keeps a result until its function changes; new tests are what a triage adds, so a
    stopped run has checked them first), then the mutants not tested yet or whose function
    changed. ``only``: mutant name globs, the rest left for a later run."""
    hashes = function_hashes(name)
    before = {n for n, s in results(name).items() if survived(s)} - confirmed(equivalents, hashes)
    workspace.mkdir(parents=True, exist_ok=True)
    written = {part: sync(source, workspace / part) for part, source in MIRRORED.items()}
    config = workspace / "pyproject.toml"
    text = settings(MODULES[name])
    if not config.exists() or config.read_text(encoding="utf-8") != text:
        # Other settings: mutmut would keep mutants made under the old ones (which lines
        # are left alone), so they are made again.
        shutil.rmtree(workspace / "mutants", ignore_errors=True)
        config.write_text(text, encoding="utf-8")
    restored = restore(name, workspace)
    print(
        f"== {name}: workspace {workspace.relative_to(REPO)}, {sum(written.values())} files"
        f" updated, {restored} results restored from {record_path(name).relative_to(REPO)}"
    )
    # Recorded after a run that was not stopped: a stopped one leaves the survivors to retry.
    judged = read_record(name)["tests_judged"]
    digest = tests_digest(workspace)
    retry = sorted(before) if judged != digest else []
    engine = start_dynamodb_local()  # one for every mutant's run (tests' conftest)
    try:
        selection = MODULES[name].selection(only)
        for names in (retry, selection) if retry else (selection,):
            if names is retry:
                print(f"== {name}: the tests changed: {len(names)} earlier survivors again")
            run = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "mutmut",
                    "run",
                    "--max-children",
                    str(max_children),
                    *names,
                ],
                cwd=workspace,
                env=os.environ | {SHARED_PORT: str(engine.port)},
                check=False,
            )
            if run.returncode != 0:
                return
        if not only:
            judged = digest  # a complete run
    finally:
        engine.stop()
        record(name, workspace, judged)


if __name__ == "__main__":
    sys.exit(main())
