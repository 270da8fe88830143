"""The message filters ``rmqstore dump`` and ``rmqstore spark export`` share: their options
and how the options become the keyword arguments of one
:class:`rmqstore.selection.MessageFilter` (the same rule for both commands, in one place)."""

from __future__ import annotations

from typing import Optional

import typer

from cli.common import fail, parse_time

TIME_HELP = "epoch seconds or milliseconds (told apart by magnitude), ISO-8601, or yyyy-MM-dd#HH:mm:ss:SSS"
QueueIdOption = typer.Option(None, "--queue-id", "-q", help="Only this queue id; repeat for several.")
TagOption = typer.Option(None, "--tag", help="Only messages whose TAGS is this tag ('TagA || TagB' for either, '*' for all); repeat for several.")
KeyOption = typer.Option(None, "--key", "-k", help="Only messages with this KEYS token; repeat for several.")
UniqKeyOption = typer.Option(None, "--uniq-key", help="Only messages with this UNIQ_KEY (client message id); repeat for several.")
SinceOption = typer.Option(None, "--since", help=f"Only messages stored at or after this time: {TIME_HELP}.")
UntilOption = typer.Option(None, "--until", help=f"Only messages stored at or before this time: {TIME_HELP}.")


def use_tz(tz: Optional[str]) -> None:
    """Make ``--tz`` the zone for times given without one (and for printed times)."""
    from rmqstore.errors import InputError
    from rmqstore.times import set_default_tz

    try:
        set_default_tz(tz)  # None: back to $RMQSTORE_TZ / UTC
    except InputError as e:
        raise fail(f"--tz: {e}") from None


def filter_args(*, topic, queue_id, tag, key, uniq_key, since, until, from_offset, to_offset,
                max_bytes) -> dict:
    """:meth:`MessageFilter.make`'s keyword arguments from the options: an option not
    given (or an empty list) is None; times are parsed in the zone :func:`use_tz` set,
    a bad one is a usage error naming its option."""
    return dict(topic=topic or None, queue_id=queue_id or None, tag=tag or None,
                key=key or None, uniq_key=uniq_key or None,
                since=parse_time(since, "--since"), until=parse_time(until, "--until"),
                from_offset=from_offset, to_offset=to_offset, max_bytes=max_bytes)
