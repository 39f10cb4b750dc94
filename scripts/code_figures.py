"""The codebase's largest files and functions at a commit: lines per file, lines and
cyclomatic complexity (ruff's mccabe) per function of the runtime, client, tooling and
infrastructure code (tests and scripts left out of the function figures).

    .venv/bin/python -m scripts.code_figures [COMMIT]     # HEAD by default
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUFF = REPO / ".venv" / "bin" / "ruff"
SHOWN = 8
NOT_CODE = ("tests/", "scripts/")


def _tree(commit: str, into: Path) -> list[Path]:
    archive = subprocess.run(
        ["git", "archive", commit], cwd=REPO, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return sorted(into.rglob("*.py"))


def _complexity(root: Path) -> list[tuple[int, str, str]]:
    found = subprocess.run(
        [
            *(str(RUFF), "check", "--isolated", "--select", "C901", "--output-format", "json"),
            *("--config", "lint.mccabe.max-complexity=0", str(root)),
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    rows = []
    for item in json.loads(found):
        named = re.search(r"`(.+?)` is too complex \((\d+) >", item["message"])
        path = str(Path(item["filename"]).relative_to(root))
        if named and not path.startswith(NOT_CODE):
            rows.append((int(named.group(2)), named.group(1), path))
    return sorted(rows, reverse=True)


def _lengths(root: Path, files: list[Path]) -> list[tuple[int, str, str]]:
    rows = []
    for path in files:
        relative = str(path.relative_to(root))
        if relative.startswith(NOT_CODE):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                rows.append(
                    ((node.end_lineno or node.lineno) - node.lineno + 1, node.name, relative)
                )
    return sorted(rows, reverse=True)


def main(argv: list[str]) -> int:
    commit = argv[0] if argv else "HEAD"
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        files = _tree(commit, root)
        sizes = sorted((len(p.read_text().splitlines()), str(p.relative_to(root))) for p in files)
        print(f"== {commit}: largest files (lines)")
        for lines, path in sizes[::-1][:SHOWN]:
            print(f"  {lines:6,d}  {path}")
        print("== most complex functions (mccabe)")
        for value, name, path in _complexity(root)[:SHOWN]:
            print(f"  {value:6d}  {name} ({path})")
        print("== longest functions (lines)")
        for value, name, path in _lengths(root, files)[:SHOWN]:
            print(f"  {value:6d}  {name} ({path})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
