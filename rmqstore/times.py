"""Times in and out: one parser for every place a user or script gives a time, one formatter.

Stores keep epoch **milliseconds** (spec §0). People type seconds, milliseconds, ISO-8601
or mqadmin's ``yyyy-MM-dd#HH:mm:ss:SSS``; scripts pass ``datetime`` objects or numbers.
:func:`parse_time` turns any of them into epoch milliseconds:

* a bare number is told apart by magnitude: 10^8 <= n < 10^11 is seconds (1973..5138),
  10^11 <= n < 10^14 is milliseconds (1973..5138); ``0`` is the epoch; anything else is
  refused as ambiguous. ``<n>s`` / ``<n>ms`` say the unit outright.
* ISO-8601 with or without a zone; mqadmin's form with or without ``:SSS``;
  naive times are read in the zone of :func:`resolve_tz` (``--tz``, ``RMQSTORE_TZ``, UTC).

:func:`format_time` prints epoch milliseconds as ISO-8601 in the same zone.
"""

from __future__ import annotations

import datetime as _dt
import numbers
import os
import re

from .errors import InputError

TZ_ENV = "RMQSTORE_TZ"
UTC = _dt.timezone.utc

SECONDS_MIN, MILLIS_MIN, MILLIS_END = 10**8, 10**11, 10**14

# mqadmin's UtilAll.YYYY_MM_DD_HH_MM_SS_SSS with '#' between date and time ("yyyy-MM-dd#HH:mm:ss:SSS").
_MQADMIN = re.compile(r"^(\d{4})-(\d{2})-(\d{2})#(\d{2}):(\d{2}):(\d{2})(?::(\d{1,3}))?$")
_NUMBER = re.compile(r"^(\d+(?:\.\d+)?)(ms|s)?$")
_OFFSET = re.compile(r"^(?:UTC|GMT)?([+-])(\d{1,2})(?::?(\d{2}))?$")

_default_tz: _dt.tzinfo | None = None


def resolve_tz(tz: "str | _dt.tzinfo | None" = None) -> _dt.tzinfo:
    """A zone from a name (IANA ``Asia/Shanghai``, ``UTC``, ``local``, ``+08:00``), a
    ``tzinfo``, or, when None, :func:`set_default_tz`'s choice, else ``$RMQSTORE_TZ``, else UTC."""
    if isinstance(tz, _dt.tzinfo):
        return tz
    if tz is None:
        if _default_tz is not None:
            return _default_tz
        tz = os.environ.get(TZ_ENV) or "UTC"
    name = tz.strip()
    if name.upper() in ("UTC", "Z", "GMT"):
        return UTC
    if name.lower() == "local":
        return _dt.datetime.now().astimezone().tzinfo
    m = _OFFSET.match(name)
    if m:
        sign = -1 if m.group(1) == "-" else 1
        delta = _dt.timedelta(hours=int(m.group(2)), minutes=int(m.group(3) or 0))
        if delta > _dt.timedelta(hours=18):
            raise InputError(f"time zone offset out of range: {tz!r}")
        return _dt.timezone(sign * delta)
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InputError(f"unknown time zone {tz!r} (an IANA name such as Asia/Shanghai, "
                         "UTC, local, or an offset such as +08:00)") from None


def set_default_tz(tz: "str | _dt.tzinfo | None") -> None:
    """The zone naive input and printed times use from now on (the CLI's ``--tz``)."""
    global _default_tz
    _default_tz = None if tz is None else resolve_tz(tz)


def _from_datetime(when: _dt.datetime, tz) -> int:
    if when.tzinfo is None:
        when = when.replace(tzinfo=resolve_tz(tz))
    return int((when - _dt.datetime(1970, 1, 1, tzinfo=UTC)) // _dt.timedelta(milliseconds=1))


def _from_number(value: float, text) -> int:
    if value == 0:
        return 0
    if SECONDS_MIN <= value < MILLIS_MIN:
        return int(round(value * 1000))
    if MILLIS_MIN <= value < MILLIS_END:
        return int(value)
    if value >= MILLIS_END:
        why = "too large for epoch milliseconds (microseconds or nanoseconds?)"
    else:
        why = "too small to be a date in epoch seconds or milliseconds (before 1973)"
    raise InputError(f"ambiguous time {text!r}: {why}; write it as ISO-8601, or add 's' or 'ms'")


def parse_time(value, tz: "str | _dt.tzinfo | None" = None) -> int | None:
    """Epoch milliseconds from any accepted form (see the module docstring); None stays None.

    Raises :class:`~rmqstore.errors.InputError` (one line, no traceback) when the value is
    not a time or is ambiguous."""
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        return _from_datetime(value, tz)
    if isinstance(value, _dt.date):
        return _from_datetime(_dt.datetime(value.year, value.month, value.day), tz)
    if isinstance(value, bool):
        raise InputError(f"not a time: {value!r}")
    if isinstance(value, numbers.Real):
        if value < 0:
            raise InputError(f"not a time: {value!r} is negative")
        return _from_number(float(value) if not isinstance(value, numbers.Integral) else int(value), value)
    if not isinstance(value, str):
        raise InputError(f"not a time: {value!r} (give a datetime, epoch seconds or "
                         "milliseconds, or an ISO-8601 string)")
    text = value.strip()
    m = _NUMBER.match(text)
    if m:
        number, unit = m.group(1), m.group(2)
        if unit == "ms":
            if "." in number:
                raise InputError(f"not a time: {value!r} (milliseconds are whole numbers)")
            return int(number)
        if unit == "s":
            return int(round(float(number) * 1000))
        return _from_number(float(number) if "." in number else int(number), value)
    m = _MQADMIN.match(text)
    if m:
        y, mo, d, h, mi, s, ms = m.groups()
        try:
            when = _dt.datetime(int(y), int(mo), int(d), int(h), int(mi), int(s),
                                int(ms or 0) * 1000)  # SimpleDateFormat reads SSS as a number
        except ValueError as e:
            raise InputError(f"not a time: {value!r} ({e})") from None
        return _from_datetime(when, tz)
    iso = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    try:
        when = _dt.datetime.fromisoformat(iso)
    except ValueError:
        raise InputError(f"not a time: {value!r} (epoch seconds or milliseconds, ISO-8601 "
                         "such as 2024-06-10T08:00:00+08:00, or yyyy-MM-dd#HH:mm:ss:SSS)") from None
    return _from_datetime(when, tz)


def to_datetime(ms: int, tz: "str | _dt.tzinfo | None" = None) -> _dt.datetime:
    """Epoch milliseconds as an aware datetime in ``tz`` (default: :func:`resolve_tz`)."""
    return _dt.datetime(1970, 1, 1, tzinfo=UTC).astimezone(resolve_tz(tz)) + _dt.timedelta(milliseconds=ms)


def format_time(ms: int | None, tz: "str | _dt.tzinfo | None" = None) -> str:
    """Epoch milliseconds as ISO-8601 with milliseconds, in ``tz``: ``Z`` for UTC, else the
    offset (``2024-06-10T14:18:20.020+08:00``). Values no calendar holds print as numbers."""
    if ms is None:
        return ""
    try:
        zone = resolve_tz(tz)
        when = _dt.datetime(1970, 1, 1, tzinfo=UTC) + _dt.timedelta(milliseconds=int(ms))
        text = when.astimezone(zone).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return text[:-6] + "Z" if zone is UTC and text.endswith("+00:00") else text


__all__ = ["parse_time", "format_time", "resolve_tz", "set_default_tz", "to_datetime", "TZ_ENV"]
