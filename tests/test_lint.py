"""The code stays lint-clean and formatted: ruff (configured in pyproject.toml) and snakefmt.

`make lint` runs the same checks plus `snakemake --lint` (which tests/test_workflow.py runs)."""

import shutil
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

CHECKS = {
    "ruff check": [sys.executable, "-m", "ruff", "check", "--no-cache", "."],
    "ruff format": [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."],
    "snakefmt": ["snakefmt", "--check", "Snakefile", "workflow/rules"],
}


@pytest.mark.parametrize("name", CHECKS)
def test_lint_and_format_are_clean(name):
    argv = CHECKS[name]
    if argv[0] == "snakefmt":
        found = shutil.which("snakefmt", path=str(REPO_ROOT / ".venv" / "bin")) or shutil.which("snakefmt")
        if found is None:
            pytest.skip("snakefmt is not installed here (envs/requirements-*.txt install it)")
        argv = [found, *argv[1:]]
    elif subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True).returncode != 0:
        pytest.skip("ruff is not installed here (envs/requirements-*.txt install it)")
    result = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, (
        f"{name} found problems (run `make lint`):\n{result.stdout[-3000:]}{result.stderr[-2000:]}"
    )
