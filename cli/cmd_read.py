"""Read-side commands: dump and get. Nothing here writes to a store."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from cli.common import (BodyMode, ConfigOption, Format, FormatOption, app, fail,
                        handles_errors, parse_time, resolve_format)
from cli import render

MESSAGE_COLUMNS = ("commitLogOffset", "storeSize", "topic", "queueId", "queueOffset",
                   "storeTimestamp", "tags", "keys", "uniqKey", "crcOk", "body")
UNIT_COLUMNS = ("queueOffset", "commitLogOffset", "size", "tagsCode")
MESSAGE_KINDS = ("store", "commitlog-segment")

# Options the read commands share (body, charset, body files, time zone).
BodyOption = typer.Option(None, "--body", help="How to print bodies: text (table default; a body that is not text in --charset is given as base64, and bodyEncoding says so), base64 (JSON default), hex, none, or raw (the stored bytes as base64, not decompressed). Compressed bodies (sysFlag 0x1 with zlib, lz4 or zstd) are decompressed in every mode but raw.")
CharsetOption = typer.Option("utf-8", "--charset", help="Charset of text bodies for --body text (utf-8, gbk, latin-1, ...).")
BodyDirOption = typer.Option(None, "--body-dir", help="Also write each body (decompressed) to DIR/<offsetMsgId>; --body then defaults to none. Existing files of that name are replaced, links never followed.", file_okay=False)
TzOption = typer.Option(None, "--tz", help="Time zone for times given without one and for printed times: an IANA name (Asia/Shanghai), UTC, local, or +08:00. Default: $RMQSTORE_TZ, else UTC.")
TIME_HELP = "epoch seconds or milliseconds (told apart by magnitude), ISO-8601, or yyyy-MM-dd#HH:mm:ss:SSS"


def _use_tz(tz: Optional[str]) -> None:
    from rmqstore.errors import InputError
    from rmqstore.times import set_default_tz

    try:
        set_default_tz(tz)  # None: back to $RMQSTORE_TZ / UTC
    except InputError as e:
        raise fail(f"--tz: {e}") from None


def _body_mode(body: Optional[BodyMode], fmt: Format, body_dir: Optional[Path] = None) -> str:
    if body is not None:
        return body.value
    if body_dir is not None:
        return "none"
    return "text" if fmt is Format.table else "base64"


def _body_options(body, out, charset, body_dir):
    """(mode, charset, sink) from the body options."""
    from rmqstore.bodies import BodyDir, check_charset

    return _body_mode(body, out, body_dir), check_charset(charset), \
        BodyDir(body_dir) if body_dir is not None else None


def _message_rows(messages, body: str, charset: str = "utf-8", sink=None):
    from rmqstore.view import message_dict

    for m in messages:
        yield message_dict(m, body, charset=charset, sink=sink)


def _limited(rows, limit):
    for i, row in enumerate(rows):
        if limit is not None and i >= limit:
            return
        yield row


def _flushing(rows):
    """Flush stdout after each row is written (a follower's rows must not wait in a buffer)."""
    for row in rows:
        yield row
        sys.stdout.flush()


def _warn(message: str) -> None:
    typer.echo(f"rmqstore: warning: {message}", err=True)


def _scan_warning(path, scan) -> bool:
    """One stderr line when the data ended in damage or bodies failed their CRC; True then."""
    parts = []
    if scan.stop is not None and scan.stop.damaged:
        parts.append(f"dump stopped early at {scan.stop.describe()}; nothing after it was "
                     f"read (rmqstore verify says more)")
    if scan.bad_crc:
        parts.append(f"{scan.bad_crc} message(s) printed with crcOk false (body does not "
                     "match its CRC)")
    if parts:
        damaged_here = scan.stop is not None and scan.stop.damaged and scan.stop.path
        _warn(("" if damaged_here else f"{path}: ") + "; ".join(parts))
    return bool(parts)


@app.command()
@handles_errors
def dump(
    paths: List[Path] = typer.Argument(..., help="Store roots or CommitLog segment files (several are read in turn), or a ConsumeQueue folder or file, an IndexFile, or the checkpoint. The kind of each PATH is recognised from where it sits."),
    fmt: Optional[Format] = FormatOption,
    topic: Optional[List[str]] = typer.Option(None, "--topic", "-t", help="Only messages (or queues) of this topic; repeat for several."),
    queue_id: Optional[List[int]] = typer.Option(None, "--queue-id", "-q", help="Only this queue id; repeat for several."),
    tag: Optional[List[str]] = typer.Option(None, "--tag", help="Only messages whose TAGS is this tag ('TagA || TagB' for either, '*' for all); repeat for several."),
    key: Optional[List[str]] = typer.Option(None, "--key", "-k", help="Only messages with this KEYS token; repeat for several."),
    uniq_key: Optional[List[str]] = typer.Option(None, "--uniq-key", help="Only messages with this UNIQ_KEY (client message id); repeat for several."),
    from_offset: Optional[int] = typer.Option(None, "--from-offset", min=0, help="Only records at or after this CommitLog offset (queue offset for a ConsumeQueue)."),
    to_offset: Optional[int] = typer.Option(None, "--to-offset", min=0, help="Only records before this CommitLog offset (queue offset for a ConsumeQueue)."),
    since: Optional[str] = typer.Option(None, "--since", help=f"Only messages stored at or after this time: {TIME_HELP}."),
    until: Optional[str] = typer.Option(None, "--until", help=f"Only messages stored at or before this time: {TIME_HELP}."),
    max_bytes: Optional[int] = typer.Option(None, "--max-bytes", min=0, help="Read at most this many CommitLog bytes from where the dump starts, per store (a record counts whole)."),
    limit: Optional[int] = typer.Option(None, "--limit", "-n", min=0, help="Stop after this many rows (over all PATHs)."),
    follow: bool = typer.Option(False, "--follow", "-F", help="Keep reading as the store grows (read-only; never takes the lock; survives segment rolls). Starts at the end unless --from-offset or --since says where. Ctrl-C ends it."),
    body: Optional[BodyMode] = BodyOption,
    charset: str = CharsetOption,
    body_dir: Optional[Path] = BodyDirOption,
    tz: Optional[str] = TzOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Print what a store or store file holds: messages in physical order, ConsumeQueue
    units, IndexFile entries, or the checkpoint.

    Exit 1 when a message dump ends in damage (a torn or garbled record, a missing
    segment) or printed a message whose body fails its CRC (crcOk false); everything
    readable is still printed, and one warning line on stderr says where."""
    from rmqstore.reader import classify

    _use_tz(tz)
    out = resolve_format(fmt)
    kinds = [classify(p) for p in paths]
    t_since, t_until = parse_time(since, "--since"), parse_time(until, "--until")
    mode, charset, sink = _body_options(body, out, charset, body_dir)
    filters = dict(topic=topic or None, queue_id=queue_id or None, tag=tag or None,
                   key=key or None, uniq_key=uniq_key or None, since=t_since, until=t_until,
                   from_offset=from_offset, to_offset=to_offset, max_bytes=max_bytes)
    if follow:
        if len(paths) != 1 or kinds[0].kind != "store":
            raise fail("--follow needs exactly one store root")
        if out is Format.json:
            raise fail("--follow streams rows: use --format jsonl or table")
        _follow(paths[0], config, filters, limit, out, mode, charset, sink)
        return
    if all(k.kind in MESSAGE_KINDS for k in kinds):
        damaged = _dump_messages(list(zip(paths, kinds)), config, filters, limit, out, mode,
                                 charset, sink)
        if damaged:
            raise typer.Exit(1)
        return
    damaged = False
    for p, k in zip(paths, kinds):
        if k.kind in MESSAGE_KINDS:
            damaged |= _dump_messages([(p, k)], config, filters, limit, out, mode, charset, sink)
        else:
            _dump_file(p, k, config, from_offset, to_offset, limit, out)
    if damaged:
        raise typer.Exit(1)


def _open(path, kind, config):
    from rmqstore.reader import open_segment_file, open_store

    return open_store(path, config) if kind.kind == "store" else open_segment_file(path, config)


def _dump_messages(targets, config, filters, limit, out, mode, charset, sink) -> bool:
    """Messages of every target, streamed as one list of rows; True when one ended in damage."""
    from rmqstore.selection import MessageFilter

    state = {"left": limit, "damaged": False}

    def rows():
        for path, kind in targets:
            if state["left"] == 0:
                return
            with _open(path, kind, config) as reader:
                scan = reader.scan(MessageFilter.make(**filters, limit=state["left"]))
                for d in scan.dicts(mode, charset=charset, sink=sink):
                    if len(targets) > 1:
                        d["store"] = str(path)
                    yield d
                state["damaged"] |= _scan_warning(path, scan)
                if state["left"] is not None:
                    state["left"] -= scan.given

    render.write_rows(rows(), out, MESSAGE_COLUMNS, time_columns=("storeTimestamp",))
    return state["damaged"]


def _follow(path, config, filters, limit, out, mode, charset, sink) -> None:
    from rmqstore.reader import open_store
    from rmqstore.selection import MessageFilter
    from rmqstore.view import message_dict

    with open_store(path, config) as reader:
        follower = reader.follow(MessageFilter.make(**filters, limit=limit))
        warned = [None]

        def rows():
            for m in follower:
                yield message_dict(m, mode, charset=charset, sink=sink)
                if follower.stalled is not None and follower.stalled != warned[0]:
                    warned[0] = follower.stalled
                    _warn(f"{path}: waiting at {follower.stalled.describe()}")

        # Until the shared output layer streams tables, a follower prints JSON Lines.
        try:
            render.write_rows(_flushing(rows()), Format.jsonl if out is Format.table else out,
                              MESSAGE_COLUMNS, time_columns=("storeTimestamp",))
        except KeyboardInterrupt:
            raise typer.Exit(0) from None  # Ctrl-C is how a follow ends


def _dump_file(path, kind, config, from_offset, to_offset, limit, out) -> None:
    """A ConsumeQueue, an IndexFile or the checkpoint."""
    if kind.kind in ("consumequeue-dir", "consumequeue-file"):
        from rmqstore.consumequeue import ConsumeQueue
        from rmqstore.config import load_config
        from rmqstore.view import unit_dict

        cfg = load_config(kind.root, config)
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
        from rmqstore.config import load_config

        cfg = load_config(kind.root, config)
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
    body: Optional[BodyMode] = BodyOption,
    charset: str = CharsetOption,
    body_dir: Optional[Path] = BodyDirOption,
    tz: Optional[str] = TzOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Print one message, found by offset, offsetMsgId, queue position, or UNIQ_KEY
    (every message with that UNIQ_KEY). Exit 1 when nothing matches."""
    from rmqstore.reader import open_store
    from rmqstore.view import message_dict

    _use_tz(tz)

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
        mode, charset, sink = _body_options(body, out, charset, body_dir)
        rows = [message_dict(m, mode, charset=charset, sink=sink) for m in msgs]
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
    max_num: Optional[int] = typer.Option(None, "--max-num", min=1, help="Print at most this many (the newest). Default: every match."),
    broker_cap: bool = typer.Option(False, "--broker-cap", help="Answer as the broker (and mqadmin queryMsgByKey) would: the IndexFile walk stops after maxMsgsNumBatch index hits (64, or broker.conf's), hash collisions included."),
    begin: Optional[str] = typer.Option(None, "--begin", help=f"Earliest store time: {TIME_HELP}."),
    end: Optional[str] = typer.Option(None, "--end", help=f"Latest store time: {TIME_HELP}."),
    fmt: Optional[Format] = FormatOption,
    body: Optional[BodyMode] = BodyOption,
    charset: str = CharsetOption,
    body_dir: Optional[Path] = BodyDirOption,
    tz: Optional[str] = TzOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Find messages by key through the IndexFiles, walking them as the broker does, then
    keep only records whose KEYS or UNIQ_KEY really equal the key. Every match is printed
    unless --max-num or --broker-cap limits it; a limited answer says so on stderr.
    Exit 1 when none ("no message matches")."""
    from rmqstore.reader import open_store

    _use_tz(tz)
    out = resolve_format(fmt)
    b = parse_time(begin, "--begin")
    e = parse_time(end, "--end")
    mode, charset, sink = _body_options(body, out, charset, body_dir)
    with open_store(store, config) as reader:
        msgs = reader.query_key(topic, key, max_num, b, e, broker_cap=broker_cap)
        if not msgs:
            raise fail("no message matches", 1)
        render.write_rows(_message_rows(msgs, mode, charset, sink), out, MESSAGE_COLUMNS,
                          time_columns=("storeTimestamp",))
    if msgs.truncated:
        why = (f"the broker's cap (maxMsgsNumBatch={msgs.broker_cap})" if msgs.broker_cap
               else f"--max-num {max_num}")
        typer.echo(f"rmqstore: note: {len(msgs)} shown, more messages match; limited by {why}",
                   err=True)


@app.command()
@handles_errors
def stats(
    store: Path = typer.Argument(..., help="The store root."),
    fmt: Optional[Format] = FormatOption,
    tz: Optional[str] = TzOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Per topic/queue message counts, queue offsets, bytes and store times (from the
    CommitLog, next to the ConsumeQueue's own min/max), the CommitLog's extent, the
    IndexFiles and the checkpoint."""
    from rmqstore.reader import open_store
    from rmqstore.stats import store_stats

    _use_tz(tz)
    out = resolve_format(fmt)
    with open_store(store, config) as reader:
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
