"""The house rules that keep a new technique one file away: layers import downward only
(harness <- systems <- workloads <- analysis), and nothing parses variant names back into parts."""

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAYERS = ("harness", "systems", "workloads", "analysis")  # each may import only those before it


def imported_packages(path: Path) -> set[str]:
    """Top-level packages ``path`` imports (absolute imports only; the suite uses no relative ones)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_imports_only_the_layers_below_it(layer):
    above = set(LAYERS[LAYERS.index(layer) + 1 :])
    wrong = {
        str(path.relative_to(REPO)): sorted(imported_packages(path) & above)
        for path in sorted((REPO / layer).rglob("*.py"))
        if imported_packages(path) & above
    }
    assert not wrong, f"{layer}/ imports layers above it: {wrong}"


# Composite variant names parsed back (`offload_all_<store>` -> store) are what structured columns
# replace: a part or a notebook that needs the store reads the `store` column.
NAMES = r"(variant|store|policy|form)\w*(\"\])?(\.str)?"
PARSING = re.compile(NAMES + r"\.(removeprefix|removesuffix|startswith|endswith)\(")


def test_no_part_or_notebook_parses_a_variant_name():
    files = sorted((REPO / "analysis").glob("*.py")) + sorted((REPO / "workloads").glob("*/parts.py"))
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if PARSING.search(line)
    ]
    assert not found, "variant names parsed back:\n" + "\n".join(found)
