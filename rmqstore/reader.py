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

from .codec import Message, decode_offset_msg_id
from .commitlog import CommitLog
from .config import SEGMENT_NAME, StoreConfig, load_config
from .errors import ConfigError, NotAStoreError, OffsetError, RmqStoreError, UnsupportedStoreError
from .scan import scan_windows

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
    from .storekind import DLEDGER_DIR, dledger_dirs

    for d in (p, p.parent, p.parent.parent):
        if DLEDGER_DIR.match(d.name) and d.parent != d and d in dledger_dirs(d.parent):
            return d
    return None


def classify(path: str | os.PathLike) -> PathKind:
    """Recognise a store root or a store file from where it sits (see ``rmqstore dump``).

    A path inside a DLedger CommitLog (``dledger-*/``) raises
    :class:`~rmqstore.errors.UnsupportedStoreError`: its files are not CommitLog segments."""
    from .storekind import dledger_dirs

    p = Path(path)
    if not p.exists():
        raise NotAStoreError("no such file or directory", p)
    d = _inside_dledger(p)
    if d is not None:
        raise UnsupportedStoreError(f"part of a DLedger CommitLog ({d.name}/), which rmqstore "
                                    "cannot read yet; nothing was read", p)
    if p.is_dir():
        if any((p / m).exists() for m in STORE_MARKERS) or dledger_dirs(p):
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
        self.commitlog = commitlog or CommitLog(config)

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
        from .consumequeue import list_queues

        return list_queues(self.root)

    def consume_queue(self, topic: str, queue_id: int):
        from .consumequeue import open_consume_queue

        return open_consume_queue(self.root, topic, queue_id, self.config.cq_file_size)

    def index(self):
        """The IndexFiles, read-only, with this store's geometry (a :class:`ConfigError`
        when the files do not determine it and no broker.conf gave it)."""
        from .index import IndexGeometry, IndexReader

        why = self.config.undetermined.get("max_hash_slot_num")
        if why:
            raise ConfigError(f"{why}; key lookups need --config with both", self.config.index_dir)

        return IndexReader(self.config.index_dir,
                           IndexGeometry(self.config.max_hash_slot_num, self.config.max_index_num),
                           max_msgs_num_batch=self.config.max_msgs_num_batch)

    def get_by_queue_offset(self, topic: str, queue_id: int, queue_offset: int) -> Message:
        """Through the ConsumeQueue unit, as a consumer's pull does (spec §6.2)."""
        with self.consume_queue(topic, queue_id) as cq:
            unit = cq.unit_at(queue_offset)
        if unit.is_placeholder:
            raise OffsetError(f"queue offset {queue_offset} is a placeholder unit (no message)",
                              self.root / "consumequeue" / topic / str(queue_id), queue_offset * 20)
        return self.read_at(unit.commit_log_offset)

    def query_key(self, topic: str, key: str, max_num: int | None = None, begin: int = 0,
                  end: int = 2**63 - 1) -> list[Message]:
        """Messages of ``topic`` whose KEYS tokens or UNIQ_KEY equal ``key``: the IndexFile
        walk of spec §7.6, then the key re-checked on each record (hash hits may collide)."""
        max_num = self.config.max_msgs_num_batch if max_num is None else max_num
        with self.index() as idx:
            hits = idx.query(topic, key, max_num, begin, end).phy_offsets
        out, seen = [], set()
        for off in hits:
            if off in seen:
                continue  # re-dispatch can index a record twice (spec §14.7)
            seen.add(off)
            try:
                msg = self.read_at(off)
            except RmqStoreError:
                continue  # the entry points at data that is gone or damaged
            if msg.topic == topic and (key in msg.keys or msg.uniq_key == key):
                out.append(msg)
        return out

    def get_by_uniq_key(self, topic: str, uniq_key: str) -> list[Message]:
        return [m for m in self.query_key(topic, uniq_key) if m.uniq_key == uniq_key]

    def messages(self, *, topic: str | None = None, queue_id: int | None = None,
                 from_offset: int | None = None, to_offset: int | None = None,
                 since: int | None = None, until: int | None = None,
                 limit: int | None = None) -> Iterator[Message]:
        """Valid messages in physical order, filtered; the bulk scan finds them and only
        the ones that pass the filters are decoded."""
        yield from iter_messages(self.commitlog, topic=topic, queue_id=queue_id,
                                 from_offset=from_offset, to_offset=to_offset,
                                 since=since, until=until, limit=limit)

    def message_dicts(self, body: str = "base64", **filters) -> Iterator[dict]:
        """The message JSON of :mod:`rmqstore.view` for each selected message (fast path)."""
        from .view import message_dicts

        for cols, chosen in iter_selected(self.commitlog, **filters):
            yield from message_dicts(cols, body, chosen)


