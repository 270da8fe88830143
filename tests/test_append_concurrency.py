"""Threads appending at once lose nothing and duplicate nothing; queue offsets are dense and
in CommitLog order; a reader scanning the files meanwhile only ever sees whole records."""

from __future__ import annotations

import random
import threading

from rmqstore.files.commitlog import Check, CommitLog
from rmqstore.format.message import Message
from rmqstore.files.config import StoreConfig
from rmqstore.files.consumequeue import open_consume_queue
from rmqstore.engine.store import MessageStore

THREADS, PER_THREAD = 4, 300
QUEUES = [("A", 0), ("A", 1), ("B", 0)]


def _config(root) -> StoreConfig:
    # Small segments so the writers roll through several BLANKs while racing.
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=65536,
                       mapped_file_size_consume_queue=1280, max_hash_slot_num=64,
                       max_index_num=256, flush_interval_commit_log=1)


def _writer(st: MessageStore, tid: int, errors: list) -> None:
    rnd = random.Random(tid)
    seq = 0
    try:
        while seq < PER_THREAD:
            topic, qid = QUEUES[rnd.randrange(len(QUEUES))]
            n = 1 if rnd.random() < 0.7 else min(rnd.randrange(2, 6), PER_THREAD - seq)
            msgs = [Message(topic=topic, queue_id=qid, body=f"{tid}:{seq + i}:".encode() + b"p" * rnd.randrange(0, 900),
                            properties={"KEYS": f"t{tid}-{seq + i}"}, store_timestamp=1)
                    for i in range(n)]
            results = st.put_batch(msgs) if n > 1 else [st.put(msgs[0])]
            assert all(r.ok for r in results), results
            seq += n
    except BaseException as e:  # surfaced by the test thread
        errors.append(e)


def _scan_whole_records(cfg, stop: threading.Event, seen: list, errors: list) -> None:
    """Walk the files over and over; anything but whole records or unwritten space fails."""
    try:
        while not stop.is_set():
            with CommitLog(cfg) as log:
                count = 0
                for off, c in log.walk(check_crc=True):
                    if c.status is Check.OK:
                        m = log.read_at(off, check_crc=True)
                        tid, seq, _ = m.body.split(b":", 2)
                        assert m.properties["KEYS"] == f"t{int(tid)}-{int(seq)}"
                        count += 1
                    elif c.status is Check.FAIL:
                        seg, pos = log.queue.find(off)
                        # The end of published data: TOTALSIZE not written yet.
                        assert seg.buffer()[pos:pos + 4] == b"\0\0\0\0", (off, c)
                    else:
                        assert c.status is Check.END_OF_SEGMENT, (off, c)
                assert not seen or count >= seen[-1]
                seen.append(count)
    except BaseException as e:
        errors.append(e)


def test_concurrent_writers_and_a_reader(tmp_path):
    root = tmp_path / "s"
    cfg = _config(root)
    errors: list = []
    seen: list = []
    with MessageStore.open(root, cfg, create=True) as st:
        stop = threading.Event()
        reader = threading.Thread(target=_scan_whole_records, args=(cfg, stop, seen, errors))
        reader.start()
        writers = [threading.Thread(target=_writer, args=(st, t, errors)) for t in range(THREADS)]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        stop.set()
        reader.join()
    assert not errors, errors[0]
    assert len(seen) >= 2  # the reader really ran while writing

    with CommitLog(cfg) as log:
        msgs = list(log.messages(check_crc=True))
    ids = [tuple(int(x) for x in m.body.split(b":", 2)[:2]) for m in msgs]
    assert len(ids) == THREADS * PER_THREAD
    assert set(ids) == {(t, s) for t in range(THREADS) for s in range(PER_THREAD)}
    per_thread_order = {}
    next_offset = {}
    for m, (tid, seq) in zip(msgs, ids):
        assert seq > per_thread_order.get(tid, -1)  # each writer's messages in its order
        per_thread_order[tid] = seq
        key = (m.topic, m.queue_id)
        assert m.queue_offset == next_offset.get(key, 0)  # dense, in CommitLog order
        next_offset[key] = m.queue_offset + 1
    for topic, qid in QUEUES:
        with open_consume_queue(root, topic, qid, 1280) as cq:
            units = list(cq)
        mine = [m for m in msgs if (m.topic, m.queue_id) == (topic, qid)]
        assert [(u.queue_offset, u.commit_log_offset, u.size) for u in units] == [
            (m.queue_offset, m.commit_log_offset, m.store_size) for m in mine]
