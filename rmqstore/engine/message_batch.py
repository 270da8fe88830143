"""One regular batch (spec §3.7) given as columns instead of Message objects:
:class:`MessageBatch`, what :meth:`rmqstore.engine.store.MessageStore.put_columns` takes."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..format.message import Host, Message, parse_properties

_DEFAULT_BORN = Message.__dataclass_fields__["born_host"].default
_DEFAULT_STORE = Message.__dataclass_fields__["store_host"].default


def is_scalar(v) -> bool:
    """One value for every message (not a column)."""
    return isinstance(v, (int, np.integer))


@dataclass
class MessageBatch:
    """One regular batch as columns. Each numeric field is a scalar (every message) or a
    sequence/array with one value per message.

    ``properties`` maps names, in order, to a ``str`` (every message) or a sequence with
    one ``str`` or ``None`` (no such property) per message; ``properties_texts`` instead
    gives each message's stored text (then ``properties`` must be empty). ``bodies`` is a
    sequence of bytes, or one ``bytes`` blob cut at ``body_offsets`` (n + 1 offsets).
    ``topic`` is one topic or one per message.
    """

    topic: str | Sequence[str]
    bodies: Sequence[bytes] | bytes
    queue_ids: int | Sequence[int] = 0
    properties: Mapping[str, Any] = field(default_factory=dict)
    properties_texts: Sequence[str] | None = None
    body_offsets: Sequence[int] | None = None
    flag: int | Sequence[int] = 0
    sys_flag: int | Sequence[int] = 0
    born_timestamp: int | Sequence[int] = 0
    store_timestamp: int | Sequence[int] = 0
    reconsume_times: int | Sequence[int] = 0
    prepared_transaction_offset: int | Sequence[int] = 0
    born_host: Host = _DEFAULT_BORN
    store_host: Host = _DEFAULT_STORE

    def __post_init__(self):
        if isinstance(self.bodies, (bytes, bytearray, memoryview)):
            if self.body_offsets is None:
                raise ValueError("a bodies blob needs body_offsets (n + 1 offsets)")
            blob = bytes(self.bodies)
            offs = np.asarray(self.body_offsets, dtype=np.int64).tolist()
            self.bodies = [blob[a:b] for a, b in zip(offs, offs[1:])]
        elif self.body_offsets is not None:
            raise ValueError("body_offsets go with a bodies blob")
        n = len(self.bodies)
        if self.properties_texts is not None:
            if self.properties:
                raise ValueError("give properties or properties_texts, not both")
            if len(self.properties_texts) != n:
                raise ValueError("properties_texts needs one text per message")
        for name, v in self.properties.items():
            if not isinstance(v, str) and len(v) != n:
                raise ValueError(f"property column {name!r} has {len(v)} values for {n} messages")
        if not isinstance(self.topic, str) and len(self.topic) != n:
            raise ValueError("topic needs one value per message")
        for name in ("queue_ids", "flag", "sys_flag", "born_timestamp", "store_timestamp",
                     "reconsume_times", "prepared_transaction_offset"):
            v = getattr(self, name)
            if not is_scalar(v) and len(v) != n:
                raise ValueError(f"{name} needs one value per message")

    def __len__(self) -> int:
        return len(self.bodies)

    def _values(self, name: str) -> list:
        v = getattr(self, name)
        n = len(self)
        return [int(v)] * n if is_scalar(v) else np.asarray(v, dtype=np.int64).tolist()

    def messages(self) -> list[Message]:
        """The equivalent messages: what :meth:`MessageStore.put_batch` would be given."""
        n = len(self)
        topics = [self.topic] * n if isinstance(self.topic, str) else list(self.topic)
        if self.properties_texts is not None:
            texts = list(self.properties_texts)
            props = [parse_properties(t) for t in texts]
        else:
            texts = [None] * n
            cols = [(k, itertools.repeat(v, n) if isinstance(v, str) else v)
                    for k, v in self.properties.items()]
            names = [k for k, _ in cols]
            rows = zip(*[c for _, c in cols]) if cols else itertools.repeat((), n)
            props = [{k: v for k, v in zip(names, row) if v is not None} for row in rows]
        fields = [self._values(f) for f in ("queue_ids", "flag", "sys_flag", "born_timestamp",
                                            "store_timestamp", "reconsume_times",
                                            "prepared_transaction_offset")]
        return [Message(topic=t, body=b if b is not None else b"", properties=p, queue_id=q,
                        flag=fl, sys_flag=sf, born_timestamp=bt, store_timestamp=st,
                        reconsume_times=rt, prepared_transaction_offset=pt,
                        born_host=self.born_host, store_host=self.store_host,
                        properties_text=tx)
                for t, b, p, tx, q, fl, sf, bt, st, rt, pt in zip(
                    topics, self.bodies, props, texts, *fields)]
