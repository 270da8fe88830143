"""The inline single-record dispatch writes what the general one does."""
import random

from rmqstore.format.message import Message
from rmqstore.format.hashing import index_hash
from rmqstore.files.config import StoreConfig
from rmqstore.format.hashing import prefix_hash, token_hash
from rmqstore.engine.store import MessageStore


def test_ascii_token_hash_equals_java():
    """The two base-31 parses of an ASCII token, against the spec's hash of the whole key."""
    rnd = random.Random(7)
    for _ in range(2000):
        topic = "".join(chr(rnd.randrange(32, 0x3000)) for _ in range(rnd.randrange(1, 20)))
        t = "".join(chr(rnd.randrange(128)) for _ in range(rnd.randrange(0, 60)))
        assert token_hash(prefix_hash(topic), topic, t) == index_hash(f"{topic}#{t}")


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
