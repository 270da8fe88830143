"""Issue #14 WP A: the store's kind and version, named from its files (design-14 §8, T9).

Every fixture folder RocketMQ wrote gets the kind the design's table gives it (verified
there from the bytes by ``detect.py``), both from the cheap profile every command can
afford and, with the record-level evidence only a full pass sees, in ``stats``."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from cli.main import app
from conftest import FIXTURES, copy_store, tree_hashes
from rmqstore.files import storekind_detect, storekind_profile
from rmqstore.files.dledger_files import find_ledger_dirs

runner = CliRunner()

#: design-14 §8 "Expected stats → storeKind per folder": (log, family, features).
EXPECTED = {
    **{f"rocketmq-4.9.8/{s}": ("plain", "4.9", []) for s in (
        "basic", "async-transient", "crash", "crash-recovered", "crash-torn",
        "crash-torn-recovered", "crash-torn-tail", "crash-torn-tail-recovered", "ipv6",
        "special", "sync-flush", "unicode")},
    "rocketmq-5.3.3/basic": ("plain", "5", []),
    "rocketmq-5.3.3/crash": ("plain", "5", []),
    "rocketmq-5.3.3/crash-recovered": ("plain", "5", []),
    "rocketmq-5.3.3/long-topics": ("plain", "5", ["v2-magic"]),
    "rocketmq-5.3.3/lmq": ("plain", "5", ["lmq"]),
    "rocketmq-5.3.3/batch-cq": ("plain", "5", ["batch-cq"]),
    "rocketmq-5.3.3/prop-crc": ("plain", "5", ["prop-crc", "v2-magic"]),
    "rocketmq-4.9.8-dledger/basic": ("dledger", "4.9", []),
    "rocketmq-4.9.8-dledger/crash": ("dledger", "4.9", []),
    "rocketmq-5.3.3-dledger/basic": ("dledger", "5", []),
}
#: Features only a pass over every record can see (the first record does not show them).
RECORD_ONLY = {"rocketmq-5.3.3/long-topics": {"v2-magic"}, "rocketmq-5.3.3/prop-crc": {"v2-magic"}}


def folder(name: str):
    p = FIXTURES / name
    if not p.is_dir():
        pytest.skip(f"fixture {p} absent")
    return p


def test_the_table_covers_every_fixture_folder():
    if not FIXTURES.is_dir():
        pytest.skip(f"{FIXTURES} absent")
    found = {f"{v.name}/{s.name}" for v in FIXTURES.iterdir() if v.is_dir()
             for s in v.iterdir() if s.is_dir()}
    assert found == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_profile_names_kind_and_family_from_the_files(name):
    root = folder(name)
    before = tree_hashes(root)
    p = storekind_profile.profile(root)
    log, family, features = EXPECTED[name]
    assert (p.log, p.family) == (log, family), p.evidence
    assert set(p.features) == set(features) - RECORD_ONLY.get(name, set()), p.evidence
    assert p.evidence  # every conclusion says why
    assert (p.dledger is not None) == (log == "dledger")
    assert tree_hashes(root) == before


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_stats_names_the_store_kind_with_every_record_counted(name):
    root = folder(name)
    before = tree_hashes(root)
    r = runner.invoke(app, ["stats", str(root), "-f", "json"])
    assert r.exit_code == 0, r.output
    kind = json.loads(r.stdout)["storeKind"]
    log, family, features = EXPECTED[name]
    assert (kind["log"], kind["family"], kind["features"]) == (log, family, features), kind
    assert tree_hashes(root) == before


def test_a_loose_4x_segment_keeps_the_separator_and_says_unknown():
    seg = FIXTURES / "rocketmq-4.x-segment" / "00000000000000000000"
    if not seg.is_file():
        pytest.skip(f"{seg} absent")
    p = storekind_profile.profile_segment(seg)
    assert (p.log, p.family, p.features) == ("segment", "unknown", [])
    assert p.evidence == ["properties keep the trailing 0x02 (<=4.9.0 or >=5.2)"]


def test_five_only_files_outweigh_the_properties_text(tmp_path):
    """An upgraded store is 5 (design-14 §8): one 5-only file decides, whatever the
    records' properties say; without any, 4.9 records keep it 4.9."""
    store = copy_store(folder("rocketmq-4.9.8/basic"), tmp_path / "store")
    assert storekind_profile.profile(store).family == "4.9"
    (store / "abort.bak").write_bytes(b"")
    p = storekind_profile.profile(store)
    assert p.family == "5" and any("abort.bak" in e for e in p.evidence)
    (store / "abort.bak").unlink()
    (store / "abort").write_bytes(b"4242")
    assert storekind_profile.profile(store).family == "5"


def test_ledger_folders_are_found_in_one_place(tmp_path):
    """Detection and the profile find DLedger folders through files.dledger_files (no copy
    of the rule)."""
    assert not hasattr(storekind_detect, "dledger_dirs")
    assert not hasattr(storekind_profile, "dledger_dirs")
    store = tmp_path / "store"
    (store / "dledger-n1" / "index").mkdir(parents=True)
    (store / "dledger-stray").mkdir()  # neither data/ nor index/: not DLedger's
    assert [d.name for d in find_ledger_dirs(store)] == ["dledger-n1"]
    found = storekind_detect.detect(store, {})
    assert [(d.feature.key, d.evidence) for d in found] == [("dledger", "dledger-n1/")]
    assert storekind_profile.profile(store).log == "dledger"
    shutil.rmtree(store / "dledger-n1")
    assert storekind_profile.profile(store).log == "plain"


@pytest.mark.parametrize("name, want", [
    # design-14 §8 (detect.py over every record): v2 records, __CRC32# tails, inner batches
    ("rocketmq-5.3.3/long-topics", {"records": 18, "v2": 8, "propCrc": 0, "innerBatch": 0}),
    ("rocketmq-5.3.3/prop-crc", {"records": 27, "v2": 1, "propCrc": 27, "innerBatch": 0}),
    ("rocketmq-5.3.3/batch-cq", {"records": 39, "v2": 0, "propCrc": 0, "innerBatch": 21}),
    ("rocketmq-4.9.8/basic", {"records": 500, "v2": 0, "propCrc": 0, "innerBatch": 0}),
])
def test_record_evidence_is_counted_over_every_record(name, want):
    from rmqstore import stats

    _, _, counts = stats.commitlog_stats(str(folder(name)), kind=True)
    assert counts == want
