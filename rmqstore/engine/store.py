"""``MessageStore``: the writer engine behind one store root (put, put_batch, close).

Opening takes the broker's ``lock`` (spec §8.3) and keeps it until :meth:`close`;
another holder makes :meth:`MessageStore.open` raise :class:`StoreLockedError`. It then
creates ``abort`` (§8.2: empty for 4.9, the PID for 5), finds the end of the CommitLog
(§10.1), and restores the next queue offset of every queue from the ConsumeQueues
(§10.6), first re-dispatching any records the queues lack (the 4.9 reput start, §9).
After a crash (``abort`` was there) it also undoes what an interrupted append or index
put left, and takes logicsMsgTimestamp from the last dispatched record, as the broker's
abnormal recovery leaves them (§10.3). What the open reads, refuses and re-dispatches is
:mod:`rmqstore.engine.load`'s; the dispatch modes :mod:`rmqstore.engine.dispatch_modes`'.

A clean :meth:`close` stops dispatch and flushing, syncs everything, deletes the
preallocated segment nothing was written to (§2), writes the checkpoint (§8.1: 3 longs
for 4.9, 5 for 5) and only then removes ``abort``.

A store with BatchCQ topics or LMQ puts through :mod:`rmqstore.engine.queue_kinds_put`.

``brokerVersion`` (config.broker_version) picks the on-disk conventions of §13: the
trailing property separator, magic v2 for long topics, and the checkpoint length.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Sequence

from ..errors import NotAStoreError, RecordError, StoreIOError
from ..files import checkpoint as ckpt
from ..files.config import StoreConfig, load_config
from ..files.index import IndexGeometry
from ..files.index_service import IndexService, recover_unfinished
from ..files.segments import SegmentQueue
from ..format import layout as L
from ..format.message import Message
from . import batch, queue_kinds_put
from .append import CommitLogAppender
from .dispatch import Dispatcher
from .dispatch_modes import DISPATCH_MODES, BackgroundDispatcher, hooks
from .flush import FlushService, TransientPool
from .load import catch_up, queue_kinds, survey
from .logics_flush import LogicsFlushService
from .message_batch import MessageBatch
from .prepare import prepare
from .results import Appended, PutResult, PutResults, PutStatus
from .unfinished_append import clear_unfinished_append

__all__ = ["DISPATCH_MODES", "MessageStore"]


def _declined(msg, stamp, record):
    """The fast single put's answer when it must not run: "take the general path"."""
    return None


