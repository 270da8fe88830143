"""``rmqstore append``: write messages into a store, as the broker's store would."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from cli.common import ConfigOption, app, fail, handles_errors, report_config
from cli.output import Output, output_options

RESULT_FIELDS = ("status", "commitLogOffset", "storeSize", "queueOffset", "offsetMsgId", "reason")


class _BadLine(Exception):
    pass


def _lines(source: str):
    """(line number, text) of a JSONL file or stdin, blank lines skipped."""
    f = sys.stdin if source == "-" else open(source, encoding="utf-8", errors="surrogateescape")
    try:
        for n, line in enumerate(f, 1):
            if line.strip():
                yield n, line
    finally:
        if f is not sys.stdin:
            f.close()


def _flag_message(topic, body, body_file, tags, keys, queue_id, props, flag) -> dict:
    if body is not None and body_file is not None:
        raise fail("give --body or --body-file, not both")
    obj: dict = {"topic": topic, "queueId": queue_id, "flag": flag}
    if body_file is not None:
        import base64
        obj["bodyBase64"] = base64.b64encode(Path(body_file).read_bytes()).decode("ascii")
    else:
        obj["body"] = body or ""
    properties: dict = {}
    if tags is not None:
        properties["TAGS"] = tags
    if keys is not None:
        properties["KEYS"] = keys
    for p in props:
        name, sep, value = p.partition("=")
        if not sep or not name:
            raise fail(f"--property expects NAME=VALUE, got {p!r}")
        properties[name] = value
    obj["properties"] = properties
    return obj


@app.command()
@handles_errors
@output_options(pager=False)
def append(
    store: Path = typer.Argument(..., help="Store root to append to."),
    jsonl: Optional[str] = typer.Option(None, "--jsonl", help="Append one message per line of this JSON Lines file ('-' for stdin), in the message JSON of `rmqstore dump`."),
    topic: Optional[str] = typer.Option(None, "--topic", "-t", help="Topic of a single message given by flags."),
    body: Optional[str] = typer.Option(None, "--body", help="Body text of the single message."),
    body_file: Optional[Path] = typer.Option(None, "--body-file", help="Read the single message's body from this file (bytes as they are)."),
    tags: Optional[str] = typer.Option(None, "--tags", help="TAGS property."),
    keys: Optional[str] = typer.Option(None, "--keys", help="KEYS property (space-separated keys)."),
    queue_id: int = typer.Option(0, "--queue-id", "-q", help="Queue id."),
    prop: List[str] = typer.Option([], "--property", "-p", help="Extra property NAME=VALUE (repeatable; written in the order given)."),
    flag: int = typer.Option(0, "--flag", help="The message's flag integer."),
    as_broker: bool = typer.Option(False, "--as-broker", help="Do what a broker does to an incoming message: add UNIQ_KEY if absent, CLUSTER, rewrite delay levels into SCHEDULE_TOPIC_XXXX, set store host and time."),
    create: bool = typer.Option(False, "--create", help="Create the store if it does not exist (geometry from the options below or --config)."),
    config: Optional[Path] = ConfigOption,
    commitlog_size: Optional[int] = typer.Option(None, "--commitlog-size", help="mappedFileSizeCommitLog for a new store (default 1 GiB)."),
    cq_size: Optional[int] = typer.Option(None, "--cq-size", help="mappedFileSizeConsumeQueue for a new store (default 6000000)."),
    index_slots: Optional[int] = typer.Option(None, "--index-slots", help="maxHashSlotNum (default 5000000)."),
    index_num: Optional[int] = typer.Option(None, "--index-num", help="maxIndexNum (default 20000000)."),
    broker_version: Optional[str] = typer.Option(None, "--broker-version", help="On-disk conventions to follow: 4.9 or 5. Default: what the store's files show (append refuses when they cannot tell); 4.9 for a new store."),
    flush_disk_type: Optional[str] = typer.Option(None, "--flush-disk-type", help="ASYNC_FLUSH (default) or SYNC_FLUSH (each message acknowledged once on disk)."),
    *, out: Output,
) -> None:
    """Append messages to a store, byte for byte as RocketMQ's store writes them, building
    the ConsumeQueue and IndexFile entries as the broker's dispatch does.

    One message from flags (--topic, --body ...), or many from --jsonl: one JSON object
    per line with the keys `rmqstore dump --format jsonl` prints (topic, queueId, flag,
    sysFlag, bornTimestamp, bornHost, storeTimestamp, storeHost, reconsumeTimes,
    preparedTransactionOffset, properties, propertiesText, body + bodyEncoding or
    bodyBase64; offsets and ids are ignored: the store assigns them). Messages are
    written exactly as given unless --as-broker. Absent times are now; absent hosts are
    127.0.0.1:0 and brokerIP1:listenPort.

    RocketMQ 5.x stores (--broker-version 5): a line with "batch": [{flag, body or
    bodyBase64, properties or propertiesText}, ...] instead of a body is an inner batch
    for a BatchCQ topic (config/topics.json queue.type=BatchCQ, or
    batchconsumequeue/TOPIC/): one record whose body holds the entries, sysFlag 0x40|0x80,
    INNER_NUM the count; the store adds INNER_BASE and writes BatchConsumeQueue units. With
    LMQ (consumequeue/%LMQ%*, or enableLmq in --config) a message's INNER_MULTI_DISPATCH
    gets INNER_MULTI_QUEUE_OFFSET and %LMQ% queue units. Queue kinds that the files and
    config/topics.json disagree on refuse the store (exit 2).

    Prints one row per message as it is appended: status, commitLogOffset, storeSize,
    queueOffset, offsetMsgId (and reason when not PUT_OK). Each input line is checked before it is appended: a malformed line
    stops the command with "FILE:LINE: why" (exit 2); the lines before it stay appended.
    Exit 0 when every message is PUT_OK, 1 when some are not, 2 on bad usage or input.
    """
    from rmqstore.engine.append import now_ms
    from rmqstore.engine.broker import message_from_json, put_as_broker
    from rmqstore.files.config import load_config
    from rmqstore.errors import InputError
    from rmqstore.engine.store import MessageStore

    if (jsonl is None) == (topic is None):
        raise fail("give either --jsonl FILE or --topic (with --body/--body-file) for one message")
    if not create and not store.is_dir():
        raise fail(f"{store}: no such store (add --create to make one)")
    overrides = {"mapped_file_size_commit_log": commitlog_size,
                 "mapped_file_size_consume_queue": cq_size, "max_hash_slot_num": index_slots,
                 "max_index_num": index_num, "broker_version": broker_version,
                 "flush_disk_type": flush_disk_type}
    cfg = load_config(store, config, overrides)
    if store.is_dir():
        from rmqstore.files.storekind import require_writable

        require_writable(cfg, "append")
    report_config(cfg)
    if jsonl is None:
        items = [(None, _flag_message(topic, body, body_file, tags, keys, queue_id, prop, flag))]
        source = "<flags>"
    else:
        items = _lines(jsonl)
        source = "<stdin>" if jsonl == "-" else jsonl
    failed = []

    def results(st):
        for lineno, item in items:
            try:
                obj = json.loads(item) if isinstance(item, str) else item
                now = now_ms()
                msg = message_from_json(obj, cfg, now=now)
            except (ValueError, InputError) as e:
                why = e.message if isinstance(e, InputError) else f"not valid JSON: {e}"
                where = f"{source}:{lineno}" if lineno is not None else source
                raise fail(f"{where}: {why}") from None
            r = put_as_broker(st, msg, cfg, now=now) if as_broker else st.put(msg)
            if not r.ok:
                failed.append(r)
            row = {"status": r.status.value, "commitLogOffset": r.offset, "storeSize": r.size,
                   "queueOffset": r.queue_offset, "offsetMsgId": r.msg_id}
            if r.reason:
                row["reason"] = r.reason
            yield row

    with MessageStore.open(store, cfg, create=create) as st:
        out.rows(results(st), RESULT_FIELDS, fields=RESULT_FIELDS)
    if failed:
        raise typer.Exit(1)
