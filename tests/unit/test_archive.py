"""Function packages are unpacked within limits: real zip bombs (small ones, against low
limits), one whose directory lies about its sizes, and entries that would land outside the
folder they are unpacked into."""

from __future__ import annotations

import io
import stat
import struct
import zipfile
from pathlib import Path

import pytest

from magnetar.instance.archive import ArchiveLimits, check_archive, extract_archive
from magnetar.instance.code_package import code_search_paths
from magnetar.instance.exceptions import ArchiveLimitError, FunctionLoadError
from tests.zips import lying_zip, zip_bytes

MIB = 1 << 20


def make_zip(
    path: Path, entries: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED
) -> Path:
    path.write_bytes(zip_bytes(entries, compression))
    return path


def make_lying_zip(path: Path, content: bytes, declared: int) -> Path:
    """A one-entry zip whose headers declare ``declared`` bytes for ``content``."""
    path.write_bytes(lying_zip({"fn.py": content}, "fn.py", declared))
    return path


def size_on_disk(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_a_package_within_the_limits_unpacks_whole(tmp_path: Path) -> None:
    entries = {
        "pkg/": b"",
        "pkg/fn.py": b"def process(x):\n    return x\n" * 50,
        "data.bin": bytes(range(256)) * 400,
    }
    stored = make_zip(tmp_path / "stored.zip", entries, zipfile.ZIP_STORED)
    deflated = make_zip(tmp_path / "deflated.zip", entries)
    for package in (stored, deflated):
        target = tmp_path / package.stem
        summary = extract_archive(package, target, ArchiveLimits(max_unpacked_bytes=MIB))
        assert summary.entries == 3
        assert summary.unpacked_bytes == sum(len(c) for c in entries.values())
        assert (target / "pkg" / "fn.py").read_bytes() == entries["pkg/fn.py"]
        assert (target / "data.bin").read_bytes() == entries["data.bin"]


def test_a_bomb_is_refused_by_its_directory_naming_the_limit(tmp_path: Path) -> None:
    bomb = make_zip(tmp_path / "bomb.zip", {f"zeros{i}": bytes(MIB) for i in range(3)})
    assert bomb.stat().st_size < 20_000
    limits = ArchiveLimits(max_unpacked_bytes=2 * MIB, max_compression_ratio=1e9)

    with pytest.raises(ArchiveLimitError) as refused:
        check_archive(bomb, limits)
    assert str(refused.value) == (
        f"the function package unpacks to more than {2 * MIB} bytes, the limit "
        "(max_package_unpacked_bytes)"
    )
    with pytest.raises(ArchiveLimitError, match="max_package_unpacked_bytes"):
        extract_archive(bomb, tmp_path / "out", limits)
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_too_many_entries_are_refused(tmp_path: Path) -> None:
    package = make_zip(tmp_path / "many.zip", {f"f{i}.py": b"" for i in range(11)})

    with pytest.raises(ArchiveLimitError) as refused:
        check_archive(package, ArchiveLimits(max_entries=10))
    assert str(refused.value) == (
        "the function package has 11 entries, more than the limit of 10 (max_package_entries)"
    )
    assert check_archive(package, ArchiveLimits(max_entries=11)).entries == 11


def test_an_entry_inflating_past_the_ratio_is_refused(tmp_path: Path) -> None:
    bomb = make_zip(tmp_path / "ratio.zip", {"zeros": bytes(4 * MIB)})
    small = make_zip(tmp_path / "small.zip", {"text.txt": b"a" * 500_000})

    with pytest.raises(ArchiveLimitError) as refused:
        check_archive(bomb, ArchiveLimits(max_compression_ratio=100))
    assert "'zeros' inflates more than 100 times" in str(refused.value)
    assert str(refused.value).endswith("(max_package_compression_ratio)")
    # a small entry compressing as well is no threat to a disk: not held to the ratio
    assert check_archive(small, ArchiveLimits(max_compression_ratio=100)).entries == 1


def test_a_lying_directory_is_stopped_by_the_bytes_actually_inflated(tmp_path: Path) -> None:
    limit = 1_000_000
    liar = make_lying_zip(tmp_path / "liar.zip", bytes(8 * MIB), declared=100)
    limits = ArchiveLimits(max_unpacked_bytes=limit, max_compression_ratio=1e9)
    assert check_archive(liar, limits).unpacked_bytes == 100  # the directory looks harmless
    target = tmp_path / "out"

    with pytest.raises(ArchiveLimitError) as refused:
        extract_archive(liar, target, limits)
    assert "max_package_unpacked_bytes" in str(refused.value)
    assert size_on_disk(target) <= limit


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../evil.py", "points outside the folder"),
        ("pkg/../../evil.py", "points outside the folder"),
        ("/etc/evil.py", "points outside the folder"),
        ("C:/evil.py", "points outside the folder"),
    ],
)
def test_entries_outside_the_folder_are_refused(tmp_path: Path, name: str, why: str) -> None:
    package = make_zip(tmp_path / "escape.zip", {"fn.py": b"", name: b"x = 1\n"})

    with pytest.raises(ArchiveLimitError, match=why):
        extract_archive(package, tmp_path / "work" / "out", ArchiveLimits())
    assert not (tmp_path / "work").exists()
    assert not (tmp_path / "evil.py").exists()


