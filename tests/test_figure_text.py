"""The words of a saved figure, recorded for tests (analysis/figure_text.py), through a real render."""

import json

import pytest

from analysis.render import main

pytest.importorskip("jupytext", reason="notebook rendering needs jupytext (the CPU environment has it)")

NOTEBOOK = """# %% tags=["parameters"]
figure = summary = "none"
results = {}

# %%
from pathlib import Path
import matplotlib.pyplot as plt
fig, (a, b) = plt.subplots(1, 2)
a.bar(["alpha_variant", "beta"], [1, 2], label="bars")
a.set_title("Gather time")
a.set_ylabel("time (ms)")
a.legend()
b.plot([0, 1], [1, 0], label="my_new_store")
b.legend(title="stores")
fig.suptitle("A figure")
other = plt.figure()
other.text(0.5, 0.5, "not this figure")
other.savefig(Path(figure).with_name("other.png"))
fig.savefig(figure)
Path(summary).write_text("ok")
"""


def test_the_saved_figures_words_are_recorded_beside_the_executed_notebook(tmp_path):
    (tmp_path / "nb.py").write_text(NOTEBOOK)
    executed = tmp_path / "logs" / "nb.ipynb"
    main([str(tmp_path / "nb.py"), "--executed", str(executed), "--figure", str(tmp_path / "f.png")]
         + ["--summary", str(tmp_path / "f.md")])  # fmt: skip
    panels = json.loads(executed.with_suffix(".text.json").read_text())
    assert panels[0] == ["A figure"]
    assert {"alpha_variant", "beta", "Gather time", "time (ms)", "bars"} <= set(panels[1])
    assert {"my_new_store", "stores"} <= set(panels[2])
    assert "not this figure" not in json.dumps(panels)  # only the figure saved to `figure`


def test_a_failed_render_leaves_no_record_of_an_older_figure(tmp_path):
    executed = tmp_path / "nb.ipynb"
    record = executed.with_suffix(".text.json")
    record.write_text("[]")
    (tmp_path / "nb.py").write_text('# %% tags=["parameters"]\nfigure = summary = ""\n\n# %%\nraise ValueError("no")\n')
    with pytest.raises(SystemExit):
        main([str(tmp_path / "nb.py"), "--executed", str(executed), "--figure", str(tmp_path / "f.png")]
             + ["--summary", str(tmp_path / "f.md")])  # fmt: skip
    assert not record.exists()
