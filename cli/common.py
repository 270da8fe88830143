"""What every command shares: the app, error handling, time parsing.

Commands live in ``cli/cmd_*.py`` modules, each registering on :data:`app`; they parse
arguments, call the library, and hand results to :mod:`cli.output`. Heavy modules
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
from typer._click.exceptions import NoArgsIsHelpError, UsageError
from typer.core import TyperGroup

from cli import terminal
from rmqstore.errors import EXIT_UNUSABLE, RmqStoreError


def _one_line(self: UsageError, file=None) -> None:
    """A usage error as one line, ``rmqstore dump: no such option: --foo (see rmqstore
    dump -h)``, instead of click's usage block."""
    path = self.ctx.command_path if self.ctx is not None else "rmqstore"
    msg = " ".join(self.format_message().replace("Value error, ", "").split()).rstrip(".")
    msg = msg[:1].lower() + msg[1:]
    typer.echo(f"{path}: {terminal.clean(msg)} (see {path} -h)", err=True)


def _short(e: UsageError) -> UsageError:
    if not isinstance(e, NoArgsIsHelpError):  # `rmqstore` alone prints the help
        e.show = _one_line.__get__(e)
    return e


class Group(TyperGroup):
    """The root command: usage errors anywhere below it print one line (exit 2)."""

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except UsageError as e:
            raise _short(e) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UsageError as e:
            raise _short(e) from None


app = typer.Typer(
    name="rmqstore",
    help="Read, check, repair and rebuild Apache RocketMQ broker stores, offline.",
    cls=Group,
    no_args_is_help=True,
    add_completion=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class BodyMode(str, enum.Enum):
    base64 = "base64"
    text = "text"
    hex = "hex"
    none = "none"
    raw = "raw"


def fail(message: str, code: int = EXIT_UNUSABLE) -> "typer.Exit":
    """One line on stderr, then exit with ``code``."""
    typer.echo(f"rmqstore: {terminal.clean(message)}", err=True)
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


def report_config(cfg) -> None:
    """The notes and warnings :func:`rmqstore.files.config.load_config` left, one line each on
    stderr: what was ignored, and what the output may not cover."""
    for n in cfg.notes:
        typer.echo(f"rmqstore: note: {n}", err=True)
    for w in cfg.warnings:
        typer.echo(f"rmqstore: warning: {w}", err=True)


def existing_path(path: Path, what: str = "path") -> Path:
    if not path.exists():
        raise fail(f"{path}: no such {what}")
    return path


# Options shared by the commands that open a store.
ConfigOption = typer.Option(None, "--config", "-c", help="The broker.conf the store was written with (RocketMQ property names). The files decide geometry; a value that disagrees with them is an error, and --config supplies what they cannot tell (IndexFile slots vs entries). STORE stays the root: storePathRootDir is ignored, storePathCommitLog is used only where its directories exist (docs/reading.md).", exists=False)
