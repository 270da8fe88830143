"""Planning CommitLog splits: which segment files a store has (local or remote) and the
byte ranges a driver hands to its tasks (spark-notes "Reading CommitLog files", spec §2).

A task owns exactly the records that *start* in its range; :mod:`rmqstore.scan.splits`
reads one, :mod:`rmqstore.scan.split_stitch` checks that their chains join.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Sequence

from ..errors import NotAStoreError
from ..format.rules import parse_delay_levels

DEFAULT_SPLIT_SIZE = 64 * 1024 * 1024


@dataclass(frozen=True)
class Split:
    """One byte range of one CommitLog segment file. Small and picklable: it is what the
    driver ships to a task."""

    split_id: int
    store: str  # the store root exactly as the user gave it
    path: str  # segment file: a local path or a URI pyarrow.fs understands
    file_index: int  # position of the file in the store's segment order
    file_start: int  # the segment's start offset (its name)
    file_size: int  # readable bytes: min(file length, segment size)
    segment_size: int
    begin: int  # first byte of the range, relative to the file
    end: int  # one past the last byte of the range
    max_record: int  # largest plausible TOTALSIZE (maxMessageSize + 64 KiB, spec §3.6)
    contiguous: bool = True  # the file starts where the previous one ended (spec §2)
    #: Forced first record position: no resync. One below ``begin`` (a range's first split
    #: read alone) walks the chain from there, and only the records from ``begin`` are read.
    start: int | None = None
    #: "dledger": the file is a DLedger data file; ``begin`` is an entry start the driver
    #: found (:mod:`rmqstore.scan.dledger_splits`) and entries are walked, never resynced.
    framing: str = "plain"
    #: DLedger: why the file's valid entries end after this split (its last one), else None.
    stop_hint: str | None = None

    def with_start(self, start: int) -> Split:
        return dataclasses.replace(self, start=start)


def is_remote(path: str) -> bool:
    """A URI with a scheme other than ``file``: read through pyarrow.fs."""
    return "://" in path and not path.startswith("file://")


#: Hadoop's names for S3 buckets, which pyarrow knows as ``s3://`` (same bucket and key).
_ARROW_SCHEMES = {"s3a": "s3", "s3n": "s3"}


def arrow_filesystem(uri: str):
    """(pyarrow filesystem, path inside it) for a URI; ``s3a://`` and ``s3n://`` (Hadoop's
    spelling, what Spark users write) are read as ``s3://``."""
    from pyarrow import fs as pafs

    scheme, sep, rest = uri.partition("://")
    return pafs.FileSystem.from_uri(_ARROW_SCHEMES.get(scheme.lower(), scheme) + sep + rest)


