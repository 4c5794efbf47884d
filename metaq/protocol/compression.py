"""Compressed message bodies (sans-IO): RocketMQ's sysFlag bits, and metaq's one rule for them.

RocketMQ producers compress a body over 4 KiB by default and say so in the
message's sysFlag (``MessageSysFlag``): bit 0 ``COMPRESSED_FLAG``, bits 8-10 the
codec (1 LZ4, 2 ZSTD, 3 ZLIB; 0 is RocketMQ 4's zlib). The formats are zlib's
stream (``java.util.zip``, stdlib ``zlib``), a zstd frame (``zstandard``) and an
LZ4 *frame* (lz4-java's ``LZ4FrameOutputStream``, ``lz4.frame``).

**The rule: a body is decompressed when it arrives and stored as the original
bytes.** Every reader (a text ``get``, the metaq ``Consumer``, Spark, RocketMQ
consumers, replication) then gets what the producer meant, with no reader
needing a codec; the stored record keeps no compression bit. The cost is disk
and replication bytes, not network: the producer still sends the compressed
form. A body that does not decompress, names a codec that does not exist, or
decompresses past the body limit is refused with ``BadCompressedBody`` and
nothing is stored.

Decompression is bounded and stepwise: ``inflate_steps`` yields the output at
most ``step`` bytes at a time and stops past ``max_bytes`` (a zip bomb costs at
most the limit), so the broker can let other clients run between steps.
"""

import zlib

from metaq.errors import BadCompressedBody

__all__ = ["COMPRESSED_FLAG", "TYPE_MASK", "COMPRESSION_BITS", "CODECS", "codec_of", "sys_flag_of", "inflate_steps",
           "inflate", "compress"]

COMPRESSED_FLAG = 0x1
TYPE_SHIFT = 8
TYPE_MASK = 7 << TYPE_SHIFT
#: Every sysFlag bit that speaks of compression (cleared from what is stored).
COMPRESSION_BITS = COMPRESSED_FLAG | TYPE_MASK

#: codec name -> RocketMQ 5's type value in bits 8-10
CODECS = {"lz4": 1, "zstd": 2, "zlib": 3}
_BY_TYPE = {0: "zlib", 1: "lz4", 2: "zstd", 3: "zlib"}


def codec_of(sys_flag):
    """The codec a sysFlag names (``"zlib"``, ``"zstd"``, ``"lz4"``), or None when the body is not compressed.

    BadCompressedBody for a type value RocketMQ does not define (4..7)."""
    if not sys_flag & COMPRESSED_FLAG:
        return None
    kind = (sys_flag & TYPE_MASK) >> TYPE_SHIFT
    codec = _BY_TYPE.get(kind)
    if codec is None:
        raise BadCompressedBody("sysFlag %d names compression type %d, which does not exist (1 LZ4, 2 ZSTD, "
                                "3 ZLIB, 0 zlib)" % (sys_flag, kind))
    return codec


def sys_flag_of(codec):
    """The sysFlag bits that announce ``codec`` (RocketMQ 5's form)."""
    try:
        return COMPRESSED_FLAG | (CODECS[codec] << TYPE_SHIFT)
    except KeyError:
        raise ValueError("unknown compression %r: one of %s" % (codec, ", ".join(sorted(CODECS)))) from None


def _too_big(codec, size, max_bytes):
    return BadCompressedBody("a %s body of %d bytes decompresses past %d bytes (the body limit): refused"
                             % (codec, size, max_bytes))


def _corrupt(codec, size, why):
    return BadCompressedBody("a body marked %s-compressed (%d bytes) does not decompress: %s" % (codec, size, why))


