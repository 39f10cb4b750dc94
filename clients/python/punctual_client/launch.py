"""The ``punctual`` command's entry point. Its modules take a moment to load (pydantic,
botocore): Ctrl-C then ends it as Ctrl-C at any other time does, with one line and the
shell's exit code for SIGINT, not a traceback of the import it cut short."""

from __future__ import annotations

import sys

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C


def entry_point() -> None:
    try:
        from punctual_client.cli import main  # (imported here: under the guard)
    except KeyboardInterrupt:
        print("punctual: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(main())


if __name__ == "__main__":
    entry_point()
