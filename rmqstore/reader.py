"""Read-only access to a whole store: what ``dump``, ``get``, ``query-key`` and ``stats`` do.

``open_store(path)`` never writes: files are opened read-only and mapped ``ACCESS_READ``.
Ops scripts use this module the way the CLI does::

    with rmqstore.reader.open_store("/data/store") as store:
        for msg in store.messages(topic="TopicA"):
            ...
"""

from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .format import layout as L
from .format.message import Message, decode_offset_msg_id
from .files.commitlog import CommitLog
from .files.config import SEGMENT_NAME, StoreConfig, load_config
from .errors import (ConfigError, InputError, NotAStoreError, OffsetError, RmqStoreError,
                     UnsupportedStoreError)
from .selection import MessageFilter, MessageScan, release_pages  # noqa: F401 (re-exported)
from .times import parse_time

LONG_MAX = 2**63 - 1  # Java Long.MAX_VALUE: the open end of a time range
INDEX_NAME = re.compile(r"^\d{17}$")
STORE_MARKERS = ("commitlog", "consumequeue", "index", "checkpoint")


@dataclass
class PathKind:
    """What a path given on the command line is, and the store root it belongs to."""

    kind: str  # store | commitlog-segment | consumequeue-dir | consumequeue-file | indexfile | checkpoint
    path: Path
    root: Path | None  # the store root, when the path sits inside one
    topic: str | None = None
    queue_id: int | None = None


def _inside_dledger(p: Path) -> Path | None:
    """The ``dledger-*`` directory ``p`` is or lies in (up to two levels down): DLedger's
    data, index and checkpoint files."""
    from .files.dledger_files import LEDGER_DIR, find_ledger_dirs

    for d in (p, p.parent, p.parent.parent):
        if LEDGER_DIR.match(d.name) and d.parent != d and d in find_ledger_dirs(d.parent):
            return d
    return None


def classify(path: str | os.PathLike) -> PathKind:
    """Recognise a store root or a store file from where it sits (see ``rmqstore dump``).

    A path inside a DLedger CommitLog (``dledger-*/``) raises
    :class:`~rmqstore.errors.UnsupportedStoreError` naming the store root to read instead:
    its files are entries, read through the store (design-14 §1)."""
    from .files.dledger_files import find_ledger_dirs

    p = Path(path)
    if not p.exists():
        raise NotAStoreError("no such file or directory", p)
    d = _inside_dledger(p)
    if d is not None:
        raise UnsupportedStoreError(f"part of a DLedger CommitLog ({d.name}/): its files are "
                                    f"read through the store root, give {d.parent} instead; "
                                    "nothing was read", p)
    if p.is_dir():
        if any((p / m).exists() for m in STORE_MARKERS) or find_ledger_dirs(p):
            return PathKind("store", p, p)
        if p.parent.parent.name == "consumequeue" and p.name.lstrip("-").isdigit():
            return PathKind("consumequeue-dir", p, p.parent.parent.parent,
                            p.parent.name, int(p.name))
        if p.name == "commitlog":
            return PathKind("store", p.parent, p.parent)
        raise NotAStoreError("not a RocketMQ store: no commitlog/, consumequeue/, index/ or checkpoint", p)
    name, parent = p.name, p.parent
    if name == "checkpoint":
        return PathKind("checkpoint", p, parent)
    if INDEX_NAME.match(name) and parent.name == "index":
        return PathKind("indexfile", p, parent.parent)
    if SEGMENT_NAME.match(name):
        if parent.parent.parent.name == "consumequeue" and parent.name.lstrip("-").isdigit():
            return PathKind("consumequeue-file", p, parent.parent.parent.parent,
                            parent.parent.name, int(parent.name))
        root = parent.parent if parent.name == "commitlog" else None
        return PathKind("commitlog-segment", p, root)
    raise NotAStoreError("not a store file: expected a 20-digit segment, a 17-digit index "
                         "file, a checkpoint, or a store directory", p)


