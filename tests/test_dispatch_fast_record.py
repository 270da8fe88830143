"""The inline single-record dispatch writes what the general one does."""
import random

from rmqstore.codec import Message
from rmqstore.config import StoreConfig
from rmqstore.dispatch import _Q31, _R31, _POW_N, _index_hash_from
from rmqstore.store import MessageStore


def test_ascii_hash_matches_loop():
    rnd = random.Random(7)
    for _ in range(2000):
        t = "".join(chr(rnd.randrange(128)) for _ in range(rnd.randrange(1, 60)))
        ph = rnd.randrange(1 << 32)
        b = t.encode("ascii")
        h = (ph * _POW_N[len(b)] + 31 * int(b.translate(_Q31), 31) + int(b.translate(_R31), 31)) & 0xFFFFFFFF
        if h & 0x80000000:
            h = 0 if h == 0x80000000 else 0x100000000 - h
        assert h == _index_hash_from(ph, "T", t)


def _store_bytes(root, fast):
    st = MessageStore.open(root, StoreConfig(mapped_file_size_commit_log=1 << 20), create=True)
    if not fast:
        st._record = st.dispatcher._dispatch_record
    props = [{"KEYS": "a b  c"}, {"UNIQ_KEY": "", "KEYS": ""}, {"UNIQ_KEY": "u1", "KEYS": "k"},
             {"KEYS": "é ü"}, {"TAGS": "t", "KEYS": "x" * 300}, {}, {"TAGS": "", "KEYS": "z"}]
    for i in range(70):
        st.put(Message(topic=f"T{i % 2}", body=b"b", queue_id=i % 3, properties=dict(props[i % 7]),
                       born_timestamp=1, store_timestamp=1000 + i))
    st.close()
    # Index file names are wall-clock times: compare them by position.
    return {(p.parent.relative_to(root), i if p.parent.name == "index" else p.name): p.read_bytes()
            for i, p in enumerate(sorted(root.rglob("*"))) if p.is_file() and "checkpoint" not in p.name}


def test_fast_record_same_bytes(tmp_path):
    a = _store_bytes(tmp_path / "a", True)
    b = _store_bytes(tmp_path / "b", False)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k] == b[k], k