def iter_messages(commitlog: CommitLog, **filters) -> Iterator[Message]:
    """Decoded messages of the CommitLog, filtered (see :meth:`StoreReader.messages`)."""
    for cols, keep in iter_selected(commitlog, **filters):
        for i in keep.tolist():
            yield cols.message(i)


def iter_selected(commitlog: CommitLog, *, topic=None, queue_id=None, from_offset=None,
                  to_offset=None, since=None, until=None, limit=None):
    """(columns, indices) per window of a segment for the valid records that pass the
    filters, in physical order, at most ``limit`` records in all.

    Segments are walked a window at a time (:func:`~rmqstore.scan.scan_windows`) and the
    pages of a window are let go once its records are handed over, so memory stays at a
    window's columns whatever the store's size."""
    import numpy as np

    count = 0
    for seg in commitlog.segments:
        if to_offset is not None and seg.start >= to_offset:
            return
        if from_offset is not None and seg.end <= from_offset:
            continue
        buf = seg.buffer()
        released = 0
        for scan in scan_windows(buf, seg.start, seg.readable_size):
            cols = scan.records
            keep = np.ones(len(cols), dtype=bool)
            off = cols.offset
            if from_offset is not None:
                keep &= off >= from_offset
            if to_offset is not None:
                keep &= off < to_offset
            if queue_id is not None:
                keep &= cols.queue_id == queue_id
            if since is not None:
                keep &= cols.store_timestamp >= since
            if until is not None:
                keep &= cols.store_timestamp <= until
            if topic is not None and keep.any():
                names, ids = cols.topic_table()
                wanted = [i for i, n in enumerate(names) if n == topic]
                keep &= np.isin(ids, wanted)
            chosen = np.flatnonzero(keep)
            if limit is not None:
                chosen = chosen[:limit - count]
            if len(chosen):
                yield cols, chosen
            count += len(chosen)
            if limit is not None and count >= limit:
                return
            if to_offset is not None and scan.end >= to_offset:
                return
            if not seg.writable:
                released = release_pages(buf, released, scan.end - seg.start)
        if scan.stop != "blank" and scan.stop != "end":
            return  # valid data ends in this segment (spec §10.1)


def release_pages(buf, done: int, upto: int) -> int:
    """Drop this process's mapping of a read-only map's pages in ``[done, upto)`` (page
    aligned down): the data stays in the page cache and is read again if touched, but it
    no longer counts in the reader's resident memory. Returns the new ``done``."""
    upto -= upto % mmap.PAGESIZE
    if upto > done and isinstance(buf, mmap.mmap):
        buf.madvise(mmap.MADV_DONTNEED, done, upto - done)
        return upto
    return done


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
    from .segments import SegmentQueue

    q = SegmentQueue([p.parent], cfg.mapped_file_size_commit_log, kind="commitlog")
    q.segments = [s for s in q.segments if s.path.name == p.name]
    q.problems = [x for x in q.problems if Path(x.path).name == p.name]
    return StoreReader(cfg, CommitLog(cfg, queue=q))


__all__ = ["PathKind", "StoreReader", "classify", "open_store", "open_segment_file",
           "iter_messages", "RmqStoreError"]
