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


@pytest.fixture(scope="module")
def big_segment(tmp_path_factory):
    """A store whose one segment is 256 MiB, 32 MiB of records and a hole after them."""
    from rmqstore.bench_data import make_store

    return make_store(tmp_path_factory.mktemp("head") / "s", 32 << 20, segment_size=256 << 20,
                      queues_and_index=False)


def test_a_head_read_walks_only_the_windows_it_needs(big_segment, monkeypatch, walk_spans):
    """dump -n 5's scan: the bytes the record walk is asked to cover (every window it
    opens) stay near what the 5 records take, not a window of 8 MiB or the segment."""
    import rmqstore.scan.records as S
    from rmqstore.selection import MessageFilter

    asked = walk_spans
    with open_store(big_segment.root) as store:
        got = list(store.scan(MessageFilter.make(limit=5)).messages())
    assert [m.commit_log_offset for m in got] == big_segment.positions[:5].tolist()
    assert sum(asked) <= 128 * 1024, asked
    # Without a limit the windows grow to WINDOW and the walk covers the data once.
    asked.clear()
    with open_store(big_segment.root) as store:
        n = sum(len(keep) for _cols, keep in store.scan(MessageFilter()).chunks())
    assert n == big_segment.messages
    assert max(asked) == S.WINDOW and sum(asked) < (32 << 20) + 2 * S.WINDOW


_RUSAGE = ("import resource, runpy, sys; sys.argv = ['rmqstore'] + sys.argv[1:]\n"
           "try:\n    runpy.run_module('cli.main', run_name='__main__')\n"
           "except SystemExit as e:\n    code = e.code\n"
           "r = resource.getrusage(resource.RUSAGE_SELF)\n"
           "print('rusage', r.ru_minflt, r.ru_maxrss, file=sys.stderr)\n"
           "sys.exit(code)\n")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux getrusage")
def test_dump_head_of_a_big_segment_costs_what_a_get_costs(big_segment):
    """`rmqstore dump -n 5` in a process of its own: page faults and peak RSS next to
    `rmqstore get` of the first record in the same store (same imports, one record read).
    The difference is the data the dump touched: far below one 8 MiB window (2048 pages)."""
    import subprocess
    import sys

    from conftest import REPO

    def rusage(*args):
        out = subprocess.run([sys.executable, "-c", _RUSAGE, *args, "--format", "jsonl"],
                             capture_output=True, text=True, cwd=REPO, timeout=120)
        assert out.returncode == 0, out.stderr[-1000:]
        faults, rss = out.stderr.rsplit("rusage ", 1)[1].split()[:2]
        return int(faults), int(rss), out.stdout

    root = str(big_segment.root)
    dump_faults, dump_rss, text = rusage("dump", root, "-n", "5")
    get_faults, get_rss, _ = rusage("get", root, "--offset", "0")
    assert len(text.splitlines()) == 5
    assert dump_faults - get_faults < 512, (dump_faults, get_faults)  # 2 MiB of pages
    assert dump_rss - get_rss < 6 * 1024, (dump_rss, get_rss)  # KiB; one window is 8 MiB
