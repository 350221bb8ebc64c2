"""mkdocs hooks: links that leave docs/ are checked too, so a strict build fails on any of them.

The pages are read in the repository as much as on the built site, so they link to its files
(``../examples/exclamation.py``) and the README links into them (``docs/state.md#state``).
mkdocs checks only links between the pages of docs/; these hooks check the rest: every link
from a page to a file of the repository, and every relative link of the README, with its
anchor when it points at a heading. The site holds docs/ alone, so there a link to a file of
the repository shows as its text.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from markdown.extensions.toc import slugify

log = logging.getLogger("mkdocs.hooks.repository_links")

_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*#*\s*$", re.MULTILINE)


def on_pre_build(config: Any, **kwargs: Any) -> None:
    root = Path(config.config_file_path).parent
    readme = root / "README.md"
    for target in _links(readme.read_text(encoding="utf-8")):
        problem = _problem(readme, target)
        if problem:
            log.warning("README.md links to '%s', %s", target, problem)


def on_page_markdown(markdown: str, page: Any, config: Any, **kwargs: Any) -> str:
    docs_dir = Path(config.docs_dir).resolve()
    source = Path(page.file.abs_src_path)

    def outside_docs(match: re.Match[str]) -> str:
        target = match["target"]
        if _is_external(target) or target.startswith("#"):
            return match[0]
        path = (source.parent / target.split("#", 1)[0]).resolve()
        if path.is_relative_to(docs_dir):
            return match[0]  # mkdocs' own validation checks it
        problem = _problem(source, target)
        if problem:
            log.warning("Doc file '%s' links to '%s', %s", page.file.src_uri, target, problem)
        return match["text"]

    return _outside_fences(markdown, lambda text: _LINK.sub(outside_docs, text))


def _problem(source: Path, target: str) -> str | None:
    """What is wrong with a relative link of ``source``, or None (external links are not
    fetched)."""
    if _is_external(target):
        return None
    path_part, _, anchor = target.partition("#")
    path = (source.parent / path_part).resolve() if path_part else source
    if not path.exists():
        return "which does not exist"
    if anchor and path.suffix == ".md" and anchor not in _anchors(path):
        return f"but {path.name} has no heading with the anchor '#{anchor}'"
    return None


def _anchors(page: Path) -> set[str]:
    """The ids mkdocs gives the headings of a page (the toc extension's slugs)."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slugify(match["title"], "-") for match in _HEADING.finditer(text)}


def _links(markdown: str) -> list[str]:
    return [match["target"] for match in _LINK.finditer(_FENCE.sub("", markdown))]


def _is_external(target: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*:", target) is not None


def _outside_fences(markdown: str, change: Callable[[str], str]) -> str:
    """``change`` applied to the text between fenced code blocks, the blocks kept as they are."""
    pieces: list[str] = []
    last = 0
    for fence in _FENCE.finditer(markdown):
        pieces += [change(markdown[last : fence.start()]), fence[0]]
        last = fence.end()
    return "".join([*pieces, change(markdown[last:])])
