"""The Spark commands' checks before Spark starts, the paths tasks get, and task errors as
one line (issue 12, "Spark on a cluster"). Most of this needs no Spark at all: the
preflight must fail before any JVM exists, so these tests replace the jobs module with
one whose session() fails the test if it is ever called.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from conftest import REPO, ROCKETMQ_498
from rmqstore import errors as E
from rmqstore.pipeline import preflight as P
from rmqstore.pipeline import taskerror as TE

runner = CliRunner()
SAMPLE = REPO / "samples" / "multi-segment"
RMQSTORE = str(Path(sys.executable).parent / "rmqstore")


# --- paths -----------------------------------------------------------------------------------


def test_local_paths_become_absolute_file_uris_and_others_stay(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert P.absolute_uri("store") == f"file://{tmp_path}/store"
    assert P.absolute_uri("./a/../store/") == f"file://{tmp_path}/store"
    assert P.absolute_uri("/data/store") == "file:///data/store"
    assert P.absolute_uri("file:///data/store") == "file:///data/store"
    assert P.absolute_uri("file://rel/store") == f"file://{tmp_path}/rel/store"
    assert P.absolute_uri(tmp_path / "x") == f"file://{tmp_path}/x"
    for uri in ("hdfs://nn:8020/rocketmq/store", "hdfs:///rocketmq/store", "s3a://bucket/store",
                "s3://bucket/a b", "viewfs://cluster/store"):
        assert P.absolute_uri(uri) == uri
    assert P.local_path("file:///data/store") == "/data/store"


def test_hadoop_s3_names_are_read_as_s3_and_unknown_schemes_are_one_line(no_spark, tmp_path):
    pytest.importorskip("pyarrow")
    from pyarrow import fs as pafs

    from rmqstore.scan import splits as S

    fs, path = S.arrow_filesystem("s3a://bucket/rocketmq/store?region=us-east-1")
    assert isinstance(fs, pafs.S3FileSystem) and path == "bucket/rocketmq/store"
    _refused(["stats", "nosuchfs://host/store"], r"nosuchfs://host/store: cannot list it: .*Unrecognized")
    _refused(["export", SAMPLE, "--out", "nosuchfs://host/out"], r"--out nosuchfs://host/out: .*Unrecognized")


def test_store_files_reach_tasks_as_absolute_uris_named_as_given(monkeypatch):
    pytest.importorskip("pyspark")
    from rmqstore.pipeline import jobs

    monkeypatch.chdir(SAMPLE.parent)
    files = jobs.store_files([SAMPLE.name])
    sf = files[SAMPLE.name]
    assert sf.store == SAMPLE.name  # results name the store as the user did
    assert sf.files and all(p.startswith(f"file://{SAMPLE}/commitlog/") for p, _, _ in sf.files)


# --- the executors' Python ---------------------------------------------------------------------


def test_executor_python_is_chosen_explicitly_in_a_documented_order():
    env = {"PYSPARK_PYTHON": "/env/python"}
    conf = {"spark.pyspark.python": "./venv/bin/python"}
    assert P.executor_python("/opt/py", conf, env) == ("/opt/py", "--python")
    assert P.executor_python(None, conf, env) == ("./venv/bin/python", "spark.pyspark.python")
    assert P.executor_python(None, {}, env) == ("/env/python", "PYSPARK_PYTHON")
    assert P.executor_python(None, {}, {}) == (sys.executable, "the driver's interpreter")


def test_master_defaults_to_local_unless_spark_submit_chose_one():
    assert P.resolve_master(None, {}) == "local[*]"
    assert P.resolve_master("spark://10.0.0.1:7077", {"PYSPARK_GATEWAY_PORT": "4711"}) == "spark://10.0.0.1:7077"
    assert P.resolve_master(None, {"PYSPARK_GATEWAY_PORT": "4711"}) is None  # spark-submit's --master
    assert P.is_local_master("local[2]") and P.is_local_master("local") and P.is_local_master("local[4,2]")
    assert not P.is_local_master("local-cluster[2,1,1024]") and not P.is_local_master(None)


def _python_without_rmqstore(tmp_path: Path) -> Path:
    """This venv's Python, where importing rmqstore fails as it does where it is not
    installed (a directory first on PYTHONPATH shadows the package)."""
    shadow = tmp_path / "shadow" / "rmqstore"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'rmqstore'\", name='rmqstore')\n")
    exe = tmp_path / "python-without-rmqstore"
    exe.write_text(f"#!/bin/sh\nPYTHONPATH={shadow.parent}${{PYTHONPATH:+:$PYTHONPATH}} "
                   f"exec {sys.executable} \"$@\"\n")
    exe.chmod(0o755)
    return exe


# --- Java --------------------------------------------------------------------------------------


def test_java_version_strings():
    # What `java -version` prints (stderr) for JDKs 8, 11, 17 and 21.
    assert P.java_major('java version "1.8.0_392"\nJava(TM) SE Runtime Environment') == 8
    assert P.java_major('openjdk version "11.0.2" 2019-01-15\nOpenJDK Runtime Environment') == 11
    assert P.java_major('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment') == 17
    assert P.java_major('openjdk version "21" 2023-09-19\nOpenJDK Runtime Environment') == 21
    assert P.java_major("no version here") is None


def _fake_jdk(tmp_path: Path, version: str) -> Path:
    home = tmp_path / f"jdk-{version}"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2019-01-15' >&2\n")
    java.chmod(0o755)
    return home


def test_java_is_found_as_spark_class_finds_it(tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    with pytest.raises(E.SparkError, match=r"Java not found.*JAVA_HOME.*java on PATH"):
        P.check_java({"PATH": str(empty)})
    with pytest.raises(E.SparkError, match=r"JAVA_HOME is .*, which has no bin/java"):
        P.check_java({"PATH": os.environ["PATH"], "JAVA_HOME": str(empty)})
    old = _fake_jdk(tmp_path, "11.0.2")
    if P.java_needed() > 11:
        with pytest.raises(E.SparkError, match=r"is Java 11: Spark needs Java 17"):
            P.check_java({"PATH": str(empty), "JAVA_HOME": str(old)})
    new = _fake_jdk(tmp_path, "21.0.1")
    assert P.check_java({"PATH": str(empty), "JAVA_HOME": str(new)}) == str(new / "bin" / "java")
    # Started by spark-submit: the JVM is already there.
    assert P.check_java({"PATH": str(empty), "PYSPARK_GATEWAY_PORT": "4711"}) is None


# --- the CLI refuses before Spark starts ------------------------------------------------------


@pytest.fixture
def no_spark(monkeypatch):
    """The jobs module, replaced: starting Spark fails the test."""
    import rmqstore.pipeline as pipeline

    def session(*a, **k):
        pytest.fail("Spark was started before the preflight refused")

    fake = types.SimpleNamespace(session=session)
    monkeypatch.setitem(sys.modules, "rmqstore.pipeline.jobs", fake)
    monkeypatch.setattr(pipeline, "jobs", fake, raising=False)
    return fake


def _refused(args, match: str, env=None):
    r = runner.invoke(app, ["spark", *map(str, args)], env=env)
    assert r.exit_code == 2, (args, r.output)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert re.search(match, lines[0]), lines[0]
    return lines[0]


def test_out_must_be_empty_or_creatable(no_spark, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "part-0.parquet").write_bytes(b"x")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for cmd in (["export", SAMPLE], ["rebuild-cq", SAMPLE]):
        _refused([*cmd, "--out", full], r"--out .*full is not empty; choose a new directory")
        _refused([*cmd, "--out", a_file], r"--out .*a-file is a file")
        _refused([*cmd, "--out", a_file / "sub" / "out"], r"cannot be created: .*a-file is a file")
    assert sorted(p.name for p in full.iterdir()) == ["part-0.parquet"]  # untouched


def test_stores_are_checked_as_the_other_commands_check_them(no_spark, tmp_path):
    not_store = tmp_path / "not-a-store"
    not_store.mkdir()
    for cmd in ("stats", "audit"):
        _refused([cmd, tmp_path / "missing"], r"missing: no such file or directory")
        _refused([cmd, not_store], r"not a RocketMQ store")
        _refused([cmd, SAMPLE / "commitlog" / "00000000000000000000"], r"is a commitlog segment, not a store root")
    _refused(["export", tmp_path / "missing", "--out", tmp_path / "o"], r"no such file or directory")
    # the same words as `rmqstore stats`
    plain = runner.invoke(app, ["stats", str(not_store)])
    assert plain.exit_code == 2 and "not a RocketMQ store" in plain.stderr


def test_audit_and_rebuild_refuse_remote_locations_before_spark(no_spark, tmp_path):
    _refused(["audit", "hdfs://namenode:8020/rocketmq/store"], r"ConsumeQueue files .* local path")
    _refused(["rebuild-cq", "s3a://bucket/store", "--out", tmp_path / "o"], r"s3a://bucket/store: .*local path")
    _refused(["rebuild-cq", SAMPLE, "--out", "s3a://bucket/cq"], r"--out s3a://bucket/cq: .*local path")


def test_config_is_checked_on_every_command(no_spark, tmp_path):
    bad = tmp_path / "broker.conf"
    bad.write_text("mappedFileSizeCommitLog=64k\n")
    for cmd in (["stats", SAMPLE], ["audit", SAMPLE], ["export", SAMPLE, "--out", tmp_path / "o"],
                ["rebuild-cq", SAMPLE, "--out", tmp_path / "o"]):
        _refused([*cmd, "--config", bad], r"broker.conf: mappedFileSizeCommitLog must be a whole number")
        _refused([*cmd, "--config", tmp_path / "none.conf"], r"none.conf: cannot read broker.conf")


def test_no_java_is_one_line_naming_java_home_and_java(no_spark, tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {"PATH": str(empty), "JAVA_HOME": None, "PYSPARK_GATEWAY_PORT": None}
    for cmd in (["stats", SAMPLE], ["audit", SAMPLE], ["export", SAMPLE, "--out", tmp_path / "o"],
                ["rebuild-cq", SAMPLE, "--out", tmp_path / "o"]):
        _refused(cmd, r"Java not found \(JAVA_HOME is not set and there is no java on PATH\)", env=env)
    _refused(["stats", SAMPLE], r"JAVA_HOME is .*bin, which has no bin/java", env={**env, "JAVA_HOME": str(empty)})


def test_no_java_from_a_real_shell(tmp_path):
    """The whole command as a user runs it, with a PATH that has no java: one line, not
    pyspark's JAVA_GATEWAY_EXITED."""
    pytest.importorskip("pyspark")
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYSPARK_GATEWAY_PORT")}
    env["PATH"] = str(empty)
    r = subprocess.run([RMQSTORE, "spark", "stats", str(SAMPLE), "--master", "local[1]"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "rmqstore: Java not found (JAVA_HOME is not set and there is no java on PATH): Spark needs "
        f"Java {P.java_needed()} or newer; install a JDK and set JAVA_HOME or put its bin/ on PATH"]


def test_executors_python_without_rmqstore_is_refused_for_local_masters(no_spark, tmp_path, monkeypatch):
    exe = _python_without_rmqstore(tmp_path)
    monkeypatch.chdir(tmp_path)  # not the repository, whose rmqstore/ `python -c` would import
    line = _refused(["stats", SAMPLE, "--master", "local[2]", "--python", exe],
                    r"executors' Python .*python-without-rmqstore \(from --python\) cannot run rmqstore: "
                    r"ModuleNotFoundError: No module named 'rmqstore'")
    assert "PYSPARK_PYTHON" in line
    monkeypatch.setenv("PYSPARK_PYTHON", str(exe))
    _refused(["stats", SAMPLE, "--master", "local[2]"], r"\(from PYSPARK_PYTHON\) cannot run rmqstore")
    _refused(["stats", SAMPLE, "--python", tmp_path / "no-such-python"], r"is not a program here")


# --- task errors become one line --------------------------------------------------------------


def test_a_task_error_is_carried_to_the_driver_typed():
    e = E.SegmentError("cannot map segment: No such file or directory",
                       "file:///data/store/commitlog/00000000000000065536", 4096)
    raised = TE.task_failure(e)
    # What the driver gets: Python's traceback text inside Spark's message.
    spark_text = ("An exception was thrown from the Python worker:\nTraceback (most recent call last):\n"
                  '  File "/x/jobs.py", line 93, in run\n    yield from fn(plan[sid], attempt)\n'
                  f"RuntimeError: {raised}\n\n\tat org.apache.spark.api.python.BasePythonRunner")
    got = TE.from_spark(Exception(spark_text))
    assert type(got) is E.SegmentError
    assert (got.path, got.offset) == ("file:///data/store/commitlog/00000000000000065536", 4096)
    assert re.fullmatch(r"file:///data/store/commitlog/00000000000000065536 @ offset 4096: cannot map "
                        r"segment: No such file or directory \(in a Spark task on \S+\)", str(got))
    os_err = TE.task_failure(FileNotFoundError(2, "No such file or directory", "/data/store/consumequeue/T/0"))
    got = TE.decode(str(os_err))
    assert type(got) is E.StoreIOError and got.path == "/data/store/consumequeue/T/0"
    bug = ValueError("a bug")
    assert TE.task_failure(bug) is bug  # a bug keeps its traceback


def test_spark_failures_outside_rmqstore_are_one_line():
    no_module = ("An exception was thrown from the Python worker:\nTraceback (most recent call last):\n"
                 '  File "/usr/lib/python3/dist-packages/pyspark/cloudpickle.py", line 1, in subimport\n'
                 "ModuleNotFoundError: No module named 'rmqstore'\n")
    got = TE.from_spark(Exception(no_module), "/usr/bin/python3")
    assert type(got) is E.SparkError
    assert str(got).startswith("executors' Python (/usr/bin/python3) cannot import rmqstore: every node needs")
    mismatch = ("[PYTHON_VERSION_MISMATCH] Python in worker has different version: 3.10 than that in "
                "driver: 3.11, PySpark cannot run with different minor versions.\n\tat org.apache")
    assert "another Python version" in str(TE.from_spark(Exception(mismatch), "python3"))
    cannot_run = ('Job aborted: java.io.IOException: Cannot run program "/opt/py": error=2, No such file '
                  "or directory\n\tat java.base/java.lang.ProcessBuilder.start")
    assert 'Cannot run program "/opt/py": error=2' in str(TE.from_spark(Exception(cannot_run)))
    bug = ("An exception was thrown from the Python worker:\nTraceback (most recent call last):\n"
           '  File "x.py", line 1, in f\nZeroDivisionError: division by zero\n\n'
           "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(x)\n")
    assert str(TE.from_spark(Exception(bug))) == "a Spark task failed: ZeroDivisionError: division by zero"
    jvm = ("An error occurred while calling o63.collectToPython.\n: org.apache.spark.SparkException: "
           "Job aborted due to stage failure: executor lost\n\tat org.apache.spark.scheduler.X")
    assert str(TE.from_spark(Exception(jvm))) == ("Spark failed: org.apache.spark.SparkException: "
                                                   "Job aborted due to stage failure: executor lost")
    for e in (no_module, mismatch, cannot_run, bug, jvm):
        assert "\n" not in str(TE.from_spark(Exception(e)))


def test_another_rmqstore_version_on_an_executor_is_refused(monkeypatch):
    TE.check_version(TE.__version__)
    with pytest.raises(E.SparkError, match=r"has rmqstore .*, the driver 0\.0\.0-other"):
        TE.check_version("0.0.0-other")
    e = TE.decode(str(TE.task_failure(E.SparkError("x"))))
    assert type(e) is E.SparkError


# --- with Spark (local mode, the session shared with the other Spark tests) -------------------


@pytest.mark.spark
def test_relative_paths_after_the_jvm_started_elsewhere(spark, tmp_path, monkeypatch):
    """Executors keep the working directory the JVM started in (here: wherever pytest
    started), as a cluster's executors have their own; relative store and --out paths must
    still mean the driver's."""
    import pyarrow.dataset as ds
    from rmqstore.pipeline import jobs
    from test_splits import generate

    generate(tmp_path / "gen", 3)
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["spark", "export", "gen", "--out", "exported", "--master", "local[2]",
                            "--split-size", "20000", "-f", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["out"] == f"file://{tmp_path}/exported"
    assert doc["executorPython"] == sys.executable and doc["executorPythonFrom"] == "the driver's interpreter"
    rows = ds.dataset(str(tmp_path / "exported"), format="parquet").to_table().to_pylist()
    assert len(rows) == doc["records"] > 0 and {x["store"] for x in rows} == {"gen"}
    assert (tmp_path / "exported" / "_SUCCESS").exists()
    s = jobs.stats(spark, ["gen"], split_size=20000)
    assert sum(q.count for q in s.stats["gen"]) == doc["records"]


@pytest.mark.spark
def test_a_task_error_reaches_the_caller_as_one_typed_line(spark, tmp_path):
    """A CommitLog file that disappears after the driver planned (what an executor sees
    when the store is not mounted there): the task's SegmentError, file named, one line."""
    import shutil

    from rmqstore.pipeline import jobs

    if not ROCKETMQ_498.is_dir():
        pytest.skip("RocketMQ fixtures absent")
    store = tmp_path / "basic"
    shutil.copytree(ROCKETMQ_498 / "basic", store)
    gone = sorted((store / "commitlog").iterdir())[1]

    def progress(stage):
        if stage.startswith("stats:"):  # splits planned, tasks not started
            gone.rename(tmp_path / "moved")

    with pytest.raises(E.SegmentError) as err:
        jobs.stats(spark, [str(store)], split_size=1 << 20, progress=progress)
    text = str(err.value)
    assert re.fullmatch(rf"file://{re.escape(str(gone))}: cannot map segment: No such file or "
                        r"directory \(in a Spark task on \S+\)", text), text
    assert err.value.path == f"file://{gone}"


@pytest.mark.spark
def test_config_reaches_stats_and_audit(spark, tmp_path):
    """--config on stats and audit: a CommitLog kept elsewhere (storePathCommitLog) and
    another delay-level table (messageDelayLevel), both only in broker.conf."""
    import shutil

    if not ROCKETMQ_498.is_dir():
        pytest.skip("RocketMQ fixtures absent")
    from rmqstore import stats as STATS

    store = tmp_path / "store"
    shutil.copytree(ROCKETMQ_498 / "basic", store)
    elsewhere = tmp_path / "disk2" / "commitlog"
    elsewhere.parent.mkdir()
    (store / "commitlog").rename(elsewhere)
    conf = tmp_path / "broker.conf"
    # the fixture broker's own settings (fixtures README), and where the CommitLog went
    conf.write_text(f"mappedFileSizeCommitLog=65536\nmappedFileSizeConsumeQueue=1280\n"
                    f"maxHashSlotNum=64\nmaxIndexNum=256\nstorePathCommitLog={elsewhere}\n")
    r = runner.invoke(app, ["spark", "stats", str(store), "-f", "json", "--split-size", "30000"])
    assert r.exit_code == 2 and "no commitlog directory" in r.stderr  # without it: no CommitLog
    r = runner.invoke(app, ["spark", "stats", str(store), "--config", str(conf), "-f", "json",
                            "--split-size", "30000"])
    assert r.exit_code == 0, r.output
    ref, _ = STATS.commitlog_stats(str(ROCKETMQ_498 / "basic"), split_size=1 << 30)
    got = json.loads(r.stdout)["queues"]
    assert [(q["topic"], q["queueId"], q["messages"], q["bytes"]) for q in got] == \
        [(q.topic, q.queue_id, q.count, q.bytes) for q in ref]

    # special holds delay messages: their CQ tagsCode is storeTimestamp + the level's delay
    # (fixtures README), so another table makes every such unit a mismatch.
    special = str(ROCKETMQ_498 / "special")
    levels = tmp_path / "levels.conf"
    levels.write_text("messageDelayLevel=2s 6s 11s 31s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h\n")
    clean = runner.invoke(app, ["spark", "audit", special, "-f", "json"])
    assert clean.exit_code == 0, clean.output
    r = runner.invoke(app, ["spark", "audit", special, "--config", str(levels), "-f", "json"])
    assert r.exit_code == 1, r.output
    found = json.loads(r.stdout)["findings"]
    assert found and {f["topic"] for f in found} == {"SCHEDULE_TOPIC_XXXX"}
    assert {f["kind"] for f in found} == {"mismatch"} and {f["detail"] for f in found} == {"wrong tagsCode"}
