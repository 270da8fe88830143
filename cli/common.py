"""What every command shares: the app, error handling, output format, time parsing.

Commands live in ``cli/cmd_*.py`` modules, each registering on :data:`app`; they parse
arguments, call the library, and hand results to :mod:`cli.render`. Heavy modules
(pyspark, pyarrow) are imported inside the commands that use them, never here.
"""

from __future__ import annotations

import enum
import functools
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from rmqstore.errors import EXIT_UNUSABLE, RmqStoreError

app = typer.Typer(
    name="rmqstore",
    help="Read, check, repair and rebuild Apache RocketMQ broker stores, offline.",
    no_args_is_help=True,
    add_completion=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class Format(str, enum.Enum):
    table = "table"
    json = "json"
    jsonl = "jsonl"


class BodyMode(str, enum.Enum):
    base64 = "base64"
    text = "text"
    hex = "hex"
    none = "none"
    raw = "raw"


def is_terminal() -> bool:
    return sys.stdout.isatty()


def resolve_format(fmt: Optional[Format]) -> Format:
    """Table on a terminal, JSON Lines when piped, unless the user chose."""
    if fmt is not None:
        return fmt
    return Format.table if is_terminal() else Format.jsonl


def fail(message: str, code: int = EXIT_UNUSABLE) -> "typer.Exit":
    """One line on stderr, then exit with ``code``."""
    typer.echo(f"rmqstore: {message}", err=True)
    return typer.Exit(code)


def handles_errors(fn):
    """Turn library errors (and a broken pipe) into one line and a documented exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RmqStoreError as e:
            raise fail(str(e), e.exit_code) from None
        except BrokenPipeError:
            # The reader went away (`| head`): stop quietly, as Unix tools do.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            raise typer.Exit(0) from None
        except KeyboardInterrupt:
            raise fail("interrupted", 130) from None
        except OSError as e:
            where = f"{e.filename}: " if getattr(e, "filename", None) else ""
            raise fail(f"{where}{e.strerror or e}", EXIT_UNUSABLE) from None
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except Exception as e:  # noqa: BLE001 - a bug must still not spill a traceback
            if os.environ.get("RMQSTORE_DEBUG"):
                raise
            raise fail(f"internal error: {type(e).__name__}: {e} "
                       "(set RMQSTORE_DEBUG=1 for a traceback; please report it)", EXIT_UNUSABLE) from None

    return wrapper


def parse_time(text: Optional[str], option: str) -> Optional[int]:
    """Any time form :func:`rmqstore.times.parse_time` reads, to epoch milliseconds; a bad
    one is a usage error naming the option."""
    from rmqstore.errors import InputError
    from rmqstore.times import parse_time as _parse

    try:
        return _parse(text)
    except InputError as e:
        raise fail(f"{option}: {e}") from None


def iso(ms: Optional[int]) -> str:
    """Epoch milliseconds as ISO-8601 in the display zone (``--tz``, ``RMQSTORE_TZ``, UTC)."""
    from rmqstore.times import format_time

    return format_time(ms)


def existing_path(path: Path, what: str = "path") -> Path:
    if not path.exists():
        raise fail(f"{path}: no such {what}")
    return path


# Options shared by the commands that open a store.
ConfigOption = typer.Option(None, "--config", "-c", help="broker.conf to take store geometry from (RocketMQ property names).", exists=False)
FormatOption = typer.Option(None, "--format", "-f", help="Output format: table (default on a terminal), json, or jsonl (default when piped).", case_sensitive=False)
