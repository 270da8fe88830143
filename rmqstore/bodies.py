"""Message bodies as people read them: decompressed by their SYSFLAG, then printed in a
chosen form, or written to a file named by the record's offsetMsgId.

Compression (spec §3.3): bit ``0x1`` (COMPRESSED_FLAG) says the body is compressed; bits
8-10 (``0x700``) name the codec, 0 or 3 zlib (0: records from before 4.9.4), 1 LZ4 (frame
format), 2 ZSTD. The codec bits count only with bit 0x1 set. A body that cannot be
decompressed is shown as stored, with a note; nothing here raises on disk data.

Body modes: ``text`` (decoded in a charset; a body that is not valid text in it is given
as base64 instead, and ``bodyEncoding`` says so), ``base64``, ``hex``, ``none``, and ``raw``
(the stored bytes, not decompressed, as base64: what BODYCRC covers).
"""

from __future__ import annotations

import base64
import codecs
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

from . import layout as L
from .errors import InputError, StoreIOError

BODY_MODES = ("text", "base64", "hex", "none", "raw")
COMPRESSION_TYPES = {0: "zlib", 1: "lz4", 2: "zstd", 3: "zlib"}
#: Most bytes one body may decompress to; a larger result is shown as stored, with a note.
#: Bodies are at most maxMessageSize (4 MiB by default) compressed, and producers compress
#: text, so 256 MiB leaves room while a crafted bomb cannot exhaust memory.
MAX_DECOMPRESSED = 256 * 1024 * 1024


def compression_of(sys_flag: int) -> str | None:
    """The codec the SYSFLAG names (``zlib``, ``lz4``, ``zstd``, ``unknown-N``), or None
    when the body is not compressed."""
    if not sys_flag & L.SYSFLAG_COMPRESSED:
        return None
    kind = (sys_flag & L.SYSFLAG_COMPRESSION_TYPE_MASK) >> 8
    return COMPRESSION_TYPES.get(kind, f"unknown-{kind}")


def _zlib(data: bytes) -> bytes:
    d = zlib.decompressobj()
    out = d.decompress(data, MAX_DECOMPRESSED + 1)
    if len(out) > MAX_DECOMPRESSED:
        raise _TooLarge
    if not d.eof:
        raise ValueError("truncated zlib stream")
    return out


def _zstd(data: bytes) -> bytes:
    try:
        import zstandard
    except ImportError:
        raise _Missing("zstandard") from None
    import io

    # zstd-jni streams may not record the content size: read the frame as a stream.
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as r:
        out = r.read(MAX_DECOMPRESSED + 1)
    if len(out) > MAX_DECOMPRESSED:
        raise _TooLarge
    return out


def _lz4(data: bytes) -> bytes:
    try:
        import lz4.frame
    except ImportError:
        raise _Missing("lz4") from None
    d = lz4.frame.LZ4FrameDecompressor()
    out = d.decompress(data, max_length=MAX_DECOMPRESSED + 1)
    if len(out) > MAX_DECOMPRESSED:
        raise _TooLarge
    if not d.eof:
        raise ValueError("truncated lz4 frame")
    return out


class _Missing(Exception):
    pass


class _TooLarge(Exception):
    pass


_CODECS = {"zlib": _zlib, "zstd": _zstd, "lz4": _lz4}


@dataclass(frozen=True, slots=True)
class DecodedBody:
    """A body after its SYSFLAG was honoured."""

    data: bytes  # decompressed when ``decompressed``, else the stored bytes
    compression: str | None  # what the SYSFLAG names, None when not compressed
    decompressed: bool
    note: str | None = None  # why a compressed body is given as stored


def decode_body(stored: bytes, sys_flag: int) -> DecodedBody:
    """Decompress ``stored`` as its SYSFLAG says; never raises on bad data."""
    kind = compression_of(sys_flag)
    if kind is None:
        return DecodedBody(stored, None, False)
    fn = _CODECS.get(kind)
    if fn is None:
        return DecodedBody(stored, kind, False, f"unknown compression type in sysFlag "
                           f"0x{sys_flag & 0xFFFFFFFF:X}; body shown as stored")
    if not stored:
        return DecodedBody(stored, kind, False, "empty body; nothing to decompress")
    try:
        return DecodedBody(fn(stored), kind, True)
    except _Missing as e:
        return DecodedBody(stored, kind, False, f"{kind} body shown as stored: install the "
                           f"'{e.args[0]}' package to decompress it")
    except _TooLarge:
        return DecodedBody(stored, kind, False, f"{kind} body would decompress to more than "
                           f"{MAX_DECOMPRESSED} bytes; shown as stored")
    except Exception as e:  # noqa: BLE001 - any codec error on disk data is a note, not a crash
        return DecodedBody(stored, kind, False, f"{kind} body does not decompress "
                           f"({type(e).__name__}: {e}); shown as stored")


