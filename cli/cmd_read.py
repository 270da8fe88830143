"""Read-side commands: dump and get. Nothing here writes to a store."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from cli.common import (BodyMode, ConfigOption, Format, FormatOption, app, fail,
                        handles_errors, parse_time, report_config, resolve_format)
from cli import render

MESSAGE_COLUMNS = ("commitLogOffset", "storeSize", "topic", "queueId", "queueOffset",
                   "storeTimestamp", "tags", "keys", "uniqKey", "body")
UNIT_COLUMNS = ("queueOffset", "commitLogOffset", "size", "tagsCode")


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


def _index_geometry_known(cfg, where) -> None:
    """Index lookups need the IndexFile geometry: without it, one clear error, first."""
    from rmqstore.errors import ConfigError

    why = cfg.undetermined.get("max_hash_slot_num")
    if why:
        raise ConfigError(f"{why}; pass --config with both", where)


@app.command()
@handles_errors
def dump(
    path: Path = typer.Argument(..., help="A store root, a CommitLog segment file, a ConsumeQueue folder or file, an IndexFile, or the checkpoint."),
    fmt: Optional[Format] = FormatOption,
    topic: Optional[str] = typer.Option(None, "--topic", "-t", help="Only messages (or queues) of this topic."),
    queue_id: Optional[int] = typer.Option(None, "--queue-id", "-q", help="Only this queue id."),
    from_offset: Optional[int] = typer.Option(None, "--from-offset", help="Only records at or after this CommitLog offset (queue offset for a ConsumeQueue)."),
    to_offset: Optional[int] = typer.Option(None, "--to-offset", help="Only records before this CommitLog offset (queue offset for a ConsumeQueue)."),
    since: Optional[str] = typer.Option(None, "--since", help="Only messages stored at or after this time (epoch ms or ISO-8601)."),
    until: Optional[str] = typer.Option(None, "--until", help="Only messages stored at or before this time (epoch ms or ISO-8601)."),
    limit: Optional[int] = typer.Option(None, "--limit", "-n", min=0, help="Stop after this many rows."),
    body: Optional[BodyMode] = typer.Option(None, "--body", help="How to print bodies: base64 (JSON default, lossless), text (table default), hex, none."),
    config: Optional[Path] = ConfigOption,
) -> None:
    """Print what a store or store file holds: messages in physical order, ConsumeQueue
    units, IndexFile entries, or the checkpoint. The kind of PATH is recognised from
    where it sits."""
    from rmqstore.reader import classify, open_segment_file, open_store

    from rmqstore.config import load_config

    out = resolve_format(fmt)
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
            rows = reader.message_dicts(_body_mode(body, out), topic=topic, queue_id=queue_id,
                                        from_offset=from_offset, to_offset=to_offset,
                                        since=t_since, until=t_until, limit=limit)
            render.write_rows(rows, out, MESSAGE_COLUMNS, time_columns=("storeTimestamp",))
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
            render.write_rows(_limited(rows, limit), out, UNIT_COLUMNS)
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
            e = f.used_entries
            rows = [{"entry": i + 1, "slot": int(kh) % geometry.hash_slot_num, "keyHash": int(kh),
                     "phyOffset": int(po), "timeDiff": int(td), "prevIndex": int(pv)}
                    for i, (kh, po, td, pv) in enumerate(zip(e["key_hash"], e["phy_offset"],
                                                             e["time_diff"], e["prev_index"]))]
            rows = list(_limited(rows, limit))
        finally:
            f.close()
        if out is Format.table:
            render.write_kv(header, out, title=f"IndexFile {path}",
                            time_keys=("beginTimestamp", "endTimestamp"))
            render.write_rows(rows, out, ("entry", "slot", "keyHash", "phyOffset", "timeDiff", "prevIndex"))
        elif out is Format.jsonl:
            render.write_jsonl(rows)
        else:
            render.write_json({"header": header, "entries": rows})
        return
    if kind.kind == "checkpoint":
        from rmqstore.checkpoint import read_checkpoint

        cp = read_checkpoint(kind.path)
        render.write_kv({"physicMsgTimestamp": cp.physic_msg_timestamp,
                         "logicsMsgTimestamp": cp.logics_msg_timestamp,
                         "indexMsgTimestamp": cp.index_msg_timestamp,
                         "masterFlushedOffset": cp.master_flushed_offset,
                         "confirmPhyOffset": cp.confirm_phy_offset}, out, title="checkpoint",
                        time_keys=("physicMsgTimestamp", "logicsMsgTimestamp", "indexMsgTimestamp"))
        return
    raise fail(f"{path}: cannot dump a {kind.kind}")


@app.command()
@handles_errors
def get(
    store: Path = typer.Argument(..., help="The store root."),
    offset: Optional[int] = typer.Option(None, "--offset", help="CommitLog physical offset of the record."),
    msg_id: Optional[str] = typer.Option(None, "--msg-id", help="offsetMsgId (32 or 56 hex characters)."),
    topic: Optional[str] = typer.Option(None, "--topic", "-t", help="Topic, with --queue-id/--queue-offset or --uniq-key."),
    queue_id: Optional[int] = typer.Option(None, "--queue-id", "-q", help="Queue id, with --topic and --queue-offset."),
    queue_offset: Optional[int] = typer.Option(None, "--queue-offset", help="Queue offset, with --topic and --queue-id."),
    uniq_key: Optional[str] = typer.Option(None, "--uniq-key", help="UNIQ_KEY (client message id), with --topic."),
    fmt: Optional[Format] = FormatOption,
    body: Optional[BodyMode] = typer.Option(None, "--body", help="How to print the body: base64 (JSON default), text (table default), hex, none."),
    config: Optional[Path] = ConfigOption,
) -> None:
    """Print one message, found by offset, offsetMsgId, queue position, or UNIQ_KEY.
    Exit 1 when nothing matches."""
    from rmqstore.reader import open_store
    from rmqstore.view import message_dict

    ways = [offset is not None, msg_id is not None,
            queue_offset is not None or (queue_id is not None and uniq_key is None),
            uniq_key is not None]
    if sum(ways) != 1:
        raise fail("give exactly one of --offset, --msg-id, --topic/--queue-id/--queue-offset, --topic/--uniq-key")
    if (ways[2] or ways[3]) and topic is None:
        raise fail("--topic is required with --queue-offset or --uniq-key")
    if ways[2] and (queue_id is None or queue_offset is None):
        raise fail("--queue-id and --queue-offset go together")
    out = resolve_format(fmt)
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
        mode = _body_mode(body, out)
        rows = [message_dict(m, mode) for m in msgs]
        if out is Format.table:
            for r in rows:
                render.write_kv(r, out, time_keys=("bornTimestamp", "storeTimestamp"))
        elif out is Format.json and len(rows) == 1:
            render.write_json(rows[0])
        else:
            render.write_rows(rows, out, MESSAGE_COLUMNS)


@app.command("query-key")
@handles_errors
def query_key(
    store: Path = typer.Argument(..., help="The store root."),
    topic: str = typer.Option(..., "--topic", "-t", help="Topic the key was sent with."),
    key: str = typer.Option(..., "--key", "-k", help="A KEYS token or a UNIQ_KEY."),
    max_num: Optional[int] = typer.Option(None, "--max-num", min=1, help="Most hits to collect (the broker caps it at maxMsgsNumBatch, 64)."),
    begin: Optional[str] = typer.Option(None, "--begin", help="Earliest store time (epoch ms or ISO-8601)."),
    end: Optional[str] = typer.Option(None, "--end", help="Latest store time (epoch ms or ISO-8601)."),
    fmt: Optional[Format] = FormatOption,
    body: Optional[BodyMode] = typer.Option(None, "--body", help="How to print bodies: base64 (JSON default), text (table default), hex, none."),
    config: Optional[Path] = ConfigOption,
) -> None:
    """Find messages by key through the IndexFiles, walking them as the broker does, then
    keep only records whose KEYS or UNIQ_KEY really equal the key. Exit 1 when none."""
    from rmqstore.reader import open_store

    out = resolve_format(fmt)
    b = parse_time(begin, "--begin")
    e = parse_time(end, "--end")
    with open_store(store, config) as reader:
        _index_geometry_known(reader.config, reader.config.index_dir)
        report_config(reader.config)
        msgs = reader.query_key(topic, key, max_num, 0 if b is None else b,
                                2**63 - 1 if e is None else e)
        render.write_rows(_message_rows(msgs, _body_mode(body, out)), out, MESSAGE_COLUMNS,
                          time_columns=("storeTimestamp",))
    if not msgs:
        raise typer.Exit(1)


@app.command()
@handles_errors
def stats(
    store: Path = typer.Argument(..., help="The store root."),
    fmt: Optional[Format] = FormatOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Per topic/queue message counts, queue offsets, bytes and store times (from the
    CommitLog, next to the ConsumeQueue's own min/max), the CommitLog's extent, the
    IndexFiles and the checkpoint."""
    from rmqstore.reader import open_store
    from rmqstore.stats import store_stats

    out = resolve_format(fmt)
    with open_store(store, config) as reader:
        report_config(reader.config)
        s = store_stats(reader, conf=config)
    if out is Format.json:
        render.write_json(s)
        return
    if out is Format.jsonl:
        render.write_jsonl([s])  # one object, on one line
        return
    cl = s["commitLog"]
    render.write_kv({"store": s["store"], "minOffset": cl["minOffset"], "maxOffset": cl["maxOffset"],
                     "messages": cl["messages"], "bytes": cl["bytes"], "segments": cl["segments"],
                     "segmentSize": cl["segmentSize"], "endReason": cl["endReason"],
                     "abortFile": s["abortFile"]}, out, title="CommitLog")
    render.write_rows(s["queues"], out, ("topic", "queueId", "messages", "bytes", "minQueueOffset",
                                          "maxQueueOffset", "cqMinOffset", "cqMaxOffset",
                                          "firstStoreTime", "lastStoreTime"),
                      title="Queues", time_columns=("firstStoreTime", "lastStoreTime"))
    if s["indexFiles"]:
        render.write_rows(s["indexFiles"], out, ("name", "entries", "hashSlotCount", "beginTimestamp",
                                                  "endTimestamp", "beginPhyOffset", "endPhyOffset"),
                          title="IndexFiles", time_columns=("beginTimestamp", "endTimestamp"))