class StoreReader:
    """A read-only store: CommitLog, and (when present) ConsumeQueues and IndexFiles."""

    def __init__(self, config: StoreConfig, commitlog: CommitLog | None = None):
        self.config = config
        self.root = config.root
        self.commitlog = commitlog or _commitlog(config)

    @property
    def dledger(self):
        """The :class:`~rmqstore.files.dledger.DLedgerLog` of a DLedger store, else None."""
        return getattr(self.commitlog, "log", None) if self.framing == "dledger" else None

    @property
    def framing(self) -> str:
        """``plain`` (records back to back) or ``dledger`` (each record in an entry)."""
        return getattr(self.commitlog, "framing", "plain")

    def close(self) -> None:
        self.commitlog.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- messages ------------------------------------------------------------------------

    def read_at(self, offset: int, *, check_crc: bool = False) -> Message:
        return self.commitlog.read_at(offset, check_crc=check_crc)

    def get_by_msg_id(self, msg_id: str) -> Message:
        """By offsetMsgId (spec §5.1): the id's offset must hold a record from this host."""
        host, offset = decode_offset_msg_id(msg_id)
        msg = self.read_at(offset)
        if msg.store_host != host:
            raise OffsetError(f"record at {offset} was stored by {msg.store_host}, "
                              f"but the id names {host}", self.root, offset)
        return msg

    # --- ConsumeQueue and IndexFile ---------------------------------------------------------

    def queues(self):
        """Every ``consumequeue/{topic}/{queueId}`` of the store (with odd entries reported)."""
        from .files.consumequeue import list_queues

        return list_queues(self.root)

    def consume_queue(self, topic: str, queue_id: int):
        from .files.consumequeue import open_consume_queue

        return open_consume_queue(self.root, topic, queue_id, self.config.cq_file_size)

    def index(self, max_msgs_num_batch: int | None = None):
        """The IndexFiles, read-only, with this store's geometry; queries are capped at
        ``max_msgs_num_batch`` hits (default: the store's maxMsgsNumBatch, as the broker).
        A :class:`ConfigError` when the files do not determine the geometry and no
        broker.conf gave it."""
        from .files.index import IndexGeometry
        from .files.index_query import IndexReader

        why = self.config.undetermined.get("max_hash_slot_num")
        if why:
            raise ConfigError(f"{why}; key lookups need --config with both", self.config.index_dir)
        cap = self.config.max_msgs_num_batch if max_msgs_num_batch is None else max_msgs_num_batch
        return IndexReader(self.config.index_dir,
                           IndexGeometry(self.config.max_hash_slot_num, self.config.max_index_num),
                           max_msgs_num_batch=cap)

    def batch_queues(self):
        """Every ``batchconsumequeue/{topic}/{queueId}`` of the store (RocketMQ 5.x)."""
        from .files.batchconsumequeue import list_batch_queues

        return list_batch_queues(self.root)

    def get_by_queue_offset(self, topic: str, queue_id: int, queue_offset: int) -> Message:
        """Through the ConsumeQueue unit, as a consumer's pull does (spec §6.2); on a
        BatchCQ topic through its BatchConsumeQueue, giving the message of an inner batch
        the offset falls in (design-14 §4.2, §4.3)."""
        from .files.batchconsumequeue import get_in_batch_queue

        got = get_in_batch_queue(self, topic, queue_id, queue_offset)
        if got is not None:
            return got
        with self.consume_queue(topic, queue_id) as cq:
            unit = cq.unit_at(queue_offset)
        if unit.is_placeholder:
            raise OffsetError(f"queue offset {queue_offset} is a placeholder unit (no message)",
                              self.root / "consumequeue" / topic / str(queue_id), queue_offset * L.CQ_UNIT_SIZE)
        return self.read_at(unit.commit_log_offset)

    def query_key(self, topic: str, key: str, max_num: int | None = None, begin=None, end=None,
                  *, broker_cap: bool = False, tz=None) -> "KeyQueryResult":
        """Messages of ``topic`` whose KEYS tokens or UNIQ_KEY equal ``key``: the IndexFile
        walk of spec §7.6, then the key re-checked on each record (hash hits may collide)
        and records indexed twice given once. Ascending CommitLog offsets.

        Every hit is returned, or the newest ``max_num`` of them. ``broker_cap=True`` answers
        as the broker (and mqadmin) would: the walk stops after maxMsgsNumBatch (64)
        index hits, collisions included. ``begin``/``end`` bound the store time (any form
        :func:`rmqstore.times.parse_time` reads). The result is a list with ``truncated``:
        True when matching messages exist that it does not hold."""
        begin = 0 if begin is None else parse_time(begin, tz)
        end = LONG_MAX if end is None or end == LONG_MAX else parse_time(end, tz)
        if max_num is not None and max_num < 1:
            raise InputError(f"max_num must be at least 1, got {max_num}")
        cache: dict[int, Message | None] = {}

        def hit(off: int) -> Message | None:
            if off not in cache:
                try:
                    msg = self.read_at(off)
                except RmqStoreError:
                    msg = None  # the entry points at data that is gone or damaged
                if msg is not None and not (msg.topic == topic and (key in msg.keys or msg.uniq_key == key)):
                    msg = None
                cache[off] = msg
            return cache[off]

        with self.index(LONG_MAX) as idx:
            every = sorted(set(idx.query(topic, key, LONG_MAX, begin, end).phy_offsets), reverse=True)
        cap = self.config.max_msgs_num_batch
        if broker_cap:
            with self.index() as idx:
                limit = cap if max_num is None else min(max_num, cap)
                offsets = sorted(set(idx.query(topic, key, limit, begin, end).phy_offsets))
            found = [m for m in map(hit, offsets) if m is not None]
            taken = set(offsets)
            truncated = any(hit(o) is not None for o in every if o not in taken)
        else:
            found, truncated = [], False
            for off in every:  # newest first, as the broker walks
                msg = hit(off)
                if msg is None:
                    continue
                if max_num is not None and len(found) >= max_num:
                    truncated = True
                    break
                found.append(msg)
            found.reverse()
        return KeyQueryResult(found, truncated=truncated, max_num=max_num,
                              broker_cap=cap if broker_cap else None)

    def get_by_uniq_key(self, topic: str, uniq_key: str) -> list[Message]:
        return [m for m in self.query_key(topic, uniq_key) if m.uniq_key == uniq_key]

    def scan(self, filter: MessageFilter | None = None, **filters) -> MessageScan:
        """The messages that pass ``filter`` (or the keyword filters of
        :meth:`MessageFilter.make`), in physical order; after iterating, ``.stop`` says
        why it ended and whether that is damage."""
        unwrap = filters.pop("unwrap", True)  # inner batches as messages (design-14 D7)
        return MessageScan(self.commitlog, filter or MessageFilter.make(**filters), unwrap=unwrap)

    def messages(self, **filters) -> Iterator[Message]:
        """Valid messages in physical order, filtered (keywords of :meth:`MessageFilter.make`:
        topic, queue_id, tag, key, uniq_key, since, until, from_offset, to_offset,
        max_bytes, limit, tz); the bulk scan finds them and only those that pass are decoded."""
        yield from self.scan(**filters).messages()

    def message_dicts(self, body: str = "base64", *, charset: str = "utf-8", tz=None,
                      sink=None, **filters) -> Iterator[dict]:
        """The message JSON of :mod:`rmqstore.view` for each selected message (fast path)."""
        yield from self.scan(tz=tz, **filters).dicts(body, charset=charset, tz=tz, sink=sink)

    def follow(self, filter: MessageFilter | None = None, **options):
        """Messages as a live store gains them, read-only (see :func:`rmqstore.follow.follow`)."""
        from .follow import follow

        if self.framing == "dledger":  # it polls record chains; entries are WP D1's
            raise UnsupportedStoreError(f"the store uses a DLedger CommitLog ({self.dledger.ledger_dir.name}/): "
                                        "following it as it grows is not supported yet; dump "
                                        "without --follow reads it; nothing was read", self.root)
        return follow(self, filter, **options)


