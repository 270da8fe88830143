"""A message and the small encodings around it: properties text (spec §3.4), hosts and
offsetMsgId (§3.2, §5.1), and :class:`Message`, one record decoded or one to append.

Record bytes are :mod:`rmqstore.format.record`'s business; the Java hashes are in
:mod:`rmqstore.format.hashing`, broker rules such as tagsCode in :mod:`rmqstore.format.rules`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Iterable, Mapping, NamedTuple

import numpy as np

from ..errors import InputError
from . import layout as L

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


def without_prop_crc(text: str) -> str:
    """The properties text a 5.2+ writer with ``enabledAppendPropCRC`` appends its
    ``__CRC32#`` entry to (spec §3.8, ``MessageUtils#deleteProperty``): every
    ``__CRC32#\\x01value\\x02`` pair the client sent removed as text (no re-serialising),
    and one separator added when the text is not empty and does not end in one."""
    name = L.PROP_CRC_NAME.decode() + L.PROPERTY_NAME_VALUE_SEPARATOR
    at = 0
    while True:
        i = text.find(name, at)
        if i < 0:
            break
        if i and text[i - 1] != L.PROPERTY_SEPARATOR:
            at = i + 1  # inside another pair's value
            continue
        j = text.find(L.PROPERTY_SEPARATOR, i)
        text = text[:i] + ("" if j < 0 else text[j + 1:])
        at = i
    if text and not text.endswith(L.PROPERTY_SEPARATOR):
        text += L.PROPERTY_SEPARATOR
    return text


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


def offset_msg_id_prefix(store_host: Host) -> str:
    """The store-host half of an offsetMsgId (spec §5.1): address + i32 port as uppercase
    hex. Writers keep it per host and finish ids with :func:`offset_msg_id_at`."""
    return L.OFFSET_MSG_ID_HOST_STRUCT[store_host.is_v6].pack(*store_host).hex().upper()


def offset_msg_id_at(prefix: str, physical_offset: int) -> str:
    """The offsetMsgId of ``physical_offset`` from its store host's
    :func:`offset_msg_id_prefix`: the i64 offset appended as uppercase hex (spec §5.1)."""
    return prefix + L.OFFSET_MSG_ID_OFFSET_STRUCT.pack(physical_offset).hex().upper()


def offset_msg_id(store_host: Host, physical_offset: int) -> str:
    """offsetMsgId: store address + port + physical offset, uppercase hex (spec §5.1)."""
    return L.OFFSET_MSG_ID_STRUCT[store_host.is_v6].pack(
        store_host.address, store_host.port, physical_offset).hex().upper()


def is_offset_msg_id(text: str) -> bool:
    """Whether ``text`` has an offsetMsgId's shape: 32 or 56 hex digits, either case."""
    return (len(text) in L.OFFSET_MSG_ID_HEX_LENGTHS
            and all(c in "0123456789ABCDEFabcdef" for c in text))


def decode_offset_msg_id(msg_id: str) -> tuple[Host, int]:
    """(store host, physical offset) from an offsetMsgId of 32 or 56 hex characters."""
    text = msg_id.strip()
    v6 = L.OFFSET_MSG_ID_HEX_LENGTHS.get(len(text))
    if v6 is None:
        raise InputError(f"offsetMsgId must have 32 or 56 hex characters, got {len(text)}: {text!r}")
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise InputError(f"offsetMsgId is not hexadecimal: {text!r}") from None
    if len(raw) != L.OFFSET_MSG_ID_SIZE[v6]:  # fromhex skips spaces: "C0A8 0064 …"
        raise InputError(f"offsetMsgId is not hexadecimal: {text!r}")
    address, port, offset = L.OFFSET_MSG_ID_STRUCT[v6].unpack(raw)
    return Host(address, port), offset


def client_msg_id(ip: bytes, pid: int, loader_hash: int, span: int, counter: int) -> str:
    """The UNIQ_KEY text of a client message id (spec §5.2): ip, pid (u16), class-loader
    hash (u32), ms since the start of the month (unsigned i32), counter (u16), as
    uppercase hex (``rmqstore.uniqkey`` takes it apart)."""
    return (ip + (pid & 0xFFFF).to_bytes(2, "big") + loader_hash.to_bytes(4, "big")
            + (span & 0xFFFFFFFF).to_bytes(4, "big")
            + (counter & 0xFFFF).to_bytes(2, "big")).hex().upper()


#: ASCII of the uppercase hex digits (offsetMsgId and UNIQ_KEY texts), by value.
HEX_DIGITS = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)


def offset_msg_ids(address: np.ndarray, port: np.ndarray, v6: np.ndarray,
                   physical_offset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`offset_msg_id` of many records at once: ``address`` is (n, 16) bytes (an IPv4
    address in the first 4), ``port``, ``v6`` (is the store host IPv6) and
    ``physical_offset`` have one entry per record. Returns (offsets, data): id ``i`` is the
    ASCII ``data[offsets[i]:offsets[i + 1]]`` (an Arrow string array's buffers)."""
    n = len(physical_offset)
    v6 = np.asarray(v6, dtype=bool)
    hex_len = np.where(v6, 2 * L.OFFSET_MSG_ID_SIZE[True], 2 * L.OFFSET_MSG_ID_SIZE[False])
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(hex_len, out=offsets[1:])
    data = np.empty(int(offsets[-1]), np.uint8)
    for wide, sel in ((False, np.flatnonzero(~v6)), (True, np.flatnonzero(v6))):
        if len(sel) == 0:
            continue
        dtype = L.OFFSET_MSG_ID_DTYPE[wide]
        rows = np.empty(len(sel), dtype)
        rows["address"] = address[sel, :dtype["address"].shape[0]]
        rows["port"] = port[sel]
        rows["physical_offset"] = physical_offset[sel]
        raw = rows.view(np.uint8).reshape(len(sel), dtype.itemsize)
        hexed = np.empty((len(sel), 2 * dtype.itemsize), np.uint8)
        hexed[:, 0::2] = HEX_DIGITS[raw >> 4]
        hexed[:, 1::2] = HEX_DIGITS[raw & 15]
        data[offsets[sel][:, None] + np.arange(hexed.shape[1])] = hexed
    return offsets, data


# --- the message -------------------------------------------------------------------------


class InnerBatch(NamedTuple):
    """Where an unwrapped message sat in its inner-batch record (design-14 §4.3)."""

    index: int  # 0-based place in the batch
    count: int  # entries in the record's body
    entry_size: int  # the entry's totalSize
    record_crc_ok: bool  # the record's body matches its BODYCRC


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
    #: Set on a message unwrapped from an inner-batch record (design-14 §4.3): its place in
    #: the batch; the other fields not from the entry are the record's.
    inner_batch: "InnerBatch | None" = None

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
        from .rules import index_keys  # rules reads message's split_keys

        return index_keys(self.topic, self.uniq_key, self.properties.get("KEYS"), self.sys_flag)
