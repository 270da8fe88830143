"""Filters in the library (dump's and scripts'), the reason a scan stops, and key queries that
return every hit. Golden data: the fixtures' manifests, and for more than 64 hits a store
written here whose put results say where each message went."""

from __future__ import annotations

import datetime as dt

import pytest

from conftest import ROCKETMQ_498, manifest, scenario_params
from rmqstore.format.message import Host, Message, split_keys
from rmqstore.files.config import StoreConfig
from rmqstore.errors import InputError
from rmqstore.reader import open_segment_file, open_store
from rmqstore.selection import MessageFilter
from rmqstore.engine.store import MessageStore


def _stored(scenario):
    return sorted((e["stored"] for e in manifest(scenario)["messages"]), key=lambda s: s["phyOffset"])


def _offsets(store, **f):
    return [m.commit_log_offset for m in store.messages(**f)]


@pytest.mark.parametrize("scenario", scenario_params(["basic"]))
def test_every_filter_against_the_manifest(scenario):
    stored = _stored(scenario)
    mid = stored[250]["storeTimestamp"]
    cases = [
        (dict(topic="TopicB"), lambda s: s["topic"] == "TopicB"),
        (dict(topic=["TopicB", "TopicHot"], queue_id=[0]), lambda s: s["topic"] in ("TopicB", "TopicHot") and s["queueId"] == 0),
        (dict(key="dup-key"), lambda s: "dup-key" in split_keys(s["keys"])),
        (dict(key=["user-4", "user-9"]), lambda s: {"user-4", "user-9"} & set(split_keys(s["keys"]))),
        (dict(uniq_key=stored[7]["uniqKey"]), lambda s: s["uniqKey"] == stored[7]["uniqKey"]),
        (dict(since=mid), lambda s: s["storeTimestamp"] >= mid),
        (dict(since=mid // 1000 * 1000, until=mid + 500), lambda s: mid // 1000 * 1000 <= s["storeTimestamp"] <= mid + 500),
        (dict(from_offset=70000, to_offset=200000), lambda s: 70000 <= s["phyOffset"] < 200000),
    ]
    tags = sorted({s["tags"] for s in stored if s["tags"]})
    cases.append((dict(tag=tags[0]), lambda s: s["tags"] == tags[0]))
    cases.append((dict(tag=f"{tags[0]} || {tags[1]}"), lambda s: s["tags"] in tags[:2]))
    cases.append((dict(tag="*"), lambda s: True))
    with open_store(ROCKETMQ_498 / scenario) as store:
        for f, want in cases:
            expected = [s["phyOffset"] for s in stored if want(s)]
            assert expected, f
            assert _offsets(store, **f) == expected, f
            # the scalar form (used by --follow) agrees with the vectorised one
            flt = MessageFilter.make(**f)
            assert [m.commit_log_offset for m in store.messages() if flt.matches(m)] == expected, f
        assert _offsets(store, topic="TopicA", limit=3) == [s["phyOffset"] for s in stored if s["topic"] == "TopicA"][:3]
        # max_bytes: only records that end within the first N bytes read
        assert _offsets(store, max_bytes=20000) == [s["phyOffset"] for s in stored
                                                    if s["phyOffset"] + s["storeSize"] <= 20000]
        assert _offsets(store, from_offset=65536, max_bytes=30000) == [
            s["phyOffset"] for s in stored if 65536 <= s["phyOffset"] and s["phyOffset"] + s["storeSize"] <= 95536]


@pytest.mark.parametrize("scenario", scenario_params(["basic"]))
def test_times_in_any_form_no_numpy_error(scenario):
    stored = _stored(scenario)
    mid = stored[250]["storeTimestamp"]
    expected = [s["phyOffset"] for s in stored if s["storeTimestamp"] >= mid // 1000 * 1000]
    iso = dt.datetime.fromtimestamp(mid // 1000, dt.timezone.utc).isoformat()
    with open_store(ROCKETMQ_498 / scenario) as store:
        # issue #12: an ISO string raised numpy's UFuncTypeError; seconds read as 1970
        assert _offsets(store, since=iso) == expected
        assert _offsets(store, since=mid // 1000) == expected
        assert _offsets(store, since=dt.datetime.fromtimestamp(mid // 1000, dt.timezone.utc)) == expected
        with pytest.raises(InputError):
            list(store.messages(since="last tuesday"))
        with pytest.raises(InputError):
            list(store.messages(limit=-1))


@pytest.mark.parametrize("scenario,reason,damaged", [("basic", "zeros", False), ("crash", "zeros", False),
                                                     ("crash-torn", "half record", True)])
def test_scan_says_why_it_stopped(scenario, reason, damaged):
    if not ROCKETMQ_498.is_dir():
        pytest.skip("no fixtures")
    m = manifest("crash" if scenario.startswith("crash") else scenario)
    with open_store(ROCKETMQ_498 / scenario) as store:
        scan = store.scan()
        n = sum(1 for _ in scan.messages())
        assert (scan.stop.reason, scan.stop.damaged) == (reason, damaged)
        assert scan.bad_crc == 0
    if scenario == "crash-torn":  # the torn record (README: at 464829) is not given
        assert n == 399 and scan.stop.offset == 464829
        assert scan.stop.path.endswith("00000000000000458752")
    else:
        assert n == len(m["messages"])


@pytest.mark.parametrize("scenario", scenario_params(["basic"]))
def test_missing_segment_is_damage(scenario, tmp_path):
    import shutil

    root = tmp_path / "s"
    shutil.copytree(ROCKETMQ_498 / scenario, root)
    (root / "commitlog" / "00000000000000131072").unlink()
    with open_store(root) as store:
        scan = store.scan()
        offs = [m.commit_log_offset for m in scan.messages()]
    assert offs == [s["phyOffset"] for s in _stored(scenario) if s["phyOffset"] < 131072]
    assert (scan.stop.reason, scan.stop.offset, scan.stop.damaged) == ("missing segment", 131072, True)


# --- query-key -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hot_store(tmp_path_factory):
    """80 messages with KEYS "hot" spread over several index files (so the broker's walk
    crosses files), 20 others; returns (root, offsets of the hot ones in put order)."""
    root = tmp_path_factory.mktemp("hot") / "store"
    cfg = StoreConfig(mapped_file_size_commit_log=65536, mapped_file_size_consume_queue=1280,
                      max_hash_slot_num=64, max_index_num=64)
    hot = []
    with MessageStore.open(root, cfg, create=True) as s:
        for i in range(100):
            keys = "hot" if i % 5 else f"cold-{i}"
            r = s.put(Message(topic="TopicQ", body=b"x" * 700, properties={"KEYS": keys, "UNIQ_KEY": f"{i:032X}"},
                              born_timestamp=1_718_000_000_000 + i, store_timestamp=1_718_000_000_000 + 1000 * i,
                              born_host=Host(b"\x0a\x00\x00\x01", 5000)))
            assert r.status.value == "PUT_OK"
            if keys == "hot":
                hot.append(r.offset)
    assert len(hot) == 80 and len(list((root / "index").iterdir())) > 1
    return root, hot


def test_query_key_returns_every_hit(hot_store):
    root, hot = hot_store
    with open_store(root, max_hash_slot_num=64, max_index_num=64) as store:
        got = store.query_key("TopicQ", "hot", 1000)
        assert [m.commit_log_offset for m in got] == hot and got.truncated is False
        every = store.query_key("TopicQ", "hot", max_num=10_000)
        assert len(every) == 80 and not every.truncated
        newest = store.query_key("TopicQ", "hot", 10)
        assert [m.commit_log_offset for m in newest] == hot[-10:] and newest.truncated is True
        # as the broker (and mqadmin) answer: maxMsgsNumBatch = 64 index hits, newest first
        capped = store.query_key("TopicQ", "hot", 1000, broker_cap=True)
        assert [m.commit_log_offset for m in capped] == hot[-64:]
        assert capped.truncated is True and capped.broker_cap == 64
        # a time window, in any time form
        window = store.query_key("TopicQ", "hot", begin="2024-06-10T06:14:00Z", end=1_718_000_060_000)
        assert all(1_718_000_040_000 <= m.store_timestamp <= 1_718_000_060_000 for m in window)
        assert len(window) == sum(1 for i in range(100) if i % 5 and 40 <= i <= 60)
        assert store.query_key("TopicQ", "nope") == [] and not store.query_key("TopicQ", "nope").truncated
        with pytest.raises(InputError):
            store.query_key("TopicQ", "hot", 0)


@pytest.mark.parametrize("scenario", scenario_params(["basic"]))
def test_fixture_queries_are_whole_and_not_truncated(scenario):
    """Every query RocketMQ answered (maxNum 64) returned fewer than 64 offsets, so our
    uncapped and capped answers agree and neither says truncated."""
    m = manifest(scenario)
    with open_store(ROCKETMQ_498 / scenario) as store:
        for q in m["queries"][::5]:
            full = store.query_key(q["topic"], q["key"])
            capped = store.query_key(q["topic"], q["key"], broker_cap=True)
            assert [x.commit_log_offset for x in full] == [x.commit_log_offset for x in capped]
            assert not full.truncated and not capped.truncated
            assert {x.commit_log_offset for x in full} <= set(q["phyOffsets"])


def test_segment_file_scan(tmp_path):
    from conftest import SEGMENT_4X

    if not SEGMENT_4X.exists():
        pytest.skip("no fixtures")
    with open_segment_file(SEGMENT_4X) as r:
        scan = r.scan()
        assert sum(1 for _ in scan.messages()) == 47
        # the 8 KiB extract ends in a BLANK record at 8084 (size 108, blank magic)
        assert (scan.stop.reason, scan.stop.offset, scan.stop.damaged) == ("blank", 8084, False)
