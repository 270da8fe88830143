"""The append benchmark's data and timed run (``rmqstore bench append``): the messages
(:func:`bench_messages`) or the same as columns (:func:`bench_columns`) put into a new
store with :meth:`~rmqstore.engine.store.MessageStore.put`, ``put_batch`` or
``put_columns`` (:func:`run_append`). The ``broker`` shape puts the messages of
:mod:`rmqstore.bench_shapes` (UNIQ_KEY, KEYS, TAGS, CLUSTER, user properties, as a broker
stores them); ``easy`` the old ones (one topic, TAGS and one KEYS token).
:mod:`rmqstore.bench` renders the figures."""

from __future__ import annotations

import threading
import time

import numpy as np

from .engine.store import MessageStore
from .files.config import StoreConfig
from .format.message import Message


def bench_messages(count: int, body_size: int = 100, queues: int = 8, topic: str = "BenchTopic",
                   *, shape: str = "easy", topics: int = 4):
    """The benchmark's messages. ``easy``: fixed body, TAGS and one KEYS token each,
    round-robin over ``queues`` queues of ``topic`` (so dispatch writes CQ units and an
    index entry per message); ``broker``: :func:`rmqstore.bench_shapes.shape_messages`
    over ``topics`` x ``queues``."""
    if shape != "easy":
        from .bench_shapes import shape_messages, templates

        yield from shape_messages(templates(shape, topics=topics, queues=queues,
                                            body_size=body_size), count)
        return
    body = b"x" * body_size
    tags = [f"Tag{i % 4}" for i in range(4)]
    for i in range(count):
        yield Message(topic=topic, body=body, queue_id=i % queues,
                      properties={"TAGS": tags[i % 4], "KEYS": f"k{i}"},
                      born_timestamp=1, store_timestamp=1)


def bench_columns(count: int, body_size: int = 100, queues: int = 8, topic: str = "BenchTopic",
                  *, shape: str = "easy", topics: int = 4) -> dict:
    """:func:`bench_messages` as :class:`~rmqstore.engine.message_batch.MessageBatch`
    keyword columns (``topic``, ``bodies``, ``queue_ids``, ``properties`` in the stored
    order, None where a message lacks one, the timestamps). One born host for all: a batch
    has one."""
    if shape == "easy":
        body = b"x" * body_size
        tags = [f"Tag{i % 4}" for i in range(4)]
        return {"topic": topic, "bodies": [body] * count,
                "queue_ids": np.arange(count, dtype=np.int64) % queues,
                "properties": {"TAGS": [tags[i % 4] for i in range(count)],
                               "KEYS": [f"k{i}" for i in range(count)]},
                "born_timestamp": 1, "store_timestamp": 1}
    msgs = list(bench_messages(count, body_size, queues, shape=shape, topics=topics))
    # Every message's names in one order: the longest dict's (the broker's HashMap order
    # of the names, which adding names does not change below 12 of them).
    names = list(max((m.properties for m in msgs), key=len))
    return {"topic": [m.topic for m in msgs], "bodies": [m.body for m in msgs],
            "queue_ids": np.array([m.queue_id for m in msgs], dtype=np.int64),
            "properties": {k: [m.properties.get(k) for m in msgs] for k in names},
            "born_timestamp": np.array([m.born_timestamp for m in msgs], dtype=np.int64),
            "store_timestamp": np.array([m.store_timestamp for m in msgs], dtype=np.int64),
            "born_host": msgs[0].born_host, "store_host": msgs[0].store_host}


def run_append(root, count: int = 200_000, *, body_size: int = 100, batch: int = 0,
                 flush_disk_type: str = "ASYNC_FLUSH", dispatch: str = "sync",
                 segment_size: int = 1 << 30, threads: int = 1, columns: bool = False,
                 shape: str = "easy", topics: int = 4, queues: int = 8) -> dict:
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
        cols = bench_columns(count, body_size, queues, shape=shape, topics=topics)
        # The calls' columns are cut before the clock starts: a caller holds its columns.
        chunks = [[{k: _slice(v, i, min(i + batch, j)) for k, v in cols.items()}
                   for i in range(s, j, batch)]
                  for s, j in ((s, min(s + per, count)) for s in range(0, count, per))]
    else:
        msgs = list(bench_messages(count, body_size, queues, shape=shape, topics=topics))
        chunks = [msgs[i:i + per] for i in range(0, count, per)]

    def work(chunk):
        if columns:
            put = st.put_columns
            for kw in chunk:
                put(**kw)
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


def _slice(v, i: int, j: int):
    """Rows ``i:j`` of a column; scalars, strings and hosts are for every message."""
    if isinstance(v, dict):
        return {k: _slice(c, i, j) for k, c in v.items()}
    if isinstance(v, (list, np.ndarray)):
        return v[i:j]
    return v
