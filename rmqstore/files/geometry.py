"""Store geometry from the files (spec §1.2, §2, §7.1), and the settings checked against it.

:func:`segment_size` reads a queue's segment size off its files; :class:`Reconcile` decides
each geometry value of :func:`rmqstore.files.config.load_config`: the files when they determine
it (a broker.conf or option value that disagrees is a :class:`ConfigError` naming both),
else the setting, else a guess that is recorded as undetermined.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..format import layout as L
from .config import PROPERTY_NAMES, SEGMENT_NAME
from ..errors import ConfigError
from .listing import LONG_MAX, entries as list_entries


@dataclass
class SizeDecision:
    """The segment size a queue's files show (``ambiguous``: they exist but disagree)."""

    value: int
    how: str
    ambiguous: bool
    example: Path
    largest: int


def segment_size(directories) -> SizeDecision | None:
    """The segment size the files of ``directories`` show (spec §2), None without files.

    Segment files are created full size, so one size decides it. A short file (a cut
    tail) does not spoil that when the largest size is shared by two files or equals
    the step between names; anything else is ambiguous (a guess: the largest size)."""
    from collections import Counter

    files: list[tuple[int, Path, int]] = []
    for d in directories:
        try:
            found = list_entries(d)  # links inside the store are not followed (rmqstore.files.listing)
        except OSError:
            continue
        for e in found:
            if SEGMENT_NAME.match(e.name) and e.kind == "file" and int(e.name) <= LONG_MAX:
                files.append((int(e.name), e.path, e.size))
    sized = [(s, p, n) for s, p, n in files if n > 0]
    if not sized:
        return None
    sizes = Counter(n for _, _, n in sized)
    largest = max(sizes)
    example = min((s, p) for s, p, n in sized if n == largest)[1]
    if len(sizes) == 1:
        return SizeDecision(largest, "segment file size", False, example, largest)
    starts = sorted({s for s, _, _ in files})
    steps = [b - a for a, b in zip(starts, starts[1:])]
    if sizes[largest] >= 2 or (steps and min(steps) == largest):
        return SizeDecision(largest, "largest segment file size (shorter files are cut short)",
                            False, example, largest)
    return SizeDecision(largest, f"segment files have sizes {sorted(sizes)}", True, example, largest)


def queue_dirs(root: Path) -> list[Path]:
    """The queue directories verify reads (``consumequeue/{topic}/{queueId}``): files in
    a directory of another name are strays, and must not decide the geometry."""
    from .consumequeue import list_queues

    try:
        return [q.path for q in list_queues(root).queues]
    except OSError:
        return []


