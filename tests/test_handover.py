"""The workers' hand-over format (rmqstore.scan.handover) is defined once: both parts, the
per-record columns verify merges and the grouped units a rebuild joins, carry the same
head, and the head alone gives every record's offset and size as RocketMQ walked them
(manifest ``commitlogWalk``)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import MESSAGE_SCENARIOS, ROCKETMQ_498, manifest, scenario_params
from rmqstore.files.config import load_config
from rmqstore.scan import handover
from rmqstore.scan.dispatch import dispatch_split
from rmqstore.scan.per_queue import grouped_split
from rmqstore.scan.runner import scan_chains

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("scenario", scenario_params(["basic", "special", "ipv6"]))
@pytest.mark.parametrize("task, payload", [(dispatch_split, handover.COLUMNS),
                                           (grouped_split, handover.GROUPED)],
                         ids=["columns", "grouped"])
def test_every_part_is_the_head_and_one_payload(scenario, task, payload):
    cfg = load_config(ROCKETMQ_498 / scenario)
    chains = scan_chains(cfg, functools.partial(task, delay_millis=cfg.delay_millis),
                         processes=1, split_size=4096)
    parts = [d for chain in chains for d in chain]
    assert len(parts) > 3  # several ranges per segment, so the head is joined across them
    offsets, sizes = [], []
    for d in parts:
        assert set(d) == set(handover.HEAD) | set(payload)
        assert d["size"].dtype == np.int32 and len(d["size"]) == d["n"]
        offsets += handover.record_offsets(d).tolist()
        sizes += d["size"].tolist()
        assert handover.flags(d, "consistent").all() and handover.flags(d, "crc_ok").all()
    walk = [(e["offset"], e["size"]) for e in manifest(scenario)["commitlogWalk"]
            if e["type"] == "MESSAGE"]
    assert list(zip(offsets, sizes)) == walk


def test_flags_left_out_mean_all_true_and_sent_ones_are_kept():
    d = {"n": 3, "consistent": None, "crc_ok": np.array([True, False, True])}
    assert handover.flags(d, "consistent").tolist() == [True, True, True]
    assert handover.flags(d, "crc_ok").tolist() == [True, False, True]


def test_record_offsets_follow_the_sizes_from_the_first():
    d = {"first": 1000, "size": np.array([91, 103, 2**31 - 1], np.int32)}
    assert handover.record_offsets(d).tolist() == [1000, 1091, 1194]
    assert handover.record_offsets({"first": 0, "size": np.zeros(0, np.int32)}).tolist() == []


def test_no_other_module_builds_a_part_head():
    """A second packer would restate the head; it must call handover.head instead."""
    pat = re.compile(r"""["']chain_end["']\s*:|np\.cumsum\(\s*size\[:-1\]""")
    found = [p.relative_to(REPO).as_posix() for p in sorted((REPO / "rmqstore").rglob("*.py"))
             if pat.search(p.read_text(encoding="utf-8"))]
    assert found == ["rmqstore/scan/handover.py"]
