"""One record encoder (issue #13): every path the engine writes a record by produces the
bytes of :func:`rmqstore.format.record.encode_record` for the same message and the
offsets, queue offset and timestamp the store gave it (spec §3.1).

The fast single put (``CommitLogAppender.put_message``), the vectorised batch
(``batch.put_messages``) and the columnar put (``put_columns``) are specialised forms; the
general path (``prepare`` + ``append``) calls the format encoder's two halves. Each is checked here against ``encode_record``
on generated messages: v2 topics (over 127 Java characters), non-ASCII and astral
topics, empty properties, stored properties texts, the trailing separator on (5) and off (4.9),
IPv6 hosts, transaction flags. ``encode_record`` itself is tied to RocketMQ's bytes by
the spec vectors (tests/test_codec.py) and the fixture records (test_reader_fixtures).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from rmqstore.engine import batch as batch_module
from rmqstore.engine.message_batch import MessageBatch
from rmqstore.engine.prepare import prepare
from rmqstore.engine.results import PutResult
from rmqstore.engine.store import MessageStore
from rmqstore.files.config import StoreConfig
from rmqstore.format import layout as L
from rmqstore.format.message import Host, Message
from rmqstore.format.record import encode_record

HOSTS = [Host.parse("10.0.0.1:1234"), Host.parse("192.168.0.100:10911"),
         Host.parse("[2001:db8::1]:10911"), Host.parse("[::1]:50000")]
SAFE = "abcXYZ019_-%é订😀"  # characters a topic directory may hold, incl. 2- and 4-byte UTF-8
TEXT = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
               max_size=12)

topics = st.one_of(
    st.text(SAFE, min_size=1, max_size=20),
    # Around the v1/v2 boundary: %RETRY% topics may go to 255 UTF-8 bytes in 5.x (§3.6).
    st.integers(118, 130).map(lambda n: "%RETRY%" + "r" * n),
    st.integers(55, 64).map(lambda n: "%RETRY%" + "😀" * n),  # Java length 2n + 7
    st.sampled_from(["t" * 127, "t" * 128, "é" * 63]),
)
properties = st.dictionaries(st.text(SAFE, min_size=1, max_size=8),
                             st.one_of(TEXT, st.none()), max_size=5)


@st.composite
def messages(draw):
    props = draw(properties)
    m = Message(topic=draw(topics), body=draw(st.binary(max_size=300)), properties=props,
                queue_id=draw(st.integers(0, 3)), flag=draw(st.integers(-2**31, 2**31 - 1)),
                sys_flag=draw(st.sampled_from([0, 0x1, 0x2, L.TRANSACTION_PREPARED,
                                               L.TRANSACTION_COMMIT, L.TRANSACTION_ROLLBACK,
                                               L.SYSFLAG_BORNHOST_V6])),
                born_timestamp=draw(st.integers(0, 2**62)),
                store_timestamp=draw(st.integers(0, 2**62)),
                born_host=draw(st.sampled_from(HOSTS)), store_host=draw(st.sampled_from(HOSTS)),
                reconsume_times=draw(st.integers(0, 16)),
                prepared_transaction_offset=draw(st.integers(0, 2**40)))
    if draw(st.integers(0, 4)) == 0:  # a stored text: taken as it is
        m.properties_text = draw(st.sampled_from(["", "A\x01b", "A\x01b\x02", "x\x02\x02y"]))
    return m


def _expected(msg: Message, r, cfg: StoreConfig) -> bytes:
    placed = dataclasses.replace(msg, queue_offset=r.queue_offset, commit_log_offset=r.offset,
                                 store_timestamp=r.store_timestamp)
    return encode_record(placed, trailing_separator=cfg.trailing_separator,
                         auto=cfg.broker_version != "4.9")


def _written(store: MessageStore, r) -> bytes:
    seg, pos = store.appender.queue.find(r.offset)
    return bytes(seg.buffer()[pos:pos + r.size])


def _config(version: str) -> StoreConfig:
    cfg = StoreConfig(mapped_file_size_commit_log=1 << 20, broker_version=version)
    # The trailing 0x02 after properties is the version's (spec §3.4): off for 4.9, on for 5.
    assert cfg.trailing_separator == (version != "4.9")
    return cfg


CASES = ["4.9", "5"]
SETTINGS = settings(max_examples=120, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


@pytest.mark.parametrize("version", CASES)
def test_fast_single_put_writes_encode_record_bytes(tmp_path, version):
    cfg = _config(version)
    seen = {"v2": 0, "v6": 0}
    with MessageStore.open(tmp_path / "s", cfg, create=True) as store:
        put = store.appender.put_message

        @SETTINGS
        @given(messages(), st.booleans())
        def check(msg, stamp):
            r = put(msg, stamp)
            assume(r is not None)  # None: refused or sent the general way (tested below)
            assert r.ok
            raw = _written(store, r)
            assert raw == _expected(msg, r, cfg)
            seen["v2"] += int.from_bytes(raw[4:8], "big", signed=True) == L.MAGIC_V2
            seen["v6"] += msg.store_host.is_v6

        check()
    assert seen["v6"]  # the generator reached IPv6 store hosts
    assert bool(seen["v2"]) == (version != "4.9")  # v2 topics went the fast way on 5.x


@pytest.mark.parametrize("version", CASES)
def test_general_put_writes_encode_record_bytes(tmp_path, version):
    cfg = _config(version)
    with MessageStore.open(tmp_path / "s", cfg, create=True) as store:
        a = store.appender

        @SETTINGS
        @given(messages(), st.booleans(), st.booleans())
        def check(msg, stamp, asks_v2):
            if asks_v2:
                msg.magic = L.MAGIC_V2
            p = prepare(msg, cfg)
            assume(not isinstance(p, PutResult))  # refused (the limits have their tests)
            with a.lock:
                r, _ = a.append(p, stamp=stamp)
            assert _written(store, r) == _expected(msg, r, cfg)

        check()


@pytest.mark.parametrize("version", CASES)
def test_vectorised_batch_writes_encode_record_bytes(tmp_path, version):
    cfg = _config(version)
    with MessageStore.open(tmp_path / "s", cfg, create=True) as store:
        a = store.appender

        @SETTINGS
        @given(st.lists(messages(), min_size=1, max_size=8), st.booleans())
        def check(msgs, stamp):
            for m in msgs:  # one host width per batch, or it goes the general way
                m.born_host = Host(bytes(len(msgs[0].born_host.address)), m.born_host.port)
                m.store_host = Host(bytes(len(msgs[0].store_host.address)), m.store_host.port)
            results = batch_module.put_messages(a, msgs, stamp)
            assume(results is not None)
            for m, r in zip(msgs, results):
                assert _written(store, r) == _expected(m, r, cfg)

        check()


@st.composite
def batches(draw):
    n = draw(st.integers(1, 12))
    col = lambda s: st.one_of(s, st.lists(s, min_size=n, max_size=n))  # noqa: E731
    names = draw(st.lists(st.text(SAFE, min_size=1, max_size=6), unique=True, max_size=4))
    props = {k: draw(st.one_of(TEXT, st.lists(st.one_of(TEXT, st.none()), min_size=n,
                                                  max_size=n))) for k in names}
    texts = None
    if not props and draw(st.booleans()):
        texts = draw(st.lists(st.sampled_from(["", "A\x01b", "A\x01b\x02"]), min_size=n, max_size=n))
    return MessageBatch(
        topic=draw(st.one_of(topics, st.lists(topics, min_size=n, max_size=n))),
        bodies=draw(st.lists(st.binary(max_size=200), min_size=n, max_size=n)),
        queue_ids=draw(col(st.integers(0, 3))), properties=props, properties_texts=texts,
        flag=draw(col(st.integers(-2**31, 2**31 - 1))),
        sys_flag=draw(col(st.sampled_from([0, 0x1, L.TRANSACTION_PREPARED, L.TRANSACTION_COMMIT,
                                           L.TRANSACTION_ROLLBACK]))),
        born_timestamp=draw(col(st.integers(0, 2**62))),
        store_timestamp=draw(col(st.integers(0, 2**62))),
        born_host=draw(st.sampled_from(HOSTS)), store_host=draw(st.sampled_from(HOSTS)))


@pytest.mark.parametrize("version", CASES)
def test_columnar_put_writes_encode_record_bytes(tmp_path, version):
    cfg = _config(version)
    written = []
    with MessageStore.open(tmp_path / "s", cfg, create=True) as store:

        @SETTINGS
        @given(batches(), st.booleans())
        def check(batch, stamp):
            # the columnar path alone (None: the batch would go put_batch's way)
            results = batch_module.put_columns(store.appender, batch, stamp)
            assume(results is not None)
            for m, r in zip(batch.messages(), results):
                assert _written(store, r) == _expected(m, r, cfg)
            written.append(len(results))

        check()
    assert len(written) > 20  # the columnar path took most batches
