"""Executing a text-based notebook headless: parameters injected, failures reported in one line."""

import pytest

from analysis.render import main

pytest.importorskip("jupytext", reason="notebook rendering needs jupytext (the CPU environment has it)")

NOTEBOOK = """# %% tags=["parameters"]
value = "default"
out = "none"

# %%
from pathlib import Path
if value == "boom":
    raise ValueError("the notebook refused value=boom")
Path(out).write_text(value)
"""


@pytest.fixture
def notebook(tmp_path):
    path = tmp_path / "demo.py"
    path.write_text(NOTEBOOK)
    return path


def test_parameters_reach_the_notebook(notebook, tmp_path):
    out = tmp_path / "out.txt"
    main([str(notebook), "--executed", str(tmp_path / "run.ipynb"), "-p", "value=hello", "-p", f"out={out}"])
    assert out.read_text() == "hello"
    assert "Injected by analysis.render" in (tmp_path / "run.ipynb").read_text()


def test_failing_cell_is_one_line_and_executed_copy_is_kept(notebook, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(notebook), "--executed", str(tmp_path / "run.ipynb"), "-p", "value=boom"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "ValueError: the notebook refused value=boom" in err
    assert (tmp_path / "run.ipynb").exists()


def test_refuses_notebook_without_parameters_cell_and_bad_parameter(tmp_path, capsys):
    plain = tmp_path / "plain.py"
    plain.write_text("# %%\nx = 1\n")
    with pytest.raises(SystemExit):
        main([str(plain), "--executed", str(tmp_path / "run.ipynb")])
    assert "no cell tagged 'parameters'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(plain), "--executed", str(tmp_path / "run.ipynb"), "-p", "no-equals-sign"])
