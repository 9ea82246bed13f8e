"""Reading the files a user hands tuner (config, rule files, workloads, tokens, saved expositions): read in chunks
that stop at a cap (``/dev/zero`` or a gzip bomb ends in an error, not in the kernel's OOM killer), decoded as
strict UTF-8; every failure is one InputFileError naming the file, which the caller turns into its own error."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import BinaryIO

from tuner.errors import InputFileError

__all__ = ["read_bytes", "read_tail", "read_text", "decode", "MAX_FILE_BYTES"]

MAX_FILE_BYTES = 10 * 2**20  # as defaults.max_body_bytes: no input file tuner reads is larger than a scrape
_CHUNK = 1 << 16


def read_bytes(path: str | Path, *, max_bytes: int = MAX_FILE_BYTES, gzipped: bool = False, cap: str = "") -> bytes:
    """The file's bytes (decompressed when ``gzipped``), at most ``max_bytes`` of them: reading stops one chunk
    past the cap. InputFileError when it cannot be opened, is larger, or is not a complete gzip stream; ``cap``
    names the setting that sets ``max_bytes`` in that message."""
    name = str(path)
    try:
        f: BinaryIO
        with gzip.open(path, "rb") if gzipped else open(path, "rb") as f:  # type: ignore[assignment]
            chunks, size = [], 0
            while chunk := f.read(min(_CHUNK, max_bytes + 1 - size)):
                chunks.append(chunk)
                size += len(chunk)
                if size > max_bytes:
                    what = "decompresses to more than" if gzipped else "is larger than"
                    raise InputFileError(name, f"{what} {max_bytes} bytes{f' ({cap})' if cap else ''}; not read")
    except gzip.BadGzipFile as exc:
        raise InputFileError(name, f"not a gzip file ({exc})") from None
    except OSError as exc:
        raise InputFileError(name, f"cannot read: {exc.strerror or exc}") from None
    except (EOFError, zlib.error) as exc:  # cut short, or corrupt inside
        raise InputFileError(name, f"not a complete gzip stream ({exc})") from None
    return b"".join(chunks)


def read_tail(path: str | Path, *, max_bytes: int) -> bytes:
    """The last ``max_bytes`` of a file (a log): a regular file is read from there on; anything else (a pipe, a
    device) is read_bytes, up to the cap."""
    p = Path(path)
    try:
        if p.is_file():
            with open(p, "rb") as f:
                f.seek(max(0, p.stat().st_size - max_bytes))
                return f.read(max_bytes)
    except OSError as exc:
        raise InputFileError(str(path), f"cannot read: {exc.strerror or exc}") from None
    return read_bytes(path, max_bytes=max_bytes)


def decode(raw: bytes, name: str) -> str:
    """Strict UTF-8 (a BOM is dropped); InputFileError naming the line of the first bad byte."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InputFileError(
            name, f"not UTF-8 text: byte 0x{raw[exc.start]:02x} on line {line} (save the file as UTF-8)"
        ) from None


def read_text(path: str | Path, *, max_bytes: int = MAX_FILE_BYTES, gzipped: bool = False, cap: str = "") -> str:
    """read_bytes, then decode."""
    return decode(read_bytes(path, max_bytes=max_bytes, gzipped=gzipped, cap=cap), str(path))
