"""What a put reports back: :class:`PutStatus` (spec §3.6), :class:`PutResult` for one
message, :class:`PutResults` for a batch (made on first use), and :class:`Appended`, one
record as written with what dispatch needs (§9)."""

from __future__ import annotations

import enum
from collections.abc import Sequence as _SequenceABC
from dataclasses import dataclass

from ..format.message import offset_msg_id_at


class PutStatus(str, enum.Enum):
    """PutMessageStatus (spec §3.6); the 5.x spellings."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGE_CACHE_BUSY = "OS_PAGE_CACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class PutResult:
    """What a put reports back: status, where the record went, its ids.

    ``msg_id`` is the offsetMsgId (spec §5.1). A put that knows its store host's prefix
    passes ``prefix`` instead, and the id is made on first read (as the broker's
    msgIdSupplier does): a caller that never reads it does not pay for the hex text.
    """

    __slots__ = ("status", "offset", "size", "queue_offset", "store_timestamp", "_msg_id",
                 "reason", "_prefix")

    def __init__(self, status: PutStatus, offset: int = -1, size: int = 0,
                 queue_offset: int = -1, store_timestamp: int = 0, msg_id: str = "",
                 reason: str = "", *, prefix: str | None = None):
        self.status = status
        self.offset = offset  # wroteOffset: PHYSICALOFFSET of the record
        self.size = size  # wroteBytes: TOTALSIZE
        self.queue_offset = queue_offset
        self.store_timestamp = store_timestamp
        self._msg_id = msg_id if prefix is None else None
        self.reason = reason  # why a put failed, for people
        self._prefix = prefix

    @property
    def msg_id(self) -> str:
        m = self._msg_id
        if m is None:
            m = self._msg_id = offset_msg_id_at(self._prefix, self.offset)
        return m

    @msg_id.setter
    def msg_id(self, value: str) -> None:
        self._msg_id = value

    @property
    def ok(self) -> bool:
        return self.status is PutStatus.PUT_OK

    def _fields(self) -> tuple:
        return (self.status, self.offset, self.size, self.queue_offset, self.store_timestamp,
                self.msg_id, self.reason)

    def __eq__(self, other) -> bool:
        if not isinstance(other, PutResult):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # mutable (status changes on a flush timeout), like the dataclass was

    def __repr__(self) -> str:
        return ("PutResult(status={!r}, offset={!r}, size={!r}, queue_offset={!r}, "
                "store_timestamp={!r}, msg_id={!r}, reason={!r})").format(*self._fields())


_PUT_OK = PutStatus.PUT_OK


_new_object = object.__new__


def put_ok(offset: int, size: int, queue_offset: int, store_timestamp: int,
            prefix: str) -> PutResult:
    """The PUT_OK :class:`PutResult` of the fast single put, its slots filled here:
    calling the class (type call, ``__init__`` run from C, keyword defaults) costs
    more per put. The same object in every way."""
    r = _new_object(PutResult)
    r.status = _PUT_OK
    r.offset = offset
    r.size = size
    r.queue_offset = queue_offset
    r.store_timestamp = store_timestamp
    r._msg_id = None
    r.reason = ""
    r._prefix = prefix
    return r


class PutResults(_SequenceABC):
    """The results of one batch put, made on first use (like the broker's msgIdSupplier):
    a caller that only needs the batch written does not pay for a PutResult per message.
    Behaves as a read-only list of :class:`PutResult` (the objects are kept once made)."""

    __slots__ = ("_offsets", "_sizes", "_queue_offsets", "_timestamps", "_prefixes", "_list")

    def __init__(self, offsets, sizes, queue_offsets, timestamps, prefixes):
        self._offsets, self._sizes = offsets, sizes
        self._queue_offsets, self._timestamps, self._prefixes = queue_offsets, timestamps, prefixes
        self._list = None

    def _made(self) -> list[PutResult]:
        if self._list is None:
            ok = PutStatus.PUT_OK
            self._list = [PutResult(ok, o, s, q, t, offset_msg_id_at(p, o)) for o, s, q, t, p in zip(
                self._offsets.tolist(), self._sizes.tolist(), self._queue_offsets.tolist(),
                self._timestamps, self._prefixes)]
        return self._list

    @property
    def end(self) -> int:
        """End offset of the batch's last record."""
        return int(self._offsets[-1] + self._sizes[-1])

    def __len__(self) -> int:
        return len(self._offsets)

    def __getitem__(self, i):
        return self._made()[i]

    def __iter__(self):
        return iter(self._made())

    def __eq__(self, other) -> bool:
        return list(self) == list(other) if isinstance(other, (list, tuple, PutResults)) \
            else NotImplemented

    def __repr__(self) -> str:
        return repr(self._made())


@dataclass(slots=True)
class Appended:
    """One record as written, with what dispatch needs (spec §9)."""

    offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    sys_flag: int
    store_timestamp: int
    properties: dict
