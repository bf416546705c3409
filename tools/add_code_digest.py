"""Add the measured code's digest to provenance records written before runs recorded it.

    python tools/add_code_digest.py results/h200            # every record under the folder
    python tools/add_code_digest.py --check results/h200    # only say what would change

A run records ``code.digest`` (``harness.provenance.code_digest``): a sha256 of the files under
``config/``, ``harness/``, ``systems/`` and ``workloads/`` as they were on disk (all but the
record writer, ``harness/provenance.py``). Re-runs of a part
are read beside its committed run when the digests agree, so processes measured at different
commits of the same code count together. An older record has only its commit; where that commit
was clean (``git.dirty`` false) its tree in git is the code that ran, and this tool computes the
same digest from it, marked ``"source": "the commit's tree in git, added after the run"``. A dirty
or unknown tree is left as it is: what ran there cannot be recovered.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.provenance import MEASURED_CODE, code_digest_at

FROM_GIT = "the commit's tree in git, added after the run"


def add_digest(record: dict) -> str:
    """Give ``record`` its code digest where it can be recovered; says what was done."""
    if "code" in record:
        return "has one"
    git = record.get("git", {})
    if git.get("dirty") is not False:
        return "left: the tree was dirty or its state unknown"
    digest = code_digest_at(git.get("commit", ""))
    if digest is None:
        return f"left: commit {git.get('commit', '?')[:8]} is not in this clone's git history"
    record["code"] = {"digest": digest, "folders": list(MEASURED_CODE), "source": FROM_GIT}
    return "added"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="say what would change, write nothing")
    args = parser.parse_args(argv)
    for folder in args.folders:
        if not folder.is_dir():
            parser.error(f"{folder} is not a folder")
        for path in sorted(folder.rglob("*.provenance.json")):
            record = json.loads(path.read_text())
            outcome = add_digest(record)
            if outcome == "added" and not args.check:
                path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
            if outcome != "has one":
                print(f"{path}: {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
