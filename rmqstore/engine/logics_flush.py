"""The ConsumeQueue flush thread and the checkpoint it keeps (spec §8.1, §11).

Like the broker's FlushConsumeQueueService: every ``flushIntervalConsumeQueue`` ms the
ConsumeQueue files with at least ``flushConsumeQueueLeastPages`` new pages are synced;
every ``flushConsumeQueueThoroughInterval`` ms all of them are, and then the checkpoint
is written with the logicsMsgTimestamp taken before that flush (so it never claims a unit
that was not yet on disk). A 5.x store also writes the checkpoint every second. The
store writes it besides when an index file fills (:class:`~rmqstore.files.index_service.IndexService`)
and on close; that way a crashed writer leaves a checkpoint as recent as a broker's.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from ..errors import StoreIOError


class LogicsFlushService:
    """One thread per open store; ``write_checkpoint(logics_ts or None)`` writes the file
    (None: the current logicsMsgTimestamp)."""

    def __init__(self, dispatcher, config, write_checkpoint: Callable[[int | None], None]):
        self.dispatcher = dispatcher
        self.config = config
        self.write_checkpoint = write_checkpoint
        self.every_second = config.broker_version != "4.9"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rmqstore-logics-flush",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        cfg = self.config
        now = time.monotonic
        last_thorough = last_checkpoint = now()
        while not self._stop.wait(cfg.flush_interval_consume_queue / 1000):
            t = now()
            try:
                if t - last_thorough >= cfg.flush_consume_queue_thorough_interval / 1000:
                    last_thorough = last_checkpoint = t
                    logics = self.dispatcher.logics_timestamp
                    self.dispatcher.flush_queues(0)
                    self.write_checkpoint(logics)
                    continue
                self.dispatcher.flush_queues(cfg.flush_consume_queue_least_pages)
                if self.every_second and t - last_checkpoint >= 1:
                    last_checkpoint = t
                    self.write_checkpoint(None)
            except (OSError, StoreIOError):
                # A disk error: the next round tries again; close reports what still fails.
                pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