def round_units(n: int) -> int:
    return -(-n // L.CQ_UNIT_SIZE) * L.CQ_UNIT_SIZE


class Reconcile:
    """Geometry for one store: files first, claims (broker.conf, options) checked."""

    def __init__(self, root: Path, claims: dict[str, tuple[object, str]], conf):
        self.root, self.claims, self.conf = root, claims, conf
        self.values: dict[str, object] = {}
        self.sources: dict[str, str] = {}
        self.undetermined: dict[str, str] = {}
        self.warnings: list[str] = []

    def _disagree(self, name: str, value, evidence: str) -> ConfigError:
        _, src = self.claims[name]
        given = "in broker.conf" if src == "broker.conf" else "given as an option"
        return ConfigError(f"{PROPERTY_NAMES[name]}={value} {given} disagrees with the store: "
                           f"{evidence}; the files are the truth: fix or drop the setting",
                           self.conf if src == "broker.conf" else self.root)

    def _claimed(self, name: str):
        return self.claims[name][0] if name in self.claims else None

    def _use(self, name: str, value, source: str) -> None:
        self.values[name] = value
        self.sources[name] = source

    def segments(self, name: str, what: str, directories, effective=lambda n: n) -> None:
        d = segment_size(directories)
        claim = self._claimed(name)
        src = self.claims[name][1] if claim is not None else None
        if d is None:
            if claim is not None:
                self._use(name, claim, src)
            return
        if not d.ambiguous:
            if claim is not None and effective(claim) != d.value:
                raise self._disagree(name, claim, f"its {what} segment files are {d.value} bytes "
                                     f"({d.example})")
            self._use(name, d.value, f"files: {what} {d.how}"
                      + (f" ({src} agrees)" if claim is not None else ""))
            return
        if claim is not None:
            if effective(claim) < d.largest:
                raise self._disagree(name, claim, f"{d.example} is {d.largest} bytes, larger "
                                     "than a segment")
            self._use(name, claim, f"{src} ({what} files do not decide: {d.how})")
            return
        why = f"the {what} files do not determine {PROPERTY_NAMES[name]} ({d.how})"
        self.undetermined[name] = why
        self.warnings.append(f"{why}; reading with {d.largest}, the largest (pass --config to "
                             "choose)")
        self._use(name, d.largest, f"guess: {d.how}")

    def index(self, index_enabled: bool) -> None:
        from .index_geometry import IndexFiles, entries_for, slots_for

        s_name, n_name = "max_hash_slot_num", "max_index_num"
        slots, entries = self._claimed(s_name), self._claimed(n_name)
        view = IndexFiles(self.root / "index")
        if not view.sizes:
            for name, v in ((s_name, slots), (n_name, entries)):
                if v is not None:
                    self._use(name, v, self.claims[name][1])
            return
        if slots is None and entries is None:
            d = view.decide()
            if d is not None and not d.ambiguous:
                self._use(s_name, d.slots, f"files: {d.how}")
                self._use(n_name, d.entries, f"files: {d.how}")
                return
            why = f"the IndexFiles do not determine maxHashSlotNum and maxIndexNum ({d.how})"
            if index_enabled:
                self.undetermined[s_name] = self.undetermined[n_name] = why
                self.warnings.append(f"{why}; key lookups and index checks need --config with "
                                     "both")
            self.sources[s_name] = self.sources[n_name] = f"unknown: {d.how}"
            return
        size, example = view.size, view.example
        name = s_name if slots is not None else n_name
        if slots is not None and entries is not None:
            if L.index_file_size(slots, entries) != size:
                raise self._disagree(name, slots if name == s_name else entries,
                                     f"with {PROPERTY_NAMES[s_name]}={slots} and "
                                     f"{PROPERTY_NAMES[n_name]}={entries} an IndexFile is "
                                     f"{L.index_file_size(slots, entries)} bytes, but {example} "
                                     f"is {size}")
            self._use(s_name, slots, self.claims[s_name][1])
            self._use(n_name, entries, self.claims[n_name][1])
        elif slots is not None:
            entries = entries_for(size, slots)
            if entries is None:
                raise self._disagree(s_name, slots, f"no maxIndexNum fits it to {example}, "
                                     f"which is {size} bytes")
            self._use(s_name, slots, self.claims[s_name][1])
            self._use(n_name, entries, f"files: IndexFile size with maxHashSlotNum from "
                                       f"{self.claims[s_name][1]}")
        else:
            slots = slots_for(size, entries)
            if slots is None:
                raise self._disagree(n_name, entries, f"no maxHashSlotNum fits it to {example}, "
                                     f"which is {size} bytes")
            self._use(n_name, entries, self.claims[n_name][1])
            self._use(s_name, slots, f"files: IndexFile size with maxIndexNum from "
                                     f"{self.claims[n_name][1]}")
        agree, contra, bad = view.verdicts(slots)
        if contra and not agree:
            d = view.decide()
            if d is not None and not d.ambiguous and d.slots != slots:
                raise self._disagree(name, self.values[name],
                                     f"its IndexFile entries fit maxHashSlotNum={d.slots}, "
                                     f"maxIndexNum={d.entries} ({d.how}; {bad})")


__all__ = ["SizeDecision", "segment_size", "queue_dirs", "round_units", "Reconcile"]
