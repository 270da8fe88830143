"""Every place rmqstore removes, renames or truncates a file is reviewed (issue #11).

A repair, rebuild or restore must never change a byte outside the store and its backup
folder, and never delete what holds valid records without evidence. The behaviour is
tested elsewhere (tests/test_hostile.py, test_repair_journal.py, the fuzz suite's
``wrote-outside``/``prefix-lost`` invariants); this test keeps the list of call sites that
can destroy bytes closed: a new ``unlink``, ``rename``, ``rmtree``, ``ftruncate``… in
``rmqstore/`` fails here until it is added below with the reason it is confined.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "rmqstore"

#: Method names that destroy bytes or names whatever object they are called on.
ANY_OBJECT = {"unlink", "rename", "rmdir", "ftruncate", "truncate", "rmtree", "remove_tree",
              "removedirs"}
#: Names that only destroy as functions of ``os`` (``str.replace``, ``dataclasses.replace``
#: and ``list.remove`` do not).
OS_ONLY = {"replace", "remove"}

#: (enclosing function, call) -> why it stays inside the store, its scratch or its backup.
REVIEWED = {
    # Writer engine: files it creates itself, inside the store it holds the lock of.
    ("ConsumeQueueWriter.__init__", "unlink"): "a queue file it created, on ENOSPC",
    ("ConsumeQueueWriter._fd", "ftruncate"): "sizes a new queue file (a hole, §2)",
    ("BatchConsumeQueueWriter._fd", "ftruncate"): "sizes a new BatchConsumeQueue file (a "
                                                  "hole); only ever extends",
    ("IndexFile.__init__", "ftruncate"): "sizes a new IndexFile (a hole)",
    ("IndexFile.__init__", "unlink"): "an IndexFile it created, on ENOSPC",
    ("SegmentQueue.delete_from", "unlink"): "segments after the end, refused unless empty "
                                            "or our own interrupted append (store reopen)",
    ("create_segment_file", "ftruncate"): "sizes a new segment (a hole, §2)",
    ("create_segment_file", "replace"): "a new segment made under a temporary name",
    ("_create_nameless", "ftruncate"): "sizes a new nameless segment before it is linked in",
    ("SegmentQueue._remove_unfinished", "unlink"): "a writer's own '.NAME.new' left by a crash "
                                                   "between sizing and renaming, only when "
                                                   "every byte is zero (holds_no_data)",
    ("recover_unfinished", "unlink"): "an IndexFile put interrupted by our own writer",
    ("_write_file", "unlink"): "a store state file (abort) this call created, when its "
                               "write fails (O_NOFOLLOW)",
    ("remove_abort", "unlink"): "abort, a store state file",
    # Repair: every path confined to the store (journal.confine) and saved first.
    ("Journal._save", "ftruncate"): "the backup copy of a range, in the backup folder",
    ("Journal.begin", "remove_tree"): "the journal folder left by a run killed after it ended",
    ("Journal.end", "remove_tree"): "the journal folder of --no-backup, after success",
    ("Journal.move", "remove_tree"): "a half-copied .partial in the backup; the source after "
                                     "a cross-device copy is complete and fsync'd",
    ("Journal.move", "rename"): "store path -> backup (confined, same device)",
    ("_backup_target", "unlink"): "the manifest and journal of a run killed before its "
                                  "marker (journal.abandoned_begin), in the backup folder",
    ("remove_marker", "unlink"): "STORE/.rmqstore-repair, our own marker",
    ("write_marker", "replace"): "STORE/.rmqstore-repair, written under a temporary name",
    ("zero_range", "ftruncate"): "a zero-tail/cut-queue/cut-bcq/dispatch-bcq step on a "
                                 "confined, saved file (extends a BatchConsumeQueue file "
                                 "to its size with a hole, as the broker's map does)",
    ("run", "ftruncate"): "extend-segment on a confined, saved segment (a hole)",
    ("_drop_special", "unlink"): "a FIFO/socket/device where a state file belongs, saved as "
                                 "its kind first",
    # Restore: puts the backup's bytes back, inside the store.
    ("_restore_path", "ftruncate"): "a restored file back to its saved size",
    ("_restore_path", "remove_tree"): "what a step put at a confined path, before the saved "
                                      "state goes back",
    ("_restore_path", "rename"): "backup -> store path, or a restore temporary into place",
    ("_restore_item", "rmdir"): "directories the step created above its path, while empty",
    ("_restore_lock", "ftruncate"): "lock, back to its saved bytes",
    ("_restore_lock", "unlink"): "lock that did not exist before the repair",
    ("resume", "remove_tree"): "the journal folder once everything is undone",
    ("_clean_leftovers", "remove_tree"): "our own marker temporary and internal folder",
    ("remove_tree", "remove_tree"): "the recursion (never follows links)",
    ("remove_tree", "rmdir"): "the recursion",
    ("remove_tree", "unlink"): "the recursion (links removed as links)",
    ("copy_file", "ftruncate"): "a backup copy, created O_EXCL in the backup",
    # Rebuild: a scratch folder inside the store, swapped in by rename.
    ("_rebuild", "rmtree"): "our scratch folder STORE/.rmqstore-rebuild-<pid>",
    ("_clean_up", "rmtree"): "our scratch folder",
    ("_cut_queue", "unlink"): "queue files past the cut, listed without following links",
    ("swap_in", "rename"): "scratch consumequeue/ or index/ <-> the store's (refused when "
                           "they are links)",
    ("Live._drop_queues", "rmtree"): "queues written into the scratch folder",
    ("Live.finish", "rmtree"): "an index written into the scratch folder",
    # Spark: the user's --out, checked empty or new first.
    ("_export_spark_writer", "rmdir"): "--out, checked empty, for Spark's writer",
    ("rebuild_cq", "rmtree"): "--out's _temporary folder",
    ("rebuild_cq.per_queue", "rename"): "a finished queue into --out",
    ("rebuild_cq.per_queue", "rmtree"): "a queue another task attempt finished",
    ("BodyDir.__call__", "replace"): "--body-dir: a body file written under a temporary name",
    ("BodyDir.__call__", "unlink"): "--body-dir: our temporary, on error",
    # Benchmarks and samples: their own temporary or new folders.
    ("_Workdir.__init__", "rmtree"): "bench scratch folder",
    ("_Workdir.__exit__", "rmtree"): "bench scratch folder",
    ("_write", "rmtree"): "samples: a sample folder being regenerated",
    ("_crash", "truncate"): "samples: the crashed sample's torn segment",
    ("bench_append.once", "rmtree"): "bench scratch folder",
    ("bench_spark_export", "rmtree"): "bench scratch folder",
    ("bench_spark_export.once", "rmtree"): "bench scratch folder",
    ("bench_spark_export.timed", "rmtree"): "bench scratch folder",
    ("make_store", "truncate"): "bench: a generated segment it just created",
}


def _sites() -> Counter:
    out: Counter = Counter()
    for p in sorted(ROOT.rglob("*.py")):
        def walk(node, fn):
            for ch in ast.iter_child_nodes(node):
                f = fn
                if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    f = ch.name if fn is None else f"{fn}.{ch.name}"
                if isinstance(ch, ast.Call):
                    c = ch.func
                    if isinstance(c, ast.Attribute):
                        name = c.attr
                        on_os = isinstance(c.value, ast.Name) and c.value.id in ("os", "shutil")
                    elif isinstance(c, ast.Name):
                        name, on_os = c.id, c.id in ANY_OBJECT
                    else:
                        name, on_os = None, False
                    if name in ANY_OBJECT or (name in OS_ONLY and on_os):
                        out[(f or "<module>", name)] += 1
                walk(ch, f)
        walk(ast.parse(p.read_text()), None)
    return out


def test_every_destructive_call_is_reviewed():
    new = sorted(set(_sites()) - set(REVIEWED))
    assert not new, ("unreviewed call sites that remove, rename or truncate (say in "
                     f"REVIEWED why each stays inside the store or its backup): {new}")


def test_the_review_list_has_no_stale_entries():
    gone = sorted(set(REVIEWED) - set(_sites()))
    assert not gone, f"REVIEWED names call sites that no longer exist: {gone}"


def test_the_scan_sees_a_destructive_call(tmp_path, monkeypatch):
    """The scan itself finds what it is for (a new unlink would fail the first test)."""
    import test_write_sites as T

    pkg = tmp_path / "rmqstore"
    pkg.mkdir()
    (pkg / "x.py").write_text("import os\ndef wipe(p):\n    os.unlink(p)\n    'a'.replace('a', 'b')\n")
    monkeypatch.setattr(T, "ROOT", pkg)
    assert T._sites() == Counter({("wipe", "unlink"): 1})
