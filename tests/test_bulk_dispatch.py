"""The one bulk dispatch (``engine/batch_dispatch.dispatch_columns``) writes, for records
as written, the ConsumeQueue and IndexFile bytes of dispatching them one at a time
(``Dispatcher.dispatch``), including what a put never makes: queue offsets that skip or
repeat (a log written by something else, re-read by the reput from the files). The
fixture tests tie the one-at-a-time path to RocketMQ."""

from __future__ import annotations

import hashlib
import random

import pytest

from rmqstore.engine.dispatch import Dispatcher
from rmqstore.engine.results import Appended
from rmqstore.files.config import StoreConfig
from rmqstore.files.index import IndexGeometry
from rmqstore.files.index_service import IndexService
from rmqstore.format import layout as L
from rmqstore.format.rules import SCHEDULE_TOPIC

CLOCK = 1700000000000


def _records(seed: int, n: int, skips: bool) -> list[Appended]:
    rnd = random.Random(seed)
    next_qo: dict = {}
    out, off = [], 0
    for i in range(n):
        topic = rnd.choice(["T", "T", "U", SCHEDULE_TOPIC])
        qid = rnd.randrange(3)
        props = {"TAGS": rnd.choice(["A", "B", "订单", ""]),
                 "KEYS": rnd.choice([f"k{i}", f"k{i} x{i}", " ", f"ключ{i}", f"k{i}  y"])}
        if rnd.random() < 0.3:
            props["UNIQ_KEY"] = f"{i:032X}"
        if topic == SCHEDULE_TOPIC:
            props["DELAY"] = str(rnd.randrange(0, 20))
        sys_flag = rnd.choice([0, 0, 0, L.TRANSACTION_PREPARED, L.TRANSACTION_ROLLBACK,
                               L.TRANSACTION_COMMIT])
        qo = next_qo.get((topic, qid), 0)
        if sys_flag & L.TRANSACTION_PREPARED:
            qo_rec = 0
        else:
            if skips and rnd.random() < 0.1:
                qo += rnd.choice([-1, 0, 2, 5])  # offsets that skip or repeat
                qo = max(qo, 0)
            qo_rec = qo
            next_qo[(topic, qid)] = qo + 1
        size = rnd.randrange(100, 400)
        out.append(Appended(off, size, topic, qid, qo_rec, sys_flag, CLOCK + 7 * i, props))
        off += size
    return out


def _tree(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _dispatch(root, records, bulk: bool) -> dict:
    cfg = StoreConfig(store_path_root_dir=str(root), mapped_file_size_consume_queue=400)
    index = IndexService(root / "index", IndexGeometry(16, 40), clock=lambda: CLOCK)
    d = Dispatcher(cfg, index=index)
    rnd = random.Random(len(records))
    i = 0
    while i < len(records):
        k = rnd.choice([1, 20, 40, 200]) if bulk else 1
        if bulk:
            d.dispatch_many(records[i:i + k])
        else:
            d.dispatch(records[i])
        i += k
    ts = d.logics_timestamp
    d.flush()
    d.close()
    return {"tree": _tree(root), "logics": ts, "dispatched": d.dispatched}


@pytest.mark.parametrize("skips", [False, True])
@pytest.mark.parametrize("seed", [1, 2])
def test_bulk_dispatch_writes_the_one_at_a_time_bytes(tmp_path, seed, skips):
    records = _records(seed, 900, skips)
    one = _dispatch(tmp_path / "one", records, False)
    bulk = _dispatch(tmp_path / "bulk", records, True)
    assert len([k for k in one["tree"] if k.startswith("index")]) > 3
    assert len([k for k in one["tree"] if k.startswith("consumequeue")]) > 6
    assert bulk == one
