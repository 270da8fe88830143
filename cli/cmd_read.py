"""Read-side commands: dump and get. Nothing here writes to a store."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from cli.common import (BodyMode, ConfigOption, app, fail, handles_errors, parse_time,
                        report_config)
from cli.filters import (TIME_HELP, KeyOption, QueueIdOption, SinceOption, TagOption,
                         UniqKeyOption, UntilOption, filter_args, use_tz)
from cli.formats import Format
from cli.output import Output, output_options

# Table columns (JSON and CSV carry every field). A table has no room for a crcOk column
# at 120 characters; a body that fails its CRC is marked in its cell instead.
MESSAGE_COLUMNS = ("commitLogOffset", "storeSize", "topic", "queueId", "queueOffset",
                   "storeTimestamp", "tags", "keys", "uniqKey", "body")
UNIT_COLUMNS = ("queueOffset", "commitLogOffset", "size", "tagsCode")
MESSAGE_KINDS = ("store", "commitlog-segment")
# Tables show KEYS tokens as the property holds them, space-separated (a token has no space).
MESSAGE_CELLS = {"keys": " ".join}
ENTRY_COLUMNS = ("entry", "slot", "keyHash", "phyOffset", "timeDiff", "prevIndex")

# Options the read commands share (body, charset, body files, time zone).
BodyOption = typer.Option(None, "--body", help="How to print bodies: text (table default; a body that is not text in --charset is given as base64, and bodyEncoding says so), base64 (JSON default), hex, none, or raw (the stored bytes as base64, not decompressed). Compressed bodies (sysFlag 0x1 with zlib, lz4 or zstd) are decompressed in every mode but raw.")
CharsetOption = typer.Option("utf-8", "--charset", help="Charset of text bodies for --body text (utf-8, gbk, latin-1, ...).")
BodyDirOption = typer.Option(None, "--body-dir", help="Also write each body (decompressed) to DIR/<offsetMsgId>; --body then defaults to none. Existing files of that name are replaced, links never followed.", file_okay=False)
TzOption = typer.Option(None, "--tz", help="Time zone for times given without one and for printed times: an IANA name (Asia/Shanghai), UTC, local, or +08:00. Default: $RMQSTORE_TZ, else UTC.")


def _body_mode(body: Optional[BodyMode], fmt: Format, body_dir: Optional[Path] = None) -> str:
    if body is not None:
        return body.value
    if body_dir is not None:
        return "none"
    return "text" if fmt is Format.table else "base64"


def _body_options(body, out, charset, body_dir):
    """(mode, charset, sink) from the body options."""
    from rmqstore.view import BodyDir, check_charset

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


def _crc_marked(rows):
    for r in rows:
        if r.get("crcOk") is False:
            r = dict(r, body=f"(body fails its CRC) {r.get('body') or ''}")
        yield r


def _messages(out: Output, rows) -> int:
    from rmqstore.view import MESSAGE_FIELDS

    if out.fmt is Format.table:
        rows = _crc_marked(rows)
    return out.rows(rows, MESSAGE_COLUMNS, fields=MESSAGE_FIELDS, times=("storeTimestamp",),
                    cells=MESSAGE_CELLS)


def _index_geometry_known(cfg, where) -> None:
    """Index lookups need the IndexFile geometry: without it, one clear error, first."""
    from rmqstore.errors import ConfigError

    why = cfg.undetermined.get("max_hash_slot_num")
    if why:
        raise ConfigError(f"{why}; pass --config with both", where)


def _scan_warning(out: Output, path, scan) -> bool:
    """One stderr line when the data ended in damage or bodies failed their CRC; True then."""
    parts = []
    if scan.stop is not None and scan.stop.damaged:
        parts.append(f"dump stopped early at {scan.stop.describe()}; nothing after it was "
                     f"read (rmqstore verify says more)")
    for d in getattr(scan, "damage", ())[:3]:  # damage the scan passed over (DLedger)
        parts.append(f"skipped {d.describe()}")
    if len(getattr(scan, "damage", ())) > 3:
        parts.append(f"and {len(scan.damage) - 3} more damaged record(s) skipped")
    for off, why in getattr(scan, "unwrap_problems", ())[:3]:
        parts.append(f"the inner batch at offset {off} was given as one record ({why})")
    if scan.bad_crc:
        parts.append(f"{scan.bad_crc} message(s) printed with crcOk false (body does not "
                     "match its CRC)")
    if parts:
        damaged_here = scan.stop is not None and scan.stop.damaged and scan.stop.path
        out.warn("warning: " + ("" if damaged_here else f"{path}: ") + "; ".join(parts))
    return bool(parts)


@app.command()
@handles_errors
@output_options
def dump(
    paths: List[Path] = typer.Argument(..., help="Store roots or CommitLog segment files (several are read in turn), or a ConsumeQueue folder or file, an IndexFile, or the checkpoint. The kind of each PATH is recognised from where it sits."),
    topic: Optional[List[str]] = typer.Option(None, "--topic", "-t", help="Only messages (or queues) of this topic; repeat for several."),
    queue_id: Optional[List[int]] = QueueIdOption,
    tag: Optional[List[str]] = TagOption,
    key: Optional[List[str]] = KeyOption,
    uniq_key: Optional[List[str]] = UniqKeyOption,
    from_offset: Optional[int] = typer.Option(None, "--from-offset", min=0, help="Only records at or after this CommitLog offset (queue offset for a ConsumeQueue)."),
    to_offset: Optional[int] = typer.Option(None, "--to-offset", min=0, help="Only records before this CommitLog offset (queue offset for a ConsumeQueue)."),
    since: Optional[str] = SinceOption,
    until: Optional[str] = UntilOption,
    max_bytes: Optional[int] = typer.Option(None, "--max-bytes", min=0, help="Read at most this many CommitLog bytes from where the dump starts, per store (a record counts whole)."),
    limit: Optional[int] = typer.Option(None, "--limit", "-n", min=0, help="Stop after this many rows (over all PATHs)."),
    records: bool = typer.Option(False, "--records", help="One row per CommitLog record: an inner-batch record of a RocketMQ 5.x BatchCQ topic is given as stored, not as the messages its body holds (the default gives one row per message, with innerBatch {index, count, entrySize})."),
    follow: bool = typer.Option(False, "--follow", "-F", help="Keep reading as the store grows (read-only; never takes the lock; survives segment rolls). Starts at the end unless --from-offset or --since says where. Ctrl-C ends it."),
    body: Optional[BodyMode] = BodyOption,
    charset: str = CharsetOption,
    body_dir: Optional[Path] = BodyDirOption,
    tz: Optional[str] = TzOption,
    config: Optional[Path] = ConfigOption,
    *, out: Output,
) -> None:
    """Print what a store or store file holds: messages in physical order, ConsumeQueue
    units, IndexFile entries, or the checkpoint.

    Exit 1 when a message dump ends in damage (a torn or garbled record, a missing
    segment) or printed a message whose body fails its CRC (crcOk false); everything
    readable is still printed, and one warning line on stderr says where."""
    from rmqstore.files.config import load_config
    from rmqstore.reader import classify

    use_tz(tz)
    kinds = [classify(p) for p in paths]
    filters = filter_args(topic=topic, queue_id=queue_id, tag=tag, key=key, uniq_key=uniq_key,
                          since=since, until=until, from_offset=from_offset,
                          to_offset=to_offset, max_bytes=max_bytes)
    mode, charset, sink = _body_options(body, out.fmt, charset, body_dir)
    # A file inside a store is read with the store's settings, checked like the store's.
    cfgs = {}
    for p, k in zip(paths, kinds):
        if k.root is not None and k.kind != "store":
            cfgs[p] = cfg = load_config(k.root, config)
            if k.kind == "indexfile":
                _index_geometry_known(cfg, k.path)
            report_config(cfg)
    if follow:
        if len(paths) != 1 or kinds[0].kind != "store":
            raise fail("--follow needs exactly one store root")
        if out.fmt is Format.json:
            raise fail("--follow streams rows: use --format jsonl or table")
        _follow(paths[0], config, filters, limit, out, mode, charset, sink)
        return
    if all(k.kind in MESSAGE_KINDS for k in kinds):
        damaged = _dump_messages(list(zip(paths, kinds)), config, filters, limit, out, mode,
                                 charset, sink, unwrap=not records)
        if damaged:
            raise typer.Exit(1)
        return
    damaged = False
    for p, k in zip(paths, kinds):
        if k.kind in MESSAGE_KINDS:
            damaged |= _dump_messages([(p, k)], config, filters, limit, out, mode, charset, sink,
                                      unwrap=not records)
        else:
            _dump_file(p, k, cfgs.get(p), config, from_offset, to_offset, limit, out)
    if damaged:
        raise typer.Exit(1)


def _open(path, kind, config):
    from rmqstore.reader import open_segment_file, open_store

    return open_store(path, config) if kind.kind == "store" else open_segment_file(path, config)


def _dump_messages(targets, config, filters, limit, out, mode, charset, sink, *,
                   unwrap: bool = True) -> bool:
    """Messages of every target, streamed as one list of rows; True when one ended in damage."""
    from rmqstore.selection import MessageFilter

    state = {"left": limit, "damaged": False}

    def rows():
        for path, kind in targets:
            if state["left"] == 0:
                return
            with _open(path, kind, config) as reader:
                if kind.kind == "store":
                    report_config(reader.config)
                scan = reader.scan(MessageFilter.make(**filters, limit=state["left"]), unwrap=unwrap)
                extra = {"store": str(path)} if len(targets) > 1 else None
                if out.fmt is Format.jsonl and sink is None:
                    # Lines rendered a block at a time, the same text write_jsonl makes.
                    yield from scan.json_lines(mode, charset=charset, extra=extra)
                else:
                    for d in scan.dicts(mode, charset=charset, sink=sink):
                        yield {**d, **extra} if extra else d
                state["damaged"] |= _scan_warning(out, path, scan)
                if state["left"] is not None:
                    state["left"] -= scan.given

    _messages(out, rows())
    return state["damaged"]


def _follow(path, config, filters, limit, out, mode, charset, sink) -> None:
    from rmqstore.reader import open_store
    from rmqstore.selection import MessageFilter, unwrap_message
    from rmqstore.view import message_dict

    with open_store(path, config) as reader:
        report_config(reader.config)
        follower_filter = MessageFilter.make(**filters, limit=limit)
        follower = reader.follow(follower_filter)
        warned = [None]
        out.pause()  # a follow never ends: no pager, rows go straight to the terminal

        def rows():
            for m in follower:
                for x in unwrap_message(m, follower_filter):  # inner batches as messages
                    yield message_dict(x, mode, charset=charset, sink=sink)
                out.flush()  # the row just written must not wait while the store is idle
                if follower.stalled is not None and follower.stalled != warned[0]:
                    warned[0] = follower.stalled
                    out.warn(f"warning: {path}: waiting at {follower.stalled.describe()}")

        try:
            _messages(out, rows())
        except KeyboardInterrupt:
            raise typer.Exit(0) from None  # Ctrl-C is how a follow ends


def _dump_file(path, kind, cfg, config, from_offset, to_offset, limit, out: Output) -> None:
    """A ConsumeQueue, an IndexFile or the checkpoint (``cfg``: the settings of the store
    the file sits in, when it sits in one)."""
    from rmqstore.files.config import load_config

    if kind.kind in ("consumequeue-dir", "consumequeue-file"):
        from rmqstore.files.consumequeue import ConsumeQueue
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
        from rmqstore.files.index import IndexFile, infer_index_geometry

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
        from rmqstore.files.checkpoint import read_checkpoint

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
    queue_id: Optional[int] = typer.Option(None, "--queue-id", "-q", help="Queue id, with --topic and --queue-offset (default 0 for an %LMQ% topic)."),
    queue_offset: Optional[int] = typer.Option(None, "--queue-offset", help="Queue offset, with --topic and --queue-id."),
    uniq_key: Optional[str] = typer.Option(None, "--uniq-key", help="UNIQ_KEY (client message id), with --topic."),
    body: Optional[BodyMode] = BodyOption,
    charset: str = CharsetOption,
    body_dir: Optional[Path] = BodyDirOption,
    tz: Optional[str] = TzOption,
    config: Optional[Path] = ConfigOption,
    *, out: Output,
) -> None:
    """Print one message, found by offset, offsetMsgId, queue position, or UNIQ_KEY
    (-f json: an object; with --uniq-key, an array of every message with that UNIQ_KEY).
    Exit 1 when nothing matches."""
    from rmqstore.reader import open_store
    from rmqstore.view import MESSAGE_FIELDS, message_dict

    use_tz(tz)

    ways = [offset is not None, msg_id is not None,
            queue_offset is not None or (queue_id is not None and uniq_key is None),
            uniq_key is not None]
    if sum(ways) != 1:
        raise fail("give exactly one of --offset, --msg-id, --topic/--queue-id/--queue-offset, --topic/--uniq-key")
    if (ways[2] or ways[3]) and topic is None:
        raise fail("--topic is required with --queue-offset or --uniq-key")
    if ways[2] and queue_id is None and topic is not None and topic.startswith("%LMQ%"):
        queue_id = 0  # an LMQ queue is always queue 0 (enableLmq, design-14 §5.2)
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
        mode, charset, sink = _body_options(body, out.fmt, charset, body_dir)
        rows = [message_dict(m, mode, charset=charset, sink=sink) for m in msgs]
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
    max_num: Optional[int] = typer.Option(None, "--max-num", min=1, help="Print at most this many (the newest). Default: every match."),
    broker_cap: bool = typer.Option(False, "--broker-cap", help="Answer as the broker (and mqadmin queryMsgByKey) would: the IndexFile walk stops after maxMsgsNumBatch index hits (64, or broker.conf's), hash collisions included."),
    begin: Optional[str] = typer.Option(None, "--begin", help=f"Earliest store time: {TIME_HELP}."),
    end: Optional[str] = typer.Option(None, "--end", help=f"Latest store time: {TIME_HELP}."),
    body: Optional[BodyMode] = BodyOption,
    charset: str = CharsetOption,
    body_dir: Optional[Path] = BodyDirOption,
    tz: Optional[str] = TzOption,
    config: Optional[Path] = ConfigOption,
    *, out: Output,
) -> None:
    """Find messages by key through the IndexFiles, walking them as the broker does, then
    keep only records whose KEYS or UNIQ_KEY really equal the key. Every match is printed
    unless --max-num or --broker-cap limits it; a limited answer says so on stderr.
    Exit 1 when none ("no message matches")."""
    from rmqstore.reader import open_store

    use_tz(tz)
    b = parse_time(begin, "--begin")
    e = parse_time(end, "--end")
    mode, charset, sink = _body_options(body, out.fmt, charset, body_dir)
    with open_store(store, config) as reader:
        _index_geometry_known(reader.config, reader.config.index_dir)
        report_config(reader.config)
        msgs = reader.query_key(topic, key, max_num, b, e, broker_cap=broker_cap)
        if not msgs:
            raise fail("no message matches", 1)
        _messages(out, _message_rows(msgs, mode, charset, sink))
    if msgs.truncated:
        why = (f"the broker's cap (maxMsgsNumBatch={msgs.broker_cap})" if msgs.broker_cap
               else f"--max-num {max_num}")
        out.warn(f"note: {len(msgs)} shown, more messages match; limited by {why}")


QUEUE_COLUMNS = ("topic", "queueId", "messages", "bytes", "minQueueOffset", "maxQueueOffset",
                 "cqMinOffset", "cqMaxOffset", "firstStoreTime", "lastStoreTime")
INDEX_COLUMNS = ("name", "entries", "hashSlotCount", "beginTimestamp", "endTimestamp",
                 "beginPhyOffset", "endPhyOffset")


@app.command()
@handles_errors
@output_options
def stats(
    store: Path = typer.Argument(..., help="The store root."),
    tz: Optional[str] = TzOption,
    config: Optional[Path] = ConfigOption,
    *, out: Output,
) -> None:
    """Per topic/queue message counts, queue offsets, bytes and store times (from the
    CommitLog, next to the ConsumeQueue's own min/max), the CommitLog's extent, the
    IndexFiles and the checkpoint. jsonl, csv and tsv: one row per queue; json: all of it."""
    from rmqstore.reader import open_store
    from rmqstore.stats import store_stats

    use_tz(tz)
    with open_store(store, config) as reader:
        report_config(reader.config)
        s = store_stats(reader, conf=config)
    cl = s["commitLog"]
    out.document(s)
    out.record({"store": s["store"], "minOffset": cl["minOffset"], "maxOffset": cl["maxOffset"],
                "messages": cl["messages"], "bytes": cl["bytes"], "segments": cl["segments"],
                "segmentSize": cl["segmentSize"], "endReason": cl["endReason"],
                "abortFile": s["abortFile"]}, title="CommitLog", items=False)
    k = s["storeKind"]
    out.record({"log": k["log"], "family": k["family"], "features": " ".join(k["features"]) or "-"},
               title="Store kind", items=False)
    if "dledger" in s:
        out.record({n: v for n, v in s["dledger"].items() if n not in ("problems", "recordsSkipped")},
                   title="DLedger", items=False)
    out.rows(s["queues"], QUEUE_COLUMNS, title="Queues", times=("firstStoreTime", "lastStoreTime"))
    if s["indexFiles"]:
        out.rows(s["indexFiles"], INDEX_COLUMNS, title="IndexFiles", items=False,
                 times=("beginTimestamp", "endTimestamp"))
