"""The checkpoint while a store is open (spec §8.1): created at start, written by the
logics flush thread after each thorough ConsumeQueue flush (with the logicsMsgTimestamp
taken before it), when an index file fills, every second under 5.x, and on close."""

from __future__ import annotations

import time

from rmqstore.files.checkpoint import read_checkpoint
from rmqstore.format.message import Message
from rmqstore.files.config import StoreConfig
from rmqstore.files.index import IndexFile, IndexGeometry, list_index_files
from rmqstore.engine.store import MessageStore


def _wait_for(cond, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def _put(st, n: int, ts0: int = 1_000, **props) -> None:
    for i in range(n):
        st.put(Message(topic="T", body=b"b", queue_id=i % 2, properties=dict(props),
                       born_timestamp=1, store_timestamp=ts0 + i))


def test_created_at_open_as_the_broker_does(tmp_path):
    with MessageStore.open(tmp_path, StoreConfig(), create=True):
        cp_file = tmp_path / "checkpoint"
        assert cp_file.stat().st_size == 4096 and cp_file.read_bytes() == bytes(4096)


def test_thorough_flush_writes_it_while_open(tmp_path):
    cfg = StoreConfig(flush_interval_consume_queue=20, flush_consume_queue_thorough_interval=50,
                      flush_interval_commit_log=20, flush_commit_log_thorough_interval=50)
    with MessageStore.open(tmp_path, cfg, create=True) as st:
        _put(st, 50)
        assert _wait_for(lambda: read_checkpoint(tmp_path).logics_msg_timestamp == 1_049)
        assert _wait_for(lambda: read_checkpoint(tmp_path).physic_msg_timestamp == 1_049)
        assert (tmp_path / "abort").exists()  # still open: this is the live checkpoint


def test_a_filled_index_file_writes_it(tmp_path):
    # No thorough flush for ten minutes: only the full index file writes the checkpoint.
    cfg = StoreConfig(max_hash_slot_num=8, max_index_num=10,
                      flush_consume_queue_thorough_interval=600_000)
    with MessageStore.open(tmp_path, cfg, create=True) as st:
        for i in range(12):  # 9 entries fill a file (entry 0 is unused); the 10th rolls
            _put(st, 1, ts0=2_000 + i, KEYS=f"k{i}")
        st.wait_dispatched()
        first = list_index_files(tmp_path / "index")[0]
        f = IndexFile(first, IndexGeometry(8, 10))
        end = f.header.end_timestamp
        f.close()
        assert end == 2_008
        assert read_checkpoint(tmp_path).index_msg_timestamp == end


def test_every_second_under_5x(tmp_path):
    cfg = StoreConfig(broker_version="5", flush_interval_consume_queue=100,
                      flush_consume_queue_thorough_interval=600_000, flush_interval_commit_log=20)
    with MessageStore.open(tmp_path, cfg, create=True) as st:
        _put(st, 5, ts0=3_000)
        assert _wait_for(lambda: read_checkpoint(tmp_path).logics_msg_timestamp == 3_004)
