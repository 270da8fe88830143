"""The append benchmark's data and timed run (``rmqstore bench append``): the messages
(:func:`bench_messages`) or the same as columns (:func:`bench_columns`) put into a new
store with :meth:`~rmqstore.engine.store.MessageStore.put`, ``put_batch`` or
``put_columns`` (:func:`run_append`). :mod:`rmqstore.bench` renders the figures."""

from __future__ import annotations

import threading
import time

import numpy as np

from .engine.store import MessageStore
from .files.config import StoreConfig
from .format.message import Message


def bench_messages(count: int, body_size: int = 100, queues: int = 8, topic: str = "BenchTopic"):
    """The benchmark's messages: fixed body, TAGS and one KEYS token each, round-robin
    over ``queues`` queues (so dispatch writes CQ units and an index entry per message)."""
    body = b"x" * body_size
    tags = [f"Tag{i % 4}" for i in range(4)]
    for i in range(count):
        yield Message(topic=topic, body=body, queue_id=i % queues,
                      properties={"TAGS": tags[i % 4], "KEYS": f"k{i}"},
                      born_timestamp=1, store_timestamp=1)


def bench_columns(count: int, body_size: int = 100, queues: int = 8, topic: str = "BenchTopic"):
    """:func:`bench_messages` as columns: (topic, bodies, queue ids, TAGS, KEYS)."""
    body = b"x" * body_size
    tags = [f"Tag{i % 4}" for i in range(4)]
    return (topic, [body] * count, np.arange(count, dtype=np.int64) % queues,
            [tags[i % 4] for i in range(count)], [f"k{i}" for i in range(count)])


def run_append(root, count: int = 200_000, *, body_size: int = 100, batch: int = 0,
                 flush_disk_type: str = "ASYNC_FLUSH", dispatch: str = "sync",
                 segment_size: int = 1 << 30, threads: int = 1, columns: bool = False) -> dict:
    """Append ``count`` messages into a new store at ``root`` and time it (from the first
    put to a clean close, so flushing and dispatch are included).

    ``batch`` > 0 uses :meth:`MessageStore.put_batch` with that many messages per call;
    ``columns`` (with ``batch``) gives the same messages to
    :meth:`MessageStore.put_columns` as column slices instead;
    ``threads`` writers share the work. Returns messages, bytes, seconds, msgs_per_s.
    """
    cfg = StoreConfig(mapped_file_size_commit_log=segment_size, flush_disk_type=flush_disk_type)
    st = MessageStore.open(root, cfg, create=True, dispatch=dispatch)
    per = -(-count // threads)
    if columns:
        if not batch:
            raise ValueError("columns=True needs batch > 0")
        topic, bodies, qids, tags, keys = bench_columns(count, body_size)
        chunks = [range(i, min(i + per, count)) for i in range(0, count, per)]
    else:
        msgs = list(bench_messages(count, body_size))
        chunks = [msgs[i:i + per] for i in range(0, count, per)]

    def work(chunk):
        if columns:
            put = st.put_columns
            for i in range(chunk.start, chunk.stop, batch):
                j = min(i + batch, chunk.stop)
                put(topic=topic, bodies=bodies[i:j], queue_ids=qids[i:j],
                    properties={"TAGS": tags[i:j], "KEYS": keys[i:j]},
                    born_timestamp=1, store_timestamp=1)
        elif batch:
            for i in range(0, len(chunk), batch):
                st.put_batch(chunk[i:i + batch])
        else:
            put = st.put
            for m in chunk:
                put(m)

    t0 = time.perf_counter()
    if threads == 1:
        work(chunks[0])
    else:
        workers = [threading.Thread(target=work, args=(c,)) for c in chunks]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    end = st.appender.end
    st.close()
    seconds = time.perf_counter() - t0
    return {"messages": count, "bytes": end, "seconds": seconds,
            "msgs_per_s": count / seconds if seconds else float("inf")}
