"""A function's code archive (a ``.zip``, or a ``.whl`` wheel) unpacked within limits, so that
no package fills a worker's disk: a few megabytes may inflate to gigabytes (a zip bomb), and
an entry may name a path outside the folder it is unpacked into.

Two checks share the limits. ``check_archive`` reads the archive's central directory only
(cheap: the REST API refuses a package with it before storing it, and the instance checks a
wheel with it before pip unpacks it). ``extract_archive`` counts the bytes it actually
inflates and stops as soon as they pass a limit, so an archive whose directory lies about its
sizes is stopped there too: it inflates stored and deflated entries itself rather than
trusting the sizes the directory declares.
"""

from __future__ import annotations

import stat
import struct
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from magnetar.instance.exceptions import ArchiveLimitError, FunctionLoadError

__all__ = [
    "DEFAULT_ARCHIVE_LIMITS",
    "ArchiveLimits",
    "ArchiveSummary",
    "check_archive",
    "extract_archive",
]

_CHUNK = 1 << 16
_RATIO_GRACE_BYTES = 1 << 20
"""Entries smaller than this are not held to the compression ratio: a small file of repeated
text compresses far better than code does, and cannot fill a disk."""
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_SIGNATURE = b"PK\x03\x04"


@dataclass(frozen=True)
class ArchiveLimits:
    """How much one function package may unpack to (worker settings
    ``max_package_unpacked_bytes``, ``max_package_entries``, ``max_package_compression_ratio``)."""

    max_unpacked_bytes: int = 1 << 30
    """Total bytes the archive's entries inflate to."""
    max_entries: int = 20_000
    """Entries (files and folders) in the archive."""
    max_compression_ratio: float = 100.0
    """Inflated size over compressed size, of the archive and of each entry past 1 MiB."""

    def after(self, used: ArchiveSummary) -> ArchiveLimits:
        """The limits left for archives unpacked from this one (a zip's wheels)."""
        return ArchiveLimits(
            max(0, self.max_unpacked_bytes - used.unpacked_bytes),
            max(0, self.max_entries - used.entries),
            self.max_compression_ratio,
        )


DEFAULT_ARCHIVE_LIMITS = ArchiveLimits()


@dataclass(frozen=True)
class ArchiveSummary:
    """What an archive holds, by its central directory (or as extracted)."""

    entries: int
    unpacked_bytes: int
    compressed_bytes: int

    def __add__(self, other: ArchiveSummary) -> ArchiveSummary:
        return ArchiveSummary(
            self.entries + other.entries,
            self.unpacked_bytes + other.unpacked_bytes,
            self.compressed_bytes + other.compressed_bytes,
        )


def check_archive(archive: str | Path | IO[bytes], limits: ArchiveLimits) -> ArchiveSummary:
    """The archive's entries checked against ``limits`` by its central directory;
    ArchiveLimitError names the limit it passes, FunctionLoadError says why it is unusable."""
    with _open(archive) as opened:
        infos = opened.infolist()
    if len(infos) > limits.max_entries:
        raise ArchiveLimitError(
            f"the function package has {len(infos)} entries, more than the limit of "
            f"{limits.max_entries} (max_package_entries)"
        )
    unpacked = compressed = 0
    for info in infos:
        _check_entry(info)
        unpacked += info.file_size
        compressed += info.compress_size
        if unpacked > limits.max_unpacked_bytes:
            raise _too_big(limits)
        _check_ratio(info.filename, info.file_size, info.compress_size, limits)
    _check_ratio(None, unpacked, compressed, limits)
    return ArchiveSummary(len(infos), unpacked, compressed)


def extract_archive(archive: Path, target: Path, limits: ArchiveLimits) -> ArchiveSummary:
    """Unpack ``archive`` into ``target``, counting what is actually inflated; stops with
    ArchiveLimitError (naming the limit) as soon as a limit is passed."""
    check_archive(archive, limits)
    unpacked = compressed = 0
    with _open(archive) as opened, archive.open("rb") as raw:
        infos = opened.infolist()
        for info in infos:
            path = target.joinpath(*PurePosixPath(info.filename).parts)
            if info.is_dir():
                path.mkdir(parents=True, exist_ok=True)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            written = 0
            with path.open("wb") as out:
                for block in _inflate(opened, raw, info):
                    written += len(block)
                    if unpacked + written > limits.max_unpacked_bytes:
                        raise _too_big(limits)
                    _check_ratio(info.filename, written, info.compress_size, limits)
                    out.write(block)
            unpacked += written
            compressed += info.compress_size
    _check_ratio(None, unpacked, compressed, limits)
    return ArchiveSummary(len(infos), unpacked, compressed)


