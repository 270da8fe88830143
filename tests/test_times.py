"""One time parser for the CLI and the library: seconds vs milliseconds by magnitude, ISO-8601
with zones, mqadmin's yyyy-MM-dd#HH:mm:ss:SSS, datetime objects, and a chosen zone for naive
times and for display. 1700000000 s = 2023-11-14T22:13:20Z (spec §12.5 uses 1700000000000 ms)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from rmqstore import times
from rmqstore.errors import InputError

T = 1_700_000_000_000  # 2023-11-14T22:13:20.000Z


@pytest.fixture(autouse=True)
def _clean_zone(monkeypatch):
    monkeypatch.delenv(times.TZ_ENV, raising=False)
    times.set_default_tz(None)
    yield
    times.set_default_tz(None)


@pytest.mark.parametrize("given", [
    "1700000000", 1700000000, "1700000000000", T, np.int64(T), "1700000000s", "1700000000000ms",
    1700000000.0, "2023-11-14T22:13:20Z", "2023-11-14T22:13:20+00:00",
    "2023-11-15T06:13:20+08:00", "2023-11-14 22:13:20", "2023-11-14T22:13:20.000",
    "2023-11-14#22:13:20:000", "2023-11-14#22:13:20",
    dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.timezone.utc),
    dt.datetime(2023, 11, 15, 6, 13, 20, tzinfo=dt.timezone(dt.timedelta(hours=8))),
    dt.datetime(2023, 11, 14, 22, 13, 20),
])
def test_every_form_of_the_same_instant(given):
    assert times.parse_time(given) == T


def test_seconds_are_not_read_as_1970():
    # the bug of issue #12: 1700000000 read as milliseconds is 1970-01-20
    assert times.parse_time("1700000000") == 1_700_000_000 * 1000
    assert times.parse_time("1700000000.25") == 1_700_000_000_250


def test_mqadmin_format_keeps_milliseconds():
    assert times.parse_time("2023-11-14#22:13:20:123") == T + 123
    assert times.parse_time("2023-11-14#22:13:20:5") == T + 5  # Java reads SSS as a number


@pytest.mark.parametrize("bad", ["12345", "99999999", 10**14, "100000000000000000", -5, "-1700000000",
                                 "yesterday", "2023-13-01", "2023-11-14#25:00:00:000", "1.5ms", True,
                                 object()])
def test_ambiguous_or_invalid_is_refused_with_one_line(bad):
    with pytest.raises(InputError) as e:
        times.parse_time(bad)
    assert "\n" not in str(e.value)


def test_zero_and_none():
    assert times.parse_time(0) == 0 and times.parse_time("0") == 0
    assert times.parse_time(None) is None


def test_naive_times_use_the_chosen_zone(monkeypatch):
    shanghai = T - 8 * 3600 * 1000  # 22:13:20 in +08:00 is 14:13:20Z
    assert times.parse_time("2023-11-14T22:13:20", "Asia/Shanghai") == shanghai
    assert times.parse_time("2023-11-14#22:13:20:000", "+08:00") == shanghai
    assert times.parse_time(dt.datetime(2023, 11, 14, 22, 13, 20), "Asia/Shanghai") == shanghai
    monkeypatch.setenv(times.TZ_ENV, "Asia/Shanghai")
    assert times.parse_time("2023-11-14 22:13:20") == shanghai
    times.set_default_tz("UTC")  # the CLI's --tz wins over the environment
    assert times.parse_time("2023-11-14 22:13:20") == T
    # an explicit zone in the text always wins
    assert times.parse_time("2023-11-14T22:13:20Z", "Asia/Shanghai") == T


def test_format_in_the_same_zone(monkeypatch):
    assert times.format_time(T) == "2023-11-14T22:13:20.000Z"
    assert times.format_time(T + 7, "Asia/Shanghai") == "2023-11-15T06:13:20.007+08:00"
    monkeypatch.setenv(times.TZ_ENV, "-05:30")
    assert times.format_time(T) == "2023-11-14T16:43:20.000-05:30"
    assert times.format_time(None) == ""
    assert times.format_time(2**62) == str(2**62)  # beyond the calendar: the number
    assert times.parse_time(times.format_time(T + 42, "America/New_York")) == T + 42


def test_unknown_zone_is_one_line():
    with pytest.raises(InputError, match="unknown time zone"):
        times.resolve_tz("Mars/Olympus")
