"""What the benchmarks' generated messages look like (``rmqstore bench --shape``).

``broker`` (the default) is what a RocketMQ 4.9.8 client and broker write, as the
RocketMQ-written fixtures show (``fixtures/rocketmq-4.9.8/basic``): the client's ``TAGS``,
``KEYS`` (one to three space-separated tokens), ``WAIT=true``, user properties on some
messages and a ``UNIQ_KEY`` (client message id, spec §5.2) on every one; the broker adds
``CLUSTER``, drops ``WAIT`` and stores the text in its ``HashMap`` order
(:func:`rmqstore.engine.broker.as_broker`, spec §3.4, §14.3). Bodies come in five sizes
around ``body_size``. ``easy`` is the old shape: one ``TAGS`` and one ``KEYS`` token, no
``UNIQ_KEY``, no ``CLUSTER``, one body size, so every record is the same size.

Messages go round-robin over topics x queues (topic-major); message ``i``'s variant
(which properties, which body size) is drawn with a seeded generator. Each (queue,
variant) is one *template* record made by :func:`~rmqstore.format.record.encode_record`;
what differs per message are digit runs inside property values (``FIELDS``: the
UNIQ_KEY's time and counter, the KEYS tokens, ``seq``) and the head fields
(:mod:`rmqstore.bench_data` writes them). :func:`shape_messages` gives the same messages as
:class:`~rmqstore.format.message.Message` objects (the append benchmark, the tests).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from .engine.broker import as_broker, hashmap_order
from .files.config import StoreConfig
from .format.hashing import java_hash
from .format.message import HEX_DIGITS, Host, Message, client_msg_id
from .format.record import encode_record

SHAPES = ("broker", "easy")
#: First store timestamp of generated data; one millisecond per message after that.
BENCH_EPOCH_MS = 1_700_000_000_000
SEED = 7
#: Body sizes of the broker shape, as fractions of ``body_size`` (their mean is 1).
BODY_FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5)
#: Broker-shape variants: (weight, KEYS tokens, user properties).
VARIANTS = ((0.55, ("order",), False), (0.25, ("order", "user"), False),
            (0.10, ("order", "user", "sku"), False), (0.10, ("order",), True))
_TAGS = ("TagA", "TagB", "TagC", "TagD")
_COLORS = ("red", "green", "blue")
# The client id's fixed part (spec §5.2): pid and class-loader hash after the client IP.
_PID, _LOADER = 0x2A4F, 0x1B2C3D4E
# The id's time is ms since the start of the month; UTC here, so the data is the same anywhere.
_MONTH0 = int(_dt.datetime.fromtimestamp(BENCH_EPOCH_MS / 1000, _dt.timezone.utc)
              .replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp() * 1000)


@dataclass(frozen=True)
class Field:
    """A run of ``width`` digits (``base`` 10 or 16) inside a property value that differs
    per message; ``value(i)`` gives it for message numbers ``i`` (int64 array)."""

    width: int
    base: int
    value: Callable[[np.ndarray], np.ndarray]
    indexed: bool  # the token it ends is an IndexFile key (UNIQ_KEY, a KEYS token)


FIELDS = {
    # UNIQ_KEY's last 6 bytes: time (ms since the month began) and the counter (spec §5.2).
    "uniq": Field(12, 16, lambda i: (((BENCH_EPOCH_MS - _MONTH0 + i) & 0xFFFFFFFF) << 16)
                  | (i & 0xFFFF), True),
    "order": Field(10, 10, lambda i: i, True),  # unique per message
    "user": Field(7, 10, lambda i: (i * 7919) % 99991, True),  # repeats, as user ids do
    "sku": Field(6, 10, lambda i: i % 5003, True),
    "seq": Field(10, 10, lambda i: i, False),
    "bk": Field(10, 10, lambda i: i, True),  # the easy shape's KEYS token
}


_GROUP = 4  # digits looked up at a time: a quarter of the divisions of one per digit
_GROUP_TABLES: dict[int, np.ndarray] = {}


def _group_table(base: int) -> np.ndarray:
    """The ``_GROUP`` ASCII digits of every value below ``base**_GROUP``, one row each."""
    t = _GROUP_TABLES.get(base)
    if t is None:
        v = np.arange(base ** _GROUP, dtype=np.int64)
        powers = np.int64(base) ** np.arange(_GROUP - 1, -1, -1, dtype=np.int64)
        t = _GROUP_TABLES[base] = HEX_DIGITS[(v[:, None] // powers) % base]
    return t


def digits(f: Field, i: np.ndarray) -> np.ndarray:
    """The ASCII digits of field ``f`` for message numbers ``i``: an (n, width) uint8 array."""
    groups = -(-f.width // _GROUP)
    unit = np.int64(f.base) ** _GROUP
    powers = unit ** np.arange(groups - 1, -1, -1, dtype=np.int64)
    v = f.value(np.asarray(i, dtype=np.int64))
    out = _group_table(f.base)[(v[:, None] // powers) % unit].reshape(len(v), groups * _GROUP)
    return out[:, groups * _GROUP - f.width:]


def topic_name(t: int) -> str:
    return f"BenchTopic{t:02d}"  # equal lengths: an easy-shape record's size is fixed


@dataclass
class Template:
    """One encoded record and where its per-message digit runs sit."""

    record: bytes
    topic: str
    queue_id: int
    tags: str
    #: field name -> (offset in the record of its digits, the token text before them),
    #: in IndexFile put order for indexed fields (UNIQ_KEY first, then KEYS tokens, §7.3)
    fields: dict[str, tuple[int, str]]
    #: property name -> value, with ``{field}`` where a field's digits go (the broker's order)
    properties: dict[str, str]
    born_host: Host
    store_host: Host
    body: bytes


@dataclass
class Templates:
    """Every template of a shape: ``per_queue`` variants for each (topic, queue), topic-major,
    template id = ``queue slot * per_queue + variant``, and the variants' weights."""

    shape: str
    topics: int
    queues: int
    items: list[Template]
    weights: np.ndarray

    @property
    def per_queue(self) -> int:
        return len(self.weights)

    def sizes(self) -> np.ndarray:
        return np.array([len(t.record) for t in self.items], dtype=np.int64)

    def mean_size(self) -> float:
        return float((self.sizes().reshape(-1, self.per_queue) * self.weights).sum(axis=1).mean())

    def choose(self, n: int, seed: int = SEED) -> np.ndarray:
        """Template ids of messages ``0 .. n-1`` (int32): round-robin over the queues,
        the variant drawn with weights (seeded)."""
        slot = np.arange(n, dtype=np.int64) % (self.topics * self.queues)
        if self.per_queue == 1:
            return slot.astype(np.int32)
        v = np.random.default_rng(seed).choice(self.per_queue, size=n, p=self.weights)
        return (slot * self.per_queue + v).astype(np.int32)

    def table(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per template, for field ``name``: the digits' offset in the record (-1 when the
        template lacks it), the unsigned Java hash of ``topic#token-prefix`` and the key's
        put position among the record's index keys (-1 when not indexed)."""
        off = np.full(len(self.items), -1, dtype=np.int64)
        pre = np.zeros(len(self.items), dtype=np.uint64)
        slot = np.full(len(self.items), -1, dtype=np.int64)
        for j, t in enumerate(self.items):
            if name in t.fields:
                off[j], before = t.fields[name]
                pre[j] = java_hash(f"{t.topic}#{before}") & 0xFFFFFFFF
                if FIELDS[name].indexed:
                    slot[j] = [k for k in t.fields if FIELDS[k].indexed].index(name)
        return off, pre, slot

    def index_keys(self) -> np.ndarray:
        """How many IndexFile keys each template's record puts."""
        return np.array([sum(FIELDS[k].indexed for k in t.fields) for t in self.items],
                        dtype=np.int64)

    def tags_codes(self) -> np.ndarray:
        """The ConsumeQueue tagsCode of each template (the TAGS hash, spec §6.1)."""
        return np.array([java_hash(t.tags) for t in self.items], dtype=np.int64)


