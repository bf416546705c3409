"""Give provenance records written without a digest of their topic's code one, from git.

    python tools/add_code_digest.py results/h200            # every record under the folder
    python tools/add_code_digest.py --check results/h200    # only say what would change

A malformed record stops it before anything is written; a folder without records is named, and the
exit status is then 1.

A run records ``code.digest`` (``harness.code_digest``): a sha256 of the files its topic's parts
can run (the harness, the topic's package and config, and what they import), as they were on disk.
Re-runs of a part are read beside its committed run when the digests agree, so processes measured
at different commits of the same code count together. A record without that digest (older runs,
or runs whose digest covered every measured folder rather than its topic's files) has its commit;
where that commit was clean (``git.dirty`` false) its tree in git is the code that ran, and this
tool computes the same digest from it, marked ``"source": "the commit's tree in git, added after
the run"``. A dirty or unknown tree is left as it is: what ran there cannot be recovered.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness import code_digest
from harness.errors import UserError, exit_on_user_error
from harness.provenance import REPO_ROOT

FROM_GIT = "the commit's tree in git, added after the run"


def add_digest(record: dict) -> str:
    """Give ``record`` the digest of its topic's code where it can be recovered; says what was done.
    A digest a run took of its files on disk is kept; one this tool added is computed again (the
    rules of what a topic's code is may have changed since), and rewritten where it differs."""
    code = record.get("code") or {}
    if "topic" in code and code.get("source") != FROM_GIT:
        return "has one"
    git = record.get("git", {})
    if git.get("dirty") is not False:
        return "left: the tree was dirty or its state unknown"
    files = code_digest.files_at(git.get("commit", ""), REPO_ROOT)
    if files is None:
        return f"left: commit {git.get('commit', '?')[:8]} is not in this clone's git history"
    topic = record.get("topic")
    try:
        scope = code_digest.topic_files(files, topic) if topic else set(files)
    except ValueError as err:
        return f"left: {err}"
    digest = code_digest.digest({p: files[p] for p in scope})
    new = {"digest": digest, "topic": topic, "files": len(scope), "source": FROM_GIT}
    if code == new:
        return "has one"
    record["code"] = new
    return "added" if code.get("source") != FROM_GIT else "computed again"


def read_record(path: Path) -> dict:
    """The provenance record at ``path``, refused in one line that names the file where it is not
    a JSON object."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise UserError(f"{path} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path} cannot be read: {getattr(err, 'strerror', None) or err}") from None
    if not isinstance(record, dict):
        raise UserError(f"{path} holds a JSON {type(record).__name__}, not a provenance record (an object)")
    return record


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="say what would change, write nothing")
    args = parser.parse_args(argv)
    for folder in args.folders:
        if not folder.is_dir():
            parser.error(f"{folder} is not a folder")
    # Every record is read before any is written: a malformed one leaves them all as they were.
    paths = {folder: sorted(folder.rglob("*.provenance.json")) for folder in args.folders}
    records = {path: read_record(path) for found in paths.values() for path in found}
    empty = [folder for folder, found in paths.items() if not found]
    for folder in empty:
        print(f"{folder}: no provenance records (*.provenance.json) in it or below it", file=sys.stderr)
    for path, record in records.items():
        outcome = add_digest(record)
        if outcome in ("added", "computed again") and not args.check:
            path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        if outcome != "has one":
            print(f"{path}: {outcome}")
    return 1 if empty else 0


if __name__ == "__main__":
    sys.exit(main())
