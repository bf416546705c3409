"""Compress committed results files: each ``<part>-<scale>.csv`` under the given folders becomes
``<part>-<scale>.csv.gz`` (the same bytes, gzip-compressed without a name or time, so the same file
always compresses to the same bytes), its provenance record left as it is.

    python tools/compress_results.py results/h200 results/h100     # before committing results
    python tools/compress_results.py --check results/h200          # only say what would change

The long-format CSVs compress about 18 times; uncompressed, a machine's results of the relational
topic alone take tens of MB. Everything that reads results reads either form (harness.results:
``X.csv`` wins where both are there, as a fresh measurement over a committed one). A file is
checked (its rows against its record's digest) before it is replaced, and a folder holding both
forms of one file is refused: which one is meant cannot be told.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
from pathlib import Path

from harness.errors import UserError, exit_on_user_error
from harness.results import COMPRESSED, CSV, ROWS_DIGEST, provenance_path


def compress(path: Path) -> Path:
    """``path`` (``X.csv``) replaced by ``X.csv.gz``, after its rows are checked against its record."""
    data = path.read_bytes()
    record = provenance_path(path)
    if record.exists():
        digest = json.loads(record.read_text(encoding="utf-8")).get(ROWS_DIGEST)
        if digest is not None and digest != hashlib.sha256(data).hexdigest():
            raise UserError(f"{path}: its rows are not those its record was written with: not compressed")
    target = path.with_name(path.name + ".gz")
    partial = target.with_name(f".{target.name}.partial")
    partial.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    if gzip.decompress(partial.read_bytes()) != data:
        partial.unlink()
        raise UserError(f"{path}: its compressed copy does not read back the same: not compressed")
    partial.replace(target)
    path.unlink()
    return target


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="say what would change, write nothing")
    args = parser.parse_args(argv)
    for folder in args.folders:
        if not folder.is_dir():
            parser.error(f"{folder} is not a folder")
    files = sorted({p for folder in args.folders for p in folder.rglob(f"*{CSV}") if p.is_file()})
    both = [p for p in files if p.with_name(p.name + ".gz").exists()]
    if both:
        raise UserError(f"{both[0]} is there in both forms ({COMPRESSED} too): remove the one not meant first")
    for path in files:
        if args.check:
            print(f"{path}: would be compressed")
            continue
        before = path.stat().st_size
        target = compress(path)
        print(f"{path} -> {target.name} ({before:,} -> {target.stat().st_size:,} B)")
    if not files:
        print("no uncompressed results files", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
