"""The whole CommitLog scanned at once: every segment cut into byte ranges
(:mod:`rmqstore.scan.splits`), the ranges run in parallel worker processes
(:mod:`rmqstore.scan.parallel`), and their results stitched back along the record chain,
so the result is exactly a sequential walk of each segment. One runner for verify
(:func:`scan_dispatched`: every field of every record, and what dispatch writes, grouped
by the workers; :func:`scan_commitlog` for the fields alone) and rebuild (a task that hands
back only what dispatch writes, :mod:`rmqstore.scan.per_queue`).
"""

from __future__ import annotations

import functools
import os
from typing import Callable

from ..files.config import StoreConfig
from ..files.segments import SegmentQueue
from .dispatch import StoreScan, store_scan
from .handover import COLUMNS, GROUPED, HEAD
from .parallel import Arena, pool_map, trim_heap

#: Below this many CommitLog bytes the scan stays in this process (forking costs more).
PARALLEL_MIN_BYTES = 32 * 1024 * 1024
#: Shared memory for workers' results, at most (beyond it they come through pipes).
ARENA_MAX = 4 << 30
#: Byte ranges a segment is cut into, so one big segment is scanned on every core.
SPLIT_SIZE = 32 * 1024 * 1024
#: Shared memory reserved per byte of CommitLog for a verify part (every column and the
#: grouped units: ~90 bytes a record of at least 91 bytes with two keys; what does not fit
#: its slot is pickled).
VERIFY_SHARE = 1.0

Progress = Callable[[int, int], None]


def _splits(queue: SegmentQueue, config: StoreConfig, split_size: int):
    from .splits import Split

    out = []
    max_record = config.max_message_size + 65536
    for fi, s in enumerate(queue.segments):
        readable = s.readable_size
        for b in (range(0, readable, split_size) if readable > 0 else [0]):
            out.append(Split(len(out), "", str(s.path), fi, s.start, max(readable, 0),
                             queue.segment_size, b, min(b + split_size, max(readable, 0)),
                             max_record))
    return out


def scan_commitlog(config: StoreConfig, *, check_crc: bool = True, keys: bool = True,
                   processes: int | None = None, progress: Progress | None = None,
                   queue: SegmentQueue | None = None, split_size: int | None = None) -> StoreScan:
    """Dispatch data of every CommitLog segment, merged in order. Each segment is cut into
    byte ranges (:mod:`rmqstore.scan.splits`) scanned in parallel; a range whose resync does
    not continue the previous range's chain is scanned again from where the chain says
    (so the result is exactly a sequential walk of each segment)."""
    from .dispatch import dispatch_split, merge_splits

    task = functools.partial(dispatch_split, check_crc=check_crc,
                             delay_millis=config.delay_millis, keys=keys)
    chains = scan_chains(config, task, processes=processes, progress=progress, queue=queue,
                         split_size=split_size)
    return store_scan([merge_splits(c) for c in chains], config.mapped_file_size_commit_log)


def scan_dispatched(config: StoreConfig, *, check_crc: bool = True,
                    processes: int | None = None, progress: Progress | None = None,
                    queue: SegmentQueue | None = None, split_size: int | None = None):
    """(:func:`scan_commitlog`, :func:`~rmqstore.scan.per_queue.dispatched` of it) in one
    scan: each worker also groups its own range per queue (the rule's other way in,
    :func:`~rmqstore.scan.per_queue.verify_split`), and the parts come back through
    shared memory; what verify reads. Each part's columns are dropped once its segment is
    merged and the freed heap is handed back (:func:`~rmqstore.scan.parallel.trim_heap`),
    so the parent never holds a segment's columns twice (verify's peak memory)."""
    from .dispatch import merge_splits
    from .per_queue import dispatched, verify_split

    task = functools.partial(verify_split, check_crc=check_crc,
                             delay_millis=config.delay_millis)
    chains = scan_chains(config, task, processes=processes, progress=progress, queue=queue,
                         split_size=split_size, shared=VERIFY_SHARE)
    merged = []
    for chain in chains:
        merged.append(merge_splits(chain))
        for d in chain:  # merged: only the grouped payload is read again (join_groups)
            for name in _COLUMNS_ONLY:
                d.pop(name, None)
    trim_heap()
    scan = store_scan(merged, config.mapped_file_size_commit_log)
    d = dispatched(scan, chains=chains)
    del chains
    trim_heap()  # the parts are gone: the checks that follow need their pages
    return scan, d


#: A verify part's fields that only :func:`~rmqstore.scan.dispatch.merge_splits` reads
#: (``key_hash`` is also the grouped payload's).
_COLUMNS_ONLY = tuple(sorted(set(COLUMNS) - set(GROUPED) - set(HEAD)))


def scan_chains(config: StoreConfig, task, *, processes: int | None = None,
                progress: Progress | None = None, queue: SegmentQueue | None = None,
                split_size: int | None = None, on_part=None,
                shared: float | None = None) -> list[list]:
    """Per segment, the parts ``task`` made of its byte ranges along the record chain, in
    order (``task(split)`` gives ``(Boundary, part)``; ranges run in parallel).
    ``on_part(segment index, part)`` sees each part as soon as it is known to be on the
    chain, in order, while later ranges are still being scanned.

    With ``shared`` (bytes of a part per byte of range), parallel tasks get an
    ``arena_key`` and leave their parts' arrays in shared memory (:class:`Arena`),
    which is read without copies; stores too big for one arena fall back to pipes."""
    own = queue is None
    queue = queue or SegmentQueue(config.commit_log_dirs, config.mapped_file_size_commit_log,
                                  kind="commitlog")
    shelf = None
    try:
        size = split_size or SPLIT_SIZE
        splits = _splits(queue, config, size)
        total = sum(s.end - s.begin for s in splits)
        workers = processes if processes is not None else (os.cpu_count() or 1)
        receive = None
        if workers > 1 and len(splits) > 1 and total >= PARALLEL_MIN_BYTES:
            if shared and len(splits) * size * shared <= ARENA_MAX:
                shelf = Arena(len(splits), int(size * shared)).__enter__()
                task, receive = functools.partial(task, arena_key=shelf.key), shelf.get
            from . import segment_pass

            segment_pass.warm()  # load the compiled pass once, before the workers fork
            it = pool_map(task, splits, min(workers, len(splits)))
        else:
            it = map(task, splits)
        chains: list[list] = []
        chain: list | None = None
        done, file_index = 0, None
        expected: int | None = 0
        # Splits come in segment order, then byte order: each segment's chain is stitched
        # as its ranges' results arrive.
        for s, (b, part) in zip(splits, it):
            done += s.end - s.begin
            if progress:
                progress(done, total)
            if s.file_index != file_index:
                if chain is not None:
                    chains.append(chain)
                file_index, chain, expected = s.file_index, [], 0
            if expected is None or expected >= s.end and chain:
                continue  # past the chain's end, or inside one record spanning the range
            if b.first != expected:
                b, part = task(s.with_start(expected))
            if receive is not None:
                part = receive(part)
            chain.append(part)
            if on_part is not None:
                on_part(len(chains), part)
            expected = b.chain_end if b.stop == "range" else None
        if chain is not None:
            chains.append(chain)
        return chains
    finally:
        if shelf is not None:
            shelf.__exit__()
        if own:
            queue.close()


def store_timestamp_at(config: StoreConfig) -> Callable[[int], int]:
    """A reader of one record's STORETIMESTAMP by CommitLog offset."""
    def at(offset: int) -> int:
        from ..files.commitlog import CommitLog

        with CommitLog(config) as log:
            return log.read_at(offset).store_timestamp
    return at
