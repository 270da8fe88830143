"""UNIQ_KEY, the client message id, taken apart (spec §5.2, RocketMQ's MessageClientIDSetter).

Bytes (shown as 32 or 56 uppercase hex characters): client IP (4 or 16 bytes), the low 16
bits of the process id, the class loader's hashCode (i32), milliseconds since the start of
the producer's month in its local zone (read unsigned), and a 16-bit counter.

The month is not in the id. RocketMQ guesses it from "now"; offline we take the record's
store time instead: the id was made before the record was stored, so the month is the
latest one in which ``month start + span`` is not after the store time (a day of slack
absorbs clock skew and a wrong zone guess). The producer's zone is not stored either:
the caller chooses it (``--tz``, ``RMQSTORE_TZ``, UTC), and a wrong guess shifts the time by
the zones' difference.
"""

from __future__ import annotations

import datetime as _dt
import re

from .format.message import Host
from .times import resolve_tz

#: The slack of the month guess: an id may name a time up to a day after the store time.
SLACK_MS = 24 * 3600 * 1000
_month_cache: dict = {}


def _month_starts(ref_ms: int, tz) -> tuple[int, int, int]:
    """Epoch ms of the start of the month holding ``ref_ms`` in ``tz`` and of the two
    before it (cached per quarter hour: zone offsets are whole quarter hours)."""
    key = (ref_ms // 900_000, tz)
    got = _month_cache.get(key)
    if got is None:
        when = (_dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
                + _dt.timedelta(milliseconds=ref_ms)).astimezone(tz)
        y, m = when.year, when.month
        out = []
        for _ in range(3):
            start = _dt.datetime(y, m, 1, tzinfo=tz)
            out.append(int(start.timestamp() * 1000))
            y, m = (y, m - 1) if m > 1 else (y - 1, 12)
        if len(_month_cache) > 4096:
            _month_cache.clear()
        got = _month_cache[key] = tuple(out)
    return got


_HEX = re.compile(r"[0-9A-Fa-f]+")
_prefix_cache: dict[str, tuple[str, int, int]] = {}


def _prefix(fixed: str) -> tuple[str, int, int]:
    """(ip, pid, classLoaderHash) of the part a producer process repeats in every id."""
    got = _prefix_cache.get(fixed)
    if got is None:
        raw = bytes.fromhex(fixed)
        ip_len = len(raw) - 6
        got = (str(Host(raw[:ip_len], 0)).rsplit(":", 1)[0].strip("[]"),
               int.from_bytes(raw[ip_len:ip_len + 2], "big"),
               int.from_bytes(raw[ip_len + 2:], "big", signed=True))
        if len(_prefix_cache) > 4096:
            _prefix_cache.clear()
        _prefix_cache[fixed] = got
    return got


def uniq_key_info(uniq_key: str | None, ref_ms: int | None = None, tz=None) -> dict | None:
    """``{"ip", "pid", "classLoaderHash", "time", "counter"}`` for a UNIQ_KEY, or None when it
    is absent or not an id of that shape. ``time`` (epoch ms) needs ``ref_ms``, the record's
    store time; it is None without one."""
    if not uniq_key or len(uniq_key) not in (32, 56) or not _HEX.fullmatch(uniq_key):
        return None
    n = len(uniq_key)
    ip, pid, loader = _prefix(uniq_key[:n - 12])
    span = int(uniq_key[n - 12:n - 4], 16)  # unsigned: it wraps after ~24.8 days (spec §5.2)
    time = None
    if ref_ms is not None:
        zone = tz if isinstance(tz, _dt.tzinfo) else resolve_tz(tz)
        try:
            starts = _month_starts(ref_ms, zone)
        except (OverflowError, OSError, ValueError):
            starts = ()
        for start in starts:
            if start + span <= ref_ms + SLACK_MS:
                time = start + span
                break
    return {"ip": ip, "pid": pid, "classLoaderHash": loader, "time": time,
            "counter": int(uniq_key[n - 4:], 16)}


def month_starts(ref_ms, tz=None):
    """For many store times at once: (starts, count), ``starts[i]`` the month starts
    :func:`uniq_key_info` tries for a record stored at ``ref_ms[i]``, latest first, and
    ``count[i]`` how many there are (3, or 0 where the time cannot be placed in a month).
    The rule is :func:`uniq_key_info`'s: one cached answer per quarter hour."""
    import numpy as np

    zone = tz if isinstance(tz, _dt.tzinfo) else resolve_tz(tz)
    ref = np.asarray(ref_ms, dtype=np.int64)
    starts = np.zeros((len(ref), 3), np.int64)
    count = np.zeros(len(ref), np.int64)
    if not len(ref):
        return starts, count
    quarter, first, inverse = np.unique(ref // 900_000, return_index=True, return_inverse=True)
    table = np.zeros((len(quarter), 3), np.int64)
    got = np.zeros(len(quarter), np.int64)
    for k, i in enumerate(first.tolist()):
        try:
            table[k] = _month_starts(int(ref[i]), zone)
            got[k] = 3
        except (OverflowError, OSError, ValueError):
            pass
    inverse = inverse.reshape(-1)
    return table[inverse], got[inverse]


__all__ = ["SLACK_MS", "month_starts", "uniq_key_info"]
