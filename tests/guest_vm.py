"""A Linux guest for what this machine's kernel cannot show: QEMU boots the Debian kernel that
``make guest-vm`` fetched, with this host's files as its root (read-only, over 9p), runs a
shell script as its first process and ends when the script does. A test reads the guest's
console.

It is used for cgroup v2: this machine mounts every controller on cgroup v1, and a controller
is on one version at a time, per kernel. QEMU emulates the CPU (TCG): this machine's
``/dev/kvm`` opens, but a guest on it hangs at boot (KVM nested in a VM). The guest boots in
about 5 s, and Python in it runs about ten times slower.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path
from typing import BinaryIO

__all__ = ["guest_unavailable", "run_in_guest"]

ROOT = Path(__file__).resolve().parent.parent
KERNEL_TREE = ROOT / "build" / "guest-kernel"
"""The kernel package, unpacked (``make guest-vm``)."""
BUSYBOX = Path("/bin/busybox")
"""The static busybox the guest's first steps run on, before the host's files are mounted."""
MODULES = (
    "virtio_ring",
    "virtio",
    "virtio_pci_legacy_dev",
    "virtio_pci_modern_dev",
    "virtio_pci",
    "9pnet",
    "9pnet_virtio",
    "netfs",
    "fscache",
    "9p",
)
"""What mounting the host's files over virtio-9p needs, in the order they load (Debian builds
them as modules)."""

_INIT = """#!/bin/busybox sh
B=/bin/busybox
$B mount -t devtmpfs dev /dev
for module in {modules}; do $B insmod /modules/$module.ko || exit 1; done
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose host /host
$B mount -t tmpfs run /host/run
$B cp /script.sh /host/run/script.sh
$B mount --move /dev /host/dev
exec $B switch_root /host /bin/sh /run/script.sh
"""
_PREAMBLE = """exec 2>&1
mount -t proc proc /proc
mount -t sysfs sys /sys
mkdir -p /dev/shm && mount -t tmpfs shm /dev/shm
mkdir /run/tmp && export TMPDIR=/run/tmp
"""
"""What every script starts with: the guest's own /proc, /sys and /dev/shm, and a temporary
directory in /run (written over /tmp, a tmpfs would hide a checkout there)."""


def _kernel() -> tuple[Path, Path] | None:
    """The kernel image and its modules' folder, if fetched."""
    images = sorted(KERNEL_TREE.glob("boot/vmlinuz-*"))
    if not images:
        return None
    version = images[-1].name.removeprefix("vmlinuz-")
    return images[-1], KERNEL_TREE / "lib" / "modules" / version / "kernel"


def guest_unavailable() -> str | None:
    """Why no guest can be booted here, or None."""
    if shutil.which("qemu-system-x86_64") is None:
        return "no qemu-system-x86_64 (make guest-vm installs it, as root with apt)"
    if not BUSYBOX.exists():
        return f"no {BUSYBOX} (make guest-vm installs busybox-static, as root with apt)"
    if _kernel() is None:
        return f"no kernel in {KERNEL_TREE} (make guest-vm fetches it, with apt)"
    return None


def run_in_guest(script: str, work: Path, timeout_s: float) -> str:
    """Boot a guest that runs ``script`` (sh, as root, after ``_PREAMBLE``) and return what
    it wrote to the console. ``work``: a folder for the guest's initramfs."""
    found = _kernel()
    assert found is not None, guest_unavailable()
    image, modules = found
    by_name = {path.stem: path for path in modules.rglob("*.ko")}
    initramfs = work / "initramfs.cpio"
    with initramfs.open("wb") as archive:
        _Cpio(archive).write_all(
            {
                "bin/busybox": BUSYBOX.read_bytes(),
                "init": _INIT.format(modules=" ".join(MODULES)).encode(),
                "script.sh": (_PREAMBLE + script).encode(),
                **{f"modules/{name}.ko": by_name[name].read_bytes() for name in MODULES},
            },
            folders=("bin", "dev", "host", "modules"),
        )
    command = [
        "qemu-system-x86_64",
        *("-accel", "tcg", "-cpu", "max", "-smp", "2", "-m", "2048"),
        *("-nographic", "-nodefaults", "-no-reboot", "-serial", "stdio"),
        *("-kernel", str(image), "-initrd", str(initramfs)),
        # multidevs=remap: without it, /proc and /sys (inode 1 each on their own device)
        # were one directory to the guest, and a mount on one showed on the other
        *("-fsdev", "local,id=host,path=/,security_model=none,readonly=on,multidevs=remap"),
        *("-device", "virtio-9p-pci,fsdev=host,mount_tag=host"),
        # panic=-1: the script's end ends init, and the kernel's panic then ends QEMU
        *("-append", "console=ttyS0 quiet panic=-1"),
    ]
    done = subprocess.run(
        command,
        check=False,  # what went wrong is on the console, which the test shows
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout_s,
    )
    return done.stdout.decode(errors="replace")


class _Cpio:
    """The "newc" cpio format the kernel unpacks an initramfs from."""

    def __init__(self, archive: BinaryIO) -> None:
        self._archive = archive
        self._inode = 0

    def write_all(self, files: dict[str, bytes], folders: tuple[str, ...]) -> None:
        for folder in folders:
            self._entry(folder, stat.S_IFDIR | 0o755, b"")
        for name, content in files.items():
            self._entry(name, stat.S_IFREG | 0o755, content)
        self._entry("TRAILER!!!", 0, b"")

    def _entry(self, name: str, mode: int, content: bytes) -> None:
        self._inode += 1
        encoded = name.encode() + b"\0"
        # inode, mode, uid, gid, links, mtime, size, device (4), name size, checksum
        fields = (self._inode, mode, 0, 0, 1, 0, len(content), 0, 0, 0, 0, len(encoded), 0)
        header = b"070701" + b"".join(b"%08X" % value for value in fields) + encoded
        self._archive.write(header + b"\0" * (-len(header) % 4))
        self._archive.write(content + b"\0" * (-len(content) % 4))
