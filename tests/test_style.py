"""The suite's one look (analysis/style.py): every registered variant has its own colour within its
registry, ids read as plain words, and a figure with an empty panel or too many panels is refused."""

import matplotlib

matplotlib.use("Agg")

import pytest

from analysis import style
from harness.errors import UserError
from systems.pytorch_direct.gather_variants import GATHER_VARIANTS
from systems.rgnn.forms import FORMS
from systems.ssdtrain import POLICIES, STORES


@pytest.mark.parametrize(
    "names, table",
    [
        (GATHER_VARIANTS.names(), style.GATHER_VARIANTS),
        (FORMS.names(), style.RELATIONAL_FORMS),
        (POLICIES.names(), style.OFFLOAD_POLICIES),
    ],
    ids=["gather variants", "relational forms", "offload policies"],
)
def test_every_registered_variant_has_a_colour_of_its_own_and_a_readable_name(names, table):
    assert set(names) <= set(table), f"no style for {sorted(set(names) - set(table))}"
    colours = [table[n][0] for n in names]
    assert len(set(colours)) == len(colours), "two variants of one registry share a colour"
    assert all(style.readable(n) != n or n in ("dense", "planner", "recompute") for n in names)


def test_stores_have_markers_and_models_differ_by_marker_and_hatch_only():
    assert set(STORES.names()) <= set(style.STORE_MARKERS)
    assert len(set(style.MODEL_MARKERS.values())) == len(style.MODEL_MARKERS)
    assert len(set(style.MODEL_HATCHES.values())) == len(style.MODEL_HATCHES)


def test_a_name_in_two_registries_keeps_one_colour_and_an_unseen_one_is_stable():
    assert (
        style.color("cpu_gather")
        == style.GATHER_VARIANTS["cpu_gather"][0]
        == style.GNN_TRAINING_VARIANTS["cpu_gather"][0]
    )
    assert style.style("my_new_store") == style.style("my_new_store")
    assert style.style("my_new_store")[1] == "-."
    assert style.readable("my_new_store") == "my_new_store"  # a user's own id stays recognisable


@pytest.mark.parametrize(
    "name, long, short",
    [
        ("llama-8192x4-s1024b4", "Llama, hidden 8192, 4 layers, seq 1024, batch 4", "Llama 8192x4, seq 1024, batch 4"),
        (
            "gpt2-8192x4-s1024b16",
            "GPT-2, hidden 8192, 4 layers, seq 1024, batch 16",
            "GPT-2 8192x4, seq 1024, batch 16",
        ),
        ("llama-paper-8192x4", "Llama, hidden 8192, 4 layers", "Llama 8192x4"),
        ("my model", "my model", "my model"),
    ],
)
def test_llm_model_ids_read_as_words(name, long, short):
    assert style.llm_model_label(name) == long
    assert style.llm_model_label(name, short=True) == short


def test_a_figure_with_an_empty_panel_is_refused_and_a_full_one_saved(tmp_path):
    fig, (full, empty) = style.panels(2)
    full.plot([0, 1], [2, 3])
    empty.set_title("nothing here")
    style.reference_line(empty, 1.0, "a ceiling", kind="ceiling")  # a reference line alone is no data
    with pytest.raises(UserError, match="nothing here"):
        style.save(fig, tmp_path / "f.png")
    assert not (tmp_path / "f.png").exists()
    empty.bar([0], [1.5])
    assert style.save(fig, tmp_path / "f.png") == tmp_path / "f.png"
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"


def test_more_panels_than_a_reader_takes_in_are_refused():
    with pytest.raises(UserError, match="1 to 6 panels"):
        style.panels(7)
    with pytest.raises(UserError, match="1 to 6 panels"):
        style.mosaic([["a", "b", "c", "d"], ["e", "f", "g", "h"]], 8, 4)


def test_supporting_figures_are_named_beside_the_figure_even_under_a_temporary_name(tmp_path):
    assert style.supporting_path(tmp_path / "topic-h200.png", "ablation") == tmp_path / "topic-h200-ablation.png"
    temporary = tmp_path / ".topic-h200.tmp123.png"
    assert style.supporting_path(temporary, "times_1") == tmp_path / ".topic-h200-times_1.tmp123.png"
    with pytest.raises(UserError):
        style.supporting_path(tmp_path / "topic-h200.png", "Bad Name")
