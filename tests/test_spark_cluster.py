"""The Spark commands on a real standalone cluster: a master and a worker started from the
installed pyspark (``spark-class``), loopback only, free ports, small memory, stopped at
the end of the session even when a test fails.

What a cluster changes against local mode: executors run in the worker's scratch
directory (``work/app-*/0``), in other processes than the driver. So the four jobs run
with RELATIVE store and ``--out`` paths from a temporary working directory, and their
results must equal local mode's. All commands share one driver process (one Spark start)
to keep the cost down; a last command switches the executors to a Python without
rmqstore and must fail with one line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROCKETMQ_498

pytestmark = pytest.mark.spark

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'rmqstore[spark]')")

STARTUP_LIMIT = 600  # seconds a daemon may take to come up before the test gives up (not a budget)


def _start(spark_class: Path, args: list[str], log: Path, env: dict, ready: str, procs: list):
    """Start one daemon in its own process group; wait for ``ready`` in its log."""
    fh = open(log, "wb")
    p = subprocess.Popen([str(spark_class), *args], stdout=fh, stderr=subprocess.STDOUT, env=env,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    fh.close()
    procs.append(p)
    deadline = time.monotonic() + STARTUP_LIMIT
    while time.monotonic() < deadline:
        m = re.search(ready, log.read_text(errors="replace"))
        if m:
            return m
        if p.poll() is not None:
            break
        time.sleep(0.2)
    pytest.fail(f"{args[0]} did not start (exit {p.poll()}):\n" + log.read_text(errors="replace")[-3000:])


def _stop(p: subprocess.Popen) -> None:
    """Stop a daemon and what it started (the worker's executors share its group)."""
    for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """(master URL, worker's scratch directory) of a standalone cluster on 127.0.0.1."""
    import pyspark

    home = Path(pyspark.__file__).parent
    base = tmp_path_factory.mktemp("spark-cluster")
    (base / "conf").mkdir()
    (base / "work").mkdir()
    env = {**os.environ,
           "SPARK_HOME": str(home),
           "SPARK_CONF_DIR": str(base / "conf"),  # no spark-defaults from anywhere else
           "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_DAEMON_MEMORY": "256m",
           "SPARK_DAEMON_JAVA_OPTS": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
           # the REST submission server would take the fixed port 6066
           "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
    spark_class = home / "bin" / "spark-class"
    procs: list[subprocess.Popen] = []
    try:
        m = _start(spark_class, ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                 "--port", "0", "--webui-port", "0"],
                   base / "master.log", env, r"Starting Spark master at (spark://127\.0\.0\.1:\d+)", procs)
        url = m.group(1)
        _start(spark_class, ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                             "--port", "0", "--webui-port", "0", "--cores", "2", "--memory", "1g",
                             "--work-dir", str(base / "work"), url],
               base / "worker.log", env, r"Successfully registered with master", procs)
        yield url, base / "work"
    finally:
        for p in reversed(procs):
            _stop(p)


# One driver process runs every command (typer's CliRunner, so each command's stdout,
# stderr and exit code are its own); Spark starts once, with the first command.
DRIVER = r"""
import json, sys
from typer.testing import CliRunner
from cli.main import app

results = []
for args in json.loads(sys.argv[1]):
    if args[0] == "--executors-python":
        # test only: executors start this Python from the next job on
        from pyspark import SparkContext
        SparkContext._active_spark_context.pythonExec = args[1]
        continue
    r = CliRunner().invoke(app, args)
    results.append({"args": args, "code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr})
with open(sys.argv[2], "w") as f:
    json.dump(results, f)
"""

STORES = ["basic", "crash-torn-tail"]  # crash-torn-tail: one documented audit finding


def _commands(master_args: list[str], tag: str) -> list[list[str]]:
    return [["spark", "export", *STORES, "--out", f"export-{tag}", *master_args, "-f", "json",
             "--split-size", "40000"],
            ["spark", "stats", *STORES, *master_args, "-f", "json", "--split-size", "40000"],
            ["spark", "audit", *STORES, *master_args, "-f", "json", "--split-size", "40000"],
            ["spark", "rebuild-cq", "basic", "--out", f"cq-{tag}", *master_args, "-f", "json",
             "--split-size", "40000"]]


def _python_without_rmqstore(tmp: Path) -> Path:
    shadow = tmp / "shadow" / "rmqstore"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'rmqstore'\", name='rmqstore')\n")
    exe = tmp / "python-without-rmqstore"
    exe.write_text(f"#!/bin/sh\nPYTHONPATH={shadow.parent}${{PYTHONPATH:+:$PYTHONPATH}} "
                   f"exec {sys.executable} \"$@\"\n")
    exe.chmod(0o755)
    return exe


