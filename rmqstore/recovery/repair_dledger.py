"""What repair does on a DLedger store (design-14 D3, D4, §1.10): the steps that touch only
rmqstore's side of it (IndexFiles, ConsumeQueues rebuilt or extended from the entries, the
root checkpoint, ``abort``), never ``dledger-*/`` (data, index, ``checkpoint``,
``currterm``: DLedger's own recovery owns them and the Raft group's terms are not ours to
write). Problems inside the DLedger files are left to DLedger's next start, with the reason.
"""

from __future__ import annotations

#: Steps repair runs on a DLedger store; any other is refused with :data:`NOT_YET`.
STEPS = ("remove-leftover", "move-stray", "rebuild-queue", "dispatch-queue", "rebuild-bcq",
         "dispatch-bcq", "remove-index", "reindex", "write-checkpoint", "remove-abort",
         "create-abort")
NOT_YET = ("not supported on a DLedger store yet (repair writes nothing under dledger-*/ and "
           "has no DLedger-framed evidence for this step); DLedger's and RocketMQ's next start "
           "do it, or --allow-data-loss")

#: DLedger findings repair leaves as they are, and why.
UNFIXED = {
    "dledger-torn": "DLedger's recovery cuts the entry chain there on its next start; repair "
                    "never writes dledger-*/",
    "dledger-chain-break": "DLedger never walks that file again; repair never writes dledger-*/",
    "dledger-index-mismatch": "DLedger rewrites its index from its start file on; repair never "
                              "writes dledger-*/",
    "dledger-index-missing": "DLedger rewrites its index from its start file on; repair never "
                             "writes dledger-*/",
    "dledger-record-bad": "the entry is DLedger's (it keeps it); rebuild dispatches every valid "
                          "record around it",
    "dledger-files": "files DLedger refuses to load: fix them by hand (repair never writes "
                     "dledger-*/)",
}


def is_dledger(report) -> bool:
    """Was the store verified as a DLedger log (:class:`~rmqstore.scan.dledger_scan.DLedgerScan`)?"""
    return getattr(report.scan, "chain", None) is not None


def refused(report, steps) -> list:
    """(step, why) for each planned step repair does not run on a DLedger store."""
    if not is_dledger(report):
        return []
    return [(s, NOT_YET) for s in steps if s.action not in STEPS]


def unfixed(report) -> list:
    """(finding, why) for the DLedger problems no step fixes."""
    if not is_dledger(report):
        return []
    return [(f, UNFIXED[f.code]) for f in report.problems if f.code in UNFIXED]
