"""One vocabulary of findings (issue #13): verify's codes and the Spark audit's ConsumeQueue
kinds are defined once, in ``rmqstore.recovery.findings``, and both checks use only it.

The audit's rules (spec §6.1, §9, §10.4; docs/pipeline.md "audit") decide the golden
findings of the hand-built queue below; the code under test supplies none of them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from rmqstore.format import layout as L
from rmqstore.pipeline import audit as A
from rmqstore.recovery.findings import CODES, CQ_AUDIT_KINDS, INFO, Collector

REPO = Path(__file__).resolve().parents[1]


def test_every_kind_the_audit_finds_on_a_damaged_queue():
    # CommitLog valid from 1000 to 2000; records imply (queue offset, offset, size, tagsCode)
    implied = [(0, 1000, 100, 1), (1, 1100, 100, 2), (1, 1200, 100, 3),  # qo 1 twice
               (3, 1300, 100, 4),  # no record for qo 2
               (4, 1400, 100, 5)]  # no unit on disk
    existing = [(0, 1000, 100, 1),
                (1, 1100, 100, 9),  # wrong tagsCode
                (3, 1300, 100, 4),
                (5, 500, 100, 0),  # below the CommitLog minimum: deleted head
                (6, 1500, 100, 0),  # inside the log, but no record implies qo 6
                (7, 2500, 100, 0),  # past the end of valid data
                (8, 0, L.CQ_PLACEHOLDER_SIZE, 0)]  # the broker's pre-fill: not data
    cols = lambda rows: [list(c) for c in zip(*rows)]
    found = A.audit_queue(*cols(existing), *cols(implied), 1000, 2000)
    assert [(f["kind"], f["queueOffset"]) for f in found] == [
        ("duplicate", 1), ("mismatch", 1), ("hole", 2), ("missing", 4), ("expired", 5),
        ("extra", 6), ("beyond-end", 7)]
    mismatch = found[1]
    assert (mismatch["expectedTagsCode"], mismatch["actualTagsCode"]) == (2, 9)
    assert mismatch["detail"] == "wrong tagsCode"
    # the vocabulary holds exactly what the audit says, and only "expired" is not a problem
    assert {f["kind"] for f in found} == set(CQ_AUDIT_KINDS)
    assert A.INFO == ("expired",)
    assert set(A.PROBLEMS) == set(CQ_AUDIT_KINDS) - {"expired"}


def test_the_audit_refuses_a_kind_outside_the_vocabulary():
    with pytest.raises(ValueError):
        A._finding("holes", 0)


def test_audit_kinds_name_verify_codes_that_exist():
    for kind, (severity, meaning, codes) in CQ_AUDIT_KINDS.items():
        assert severity in ("error", "warning", "info") and meaning
        assert all(c in CODES and c.startswith("cq-") for c in codes), kind
    assert CQ_AUDIT_KINDS["expired"][0] == INFO


_CODE_SHAPE = re.compile(r"(commitlog|record|cq|index)-[a-z]+(-[a-z]+)*")


def _code_literals(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and _CODE_SHAPE.fullmatch(n.value)}


def test_every_code_verify_writes_is_in_the_vocabulary():
    used = set()
    for p in sorted((REPO / "rmqstore" / "recovery").glob("verify*.py")):
        used |= _code_literals(p)
    assert {"cq-missing-tail", "cq-tags-mismatch", "index-chain", "commitlog-tail"} <= used
    assert used - set(CODES) == set()


def test_a_code_outside_the_vocabulary_is_refused_even_with_a_severity(tmp_path):
    c = Collector(tmp_path)
    c.add("cq-missing-tail", tmp_path / "x", 0, "fine", severity="error")
    assert c.findings[0].severity == "error" and c.findings[0].file == "x"
    with pytest.raises(KeyError):
        c.add("cq-missing-tails", None, None, "typo", severity="warning")