def _rows(path: Path) -> list[dict]:
    import pyarrow.dataset as ds

    t = ds.dataset(str(path), format="parquet").to_table()
    return sorted(t.to_pylist(), key=lambda r: (r["store"], r["commitLogOffset"]))


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _without_spark(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k not in ("spark", "out", "master", "executorPython",
                                                       "executorPythonFrom")}


def test_four_jobs_on_a_standalone_cluster_with_relative_paths_equal_local_mode(
        spark_cluster, spark, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from cli.main import app

    if not ROCKETMQ_498.is_dir():
        pytest.skip("RocketMQ fixtures absent")
    url, scratch = spark_cluster
    for s in STORES:
        shutil.copytree(ROCKETMQ_498 / s, tmp_path / s)
    bad_python = _python_without_rmqstore(tmp_path / "py")

    cluster_args = ["--master", url, "--conf", "spark.driver.host=127.0.0.1",
                    "--conf", "spark.driver.bindAddress=127.0.0.1",
                    "--conf", "spark.executor.memory=512m", "--conf", "spark.ui.enabled=false",
                    "--conf", "spark.sql.shuffle.partitions=2",
                    "--conf", "spark.driver.extraJavaOptions=-XX:+UseSerialGC -XX:TieredStopAtLevel=1"]
    runs = _commands(cluster_args, "cluster") + [
        ["--executors-python", str(bad_python)],
        ["spark", "stats", "basic", *cluster_args, "-f", "json"]]
    results_file = tmp_path / "results.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "SPARK_HOME")}
    driver = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(runs), str(results_file)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3600)
    assert driver.returncode == 0 and results_file.exists(), driver.stderr[-5000:]
    on_cluster = json.loads(results_file.read_text())
    export, stats, audit, rebuild, bad = on_cluster

    # It ran on the cluster: the master reported back, and the worker ran an executor.
    for r in (export, rebuild):
        assert r["code"] == 0, r
        doc = json.loads(r["stdout"])
        assert doc["master"] == url and doc["executorPython"] == sys.executable
        assert doc["executorPythonFrom"] == "the driver's interpreter"
    assert json.loads(stats["stdout"])["spark"]["master"] == url
    assert list(scratch.glob("app-*/0/stderr")), "no executor ran on the worker"
    # --out paths were the driver's, not the worker's scratch directory
    assert json.loads(export["stdout"])["out"] == f"file://{tmp_path}/export-cluster"
    assert json.loads(rebuild["stdout"])["out"] == f"file://{tmp_path}/cq-cluster"
    assert not list(scratch.rglob("export-cluster")) and not list(scratch.rglob("cq-cluster"))

    # The same commands in local mode (the session the other Spark tests share).
    monkeypatch.chdir(tmp_path)
    local = [CliRunner().invoke(app, args) for args in _commands(["--master", "local[2]"], "local")]
    assert [r.exit_code for r in local] == [0, 0, 1, 0], [r.output for r in local]
    assert [r["code"] for r in (export, stats, audit, rebuild)] == [0, 0, 1, 0]

    assert _without_spark(json.loads(export["stdout"])) == _without_spark(json.loads(local[0].stdout))
    rows = _rows(tmp_path / "export-cluster")
    assert rows == _rows(tmp_path / "export-local")
    assert {r["store"] for r in rows} == set(STORES) and len(rows) == json.loads(export["stdout"])["records"]
    assert _without_spark(json.loads(stats["stdout"])) == _without_spark(json.loads(local[1].stdout))
    audited = json.loads(audit["stdout"])
    assert _without_spark(audited) == _without_spark(json.loads(local[2].stdout))
    # fixtures README: crash-torn-tail keeps the pre-crash tagsCode of TopicHot/0 unit 159
    assert [(f["store"], f["topic"], f["queueId"], f["queueOffset"], f["kind"]) for f in audited["findings"]] \
        == [("crash-torn-tail", "TopicHot", 0, 159, "mismatch")]
    assert _without_spark(json.loads(rebuild["stdout"])) == _without_spark(json.loads(local[3].stdout))
    golden = _tree(ROCKETMQ_498 / "basic" / "consumequeue")
    assert _tree(tmp_path / "cq-cluster") == golden == _tree(tmp_path / "cq-local")

    # Executors whose Python cannot import rmqstore: one line, exit 2, no traces.
    assert bad["code"] == 2 and bad["stdout"] == ""
    assert bad["stderr"].splitlines() == [
        f"rmqstore: executors' Python ({bad_python}) cannot import rmqstore: every node needs the "
        "same rmqstore version with the 'spark' extra for that Python; choose the executors' Python "
        "with --python or PYSPARK_PYTHON (docs/pipeline.md, On a cluster)"]
    for noise in ("Traceback", "Py4J", "py4j", "\tat org.apache", "PythonException"):
        assert noise not in driver.stderr, (noise, driver.stderr[-3000:])
