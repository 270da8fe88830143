"""Issue #14 WP D2: verify and rebuild of RocketMQ 5.x BatchConsumeQueues and LMQ queues,
against ``rocketmq-5.3.3/batch-cq`` and ``rocketmq-5.3.3/lmq`` (design-14 §10 T4, T5).

verify is clean on both (no store-feature finding: it checks them now) and names damage in
a BCQ or LMQ unit; rebuild after deleting ``consumequeue/``, ``batchconsumequeue/`` and
``index/`` gives byte-identical queue files and IndexFiles with identical contents; an LMQ
store whose LMQ queues are gone needs ``enableMultiDispatch`` from broker.conf (decision
D6), else exit 2 naming it; the Spark jobs still refuse, in one line (append and repair
write them now: tests/test_append_fixtures_5x.py, tests/test_repair_5x_queues.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from conftest import FIXTURES, copy_store, tree_hashes
from rmqstore.files.config import load_config
from rmqstore.format import layout as L
from rmqstore.recovery.rebuild import rebuild
from rmqstore.recovery.verify import verify

runner = CliRunner()
F533 = FIXTURES / "rocketmq-5.3.3"
pytestmark = pytest.mark.skipif(not (F533 / "lmq").is_dir(), reason=f"no 5.3.3 fixtures under {FIXTURES}")


def cli(*args):
    r = runner.invoke(app, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


def manifest(name: str) -> dict:
    return json.loads((F533 / name / "manifest.json").read_text())


def broker_conf(name: str, path: Path, drop=()) -> Path:
    """The fixture's storeConfig as a broker.conf (what the broker ran with)."""
    conf = manifest(name)["storeConfig"]
    path.write_text("".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}\n"
                            for k, v in conf.items() if k not in drop))
    return path


def queue_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for d in ("consumequeue", "batchconsumequeue")
            if (root / d).is_dir() for p in (root / d).rglob("*") if p.is_file()}


def index_contents(root: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted((root / "index").iterdir())]


def codes(report) -> list[str]:
    return [f.code for f in report.findings if f.severity != "info"]


# --- T4: verify -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["batch-cq", "lmq"])
def test_verify_is_clean_on_the_5x_queue_fixtures(name):
    store = F533 / name
    before = tree_hashes(store)
    r = verify(store, deep=True)
    assert r.ok and codes(r) == [], [f.explanation for f in r.findings]
    code, out, err = cli("verify", store, "--deep")
    assert code == 0 and "store-feature" not in out and "warning" not in err, (out, err)
    assert tree_hashes(store) == before


def test_verify_names_a_damaged_bcq_unit_and_missing_ones(tmp_path):
    store = copy_store(F533 / "batch-cq", tmp_path / "s")
    f = store / "batchconsumequeue" / "TopicBCQ" / "0" / "00000000000000000736"
    data = bytearray(f.read_bytes())
    at = 3 * L.BCQ_UNIT_SIZE + 28  # unit 16+3's msgBaseOffset
    data[at:at + 8] = (999).to_bytes(8, "big")
    f.write_bytes(bytes(data))
    shutil.rmtree(store / "batchconsumequeue" / "TopicBCQ" / "1")
    r = verify(store)
    mism = [x for x in r.findings if x.code == "bcq-mismatch"]
    assert len(mism) == 1 and mism[0].file.endswith("TopicBCQ/0/00000000000000000736")
    assert mism[0].offset == 3 * L.BCQ_UNIT_SIZE and "msg_base_offset 999" in mism[0].explanation
    tail = [x for x in r.findings if x.code == "bcq-missing-tail"]
    assert len(tail) == 1 and "TopicBCQ/1: 4 record(s)" in tail[0].explanation
    assert not r.ok


def test_verify_names_a_damaged_lmq_unit(tmp_path):
    store = copy_store(F533 / "lmq", tmp_path / "s")
    f = store / "consumequeue" / "%LMQ%room3" / "0" / "00000000000000000000"
    data = bytearray(f.read_bytes())
    data[7 * 20 + 8:7 * 20 + 12] = (30000).to_bytes(4, "big")  # the size of the unit at offset 7
    f.write_bytes(bytes(data))
    r = verify(store)
    assert [(x.code, x.data.get("queueOffset")) for x in r.findings if x.severity == "error"] \
        == [("cq-mismatch", 7)]


# --- T5: rebuild ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["batch-cq", "lmq"])
def test_rebuild_gives_byte_identical_queues_and_index(name, tmp_path):
    src = F533 / name
    store = copy_store(src, tmp_path / name)
    for d in ("consumequeue", "batchconsumequeue", "index"):
        shutil.rmtree(store / d, ignore_errors=True)
    cfg = load_config(store, broker_conf(name, tmp_path / "broker.conf"))
    r = rebuild(store, config=cfg, clock=lambda: 1_700_000_000_000)
    assert queue_files(store) == queue_files(src)
    assert index_contents(store) == index_contents(src)
    m = manifest(name)
    assert r.units == sum(len(q["cqEntries"]) for q in m["queues"]) == {"batch-cq": 39, "lmq": 103}[name]
    assert r.messages == len(m["messages"])
    assert verify(store, config=cfg, deep=True).ok


def test_rebuild_over_existing_5x_queues_needs_no_config(tmp_path):
    for name in ("batch-cq", "lmq"):
        src = F533 / name
        store = copy_store(src, tmp_path / name)
        code, out, err = cli("rebuild", store)
        assert code == 0, err
        assert queue_files(store) == queue_files(src)


def test_lmq_rebuild_without_enable_multi_dispatch_refuses(tmp_path):
    store = copy_store(F533 / "lmq", tmp_path / "s")
    shutil.rmtree(store / "consumequeue")
    shutil.rmtree(store / "index")
    before = tree_hashes(store)
    conf = broker_conf("lmq", tmp_path / "broker.conf", drop=("enableLmq", "enableMultiDispatch"))
    for args in (["rebuild", store], ["rebuild", store, "-c", conf]):
        code, _, err = cli(*args)
        lines = [x for x in err.splitlines() if "refused" in x]
        assert code == 2 and len(lines) == 1 and "enableMultiDispatch" in lines[0], err
        assert "Traceback" not in err
    assert tree_hashes(store) == before
    # Said off: the broker wrote no LMQ units, and neither does rebuild.
    off = tmp_path / "off.conf"
    off.write_text(conf.read_text() + "enableMultiDispatch=false\n")
    code, _, err = cli("rebuild", store, "-c", off)
    assert code == 0, err
    assert not [p for p in (store / "consumequeue").iterdir() if p.name.startswith("%LMQ%")]


@pytest.mark.parametrize("name", ["batch-cq", "lmq"])
def test_spark_still_refuses_in_one_line(name, tmp_path):
    # (append and repair write BCQ and LMQ units now: test_append_fixtures_5x.py,
    # test_repair_5x_queues.py)
    store = copy_store(F533 / name, tmp_path / "s")
    before = tree_hashes(store)
    for args in (["spark", "stats", store],):  # the Spark jobs do not unwrap or know BCQ/LMQ yet
        code, _, err = cli(*args)
        lines = [x for x in err.splitlines() if x.startswith("rmqstore: ") and "refused" in x]
        assert code == 2 and len(lines) == 1 and "spark refused" in lines[0], err
        assert "reads, verify, rebuild and repair are supported" in lines[0]
    assert tree_hashes(store) == before
