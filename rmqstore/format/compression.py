"""Message bodies decompressed as their SYSFLAG says (spec §3.3).

Bit ``0x1`` (COMPRESSED_FLAG) says the body is compressed; bits 8-10 (``0x700``) name the
codec, 0 or 3 zlib (0: records from before 4.9.4), 1 LZ4 (frame format), 2 ZSTD. The codec
bits count only with bit 0x1 set. A body that cannot be decompressed comes back as stored,
with a note; nothing here raises on disk data. zstandard and lz4 are optional packages,
imported only when a body needs them (start-up cost, and they may be missing).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from . import layout as L

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


__all__ = ["COMPRESSION_TYPES", "MAX_DECOMPRESSED", "DecodedBody", "decode_body", "compression_of"]