def bench_config() -> StoreConfig:
    """The broker the broker shape is stored by: RocketMQ 4.9 defaults (cluster name
    DefaultCluster) at 10.0.0.1:10911."""
    return StoreConfig(broker_ip1="10.0.0.1")


def _body(size: int, s: int) -> bytes:
    rng = np.random.default_rng(1000 + s)
    return rng.integers(32, 127, size=size, dtype=np.uint8).tobytes()  # printable text


def _place(props_text: str, record: bytes, name: str, value: str, field: str) -> tuple[int, str]:
    """Where ``field``'s digits (the zeros after ``{field}`` in ``value``) sit in
    ``record``, and the token text before them."""
    marker = "{" + field + "}"
    at = value.index(marker)
    token_start = value.rfind(" ", 0, at) + 1
    name_at = ("\x02" + props_text).index("\x02" + name + "\x01")  # ASCII: chars = bytes
    value_at = name_at + len(name) + 1
    props_at = len(record) - len(props_text)
    start = value_at + len(_render(value[:at]))
    return props_at + start, _render(value[token_start:at])


def _render(value: str, i: int = 0) -> str:
    """``value`` with every ``{field}`` replaced by field's digits for message ``i``."""
    out, rest = [], value
    while "{" in rest:
        a = rest.index("{")
        b = rest.index("}", a)
        f = FIELDS[rest[a + 1:b]]
        out.append(rest[:a])
        out.append(bytes(digits(f, np.array([i]))[0]).decode())
        rest = rest[b + 1:]
    out.append(rest)
    return "".join(out)