def test_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    package = tmp_path / "link.zip"
    with zipfile.ZipFile(package, "w") as archive:
        link = zipfile.ZipInfo("secrets")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/etc/passwd")

    with pytest.raises(ArchiveLimitError) as refused:
        check_archive(package, ArchiveLimits())
    assert str(refused.value) == (
        "the function package's entry 'secrets' is a symbolic link: links are refused"
    )


def test_a_corrupt_entry_is_an_error(tmp_path: Path) -> None:
    package = make_zip(tmp_path / "corrupt.zip", {"fn.py": b"x = 1\n" * 1000})
    data = bytearray(package.read_bytes())
    central = data.index(b"PK\x01\x02")
    struct.pack_into("<I", data, central + 16, 12345)  # the CRC-32 the directory declares
    package.write_bytes(bytes(data))

    with pytest.raises(FunctionLoadError, match=r"'fn\.py' is corrupt"):
        extract_archive(package, tmp_path / "out", ArchiveLimits())


def test_an_instance_loading_a_bomb_fails_naming_the_limit_and_frees_the_disk(
    tmp_path: Path,
) -> None:
    bomb = make_lying_zip(tmp_path / "fn.zip", bytes(8 * MIB), declared=100)
    work = tmp_path / "work"

    with pytest.raises(ArchiveLimitError, match="max_package_unpacked_bytes"):
        code_search_paths(bomb, work, ArchiveLimits(max_unpacked_bytes=MIB))
    assert size_on_disk(work) == 0


def test_the_wheels_a_zip_carries_share_its_limits(tmp_path: Path) -> None:
    wheel = io.BytesIO()
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("dep/__init__.py", bytes(3 * MIB))
    package = make_zip(
        tmp_path / "fn.zip",
        {
            "fn.py": b"def process(x):\n    return x\n",
            "deps/dep-1.0-py3-none-any.whl": wheel.getvalue(),
        },
        zipfile.ZIP_STORED,
    )

    with pytest.raises(ArchiveLimitError, match="max_package_unpacked_bytes"):
        code_search_paths(
            package,
            tmp_path / "work",
            ArchiveLimits(max_unpacked_bytes=2 * MIB, max_compression_ratio=1e9),
        )


def test_a_wheel_package_is_checked_before_pip_unpacks_it(tmp_path: Path) -> None:
    wheel = make_zip(tmp_path / "bomb-1.0-py3-none-any.whl", {"bomb/__init__.py": bytes(3 * MIB)})

    with pytest.raises(ArchiveLimitError, match="max_package_compression_ratio"):
        code_search_paths(wheel, tmp_path / "work", ArchiveLimits(max_compression_ratio=100))
    assert not list((tmp_path / "work").rglob("site"))  # pip never ran
