"""Parquet output written by tasks themselves, with a commit protocol of our own.

Tasks write their split's rows with pyarrow into a per-attempt directory and commit by
renaming it to the split's directory; the driver then moves the files of the splits the
chain check kept into place and writes ``_SUCCESS`` (the shape of Hadoop's
FileOutputCommitter v1). A retried or duplicated attempt never mixes into the output:
its rename finds the split directory taken and it deletes its own files. Rename is
atomic on local disks and HDFS; on object stores it is a copy, so use a filesystem there.

Measured against Spark's own Parquet writer, writing inside tasks was the faster one
(see docs/pipeline.md), which is why this module exists.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import uuid
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..scan import splits as S

from ..scan import arrow as AV
from ..errors import InputError
from ..selection import MessageFilter

#: Characters Spark escapes in partition directory names (ExternalCatalogUtils), so Spark
#: and pyarrow's hive partitioning both read the directory names back to the topic.
_ESCAPE = set(range(0x00, 0x20)) | {0x7F} | {ord(c) for c in '"#%\'*/:=?\\{[]^'}


def escape_partition(value: str) -> str:
    return "".join(f"%{ord(c):02X}" if ord(c) in _ESCAPE else c for c in value)


def filesystem(uri: str):
    """(pyarrow filesystem, path inside it) for a local path or a URI."""
    from pyarrow import fs as pafs

    if S.is_remote(uri):
        return S.arrow_filesystem(uri)
    return pafs.LocalFileSystem(), os.path.abspath(uri[7:] if uri.startswith("file://") else uri)


@dataclass
class ExportJob:
    """Where a job writes: the output dataset and its private ``_temporary/<job>`` area."""

    out: str
    job_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    partition_by: str | None = None
    body: bool = True
    rows_per_group: int = 65536
    #: Which records to write (None: all): the filter of ``rmqstore dump``, applied to each
    #: split's columns; ``limit`` caps the rows of one split (the driver cuts the total).
    filter: MessageFilter | None = None
    #: Per store, where its range starts (what ``max_bytes`` counts from).
    starts: Mapping[str, int] = field(default_factory=dict)

    @property
    def temp(self) -> str:
        return posixpath.join(self.out, "_temporary", self.job_id)

    def split_dir(self, split_id: int) -> str:
        return posixpath.join(self.temp, f"split-{split_id:06d}")

    def select(self, records, split: S.Split):
        """The records of a split to write: :meth:`MessageFilter.select` over its columns
        (the same code as ``rmqstore dump``), at most ``limit`` of them."""
        f = self.filter
        if f is None:
            return records
        chosen = f.select(records, self.starts.get(split.store))
        return records.take(chosen if f.limit is None else chosen[:f.limit])


def prepare(out: str) -> str:
    """Create the output directory; refuse one that already holds files."""
    from pyarrow import fs as pafs

    fs, path = filesystem(out)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        raise InputError(f"--out {out} is a file")
    if info.type == pafs.FileType.Directory:
        if fs.get_file_info(pafs.FileSelector(path)):
            raise InputError(f"--out {out} is not empty; choose a new directory")
    fs.create_dir(path)
    return path


def write_split(split: S.Split, job: ExportJob, attempt: str, *,
                replace: bool = False) -> tuple[S.Boundary, int]:
    """Read one split, write its rows (those ``job`` selects) as Parquet into an attempt
    directory, commit it.

    With ``partition_by="topic"`` rows go to ``topic=<escaped>/`` directories without a
    ``topic`` column (Hive layout). Returns the split's boundary for the chain check and
    the number of rows written.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    fs, _ = filesystem(job.out)
    _, temp = filesystem(job.temp)
    att = posixpath.join(temp, f"attempt-{split.split_id:06d}-{attempt}")
    fs.create_dir(att)
    writers: dict[str, pq.ParquetWriter] = {}
    schema = AV.ARROW_SCHEMA()
    part_schema = schema.remove(schema.get_field_index("topic")) if job.partition_by else schema

    def writer(key: str):
        w = writers.get(key)
        if w is None:
            d = att if key == "" else posixpath.join(att, f"topic={escape_partition(key)}")
            fs.create_dir(d)
            w = pq.ParquetWriter(posixpath.join(d, f"part-{split.split_id:06d}.parquet"),
                                 part_schema, filesystem=fs, compression="snappy")
            writers[key] = w
        return w

    try:
        with S.open_split(split) as sc:
            boundary = sc.boundary
            records = job.select(sc.records, split)
            written = len(records)
            for batch in AV.iter_batches(records, split.store, body=job.body, rows=job.rows_per_group):
                if not job.partition_by:
                    writer("").write_batch(batch)
                    continue
                topics = batch.column("topic")
                enc = topics.dictionary_encode()
                idx = batch.schema.get_field_index("topic")
                rest = batch.drop_columns(["topic"]) if hasattr(batch, "drop_columns") else \
                    pa.RecordBatch.from_arrays([c for i, c in enumerate(batch.columns) if i != idx],
                                               schema=part_schema)
                for k, name in enumerate(enc.dictionary.to_pylist()):
                    writer(name).write_batch(rest.filter(pc.equal(enc.indices, k)))
    finally:
        for w in writers.values():
            w.close()
    dest = posixpath.join(temp, f"split-{split.split_id:06d}")
    from pyarrow import fs as pafs

    if replace and fs.get_file_info(dest).type != pafs.FileType.NotFound:
        fs.delete_dir(dest)
    try:
        if fs.get_file_info(dest).type != pafs.FileType.NotFound:
            raise FileExistsError(dest)
        fs.move(att, dest)
    except (FileExistsError, OSError):
        # Another attempt of this split committed first; ours is redundant.
        fs.delete_dir(att)
    return boundary, written


