"""Issue #14 WP D1: the Spark export reads DLedger stores (design-14 D1): every row equals
what the reader (``rmqstore dump``) gives for the same message, on RocketMQ's DLedger
fixtures and on a damaged copy; the driver cuts data files at entry starts, so nothing
is resynced. Local mode, one session (conftest ``spark``)."""

from __future__ import annotations

import base64
import struct

import pytest

pytestmark = pytest.mark.spark

try:
    import pyspark  # noqa: F401
except ImportError:  # pragma: no cover
    pytest.skip("pyspark is not installed (pip install 'rmqstore[spark]')", allow_module_level=True)

from conftest import FIXTURES, copy_store  # noqa: E402

FOLDERS = [FIXTURES / "rocketmq-4.9.8-dledger" / "basic", FIXTURES / "rocketmq-4.9.8-dledger" / "crash",
           FIXTURES / "rocketmq-5.3.3-dledger" / "basic"]
if not all(p.is_dir() for p in FOLDERS):
    pytest.skip(f"RocketMQ-written DLedger fixtures not found under {FIXTURES}", allow_module_level=True)

FILE = 65536


def _reference_rows(root) -> list[dict]:
    """What `rmqstore dump --format jsonl` prints for a DLedger store, message by message."""
    from rmqstore.reader import open_store
    from rmqstore.view import message_dict

    out = []
    with open_store(root) as r:
        for m in r.messages():
            d = message_dict(m, "raw")
            for extra in ("bodyEncoding", "bodyCompression", "crcOk", "uniqKeyInfo"):
                d.pop(extra, None)
            d["body"] = base64.b64decode(d["body"])
            out.append(d)
    return out


def _as_json(row: dict) -> dict:
    d = {k: v for k, v in row.items() if k not in ("store", "crcOk")}
    d["properties"] = dict(d["properties"])
    if d["propertiesText"] is None:
        del d["propertiesText"]
    return d


def _export(spark, stores, out, **kw):
    import pyarrow.dataset as ds

    from rmqstore.pipeline import jobs

    r = jobs.export(spark, [str(s) for s in stores], str(out), **kw)
    rows = ds.dataset(str(out), format="parquet").to_table().to_pylist()
    by_store: dict[str, list] = {}
    for row in rows:
        by_store.setdefault(row["store"], []).append(row)
    return r, {k: sorted(v, key=lambda x: x["commitLogOffset"]) for k, v in by_store.items()}


def test_export_equals_dump_on_every_dledger_fixture(spark, tmp_path):
    r, got = _export(spark, FOLDERS, tmp_path / "out", split_size=20000)
    assert r.records == 1500
    for store in FOLDERS:
        ref = _reference_rows(store)
        assert len(ref) == 500 and ref[0]["commitLogOffset"] == 48
        assert [_as_json(g) for g in got[str(store)]] == ref, store
        assert all(g["crcOk"] for g in got[str(store)])
        assert r.ends[str(store)].end_offset == ref[-1]["commitLogOffset"] + ref[-1]["storeSize"]


def test_export_skips_what_the_reader_skips_on_a_damaged_copy(spark, tmp_path):
    import json

    store = copy_store(FOLDERS[0], tmp_path / "store")
    m = json.loads((store / "manifest.json").read_text())

    def patch(i: int, at: int, data: bytes):
        pos = m["messages"][i]["stored"]["phyOffset"] - 48
        with open(store / "dledger-n0" / "data" / f"{pos - pos % FILE:020d}", "r+b") as f:
            f.seek(pos % FILE + at)
            f.write(data)

    patch(10, 48 + 4, struct.pack(">i", 0x12345678))  # a record that does not fit its entry
    patch(250, 24, struct.pack(">q", 0))  # a chain break before DLedger's start file
    r, got = _export(spark, [store], tmp_path / "out", split_size=7000, writer="spark")
    ref = _reference_rows(store)
    assert len(ref) == 500 - 1 - 15  # entries 250..264 lie in the rest of that file
    assert [_as_json(g) for g in got[str(store)]] == ref
    assert r.records == len(ref)


def test_other_spark_commands_still_refuse_a_dledger_store(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    res = CliRunner().invoke(app, ["spark", "audit", str(FOLDERS[0])])
    assert res.exit_code == 2 and "DLedger CommitLog" in res.stderr and "spark export" in res.stderr
