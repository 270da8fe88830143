"""Spark jobs over RocketMQ stores: export, stats, audit, rebuild-cq.

Only :mod:`rmqstore.pipeline.jobs` and the job modules it gathers (``tasks``,
``export_job``, ``stats_job``, ``consumequeue_jobs``) import pyspark. The pieces tasks run — split reading
(:mod:`rmqstore.scan.splits`), Parquet writing with its commit protocol
(:mod:`rmqstore.pipeline.output`) and the per-queue audit (:mod:`rmqstore.pipeline.audit`)
— are plain Python on numpy/pyarrow, so the CLI and tests use them without Spark.
"""
