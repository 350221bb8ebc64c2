"""Zip archives built in the test itself: honest ones, and ones whose headers lie."""

from __future__ import annotations

import io
import struct
import zipfile


def zip_bytes(entries: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    """A zip of ``entries`` (name -> content)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as archive:
        for name, content in entries.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def lying_zip(entries: dict[str, bytes], liar: str, declared: int) -> bytes:
    """A deflated zip of ``entries`` whose local header and central directory both declare
    ``declared`` bytes for the entry ``liar``, whatever it inflates to."""
    data = bytearray(zip_bytes(entries))
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
        info = archive.getinfo(liar)
    struct.pack_into("<I", data, info.header_offset + 22, declared)
    name = liar.encode()
    central = data.index(b"PK\x01\x02")  # the central directory's entries, in turn
    while data[central + 46 : central + 46 + len(name)] != name:
        central = data.index(b"PK\x01\x02", central + 4)
    struct.pack_into("<I", data, central + 24, declared)
    return bytes(data)
