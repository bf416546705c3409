"""Provenance of a measurement run: which code, which machine, which software, when, what scale.

Written as a JSON record next to every results file. On a machine that received a copy of the
working tree (a lent GPU box), the caller passes the commit in through SUITE_GIT_COMMIT /
SUITE_GIT_DIRTY.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from harness import machine

REPO_ROOT = Path(__file__).resolve().parent.parent

# Libraries whose versions can change a number in this suite.
TRACKED_PACKAGES = (
    "torch",
    "numpy",
    "pandas",
    "cupy-cuda13x",
    "cupy-cuda12x",
    "cuda-python",
    "triton",
    "torch-geometric",
    "transformers",
    "dgl",
    "snakemake",
    "matplotlib",
)


def _git(*args: str, cwd: Path = REPO_ROOT) -> str | None:
    try:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (subprocess.SubprocessError, OSError):
        return None


def git_state() -> dict:
    """The commit measured. SUITE_GIT_COMMIT, when set, wins over git: whoever copied the tree to
    the measuring machine knows what they sent, while a .git copied along with it can be stale
    (the H200 copies carried the session's first commit, whatever was sent later)."""
    if "SUITE_GIT_COMMIT" in os.environ:
        return {
            "commit": os.environ["SUITE_GIT_COMMIT"],
            "dirty": {"1": True, "0": False}.get(os.environ.get("SUITE_GIT_DIRTY", ""), None),  # None: not said
            "source": "environment (SUITE_GIT_COMMIT, set by whoever copied the tree)",
        }
    commit = _git("rev-parse", "HEAD")
    if commit is not None:
        status = _git("status", "--porcelain", "--untracked-files=no")
        return {"commit": commit, "dirty": bool(status), "source": "git"}
    return {"commit": "unknown", "dirty": None, "source": "unavailable"}


# The folders whose files decide a measurement: the harness, the systems, the workloads and their
# parameters. Runs whose digests of these agree measured the same code whatever their commits say
# (a commit that touches only docs, analysis or figures moves the hash, not the code).
MEASURED_CODE = ("config", "harness", "systems", "workloads")
# This file writes the records and decides no number: a change to what a record holds must not make
# every earlier run count as other code.
RECORD_WRITER = "harness/provenance.py"


# A symbolic link is hashed as this tag and its target's name, so that a link and a file holding the
# same name differ; git stores a link as a blob of that name under this mode.
LINK_TAG = b"symbolic link\0"
GIT_LINK_MODE = "120000"


def _is_code(relative: Path) -> bool:
    """Measured code: not this record writer, not a cache or a build leftover (no hidden,
    ``__pycache__`` or ``*.egg-info`` folder on the path, not compiled Python)."""
    folders_ok = all(not (p.startswith(".") or p == "__pycache__" or p.endswith(".egg-info")) for p in relative.parts)
    return folders_ok and relative.suffix not in (".pyc", ".pyo") and relative.as_posix() != RECORD_WRITER


def _digest(files: Iterable[tuple[str, bytes]]) -> str:
    total = hashlib.sha256()
    for path, data in sorted(files):
        total.update(path.encode() + b"\0" + hashlib.sha256(data).digest())
    return total.hexdigest()


def code_digest(root: Path = REPO_ROOT) -> str:
    """sha256 of the measured code as it is on disk: every file under MEASURED_CODE, by its path
    and contents. It names what ran even where the tree was dirty or copied without its git. A
    symbolic link counts as its target's name, as git stores it, and is not followed."""
    files = []
    for folder in MEASURED_CODE:
        for parent, folders, names in os.walk(root / folder):  # does not descend into linked folders
            for name in names + [f for f in folders if (Path(parent) / f).is_symlink()]:
                path = Path(parent) / name
                relative = path.relative_to(root)
                if not _is_code(relative):
                    continue
                if path.is_symlink():
                    files.append((relative.as_posix(), LINK_TAG + os.readlink(path).encode()))
                elif path.is_file():
                    files.append((relative.as_posix(), path.read_bytes()))
    return _digest(files)


def code_digest_at(commit: str, root: Path = REPO_ROOT) -> str | None:
    """:func:`code_digest` of ``commit``'s tree, read from the git repository at ``root``; None
    where git, the commit or one of its files is missing (a copy without history, a shallow or a
    partial clone)."""
    listing = _git("ls-tree", "-r", "-z", "--full-tree", commit, "--", *MEASURED_CODE, cwd=root)
    if listing is None:
        return None
    entries = [line.split("\t", 1) for line in listing.split("\0") if line]
    paths = [(path, meta.split()) for meta, path in entries]  # meta: "<mode> <type> <sha>"
    paths = [(path, mode, sha) for path, (mode, kind, sha) in paths if kind == "blob" and _is_code(Path(path))]
    try:
        blobs = subprocess.run(
            ["git", "cat-file", "--batch"],
            cwd=root,
            input="".join(f"{sha}\n" for *_, sha in paths).encode(),
            capture_output=True,
            timeout=60,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    files, at = [], 0
    for path, mode, _ in paths:  # each answer: "<sha> blob <size>\n<contents>\n", or "<sha> missing\n"
        header_end = blobs.index(b"\n", at)
        header = blobs[at:header_end].split()
        if len(header) != 3:
            return None
        size = int(header[2])
        data = blobs[header_end + 1 : header_end + 1 + size]
        files.append((path, LINK_TAG + data if mode == GIT_LINK_MODE else data))
        at = header_end + 1 + size + 1
    return _digest(files)


def package_versions(extra: tuple[str, ...] = ()) -> dict[str, str]:
    """Installed versions of TRACKED_PACKAGES and of ``extra`` (a topic's own); absent ones left out."""
    versions = {}
    for name in dict.fromkeys(TRACKED_PACKAGES + tuple(extra)):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def cuda_state() -> dict:
    """CUDA runtime as torch sees it; imported lazily so CPU-only tools stay fast."""
    try:
        import torch
    except ImportError:
        return {"available": False}
    state = {"available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
    if state["available"]:
        props = torch.cuda.get_device_properties(0)
        state.update(
            device_count=torch.cuda.device_count(),
            compute_capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
        )
    return state


def collect(scale: str, packages: tuple[str, ...] = (), **extra) -> dict:
    """Everything needed to say where, when and how a number was measured; ``packages``: the
    libraries besides TRACKED_PACKAGES whose versions can change this topic's numbers."""
    return {
        "date_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "scale": scale,
        "git": git_state(),
        "code": {"digest": code_digest(), "folders": list(MEASURED_CODE), "source": "the files on disk"},
        "machine": machine.describe().as_dict(),
        "cuda": cuda_state(),
        "python": sys.version.split()[0],
        "packages": package_versions(packages),
        "command": sys.argv,
        **extra,
    }
