"""The ``rmqstore`` command: the app, ``--version``, and every ``cli/cmd_*.py`` module."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Optional

import typer

import cli
from cli.common import app
from rmqstore import __version__


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rmqstore {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(
    version: Optional[bool] = typer.Option(None, "--version", "-V", callback=_version,
                                           is_eager=True, help="Print the version and exit."),
) -> None:
    """Read, check, repair and rebuild Apache RocketMQ broker stores, offline.

    Exit codes: 0 ok, 1 problems found, 2 bad usage or unusable input.
    """


def _load_commands() -> None:
    # Each command module registers itself on `app`; the modules keep heavy imports
    # inside their functions so start-up stays fast.
    for info in sorted(pkgutil.iter_modules(cli.__path__), key=lambda m: m.name):
        if info.name.startswith("cmd_"):
            importlib.import_module(f"cli.{info.name}")


_load_commands()


def run() -> None:
    from cli.guard import supervise

    supervise()  # the command runs in a child: a bus error becomes one line (cli/guard.py)
    app(prog_name="rmqstore")


if __name__ == "__main__":
    run()
