"""Errors inside Spark tasks, carried to the driver as one line.

A task's exception reaches the driver as the text of a Python traceback wrapped in a
JVM stack trace (pyspark's ``PythonException``). So a task raises, instead of an
:class:`~rmqstore.errors.RmqStoreError` (or an ``OSError``), a ``RuntimeError`` whose
message is :data:`MARK` plus the error as one line of JSON; the driver finds the last
such line in whatever Spark raises (:func:`from_spark`) and raises the typed error
again, naming the file, the offset and the executor's host. Failures that never reach
rmqstore's code (executors that cannot start their Python or import rmqstore, a Python
version mismatch) are recognised by what Spark says about them. Plain Python: no
pyspark import, so it is tested without Spark.
"""

from __future__ import annotations

import json
import re
import socket

from .. import __version__
from .. import errors as E

#: Starts the message of the exception a task raises for a typed error.
MARK = "rmqstore-task-error:"
_MARKED = re.compile(re.escape(MARK) + r"(\{[^\n]*\})")
_NO_MODULE = re.compile(r"No module named '(rmqstore|numpy|pyarrow|pandas|pyspark|py4j)[.'\w]*")
_WHERE = ("every node needs the same rmqstore version with the 'spark' extra for that Python; "
          "choose the executors' Python with --python or PYSPARK_PYTHON "
          "(docs/pipeline.md, On a cluster)")


def task_failure(e: BaseException) -> BaseException:
    """What a task raises in place of ``e``: typed errors and OS errors as a marked
    one-line message; anything else (a bug) unchanged."""
    if isinstance(e, E.RmqStoreError):
        d = {"type": type(e).__name__, "message": e.message, "path": e.path, "offset": e.offset}
    elif isinstance(e, OSError):
        d = {"type": "StoreIOError", "message": e.strerror or str(e),
             "path": e.filename if isinstance(e.filename, str) else None, "offset": None}
    else:
        return e
    d["host"] = socket.gethostname()
    # ensure_ascii keeps the JSON on one line whatever bytes a name held
    return RuntimeError(MARK + json.dumps(d, ensure_ascii=True))


def check_version(driver_version: str) -> None:
    """In a task: refuse to run another rmqstore version than the driver's (split plans
    and task code must agree byte for byte on what they mean)."""
    if __version__ != driver_version:
        raise E.SparkError(f"executor on {socket.gethostname()} has rmqstore {__version__}, the "
                           f"driver {driver_version}: {_WHERE}")


def decode(text: str) -> E.RmqStoreError | None:
    """The typed error a task marked in ``text`` (the last one), or None."""
    found = _MARKED.findall(text)
    if not found:
        return None
    try:
        d = json.loads(found[-1])
    except ValueError:
        return None
    cls = getattr(E, str(d.get("type")), None)
    if not (isinstance(cls, type) and issubclass(cls, E.RmqStoreError)):
        cls = E.RmqStoreError
    host = d.get("host")
    message = str(d.get("message")) + (f" (in a Spark task on {host})" if host else "")
    offset = d.get("offset") if isinstance(d.get("offset"), int) else None
    return cls(message, d.get("path"), offset)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _first_line(text: str) -> str:
    for ln in text.splitlines():
        ln = ln.strip()
        if ln and not ln.startswith(("An error occurred while calling", "Traceback")):
            return ln.lstrip(": ")
    return ""


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def from_spark(e: BaseException, python: str | None = None) -> E.RmqStoreError:
    """One typed error for whatever Spark raised on the driver (``PythonException``,
    ``Py4JJavaError``, ...): a task's own error as it was raised, else a
    :class:`~rmqstore.errors.SparkError` saying what failed in one line."""
    text = str(e)
    typed = decode(text)
    if typed is not None:
        return typed
    py = f"executors' Python ({python})" if python else "executors' Python"
    m = _NO_MODULE.search(text)
    if m:
        return E.SparkError(f"{py} cannot import {m.group(1)}: {_WHERE}")
    if "PYTHON_VERSION_MISMATCH" in text or "than that in driver" in text:
        detail = next((ln.strip() for ln in text.splitlines() if "than that in driver" in ln), "")
        return E.SparkError(f"{py} is another Python version than the driver's"
                            f"{': ' + _short(detail) if detail else ''}; {_WHERE}")
    m = re.search(r'Cannot run program "([^"]*)"[^\n]*', text)
    if m:
        return E.SparkError(f"executors cannot start their Python: {_short(m.group(0))}; {_WHERE}")
    if "Traceback (most recent call last)" in text:
        tb = text[text.index("Traceback (most recent call last)"):]
        # The Python traceback ends before the JVM's stack trace, if one follows.
        tb = re.split(r"\n\s*at [\w$.]+\(", tb)[0]
        return E.SparkError(f"a Spark task failed: {_short(_last_line(tb))}")
    return E.SparkError(f"Spark failed: {_short(_first_line(text))}")
