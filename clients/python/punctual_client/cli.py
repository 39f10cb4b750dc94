"""The ``punctual`` command line."""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from importlib.metadata import entry_points, version
from typing import NoReturn

from pydantic import ValidationError

from punctual.domain.specs import AtSpec, CronSpec, DstChoice, RateSpec, preview_fires
from punctual.domain.validation import field_errors
from punctual.timing import (
    ZoneError,
    from_epoch,
    get_zone,
    resolve_at,
    tzdata_version,
)
from punctual.timing.preview import MAX_PREVIEW
from punctual_client.commands import (
    CommandFailed,
    UsageError,
    add_client_commands,
    dst_flags,
    main_for,
    spec_flags,
)
from punctual_client.http import ApiError, BadAnswer, NoCredentials
from punctual_client.launch import EXIT_INTERRUPTED

COMMANDS_GROUP = "punctual.commands"
EXIT_USAGE = 2
EXIT_FAILURE = 1
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports `yes` after `yes | head -1`
DEBUG = "PUNCTUAL_DEBUG"  # set (to anything but 0): an unexpected error shows its traceback


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


ENDPOINT_HELP = "the API (default: $PUNCTUAL_ENDPOINT, else the local stack)"


def version_line() -> str:
    """The client's version and what it speaks: the message schema and the run protocol of
    the punctual-core it runs on."""
    from punctual.dal.runs import RUN_PROTOCOL_VERSION
    from punctual.domain.message import MESSAGE_VERSION

    return (
        f"punctual-client {version('punctual-client')} on punctual-core"
        f" {version('punctual-core')}: message schema {MESSAGE_VERSION},"
        f" run protocol {RUN_PROTOCOL_VERSION}"
    )


def _parser() -> argparse.ArgumentParser:
    """Global options (--json, --endpoint) go anywhere, as the AWS CLI's do: the top level
    holds their defaults, and a command's copy sets them only when given (SUPPRESS), so
    it never overwrites one given before the command."""
    parser = _Parser(prog="punctual", description="Punctual scheduler tools.")
    parser.add_argument("--version", action="version", version=version_line())
    parser.add_argument("--endpoint", metavar="URL", help=ENDPOINT_HELP)
    parser.add_argument("--json", action="store_true", help="print JSON")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    show = commands.add_parser(
        "preview",
        help="show the next fires of a schedule in UTC and local time, with DST notes",
    )
    spec_flags(show, required=True)
    show.add_argument("--after", metavar="ISO", help="show fires strictly after this (now)")
    show.add_argument("--count", type=int, default=10, help=f"how many, 1..{MAX_PREVIEW}")
    show.add_argument("--anchor", metavar="ISO", help="rate anchor (default: --start or --after)")
    show.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    endpoint = _Parser(add_help=False)
    endpoint.add_argument(
        "--endpoint", metavar="URL", default=argparse.SUPPRESS, help=ENDPOINT_HELP
    )
    endpoint.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON"
    )
    add_client_commands(commands, endpoint)
    # Commands other installed packages add (the development tooling's `local` and `stats`):
    # the client names none of them.
    for plugin in entry_points(group=COMMANDS_GROUP):
        plugin.load()(commands)
    return parser


def _instant(text: str | None, zone: str | None, flag: str) -> int | None:
    if text is None:
        return None
    try:
        return resolve_at(text, zone).instant
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def _spec(args: argparse.Namespace) -> CronSpec | RateSpec | AtSpec:
    start = _instant(args.start, args.tz, "--start")
    end = _instant(args.end, args.tz, "--end")
    bounds = {
        "start_at": from_epoch(start) if start is not None else None,
        "end_at": from_epoch(end) if end is not None else None,
    }
    dst = {"dst": DstChoice(**flags)} if (flags := dst_flags(vars(args))) else {}
    try:
        if args.cron is not None:
            if args.tz is None:
                raise UsageError("--tz is required with --cron (an IANA zone, e.g. Europe/Berlin)")
            return CronSpec(expression=args.cron, timezone=args.tz, **bounds, **dst)
        if args.rate is not None:
            anchor = _instant(args.anchor, args.tz, "--anchor")
            return RateSpec(
                expression=args.rate,
                anchor=from_epoch(anchor) if anchor is not None else None,
                timezone=args.tz or "UTC",
                **bounds,
                **dst,
            )
        return AtSpec(at=args.at, timezone=args.tz, **bounds, **dst)
    except ValidationError as exc:
        first = field_errors(exc)[0]
        raise UsageError(f"{first['field']}: {first['reason']}") from None


def _preview(args: argparse.Namespace, now: Callable[[], float]) -> int:
    if not 1 <= args.count <= MAX_PREVIEW:
        raise UsageError(f"--count must be between 1 and {MAX_PREVIEW}, got {args.count}")
    try:
        zone = get_zone(args.tz or "UTC")
    except ZoneError as exc:
        raise UsageError(f"--tz: {exc}") from None
    after = _instant(args.after, args.tz, "--after")
    if after is None:
        after = int(now())
    result = preview_fires(_spec(args), after, args.count)
    if args.json:
        body = result.as_json() | {"timezone": str(zone.key), "tzdata": tzdata_version()}
        print(json.dumps(body, indent=2))
        return 0
    for fire in result.fires:
        print(f"{fire.utc}  {fire.local}")
    if not result.fires:
        print("no fires after " + datetime.fromtimestamp(after, zone).isoformat())
    for note in result.notes:
        print(f"note: {note}")
    return 0


def _run(argv: Sequence[str] | None, now: Callable[[], float]) -> int:
    args = _parser().parse_args(argv)
    if args.command == "preview":
        return _preview(args, now)
    return main_for(args)


def _say(kind: str, error: BaseException | str) -> None:
    """One line on stderr, whatever the message holds (an answer's newlines included)."""
    print(f"punctual: {kind}: {' '.join(str(error).split())}", file=sys.stderr)


def _discard_stdout() -> None:
    """Python flushes stdout once more as it exits, into the same closed pipe, and says so
    on stderr: from now on stdout is /dev/null."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # not a file (a test's captured stdout)


def main(argv: Sequence[str] | None = None, now: Callable[[], float] = time.time) -> int:
    """The exit code: 0 success, 2 bad input or a 4xx answer, 1 any other failure, one line
    on stderr for each; 130 after Ctrl-C; 141, silently, when stdout's reader has gone
    (``punctual list | head``), as other tools end."""
    try:
        code = _run(argv, now)
        sys.stdout.flush()  # a reader gone is found here, not as Python exits
        return code
    except UsageError as exc:
        _say("error", exc)
        return EXIT_USAGE
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    except (ApiError, NoCredentials, CommandFailed, BadAnswer, OSError) as exc:
        _say("failed", exc)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print("punctual: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if os.environ.get(DEBUG, "0") not in ("", "0"):
            raise
        _say("failed", f"{type(exc).__name__}: {exc} (unexpected: {DEBUG}=1 shows where)")
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