def _open(archive: str | Path | IO[bytes]) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as error:
        raise FunctionLoadError(
            f"the function package is not a valid zip archive: {error}"
        ) from None


def _check_entry(info: zipfile.ZipInfo) -> None:
    """Refuse entries that would land outside the folder unpacked into, or are links."""
    name = info.filename
    parts = PurePosixPath(name.replace("\\", "/")).parts
    unsafe = (
        "\x00" in name
        or name.startswith(("/", "\\"))
        or (len(name) > 1 and name[1] == ":")  # a drive letter
        or ".." in parts
    )
    if unsafe:
        raise ArchiveLimitError(
            f"the function package's entry {name!r} points outside the folder it is unpacked "
            "into (an absolute path or '..'): refused"
        )
    if stat.S_ISLNK(info.external_attr >> 16):
        raise ArchiveLimitError(
            f"the function package's entry {name!r} is a symbolic link: links are refused"
        )
    if info.flag_bits & 0x1:
        raise FunctionLoadError(f"the function package's entry {name!r} is encrypted")


def _check_ratio(name: str | None, unpacked: int, compressed: int, limits: ArchiveLimits) -> None:
    if unpacked <= _RATIO_GRACE_BYTES or unpacked <= limits.max_compression_ratio * compressed:
        return
    what = "the function package" if name is None else f"the function package's entry {name!r}"
    raise ArchiveLimitError(
        f"{what} inflates more than {limits.max_compression_ratio:g} times "
        f"({compressed} compressed bytes inflate to {unpacked}), past the limit "
        "(max_package_compression_ratio)"
    )


def _too_big(limits: ArchiveLimits) -> ArchiveLimitError:
    return ArchiveLimitError(
        f"the function package unpacks to more than {limits.max_unpacked_bytes} bytes, the "
        "limit (max_package_unpacked_bytes)"
    )


def _inflate(opened: zipfile.ZipFile, raw: IO[bytes], info: zipfile.ZipInfo) -> Iterator[bytes]:
    """An entry's content. Stored and deflated entries are read from their raw bytes, so that
    no size the archive declares bounds (or hides) what comes out; other methods go through
    zipfile, which stops at the declared size."""
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        try:
            with opened.open(info) as entry:
                while block := entry.read(_CHUNK):
                    yield block
        except (zipfile.BadZipFile, NotImplementedError, EOFError, zlib.error) as error:
            raise FunctionLoadError(f"cannot unpack {info.filename!r}: {error}") from None
        return
    raw.seek(info.header_offset)
    header = raw.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size or header[:4] != _LOCAL_SIGNATURE:
        raise FunctionLoadError(f"the function package's entry {info.filename!r} is corrupt")
    fields = _LOCAL_HEADER.unpack(header)
    raw.seek(fields[9] + fields[10], 1)  # past the entry's name and extra field
    crc = 0
    for block in _raw_blocks(raw, info):
        crc = zlib.crc32(block, crc)
        yield block
    if crc != info.CRC:
        raise FunctionLoadError(f"the function package's entry {info.filename!r} is corrupt")


def _raw_blocks(raw: IO[bytes], info: zipfile.ZipInfo) -> Iterator[bytes]:
    """The entry's bytes, inflated in blocks of at most ``_CHUNK``: however much one compressed
    block inflates to, no more than that is held at once."""
    left = info.compress_size
    inflater = zlib.decompressobj(-zlib.MAX_WBITS) if info.compress_type else None
    tail = b""
    try:
        while True:
            if tail:
                data = tail
            elif left > 0 and (data := raw.read(min(_CHUNK, left))):
                left -= len(data)
            elif inflater is not None and not inflater.eof:
                data = b""  # input spent: what zlib still holds comes out block by block
            else:
                return
            if inflater is None:
                yield data
                continue
            block = inflater.decompress(data, _CHUNK)
            tail = inflater.unconsumed_tail
            if block:
                yield block
            elif not data or inflater.eof:
                return
    except zlib.error as error:
        raise FunctionLoadError(f"cannot unpack {info.filename!r}: {error}") from None
