"""The sample stores under ``samples/``: written by rmqstore's own engine, reproducibly.

Every input is fixed — message times, the seed for bodies and keys, and the clock that
names IndexFiles (RocketMQ names them after the wall clock in the broker's time zone,
spec §1.1, so here the clock is the time of the record being dispatched and the zone is
UTC). Running :func:`generate` twice gives byte-identical trees; ``tests/test_samples.py``
holds the checked-in copies to that.

Geometry is small so the samples stay small and still exercise segment rolls: 64 KiB
CommitLog segments, 64-unit ConsumeQueue files, and IndexFiles of 64 slots / 256 entries.
maxIndexNum = 4 x maxHashSlotNum, so every command infers the geometry from the file sizes
without a broker.conf.
"""

from __future__ import annotations

import os
import random
import shutil
from datetime import timezone
from pathlib import Path
from typing import Callable, Iterable

from .files import checkpoint as ckpt
from .format import layout as L
from .format.message import Host, Message
from .files.config import StoreConfig
from .engine.store import MessageStore

COMMITLOG_SEGMENT = 64 * 1024
CQ_FILE = 64 * L.CQ_UNIT_SIZE
HASH_SLOTS = 64
INDEX_NUM = 4 * HASH_SLOTS
PAGE = 4096

#: 2023-11-14T22:13:20Z: every sample's first store timestamp.
EPOCH_MS = 1_700_000_000_000
SEED = 20240601

SAMPLES = ("multi-segment", "ipv6-unicode", "crashed")


def sample_config(root: Path, broker_version: str = "4.9") -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root),
                       mapped_file_size_commit_log=COMMITLOG_SEGMENT,
                       mapped_file_size_consume_queue=CQ_FILE,
                       max_hash_slot_num=HASH_SLOTS, max_index_num=INDEX_NUM,
                       broker_version=broker_version)


class _Clock:
    """The time IndexService asks for when it names a new file: the record being written."""

    def __init__(self) -> None:
        self.now = EPOCH_MS

    def __call__(self) -> int:
        return self.now


def _write(root: Path, messages: Iterable[Message], broker_version: str) -> list:
    """Put ``messages`` through a fresh MessageStore and close it cleanly."""
    if root.exists():
        shutil.rmtree(root)
    clock = _Clock()
    results = []
    store = MessageStore.open(root, sample_config(root, broker_version), create=True, clock=clock)
    try:
        if store.dispatcher.index is not None:
            # Index file names are local time in RocketMQ; a fixed zone keeps them the same
            # on every machine that regenerates the samples.
            store.dispatcher.index.tz = timezone.utc
        for m in messages:
            clock.now = m.store_timestamp
            r = store.put(m)
            if not r.ok:
                raise RuntimeError(f"sample message refused: {r.status.value} {r.reason}")
            results.append(r)
    finally:
        store.close()
    return results


def _uniq_key(rng: random.Random) -> str:
    # The shape of a client-made UNIQ_KEY: 32 upper-case hex digits.
    return "%032X" % rng.getrandbits(128)


def _text_body(rng: random.Random, n: int) -> bytes:
    words = ("order", "paid", "shipped", "refund", "cart", "user", "sku", "qty", "total", "eur")
    out = []
    size = 0
    while size < n:
        w = rng.choice(words)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n].encode()


# --- multi-segment -----------------------------------------------------------------------

MULTI_TOPICS = {"OrderEvents": 4, "PaymentEvents": 2, "AuditLog": 1}
MULTI_TAGS = ("created", "paid", "shipped", "cancelled")
MULTI_COUNT = 600


def multi_segment_messages() -> list[Message]:
    rng = random.Random(SEED)
    born = Host.parse("10.0.3.17:51234")
    store_host = Host.parse("10.0.0.5:10911")
    topics = sorted(MULTI_TOPICS)
    msgs = []
    for i in range(MULTI_COUNT):
        topic = topics[i % len(topics)]
        queue = rng.randrange(MULTI_TOPICS[topic])
        tag = MULTI_TAGS[rng.randrange(len(MULTI_TAGS))]
        order = 1000 + i // 9  # nine events per order id, three per topic: keys with several hits
        keys = f"order-{order}" if i % 5 else f"order-{order} user-{rng.randrange(40)}"
        ts = EPOCH_MS + i * 1_500
        props = {"KEYS": keys, "UNIQ_KEY": _uniq_key(rng), "CLUSTER": "DefaultCluster",
                 "TAGS": tag}
        body = _text_body(rng, rng.randrange(40, 320))
        msgs.append(Message(topic=topic, body=body, properties=props, queue_id=queue,
                            born_timestamp=ts - rng.randrange(1, 40), born_host=born,
                            store_timestamp=ts, store_host=store_host))
    return msgs


# --- ipv6-unicode ------------------------------------------------------------------------

UNICODE_TAGS = ("标签-α", "étiquette", "тег", "タグ", "🚚-shipping")
UNICODE_KEYS = ("ключ-1", "キー二", "clé-3", "مفتاح-4", "🔑-5")
UNICODE_BODIES = ("Grüße aus Köln", "你好，世界", "Привет, мир", "こんにちは世界",
                  "مرحبا بالعالم", "emoji 🚀✨ and a zero-width‍joiner", "ASCII only")
