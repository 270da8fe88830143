"""``spark export`` with dump's filters: the exported rows are the rows ``rmqstore dump``
prints with the same options (golden data: the fixture stores, read by dump's sequential
scan), and splits outside an offset range are not read.

Filter values come from the fixtures README and the fixtures' own records (topics, tags,
keys, UNIQ_KEYs, store times). One export per filter over three stores at once keeps the
Spark time small.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import types

import pytest
from typer.testing import CliRunner

from cli.main import app
from conftest import NO_FIXTURES, ROCKETMQ_498

if not ROCKETMQ_498.is_dir():  # every test here reads the RocketMQ-written stores
    pytest.skip(NO_FIXTURES, allow_module_level=True)

runner = CliRunner()
STORES = [str(ROCKETMQ_498 / s) for s in ("unicode", "special", "basic")]  # order: --limit
SEG = 65536  # the fixtures' CommitLog segment size
# Store times of basic's 250th and unicode's 40th record (fixture data).
SINCE_MS, UNTIL_MS = 1795321494814, 1795321507572


def _naive(ms: int, zone: dt.timezone) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, zone).replace(tzinfo=None).isoformat(timespec="milliseconds")


CASES = {
    "topic": ["--topic", "TopicB", "-t", "Topic_Uni-Code%1|x", "-t", "%RETRY%cg_special"],
    "queue-id": ["-q", "1", "--queue-id", "17"],
    "tag": ["--tag", "TagA || 태그", "--tag", "compressed"],
    "key": ["--key", "user-4", "-k", "中文键", "-k", "s-compressed"],
    "uniq-key": ["--uniq-key", "FD00000000000000000000000000000201F85FFD2B276D18428A01D6",
                 "--uniq-key", "FD00000000000000000000000000000201F85FFD2B276D18A1F10263",
                 "--uniq-key", "FD00000000000000000000000000000201F85FFD2B276D180F060001"],
    # naive times read in --tz, as dump reads them
    "since-until": ["--since", _naive(SINCE_MS, dt.timezone(dt.timedelta(hours=8))),
                    "--until", _naive(UNTIL_MS, dt.timezone(dt.timedelta(hours=8))),
                    "--tz", "+08:00"],
    # both inside records, in the second segment: the first split read starts mid-segment
    "offsets": ["--from-offset", "100001", "--to-offset", "300000"],
    "max-bytes": ["--from-offset", "30000", "--max-bytes", "50000"],
    # 80 (unicode) + 20 of special: the cut falls inside a split of the second store
    "limit": ["--limit", "100"],
    "combined": ["-t", "TopicA", "--tag", "TagB", "-k", "dup-key", "--from-offset", "70000"],
}


def _dump(args) -> list[tuple[str, int]]:
    r = runner.invoke(app, ["dump", *STORES, *args, "-f", "jsonl", "--body", "none"])
    assert r.exit_code == 0, r.output
    return [(d["store"], d["commitLogOffset"]) for d in map(json.loads, r.stdout.splitlines())]


def _export(tmp_path, args, *more) -> tuple[list[tuple[str, int]], dict]:
    import pyarrow.dataset as ds

    out = tmp_path / "out"
    r = runner.invoke(app, ["spark", "export", *STORES, "--out", str(out), "--master", "local[2]",
                            "--split-size", "20000", "-f", "json", *args, *more])
    assert r.exit_code == 0, r.output
    t = ds.dataset(str(out), format="parquet", partitioning="hive").to_table(
        columns=["store", "commitLogOffset"])
    rows = sorted(zip(t.column("store").to_pylist(), t.column("commitLogOffset").to_pylist()),
                  key=lambda x: (STORES.index(x[0]), x[1]))
    return rows, json.loads(r.stdout)


@pytest.fixture(scope="module")
def everything():
    return _dump([])


@pytest.mark.spark
@pytest.mark.parametrize("case", sorted(CASES))
def test_export_selects_what_dump_selects(spark, tmp_path, everything, case):
    want = _dump(CASES[case])
    assert 0 < len(want) < len(everything)  # the filter selects something, not everything
    got, doc = _export(tmp_path, CASES[case])
    assert got == want
    assert doc["records"] == len(want) and doc["rereadSplits"] == 0


@pytest.mark.spark
def test_tag_star_and_the_spark_writer(spark, tmp_path, everything):
    got, doc = _export(tmp_path, ["--tag", "*", "--tag", "TagA"])  # '*' matches every message
    assert got == everything and doc["records"] == len(everything)
    # Spark's writer over an offset range too (only the splits in range are planned)
    args = CASES["offsets"] + CASES["since-until"]
    want = _dump(args)
    assert 0 < len(want) < min(len(_dump(CASES["offsets"])), len(_dump(CASES["since-until"])))
    got, doc = _export(tmp_path / "w", args, "--writer", "spark", "--partition-by", "topic")
    assert got == want and doc["records"] == len(want)


@pytest.mark.spark
def test_splits_outside_the_range_are_not_read(spark, tmp_path):
    """Only splits that can hold a record starting in [lo, hi) run; the segment holding lo
    is walked from its start inside the first task (no driver re-read)."""
    from rmqstore.scan import splits as S
    from rmqstore.pipeline import jobs
    from rmqstore.selection import MessageFilter

    lo, hi, size = 100001, 300000, 20000
    r = jobs.export(spark, STORES, str(tmp_path / "o"), split_size=size,
                    filter=MessageFilter.make(from_offset=lo, to_offset=hi))
    # from the fixtures' file sizes (README: unicode 1, special 3, basic 7 files of 64 KiB)
    planned = [(store, start + b, start + min(b + size, SEG)) for store, files in
               zip(STORES, (1, 3, 7)) for start in range(0, files * SEG, SEG)
               for b in range(0, SEG, size)]
    needed = [p for p in planned if p[1] < hi and p[2] > lo]
    assert r.splits == len(needed) < len(planned)
    assert r.reread == 0
    all_splits = S.plan_splits(STORES, size)
    assert len(all_splits) == len(planned)


# --- usage errors, before Spark starts -----------------------------------------------------------


@pytest.fixture
def no_spark(monkeypatch):
    import rmqstore.pipeline as pipeline

    def session(*a, **k):
        pytest.fail("Spark was started although the options were wrong")

    fake = types.SimpleNamespace(session=session)
    monkeypatch.setitem(sys.modules, "rmqstore.pipeline.jobs", fake)
    monkeypatch.setattr(pipeline, "jobs", fake, raising=False)


@pytest.mark.parametrize("args, says", [
    (["--limit", "5", "--writer", "spark"], "--limit needs --writer pyarrow"),
    (["--since", "12345"], "--since: ambiguous time"),
    (["--until", "noon"], "--until: not a time"),
    (["--since", "2024-06-10T08:00:00", "--tz", "Mars/Base"], "--tz: unknown time zone"),
    (["--from-offset", "-1"], "--from-offset"),
    (["--max-bytes", "-5"], "--max-bytes"),
    (["--limit", "x"], "--limit"),
    (["--queue-id", "one"], "--queue-id"),
])
def test_export_filter_usage_errors(no_spark, tmp_path, args, says):
    r = runner.invoke(app, ["spark", "export", STORES[0], "--out", str(tmp_path / "o"), *args])
    assert r.exit_code == 2, r.output
    assert says in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["stats", "audit", "rebuild-cq"])
@pytest.mark.parametrize("option", [["--topic", "TopicA"], ["--since", "2024-06-10"],
                                    ["--from-offset", "0"], ["--limit", "1"]])
def test_whole_store_jobs_take_no_filters(no_spark, tmp_path, command, option):
    """stats, audit and rebuild-cq describe or rebuild whole stores (a filtered audit would
    call every unselected ConsumeQueue unit extra): they offer no filter options."""
    extra = ["--out", str(tmp_path / "o")] if command == "rebuild-cq" else []
    r = runner.invoke(app, ["spark", command, STORES[0], *extra, *option])
    assert r.exit_code == 2 and "no such option" in r.output.lower(), r.output
