"""The files of a ``dledger-<selfId>`` folder (design-14 §1.1–1.3): the data and index
file lists, and the ``checkpoint`` and ``currterm`` Java properties files.

Read-only: listings never follow a symbolic link inside the folders and report links,
special files, stray names, wrong sizes and gaps; small files are read through
:func:`~rmqstore.files.listing.open_regular` (never a FIFO). After the #13 restructure this is
``files/dledger.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from ..format.dledger_layout import DEFAULT_INDEX_FILE_SIZE, DLEDGER_INDEX_UNIT_SIZE
from ..errors import ConfigError
from .listing import LONG_MAX, entries, odd_entry, offset_name, open_regular
from .segments import SegmentProblem, SegmentQueue

#: Small text files are Java properties of a few dozen bytes; anything far larger is not one.
_SMALL_FILE_LIMIT = 64 * 1024
_JAVA_LONG = re.compile(r"^[+-]?[0-9]+$")


@dataclass
class LedgerCheckpoint:
    """``dledger-<id>/checkpoint`` (``DLedgerMmapFileStore#persistCheckPoint``), every 3 s
    and at shutdown: ``committedIndex``/``endIndex``. ``None`` where absent or blank.
    ``problems`` name what DLedger itself would choke on (an unparsable number makes its
    recovery throw: the broker does not start)."""

    path: Path
    exists: bool
    committed_index: int | None = None
    end_index: int | None = None
    tmp_left: bool = False  # checkpoint.tmp: a crash during IOUtils#string2File
    bak_exists: bool = False  # incidental: written whenever a previous file existed
    problems: list[str] = field(default_factory=list)


@dataclass
class CurrTerm:
    """``dledger-<id>/currterm`` (``MemberState#persistTerm``): the node's term and vote."""

    path: Path
    exists: bool
    term: int | None = None
    vote_leader: str | None = None
    problems: list[str] = field(default_factory=list)


def parse_java_properties(text: str) -> dict[str, str]:
    """``java.util.Properties#load`` of ``text`` (comments, ``=``/``:``/space separators,
    escapes, continuation lines), a repeated key winning. Raises ValueError when the text
    is not loadable (Java's ``IOUtils#string2Properties`` then returns null)."""
    from jproperties import ParseError, Properties

    props = Properties()
    try:
        props.load(text, "iso-8859-1")
    except (ParseError, UnicodeError) as e:
        raise ValueError(str(e)) from None
    return {k: v.data for k, v in props.items()}


def _read_small(path: Path) -> tuple[bool, str | None, str | None]:
    """(exists, text, problem) of a small store file, never through a link or a FIFO."""
    ent = next((e for e in entries(path.parent) if e.name == path.name), None)
    if ent is None:
        return False, None, None
    odd = odd_entry(ent)
    if odd is not None:
        return True, None, odd[1]
    if ent.kind != "file":
        return True, None, "not a regular file"
    if ent.size > _SMALL_FILE_LIMIT:
        return True, None, f"{ent.size} bytes: too large for a DLedger properties file"
    try:
        with open_regular(path) as f:
            data = f.read(_SMALL_FILE_LIMIT + 1)
    except OSError as e:
        return True, None, f"cannot read: {e.strerror or e}"
    return True, data.decode("iso-8859-1"), None


def _java_long(raw: str, what: str, problems: list[str]) -> int | None:
    """``Long.valueOf(String.valueOf(v).trim())`` as DLedger parses it; None when blank."""
    text = raw.strip()
    if not text:
        return None
    if not _JAVA_LONG.match(text) or not -2**63 <= int(text) <= LONG_MAX:
        problems.append(f"{what}={raw!r} is not a Java long: DLedger's recovery throws on it "
                        "and the broker does not start")
        return None
    return int(text)


def read_checkpoint(ledger_dir: str | Path) -> LedgerCheckpoint:
    """Parse ``<ledger_dir>/checkpoint`` the way ``DLedgerMmapFileStore#loadCheckPoint``
    does (a missing or unloadable file: no committed index). Never raises for its contents."""
    d = Path(ledger_dir)
    path = d / "checkpoint"
    exists, text, problem = _read_small(path)
    ck = LedgerCheckpoint(path, exists, tmp_left=(d / "checkpoint.tmp").exists(),
                          bak_exists=(d / "checkpoint.bak").exists())
    props = _props(text, problem, ck.problems)
    if props is None:
        return ck
    if "committedIndex" in props:
        ck.committed_index = _java_long(props["committedIndex"], "committedIndex", ck.problems)
    if "endIndex" in props:
        ck.end_index = _java_long(props["endIndex"], "endIndex", ck.problems)
    return ck


def _props(text: str | None, problem: str | None, problems: list) -> dict | None:
    """The properties of a small DLedger state file, or None (its problems noted)."""
    if problem:
        problems.append(problem)
    if text is None:
        return None
    try:
        return parse_java_properties(text)
    except ValueError as e:
        problems.append(f"not Java properties text ({e}): DLedger ignores it")
        return None


def read_currterm(ledger_dir: str | Path) -> CurrTerm:
    """Parse ``<ledger_dir>/currterm`` as ``MemberState#loadTerm`` does."""
    path = Path(ledger_dir) / "currterm"
    exists, text, problem = _read_small(path)
    ct = CurrTerm(path, exists)
    props = _props(text, problem, ct.problems)
    if props is None:
        return ct
    if "currTerm" in props:
        ct.term = _java_long(props["currTerm"], "currTerm", ct.problems)
    if "voteLeader" in props:
        ct.vote_leader = props["voteLeader"] or None
    return ct


# --- the files of a dledger-<selfId> folder -----------------------------------------------

LEDGER_DIR = re.compile(r"^dledger-.+$")


def find_ledger_dirs(root: str | Path) -> list[Path]:
    """``dledger-<selfId>`` folders of a store root holding a ``data/`` or ``index/``
    directory, sorted by name. Like ``commitlog/``, these folders may be links to another
    disk (the store-kind detection counts them too); they are read through, never written."""
    return [e.path for e in entries(root)
            if e.kind in ("dir", "symlink") and LEDGER_DIR.match(e.name)
            and ((e.path / "data").is_dir() or (e.path / "index").is_dir())]


def _files_size(dirs: Iterable[Path]) -> int | None:
    """The size most well-named files in ``dirs`` have (ties: the first file's), or None."""
    sizes: dict[int, int] = {}
    for d in dirs:
        for e in entries(d):
            if e.kind == "file" and offset_name(e.name) is not None and e.size > 0:
                sizes[e.size] = sizes.get(e.size, 0) + 1
    if not sizes:
        return None
    return max(sizes, key=lambda s: sizes[s])


def _file_size(dirs: list[Path], configured: int | None, what: str, default: int) -> int:
    """The file size of a DLedger file list: from the files (the truth), else ``configured``,
    else ``default``. A configured size no file has is a :class:`ConfigError`."""
    found = _files_size(dirs)
    if configured is not None and configured <= 0:
        raise ConfigError(f"{what} file size must be positive, got {configured}", dirs[0])
    if found is None:
        return configured or default
    if configured is not None and configured != found:
        raise ConfigError(f"the configuration says {what} files are {configured} bytes but "
                          f"the files are {found} bytes", dirs[0])
    return found


@dataclass
class LedgerFiles:
    """The data and index files of one ``dledger-<selfId>`` folder (names, sizes, problems:
    stray names, links, wrong sizes, gaps). DLedger refuses to load a folder with any
    ``refusing_problems`` (``MmapFileList#doLoad``/``checkSelf``)."""

    ledger_dir: Path
    data: SegmentQueue
    index: SegmentQueue

    @property
    def data_file_size(self) -> int:
        return self.data.segment_size

    @property
    def index_file_size(self) -> int:
        return self.index.segment_size

    @property
    def problems(self) -> list[SegmentProblem]:
        return self.data.problems + self.index.problems

    @property
    def refusing_problems(self) -> list[SegmentProblem]:
        """Problems that stop DLedger from loading (``MmapFileList#doLoad``, ``checkSelf``):
        every entry of ``data/`` and ``index/`` must be a file of exactly the configured size
        with a numeric name, the names stepping by that size. (A symbolic link to such a file
        DLedger would load; rmqstore reports it and does not read through it.)"""
        return [p for p in self.problems
                if p.code in ("wrong-size", "empty-file", "gap", "stray-file", "special-file")]

    def close(self) -> None:
        for s in [*self.data.segments, *self.index.segments]:
            s.close()


def list_files(ledger_dir: str | Path, *, data_dirs: Iterable[str | Path] | None = None,
               data_file_size: int | None = None,
               index_file_size: int | None = None) -> LedgerFiles:
    """List ``<ledger_dir>/data`` (or ``data_dirs``: ``storePathDLedgerCommitLog``, a
    ``,``-list) and ``<ledger_dir>/index``. File sizes come from the files; a configured
    size that no file has is a :class:`ConfigError`. Nothing is opened yet."""
    d = Path(ledger_dir)
    ddirs = [Path(p) for p in data_dirs] if data_dirs is not None else [d / "data"]
    if not ddirs:
        raise ConfigError("no DLedger data directory given", d)
    dsize = _file_size(ddirs, data_file_size, "DLedger data", 1024 * 1024 * 1024)
    isize = _file_size([d / "index"], index_file_size, "DLedger index", DEFAULT_INDEX_FILE_SIZE)
    data = SegmentQueue(ddirs, dsize, kind="DLedger data")
    index = SegmentQueue(d / "index", isize, kind="DLedger index")
    if isize % DLEDGER_INDEX_UNIT_SIZE:
        index.problems.append(SegmentProblem(
            "wrong-size", str(d / "index"), None,
            f"index files of {isize} bytes do not hold whole {DLEDGER_INDEX_UNIT_SIZE}-byte units"))
    return LedgerFiles(d, data, index)