class MessageStore:
    """A store open for writing. Use :meth:`open`; thread-safe ``put``/``put_batch``."""

    def __init__(self, config: StoreConfig, *, dispatch: str = "sync", clock=None):
        if dispatch not in DISPATCH_MODES:
            raise ValueError(f"dispatch must be one of {DISPATCH_MODES}, got {dispatch!r}")
        self.config = config
        self.root = Path(config.store_path_root_dir)
        self._lock = ckpt.StoreLock(self.root).acquire()
        self._closed = False
        self._halt = False  # closed, or broken: put checks this one flag
        self._broken: BaseException | None = None  # see _failed
        try:
            from ..files.repair_marker import refuse_if_unfinished

            refuse_if_unfinished(self.root, "writing")
            self._open(dispatch, clock)
        except BaseException:
            self._lock.release()
            raise

    @classmethod
    def open(cls, root: str | os.PathLike, config: StoreConfig | None = None,
             create: bool = False, *, dispatch: str = "sync", clock=None) -> "MessageStore":
        """Open the store at ``root`` for writing (``create`` makes a new one).

        ``dispatch``: "sync" (CQ and index written before put returns), "background"
        (a reput thread follows the appends) or "off". ``clock`` names new index files.
        """
        root = Path(root)
        if config is None:
            config = load_config(root)
        else:
            config = config.with_values(store_path_root_dir=str(root))
        if not root.is_dir():
            if not create:
                raise NotAStoreError("no such store (use create to make a new one)", root)
            root.mkdir(parents=True)
        elif not create and not any((root / m).exists() for m in
                                    ("commitlog", "consumequeue", "index", "checkpoint")):
            raise NotAStoreError("not a RocketMQ store root (no commitlog, consumequeue, "
                                 "index or checkpoint)", root)
        else:
            from ..files.storekind import require_writable

            require_writable(config, "append")  # features it would break, guessed geometry
        return cls(config, dispatch=dispatch, clock=clock)

    # --- opening -------------------------------------------------------------------------

    def _open(self, dispatch: str, clock) -> None:
        cfg = self.config
        self.v5 = cfg.broker_version != "4.9"
        self.was_clean = not ckpt.abort_exists(self.root)
        cp_path = self.root / ckpt.CHECKPOINT
        self.checkpoint = ckpt.read_checkpoint(cp_path) if cp_path.exists() else ckpt.Checkpoint()
        self.physic_timestamp = self.checkpoint.physic_msg_timestamp
        self._cp_lock = threading.Lock()
        self._cp_version = "5.x" if self.v5 else "4.9"
        size = cfg.mapped_file_size_commit_log
        geometry = IndexGeometry(cfg.max_hash_slot_num, cfg.max_index_num)
        kinds = queue_kinds(cfg)  # BatchCQ topics, LMQ (5.x); refuses before any change
        queue = SegmentQueue(cfg.commit_log_dirs, size, writable=True, kind="commitlog")
        try:
            found, offsets, max_phy = survey(cfg, queue, geometry, self.was_clean, kinds)
        except BaseException:
            queue.close()
            raise
        end = found.offset if found is not None else 0

        # Only now does the store change, and only as a broker's start changes it: the
        # checkpoint it creates (§8.1), abort (§8.2), the segments wholly after the end,
        # which survey found to hold no valid record (truncateDirtyFiles, §10.4), and
        # after a crash what an interrupted write of ours left (module doc).
        if not cp_path.exists():  # the broker creates it, all zeros, when it starts (§8.1)
            ckpt.write_checkpoint(self.root, self.checkpoint, version=self._cp_version)
        ckpt.create_abort(self.root, str(os.getpid()).encode() if self.v5 else b"",
                          keep_previous=self.v5)
        queue.delete_from(end - end % size + size)
        self._log_queue = queue
        if not self.was_clean:
            clear_unfinished_append(queue, end)

        if cfg.message_index_enable and not self.was_clean:
            recover_unfinished(cfg.index_dir, geometry)
        index = IndexService(cfg.index_dir, geometry, clock=clock,
                             max_msgs_num_batch=cfg.max_msgs_num_batch,
                             on_full=self._write_checkpoint) \
            if cfg.message_index_enable else None
        self.dispatcher = Dispatcher(cfg, index=index)
        self.dispatcher.logics_timestamp = self.checkpoint.logics_msg_timestamp
        self.dispatcher.configure_5x(kinds)
        self.kinds = kinds

        offsets = catch_up(cfg, queue, self.dispatcher, end, max_phy, self.was_clean, offsets,
                           kinds)

        self.pool = TransientPool(size, cfg.transient_store_pool_size) \
            if cfg.transient_store_pool_enable else None
        self.appender = CommitLogAppender(
            cfg, queue, end, offsets,
            buffer_for=self.pool.buffer_for if self.pool else None,
            on_dispatch_error=self._failed)
        self.appender.batch_topics = kinds.batch_topics
        # The confirm offset (5.x, spec §8.1): recovery sets it to the start of the last
        # valid record (§10.2, §10.3) and a close persists it; appends in plain mode leave
        # it alone, so a store written in one run keeps the 0 it was created with (as
        # RocketMQ 5.3.3 wrote its fixtures: basic has 0, crash-recovered 467284).
        self._confirm_offset = self.checkpoint.confirm_phy_offset
        if found is not None and found.last_record >= 0:
            self._confirm_offset = found.last_record

        def flushed(ts: int) -> None:
            self.physic_timestamp = ts

        self.flusher = FlushService(self.appender, cfg, pool=self.pool, on_flushed=flushed,
                                    on_tick=self._tick if dispatch == "sync" else None)
        self.flusher.start()
        self.logics_flusher = LogicsFlushService(self.dispatcher, cfg, self._write_checkpoint)
        self.logics_flusher.start()
        self.dispatch_mode = dispatch
        self.background = BackgroundDispatcher(self.dispatcher) if dispatch == "background" else None
        # What the puts call under the append lock for what they wrote (dispatch).
        self._record, self._columns_record = hooks(
            dispatch, self.dispatcher, self.background)
        self._sync_flush = self.flusher.sync
        self._put_message = self.appender.put_message  # the single put's fast path
        # A record with a property CRC is signed once its offsets are known (spec §3.8):
        # only the general encoder does that, so the fast and columnar paths step aside.
        self._prop_crc = cfg.enabled_append_prop_crc
        if self._prop_crc or kinds.any:
            # Also a store with BatchCQ topics or LMQ: what the store adds to a message
            # (INNER_BASE, INNER_MULTI_QUEUE_OFFSET) is added under the lock by _put_5x.
            self._put_message = _declined
        if not self._sync_flush:
            self.put = self._quick_put()

    # --- writing -------------------------------------------------------------------------

    def _after(self, records: list[Appended]) -> None:
        if self.background is not None:
            self.background.submit(records)
        elif self.dispatch_mode == "sync":
            self.dispatcher.dispatch_many(records)

    def _wait_flush(self, results: list[PutResult], wait: bool) -> None:
        if not self.flusher.sync or not wait:
            return
        end = results[-1].offset + results[-1].size
        if not self.flusher.wait_flushed(end):
            for r in results:
                r.status = PutStatus.FLUSH_DISK_TIMEOUT

    def put(self, msg: Message, *, stamp: bool = False) -> PutResult:
        """Append one message as given (its stored form). ``stamp`` sets STORETIMESTAMP to
        the clock under the append lock, as the broker does. Never raises for a bad
        message: the status says why (spec §3.6); a full disk or an I/O error raises
        :class:`~rmqstore.errors.StoreIOError`."""
        if self._halt:
            self._check_open()
        try:
            result = self._put_message(msg, stamp, self._record)
            if result is None:
                result = self._put_general(msg, stamp)
        except StoreIOError as e:
            self._failed(e)
            raise
        if not isinstance(result, PutResult) or result.status is not PutStatus.PUT_OK:
            return result
        if self._sync_flush:
            self._wait_flush([result], msg.properties.get("WAIT") != "false")
        return result

    def _put_general(self, msg: Message, stamp: bool) -> PutResult:
        """A message the fast path declined: refused (its status), or unusual (magic
        v2, long properties) and appended the general way."""
        if self.kinds.any:
            return self._put_5x(msg, stamp)
        p = prepare(msg, self.config)
        if isinstance(p, PutResult):
            return p
        a = self.appender
        with a.lock:
            result, record = a.append(p, stamp=stamp)
            try:
                self._after([record])
            except StoreIOError as e:
                self._failed(e)  # the record is written: it is put, the store stops
        return result

    def _put_5x(self, msg: Message, stamp: bool) -> PutResult:
        """One message into a store with BatchCQ topics or LMQ: refused by
        :func:`~rmqstore.engine.queue_kinds_put.refusal`, else completed under the append
        lock by :func:`~rmqstore.engine.queue_kinds_put.with_store_properties_5x` and
        appended; the LMQ offsets advance after it (``updateLmqOffsets``, design-14 §5.1)."""
        why = queue_kinds_put.refusal(self.kinds, msg)
        if why is not None:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=why)
        a = self.appender
        with a.lock:
            msg, bump = queue_kinds_put.with_store_properties_5x(self.kinds, msg, a.next_queue_offset)
            p = prepare(msg, self.config)
            if isinstance(p, PutResult):
                return p
            result, record = a.append(p, stamp=stamp)
            for name in bump:
                a.queue_offsets[(name, 0)] = a.next_queue_offset(name, 0) + 1
            try:
                self._after([record])
            except StoreIOError as e:
                self._failed(e)  # the record is written: it is put, the store stops
        return result

    def _quick_put(self):
        """:meth:`put` without a flush to wait for, as a closure over what it calls: the
        one-at-a-time path saves its attribute lookups (a few percent a put). Installed
        at open as ``self.put``; :meth:`close` removes it."""
        put_message, record, general = self._put_message, self._record, self._put_general
        state = self  # ``_closed`` is read each time: a put after close must raise

        def put(msg: Message, *, stamp: bool = False) -> PutResult:
            if state._halt:
                state._check_open()
            try:  # (free in CPython 3.11 unless it raises)
                result = put_message(msg, stamp, record)
                return general(msg, stamp) if result is None else result
            except StoreIOError as e:
                state._failed(e)
                raise
        put.__doc__ = MessageStore.put.__doc__
        return put

    def put_batch(self, msgs: Sequence[Message], *, stamp: bool = False) -> list[PutResult]:
        """Append messages as one regular batch (spec §3.7): one record each, all in one
        segment (the whole batch moves on if it does not fit), consecutive queue offsets.
        If any message fails a check, none is written and all report that status."""
        self._check_open()
        if not msgs:
            return []
        try:
            return self._put_batch(msgs, stamp)
        except StoreIOError as e:
            self._failed(e)
            raise

    def _flushed(self, results: PutResults) -> PutResults:
        """``results`` of a vectorised batch, once flushed (SYNC_FLUSH: FLUSH_DISK_TIMEOUT
        after ``syncFlushTimeout``, spec §11.2)."""
        if self._sync_flush and not self.flusher.wait_flushed(results.end):
            for r in results:
                r.status = PutStatus.FLUSH_DISK_TIMEOUT
        return results

    def _put_batch(self, msgs: Sequence[Message], stamp: bool) -> list[PutResult]:
        if self.kinds.any:
            why = queue_kinds_put.batch_refusal(self.kinds, msgs)
            if why is not None:
                return [PutResult(PutStatus.MESSAGE_ILLEGAL, reason=why) for _ in msgs]
        elif len(msgs) > 1 and not self._prop_crc:
            results = batch.put_messages(self.appender, msgs, stamp, self._columns_record)
            if results is not None:
                return self._flushed(results)
        preps = []
        for m in msgs:
            p = prepare(m, self.config)
            if isinstance(p, PutResult):
                return [PutResult(p.status, reason=p.reason) for _ in msgs]
            preps.append(p)
        total = sum(p.total for p in preps)
        if total + L.END_FILE_MIN_BLANK_LENGTH > self.config.mapped_file_size_commit_log:
            why = f"batch of {total} bytes cannot fit one commitlog segment"
            return [PutResult(PutStatus.MESSAGE_ILLEGAL, reason=why) for _ in msgs]
        a = self.appender
        with a.lock:
            results, records = a.append_batch(preps, stamp=stamp)
            try:
                self._after(records)
            except StoreIOError as e:
                self._failed(e)  # the batch is written: it is put, the store stops
        self._wait_flush(results, True)
        return results

    def put_columns(self, columns_batch=None, /, *, stamp: bool = False, **columns):
        """:meth:`put_batch` for a batch given as columns: a
        :class:`~rmqstore.engine.message_batch.MessageBatch`, or its fields as keywords (``topic``,
        ``bodies``, ``queue_ids``, ``properties``, ...). Same bytes, results and dispatch
        as ``put_batch(batch.messages())``, without a Message object per message."""
        if columns_batch is None:
            columns_batch = MessageBatch(**columns)
        elif columns:
            raise TypeError("give a MessageBatch or keyword columns, not both")
        self._check_open()
        if len(columns_batch) == 0:
            return []
        if self._prop_crc or self.kinds.any:  # (the 5.x queue kinds: the per-message rules)
            return self.put_batch(columns_batch.messages(), stamp=stamp)
        try:
            results = batch.put_columns(self.appender, columns_batch, stamp, self._columns_record)
        except StoreIOError as e:
            self._failed(e)
            raise
        if results is None:  # anything unusual: the equivalent messages, the general way
            return self.put_batch(columns_batch.messages(), stamp=stamp)
        return self._flushed(results)

    def _failed(self, e: StoreIOError) -> None:
        """A put hit a full disk or an I/O error. When the appender refused before writing
        (``store_unchanged``) the store is as it was and takes more puts. Otherwise the
        record is in the CommitLog (and reported put, as a broker whose dispatch runs
        after the append would) but its dispatch stopped half-way: the store takes no
        more puts (units would land out of place) and :meth:`close` keeps ``abort``, so
        the next open re-dispatches as after a crash (spec §8.2, §10)."""
        if not getattr(e, "store_unchanged", False) and self._broken is None:
            self._broken = e
            self._halt = True

    # --- state ---------------------------------------------------------------------------

    @property
    def max_offset(self) -> int:
        """End of the CommitLog data readers may read (committed, with a pool)."""
        return self.flusher.readable_end()

    @property
    def queue_offsets(self) -> dict[tuple[str, int], int]:
        with self.appender.lock:
            return dict(self.appender.queue_offsets)

    def _write_checkpoint(self, logics: int | None = None) -> None:
        """Write the checkpoint from the current timestamps (spec §8.1): on close, when an
        index file fills, and from the logics flush thread, which passes the
        logicsMsgTimestamp it took before syncing the queues."""
        with self._cp_lock:
            cp = self.checkpoint
            cp.physic_msg_timestamp = self.physic_timestamp
            cp.logics_msg_timestamp = self.dispatcher.logics_timestamp if logics is None else logics
            index = self.dispatcher.index
            if index is not None and index.index_msg_timestamp is not None:
                cp.index_msg_timestamp = index.index_msg_timestamp
            ckpt.write_checkpoint(self.root, cp, version=self._cp_version)

    def _settle_index(self) -> None:
        """The flush thread's tick: index keys waiting since the last one are written, so
        a key reaches the index files within about ``flushIntervalCommitLog`` ms."""
        if self.dispatcher.keys_waiting:
            with self.appender.lock:
                self.dispatcher.settle_index()

    def _tick(self) -> None:
        """The flush thread's tick (:meth:`_settle_index`); keys that cannot be written
        (a full disk) stop the store, as a failed dispatch in a put does."""
        try:
            self._settle_index()
        except StoreIOError as e:
            self._failed(e)

    def wait_dispatched(self) -> None:
        """Return once every record appended so far is in its ConsumeQueue and the index
        files (sync dispatch lets the index keys of the last few records wait to be put
        together; this writes them)."""
        if self.background is not None:
            self.background.wait_idle()
        elif self.dispatch_mode == "sync" and not self._closed:
            self._settle_index()

    def _check_open(self) -> None:
        if self._closed:
            raise RecordError("the store is closed", self.root)
        b = self._broken
        if b is not None:
            raise StoreIOError(
                f"{getattr(b, 'message', b)}; the store took no more messages after that "
                "(open it again to recover)", getattr(b, "path", None) or self.root,
                getattr(b, "offset", None), errno=getattr(b, "errno", None))

    # --- closing -------------------------------------------------------------------------

    def close(self) -> None:
        """Clean shutdown: dispatch caught up, everything synced, checkpoint written,
        preallocated empty segment deleted, ``abort`` removed, lock released."""
        if self._closed:
            return
        self._closed = self._halt = True
        self.__dict__.pop("put", None)
        error = None
        try:
            self.logics_flusher.stop()
            if self.background is not None:
                self.background.stop()
            self.flusher.stop()
            self.dispatcher.flush()
            end = self.appender.end
            self.appender.release_ahead()
            # The preallocated next segment was never written: a clean shutdown drops it.
            self._log_queue.delete_from(end if end else 0)
            if self.v5:
                self.checkpoint.confirm_phy_offset = self._confirm_offset
            self.dispatcher.close()
            self._log_queue.close()
            self._write_checkpoint()
            error = self.background.error if self.background is not None else None
            if error is None and self._broken is None:
                if self.v5:
                    ckpt.write_compaction_position(self.root)
                ckpt.remove_abort(self.root)  # only once everything is consistent (§8.2)
        except BaseException:
            # A full disk or an I/O error on the way out: ``abort`` stays, so the next
            # open recovers as after a crash; the files are still let go.
            self._release_files()
            raise
        finally:
            self._lock.release()
        if error is not None:
            raise error

    def _release_files(self) -> None:
        for step in (self.logics_flusher.stop, self.flusher.stop, self.dispatcher.release,
                     self._log_queue.close):
            try:
                step()
            except Exception:  # noqa: BLE001 - the first error is the one reported
                pass

    def __enter__(self) -> "MessageStore":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except Exception:
            if exc is None:
                raise
            # The body's error is the cause; a failing close after it (the same full
            # disk) would only hide it.