def _broker_template(t: int, q: int, v: int, s: int, body_size: int, cfg: StoreConfig) -> Template:
    _w, tokens, user = VARIANTS[v]
    born = Host(bytes([10, 0, 1 + t, 10 + q]), 50000 + q)
    uniq_fixed = client_msg_id(born.address, _PID, _LOADER, 0, 0)[:-12]  # time, counter vary
    tags = _TAGS[(q + v) % len(_TAGS)]
    client = {"TAGS": tags, "KEYS": " ".join(f"{k}-{{{k}}}" for k in tokens), "WAIT": "true"}
    if user:  # putUserProperty after the constructor
        client.update({"color": _COLORS[q % len(_COLORS)], "seq": "{seq}"})
    client["UNIQ_KEY"] = uniq_fixed + "{uniq}"  # set by the producer just before sending
    # The client sends its HashMap's text; the broker parses it into a map of its own.
    client = {k: client[k] for k in hashmap_order(list(client))}
    body = _body(min(round(body_size * BODY_FACTORS[s]), cfg.max_message_size), s)
    m = Message(topic=topic_name(t), body=body, queue_id=q, properties=client,
                born_timestamp=BENCH_EPOCH_MS, born_host=born)
    m = as_broker(m, cfg, now=BENCH_EPOCH_MS)
    pattern = dict(m.properties)
    order = [kv.split("\x01", 1)[0] for kv in m.properties_text.split("\x02") if kv]
    pattern = {k: pattern[k] for k in order}
    return _finish(m, pattern, tags)


def _easy_template(t: int, q: int, body_size: int) -> Template:
    tags = f"Tag{q % 4}"
    pattern = {"TAGS": tags, "KEYS": "bk{bk}"}
    body = (b"rmqstore-bench-" * (body_size // 15 + 1))[:body_size]
    m = Message(topic=topic_name(t), body=body, queue_id=q, properties=pattern,
                born_timestamp=BENCH_EPOCH_MS, born_host=Host.parse("10.0.0.17:50000"),
                store_timestamp=BENCH_EPOCH_MS, store_host=Host.parse("10.0.0.1:10911"))
    return _finish(m, pattern, tags)


def _finish(m: Message, pattern: dict[str, str], tags: str) -> Template:
    """Encode ``m`` with every field's digits at message 0 and find where they sit."""
    text = "\x02".join(f"{k}\x01{_render(v)}" for k, v in pattern.items())
    m.properties = {k: _render(v) for k, v in pattern.items()}
    m.properties_text = text
    record = encode_record(m)
    fields: dict[str, tuple[int, str]] = {}
    # Index put order (spec §7.3): UNIQ_KEY first, then the KEYS tokens in order.
    for name in ("UNIQ_KEY", "KEYS", *[k for k in pattern if k not in ("UNIQ_KEY", "KEYS")]):
        value = pattern.get(name, "")
        rest = value
        while "{" in rest:
            a = rest.index("{")
            f = rest[a + 1:rest.index("}", a)]
            fields[f] = _place(text, record, name, value, f)
            rest = rest[rest.index("}", a) + 1:]
    return Template(record, m.topic, m.queue_id, tags, fields, pattern, m.born_host,
                    m.store_host, m.body)


def templates(shape: str = "broker", *, topics: int = 4, queues: int = 8,
              body_size: int = 100) -> Templates:
    """Every template record of ``shape`` (see module doc)."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {shape!r}")
    items = []
    if shape == "easy":
        for t in range(topics):
            for q in range(queues):
                items.append(_easy_template(t, q, body_size))
        return Templates(shape, topics, queues, items, np.ones(1))
    cfg = bench_config()
    combos = [(v, s) for v in range(len(VARIANTS)) for s in range(len(BODY_FACTORS))]
    for t in range(topics):
        for q in range(queues):
            items.extend(_broker_template(t, q, v, s, body_size, cfg) for v, s in combos)
    w = np.array([VARIANTS[v][0] / len(BODY_FACTORS) for v, _s in combos])
    return Templates(shape, topics, queues, items, w / w.sum())


def shape_messages(tpl: Templates, count: int, *, seed: int = SEED) -> Iterator[Message]:
    """Messages ``0 .. count-1`` of the shape as :class:`Message` objects, with the
    properties the generated records hold (a dict in the stored order) and the head fields
    the generator writes, except QUEUEOFFSET and PHYSICALOFFSET (the store assigns those)."""
    ids = tpl.choose(count, seed)
    for i, j in enumerate(ids.tolist()):
        t = tpl.items[j]
        props = {k: _render(v, i) for k, v in t.properties.items()}
        yield Message(topic=t.topic, body=t.body, queue_id=t.queue_id,
                      properties=props, born_timestamp=BENCH_EPOCH_MS + i,
                      store_timestamp=BENCH_EPOCH_MS + i, born_host=t.born_host,
                      store_host=t.store_host)


def index_tokens(tpl: Templates, i: int, j: int) -> tuple[str, list[str]]:
    """(topic, the IndexFile key tokens, in put order) of message ``i`` (template ``j``)."""
    t = tpl.items[j]
    out = []
    for name in t.fields:
        f = FIELDS[name]
        if f.indexed:
            _off, before = t.fields[name]
            out.append(before + bytes(digits(f, np.array([i]))[0]).decode())
    return t.topic, out


__all__ = ["SHAPES", "BENCH_EPOCH_MS", "FIELDS", "Templates", "templates", "shape_messages",
           "digits", "topic_name", "index_tokens", "bench_config"]
