"""The Spark jobs end to end in local mode (one session for the whole module).

Golden data: the fixtures' own ConsumeQueue files (rebuild must equal them byte for byte),
the fixtures README's documented damage (crash-torn, crash-torn-tail), the message JSON
of the non-Spark reader, and faults injected here by editing CQ units.
"""

from __future__ import annotations

import base64
import filecmp
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

try:
    import pyspark  # noqa: F401
except ImportError:  # pragma: no cover
    pytest.skip("pyspark is not installed (pip install 'rmqstore[spark]')", allow_module_level=True)

from conftest import ROCKETMQ_498, SCENARIOS  # noqa: E402

from rmqstore import stats as STATS
from rmqstore.format import layout as L  # noqa: E402

if not ROCKETMQ_498.is_dir():
    pytest.skip("RocketMQ fixtures absent", allow_module_level=True)

# crash-torn-tail(-recovered) are not clean: their CQ keeps a tagsCode the damaged record
# no longer yields (fixtures README); crash-torn keeps a unit for the torn record.
CLEAN = ["basic", "unicode", "ipv6", "special", "sync-flush", "async-transient", "crash",
         "crash-recovered"]


def _reference_rows(root: str) -> list[dict]:
    """What `rmqstore dump --format jsonl` prints, record by record (view.message_dict over
    the sequential CommitLog walk), with bodies as bytes."""
    from rmqstore.files.commitlog import CommitLog
    from rmqstore.files.config import load_config
    from rmqstore.view import message_dict

    out = []
    with CommitLog(load_config(root)) as cl:
        for m in cl.messages():
            d = message_dict(m, "raw")  # the stored bytes, as the export keeps them
            for extra in ("bodyEncoding", "bodyCompression", "crcOk", "uniqKeyInfo"):
                d.pop(extra, None)  # the export has crcOk (checked below) and no decoded extras
            d["body"] = base64.b64decode(d["body"])
            out.append(d)
    return out


def _as_json(row: dict) -> dict:
    d = {k: v for k, v in row.items() if k not in ("store", "crcOk")}
    d["properties"] = dict(d["properties"])
    if d["propertiesText"] is None:
        del d["propertiesText"]
    return d


def test_export_equals_dump_on_every_fixture_and_a_generated_store(spark, tmp_path):
    import pyarrow.dataset as ds

    from rmqstore.pipeline import jobs
    from test_splits import generate

    gen = tmp_path / "gen"
    generate(gen, 7)
    stores = [str(ROCKETMQ_498 / s) for s in SCENARIOS] + [str(gen)]
    out = tmp_path / "out"
    r = jobs.export(spark, stores, str(out), split_size=40000)
    assert (out / "_SUCCESS").exists() and not (out / "_temporary").exists()
    rows = ds.dataset(str(out), format="parquet").to_table().to_pylist()
    by_store: dict[str, list] = {}
    for row in rows:
        by_store.setdefault(row["store"], []).append(row)
    assert r.records == len(rows)
    for store in stores:
        got = sorted(by_store.get(store, []), key=lambda x: x["commitLogOffset"])
        ref = _reference_rows(store)
        assert [_as_json(g) for g in got] == ref, store
        assert all(g["crcOk"] for g in got)


def test_export_partitioned_by_topic_no_body(spark, tmp_path):
    import pyarrow.dataset as ds

    from rmqstore.pipeline import jobs

    root = str(ROCKETMQ_498 / "special")
    out = tmp_path / "p"
    jobs.export(spark, [root], str(out), split_size=20000, partition_by="topic", body=False)
    t = ds.dataset(str(out), format="parquet", partitioning="hive").to_table()
    ref = _reference_rows(root)
    assert sorted(t.column("topic").to_pylist()) == sorted(r["topic"] for r in ref)
    assert set(t.column("body").to_pylist()) == {None}
    # Spark reads the same dataset back (partition names escaped as Spark escapes them)
    sdf = spark.read.option("basePath", str(out)).parquet(str(out))
    assert sdf.count() == len(ref)
    assert {r["topic"] for r in sdf.select("topic").distinct().collect()} == {r["topic"] for r in ref}


def test_spark_writer_gives_the_same_rows(spark, tmp_path):
    import pyarrow.dataset as ds

    from rmqstore.pipeline import jobs

    root = str(ROCKETMQ_498 / "basic")
    jobs.export(spark, [root], str(tmp_path / "a"), split_size=30000, writer="spark")
    jobs.export(spark, [root], str(tmp_path / "b"), split_size=30000)
    a = ds.dataset(str(tmp_path / "a"), format="parquet").to_table().sort_by("commitLogOffset")
    b = ds.dataset(str(tmp_path / "b"), format="parquet").to_table().sort_by("commitLogOffset")
    assert a.to_pylist() == b.to_pylist()


def test_stats_equal_non_spark_stats(spark):
    from rmqstore.pipeline import jobs

    stores = [str(ROCKETMQ_498 / s) for s in SCENARIOS]
    r = jobs.stats(spark, stores, split_size=65536)
    for s in stores:
        ref, end = STATS.commitlog_stats(s, split_size=1 << 30)
        assert r.stats[s] == ref
        assert r.ends[s] == end