def commit(job: ExportJob, keep: Sequence[int]) -> list[str]:
    """Job commit: move the kept splits' files into the dataset, drop the rest and the
    temporary area, write ``_SUCCESS``. Returns the dataset's file paths."""
    from pyarrow import fs as pafs

    fs, out = filesystem(job.out)
    _, temp = filesystem(job.temp)
    files = []
    for sid in keep:
        d = posixpath.join(temp, f"split-{sid:06d}")
        if fs.get_file_info(d).type == pafs.FileType.NotFound:
            continue
        for info in fs.get_file_info(pafs.FileSelector(d, recursive=True)):
            if info.type != pafs.FileType.File:
                continue
            rel = posixpath.relpath(info.path, d)
            dest = posixpath.join(out, rel)
            fs.create_dir(posixpath.dirname(dest))
            fs.move(info.path, dest)
            files.append(dest)
    fs.delete_dir(posixpath.dirname(temp) if posixpath.basename(posixpath.dirname(temp)) == "_temporary" else temp)
    with fs.open_output_stream(posixpath.join(out, "_SUCCESS")):
        pass
    return sorted(files)


@dataclass
class ExportResult:
    out: str
    splits: int  # splits read (with a filter's offset range: only those it needs)
    records: int  # rows written
    files: list[str]
    ends: dict[str, S.StoreEnd]  # where valid data ends, in the splits read
    reread: int  # splits re-read with a forced start after a wrong resync


def plan(stores: Sequence[S.StoreFiles], split_size: int,
         flt: MessageFilter | None = None) -> tuple[list[S.Split], dict[str, int]]:
    """The splits an export reads and, per store, where its range starts (what
    ``max_bytes`` counts from, as ``rmqstore dump`` counts it). With an offset range or
    ``max_bytes``, splits that cannot hold a selected record are left out
    (:func:`splits.in_range`)."""
    splits = S.plan_splits(list(stores), split_size)
    if flt is None or (flt.from_offset is None and flt.to_offset is None and flt.max_bytes is None):
        return splits, {}
    out: list[S.Split] = []
    starts: dict[str, int] = {}
    for sf in stores:
        first = sf.files[0][1] if sf.files else 0
        starts[sf.store] = flt.scan_start(first)
        out += S.in_range([s for s in splits if s.store == sf.store], flt.from_offset,
                          flt.scan_end(first))
    return out, starts


def finish(job: ExportJob, splits: Sequence[S.Split], boundaries: dict[int, S.Boundary],
           written: dict[int, int], progress=lambda stage: None) -> ExportResult:
    """After the split tasks: the chain check (wrong resyncs rewritten here), the cut at
    ``limit`` (the first rows in the stores' order and CommitLog order, as ``rmqstore dump``
    gives them: the split where the limit falls is rewritten with the rows it may keep,
    later splits are dropped), then the job commit."""
    by_id = {s.split_id: s for s in splits}

    def again(s: S.Split) -> S.Boundary:
        b, written[s.split_id] = write_split(s, job, "driver", replace=True)
        return b

    progress("checking split chain")
    st, replaced = S.resolve(splits, boundaries, again)
    keep = st.keep
    limit = job.filter.limit if job.filter is not None else None
    if limit is not None:
        keep, left = [], limit
        for sid in st.keep:  # split ids follow the stores' order, then CommitLog order
            if left == 0:
                break
            if written[sid] > left:
                cut = dataclasses.replace(job, filter=dataclasses.replace(job.filter, limit=left))
                _, written[sid] = write_split(replaced.get(sid, by_id[sid]), cut, "limit", replace=True)
            keep.append(sid)
            left -= written[sid]
    progress("committing")
    files = commit(job, keep)
    return ExportResult(job.out, len(splits), sum(written[sid] for sid in keep), files, st.ends,
                        len(replaced))


def count_rows(out: str) -> int:
    """Rows of the Parquet dataset at ``out`` (from the files' footers)."""
    import pyarrow.dataset as ds

    fs, path = filesystem(out)
    return ds.dataset(path, filesystem=fs, format="parquet", partitioning="hive").count_rows()


def export_local(stores: Sequence[str], out: str, *, split_size: int = S.DEFAULT_SPLIT_SIZE,
                 partition_by: str | None = None, body: bool = True, processes: int = 1,
                 filter: MessageFilter | None = None) -> ExportResult:
    """The export without Spark: the same split writer and commit, in this process (or a
    process pool). The single-process baseline of the Spark benchmark."""
    prepare(out)
    files = [S.list_store(s) for s in stores]
    splits, starts = plan(files, split_size, filter)
    job = ExportJob(out, partition_by=partition_by, body=body, filter=filter, starts=starts)
    from functools import partial

    task = partial(_local_task, job=job)
    boundaries: dict[int, S.Boundary] = {}
    written: dict[int, int] = {}
    if processes > 1 and len(splits) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(processes) as pool:
            for s, (b, n) in zip(splits, pool.map(task, splits)):
                boundaries[s.split_id], written[s.split_id] = b, n
    else:
        for s in splits:
            boundaries[s.split_id], written[s.split_id] = task(s)
    return finish(job, splits, boundaries, written)


def _local_task(split: S.Split, job: ExportJob) -> tuple[S.Boundary, int]:
    return write_split(split, job, "0")
