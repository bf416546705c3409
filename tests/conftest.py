"""Test settings: GPU tests skip cleanly without a GPU, and with one they take turns across
pytest-xdist workers; tools write under the repo, not $HOME."""

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE = REPO_ROOT / ".cache"
for var, sub in (
    ("MPLCONFIGDIR", "matplotlib"),
    ("IPYTHONDIR", "ipython"),
    ("JUPYTER_CONFIG_DIR", "jupyter/config"),
    ("JUPYTER_DATA_DIR", "jupyter/data"),
    ("JUPYTER_RUNTIME_DIR", "jupyter/runtime"),
    ("CUPY_CACHE_DIR", "cupy"),
):
    os.environ.setdefault(var, str(CACHE / sub))
    Path(os.environ[var]).mkdir(parents=True, exist_ok=True)
os.environ.setdefault("SUITE_NO_PROGRESS", "1")


def copy_repository(root: Path) -> Path:
    """Copy the repository's files (tracked, and untracked but not ignored) into ``root``, without
    this machine's own results: a checkout as a user would clone it, plus uncommitted work."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    for name in filter(None, files):
        source = REPO_ROOT / name
        if source.is_file() and not name.startswith(("results/local/", "paper_figs/local/")):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    return root


def _gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


HAS_GPU = _gpu_available()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none here); run on the GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def file_digests(root: Path, outputs: tuple[str, ...]) -> dict[str, str]:
    """SHA-256 of every file under ``root`` except those under ``outputs`` (the workflow's
    outputs) and Python's caches: what a guide followed in a copy may not have changed."""
    digests = {}
    for path in root.rglob("*"):
        name = path.relative_to(root).as_posix()
        if path.is_file() and not name.startswith(outputs) and "__pycache__" not in name:
            digests[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


# --- what the pytest-xdist workers of one run share ------------------------------------------


def run_directory(tmp_path_factory) -> Path:
    """A directory shared by every pytest-xdist worker of this run (each worker's own temporary
    directory is ``<it>/popen-gwN``); without xdist, the run's temporary directory."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def taking_turns(lock_file: Path) -> Iterator[None]:
    """Hold ``lock_file``'s lock: the workers that ask for the same file run the block one at a
    time. A lock, not a test-distribution setting, so it holds however the tests are spread."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture
def scratch(request) -> Iterator[Path]:
    """A new folder on the repository's disk (O_DIRECT refuses tmpfs), under the ignored .scratch/,
    removed afterwards."""
    (REPO_ROOT / ".scratch").mkdir(exist_ok=True)
    prefix = f"{request.module.__name__.rsplit('.', 1)[-1].replace('_', '-')}-"
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=REPO_ROOT / ".scratch"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def gpu_tests_take_turns(request, tmp_path_factory):
    """GPU tests run one at a time across the workers: they share the GPU's memory, some
    measure it, and the multi-GPU ones take every GPU."""
    if not HAS_GPU or "gpu" not in request.keywords:
        yield
        return
    with taking_turns(run_directory(tmp_path_factory) / "gpu.lock"):
        yield


# --- what `make test` prints at the end -------------------------------------------------------


def skip_reason(report) -> str:
    """The reason a skipped test's report gives (``pytest.skip``'s message, or a skip marker's)."""
    longrepr = report.longrepr
    message = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return message.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter):
    """One line per skip reason with its count, most frequent first: `-rs` prints a line per test,
    hundreds of them on a machine without a GPU."""
    counts: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = skip_reason(report)
        counts[reason] = counts.get(reason, 0) + 1
    if not counts:
        return
    terminalreporter.section("skipped, by reason")
    for reason, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        terminalreporter.write_line(f"{count:6d}  {reason}")