def _zlib_steps(data, max_bytes, step):
    d = zlib.decompressobj()
    total = 0
    pending = bytes(data)
    try:
        while True:
            chunk = d.decompress(pending, step)
            pending = d.unconsumed_tail
            total += len(chunk)
            if total > max_bytes:
                raise _too_big("zlib", len(data), max_bytes)
            if chunk:
                yield chunk
            if d.eof:
                break
            if not chunk and not pending:
                raise _corrupt("zlib", len(data), "the stream ends early")
    except zlib.error as exc:
        raise _corrupt("zlib", len(data), exc) from None
    if d.unused_data:
        raise _corrupt("zlib", len(data), "%d bytes follow the end of the stream" % len(d.unused_data))


def _lz4_steps(data, max_bytes, step):
    import lz4.frame

    d = lz4.frame.LZ4FrameDecompressor()
    total = 0
    pending = bytes(data)
    try:
        while not d.eof:
            chunk = d.decompress(pending, max_length=step)
            pending = b""
            total += len(chunk)
            if total > max_bytes:
                raise _too_big("lz4", len(data), max_bytes)
            if chunk:
                yield chunk
            elif d.needs_input and not d.eof:
                raise _corrupt("lz4", len(data), "the frame ends early")
    except RuntimeError as exc:  # lz4.frame's error for a damaged frame
        raise _corrupt("lz4", len(data), exc) from None
    if d.unused_data:
        raise _corrupt("lz4", len(data), "%d bytes follow the end of the frame" % len(d.unused_data))


def _zstd_steps(data, max_bytes, step):
    """One step: zstandard decompresses a frame whole (bench/README.md, "Decompression steps"). A frame that
    announces its size is refused before any work when that size passes the limit; one that does not is
    decompressed into at most ``max_bytes``."""
    import zstandard

    data = bytes(data)
    try:
        size = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise _corrupt("zstd", len(data), exc) from None
    if size > max_bytes:
        raise _too_big("zstd", len(data), max_bytes)
    try:
        out = zstandard.ZstdDecompressor().decompress(data, max_output_size=max_bytes)
    except zstandard.ZstdError as exc:
        if size < 0 and _zstd_passes(data, max_bytes):
            raise _too_big("zstd", len(data), max_bytes) from None
        raise _corrupt("zstd", len(data), exc) from None
    if out:
        yield out


def _zstd_passes(data, max_bytes):
    """Whether a frame without a size decompresses past ``max_bytes`` (read up to one byte past it)."""
    import zstandard

    try:
        with zstandard.ZstdDecompressor().stream_reader(data) as reader:
            got = 0
            while got <= max_bytes:
                chunk = reader.read(min(1 << 20, max_bytes + 1 - got))
                if not chunk:
                    return False
                got += len(chunk)
            return True
    except zstandard.ZstdError:
        return False


_STEPS = {"zlib": _zlib_steps, "lz4": _lz4_steps, "zstd": _zstd_steps}


def inflate_steps(sys_flag, data, max_bytes, step):
    """The decompressed body of ``data`` in pieces of at most ``step`` bytes (nothing when it is not compressed).

    BadCompressedBody when it does not decompress or would pass ``max_bytes``."""
    codec = codec_of(sys_flag)
    if codec is None:
        return iter(())
    return _STEPS[codec](data, max_bytes, step)


def inflate(sys_flag, data, max_bytes, step=1 << 20):
    """The decompressed body (``data`` itself when ``sys_flag`` says it is not compressed)."""
    if codec_of(sys_flag) is None:
        return data
    return b"".join(inflate_steps(sys_flag, data, max_bytes, step))


def compress(data, codec="zlib", level=None):
    """``(sys_flag bits, compressed bytes)`` of ``data`` with ``codec`` (RocketMQ's formats; level: the codec's
    own scale, None for RocketMQ's default: zlib 5, zstd 3, lz4 the fast default)."""
    bits = sys_flag_of(codec)
    if codec == "zlib":
        return bits, zlib.compress(data, 5 if level is None else level)
    if codec == "zstd":
        import zstandard

        return bits, zstandard.ZstdCompressor(level=3 if level is None else level).compress(data)
    import lz4.frame

    return bits, lz4.frame.compress(data, compression_level=0 if level is None else level)
