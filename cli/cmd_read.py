"""Read-side commands: dump and get. Nothing here writes to a store."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from cli.common import (BodyMode, ConfigOption, app, fail, handles_errors, parse_time,
                        report_config)
from cli.output import Format, Output, output_options

MESSAGE_COLUMNS = ("commitLogOffset", "storeSize", "topic", "queueId", "queueOffset",
                   "storeTimestamp", "tags", "keys", "uniqKey", "body")
UNIT_COLUMNS = ("queueOffset", "commitLogOffset", "size", "tagsCode")
# Tables show KEYS tokens as the property holds them, space-separated (a token has no space).
MESSAGE_CELLS = {"keys": " ".join}
ENTRY_COLUMNS = ("entry", "slot", "keyHash", "phyOffset", "timeDiff", "prevIndex")


def _message_rows(messages, body: str):
    from rmqstore.view import message_dict

    for m in messages:
        yield message_dict(m, body)


def _limited(rows, limit):
    for i, row in enumerate(rows):
        if limit is not None and i >= limit:
            return
        yield row


def _body_mode(body: Optional[BodyMode], fmt: Format) -> str:
    if body is not None:
        return body.value
    return "text" if fmt is Format.table else "base64"


def _messages(out: Output, rows) -> int:
    from rmqstore.view import MESSAGE_FIELDS

    return out.rows(rows, MESSAGE_COLUMNS, fields=MESSAGE_FIELDS, times=("storeTimestamp",),
                    cells=MESSAGE_CELLS)


def _index_geometry_known(cfg, where) -> None:
    """Index lookups need the IndexFile geometry: without it, one clear error, first."""
    from rmqstore.errors import ConfigError

    why = cfg.undetermined.get("max_hash_slot_num")
    if why:
        raise ConfigError(f"{why}; pass --config with both", where)


@app.command()
@handles_errors
@output_options
def dump(
    path: Path = typer.Argument(..., help="A store root, a CommitLog segment file, a ConsumeQueue folder or file, an IndexFile, or the checkpoint."),
    topic: Optional[str] = typer.Option(None, "--topic", "-t", help="Only messages (or queues) of this topic."),
    queue_id: Optional[int] = typer.Option(None, "--queue-id", "-q", help="Only this queue id."),
    from_offset: Optional[int] = typer.Option(None, "--from-offset", help="Only records at or after this CommitLog offset (queue offset for a ConsumeQueue)."),
    to_offset: Optional[int] = typer.Option(None, "--to-offset", help="Only records before this CommitLog offset (queue offset for a ConsumeQueue)."),
    since: Optional[str] = typer.Option(None, "--since", help="Only messages stored at or after this time (epoch ms or ISO-8601)."),
    until: Optional[str] = typer.Option(None, "--until", help="Only messages stored at or before this time (epoch ms or ISO-8601)."),
    limit: Optional[int] = typer.Option(None, "--limit", "-n", min=0, help="Stop after this many rows."),
    body: Optional[BodyMode] = typer.Option(None, "--body", help="How to print bodies: base64 (JSON default, lossless), text (table default), hex, none."),
    config: Optional[Path] = ConfigOption,
    *, out: Output,
) -> None:
    """Print what a store or store file holds: messages in physical order, ConsumeQueue
    units, IndexFile entries, or the checkpoint. The kind of PATH is recognised from
    where it sits."""
    from rmqstore.reader import classify, open_segment_file, open_store

    from rmqstore.config import load_config

    kind = classify(path)
    t_since, t_until = parse_time(since, "--since"), parse_time(until, "--until")
    # A file inside a store is read with the store's settings, checked like the store's.
    cfg = load_config(kind.root, config) if kind.root is not None and kind.kind != "store" else None
    if cfg is not None:
        if kind.kind == "indexfile":
            _index_geometry_known(cfg, kind.path)
        report_config(cfg)
    if kind.kind in ("store", "commitlog-segment"):
        reader = open_store(path, config) if kind.kind == "store" else open_segment_file(path, config)
        if kind.kind == "store":
            report_config(reader.config)
        with reader:
            _messages(out, reader.message_dicts(_body_mode(body, out.fmt), topic=topic,
                                                queue_id=queue_id, from_offset=from_offset,
                                                to_offset=to_offset, since=t_since,
                                                until=t_until, limit=limit))
        return
    if kind.kind in ("consumequeue-dir", "consumequeue-file"):
        from rmqstore.consumequeue import ConsumeQueue
        from rmqstore.view import unit_dict

        cfg = cfg or load_config(kind.root, config)
        qdir = kind.path if kind.kind == "consumequeue-dir" else kind.path.parent
        with ConsumeQueue(qdir, cfg.cq_file_size) as cq:
            units = cq.iter_units(from_offset, placeholders=True)
            if kind.kind == "consumequeue-file":
                first = int(kind.path.name) // 20
                last = first + cfg.cq_file_size // 20
                units = (u for u in units if first <= u.queue_offset < last)
            rows = (unit_dict(*u) for u in units
                    if to_offset is None or u.queue_offset < to_offset)
            out.rows(_limited(rows, limit), UNIT_COLUMNS)
        return
    if kind.kind == "indexfile":
        from rmqstore.index import IndexFile, infer_index_geometry

        cfg = cfg or load_config(kind.root, config)
        geometry = infer_index_geometry(kind.path.stat().st_size, hash_slot_num=cfg.max_hash_slot_num,
                                        index_num=cfg.max_index_num, path=kind.path)
        f = IndexFile(kind.path, geometry)
        try:
            h = f.header
            header = {"beginTimestamp": h.begin_timestamp, "endTimestamp": h.end_timestamp,
                      "beginPhyOffset": h.begin_phy_offset, "endPhyOffset": h.end_phy_offset,
                      "hashSlotCount": h.hash_slot_count, "indexCount": h.index_count,
                      "hashSlotNum": geometry.hash_slot_num, "indexNum": geometry.index_num}
            out.record(header, title=f"IndexFile {path}", key="header", items=False,
                       times=("beginTimestamp", "endTimestamp"))
            out.rows(_limited(_entries(f.used_entries, geometry.hash_slot_num), limit),
                     ENTRY_COLUMNS, key="entries")
        finally:
            f.close()
        return
    if kind.kind == "checkpoint":
        from rmqstore.checkpoint import read_checkpoint

        cp = read_checkpoint(kind.path)
        out.record({"physicMsgTimestamp": cp.physic_msg_timestamp,
                    "logicsMsgTimestamp": cp.logics_msg_timestamp,
                    "indexMsgTimestamp": cp.index_msg_timestamp,
                    "masterFlushedOffset": cp.master_flushed_offset,
                    "confirmPhyOffset": cp.confirm_phy_offset}, title="checkpoint",
                   times=("physicMsgTimestamp", "logicsMsgTimestamp", "indexMsgTimestamp"))
        return
    raise fail(f"{path}: cannot dump a {kind.kind}")


def _entries(e, slots: int):
    """IndexFile entries as rows, a chunk of the arrays at a time."""
    for start in range(0, len(e), 65536):
        c = e[start:start + 65536]
        for i, kh, po, td, pv in zip(range(start + 1, start + 1 + len(c)), c["key_hash"].tolist(),
                                     c["phy_offset"].tolist(), c["time_diff"].tolist(),
                                     c["prev_index"].tolist()):
            yield {"entry": i, "slot": kh % slots, "keyHash": kh, "phyOffset": po,
                   "timeDiff": td, "prevIndex": pv}


@app.command()
@handles_errors
@output_options
def get(
    store: Path = typer.Argument(..., help="The store root."),
    offset: Optional[int] = typer.Option(None, "--offset", help="CommitLog physical offset of the record."),
    msg_id: Optional[str] = typer.Option(None, "--msg-id", help="offsetMsgId (32 or 56 hex characters)."),
    topic: Optional[str] = typer.Option(None, "--topic", "-t", help="Topic, with --queue-id/--queue-offset or --uniq-key."),
    queue_id: Optional[int] = typer.Option(None, "--queue-id", "-q", help="Queue id, with --topic and --queue-offset."),
    queue_offset: Optional[int] = typer.Option(None, "--queue-offset", help="Queue offset, with --topic and --queue-id."),
    uniq_key: Optional[str] = typer.Option(None, "--uniq-key", help="UNIQ_KEY (client message id), with --topic."),
    body: Optional[BodyMode] = typer.Option(None, "--body", help="How to print the body: base64 (JSON default), text (table default), hex, none."),
    config: Optional[Path] = ConfigOption,
    *, out: Output,
) -> None:
    """Print one message, found by offset, offsetMsgId, queue position, or UNIQ_KEY
    (-f json: an object; with --uniq-key, an array of every match). Exit 1 when nothing
    matches."""
    from rmqstore.reader import open_store
    from rmqstore.view import MESSAGE_FIELDS, message_dict

    ways = [offset is not None, msg_id is not None,
            queue_offset is not None or (queue_id is not None and uniq_key is None),
            uniq_key is not None]
    if sum(ways) != 1:
        raise fail("give exactly one of --offset, --msg-id, --topic/--queue-id/--queue-offset, --topic/--uniq-key")
    if (ways[2] or ways[3]) and topic is None:
        raise fail("--topic is required with --queue-offset or --uniq-key")
    if ways[2] and (queue_id is None or queue_offset is None):
        raise fail("--queue-id and --queue-offset go together")
    with open_store(store, config) as reader:
        if uniq_key is not None:
            _index_geometry_known(reader.config, reader.config.index_dir)
        report_config(reader.config)
        if offset is not None:
            msgs = [reader.read_at(offset)]
        elif msg_id is not None:
            msgs = [reader.get_by_msg_id(msg_id)]
        elif ways[2]:
            msgs = [reader.get_by_queue_offset(topic, queue_id, queue_offset)]
        else:
            msgs = reader.get_by_uniq_key(topic, uniq_key)
        if not msgs:
            raise fail("no message matches", 1)
        rows = [message_dict(m, _body_mode(body, out.fmt)) for m in msgs]
    times = ("bornTimestamp", "storeTimestamp")
    if uniq_key is None:
        out.record(rows[0], fields=MESSAGE_FIELDS, times=times, cells=MESSAGE_CELLS)
    else:
        out.rows(rows, fields=MESSAGE_FIELDS, times=times, cells=MESSAGE_CELLS, vertical=True)


@app.command("query-key")
@handles_errors
@output_options
def query_key(
    store: Path = typer.Argument(..., help="The store root."),
    topic: str = typer.Option(..., "--topic", "-t", help="Topic the key was sent with."),
    key: str = typer.Option(..., "--key", "-k", help="A KEYS token or a UNIQ_KEY."),
    max_num: Optional[int] = typer.Option(None, "--max-num", min=1, help="Most hits to collect (the broker caps it at maxMsgsNumBatch, 64)."),
    begin: Optional[str] = typer.Option(None, "--begin", help="Earliest store time (epoch ms or ISO-8601)."),
    end: Optional[str] = typer.Option(None, "--end", help="Latest store time (epoch ms or ISO-8601)."),
    body: Optional[BodyMode] = typer.Option(None, "--body", help="How to print bodies: base64 (JSON default), text (table default), hex, none."),
    config: Optional[Path] = ConfigOption,
    *, out: Output,
) -> None:
    """Find messages by key through the IndexFiles, walking them as the broker does, then
    keep only records whose KEYS or UNIQ_KEY really equal the key. Exit 1 when none."""
    from rmqstore.reader import open_store

    b = parse_time(begin, "--begin")
    e = parse_time(end, "--end")
    with open_store(store, config) as reader:
        _index_geometry_known(reader.config, reader.config.index_dir)
        report_config(reader.config)
        msgs = reader.query_key(topic, key, max_num, 0 if b is None else b,
                                2**63 - 1 if e is None else e)
        found = _messages(out, _message_rows(msgs, _body_mode(body, out.fmt)))
    if not found:
        raise typer.Exit(1)


QUEUE_COLUMNS = ("topic", "queueId", "messages", "bytes", "minQueueOffset", "maxQueueOffset",
                 "cqMinOffset", "cqMaxOffset", "firstStoreTime", "lastStoreTime")
INDEX_COLUMNS = ("name", "entries", "hashSlotCount", "beginTimestamp", "endTimestamp",
                 "beginPhyOffset", "endPhyOffset")


@app.command()
@handles_errors
@output_options
def stats(
    store: Path = typer.Argument(..., help="The store root."),
    config: Optional[Path] = ConfigOption,
    *, out: Output,
) -> None:
    """Per topic/queue message counts, queue offsets, bytes and store times (from the
    CommitLog, next to the ConsumeQueue's own min/max), the CommitLog's extent, the
    IndexFiles and the checkpoint. jsonl, csv and tsv: one row per queue; json: all of it."""
    from rmqstore.reader import open_store
    from rmqstore.stats import store_stats

    with open_store(store, config) as reader:
        report_config(reader.config)
        s = store_stats(reader, conf=config)
    cl = s["commitLog"]
    out.document(s)
    out.record({"store": s["store"], "minOffset": cl["minOffset"], "maxOffset": cl["maxOffset"],
                "messages": cl["messages"], "bytes": cl["bytes"], "segments": cl["segments"],
                "segmentSize": cl["segmentSize"], "endReason": cl["endReason"],
                "abortFile": s["abortFile"]}, title="CommitLog", items=False)
    out.rows(s["queues"], QUEUE_COLUMNS, title="Queues", times=("firstStoreTime", "lastStoreTime"))
    if s["indexFiles"]:
        out.rows(s["indexFiles"], INDEX_COLUMNS, title="IndexFiles", items=False,
                 times=("beginTimestamp", "endTimestamp"))