def _commitlog(config: StoreConfig):
    """The store's CommitLog: its segments, or in DLedger mode the entries of its
    ``dledger-<selfId>/data`` files (design-14 §1; the store kind comes from the files)."""
    from .files.dledger import DLedgerCommitLog, ledger_for

    log = ledger_for(config)
    return CommitLog(config) if log is None else DLedgerCommitLog(log)


class KeyQueryResult(list):
    """The messages a key query found (a plain list), and whether it is the whole answer:
    ``truncated`` is True when more messages match than it holds (``max_num``, or the
    broker's cap ``broker_cap`` = maxMsgsNumBatch, stopped it)."""

    def __init__(self, messages=(), *, truncated: bool = False, max_num: int | None = None,
                 broker_cap: int | None = None):
        super().__init__(messages)
        self.truncated = truncated
        self.max_num = max_num
        self.broker_cap = broker_cap


def iter_messages(commitlog: CommitLog, **filters) -> Iterator[Message]:
    """Decoded messages of the CommitLog, filtered (see :meth:`StoreReader.messages`)."""
    yield from MessageScan(commitlog, MessageFilter.make(**filters)).messages()


def iter_selected(commitlog: CommitLog, **filters):
    """(columns, indices) per window of a segment for the valid records that pass the
    filters, in physical order (see :meth:`MessageScan.chunks`)."""
    yield from MessageScan(commitlog, MessageFilter.make(**filters)).chunks()


def open_store(path: str | os.PathLike, conf: str | os.PathLike | None = None,
               **overrides) -> StoreReader:
    """Open the store at ``path`` read-only; geometry from ``conf``, options, or the files."""
    kind = classify(path)
    if kind.kind != "store":
        raise NotAStoreError(f"is a {kind.kind}, not a store root", path)
    return StoreReader(load_config(kind.root, conf, overrides))


def open_segment_file(path: str | os.PathLike, conf=None, **overrides) -> StoreReader:
    """A reader over one loose CommitLog segment file (its name gives its start offset)."""
    p = Path(path)
    size = p.stat().st_size
    claimed = load_config(None, conf, overrides, infer=False)
    if claimed.sources["mapped_file_size_commit_log"] != "default" \
            and claimed.mapped_file_size_commit_log < size:
        # A segment is never longer than mappedFileSizeCommitLog (shorter is a cut file).
        raise ConfigError(f"mappedFileSizeCommitLog={claimed.mapped_file_size_commit_log} "
                          f"disagrees with the file, which is {size} bytes; the files are the "
                          "truth: fix or drop the setting", conf or p)
    cfg = load_config(None, conf, {**overrides, "mapped_file_size_commit_log": size or 1,
                                   "store_path_root_dir": str(p.parent)}, infer=False)
    from .files.segments import SegmentQueue

    q = SegmentQueue([p.parent], cfg.mapped_file_size_commit_log, kind="commitlog")
    q.segments = [s for s in q.segments if s.path.name == p.name]
    q.problems = [x for x in q.problems if Path(x.path).name == p.name]
    return StoreReader(cfg, CommitLog(cfg, queue=q))


__all__ = ["PathKind", "StoreReader", "KeyQueryResult", "classify", "open_store",
           "open_segment_file", "iter_messages", "MessageFilter", "MessageScan", "RmqStoreError"]
