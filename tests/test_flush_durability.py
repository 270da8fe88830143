"""SYNC_FLUSH durability: a writer killed with SIGKILL at random moments never loses a
message it was told PUT_OK about (spec §11.2), and the store reopens after each crash
(``abort`` left behind) and carries on at the end of the valid data."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

from rmqstore.files.commitlog import CommitLog
from rmqstore.files.config import StoreConfig
from rmqstore.files.consumequeue import open_consume_queue
from rmqstore.engine.store import MessageStore

CHILD = textwrap.dedent("""
    import sys
    from rmqstore.format.message import Message
    from rmqstore.files.config import StoreConfig
    from rmqstore.engine.store import MessageStore
    root, run = sys.argv[1], int(sys.argv[2])
    cfg = StoreConfig(mapped_file_size_commit_log=65536, mapped_file_size_consume_queue=1280,
                      max_hash_slot_num=64, max_index_num=256, flush_disk_type="SYNC_FLUSH")
    st = MessageStore.open(root, cfg, create=True)
    out = sys.stdout
    out.write("ready\\n"); out.flush()
    seq = 0
    while True:
        body = f"{run}:{seq}:".encode() + b"d" * (seq * 37 % 700)
        r = st.put(Message(topic="Dur", queue_id=seq % 3, body=body, store_timestamp=1))
        if r.status.value == "PUT_OK":  # acknowledged only after the group commit synced it
            out.write(f"{run} {seq} {r.offset}\\n"); out.flush()
        seq += 1
""")


def _config() -> StoreConfig:
    return StoreConfig(mapped_file_size_commit_log=65536, mapped_file_size_consume_queue=1280,
                       max_hash_slot_num=64, max_index_num=256, flush_disk_type="SYNC_FLUSH")


def test_acknowledged_messages_survive_sigkill(tmp_path):
    root = tmp_path / "s"
    rnd = random.Random(20240611)
    acked: dict[tuple[int, int], int] = {}
    for run in range(4):
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(run)],
                                 stdout=subprocess.PIPE, text=True, bufsize=1)
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rnd.uniform(0.05, 0.5))
        os.kill(child.pid, signal.SIGKILL)
        for line in child.stdout:  # every ack written before the kill
            r, seq, off = map(int, line.split())
            acked[(r, seq)] = off
        child.wait()
        assert child.returncode == -signal.SIGKILL
        assert (root / "abort").exists()  # a crash, as the broker would see it
        assert any(k[0] == run for k in acked), "the child acknowledged nothing"

        # Everything acknowledged is there, at the offset it was acknowledged with.
        with CommitLog(_config().with_values(store_path_root_dir=str(root))) as log:
            for (r, seq), off in acked.items():
                m = log.read_at(off, check_crc=True)
                assert m.body.startswith(f"{r}:{seq}:".encode())

    # A final open recovers (re-dispatches the tail) and queue offsets stay dense.
    with MessageStore.open(root, _config()) as st:
        end = st.appender.end
    with CommitLog(_config().with_values(store_path_root_dir=str(root))) as log:
        msgs = list(log.messages(check_crc=True))
    assert msgs and msgs[-1].commit_log_offset + msgs[-1].store_size == end
    for q in range(3):
        mine = [m for m in msgs if m.queue_id == q]
        assert [m.queue_offset for m in mine] == list(range(len(mine)))
        with open_consume_queue(root, "Dur", q, 1280) as cq:
            assert [u.commit_log_offset for u in cq] == [m.commit_log_offset for m in mine]
