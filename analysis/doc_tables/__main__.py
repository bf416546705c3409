"""Rewrite (or check) the generated tables of docs/: ``python -m analysis.doc_tables [--check] [DOC ...]``.

``--check`` also lists the numbers quoted in the docs' prose that their sources do not support
(analysis/doc_tables/quoted.py)."""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from analysis.doc_tables import REPO_ROOT, blocks, quoted, render
from harness.errors import UserError, exit_on_user_error
from harness.provenance import shown


def read_doc(path: Path) -> str:
    """The text of the doc at ``path``, refused in one line where it is no readable UTF-8 file."""
    if path.is_dir():
        raise UserError(f"{path} is a folder: name the docs themselves (e.g. {path / '*.md'})")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"no such doc: {path}") from None
    except UnicodeDecodeError as err:
        raise UserError(f"{path} is not UTF-8 text (byte {err.start}: {err.reason})") from None
    except OSError as err:
        raise UserError(f"{path} cannot be read: {err.strerror or err}") from None


def docs_with_blocks() -> list[Path]:
    return [p for p in sorted((REPO_ROOT / "docs").glob("*.md")) if blocks.blocks(read_doc(p), str(p))]


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("docs", nargs="*", type=Path, help="docs to refresh (default: every doc with a block)")
    parser.add_argument(
        "--check", action="store_true", help="change nothing; list stale blocks and unsupported numbers, exit 1 if any"
    )
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.docs if not p.exists()]
    if missing:
        raise UserError(f"no such doc: {', '.join(missing)}")
    # Every doc is read, and every new text made, before any is written: a doc refused (a folder,
    # not UTF-8, a broken marker, a table that cannot be rendered) leaves all of them as they were.
    refreshed = args.docs or docs_with_blocks()
    # --check also reads the prose of the README and every doc for quoted numbers.
    quoting = (args.docs or [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]) if args.check else []
    texts = {doc: read_doc(doc) for doc in [*refreshed, *quoting]}
    cached = functools.cache(render)  # a table placed twice is rendered once
    stale, rewritten = [], {}
    for doc in dict.fromkeys(refreshed):
        text = texts[doc]
        if args.check:
            stale += [f"{doc}: {name}" for name in blocks.stale_in(text, cached, str(doc))]
            continue
        new = blocks.rewrite(text, cached, str(doc))
        if new != text:
            rewritten[doc] = new
    for doc, new in rewritten.items():
        doc.write_text(new, encoding="utf-8")
        print(f"rewrote the generated tables of {shown(doc)}")
    if stale:
        print("generated tables that differ from their results (run python -m analysis.doc_tables):", file=sys.stderr)
        print("\n".join(stale), file=sys.stderr)
    unsupported = []
    for doc in dict.fromkeys(quoting):
        unsupported += [f"{doc}: {found}" for found in quoted.problems(texts[doc])]
    if unsupported:
        print("numbers in the docs' prose that their sources do not support:", file=sys.stderr)
        print("\n".join(unsupported), file=sys.stderr)
    return 1 if stale or unsupported else 0


if __name__ == "__main__":
    sys.exit(main())
