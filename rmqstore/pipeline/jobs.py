"""The PySpark jobs, by name: what the CLI, benchmarks and scripts call.

* export (:mod:`pipeline.export_job`): every valid record as one Parquet dataset;
* stats (:mod:`pipeline.stats_job`): per-queue aggregates, as ``rmqstore stats``;
* audit / rebuild-cq (:mod:`pipeline.consumequeue_jobs`): the ConsumeQueue units the
  CommitLog implies, compared with the queues or written as a new tree;
* the session they run in and the per-split task runner (:mod:`pipeline.tasks`).

Importing this module imports pyspark; the CLI imports it only when a Spark command runs
(and tests replace it to check that the CLI refuses before Spark starts).
"""

from __future__ import annotations

from .consumequeue_jobs import AuditResult, RebuildResult, audit, rebuild_cq
from .export_job import boundaries, export
from .stats_job import StatsResult, stats
from .tasks import Progress, Stores, executor_python, session, store_files

__all__ = ["AuditResult", "Progress", "RebuildResult", "StatsResult", "Stores", "audit",
           "boundaries", "executor_python", "export", "rebuild_cq", "session", "stats",
           "store_files"]
