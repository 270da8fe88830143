"""What a Spark job checks before Spark starts, and the paths it gives its tasks.

Starting Spark costs 10-20 s and its own failures are long JVM stack traces, so whatever
can be known on the driver is checked first, each failure one line (exit 2):

* the broker.conf (``--config``) loads and is valid;
* every store is readable and recognised, as the non-Spark commands check it
  (:func:`rmqstore.reader.open_store`), and its CommitLog files open;
* ``--out`` is an empty directory or can be created;
* the executors' Python is chosen explicitly (:func:`executor_python`) and, when the
  executors run on this machine (``local[...]``), runs and imports rmqstore;
* Java is there (``$JAVA_HOME/bin/java``, else ``java`` on PATH, as ``spark-class``
  looks) and new enough for the installed pyspark.

Tasks run in other processes, on other machines, in other working directories, so every
local path becomes an absolute ``file://`` URI on the driver (:func:`absolute_uri`);
``hdfs://``, ``s3a://`` ... stay as given. Plain Python: no pyspark import.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ..scan import splits as S
from ..errors import (InputError, NotAStoreError, RmqStoreError, SparkError, StoreIOError,
                      UnsupportedStoreError)

_LOCAL_MASTER = re.compile(r"^local(\[[^\]]*\])?$")
PYTHON_RULE = ("the executors' Python is --python, else the Spark setting spark.pyspark.python, "
               "else $PYSPARK_PYTHON, else the driver's own interpreter")


def absolute_uri(path: str | os.PathLike) -> str:
    """A location every task can use: a local path (relative, absolute or ``file://``)
    as ``file://`` + its absolute path on the driver; any other URI unchanged."""
    p = os.fspath(path)
    if S.is_remote(p):
        return p
    return "file://" + os.path.abspath(S.local_path(p))


def local_path(uri: str) -> str:
    """The path of a ``file://`` URI (a plain path unchanged)."""
    return S.local_path(uri)


def is_local_master(master: str | None) -> bool:
    """Do the executors run in this process's machine (``local``, ``local[N]``, ...)?"""
    return master is not None and bool(_LOCAL_MASTER.match(master.strip()))


def resolve_master(option: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The master a job asks for: ``--master``; else, under ``spark-submit`` (which
    started this process's JVM), None: spark-submit's own ``--master`` holds; else
    ``local[*]``."""
    env = os.environ if env is None else env
    if option:
        return option
    return None if env.get("PYSPARK_GATEWAY_PORT") else "local[*]"


# --- the executors' Python ----------------------------------------------------------------


def executor_python(option: str | None = None, spark_conf: Mapping[str, str] | None = None,
                    env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(the Python executors run, where that choice came from): see :data:`PYTHON_RULE`.
    Without a choice executors would start ``python3`` from their PATH, which is rarely
    the Python that has rmqstore; the driver's own interpreter is the one that surely has."""
    env = os.environ if env is None else env
    if option:
        return option, "--python"
    if spark_conf and spark_conf.get("spark.pyspark.python"):
        return spark_conf["spark.pyspark.python"], "spark.pyspark.python"
    if env.get("PYSPARK_PYTHON"):
        return env["PYSPARK_PYTHON"], "PYSPARK_PYTHON"
    return sys.executable, "the driver's interpreter"


_PROBE = ("import sys, rmqstore, numpy, pyarrow, pandas; "
          "print(rmqstore.__version__, '%d.%d' % sys.version_info[:2])")


def check_python(python: str, source: str) -> None:
    """For executors on this machine: ``python`` runs, imports rmqstore and its Spark
    dependencies, and is the driver's rmqstore version and Python version."""
    exe = python if os.sep in python else shutil.which(python)
    if not exe or not os.path.isfile(exe) or not os.access(exe, os.X_OK):
        raise SparkError(f"executors' Python {python} (from {source}) is not a program here")
    if os.path.abspath(exe) == sys.executable:
        return  # this very interpreter: it imports what the driver imports
    try:
        r = subprocess.run([exe, "-c", _PROBE], capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        raise SparkError(f"executors' Python {python} (from {source}) does not run: {e}") from None
    if r.returncode != 0:
        last = ([ln for ln in r.stderr.splitlines() if ln.strip()] or ["exit status %d" % r.returncode])[-1]
        raise SparkError(f"executors' Python {python} (from {source}) cannot run rmqstore: {last.strip()}; "
                         "choose one that has rmqstore with the 'spark' extra (--python or PYSPARK_PYTHON)")
    from .. import __version__

    got = r.stdout.split()
    mine = (__version__, "%d.%d" % sys.version_info[:2])
    if tuple(got[:2]) != mine:
        raise SparkError(f"executors' Python {python} (from {source}) has rmqstore {got[0] if got else '?'} on "
                         f"Python {got[1] if len(got) > 1 else '?'}; the driver has rmqstore {mine[0]} "
                         f"on Python {mine[1]}: they must match")


# --- Java ------------------------------------------------------------------------------------


def java_needed() -> int:
    """The oldest Java the installed pyspark runs on (Spark 4: 17; Spark 3.5: 8)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major = int(version("pyspark").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return 17
    return 17 if major >= 4 else 8


def java_major(text: str) -> int | None:
    """The major version in ``java -version`` output (``1.8.0_392`` is 8), or None."""
    m = re.search(r'version "([^"]+)"', text)
    if not m:
        return None
    parts = re.split(r"[.\-+_]", m.group(1))
    try:
        return int(parts[1]) if parts[0] == "1" and len(parts) > 1 else int(parts[0])
    except ValueError:
        return None


def check_java(env: Mapping[str, str] | None = None) -> str | None:
    """The java Spark will start, found as ``spark-class`` finds it; None when this
    process was started by ``spark-submit`` (its JVM is already running)."""
    env = os.environ if env is None else env
    if env.get("PYSPARK_GATEWAY_PORT"):
        return None
    need = java_needed()
    home = env.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        if not (os.path.isfile(java) and os.access(java, os.X_OK)):
            raise SparkError(f"JAVA_HOME is {home}, which has no bin/java: Spark needs Java {need} or "
                             "newer; point JAVA_HOME at a JDK, or unset it to use java from PATH")
    else:
        java = shutil.which("java", path=env.get("PATH", os.defpath))
        if not java:
            raise SparkError(f"Java not found (JAVA_HOME is not set and there is no java on PATH): "
                             f"Spark needs Java {need} or newer; install a JDK and set JAVA_HOME "
                             "or put its bin/ on PATH")
    try:
        r = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL, env=dict(env))
    except (OSError, subprocess.SubprocessError) as e:
        raise SparkError(f"{java} does not run: {e}; set JAVA_HOME to a JDK {need} or newer") from None
    major = java_major(r.stderr + r.stdout)
    if r.returncode != 0 or (major is not None and major < need):
        what = f"is Java {major}" if major is not None else f"fails (exit status {r.returncode})"
        raise SparkError(f"{java} {what}: Spark needs Java {need} or newer; set JAVA_HOME to a newer JDK")
    return java


# --- stores, config, output -------------------------------------------------------------------


def check_config(conf: str | os.PathLike | None) -> None:
    """The broker.conf loads and its values are valid (the store's own checks come with it)."""
    if conf is not None:
        from ..files.config import load_config

        load_config(None, conf, infer=False)


def check_store(store: str, conf: str | os.PathLike | None = None, *,
                local_only: str | None = None, write: str | None = None,
                dledger: bool = False):
    """(the store root's absolute URI, its configuration or None for a remote store), after
    the checks the non-Spark commands make and an open of each CommitLog file.
    ``local_only``: the reason a remote store is refused; ``write``: the writing operation
    whose refusals (:func:`rmqstore.files.storekind.require_writable`) apply; ``dledger``:
    the job reads DLedger stores (export, design-14 D1), else they are refused."""
    uri = absolute_uri(store)
    if S.is_remote(uri):
        if local_only:
            raise InputError(f"{store}: {local_only}")
        try:
            S.list_store(uri)  # the driver plans splits from this listing anyway
        except RmqStoreError:
            raise
        except Exception as e:  # noqa: BLE001 - pyarrow's errors for unreachable filesystems vary
            raise InputError(f"{store}: cannot list it: {' '.join(str(e).split())}") from None
        return uri, None
    from ..reader import classify, open_store

    path = local_path(store)  # as given, so messages name it as the user did
    kind = classify(path)
    if kind.kind != "store":
        raise NotAStoreError(f"is a {kind.kind.replace('-', ' ')}, not a store root", store)
    with open_store(path, conf) as reader:
        cfg = reader.config
        if reader.framing == "dledger" and not dledger:  # only export reads it (WP D1)
            raise UnsupportedStoreError(
                f"the store uses a DLedger CommitLog ({reader.dledger.ledger_dir.name}/): this "
                "Spark command does not read it yet; spark export, rmqstore dump, get, "
                "query-key, stats and verify do; nothing was read", path)
    from ..files.storekind import refuse_operation, require_writable

    refuse_operation(cfg, "spark")  # features the jobs do not cover yet (5.x queues)
    if write:
        require_writable(cfg, write)
    root = os.path.abspath(kind.root)
    for f, _, _ in S.list_store(root, conf=conf).files:
        try:
            with open(f, "rb"):
                pass
        except OSError as e:
            raise StoreIOError(f"cannot read: {e.strerror}", f, errno=e.errno) from None
    return "file://" + root, cfg


def check_out(out: str) -> str:
    """``out`` as an absolute URI, after checking it is an empty directory or can be
    created (nothing is created here)."""
    uri = absolute_uri(out)
    if S.is_remote(uri):
        from pyarrow import fs as pafs

        try:
            fs, path = S.arrow_filesystem(uri)
            info = fs.get_file_info(path)
            if info.type == pafs.FileType.File:
                raise InputError(f"--out {out} is a file")
            if info.type == pafs.FileType.Directory and fs.get_file_info(pafs.FileSelector(path)):
                raise InputError(f"--out {out} is not empty; choose a new directory")
        except InputError:
            raise
        except Exception as e:  # noqa: BLE001 - pyarrow's errors for unreachable filesystems vary
            raise InputError(f"--out {out}: {' '.join(str(e).split())}") from None
        return uri
    p = Path(local_path(uri))
    if p.exists() or p.is_symlink():
        if not p.is_dir():
            raise InputError(f"--out {out} is a file")
        if any(p.iterdir()):
            raise InputError(f"--out {out} is not empty; choose a new directory")
        if not os.access(p, os.W_OK | os.X_OK):
            raise InputError(f"--out {out} is not writable")
        return uri
    parent = p.parent
    while not (parent.exists() or parent.is_symlink()):
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"--out {out} cannot be created: {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"--out {out} cannot be created: {parent} is not writable")
    return uri


@dataclass
class Ready:
    """What the checks found: the job can start."""

    stores: dict[str, str]  # as given -> absolute URI of the store root
    configs: dict[str, object]  # as given -> StoreConfig, for local stores (notes, warnings)
    out: str | None  # absolute URI
    python: str  # the executors' Python
    python_from: str  # where that choice came from
    java: str | None  # the java Spark starts (None: already running)


def run(stores: Sequence[str], *, out: str | None = None, conf: str | os.PathLike | None = None,
        master: str | None = "local[*]", python: str | None = None,
        spark_conf: Mapping[str, str] | None = None, local_only: str | None = None,
        write: str | None = None, env: Mapping[str, str] | None = None,
        dledger: bool = False) -> Ready:
    """Every check, cheapest first; raises the first failure."""
    check_config(conf)
    found = {s: check_store(s, conf, local_only=local_only, write=write, dledger=dledger)
             for s in dict.fromkeys(stores)}
    roots = {s: uri for s, (uri, _) in found.items()}
    configs = {s: cfg for s, (_, cfg) in found.items() if cfg is not None}
    out_uri = None
    if out is not None:
        if local_only and S.is_remote(absolute_uri(out)):
            raise InputError(f"--out {out}: {local_only}")
        out_uri = check_out(out)
    exe, source = executor_python(python, spark_conf, env)
    if is_local_master(master):
        check_python(exe, source)
    java = check_java(env)
    return Ready(roots, configs, out_uri, exe, source, java)
