"""Broker rules, each written down once: what dispatch derives from a record.

Today: tagsCode (spec §6.1: the TAGS hash, or the delivery time for SCHEDULE_TOPIC_XXXX)
and the delay levels it reads. Phase B of issue 13 brings the other rules here (which
records get a ConsumeQueue unit, queue-offset advance, index keys), each with its scalar
and numpy form side by side.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..errors import InputError
from .hashing import java_hash

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