def check_charset(charset: str) -> str:
    """The canonical codec name, or :class:`InputError` for an unknown charset."""
    try:
        return codecs.lookup(charset).name
    except LookupError:
        raise InputError(f"unknown charset {charset!r} (utf-8, gbk, latin-1, ...)") from None


def check_mode(mode: str) -> str:
    if mode not in BODY_MODES:
        raise InputError(f"body mode must be one of {', '.join(BODY_MODES)}, got {mode!r}")
    return mode


def render(data: bytes, mode: str, charset: str = "utf-8") -> tuple[str | None, str | None]:
    """(value, bodyEncoding) for ``data`` in ``mode`` (``raw`` is base64 here; which bytes
    are given is the caller's choice). ``text`` that does not decode strictly in
    ``charset`` comes back as base64, labelled so."""
    if mode == "none":
        return None, None
    if mode == "text":
        try:
            return data.decode(charset), "text"
        except UnicodeDecodeError:
            return base64.b64encode(data).decode("ascii"), "base64"
    if mode == "hex":
        return data.hex(), "hex"
    return base64.b64encode(data).decode("ascii"), "base64"


def body_fields(stored: bytes, sys_flag: int, mode: str, charset: str = "utf-8",
                sink=None, msg_id: str | None = None) -> dict:
    """The body part of the message JSON (see :mod:`rmqstore.view`), in key order:
    ``body``, ``bodyEncoding``, ``bodyCharset`` (text in a charset other than UTF-8),
    ``bodyCompression`` (compressed records), ``storedBody`` (base64 of the stored bytes,
    whenever ``body`` was decompressed, so the object stays lossless), ``bodyNote`` (a body
    that could not be decompressed), ``bodyFile`` (where ``sink`` wrote it)."""
    kind = compression_of(sys_flag)
    if mode == "raw" or (kind is None and sink is None):
        dec = DecodedBody(stored, kind, False)
    else:
        dec = decode_body(stored, sys_flag)
    value, enc = render(dec.data, mode, charset)
    out: dict = {"body": value}
    if enc is not None:
        out["bodyEncoding"] = enc
        if enc == "text" and charset not in ("utf-8", "utf_8"):
            out["bodyCharset"] = charset
    if kind is not None:
        out["bodyCompression"] = kind
        if dec.decompressed and mode != "none":
            out["storedBody"] = base64.b64encode(stored).decode("ascii")
        if dec.note and mode != "raw":
            out["bodyNote"] = dec.note
    if sink is not None and msg_id is not None:
        out["bodyFile"] = sink(msg_id, dec.data)
    return out


class BodyDir:
    """Writes each body to ``DIR/<offsetMsgId>``: the name is the hex id the store
    derives, never text from disk, and the file is created next to its final name and
    renamed over it, so a symlink planted at the name is replaced, never followed."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreIOError(f"cannot create the body directory: {e.strerror}", self.dir,
                               errno=e.errno) from None
        if not self.dir.is_dir():
            raise InputError("not a directory", self.dir)

    def __call__(self, msg_id: str, data: bytes) -> str:
        name = msg_id.upper()
        if not name or any(c not in "0123456789ABCDEF" for c in name):
            raise InputError(f"refusing body file name {msg_id!r}: not an offsetMsgId")
        final = self.dir / name
        tmp = self.dir / f".{name}.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except OSError as e:
            try:
                tmp.unlink()
            except OSError:
                pass
            raise StoreIOError(f"cannot write body file: {e.strerror}", final, errno=e.errno) from None
        return str(final)


__all__ = ["BODY_MODES", "DecodedBody", "decode_body", "compression_of", "render", "body_fields",
           "BodyDir", "check_charset", "check_mode"]