UNICODE_COUNT = 48


def ipv6_unicode_messages() -> list[Message]:
    rng = random.Random(SEED + 1)
    store_host = Host.parse("[2001:db8:0:1::5]:10911")
    born_hosts = (Host.parse("[2001:db8:0:2::17]:53412"), Host.parse("[fe80::1ff:fe23:4567:890a]:40001"),
                  Host.parse("192.0.2.10:50505"))  # one IPv4 producer: mixed widths in one log
    msgs = []
    for i in range(UNICODE_COUNT):
        topic = ("Unicode-Orders", "Unicode-Audit")[i % 2]
        queue = (i // 2) % 2 if topic == "Unicode-Orders" else 0
        ts = EPOCH_MS + 86_400_000 + i * 2_000
        key = UNICODE_KEYS[i % len(UNICODE_KEYS)]
        props = {"KEYS": f"{key} 注文-{i}", "UNIQ_KEY": _uniq_key(rng),
                 "TAGS": UNICODE_TAGS[i % len(UNICODE_TAGS)], "CLUSTER": "DefaultCluster",
                 "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
        body = f"#{i} {UNICODE_BODIES[i % len(UNICODE_BODIES)]}".encode()
        msgs.append(Message(topic=topic, body=body, properties=props, queue_id=queue,
                            born_timestamp=ts - 7, born_host=born_hosts[i % 3],
                            store_timestamp=ts, store_host=store_host))
    return msgs


# --- crashed -----------------------------------------------------------------------------

CRASHED_COUNT = 90
CRASHED_TORN_BODY = 6000  # the last record spans pages, so a page can be lost mid-record


def crashed_messages() -> list[Message]:
    rng = random.Random(SEED + 2)
    born = Host.parse("10.0.3.21:41000")
    store_host = Host.parse("10.0.0.6:10911")
    msgs = []
    for i in range(CRASHED_COUNT):
        ts = EPOCH_MS + 2 * 86_400_000 + i * 1_000
        last = i == CRASHED_COUNT - 1
        body = _text_body(rng, CRASHED_TORN_BODY if last else rng.randrange(200, 900))
        props = {"KEYS": f"txn-{i}", "UNIQ_KEY": _uniq_key(rng), "CLUSTER": "DefaultCluster",
                 "TAGS": ("debit", "credit")[i % 2]}
        msgs.append(Message(topic="Ledger", body=body, properties=props, queue_id=i % 2,
                            born_timestamp=ts - 3, born_host=born, store_timestamp=ts,
                            store_host=store_host))
    return msgs


def _crash(root: Path, messages: list[Message], results: list) -> None:
    """Turn a cleanly closed store into what a power cut leaves (spec §2, §8.2, §10).

    The last record lost every page after its first one (its header and the start of its
    body reached the disk, the rest did not), while its ConsumeQueue unit and index entries
    did; the broker had already preallocated the next CommitLog segment; the checkpoint is
    a few records behind; and ``abort`` is still there.
    """
    last = results[-1]
    seg_start = last.offset - last.offset % COMMITLOG_SEGMENT
    seg = root / "commitlog" / f"{seg_start:020d}"
    torn_from = (last.offset // PAGE + 1) * PAGE
    torn_to = last.offset + last.size
    if not last.offset < torn_from < torn_to:
        raise RuntimeError("the torn record must cross a page boundary")
    with open(seg, "r+b") as f:
        f.seek(torn_from - seg_start)
        f.write(bytes(torn_to - torn_from))
    nxt = root / "commitlog" / f"{seg_start + COMMITLOG_SEGMENT:020d}"
    with open(nxt, "wb") as f:
        f.truncate(COMMITLOG_SEGMENT)  # sparse zeros, as a fresh mmap leaves them
    behind = messages[-6].store_timestamp
    ckpt.write_checkpoint(root, ckpt.Checkpoint(behind, behind, 0), version="4.9")
    ckpt.create_abort(root, b"")  # 4.9 writes it empty


# --- all ---------------------------------------------------------------------------------

WRITERS: dict[str, Callable[[Path], None]] = {}


def write_multi_segment(root: Path) -> None:
    _write(root, multi_segment_messages(), "4.9")


def write_ipv6_unicode(root: Path) -> None:
    # A 5.x-convention store: trailing property separator and a 5-long checkpoint.
    _write(root, ipv6_unicode_messages(), "5")


def write_crashed(root: Path) -> None:
    msgs = crashed_messages()
    results = _write(root, msgs, "4.9")
    _crash(root, msgs, results)


WRITERS.update({"multi-segment": write_multi_segment, "ipv6-unicode": write_ipv6_unicode,
                "crashed": write_crashed})


def generate(dest: str | os.PathLike, names: Iterable[str] = SAMPLES) -> list[Path]:
    """(Re)write the named samples under ``dest``; returns their roots."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for name in names:
        WRITERS[name](dest / name)
        out.append(dest / name)
    return out
