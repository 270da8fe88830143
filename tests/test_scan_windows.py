"""Scanning a segment a window at a time (scan.scan_windows, used by reader.iter_selected
so `dump` streams in bounded memory): the same records and the same end as the whole-
segment scan, on RocketMQ's own stores (incl. torn ones), and pages let go as it goes."""

from __future__ import annotations

import os

import pytest

from conftest import MESSAGE_SCENARIOS, ROCKETMQ_498, SCENARIOS, manifest, scenario_params
from rmqstore.files.commitlog import CommitLog
from rmqstore.files.config import load_config
from rmqstore.reader import iter_selected, open_store
from rmqstore.scan.records import scan_buffer, scan_windows


def _windows(seg, window):
    pos, stops, end = [], [], None
    for w in scan_windows(seg.buffer(), seg.start, seg.readable_size, window=window):
        pos += w.records.pos.tolist()
        stops.append(w.stop)
        end = w.end
    return pos, stops, end


@pytest.mark.parametrize("scenario", scenario_params(SCENARIOS))
@pytest.mark.parametrize("window", [1, 1000, 1 << 16])
def test_windows_find_what_the_whole_scan_finds(scenario, window):
    with CommitLog(load_config(ROCKETMQ_498 / scenario)) as cl:
        for seg in cl.segments:
            whole = scan_buffer(seg.buffer(), seg.start, seg.readable_size)
            pos, stops, end = _windows(seg, window)
            assert pos == whole.records.pos.tolist()
            assert (stops[-1], end) == (whole.stop, whole.end)
            assert set(stops[:-1]) <= {"range"}


@pytest.mark.parametrize("scenario", scenario_params(MESSAGE_SCENARIOS))
def test_small_windows_give_every_stored_message(scenario, monkeypatch):
    import rmqstore.scan.records as S

    monkeypatch.setattr(S, "WINDOW", 777)  # the reader's windows: many a segment
    stored = sorted(e["stored"]["phyOffset"] for e in manifest(scenario)["messages"])
    with open_store(ROCKETMQ_498 / scenario) as store:
        got = [int(o) for cols, keep in iter_selected(store.commitlog)
               for o in cols.offset[keep].tolist()]
    assert got == stored


def _rss_file_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1])
    raise AssertionError("no RssFile in /proc/self/status")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_reading_a_big_segment_keeps_only_a_window_resident(tmp_path):
    """A 128 MiB segment walked to the end: file pages mapped by this process stay near
    one window (8 MiB), where keeping the map would hold all 128 MiB."""
    from rmqstore import bench as B

    g = B.make_store(tmp_path / "s", 128 << 20, segment_size=128 << 20, queues_and_index=False)
    with open_store(g.root) as store:
        before = _rss_file_kib()
        peak, records = before, 0
        for cols, keep in iter_selected(store.commitlog):
            records += len(keep)
            cols.queue_id  # gather something, as dump does
            peak = max(peak, _rss_file_kib())
    assert records == g.messages
    assert peak - before < 40 * 1024, f"{(peak - before) // 1024} MiB of the store stayed mapped"
