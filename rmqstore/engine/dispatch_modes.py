"""The three dispatch modes of a store open for writing (spec §9) and what the appender
calls, under its lock, for each record it writes.

* ``sync``: the :class:`~rmqstore.engine.dispatch.Dispatcher` writes the CQ unit before
  ``put`` returns (the index keys then or a little later: ``rmqstore.engine.index_keys``);
* ``background``: records go to a :class:`BackgroundDispatcher`, a thread that follows
  the appender in CommitLog order, like the broker's ReputMessageService;
* ``off``: nothing; the next open re-dispatches what the queues lack.
"""

from __future__ import annotations

import collections
import threading
from typing import NamedTuple, Sequence

from ..format.message import parse_properties
from .batch_dispatch import dispatch_columns
from .results import Appended

DISPATCH_MODES = ("sync", "background", "off")


class Hooks(NamedTuple):
    """What a put calls under the append lock to dispatch what it wrote (None: nothing)."""

    record: object  # (topic, queue_id, queue_offset, offset, size, sys_flag, ts, props, text)
    columns: object  # (WrittenColumns): put_batch's and put_columns' records


def hooks(mode: str, dispatcher, background: "BackgroundDispatcher | None") -> Hooks:
    """The single put's dispatch and the batch puts' (one columnar form) in ``mode``."""
    if mode == "sync":
        return Hooks(dispatcher.dispatch_record, lambda c: dispatch_columns(dispatcher, c))
    if mode == "off":
        return Hooks(None, None)
    submit = background.submit

    def to_background(topic, queue_id, queue_offset, offset, size, sys_flag, ts, props, text):
        if props is None:
            props = parse_properties(text)
        submit([Appended(offset, size, topic, queue_id, queue_offset, sys_flag, ts, props)])

    return Hooks(to_background, lambda c: submit(c.appended()))


class BackgroundDispatcher:
    """Runs a :class:`Dispatcher` on its own thread, fed in CommitLog order."""

    def __init__(self, dispatcher):
        self.dispatcher = dispatcher
        self._pending: collections.deque[Sequence[Appended]] = collections.deque()
        self._cond = threading.Condition()
        self._stop = False
        self._busy = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rmqstore-reput", daemon=True)
        self._thread.start()

    def submit(self, records: Sequence[Appended]) -> None:
        """Queue records; the appender calls this under its lock, so order is kept."""
        with self._cond:
            self._pending.append(records)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stop:
                    self._cond.wait()
                if not self._pending and self._stop:
                    return
                batch = list(self._pending)
                self._pending.clear()
                self._busy = True
            try:
                if self.error is None:  # after a failure, units would land out of place
                    self.dispatcher.dispatch_many([a for records in batch for a in records])
            except BaseException as e:  # kept for close() to raise: dispatch must not die silently
                self.error = e
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def wait_idle(self) -> None:
        """Block until every submitted record is dispatched."""
        with self._cond:
            while self._pending or self._busy:
                self._cond.wait()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()
