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


def docs_with_blocks() -> list[Path]:
    return [p for p in sorted((REPO_ROOT / "docs").glob("*.md")) if blocks.blocks(p.read_text(), str(p))]


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
    cached = functools.cache(render)  # a table placed twice is rendered once
    stale = []
    for doc in args.docs or docs_with_blocks():
        if args.check:
            stale += [f"{doc}: {name}" for name in blocks.stale(doc, cached)]
            continue
        text = doc.read_text()
        new = blocks.rewrite(text, cached, str(doc))
        if new != text:
            doc.write_text(new)
            print(f"rewrote the generated tables of {doc.resolve().relative_to(REPO_ROOT)}")
    if stale:
        print("generated tables that differ from their results (run python -m analysis.doc_tables):", file=sys.stderr)
        print("\n".join(stale), file=sys.stderr)
    unsupported = []
    if args.check:
        for doc in args.docs or [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]:
            unsupported += [f"{doc}: {found}" for found in quoted.problems(doc.read_text())]
    if unsupported:
        print("numbers in the docs' prose that their sources do not support:", file=sys.stderr)
        print("\n".join(unsupported), file=sys.stderr)
    return 1 if stale or unsupported else 0


if __name__ == "__main__":
    sys.exit(main())