def test_audit_clean_stores_have_no_findings(spark):
    from rmqstore.pipeline import jobs

    r = jobs.audit(spark, [str(ROCKETMQ_498 / s) for s in CLEAN], split_size=65536)
    assert r.findings == []


def test_audit_documented_damage(spark):
    """fixtures README: crash-torn keeps a CQ unit for the torn record (past the end),
    crash-torn-tail keeps the pre-crash tagsCode while the record now yields 0."""
    from rmqstore.pipeline import jobs

    torn, tail = str(ROCKETMQ_498 / "crash-torn"), str(ROCKETMQ_498 / "crash-torn-tail")
    r = jobs.audit(spark, [torn, tail], split_size=20000)
    got = [(f["store"], f["topic"], f["queueId"], f["queueOffset"], f["kind"]) for f in r.findings]
    assert got == [(torn, "TopicHot", 0, 159, "beyond-end"), (tail, "TopicHot", 0, 159, "mismatch")]
    assert r.findings[1]["expectedTagsCode"] == 0 and r.findings[1]["detail"] == "wrong tagsCode"


def _unit_pos(root: Path, topic: str, qid: int, qo: int, file_size: int = 1280) -> tuple[Path, int]:
    b = qo * L.CQ_UNIT_SIZE
    return root / "consumequeue" / topic / str(qid) / f"{b - b % file_size:020d}", b % file_size


def test_audit_finds_exactly_injected_faults(spark, tmp_path):
    from rmqstore.pipeline import jobs

    root = tmp_path / "basic"
    shutil.copytree(ROCKETMQ_498 / "basic", root)
    # 1. mismatch: TopicA/1 unit 3 gets another tagsCode
    p, pos = _unit_pos(root, "TopicA", 1, 3)
    data = bytearray(p.read_bytes())
    off, size, tags = L.CQ_UNIT_STRUCT.unpack_from(data, pos)
    L.CQ_UNIT_STRUCT.pack_into(data, pos, off, size, tags ^ 0x5A5A)
    p.write_bytes(bytes(data))
    # 2. missing: drop TopicB/0's last unit (zero it: the end of the queue moves back)
    units = sorted((root / "consumequeue" / "TopicB" / "0").iterdir())[-1]
    data = bytearray(units.read_bytes())
    last = max(i for i in range(0, len(data), 20) if any(data[i:i + 20]))
    missing_qo = (int(units.name) + last) // 20
    data[last:last + 20] = bytes(20)
    units.write_bytes(bytes(data))
    # 3. extra: append a unit after TopicA/0's end that repeats another queue's record
    qdir = root / "consumequeue" / "TopicA" / "0"
    f = sorted(qdir.iterdir())[-1]
    data = bytearray(f.read_bytes())
    end = max(i for i in range(0, len(data), 20) if any(data[i:i + 20])) + 20
    assert end < len(data)
    L.CQ_UNIT_STRUCT.pack_into(data, end, off, size, tags)
    f.write_bytes(bytes(data))
    extra_qo = (int(f.name) + end) // 20
    r = jobs.audit(spark, [str(root)], split_size=50000)
    got = sorted((f["topic"], f["queueId"], f["queueOffset"], f["kind"]) for f in r.findings)
    assert got == sorted([("TopicA", 1, 3, "mismatch"), ("TopicB", 0, missing_qo, "missing"),
                          ("TopicA", 0, extra_qo, "extra")])


@pytest.mark.parametrize("scenario", ["basic", "special", "unicode"])
def test_rebuild_cq_is_byte_identical(spark, tmp_path, scenario):
    from rmqstore.pipeline import jobs

    out = tmp_path / "cq"
    jobs.rebuild_cq(spark, str(ROCKETMQ_498 / scenario), str(out), split_size=30000)
    cmp = filecmp.dircmp(out, ROCKETMQ_498 / scenario / "consumequeue")
    ref_files = sorted(p.relative_to(ROCKETMQ_498 / scenario / "consumequeue")
                       for p in (ROCKETMQ_498 / scenario / "consumequeue").rglob("*") if p.is_file())
    got_files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert got_files == ref_files
    for rel in ref_files:
        assert (out / rel).read_bytes() == (ROCKETMQ_498 / scenario / "consumequeue" / rel).read_bytes(), rel
    assert cmp is not None


def test_cli_audit_exit_code(spark, tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    runner = CliRunner()
    clean = runner.invoke(app, ["spark", "audit", str(ROCKETMQ_498 / "unicode"), "--master", "local[2]",
                                "--format", "json"])
    assert clean.exit_code == 0, clean.output
    bad = runner.invoke(app, ["spark", "audit", str(ROCKETMQ_498 / "crash-torn-tail"), "--master",
                              "local[2]", "--format", "jsonl"])
    assert bad.exit_code == 1 and '"kind":"mismatch"' in bad.output.replace(" ", "")
