"""Measuring the Spark export against one plain process (for ``rmqstore bench``).

:func:`generate_commitlog` writes a synthetic but valid CommitLog quickly (a block of
records made by :func:`~rmqstore.format.record.encode_record`, tiled, with PHYSICALOFFSET /
QUEUEOFFSET / STORETIMESTAMP set by the format's vector form ``set_head_field``);
:func:`bench_spark_export` times the same export with :func:`output.export_local` in one
process and with the Spark job, on a warm session (start-up is reported apart).
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ..format import layout as L
from ..format.message import Host, Message
from ..format.record import encode_record, set_head_field


def generate_commitlog(root: str | os.PathLike, total_bytes: int, *, segment_size: int = 1 << 30,
                       seed: int = 0, block_records: int = 4096) -> dict:
    """Write ``root/commitlog/`` with about ``total_bytes`` of ~220-byte records (8 topics,
    4 queues each, tags, keys, UNIQ_KEY, 60-220-byte bodies). Returns counts."""
    rng = random.Random(seed)
    d = Path(root) / "commitlog"
    d.mkdir(parents=True, exist_ok=True)
    topics = [f"BenchTopic{i}" for i in range(8)]
    recs, keys = [], []
    for i in range(block_records):
        t, q = rng.randrange(8), rng.randrange(4)
        body = bytes(rng.randrange(256) for _ in range(rng.randint(60, 220)))
        m = Message(topic=topics[t], body=body, queue_id=q, born_timestamp=1700000000000 + i,
                    properties={"TAGS": f"tag{i % 5}", "KEYS": f"order{i} user{i % 97}",
                                "UNIQ_KEY": f"0A0000011092{i:020X}", "CLUSTER": "BenchCluster"},
                    born_host=Host(bytes([10, 0, 0, 1 + i % 3]), 40000 + i % 50),
                    store_host=Host(bytes([10, 0, 0, 100]), 10911))
        recs.append(encode_record(m))
        keys.append(t * 4 + q)
    block = np.frombuffer(b"".join(recs), np.uint8)
    starts = np.cumsum([0] + [len(r) for r in recs[:-1]]).astype(np.int64)
    keys = np.array(keys)
    rank = np.zeros(len(keys), np.int64)
    per_key = np.zeros(32, np.int64)
    for i, k in enumerate(keys):
        rank[i] = per_key[k]
        per_key[k] += 1
    written = records = 0
    seg = 0
    qbase = np.zeros(32, np.int64)
    while written < total_bytes:
        n_blocks = max(1, min((segment_size - 8) // len(block), -(-(total_bytes - written) // len(block))))
        buf = np.zeros(segment_size, np.uint8)
        data = np.tile(block, n_blocks)
        rec_pos = (starts[None, :] + (np.arange(n_blocks) * len(block))[:, None]).reshape(-1)
        k = np.tile(keys, n_blocks)
        qo = qbase[k] + np.tile(rank, n_blocks) + np.repeat(np.arange(n_blocks), len(keys)) * per_key[k]
        set_head_field(data, "physical_offset", rec_pos + seg, rec_pos)
        set_head_field(data, "queue_offset", qo, rec_pos)
        set_head_field(data, "store_timestamp", 1700000000000 + np.arange(len(rec_pos)) // 1000,
                       rec_pos)
        qbase += per_key * n_blocks
        buf[:len(data)] = data
        if len(data) + 8 <= segment_size:  # spec §4: BLANK to the end of the segment
            buf[len(data):len(data) + 8] = np.frombuffer(
                L.BLANK_STRUCT.pack(segment_size - len(data), L.MAGIC_BLANK), np.uint8)
        (d / f"{seg:020d}").write_bytes(buf.tobytes())
        written += len(data)
        records += len(rec_pos)
        seg += segment_size
    return {"bytes": written, "records": records, "segments": seg // segment_size}


def bench_spark_export(store: str, *, master: str = "local[2]", split_size: int = 64 << 20,
                       workdir: str | None = None, writers=("pyarrow", "spark"), repeat: int = 1) -> dict:
    """Seconds for one-process export vs the Spark export of the same store (median of
    ``repeat``), on a warm Spark session; returns the figures and the speed-up."""
    from . import jobs
    from .output import export_local

    work = Path(workdir or tempfile.mkdtemp(prefix="rmqstore-bench-"))
    res: dict = {"store": store, "master": master, "splitSize": split_size}

    def timed(fn):
        times = []
        for i in range(repeat):
            out = work / f"out-{time.monotonic_ns()}"
            t = time.perf_counter()
            r = fn(str(out))
            times.append(time.perf_counter() - t)
            shutil.rmtree(out, ignore_errors=True)
        return statistics.median(times), r

    res["singleProcessSeconds"], r = timed(lambda o: export_local([store], o, split_size=split_size))
    res["records"] = r.records
    t = time.perf_counter()
    spark = jobs.session(master)
    spark.range(4, numPartitions=2).mapInArrow(lambda it: it, "id long").count()  # warm workers
    res["sparkStartSeconds"] = time.perf_counter() - t
    for w in writers:
        res[f"spark_{w}_Seconds"], _ = timed(
            lambda o: jobs.export(spark, [store], o, split_size=split_size, writer=w))
        res[f"speedup_{w}"] = res["singleProcessSeconds"] / res[f"spark_{w}_Seconds"]
    size = sum(f.stat().st_size for f in (Path(store) / "commitlog").iterdir())
    res["MiBps_single"] = size / 2**20 / res["singleProcessSeconds"]
    for w in writers:
        res[f"MiBps_spark_{w}"] = size / 2**20 / res[f"spark_{w}_Seconds"]
    shutil.rmtree(work, ignore_errors=True)
    return res
