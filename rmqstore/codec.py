"""Message <-> bytes, and the small encodings around a message.

Properties text (spec §3.4), hosts, offsetMsgId (§5.1), Java ``String.hashCode`` and the
index hash (§0, §7.2), tagsCode (§6.1) and the body CRC (§3.2). Record bytes are packed and
unpacked with the ``struct`` forms derived in :mod:`rmqstore.layout`; the ``construct``
schema there is the reference they are tested against.
"""

from __future__ import annotations

import ipaddress
import zlib
from dataclasses import dataclass, field
from typing import Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from . import layout as L
from .errors import InputError, RecordError

# --- hashes and checksums ----------------------------------------------------------------


def java_hash(s: str) -> int:
    """Java ``String.hashCode``: over UTF-16 code units, as a signed int32 (spec §0)."""
    b = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(b), 2):
        h = (31 * h + ((b[i] << 8) | b[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


_POW31 = np.ones(1, dtype=np.uint64)


def _pow31(n: int) -> np.ndarray:
    """31**k mod 2**32 for k < n, as uint64 (grown and cached)."""
    global _POW31
    if len(_POW31) < n:
        p = np.empty(max(n, 2 * len(_POW31)), dtype=np.uint64)
        p[0] = 1
        for k in range(1, len(p)):  # only grows to the longest key seen
            p[k] = (int(p[k - 1]) * 31) & 0xFFFFFFFF
        _POW31 = p
    return _POW31[:n]


def java_hash_many(strings: Sequence[str]) -> np.ndarray:
    """``java_hash`` of many strings at once (int32 array), without a per-unit loop."""
    n = len(strings)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    encoded = [s.encode("utf-16-be", "surrogatepass") for s in strings]
    lengths = np.fromiter((len(b) >> 1 for b in encoded), dtype=np.int64, count=n)
    units = np.frombuffer(b"".join(encoded), dtype=">u2").astype(np.uint64)
    if units.size == 0:
        return np.zeros(n, dtype=np.int32)
    ends = np.cumsum(lengths)
    owner = np.repeat(np.arange(n), lengths)
    exponent = ends[owner] - 1 - np.arange(units.size)
    terms = (units * _pow31(int(lengths.max()))[exponent]) & np.uint64(0xFFFFFFFF)
    sums = np.zeros(n, dtype=np.uint64)
    np.add.at(sums, owner, terms)
    return (sums & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32)


def index_hash(key: str) -> int:
    """Non-negative IndexFile hash of ``topic#key``; MIN_VALUE maps to 0 (spec §7.2)."""
    h = java_hash(key)
    return 0 if h == -(2**31) else abs(h)


def index_hash_many(keys: Sequence[str]) -> np.ndarray:
    h = java_hash_many(keys).astype(np.int64)
    h = np.abs(h)
    h[h == 2**31] = 0
    return h.astype(np.int32)


def body_crc(body: bytes) -> int:
    """BODYCRC: CRC-32 masked to 31 bits; 0 for an empty body (spec §0, §3.2)."""
    return zlib.crc32(body) & 0x7FFFFFFF if body else 0


# --- properties (spec §3.4) --------------------------------------------------------------


def parse_properties(text: str) -> dict[str, str]:
    """Properties map exactly as RocketMQ 4.9.1+/5.x parse it; later names win."""
    out: dict[str, str] = {}
    if not text:
        return out
    for seg in text.split(L.PROPERTY_SEPARATOR):
        if len(seg) < 3:
            continue
        i = seg.find(L.PROPERTY_NAME_VALUE_SEPARATOR)
        if i <= 0 or i == len(seg) - 1:
            continue
        out[seg[:i]] = seg[i + 1:]
    return out


def serialize_properties(props: Mapping[str, str] | Iterable[tuple[str, str]],
                         trailing: bool = False) -> str:
    """``name\\x01value\\x02`` per pair in the given order; None values are skipped."""
    # duck-typed: an isinstance check against the Mapping ABC costs more than the join
    items = props.items() if hasattr(props, "items") else props
    parts = [f"{k}\x01{v}" for k, v in items if v is not None]
    text = "\x02".join(parts)
    return text + "\x02" if trailing and text else text


def properties_need_text(props: Mapping[str, str], text: str) -> bool:
    """True when ``props`` (parsed from ``text``) cannot reproduce ``text`` under either
    separator convention.

    Parsing only ever loses information by dropping a malformed segment or by a later
    duplicate replacing an earlier one; either way fewer names come out than segments
    went in. So counting segments decides it without re-serialising."""
    if not text:
        return False
    segments = text.count(L.PROPERTY_SEPARATOR) + 1
    if text.endswith(L.PROPERTY_SEPARATOR):
        segments -= 1  # the 0x02 some versions end with (spec §3.4)
    return segments != len(props)


def split_keys(keys: str | None) -> list[str]:
    """KEYS tokens as the index sees them: Java ``split(" ")``, empty tokens dropped."""
    return [k for k in keys.split(" ") if k] if keys else []


# --- hosts and ids (spec §3.2, §5.1) -----------------------------------------------------


class Host(NamedTuple):
    """A socket address as stored: 4 or 16 address bytes and a port."""

    address: bytes
    port: int

    @property
    def is_v6(self) -> bool:
        return len(self.address) == 16

    def __str__(self) -> str:
        if self.is_v6:
            # Java's Inet6Address text: eight groups, lowercase, no zero compression.
            groups = ":".join(format(int.from_bytes(self.address[i:i + 2], "big"), "x")
                              for i in range(0, 16, 2))
            return f"[{groups}]:{self.port}"
        return f"{'.'.join(str(b) for b in self.address)}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> "Host":
        """``ip:port`` or ``[v6]:port``; an IPv4-mapped v6 address is stored as IPv4."""
        text = text.strip().lstrip("/")
        try:
            if text.startswith("["):
                addr_text, _, port_text = text[1:].partition("]:")
            else:
                addr_text, _, port_text = text.rpartition(":")
            ip = ipaddress.ip_address(addr_text)
            port = int(port_text)
        except ValueError:
            raise InputError(f"not a host address 'ip:port' or '[ipv6]:port': {text!r}") from None
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return cls(ip.packed, port)


def offset_msg_id(store_host: Host, physical_offset: int) -> str:
    """offsetMsgId: store address + port + physical offset, uppercase hex (spec §5.1)."""
    return (store_host.address + store_host.port.to_bytes(4, "big", signed=True)
            + physical_offset.to_bytes(8, "big", signed=True)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[Host, int]:
    """(store host, physical offset) from an offsetMsgId of 32 or 56 hex characters."""
    text = msg_id.strip()
    if len(text) not in (32, 56):
        raise InputError(f"offsetMsgId must have 32 or 56 hex characters, got {len(text)}: {text!r}")
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise InputError(f"offsetMsgId is not hexadecimal: {text!r}") from None
    alen = 4 if len(raw) == 16 else 16
    port = int.from_bytes(raw[alen:alen + 4], "big", signed=True)
    return Host(raw[:alen], port), int.from_bytes(raw[alen + 4:], "big", signed=True)


# --- tagsCode (spec §6.1) ----------------------------------------------------------------

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str = DEFAULT_DELAY_LEVELS) -> tuple[int, ...]:
    """``messageDelayLevel`` as milliseconds; level L is element L-1."""
    out = []
    for item in text.split():
        try:
            out.append(int(item[:-1]) * _UNIT_MS[item[-1]])
        except (KeyError, ValueError):
            raise InputError(f"bad messageDelayLevel item {item!r}") from None
    return tuple(out)


def tags_code(topic: str, properties: Mapping[str, str], store_timestamp: int,
              delay_millis: Sequence[int] = parse_delay_levels()) -> int:
    """The 8-byte tagsCode dispatch writes into a ConsumeQueue unit."""
    if topic == SCHEDULE_TOPIC and "DELAY" in properties:
        try:
            level = min(int(properties["DELAY"]), len(delay_millis))
        except ValueError:
            level = 0  # Java would throw here (spec §14.12); we report tagsCode 0
        if level > 0:
            return store_timestamp + (delay_millis[level - 1] if level <= len(delay_millis) else 1000)
    tags = properties.get("TAGS")
    return java_hash(tags) if tags else 0


# --- the message -------------------------------------------------------------------------


@dataclass(slots=True)
class Message:
    """One CommitLog record, decoded, or a message to append.

    ``properties_text``, when set, is the exact stored properties text; it wins over
    ``properties`` on encode, so a decoded record re-encodes to the same bytes.
    """

    topic: str
    body: bytes = b""
    properties: dict[str, str] = field(default_factory=dict)
    queue_id: int = 0
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: Host = Host(b"\x7f\x00\x00\x01", 0)
    store_timestamp: int = 0
    store_host: Host = Host(b"\x7f\x00\x00\x01", 10911)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    queue_offset: int = 0
    commit_log_offset: int = 0
    store_size: int = 0
    body_crc: int = 0
    magic: int = L.MAGIC_V1
    properties_text: str | None = None

    @property
    def tags(self) -> str | None:
        return self.properties.get("TAGS")

    @property
    def keys(self) -> list[str]:
        return split_keys(self.properties.get("KEYS"))

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get("UNIQ_KEY")

    @property
    def transaction_type(self) -> int:
        return self.sys_flag & L.SYSFLAG_TRANSACTION_MASK

    @property
    def offset_msg_id(self) -> str:
        return offset_msg_id(self.store_host, self.commit_log_offset)

    def index_keys(self) -> list[str]:
        """Keys dispatch puts into the IndexFile for this record, in order (spec §7.3)."""
        if self.transaction_type == L.TRANSACTION_ROLLBACK:
            return []
        out = []
        if self.uniq_key is not None:
            out.append(f"{self.topic}#{self.uniq_key}")
        out.extend(f"{self.topic}#{k}" for k in self.keys)
        return out


def _host_bits(born: Host, store: Host) -> int:
    return (L.SYSFLAG_BORNHOST_V6 if born.is_v6 else 0) | (L.SYSFLAG_STOREHOST_V6 if store.is_v6 else 0)


def encode_record(msg: Message, *, trailing_separator: bool = False) -> bytes:
    """Record bytes for ``msg`` exactly as the broker lays them out (spec §3.1).

    The host bits of SYSFLAG follow the host widths; TOTALSIZE, the lengths and BODYCRC
    are computed. QUEUEOFFSET and PHYSICALOFFSET are taken from the message as they are.
    """
    sys_flag = (msg.sys_flag & ~(L.SYSFLAG_BORNHOST_V6 | L.SYSFLAG_STOREHOST_V6)) | _host_bits(
        msg.born_host, msg.store_host)
    topic = msg.topic.encode("utf-8", "replace")
    text = msg.properties_text
    if text is None:
        text = serialize_properties(msg.properties, trailing_separator)
    props = text.encode("utf-8", "replace")
    magic = msg.magic
    if len(topic) > 127 or magic == L.MAGIC_V2:
        magic = L.MAGIC_V2
    key = (msg.born_host.is_v6, msg.store_host.is_v6)
    total = L.RECORD_FIXED_SIZE[key] + len(msg.body) + (2 if magic == L.MAGIC_V2 else 1) + len(topic) + 2 + len(props)
    head = L.RECORD_FIXED_STRUCT[key].pack(
        total, magic, body_crc(msg.body), msg.queue_id, msg.flag, msg.queue_offset,
        msg.commit_log_offset, sys_flag, msg.born_timestamp, msg.born_host.address,
        msg.born_host.port, msg.store_timestamp, msg.store_host.address, msg.store_host.port,
        msg.reconsume_times, msg.prepared_transaction_offset, len(msg.body))
    tlen = len(topic).to_bytes(2 if magic == L.MAGIC_V2 else 1, "big")
    return b"".join((head, msg.body, tlen, topic, len(props).to_bytes(2, "big"), props))


def decode_record(buf, pos: int = 0, *, limit: int | None = None, path=None,
                  base: int = 0, check_crc: bool = False) -> Message:
    """Decode the message record at ``pos`` of ``buf`` (spec §3.9 rules).

    Raises :class:`RecordError` naming ``path`` and the absolute offset ``base + pos``.
    """
    end = len(buf) if limit is None else limit
    where = base + pos

    def bad(why: str) -> RecordError:
        return RecordError(why, path, where)

    if end - pos < 8:
        raise bad(f"only {max(end - pos, 0)} bytes left, too few for a record")
    total, magic = L.BLANK_STRUCT.unpack_from(buf, pos)
    if magic == L.MAGIC_BLANK:
        raise bad("BLANK end-of-segment record, not a message")
    if magic not in L.MESSAGE_MAGICS:
        raise bad(f"bad magic 0x{magic & 0xFFFFFFFF:08X}")
    if total <= 0 or total > end - pos:
        raise bad(f"record size {total} does not fit the {end - pos} bytes left")
    sys_flag = int.from_bytes(buf[pos + 36:pos + 40], "big", signed=True)
    key = (bool(sys_flag & L.SYSFLAG_BORNHOST_V6), bool(sys_flag & L.SYSFLAG_STOREHOST_V6))
    fixed = L.RECORD_FIXED_SIZE[key]
    if total < fixed + 3:
        raise bad(f"record size {total} is below the {fixed + 3}-byte minimum")
    (_, _, crc, queue_id, flag, queue_offset, physical_offset, _, born_ts, born_addr,
     born_port, store_ts, store_addr, store_port, reconsume, prepared,
     body_len) = L.RECORD_FIXED_STRUCT[key].unpack_from(buf, pos)
    p = pos + fixed
    stop = pos + total
    blen = max(body_len, 0)
    if p + blen > stop:
        raise bad(f"body length {body_len} runs past the record end")
    body = bytes(buf[p:p + blen])
    p += blen
    tsize = 2 if magic == L.MAGIC_V2 else 1
    if p + tsize > stop:
        raise bad("topic length runs past the record end")
    tlen = int.from_bytes(buf[p:p + tsize], "big", signed=True)
    p += tsize
    if tlen < 0 or p + tlen + 2 > stop:
        raise bad(f"topic length {tlen} runs past the record end")
    topic = bytes(buf[p:p + tlen]).decode("utf-8", "replace")
    p += tlen
    plen = int.from_bytes(buf[p:p + 2], "big", signed=True)
    p += 2
    plen = max(plen, 0)
    if p + plen != stop:
        raise bad(f"lengths add up to {p + plen - pos} bytes but the record says {total}")
    text = bytes(buf[p:p + plen]).decode("utf-8", "replace")
    if check_crc and body_crc(body) != crc:
        raise bad(f"body CRC mismatch: stored {crc}, computed {body_crc(body)}")
    return Message(
        topic=topic, body=body, properties=parse_properties(text), queue_id=queue_id,
        flag=flag, sys_flag=sys_flag, born_timestamp=born_ts,
        born_host=Host(born_addr, born_port), store_timestamp=store_ts,
        store_host=Host(store_addr, store_port), reconsume_times=reconsume,
        prepared_transaction_offset=prepared, queue_offset=queue_offset,
        commit_log_offset=physical_offset, store_size=total, body_crc=crc, magic=magic,
        properties_text=text)


def encode_batch_entry(body: bytes, properties_text: str, flag: int = 0) -> bytes:
    """One entry of a batch-send body (spec §3.7): MAGIC and BODYCRC are 0."""
    props = properties_text.encode("utf-8")
    return L.BatchEntry.build(dict(magic=0, body_crc=0, flag=flag, body=body, properties=props))
