"""A store on a small file system that fills up (issue 11, item 5): read-only commands
answer as before and change no byte or block; append, rebuild and repair fail with one
line and exit 2, never a bus error or a traceback; verify then finds the store as it was
or resumable, and once there is room the store is finished with nothing lost.

The small file system is a real tmpfs where the test can mount one (root, or a user
namespace), else ENOSPC is injected into the write calls (tests/full_disk.py says what
each way proves). The way it ran is printed and recorded as the test's ``small_fs``
property; ``RMQSTORE_SMALL_FS=tmpfs|userns|inject`` forces one.
"""

from __future__ import annotations

import warnings

import pytest

import full_disk

BUS_ERROR = (-7, 135)  # SIGBUS seen by subprocess / by a shell
#: What a crash (or a stop half-way) leaves and the next open or repair finishes.
RESUMABLE = {"abort-present", "index-behind", "cq-missing-tail", "commitlog-preallocated",
             "commitlog-end"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    work = tmp_path_factory.mktemp("full-disk")
    mode = full_disk.small_fs_mode(work / "probe")
    print(f"\n[full-disk] small file system: {mode}")
    if mode == "inject":
        warnings.warn("full-disk tests ran with injected ENOSPC (no tmpfs could be mounted): "
                      "writes through memory maps were not tested on a real full disk")
    return full_disk.run_in_mode(work / "scenario", mode)


@pytest.fixture(autouse=True)
def _say_how(run, record_property):
    record_property("small_fs", run["mode"])


def one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rmqstore: "), stderr
    assert "Traceback" not in stderr and "internal error" not in stderr
    return lines[0]


def test_the_store_was_made(run):
    assert run["create"]["rc"] == 0, run["create"]["stderr"]
    v = run["verify_before"]
    assert (v["rc"], v["messages"]) == (0, 300)
    assert ["info", "commitlog-preallocated"] in v["findings"]  # a sparse segment, all hole


def test_read_only_commands_on_a_full_disk(run):
    for name, r in run["read"].items():
        assert r["rc"] not in BUS_ERROR, f"{name} died of SIGBUS"
        assert r["rc"] == 0 and r["stderr"] == "", (name, r)
    assert run["read"]["dump"]["lines"] == 300
    assert run["read_verify"]["findings"] == run["verify_before"]["findings"]
    assert run["read_unchanged"]  # not one byte or mtime
    if run["mode"] != "inject":
        free_before, free_after = run["read_free_blocks"]
        assert free_before == free_after == 0  # reading the holes allocated nothing


def test_append_stops_with_one_line_and_a_resumable_store(run):
    a = run["append"]
    assert a["rc"] == 2, a
    assert "No space left on device" in one_line(a["stderr"])
    assert a["other"] == 0
    if run["mode"] != "inject":
        assert a["put_ok"] > 100  # it filled the room there was, then stopped
    v = run["verify_after_append"]
    assert v["rc"] in (0, 1) and v["messages"] == 300 + a["put_ok"]
    assert {code for sev, code in v["findings"] if sev != "info"} <= RESUMABLE, v["findings"]
    assert not [code for sev, code in v["findings"] if sev == "error"]


def test_rebuild_stops_with_one_line_and_keeps_the_old_files(run):
    r = run["rebuild"]
    assert r["rc"] == 2, r
    line = one_line(r["stderr"])
    assert "No space left on device" in line and "as they were" in line
    assert run["rebuild_kept_files"]
    assert run["rebuild_scratch_left"] == []
    assert run["verify_after_rebuild"]["findings"] == run["verify_after_append"]["findings"]


def test_repair_fails_cleanly(run):
    r = run["repair"]
    assert r["rc"] not in BUS_ERROR
    assert r["rc"] == 2, r
    # Refused by the space preflight before any change, or stopped by ENOSPC mid-way.
    line = one_line(r["stderr"])
    assert "not enough free space" in line or "No space left on device" in line, line
    after, before = run["verify_after_repair"], run["verify_before_repair"]
    assert after["rc"] not in BUS_ERROR and after["messages"] == before["messages"]
    new = {code for sev, code in after["findings"]} - {code for sev, code in before["findings"]}
    assert new <= RESUMABLE, new  # nothing worse than what repair finishes next time


def test_with_room_again_the_store_is_finished_and_nothing_is_lost(run):
    assert run["repair_with_room"]["rc"] == 0, run["repair_with_room"]["stderr"]
    v = run["verify_final"]
    assert v["rc"] == 0 and not [f for f in v["findings"] if f[0] != "info"], v
    n = 300 + run["append"]["put_ok"]
    assert run["final_bodies"] == [f"b{i:06d}" for i in range(n)]
