"""Small wheels built in the test itself, so dependency tests need no index."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def make_wheel(
    directory: Path, name: str, files: dict[str, str], requires: tuple[str, ...] = ()
) -> Path:
    """A pure-Python wheel of ``name`` 1.0 holding ``files`` (path -> source)."""
    dist_info = f"{name}-1.0.dist-info"
    metadata = "".join(
        [
            "Metadata-Version: 2.1\n",
            f"Name: {name}\n",
            "Version: 1.0\n",
            *(f"Requires-Dist: {r}\n" for r in requires),
        ]
    )
    contents = {
        **files,
        f"{dist_info}/METADATA": metadata,
        f"{dist_info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: magnetar-tests\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n"
        ),
    }
    records = [
        f"{path},sha256={_hash(text)},{len(text.encode())}" for path, text in contents.items()
    ]
    records.append(f"{dist_info}/RECORD,,")
    path = directory / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in contents.items():
            archive.writestr(member, text)
        archive.writestr(f"{dist_info}/RECORD", "\n".join(records) + "\n")
    return path


def _hash(text: str) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
