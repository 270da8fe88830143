"""Generated stores for ``rmqstore bench``: a vectorised writer of the messages
:mod:`rmqstore.bench_shapes` describes.

Numpy copies each message's template record into place (one ``memcpy`` per record, grouped
by template), then writes what differs per message: QUEUEOFFSET, PHYSICALOFFSET and the
timestamps with the format's vector form (:func:`rmqstore.format.record.set_head_field`),
and the digit runs of UNIQ_KEY, KEYS and ``seq``. Segments fill as the broker fills them:
a record that does not leave 8 bytes for a BLANK starts the next segment (spec §4).
:func:`make_store` writes the ConsumeQueues and IndexFiles in the same pass with the
files layer's bulk writers (``ConsumeQueueWriter.put_many``, ``IndexService.put_hashes``),
in CommitLog order, so they hold the bytes dispatch writes; the index hashes come from the
digits without making strings (Java's hash is a polynomial: ``h(prefix + digits) =
h(prefix) * 31**width + h(digits)``, spec §7.2). The result equals, byte for byte, the
store :class:`rmqstore.engine.store.MessageStore` writes for the same messages
(tests/test_bench_data.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .bench_shapes import BENCH_EPOCH_MS, FIELDS, SEED, Templates, digits, index_tokens, templates
from .errors import InputError
from .format import layout as L
from .format.hashing import index_abs_many, pow31
from .format.record import set_head_field

#: Bytes of records made at a time: memory stays bounded whatever the store's size.
CHUNK_BYTES = 32 << 20
_MASK = np.uint64(0xFFFFFFFF)


@dataclass
class GeneratedStore:
    root: Path
    messages: int
    bytes: int  # CommitLog bytes holding records (BLANKs excluded)
    shape: str
    templates: Templates
    ids: np.ndarray  # template id of every message
    positions: np.ndarray  # CommitLog offset of every message

    @property
    def topics(self) -> int:
        return self.templates.topics

    @property
    def queues(self) -> int:
        return self.templates.queues

    def keys(self, i: int) -> tuple[str, list[str]]:
        """(topic, its IndexFile key tokens: UNIQ_KEY first, then KEYS) of message ``i``."""
        return index_tokens(self.templates, i, int(self.ids[i]))


def _layout(sizes: np.ndarray, segment_size: int) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """CommitLog offsets of records of ``sizes`` written in order, and per segment
    (start offset, first record, end record): a record goes to the next segment when it
    would not leave room for the 8-byte BLANK (spec §4)."""
    n = len(sizes)
    cum = np.cumsum(sizes)
    pos = np.empty(n, dtype=np.int64)
    segs = []
    first, start = 0, 0
    while first < n:
        base = int(cum[first - 1]) if first else 0
        end = int(np.searchsorted(cum, base + segment_size - L.END_FILE_MIN_BLANK_LENGTH, "right"))
        if end == first:
            raise InputError(f"a {int(sizes[first])}-byte record does not fit a "
                             f"{segment_size}-byte segment: give a larger --segment-mb")
        pos[first:end] = start + cum[first:end] - sizes[first:end] - base
        segs.append((start, first, end))
        first, start = end, start + segment_size
    return pos, segs


class _Fields:
    """Per field of the shape: where its digits sit in each template, and the hash parts."""

    def __init__(self, tpl: Templates):
        self.items = []
        for name in FIELDS:
            off, pre, slot = tpl.table(name)
            if (off >= 0).any():
                f = FIELDS[name]
                grow = np.uint64(int(pow31(f.width + 1)[f.width]))
                self.items.append((f, off, (pre * grow) & _MASK, slot))
        self.keys = tpl.index_keys()


def _fill(buf: np.ndarray, tpl_records: list[np.void], sizes_t: np.ndarray, ids: np.ndarray,
          rel: np.ndarray) -> None:
    """Copy template ``ids[k]`` to ``buf[rel[k]:]`` for every k: one void copy per record,
    grouped by template."""
    order = np.argsort(ids, kind="stable")
    sid = ids[order]
    cuts = np.flatnonzero(np.diff(sid)) + 1
    for grp in np.split(order, cuts):
        j = int(ids[grp[0]])
        s = int(sizes_t[j])
        items = np.ndarray(shape=(len(buf) - s + 1,), dtype=f"V{s}", buffer=buf, strides=(1,))
        items[rel[grp]] = tpl_records[j]


def _patch(buf: np.ndarray, fields: _Fields, ids: np.ndarray, rel: np.ndarray, i: np.ndarray):
    """Write every field's digits; returns the chunk's index hashes in put order."""
    nkeys = fields.keys[ids]
    first = np.cumsum(nkeys) - nkeys
    hashes = np.empty(int(nkeys.sum()), dtype=np.int64)
    for f, off, pre, slot in fields.items:
        o = off[ids]
        sel = np.flatnonzero(o >= 0)
        if not len(sel):
            continue
        d = digits(f, i[sel])
        buf[(rel[sel] + o[sel])[:, None] + np.arange(f.width)] = d
        if f.indexed:
            h = pre[ids[sel]]
            w = pow31(f.width)[::-1]
            h = (h + (d.astype(np.uint64) * w).sum(axis=1)) & _MASK
            hashes[first[sel] + slot[ids[sel]]] = index_abs_many(h)
    return hashes, nkeys


def make_store(root: str | os.PathLike, size_bytes: int, *, shape: str = "broker",
               body_size: int = 100, topics: int = 4, queues: int = 8,
               segment_size: int = 1 << 30, queues_and_index: bool = True,
               seed: int = SEED) -> GeneratedStore:
    """A clean store of about ``size_bytes`` of records at ``root``: CommitLog, and unless
    told not to ConsumeQueues and IndexFiles (RocketMQ's default geometry), and a
    checkpoint, as a broker's dispatch would leave them. Segments are full-size files;
    the last one's tail stays sparse zeros."""
    from .files import checkpoint as ckpt
    from .files.config import StoreConfig
    from .files.consumequeue_writer import ConsumeQueueWriter
    from .files.index import IndexGeometry
    from .files.index_service import IndexService
    from .files.names import queue_dir

    root = Path(root)
    tpl = templates(shape, topics=topics, queues=queues, body_size=body_size)
    sizes_t = tpl.sizes()
    n = max(1, int(size_bytes // tpl.mean_size()))
    ids = tpl.choose(n, seed)
    sizes = sizes_t[ids]
    pos, segs = _layout(sizes, segment_size)
    records = [np.frombuffer(t.record, dtype=f"V{len(t.record)}")[0] for t in tpl.items]
    fields = _Fields(tpl)
    tags = tpl.tags_codes()
    slots = topics * queues
    cfg = StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=segment_size)
    (root / "commitlog").mkdir(parents=True, exist_ok=True)
    cqs, index = {}, None
    if queues_and_index:
        cqs = {k: ConsumeQueueWriter(queue_dir(root / "consumequeue", tpl.items[k * tpl.per_queue].topic,
                                               k % queues), cfg.cq_file_size)
               for k in range(min(slots, n))}
        index = IndexService(root / "index", IndexGeometry(cfg.max_hash_slot_num, cfg.max_index_num),
                             clock=lambda: BENCH_EPOCH_MS, flush_full_files=False)
    buf = np.empty(CHUNK_BYTES + int(sizes_t.max()), dtype=np.uint8)
    try:
        for k, (start, a, b) in enumerate(segs):
            with open(root / "commitlog" / f"{start:020d}", "wb") as out:
                lo = a
                while lo < b:
                    hi = max(lo + 1, int(np.searchsorted(pos, pos[lo] + CHUNK_BYTES, "right")))
                    hi = min(hi, b)
                    _chunk(out, buf, lo, hi, ids, pos, sizes, sizes_t, records, fields,
                           tags, slots, cqs, index)
                    lo = hi
                if k + 1 < len(segs):
                    used = int(pos[b - 1] + sizes[b - 1] - start)
                    out.write(L.BLANK_STRUCT.pack(segment_size - used, L.MAGIC_BLANK))  # §4
                out.truncate(segment_size)
    finally:
        for w in cqs.values():
            w.close()
        if index is not None:
            index.close()
    last_ts = BENCH_EPOCH_MS + n - 1
    ckpt.write_checkpoint(root, ckpt.Checkpoint(last_ts, last_ts if queues_and_index else 0, 0),
                          version="4.9")
    return GeneratedStore(root, n, int(sizes.sum()), shape, tpl, ids, pos)


def _chunk(out, buf, lo, hi, ids, pos, sizes, sizes_t, records, fields, tags, slots, cqs, index):
    """Records ``lo .. hi-1`` (one segment's) made in ``buf`` and written; their CQ units
    and index keys put."""
    i = np.arange(lo, hi, dtype=np.int64)
    idc = ids[lo:hi]
    phys = pos[lo:hi]
    rel = phys - phys[0]
    nbytes = int(rel[-1] + sizes[hi - 1])
    view = buf[:nbytes + int(sizes_t.max())]
    _fill(view, records, sizes_t, idc, rel)
    queue_offset = i // slots
    set_head_field(view, "queue_offset", queue_offset, rel)
    set_head_field(view, "physical_offset", phys, rel)
    set_head_field(view, "born_timestamp", BENCH_EPOCH_MS + i, rel)
    set_head_field(view, "store_timestamp", BENCH_EPOCH_MS + i, rel)
    hashes, nkeys = _patch(view, fields, idc, rel, i)
    out.write(view[:nbytes].data)
    if index is not None:
        index.put_hashes(hashes, np.repeat(phys, nkeys), np.repeat(BENCH_EPOCH_MS + i, nkeys))
    if cqs:
        slot = i % slots
        for k, w in cqs.items():
            sel = np.flatnonzero(slot == k)
            if len(sel):
                w.put_many(queue_offset[sel], phys[sel], sizes[lo:hi][sel], tags[idc[sel]])


__all__ = ["GeneratedStore", "make_store", "CHUNK_BYTES"]