def local_path(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


@dataclass
class StoreFiles:
    """The CommitLog segment files of one store, in offset order."""

    store: str
    segment_size: int
    max_record: int
    files: list[tuple[str, int, int]]  # (path, start offset, file length)
    delay_millis: tuple[int, ...]
    framing: str = "plain"  # "dledger": DLedger data files (design-14 D1)
    ledger: str | None = None  # the dledger-<selfId> folder (local stores)


def list_store(store: str, *, segment_size: int | None = None, conf=None,
               config=None) -> StoreFiles:
    """The CommitLog files of a store root (local path or URI), with the geometry the
    readers need. Local stores take geometry from :func:`rmqstore.files.config.load_config`
    (broker.conf > files > defaults), or from ``config``, the
    :class:`~rmqstore.files.config.StoreConfig` a reader already uses: its CommitLog
    directories (``storePathCommitLog``) are the ones listed, and their files gave its
    geometry; remote ones from the file lengths."""
    from ..files.config import load_config
    from ..files.listing import LONG_MAX, entries, offset_name

    if not is_remote(store):
        root = local_path(store)
        if not os.path.isdir(root):
            raise NotAStoreError("no such store directory", store)
        overrides = {"mapped_file_size_commit_log": segment_size} if segment_size else None
        if config is not None:
            cfg = config.with_values(**overrides) if overrides else config
        else:
            cfg = load_config(root, conf, overrides)
        from .dledger_splits import list_ledger

        sf = list_ledger(store, cfg)
        if sf is not None:
            return sf
        found: dict[int, tuple[str, int]] = {}
        for d in cfg.commit_log_dirs:
            for e in entries(d):  # links inside the store are not followed
                start = offset_name(e.name) if e.kind == "file" else None
                if start is not None and start <= LONG_MAX - cfg.mapped_file_size_commit_log:
                    found[start] = (str(e.path), e.size)
        if not found and not any(d.is_dir() for d in cfg.commit_log_dirs):
            raise NotAStoreError("no commitlog directory", store)
        files = [(found[s][0], s, found[s][1]) for s in sorted(found)]
        return StoreFiles(store, cfg.mapped_file_size_commit_log, cfg.max_message_size + 65536,
                          files, cfg.delay_millis)
    from pyarrow import fs as pafs

    fs, base = arrow_filesystem(store.rstrip("/") + "/commitlog")
    infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    prefix = store.rstrip("/") + "/commitlog/"
    files = sorted((prefix + i.base_name, int(i.base_name), i.size) for i in infos
                   if i.type == pafs.FileType.File and offset_name(i.base_name) is not None)
    files = [(p, s, n) for p, s, n in sorted(files, key=lambda f: f[1])]
    if not files:
        raise NotAStoreError("no commitlog segment files", store)
    if segment_size is None:
        sizes = {n for _, _, n in files if n > 0}
        segment_size = max(sizes) if sizes else 1024 ** 3
    return StoreFiles(store, segment_size, 4 * 1024 * 1024 + 65536, files, parse_delay_levels())


def plan_splits(stores: Sequence[str] | Sequence[StoreFiles], split_size: int = DEFAULT_SPLIT_SIZE,
                ) -> list[Split]:
    """Cut every CommitLog segment of every store into ranges of at most ``split_size``
    bytes. Split ids are dense and ordered by (store, file, range)."""
    if split_size <= 0:
        raise ValueError("split size must be positive")
    out: list[Split] = []
    for st in stores:
        sf = st if isinstance(st, StoreFiles) else list_store(st)
        if sf.framing == "dledger":
            from .dledger_splits import plan_ledger

            out += plan_ledger(sf, split_size, len(out))
            continue
        prev_end = None
        for fi, (path, start, length) in enumerate(sf.files):
            readable = min(length, sf.segment_size)
            contiguous = prev_end is None or start == prev_end
            prev_end = start + sf.segment_size
            begins = range(0, readable, split_size) if readable else [0]
            for b in begins:
                out.append(Split(len(out), sf.store, path, fi, start, readable, sf.segment_size,
                                 b, min(b + split_size, readable), sf.max_record, contiguous))
    return out


def in_range(splits: Sequence[Split], lo: int | None = None, hi: int | None = None) -> list[Split]:
    """The splits of one store that can hold records starting in ``[lo, hi)`` (CommitLog
    offsets; None: open); the others are not read at all. Reading starts at the segment
    holding ``lo``, as a sequential reader from ``lo`` starts (spec §4): the first split
    kept in it is forced to start at the segment's start (see :attr:`Split.start`), so its
    first record is proven by the size chain, never guessed by resync. A missing segment
    before ``lo`` still ends the store's data there (spec §2), so the range gets nothing.
    A file shorter than the segment size still holds ``lo`` up to its logical end: its
    last split is kept, so damage before ``lo`` in it ends the data as it does for dump."""
    out: list[Split] = []
    gap = False
    for s in splits:
        if hi is not None and s.file_start + s.begin >= hi:
            continue
        reach = s.segment_size if s.end >= s.file_size else s.end
        if lo is not None and s.file_start + reach <= lo:
            gap |= not s.contiguous
            continue
        if not out or out[-1].file_index != s.file_index:
            if s.begin > 0:
                s = s.with_start(0)
            if gap:
                s, gap = dataclasses.replace(s, contiguous=False), False
        out.append(s)
    return out
