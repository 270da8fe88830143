"""Making appended CommitLog bytes durable, the way the broker's flush services do (spec §11).

* ``SYNC_FLUSH`` (§11.2): group commit. A writer whose message waits (``WAIT`` is not
  ``false``) asks for its end offset to be flushed and gets ``PUT_OK`` only once the one
  flush thread has synced at least that far, or ``FLUSH_DISK_TIMEOUT`` after
  ``syncFlushTimeout``. Requests that arrive while a sync runs share the next one.
* ``ASYNC_FLUSH`` (§11.1): the thread wakes every ``flushIntervalCommitLog`` ms and syncs
  when at least ``flushCommitLogLeastPages`` 4 KiB pages are dirty, or unconditionally
  every ``flushCommitLogThoroughInterval`` ms.
* ``transientStorePoolEnable`` (§11.3): appends go to an in-memory buffer per segment;
  the same thread *commits* (``write()``s) ``[committed, written)`` into the file every
  ``commitIntervalCommitLog`` ms (least ``commitCommitLogLeastPages`` pages, thorough
  every ``commitCommitLogThoroughInterval``), and the flush then syncs the file. Readers
  see only committed bytes.

A full sync (least pages 0) reports the store timestamp of the last record it covered
through ``on_flushed``; the store keeps it as the checkpoint's physicMsgTimestamp (§8.1).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from ..errors import StoreIOError
from ..files.segments import OS_PAGE_SIZE, Segment, segment_pwrite, segment_sync


class TransientPool:
    """Write buffers of one segment each, lent to segments until they are committed.

    Like the broker's pool, a returned buffer is reused without clearing: the bytes after
    a BLANK header that a commit copies are whatever the buffer held (zeros when new).
    """

    def __init__(self, segment_size: int, count: int):
        self.segment_size = segment_size
        self.count = count
        self._free: list[bytearray] = []
        self._lent: dict[int, bytearray] = {}
        self._made = 0

    def buffer_for(self, seg: Segment) -> bytearray:
        buf = self._lent.get(seg.start)
        if buf is None:
            buf = self._free.pop() if self._free else bytearray(self.segment_size)
            self._lent[seg.start] = buf
        return buf

    def lent(self, start: int) -> bytearray | None:
        return self._lent.get(start)

    def release(self, start: int) -> None:
        buf = self._lent.pop(start, None)
        if buf is not None and len(self._free) < self.count:
            self._free.append(buf)


class FlushService:
    """The flush thread of one CommitLog (and its commit step with a transient pool)."""

    def __init__(self, appender, config, *, pool: TransientPool | None = None,
                 on_flushed: Callable[[int], None] | None = None,
                 on_tick: Callable[[], None] | None = None):
        """``on_tick`` is called from the thread about every ``flushIntervalCommitLog``
        ms (the store writes index keys still waiting then)."""
        self.appender = appender
        self.on_tick = on_tick
        self.config = config
        self.pool = pool
        self.sync = config.flush_disk_type == "SYNC_FLUSH"
        self.on_flushed = on_flushed or (lambda ts: None)
        start = appender.end
        self.committed = start  # end of bytes in the files (== written without a pool)
        self.flushed = start  # end of bytes known to be on disk
        self._cond = threading.Condition()
        self._requested = start  # highest end offset a sync writer waits for
        self._stop = False
        self._io = threading.Lock()  # one commit/flush at a time
        self._thread: threading.Thread | None = None
        self.flush_count = 0

    # --- the work ------------------------------------------------------------------------

    def _snapshot(self) -> tuple[int, int, list[Segment]]:
        a = self.appender
        with a.lock:
            return a.end, a.last_store_timestamp, list(a.queue.segments)

    def commit(self, least_pages: int = 0) -> int:
        """Copy written-but-uncommitted pool bytes into the files (spec §11.3)."""
        if self.pool is None:
            end, _, _ = self._snapshot()
            self.committed = max(self.committed, end)
            return self.committed
        with self._io:
            end, _, segs = self._snapshot()
            if end <= self.committed:
                return self.committed
            if least_pages and end // OS_PAGE_SIZE - self.committed // OS_PAGE_SIZE < least_pages \
                    and end // self.pool.segment_size == self.committed // self.pool.segment_size:
                return self.committed
            for seg in segs:
                lo, hi = max(self.committed, seg.start), min(end, seg.end)
                if lo >= hi:
                    continue
                buf = self.pool.lent(seg.start)
                if buf is not None:
                    segment_pwrite(seg, memoryview(buf)[lo - seg.start:hi - seg.start], lo - seg.start)
                if hi == seg.end:
                    self.pool.release(seg.start)  # fully committed: back to the pool
            self.committed = end
            return end

    def flush(self, least_pages: int = 0) -> int:
        """Commit, then sync every segment with unsynced bytes; returns the flushed end."""
        self.commit(0 if self.sync or least_pages == 0 else self.config.commit_commit_log_least_pages)
        with self._io:
            end, ts, segs = self._snapshot()
            end = min(end, self.committed)
            if end <= self.flushed:
                if least_pages == 0 and ts:
                    self.on_flushed(ts)
                return self.flushed
            if least_pages and end // OS_PAGE_SIZE - self.flushed // OS_PAGE_SIZE < least_pages \
                    and end // self.appender.size == self.flushed // self.appender.size:
                return self.flushed
            for seg in segs:
                if seg.end > self.flushed and seg.start < end:
                    segment_sync(seg)
            self.flush_count += 1
        with self._cond:
            self.flushed = max(self.flushed, end)
            self._cond.notify_all()
        if least_pages == 0 and ts:
            self.on_flushed(ts)
        return end

    # --- the thread ----------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rmqstore-flush", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        cfg = self.config
        now = time.monotonic
        last_thorough_flush = last_thorough_commit = last_commit = last_tick = now()
        while True:
            with self._cond:
                if self.sync:
                    # Group commit: sleep until someone waits (at most 10 ms, spec §11.2).
                    if not self._stop and self._requested <= self.flushed:
                        self._cond.wait(0.01)
                else:
                    wait = cfg.flush_interval_commit_log / 1000
                    if self.pool is not None:
                        wait = min(wait, cfg.commit_interval_commit_log / 1000)
                    if not self._stop:
                        self._cond.wait(wait)
                stopping = self._stop
            if stopping:
                break
            try:
                t = now()
                if self.on_tick is not None and t - last_tick >= cfg.flush_interval_commit_log / 1000:
                    self.on_tick()
                    last_tick = t
                if self.sync:
                    self.flush(0)
                    continue
                if self.pool is not None and t - last_commit >= cfg.commit_interval_commit_log / 1000:
                    least = cfg.commit_commit_log_least_pages
                    if t - last_thorough_commit >= cfg.commit_commit_log_thorough_interval / 1000:
                        least, last_thorough_commit = 0, t
                    self.commit(least)
                    last_commit = t
                least = cfg.flush_commit_log_least_pages
                if t - last_thorough_flush >= cfg.flush_commit_log_thorough_interval / 1000:
                    least, last_thorough_flush = 0, t
                self.flush(least)
            except (OSError, StoreIOError):
                # A disk error: keep the thread alive; writers waiting will time out and
                # the store's close reports the failure when it flushes for the last time.
                time.sleep(0.01)

    def wait_flushed(self, offset: int) -> bool:
        """Block a SYNC_FLUSH writer until ``offset`` is on disk; False on timeout."""
        deadline = time.monotonic() + self.config.sync_flush_timeout / 1000
        with self._cond:
            if offset > self._requested:
                self._requested = offset
                self._cond.notify_all()
            while self.flushed < offset:
                left = deadline - time.monotonic()
                if left <= 0 or self._stop:
                    return self.flushed >= offset
                self._cond.wait(left)
        return True

    def readable_end(self) -> int:
        """How far readers may read: the committed end with a pool, else the written end."""
        return self.committed if self.pool is not None else self.appender.end

    def stop(self) -> None:
        """Stop the thread, then commit and flush everything (a clean shutdown)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.flush(0)
