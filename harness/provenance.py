"""Provenance of a measurement run: which code, which machine, which software, when, what scale.

Written as a JSON record next to every results file. On a machine that received a copy of the
working tree (a lent GPU box), the caller passes the commit in through SUITE_GIT_COMMIT /
SUITE_GIT_DIRTY.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

from harness import code_digest, machine
from harness.errors import UserError

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


_DIRTY_WORDS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False, "": None}


def _dirty_from_environment() -> bool | None:
    """SUITE_GIT_DIRTY as a bool; None where it is not set (not said)."""
    word = os.environ.get("SUITE_GIT_DIRTY", "")
    if word.strip().lower() not in _DIRTY_WORDS:
        raise UserError(f"SUITE_GIT_DIRTY must be 1 or 0 (or true/false, yes/no), not {word!r}")
    return _DIRTY_WORDS[word.strip().lower()]


def shown(path: Path) -> str:
    """``path`` relative to the repository where it lies in it (the same on every checkout), else as given."""
    try:
        return Path(path).resolve().relative_to(REPO_ROOT.resolve()).as_posix()
    except ValueError:
        return str(path)


def git_state() -> dict:
    """The commit measured. SUITE_GIT_COMMIT, when set, wins over git: whoever copied the tree to
    the measuring machine knows what they sent, while a .git copied along with it can be stale
    (the H200 copies carried the session's first commit, whatever was sent later)."""
    dirty = _dirty_from_environment()  # refused when malformed, whether or not a commit is named
    if "SUITE_GIT_COMMIT" in os.environ:
        commit = os.environ["SUITE_GIT_COMMIT"]
        if not re.fullmatch(r"[0-9a-f]{7,64}", commit):  # a hash names a measurement: a typo would name none
            raise UserError(f"SUITE_GIT_COMMIT must be a commit hash (7 to 64 hex digits), not {commit!r}")
        return {
            "commit": commit,
            "dirty": dirty,
            "source": "environment (SUITE_GIT_COMMIT, set by whoever copied the tree)",
        }
    # The suite's own checkout only: a tree unpacked from a tarball inside another repository
    # would otherwise record that repository's commit.
    top = _git("rev-parse", "--show-toplevel")
    commit = _git("rev-parse", "HEAD") if top is not None and Path(top).resolve() == REPO_ROOT.resolve() else None
    if commit is not None:
        changed = _git("status", "--porcelain", "--untracked-files=no")
        # A file not added yet in the code or config folders (a new variant, a part) ran too.
        new_code = _git("status", "--porcelain", "--untracked-files=all", "--", *code_digest.MEASURED_CODE)
        # None: git could not say (a status that failed is no clean tree).
        dirty = None if changed is None or new_code is None else bool(changed) or bool(new_code)
        return {"commit": commit, "dirty": dirty, "source": "git"}
    return {"commit": "unknown", "dirty": None, "source": "unavailable"}


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


# The measured code as it was when the part started (harness.entry notes it before the part runs):
# a record says so where it changed during the run, since the digest is taken at its end.
_FILES_AT_START: dict[str, bytes] | None = None


def note_code_at_start() -> None:
    """Remember the measured code as it is now, for this process's record (``this_process``)."""
    global _FILES_AT_START  # one part per process: what its record compares against
    _FILES_AT_START = code_digest.files_on_disk(REPO_ROOT)


def code_record(topic: str | None, root: Path = REPO_ROOT, *, this_process: bool = False) -> dict:
    """The digest of the code this process measured (harness.code_digest): the topic's files as
    they are on disk. Listed beside it, where there are any: suite modules this process loaded that
    the topic's files leave out (none, where code_digest follows the imports right), files of the
    topic that changed while the process ran, and the plugins named in SUITE_PLUGINS with digests of
    their own. A record with either list counts as the same code as no other
    (analysis.common.same_code): its digest does not name all that ran; records with other plugins
    are other code. The lists are made only for ``this_process``: a process that ran the part and
    nothing else (``python -m workloads``), whose loaded modules are the part's."""
    files = code_digest.files_on_disk(root)
    try:
        scope = code_digest.topic_files(files, topic) if topic else set(files)
    except ValueError:  # not a topic of this suite: every measured file
        topic, scope = None, set(files)
    loaded = {
        path
        for module in (list(sys.modules.values()) if this_process else [])
        if (path := _suite_file(getattr(module, "__file__", None), root)) in files and path not in scope
    }
    record = {
        "digest": code_digest.digest({p: files[p] for p in scope}),
        "topic": topic,
        "files": len(scope),
        "source": "the files on disk",
    }
    noted = this_process and root == REPO_ROOT and _FILES_AT_START is not None
    start = _FILES_AT_START if noted else files
    changed = sorted(p for p in scope if start.get(p) != files.get(p))
    plugins = _plugin_digests()
    return (
        record
        | ({"loaded_outside_scope": sorted(loaded)} if loaded else {})
        | ({"changed_during_run": changed} if changed else {})
        | ({"plugins": plugins} if plugins else {})
    )


def _plugin_digests() -> dict[str, str]:
    """Each module named in SUITE_PLUGINS (out-of-tree entries: code that ran, outside the topic's
    digest) with a digest of its source (a package's: every .py file under it), or "not loaded"."""
    digests = {}
    for name in filter(None, (n.strip() for n in os.environ.get("SUITE_PLUGINS", "").split(","))):
        file = getattr(sys.modules.get(name), "__file__", None)
        if not file:
            digests[name] = "not loaded"
            continue
        file = Path(file)
        sources = sorted(file.parent.rglob("*.py")) if file.name == "__init__.py" else [file]
        digests[name] = code_digest.digest({f.relative_to(file.parent).as_posix(): f.read_bytes() for f in sources})
    return digests


def _suite_file(file: str | None, root: Path) -> str | None:
    if not file:
        return None
    try:
        return Path(file).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return None


# Thread settings a number depends on (a CPU part at 1 and at 2 threads differs only here).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def threads_state() -> dict:
    """The environment's thread settings and torch's thread counts when the record is written."""
    state = {name: os.environ[name] for name in THREAD_VARIABLES if name in os.environ}
    try:
        import torch
    except ImportError:
        return state
    return state | {"torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads()}


def collect(scale: str, packages: tuple[str, ...] = (), *, this_process: bool = False, **extra) -> dict:
    """Everything needed to say where, when and how a number was measured; ``packages``: the
    libraries besides TRACKED_PACKAGES whose versions can change this topic's numbers;
    ``this_process``: the record is of the process that ran the part alone (see code_record)."""
    return {
        "date_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "scale": scale,
        "git": git_state(),
        "code": code_record(extra.get("topic"), this_process=this_process),
        "machine": machine.describe().as_dict(),
        "cuda": cuda_state(),
        "threads": threads_state(),
        "python": sys.version.split()[0],
        "packages": package_versions(packages),
        "command": sys.argv,
        **extra,
    }
