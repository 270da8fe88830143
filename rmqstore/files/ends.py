"""Where valid CommitLog data ends, and why: one type and one vocabulary of reasons for
every walk that answers it (spec §3.9, §4, §10.1, §10.5).

:class:`ValidEnd` is the answer. The walks carry one in their own result types:
:class:`~rmqstore.files.commitlog.ScanEnd` (the broker-faithful record walk, ``find_end``),
:class:`~rmqstore.scan.records.SegmentScan` (one segment, vectorised),
:class:`~rmqstore.scan.dispatch.StoreScan` (the whole log, for verify and rebuild) and
:class:`~rmqstore.scan.splits.StoreEnd` (the split walk, for the Spark jobs and stats).
Which rule decides where bodies failing their CRC end the data is in
:mod:`rmqstore.format.rules` (``broker_end``, ``rmqstore_end``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Every reason a walk gives, with what it means. The names are user-visible (verify's
#: ``endReason`` and ``commitlog-end`` finding, ``stats``, Spark's ``ends``): never renamed.
REASONS = {
    "": "valid data runs to the end of the last segment (its BLANK or its last byte)",
    "end": "the segment's record chain reaches the end of its readable bytes",
    "blank": "the segment's record chain reaches its BLANK; the next segment continues (§4)",
    "range": "a piece of a segment stops where its byte range does; the chain goes on",
    "none": "no record starts in a split's byte range",
    "short": "fewer than 8 bytes left: no record header fits",
    "zeros": "an all-zero header: the end of written data",
    "bad magic": "a magic code that is neither a message nor a BLANK",
    "bad size": "a TOTALSIZE below the smallest record or past the data",
    "half record": "the length fields do not add up to TOTALSIZE (§3.9's FAIL_WITH_SIZE)",
    "crc": "a body fails its CRC: the broker's recovery stops there (rules.broker_end)",
    "torn": "records failing their CRC end the chain: a torn tail (§10.5, rules.rmqstore_end)",
    "missing segment": "the next segment file is missing: a gap in the file names (§2)",
    "short file": "the last segment file is shorter than the segment size",
    "no segments": "the CommitLog has no segment file",
}

#: How verify (its ``endReason`` and the ``commitlog-end`` finding) has always spelled two
#: of the reasons; :attr:`rmqstore.scan.dispatch.StoreScan.reason` keeps these spellings.
VERIFY_SPELLING = {"half record": "torn", "missing segment": "gap"}


@dataclass(frozen=True)
class ValidEnd:
    """Valid data ends at ``offset`` because of ``reason`` (a key of :data:`REASONS`),
    after ``records`` valid records counted by the walk that found it."""

    offset: int  # first byte after the last valid record (the broker's processOffset)
    reason: str
    records: int
