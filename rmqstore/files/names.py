"""Names that come from disk (a record's topic) turned into paths, safely.

A topic is bytes from a record; the broker makes it a directory name under
``consumequeue/`` (spec §6.1). A record's topic is not covered by its CRC (spec §3.1), so a
flipped bit can make ``TopicA`` into ``T/picA``, and a hand-made record can carry
``../../x``. rmqstore uses a topic as a path only through :func:`queue_dir`, which accepts
exactly one safe path component (:func:`topic_problem`) and raises
:class:`~rmqstore.errors.UnsafePathError` otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UnsafePathError

#: The longest file name Linux file systems take (NAME_MAX), in bytes.
NAME_MAX = 255


def topic_problem(topic: str) -> str | None:
    """Why ``topic`` cannot be one directory name, or None when it can.

    Safe: non-empty, not ``.`` or ``..``, no ``/`` and no NUL, at most :data:`NAME_MAX`
    bytes in UTF-8. Anything else (spaces, ``%``, non-ASCII) is left to the broker's own
    topic rules; as a path component it is harmless."""
    if not topic:
        return "the topic is empty"
    if topic in (".", ".."):
        return f"the topic is {topic!r}, a directory reference"
    if "/" in topic:
        return "the topic contains '/'"
    if "\0" in topic:
        return "the topic contains a NUL byte"
    n = len(os.fsencode(topic))
    if n > NAME_MAX:
        return f"the topic is {n} bytes, more than a file name holds ({NAME_MAX})"
    return None


def is_safe_topic(topic: str) -> bool:
    return topic_problem(topic) is None


def shown(topic: str) -> str:
    """``topic`` for a one-line message: quoted, control bytes escaped, at most 80 chars."""
    r = repr(topic[:80])
    return r + ("..." if len(topic) > 80 else "")


def queue_dir(consumequeue: str | os.PathLike, topic: str, queue_id: int, *,
              where: str | os.PathLike | None = None, offset: int | None = None) -> Path:
    """``consumequeue/{topic}/{queueId}``, or :class:`UnsafePathError` when the topic is
    not one safe path component (``offset``: the CommitLog offset of the record it came
    from; ``where``: the file the error names)."""
    why = topic_problem(topic)
    if why is not None:
        rec = f" of the record at CommitLog offset {offset}" if offset is not None else ""
        raise UnsafePathError(f"topic {shown(topic)}{rec} cannot be a directory name ({why}); "
                              "rmqstore never uses it as a path", where)
    return Path(consumequeue) / topic / str(int(queue_id))
