"""The documentation: the site builds strictly, so a broken link or anchor anywhere between the
README, docs/ and the repository's files fails the suite; and the README stays a short page."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=project,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    result = build(ROOT, tmp_path / "site")

    assert result.returncode == 0, result.stderr
    assert "Magnetar" in (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert (tmp_path / "site" / "embedded-broker" / "index.html").exists()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    project = tmp_path / "project"
    for folder in ("docs", "examples", "scripts"):
        shutil.copytree(ROOT / folder, project / folder)
    shutil.copy(ROOT / "mkdocs.yml", project)
    readme = README.read_text(encoding="utf-8")
    (project / "README.md").write_text(
        readme + "\n[state](docs/state.md#no-such-heading) [gone](docs/gone.md)\n",
        encoding="utf-8",
    )
    with (project / "docs" / "state.md").open("a", encoding="utf-8") as page:
        page.write("\n[the cluster](cluster.md#nowhere), [code](../examples/missing.py)\n")

    result = build(project, tmp_path / "site")

    assert result.returncode == 1
    assert "README.md links to 'docs/state.md#no-such-heading'" in result.stderr
    assert "README.md links to 'docs/gone.md', which does not exist" in result.stderr
    assert "'cluster.md#nowhere'" in result.stderr
    assert "links to '../examples/missing.py', which does not exist" in result.stderr


def test_the_readme_is_short_and_starts_with_the_two_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    first_block = lines[lines.index("```sh") + 1 : lines.index("```sh") + 3]

    assert len(lines) < 200
    assert [line.split("#")[0].strip() for line in first_block] == ["make demo", "make test"]
