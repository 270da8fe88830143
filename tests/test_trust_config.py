"""Issue 11, "the disk is the truth" and "never silently wrong": a broker.conf or option that
disagrees with the files is an error (exit 2) for every command; path settings follow one
rule; IndexFile geometry the files do not determine makes reads warn and writes refuse;
store kinds rmqstore does not support (DLedger, RocksDB CQ, ...) are named with exit 2.

Every store here is a copy (or a fresh build) in tmp_path, and every refused or read-only
command is checked to leave each byte as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from conftest import FIXTURES, copy_store, tree_hashes
from rmqstore.format.message import Message
from rmqstore.files.config import StoreConfig, load_config
from rmqstore.errors import ConfigError
from rmqstore.files.index import IndexFile, IndexGeometry
from rmqstore.engine.store import MessageStore

runner = CliRunner()
BASIC_MESSAGES = 500  # fixtures README: rocketmq-4.9.8/basic


def cli(*args):
    r = runner.invoke(app, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


def _fixture(*parts) -> Path:
    p = FIXTURES.joinpath(*parts)
    if not p.is_dir():
        pytest.skip(f"fixture {p} absent")
    return p


@pytest.fixture
def basic(tmp_path) -> Path:
    return copy_store(_fixture("rocketmq-4.9.8", "basic"), tmp_path / "store")


def conf(tmp_path, text: str) -> Path:
    p = tmp_path / "broker.conf"
    p.write_text(text)
    return p


def _error_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.startswith("rmqstore: ") and ": note: " not in x
             and ": warning: " not in x]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


# Every command that reads or writes a store, as (name, args after STORE).
def _commands(store: Path, tmp_path: Path):
    return [
        ("dump", ["dump", store, "--limit", "2"]),
        ("get", ["get", store, "--offset", "0"]),
        ("query-key", ["query-key", store, "--topic", "TopicA", "--key", "dup-key"]),
        ("stats", ["stats", store, "-f", "json"]),
        ("verify", ["verify", store, "-f", "json"]),
        ("repair --dry-run", ["repair", store, "--dry-run"]),
        ("repair --yes", ["repair", store, "--yes", "--backup", tmp_path / "backup"]),
        ("rebuild", ["rebuild", store]),
        ("append", ["append", store, "--topic", "TopicA", "--body", "x"]),
        ("spark rebuild-cq", ["spark", "rebuild-cq", store, "--out", tmp_path / "cq-out"]),
    ]


# --- reproducer 1: a plausible broker.conf must not empty a healthy store ------------------


def test_storepathcommitlog_of_another_machine_is_ignored_with_a_note(basic, tmp_path):
    """The production path in broker.conf, store copied elsewhere: at 5e9440d stats said 0
    messages and repair --yes cut every queue and deleted every IndexFile, exit 0."""
    c = conf(tmp_path, "storePathRootDir=/data/rocketmq/store\n"
                       "storePathCommitLog=/data/rocketmq/store/commitlog\n")
    before = tree_hashes(basic)
    code, out, err = cli("stats", basic, "-c", c, "-f", "json")
    assert code == 0 and json.loads(out)["commitLog"]["messages"] == BASIC_MESSAGES
    assert "note: broker.conf storePathCommitLog=/data/rocketmq/store/commitlog does not exist" in err
    assert "storePathRootDir=/data/rocketmq/store is not the store given" in err
    code, out, _ = cli("verify", basic, "-c", c, "-f", "json")
    assert code == 0 and json.loads(out)["messages"] == BASIC_MESSAGES
    code, out, err = cli("repair", basic, "-c", c, "--yes", "-f", "json")
    assert code == 0, err
    assert tree_hashes(basic) == before


def test_commitlog_size_from_broker_conf_that_disagrees_is_refused_by_every_command(basic, tmp_path):
    """At 5e9440d, repair --dry-run planned to extend segment 0 to 1 GiB and move the other
    segments away."""
    c = conf(tmp_path, "mappedFileSizeCommitLog=1073741824\n")
    before = tree_hashes(basic)
    for name, args in _commands(basic, tmp_path):
        code, _, err = cli(*args, "-c", c)
        assert code == 2, (name, err)
        line = _error_line(err)
        assert str(c) in line and "mappedFileSizeCommitLog=1073741824" in line, (name, line)
        assert "65536" in line and "commitlog/00000000000000000000" in line, (name, line)
    assert tree_hashes(basic) == before
    assert not (tmp_path / "backup").exists() and not (tmp_path / "cq-out").exists()


@pytest.mark.parametrize("text, value, files", [
    ("mappedFileSizeCommitLog=131072", "mappedFileSizeCommitLog=131072", "65536"),
    ("mappedFileSizeConsumeQueue=6000000", "mappedFileSizeConsumeQueue=6000000", "1280"),
    ("maxHashSlotNum=100", "maxHashSlotNum=100", "5416"),
    ("maxIndexNum=300", "maxIndexNum=300", "5416"),
    ("maxHashSlotNum=64\nmaxIndexNum=300", "maxHashSlotNum=64", "5416"),
    # Same file size as 64/256 (40 + 4*69 + 20*255 = 5416), but the entries sit elsewhere:
    ("maxHashSlotNum=69", "maxHashSlotNum=69", "maxHashSlotNum=64, maxIndexNum=256"),
])
def test_each_geometry_key_that_disagrees_with_the_files_is_an_error(basic, tmp_path, text, value, files):
    c = conf(tmp_path, text + "\n")
    before = tree_hashes(basic)
    for args in (["stats", basic], ["verify", basic], ["repair", basic, "--dry-run"]):
        code, _, err = cli(*args, "-c", c)
        assert code == 2, (args, err)
        line = _error_line(err)
        assert value in line and files in line and str(c) in line, line
    assert tree_hashes(basic) == before
    with pytest.raises(ConfigError):
        load_config(basic, c)


def test_settings_that_agree_are_used_and_sources_say_so(basic, tmp_path):
    c = conf(tmp_path, "mappedFileSizeCommitLog=65536\nmappedFileSizeConsumeQueue=1270\n"
                       "maxHashSlotNum=64\nmaxIndexNum=256\n")  # 1270 rounds up to 1280 (§1.2)
    cfg = load_config(basic, c)
    assert (cfg.mapped_file_size_commit_log, cfg.cq_file_size, cfg.max_hash_slot_num,
            cfg.max_index_num) == (65536, 1280, 64, 256)
    assert cfg.sources["mapped_file_size_commit_log"].startswith("files:")
    assert "broker.conf agrees" in cfg.sources["mapped_file_size_commit_log"]
    assert cfg.sources["max_hash_slot_num"] == "broker.conf"
    code, out, _ = cli("stats", basic, "-c", c, "-f", "json")
    assert code == 0 and json.loads(out)["geometrySources"] == cfg.sources
    # No broker.conf: every value from the files, and said to be.
    plain = load_config(basic)
    assert all(v.startswith("files:") for v in plain.sources.values()), plain.sources


def test_an_option_that_disagrees_with_the_files_is_an_error(basic, tmp_path):
    before = tree_hashes(basic)
    for opt in (["--commitlog-size", "1073741824"], ["--cq-size", "6000000"],
                ["--index-slots", "100", "--index-num", "400"]):
        code, _, err = cli("append", basic, "--topic", "TopicA", "--body", "x", *opt)
        assert code == 2 and "disagrees with the store" in _error_line(err), (opt, err)
    assert tree_hashes(basic) == before
    with pytest.raises(ConfigError, match="given as an option"):
        load_config(basic, overrides={"mapped_file_size_commit_log": 1 << 30})


# --- the path rule --------------------------------------------------------------------------


def _split_commitlog(store: Path, a: Path, b: Path) -> None:
    """Move the store's segments into two directories, alternately, as a multi-path
    broker spreads them (spec §1.1)."""
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    for i, seg in enumerate(sorted((store / "commitlog").iterdir())):
        shutil.move(str(seg), (a if i % 2 == 0 else b) / seg.name)
    (store / "commitlog").rmdir()


def test_storepathcommitlog_that_exists_is_the_commitlog_when_the_store_has_none(basic, tmp_path):
    a, b = tmp_path / "disk1" / "commitlog", tmp_path / "disk2" / "commitlog"
    _split_commitlog(basic, a, b)
    c = conf(tmp_path, f"storePathCommitLog={a},{b}\n")
    code, out, err = cli("stats", basic, "-c", c, "-f", "json")
    assert code == 0 and json.loads(out)["commitLog"]["messages"] == BASIC_MESSAGES, err
    code, out, _ = cli("verify", basic, "-c", c, "-f", "json")
    assert code == 0 and json.loads(out)["messages"] == BASIC_MESSAGES
    # Without the broker.conf the store has no CommitLog at all, and says so.
    code, out, _ = cli("verify", basic, "-f", "json")
    assert code == 1 and json.loads(out)["messages"] == 0


def test_storepathcommitlog_may_list_the_stores_own_commitlog(basic, tmp_path):
    other = tmp_path / "disk2" / "commitlog"
    other.mkdir(parents=True)
    for seg in sorted((basic / "commitlog").iterdir())[1::2]:
        shutil.move(str(seg), other / seg.name)
    c = conf(tmp_path, f"storePathCommitLog={basic / 'commitlog'},{other}\n")
    code, out, err = cli("verify", basic, "-c", c, "-f", "json")
    assert code == 0 and json.loads(out)["messages"] == BASIC_MESSAGES, err


@pytest.mark.parametrize("layout", ["relocated", "with-own"])
def test_stats_count_from_the_commitlog_directories_read(basic, tmp_path, layout):
    """storePathCommitLog elsewhere, no mappedFileSizeCommitLog in broker.conf: the stats
    library call listed STORE/commitlog again (none, or one segment of 64 KiB), so the
    queues had 8 messages instead of 50 (fixtures README: 50 each, TopicHot 200)."""
    from rmqstore.reader import open_store
    from rmqstore.stats import store_stats

    a, b = tmp_path / "disk1" / "commitlog", tmp_path / "disk2" / "commitlog"
    _split_commitlog(basic, a, b)
    dirs = [a, b]
    if layout == "with-own":
        (basic / "commitlog").mkdir()
        one = sorted(b.iterdir())[0]
        shutil.move(str(one), basic / "commitlog" / one.name)
        dirs.append(basic / "commitlog")
    c = conf(tmp_path, f"storePathCommitLog={','.join(map(str, dirs))}\n")
    with open_store(basic, c) as r:
        s = store_stats(r)
    assert s["commitLog"]["messages"] == BASIC_MESSAGES
    assert {(q["topic"], q["queueId"]): q["messages"] for q in s["queues"]} == {
        ("TopicA", 0): 50, ("TopicA", 1): 50, ("TopicA", 2): 50, ("TopicA", 3): 50,
        ("TopicB", 0): 50, ("TopicB", 1): 50, ("TopicHot", 0): 200}
    code, out, err = cli("stats", basic, "-c", c, "-f", "json")
    assert code == 0 and [q["messages"] for q in json.loads(out)["queues"]] == [50] * 6 + [200]


def test_strays_do_not_decide_the_geometry(basic, tmp_path):
    """A segment copied into index/ (a 20-digit name) or into a directory under a topic
    that is no queue id: verify calls them strays and repair moves them, so they must not
    decide the IndexFile or ConsumeQueue geometry (they made both wrong)."""
    want = load_config(basic)
    seg = sorted((basic / "commitlog").iterdir())[0]
    shutil.copy(seg, basic / "index" / seg.name)
    (basic / "consumequeue" / "TopicA" / "odd").mkdir()
    shutil.copy(seg, basic / "consumequeue" / "TopicA" / "odd" / f"{0:020d}")
    cfg = load_config(basic)
    names = ("mapped_file_size_commit_log", "mapped_file_size_consume_queue",
             "max_hash_slot_num", "max_index_num")
    assert {n: getattr(cfg, n) for n in names} == {n: getattr(want, n) for n in names}
    assert cfg.undetermined == {} and cfg.warnings == want.warnings
    code, out, err = cli("repair", basic, "--dry-run", "-f", "json")
    assert code == 1, err
    assert {(s["action"], s["path"]) for s in json.loads(out)["steps"]} >= {
        ("move-stray", f"index/{seg.name}"), ("move-stray", "consumequeue/TopicA/odd")}


def test_two_commitlogs_are_ambiguous(basic, tmp_path):
    elsewhere = copy_store(_fixture("rocketmq-4.9.8", "unicode"), tmp_path / "other")
    c = conf(tmp_path, f"storePathCommitLog={elsewhere / 'commitlog'}\n")
    before = tree_hashes(basic)
    for args in (["stats", basic], ["dump", basic], ["verify", basic], ["repair", basic, "--yes"]):
        code, _, err = cli(*args, "-c", c)
        assert code == 2 and "two CommitLogs" in _error_line(err), (args, err)
    assert tree_hashes(basic) == before


def test_a_missing_directory_of_a_multi_path_commitlog_blocks_writes(basic, tmp_path):
    a = tmp_path / "disk1" / "commitlog"
    b = tmp_path / "disk2" / "commitlog"
    _split_commitlog(basic, a, b)
    shutil.rmtree(b)  # that disk was not copied
    c = conf(tmp_path, f"storePathCommitLog={a},{b}\n")
    before = tree_hashes(basic)
    code, out, err = cli("stats", basic, "-c", c, "-f", "json")
    assert code == 0 and f"{b}, which does not exist here" in err
    assert json.loads(out)["commitLog"]["messages"] < BASIC_MESSAGES  # what is there, noted
    for args in (["repair", basic, "--yes"], ["rebuild", basic],
                 ["append", basic, "--topic", "T", "--body", "x"]):
        code, _, err = cli(*args, "-c", c)
        assert code == 2 and "may be incomplete" in _error_line(err), (args, err)
    assert tree_hashes(basic) == before


def test_read_only_commitlog_paths_that_exist_are_refused(basic, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    c = conf(tmp_path, f"readOnlyCommitLogStorePaths={ro}\n")
    code, _, err = cli("stats", basic, "-c", c)
    assert code == 2 and "readOnlyCommitLogStorePaths" in _error_line(err)
    c = conf(tmp_path, "readOnlyCommitLogStorePaths=/nowhere/ro\n")
    code, _, err = cli("stats", basic, "-c", c)
    assert code == 0 and "note: broker.conf readOnlyCommitLogStorePaths" in err


# --- reproducer 8: IndexFile geometry other than the 4x ratio -------------------------------


def _build(root: Path, slots: int, entries: int, n: int = 400) -> Path:
    cfg = StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=65536,
                      mapped_file_size_consume_queue=1280, max_hash_slot_num=slots,
                      max_index_num=entries)
    with MessageStore.open(root, cfg, create=True) as st:
        for i in range(n):
            st.put(Message(topic="TopicA", body=b"body-%d" % i, queue_id=i % 2,
                           properties={"KEYS": f"k{i} dup", "UNIQ_KEY": f"U{i:08d}"}))
    return root


@pytest.fixture(scope="module")
def non4x(tmp_path_factory) -> Path:
    """A healthy store with maxHashSlotNum=64, maxIndexNum=300 (IndexFiles of 6296 bytes)."""
    return _build(tmp_path_factory.mktemp("g") / "non4x", 64, 300)


def test_repair_keeps_index_files_of_a_non_4x_geometry(non4x, tmp_path):
    """At 5e9440d, repair --yes moved every IndexFile away and wrote one 420 MB file."""
    store = copy_store(non4x, tmp_path / "store")
    assert {p.stat().st_size for p in (store / "index").iterdir()} == {6296}
    before = tree_hashes(store)
    code, out, err = cli("repair", store, "--yes", "-f", "json")
    assert code == 0, err
    assert tree_hashes(store) == before
    cfg = load_config(store)  # decided from the entries, exactly
    assert (cfg.max_hash_slot_num, cfg.max_index_num) == (64, 300)
    assert cfg.sources["max_hash_slot_num"].startswith("files: IndexFile contents")
    code, out, _ = cli("query-key", store, "--topic", "TopicA", "--key", "k123", "-f", "jsonl")
    assert code == 0 and [json.loads(x)["keys"] for x in out.splitlines()] == [["k123", "dup"]]
    code, out, _ = cli("verify", store, "-f", "json", "--deep")
    assert code == 0 and json.loads(out)["ok"], out


def test_a_size_that_fits_the_4x_ratio_by_coincidence_is_read_by_its_entries(tmp_path):
    """69 slots / 255 entries make 5416-byte files, like 64 / 256 (the 4x reading)."""
    store = _build(tmp_path / "s", 69, 255, n=150)
    assert {p.stat().st_size for p in (store / "index").iterdir()} == {5416}
    cfg = load_config(store)
    assert (cfg.max_hash_slot_num, cfg.max_index_num) == (69, 255)
    with pytest.raises(ConfigError, match="maxHashSlotNum=69"):
        load_config(store, conf(tmp_path, "maxHashSlotNum=64\nmaxIndexNum=256\n"))
    code, out, _ = cli("query-key", store, "--topic", "TopicA", "--key", "k7", "-f", "jsonl")
    assert code == 0 and len(out.splitlines()) == 1


def test_default_geometry_with_one_entry_is_not_ambiguous(tmp_path):
    store = _build(tmp_path / "s", 5_000_000, 20_000_000, n=1)
    cfg = load_config(store)
    assert (cfg.max_hash_slot_num, cfg.max_index_num, cfg.undetermined) == (5_000_000, 20_000_000, {})


@pytest.fixture
def undetermined(non4x, tmp_path) -> Path:
    """The non-4x store whose only IndexFile was just created: no entries tell the
    geometry (a broker leaves this after rolling to a new file), and the size fits no
    default ratio."""
    store = copy_store(non4x, tmp_path / "store")
    for p in (store / "index").iterdir():
        p.unlink()
    IndexFile.create(store / "index" / "20260101000000000", IndexGeometry(64, 300)).close()
    return store


def test_undetermined_index_geometry_reads_warn_and_writes_refuse(undetermined, tmp_path):
    store = undetermined
    before = tree_hashes(store)
    code, out, err = cli("stats", store, "-f", "json")
    s = json.loads(out)
    assert code == 0 and s["commitLog"]["messages"] == 400
    assert "warning: the IndexFiles do not determine maxHashSlotNum and maxIndexNum" in err
    assert s["warnings"] and s["indexFiles"][0]["name"] == "20260101000000000"
    code, out, _ = cli("verify", store, "-f", "json")
    codes = {f["code"] for f in json.loads(out)["findings"]}
    assert code == 1 and "geometry-unknown" in codes and not {c for c in codes if c.startswith("index")}
    code, out, _ = cli("dump", store, "-f", "jsonl", "--body", "none")
    assert code == 0 and len(out.splitlines()) == 400  # the CommitLog needs no index
    for args in (["query-key", store, "--topic", "TopicA", "--key", "k1"],
                 ["get", store, "--topic", "TopicA", "--uniq-key", "U00000001"],
                 ["dump", store / "index" / "20260101000000000"]):
        code, _, err = cli(*args)
        assert code == 2 and "--config" in _error_line(err), (args, err)
    for args in (["repair", store, "--dry-run"], ["repair", store, "--yes"],
                 ["rebuild", store, "--index"], ["rebuild", store],
                 ["append", store, "--topic", "TopicA", "--body", "x"]):
        code, _, err = cli(*args)
        line = _error_line(err)
        assert code == 2 and "refused" in line and "--config" in line, (args, err)
    assert tree_hashes(store) == before
    # A ConsumeQueue rebuild does not need the IndexFile geometry.
    assert cli("rebuild", store, "--consumequeue")[0] == 0
    # With the broker.conf the store was written with, everything works.
    c = conf(tmp_path, "maxHashSlotNum=64\nmaxIndexNum=300\n")
    code, out, _ = cli("verify", store, "-c", c, "-f", "json")
    assert code == 1 and {f["code"] for f in json.loads(out)["findings"]} == {
        "commitlog-end", "index-behind"}  # the one true finding: nothing is indexed yet
    assert cli("repair", store, "-c", c, "--yes", "--backup", tmp_path / "b")[0] == 0
    assert cli("append", store, "-c", c, "--topic", "TopicA", "--keys", "new", "--body", "x")[0] == 0
    for key in ("k5", "new"):
        code, out, _ = cli("query-key", store, "--topic", "TopicA", "--key", key, "-f", "jsonl")
        assert code == 0 and len(out.splitlines()) == 1, key
    assert load_config(store).undetermined == {}  # the files now hold entries that tell


# --- never silently wrong: store kinds rmqstore does not support ----------------------------


@pytest.mark.parametrize("fixture", [("rocketmq-4.9.8-dledger", "basic"),
                                     ("rocketmq-4.9.8-dledger", "crash"),
                                     ("rocketmq-5.3.3-dledger", "basic")])
def test_a_dledger_store_is_read_never_reported_empty_and_the_rest_refuses(fixture, tmp_path):
    """At 5e9440d it verified as "ok, 0 messages" and dump printed nothing, exit 0. Issue #14
    WP C reads it (tests/test_dledger_read.py checks the answers against RocketMQ's), WP D1
    verifies, rebuilds and repairs it; append refuses naming DLedger (design-14 D3)."""
    store = copy_store(_fixture(*fixture), tmp_path / "store")
    before = tree_hashes(store)
    data = store / "dledger-n0" / "data"
    reads = {"dump", "get", "query-key", "stats", "verify", "repair --dry-run"}
    for name, args in _commands(store, tmp_path):
        if name in ("rebuild", "repair --yes"):  # writes: tests/test_dledger_{rebuild,repair}.py
            continue
        code, out, err = cli(*args)
        if name in reads:
            if name == "get":  # offset 0 is an entry header: no record starts there
                assert code == 2 and "outside the DLedger log" in _error_line(err), err
                args = ["get", store, "--offset", "48", "-f", "json"]
                code, out, err = cli(*args)
                assert code == 0 and json.loads(out)["commitLogOffset"] == 48, err
            elif name == "stats":
                assert code == 0 and json.loads(out)["commitLog"]["messages"] == 500, err
            elif name == "verify":  # WP D1: tests/test_dledger_verify.py checks the findings
                assert code in (0, 1) and json.loads(out)["messages"] == 500, err
            elif name == "repair --dry-run":  # WP G: tests/test_dledger_repair.py
                assert code in (0, 1), err
            elif name == "dump":
                assert code == 0 and len(out.splitlines()) == 2, err
            else:
                assert code == 0 and out.strip(), (name, err)
            assert "reads, verify, rebuild and repair are supported" in err, (name, err)
            continue
        assert code == 2, (name, code, out, err)
        assert "DLedger CommitLog" in _error_line(err), (name, err)
    for name, args in [("dump data file", ["dump", sorted(data.iterdir())[0]]),
                       ("dump data dir", ["dump", data]),
                       ("spark stats", ["spark", "stats", store]),
                       ("spark audit", ["spark", "audit", store])]:
        code, out, err = cli(*args)
        assert code == 2 and "DLedger CommitLog" in _error_line(err), (name, err)
    for name, args in [("dump cq", ["dump", store / "consumequeue" / "TopicA" / "0"]),
                       ("dump index", ["dump", sorted((store / "index").iterdir())[0]]),
                       ("dump checkpoint", ["dump", store / "checkpoint"])]:
        assert cli(*args)[0] == 0, name
    assert tree_hashes(store) == before
    cfg = load_config(store)
    assert [d.feature.key for d in cfg.features] == ["dledger"] and cfg.warnings == []
    assert cfg.mapped_file_size_commit_log == 65536  # from the DLedger data files


@pytest.mark.parametrize("text, what", [
    ("enableDLegerCommitLog=true", "DLedger CommitLog"),
    ("storeType=defaultRocksDB", "RocksDB consume queue"),
    ("messageStorePlugIn=org.apache.rocketmq.tieredstore.TieredMessageStore", "plug-in"),
    ("tieredBackendServiceProvider=org.apache.rocketmq.tieredstore.provider.PosixFileSegment",
     "plug-in"),
])
def test_broker_conf_keys_that_select_unsupported_storage(basic, tmp_path, text, what):
    c = conf(tmp_path, text + "\n")
    before = tree_hashes(basic)
    for name, args in _commands(basic, tmp_path):
        code, _, err = cli(*args, "-c", c)
        assert code == 2 and what in _error_line(err), (name, err)
    assert tree_hashes(basic) == before


def test_a_rocksdb_consume_queue_on_disk_is_refused(basic, tmp_path):
    for name in ("CURRENT", "MANIFEST-000005", "000004.sst"):
        (basic / "consumequeue" / name).write_bytes(b"rocksdb")
    before = tree_hashes(basic)
    for name, args in _commands(basic, tmp_path):
        code, _, err = cli(*args)
        assert code == 2 and "RocksDB consume queue" in _error_line(err), (name, err)
    assert tree_hashes(basic) == before


# lmq and batch-cq (read, verified and rebuilt: tests/test_queues_5x_recovery.py) and prop-crc
# (supported: tests/test_prop_crc.py) no longer warn; what still refuses is tested there.


def test_prop_crc_from_broker_conf_refuses_append(basic, tmp_path):
    c = conf(tmp_path, "enabledAppendPropCRC=true\n")
    before = tree_hashes(basic)
    code, _, err = cli("append", basic, "-c", c, "--topic", "TopicA", "--body", "x")
    assert code == 2 and "append refused" in _error_line(err)
    assert tree_hashes(basic) == before


@pytest.mark.parametrize("path, feature", [("timerlog/00000000000000000000", "timer-message store"),
                                           ("compaction/compactionLog/TopicC/0/00000000000000000000",
                                            "compacted topics")])
def test_timer_and_compaction_data_refuse_repair(basic, tmp_path, path, feature):
    p = basic / path
    p.parent.mkdir(parents=True)
    p.write_bytes(b"\x01" * 64)
    before = tree_hashes(basic)
    code, _, err = cli("repair", basic, "--dry-run")
    assert code == 2 and "repair refused" in _error_line(err) and feature in err
    code, out, err = cli("verify", basic, "-f", "json")
    assert code == 1 and "warning: the store uses" in err and feature in err
    assert tree_hashes(basic) == before


def test_plain_4_9_and_5_x_stores_have_no_feature_warnings():
    for store in (_fixture("rocketmq-4.9.8", "basic"), _fixture("rocketmq-5.3.3", "basic"),
                  _fixture("rocketmq-5.3.3", "crash-recovered")):
        cfg = load_config(store)
        assert cfg.features == [] and cfg.warnings == [] and cfg.undetermined == {}, store


def test_a_new_store_never_takes_its_commitlog_from_broker_conf(basic, tmp_path):
    """append --create with the live broker's broker.conf must not write into its CommitLog."""
    before = tree_hashes(basic)
    c = conf(tmp_path, f"storePathCommitLog={basic / 'commitlog'}\n")
    new = tmp_path / "new"
    code, _, err = cli("append", new, "--create", "-c", c, "--commitlog-size", "65536",
                       "--topic", "T", "--body", "x")
    assert code == 0, err
    assert "is not used for a new store" in err
    assert [p.name for p in (new / "commitlog").iterdir()] == ["00000000000000000000"]
    assert tree_hashes(basic) == before


# --- the evidence behind the geometry -------------------------------------------------------


@pytest.mark.parametrize("folder", ["rocketmq-4.9.8", "rocketmq-5.3.3"])
def test_index_entries_agree_with_the_true_slot_count_only(folder):
    """RocketMQ's own IndexFiles (64 slots, 256 entries): every file with entries agrees
    with 64 and contradicts the neighbouring counts that give a whole number of entries."""
    from rmqstore.files.index_geometry import AGREE, CONTRADICT, IndexFiles, judge

    checked = 0
    for store in sorted(_fixture(folder).iterdir()):
        view = IndexFiles(store / "index")
        for f in view.with_entries:
            assert judge(f, 64) == AGREE, f.path
            assert judge(f, 59) == judge(f, 69) == judge(f, 54) == CONTRADICT, f.path
            checked += 1
    assert checked >= 20


def test_one_damaged_index_file_does_not_hide_the_geometry(non4x, tmp_path):
    store = copy_store(non4x, tmp_path / "store")
    victim = sorted((store / "index").iterdir())[1]
    data = bytearray(victim.read_bytes())
    data[24:32] = (123456789).to_bytes(8, "big")  # endPhyOffset: no longer its last entry's
    victim.write_bytes(bytes(data))
    cfg = load_config(store)
    assert (cfg.max_hash_slot_num, cfg.max_index_num, cfg.undetermined) == (64, 300, {})
    code, out, _ = cli("verify", store, "-f", "json")
    assert code == 1 and "geometry-unknown" not in {f["code"] for f in json.loads(out)["findings"]}


def test_commitlog_segments_of_conflicting_sizes_need_config_to_write(basic, tmp_path):
    segs = sorted((basic / "commitlog").iterdir())
    for seg in segs[2:]:
        seg.unlink()
    for seg, size in zip(segs, (30000, 50000)):  # both cut short: no size is evident
        with open(seg, "r+b") as f:
            f.truncate(size)
    before = tree_hashes(basic)
    code, out, err = cli("stats", basic, "-f", "json")
    assert code == 0 and "do not determine mappedFileSizeCommitLog" in err
    code, _, err = cli("repair", basic, "--dry-run")
    assert code == 2 and "--config" in _error_line(err)
    assert tree_hashes(basic) == before
    c = conf(tmp_path, "mappedFileSizeCommitLog=65536\n")
    assert load_config(basic, c).sources["mapped_file_size_commit_log"].startswith("broker.conf")
    # A plan, from the setting; it would move a segment of valid records after the cut
    # first segment, so the guard refuses it without --allow-data-loss.
    code, _, err = cli("repair", basic, "--dry-run", "-c", c)
    assert code == 2 and "--allow-data-loss" in _error_line(err)
    assert cli("repair", basic, "--dry-run", "-c", c, "--allow-data-loss")[0] == 1
    c = conf(tmp_path, "mappedFileSizeCommitLog=40000\n")  # smaller than a file: impossible
    code, _, err = cli("stats", basic, "-c", c)
    assert code == 2 and "50000" in _error_line(err)


def test_a_cut_index_file_does_not_make_the_geometry_unknown(tmp_path):
    store = copy_store(_fixture("rocketmq-4.9.8", "crash"), tmp_path / "store")
    last = sorted((store / "index").iterdir())[-1]
    with open(last, "r+b") as f:
        f.truncate(3000)
    cfg = load_config(store)
    assert (cfg.max_hash_slot_num, cfg.max_index_num, cfg.undetermined) == (64, 256, {})
    code, out, _ = cli("repair", store, "--dry-run", "-f", "json")
    assert code == 1 and any(s["path"] == f"index/{last.name}" for s in json.loads(out)["steps"])
