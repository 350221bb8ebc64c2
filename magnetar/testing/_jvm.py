"""The JVM under Apache Pulsar standalone: finding ``java``, and class data sharing.

Class data sharing: the first JVM writes the classes it loaded to an archive as it exits; every
later one maps the archive instead of loading and verifying the classes again, which takes a
third off the CPU a broker needs to start.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from pathlib import Path

from magnetar.testing.exceptions import ApachePulsarError

__all__ = ["ClassSharing", "archive_path", "java"]

_STALE_ARCHIVE_S = 600.0


def java() -> str:
    """The ``java`` of ``JAVA_HOME``, else the one on the PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise ApachePulsarError(
            "Apache Pulsar needs Java 17 or newer, and no `java` is on the PATH (nor in "
            "JAVA_HOME); install a JDK, e.g. `apt-get install openjdk-17-jre-headless`"
        )
    return found


def archive_path(java: str, classpath: str) -> Path | None:
    """Where the class data sharing archive of this JVM and classpath lives (None: nowhere
    writable); a JDK or a Pulsar release of its own gets an archive of its own."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "magnetar"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        jvm = Path(java).resolve()
        identity = f"{jvm}:{jvm.stat().st_mtime_ns}:{classpath}"
        # What a JVM whose parent died wrote as it exited (a live one renames it at once).
        for pending in cache.glob("apache-pulsar-*.jsa.*"):
            if time.time() - pending.stat().st_mtime > _STALE_ARCHIVE_S:
                pending.unlink(missing_ok=True)
    except OSError:
        return None
    return cache / f"apache-pulsar-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.jsa"


class ClassSharing:
    """Java's class data sharing for the broker: used when the archive exists, otherwise
    written by the JVM as it exits (under a name of its own, put in place afterwards)."""

    def __init__(self, archive: Path | None) -> None:
        self.archive = archive
        self._pending: Path | None = None

    def options(self) -> list[str]:
        self.discard()
        if self.archive is None:
            return []
        if self.archive.exists():
            return [f"-XX:SharedArchiveFile={self.archive}", "-Xlog:cds=error"]
        self._pending = self.archive.with_name(f"{self.archive.name}.{uuid.uuid4().hex[:8]}")
        # Classes of old class-file versions cannot be archived: the JVM warns of each.
        return [f"-XX:ArchiveClassesAtExit={self._pending}", "-Xlog:cds=error"]

    @property
    def writing(self) -> bool:
        """Whether the running JVM writes the archive when it exits."""
        return self._pending is not None

    def keep(self) -> None:
        """After a JVM that served has exited: put the archive it wrote in place."""
        pending, self._pending = self._pending, None
        if pending is None or self.archive is None:
            return
        try:
            if pending.stat().st_size > 0 and not self.archive.exists():
                pending.replace(self.archive)
        except OSError:
            pass
        pending.unlink(missing_ok=True)

    def discard(self) -> None:
        """Drop what a JVM that never served wrote."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.unlink(missing_ok=True)
