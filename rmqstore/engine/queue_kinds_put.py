"""What a 5.x store with BatchConsumeQueue topics or LMQ does to a message before it is
appended (design-14 §4.2, §4.3, §5.1): the inner-batch and LMQ refusals, and the properties
the store adds under the append lock (an inner batch's INNER_BASE = its queue offset; an LMQ
message's INNER_MULTI_QUEUE_OFFSET, WAIT put again), re-serialised as 5.x does. The rules
themselves are :mod:`rmqstore.format.rules`'; ``MessageStore._put_5x`` appends the result.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from ..files.names import shown, topic_problem
from ..format import layout as L
from ..format.message import Message, parse_properties, serialize_properties
from ..format.rules import (INNER_BASE, INNER_MULTI_DISPATCH, INNER_MULTI_QUEUE_OFFSET, WAIT,
                            gets_inner_base, inner_batch_refusal, java_split_comma, lmq_refusal,
                            lmq_wrap, lmq_wrap_applies, with_store_properties)


def _props(msg: Message):
    return parse_properties(msg.properties_text) if msg.properties_text is not None \
        else msg.properties


def refusal(kinds, msg: Message) -> str | None:
    """Why the store refuses ``msg`` (``DefaultMessageStore``'s inner-batch checks, the LMQ
    names it cannot dispatch), or None."""
    props = _props(msg)
    batch_cq = msg.topic in kinds.batch_topics
    return inner_batch_refusal(msg.sys_flag, props, batch_cq) or lmq_refusal(
        msg.topic, props, batch_cq, enable_lmq=kinds.enable_lmq,
        multi_dispatch=kinds.multi_dispatch) or _unsafe_lmq_names(msg.topic, props, kinds)


def _unsafe_lmq_names(topic: str, props, kinds) -> str | None:
    """Why a queue LMQ would dispatch the message to cannot be a ``consumequeue/``
    directory, or None (a name holding '/' is skipped by dispatch, design-14 §5.2)."""
    if not kinds.multi_dispatch or not lmq_wrap_applies(topic, props, enable_lmq=kinds.enable_lmq):
        return None
    for n in java_split_comma(props[INNER_MULTI_DISPATCH]):
        why = topic_problem(n)
        if why is not None and "/" not in n:
            return (f"{INNER_MULTI_DISPATCH} names queue {shown(n)}, which cannot be a "
                    f"directory name ({why})")
    return None


def with_store_properties_5x(kinds, msg: Message,
                             next_offset: Callable[[str, int], int]) -> tuple[Message, tuple]:
    """(``msg`` with what the store adds to its properties, the ``%LMQ%`` queues whose
    offsets advance once it is appended). Called under the append lock: ``next_offset``
    gives a queue's next offset."""
    props = _props(msg)
    batch_cq = msg.topic in kinds.batch_topics
    wrap = lmq_wrap(msg.topic, props, lambda n: next_offset(n, 0), enable_lmq=kinds.enable_lmq)
    added, move, bump = [], (), ()
    if gets_inner_base(msg.sys_flag, batch_cq):
        added.append((INNER_BASE, str(next_offset(msg.topic, msg.queue_id))))
    if wrap is not None:
        added.append((INNER_MULTI_QUEUE_OFFSET, wrap[0]))
        move, bump = (WAIT,), wrap[1]
    if not added:
        return msg, bump
    text = msg.properties_text
    if text is None:
        text = serialize_properties(msg.properties, True)
    text = with_store_properties(text, added, move)
    return dataclasses.replace(msg, properties_text=text, properties=parse_properties(text)), bump


def batch_refusal(kinds, msgs: Sequence[Message]) -> str | None:
    """Why a regular batch is refused in a store with BatchCQ topics or LMQ, or None:
    an inner batch is one record of its own (put it alone), and the batch path adds
    no INNER_MULTI_QUEUE_OFFSET (``encodeBatch`` @5.x), so a message LMQ would dispatch
    is put alone too (design-14 §4.3, §5.1)."""
    for m in msgs:
        props = _props(m)
        batch_cq = m.topic in kinds.batch_topics
        why = inner_batch_refusal(m.sys_flag, props, batch_cq) or lmq_refusal(
            m.topic, props, batch_cq, enable_lmq=kinds.enable_lmq,
            multi_dispatch=kinds.multi_dispatch)
        if why is not None:
            return why
        if m.sys_flag & L.SYSFLAG_INNER_BATCH:
            return "an inner batch is one record: put it alone, not in a batch"
        if lmq_wrap_applies(m.topic, props, enable_lmq=kinds.enable_lmq):
            return "a message LMQ dispatches is put alone, not in a batch"
    return None
