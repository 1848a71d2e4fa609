"""MkDocs hooks for the docs site (mkdocs.yml): pages from outside docs/.

The site is built over docs/, but some of what it shows lives elsewhere in the repository: the
README (the site's home page), the chart's README and the benchmark docs. mkdocs.yml's nav names
them by their path from docs/ (`../README.md`); `on_files` adds each such file to the site under
that same path, so a relative link between two of them, or from a page in docs/ to one of them,
resolves just as it does in the repository. A link from one of them into docs/
(`docs/GUIDE.md` in the README) cannot be relative to docs/, so `on_page_markdown` turns it into a
docs-absolute link (`/GUIDE.md`, resolved by `validation.links.absolute_links: relative_to_docs`).
Everything stays checked by `mkdocs build --strict`: a link to a missing file or anchor fails it.
"""

from __future__ import annotations

import posixpath
import re

from mkdocs.structure.files import File, InclusionLevel

_LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")


def _outside_pages(nav) -> list[str]:
    """The nav's entries that point out of docs/: `../README.md` and the like."""
    found = []
    for item in nav or []:
        values = item.values() if isinstance(item, dict) else [item]
        for value in values:
            if isinstance(value, list):
                found += _outside_pages(value)
            elif isinstance(value, str) and value.startswith("../"):
                found.append(value)
    return found


def _site_path(repo_path: str) -> str:
    """Where a repository file goes in the site: README.md is the home page, a README the index
    of its folder, any other page a folder of its own (MkDocs' directory URLs)."""
    folder, name = posixpath.split(repo_path)
    if name == "README.md":
        return posixpath.join(folder, "index.html")
    return posixpath.join(folder, name.removesuffix(".md"), "index.html")


def on_files(files, config):
    for src_uri in _outside_pages(config.nav):
        repo_path = posixpath.normpath(posixpath.join("docs", src_uri))
        files.append(File(src_uri, config.docs_dir, config.site_dir, config.use_directory_urls,
                          dest_uri=_site_path(repo_path), inclusion=InclusionLevel.INCLUDED))
    return files


def on_page_markdown(markdown, page, config, files):
    src_uri = page.file.src_uri
    if not src_uri.startswith("../"):
        return markdown
    folder = posixpath.dirname(posixpath.normpath(posixpath.join("docs", src_uri)))

    def rewrite(match: re.Match) -> str:
        target = match.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            return match.group(0)
        repo_path = posixpath.normpath(posixpath.join(folder, target))
        if not repo_path.startswith("docs/"):
            return match.group(0)
        return f"{match.group(1)}/{repo_path[len('docs/'):]}{match.group(3) or ''}{match.group(4)}"

    return _LINK.sub(rewrite, markdown)
