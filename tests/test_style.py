"""The suite's one look (analysis/style.py): every registered variant has its own colour within its
registry, ids read as plain words, a figure with an empty panel or too many panels is refused, log
axes are ticked in plain numbers and labels in the margin never overlap; and the notebooks' shared
medians-with-bars plot (analysis/common.py)."""

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.text import Text

from analysis import style
from analysis.common import errorbars
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


def test_a_users_own_store_gets_a_marker_no_suite_store_has_and_its_registered_label():
    """A store the figures do not know is drawn with a marker of its own (the same in every run),
    never one of the suite's stores' markers, and named by the label its entry registered."""
    for store in ("my_nvme", "raid0", "cxl_memory"):
        marker = style.store_marker(store)
        assert marker not in style.STORE_MARKERS.values() and marker == style.store_marker(store)
    assert style.store_marker("file") == style.STORE_MARKERS["file"]
    # Two whose names' checksums pick the same marker are still told apart.
    assert style.store_marker("zlib_host") != style.store_marker("my_clone_store")
    assert style.readable("my_nvme", "NVMe RAID") == "NVMe RAID"
    assert style.readable("my_nvme") == "my_nvme" and style.readable("host", "ignored") == "host memory"


def test_a_name_in_two_registries_keeps_one_colour_and_an_unseen_one_is_stable():
    assert (
        style.color("cpu_gather")
        == style.GATHER_VARIANTS["cpu_gather"][0]
        == style.GNN_TRAINING_VARIANTS["cpu_gather"][0]
    )
    assert style.style("my_new_store") == style.style("my_new_store")
    assert style.style("my_new_store")[1] == "-."
    assert style.readable("my_new_store") == "my_new_store"  # a user's own id stays recognisable


def _lab(colour: str) -> tuple[float, float, float]:
    """CIELAB (D65) of a hex colour: distances there follow what the eye tells apart."""
    import matplotlib.colors

    def linear(c):
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = map(linear, matplotlib.colors.to_rgb(colour))
    x, y, z = (
        (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047,
        0.2126 * r + 0.7152 * g + 0.0722 * b,
        (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883,
    )
    f = lambda t: t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116  # noqa: E731
    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def test_a_new_entrys_colour_is_never_one_the_eye_takes_for_a_suite_variants():
    """The guide's own padded_bmm was drawn in #1f78b4 beside segment_mm's #1f77b4."""
    known = {colour for colour, _ in style.VARIANT_STYLE.values()}
    for i, colour in enumerate(style.UNSEEN_PALETTE):
        others = known | set(style.UNSEEN_PALETTE[:i] + style.UNSEEN_PALETTE[i + 1 :])
        nearest = min(others, key=lambda o: math.dist(_lab(colour), _lab(o)))
        assert math.dist(_lab(colour), _lab(nearest)) >= 25, (colour, nearest)
    assert style.color("padded_bmm") in style.UNSEEN_PALETTE


@pytest.mark.parametrize("registry", list(style.REGISTRIES))
def test_variants_drawn_together_in_one_line_style_are_colours_the_eye_tells_apart(registry):
    """A figure draws the variants of one registry side by side; two in the same line style must
    differ by hue or lightness a reader sees (CIELAB distance >= 28, as the unseen palette keeps;
    the gather's solid "split" and "hot_cache" were 25.2 apart). Variants of other line styles are
    told apart by the line as well (a dashed tint of a solid colour: a compiled form of its eager one)."""
    looks = list(style.REGISTRIES[registry].items())
    close = [
        (a, b, round(math.dist(_lab(look_a[0]), _lab(look_b[0])), 1))
        for i, (a, look_a) in enumerate(looks)
        for b, look_b in looks[i + 1 :]
        if look_a[1] == look_b[1] and look_a[0] != look_b[0] and math.dist(_lab(look_a[0]), _lab(look_b[0])) < 28
    ]
    assert not close, close


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


def log_axis_ticks(low, high, **options) -> tuple[list, list[str], int]:
    """The major ticks within ``low`` to ``high`` of a log y axis ticked by style.log_ticks, their
    labels, and how many minor ticks it has."""
    fig, ax = plt.subplots()
    ax.set_yscale("log")
    ax.set_ylim(low, high)
    style.log_ticks(ax.yaxis, **options)
    fig.draw_without_rendering()
    shown = [t for t in ax.yaxis.get_major_ticks() if low <= t.get_loc() <= high]
    minor = len(ax.yaxis.get_minorticklocs())
    plt.close(fig)
    return [t.get_loc() for t in shown], [t.label1.get_text() for t in shown], minor


@pytest.mark.parametrize(
    "low, high, ticks",
    [
        (0.55, 0.78, [0.55, 0.6, 0.65, 0.7, 0.75]),  # under 0.4 decades: evenly spaced round numbers
        (0.17, 0.79, [0.2, 0.3, 0.5, 0.7]),  # under 0.9: 1-2-3-5-7
        (0.137, 5.59, [0.2, 0.5, 1, 2, 5]),  # under 3: 1-2-5
        (0.775, 3120, [1, 10, 100, 1000]),  # wider: the powers of ten
        (1e-3, 1e12, [10.0**k for k in range(-3, 13)]),  # every decade, none thinned out
    ],
)
def test_a_log_axis_is_ticked_by_the_decades_it_spans_in_plain_numbers(low, high, ticks):
    shown, labels, minor = log_axis_ticks(low, high)
    assert shown == pytest.approx(ticks)
    assert labels == [f"{t:g}" for t in ticks]
    assert minor == 0


def test_log_ticks_take_a_callers_steps_minor_ticks_and_grouped_numbers():
    every_decade_one_two_five = ((math.inf, (1, 2, 5)),)
    shown, labels, minor = log_axis_ticks(0.74, 2000, steps=every_decade_one_two_five, minor=True)
    assert shown == pytest.approx([1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000])
    assert labels[-2:] == ["1000", "2000"]
    assert minor > 0  # drawn, unlabelled
    steps = ((1.6, (1, 2, 3, 5)), (3.2, (1, 2, 5)))
    assert log_axis_ticks(0.7, 18, steps=steps, suffix="x")[1] == ["1x", "2x", "3x", "5x", "10x"]
    assert log_axis_ticks(0.5, 20000, steps=steps, grouped=True)[1] == ["1", "10", "100", "1,000", "10,000"]


def test_margin_labels_of_lines_running_close_are_set_apart_and_never_overlap():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 100])
    ax.set_ylim(0, 100)
    fig.draw_without_rendering()  # the panel's final height, which the labels are spaced in
    crowded = [(50.0, "first line", "#000000"), (50.5, "second line", "#d62728"), (51.0, "third", "#1f77b4")]
    style.margin_labels(ax, [*crowded, (90.0, "far from the others", "#2ca02c")])
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    labels = {text.get_text(): text for text in ax.texts}
    boxes = {name: Text.get_window_extent(text, renderer) for name, text in labels.items()}  # the words alone
    names = list(boxes)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not boxes[a].overlaps(boxes[b]), f"{a!r} overlaps {b!r}"
    # The pushed labels keep the lines' order, and a label with room stays at its line's height.
    middles = [(boxes[name].y0 + boxes[name].y1) / 2 for name in ("first line", "second line", "third")]
    assert middles == sorted(middles)
    far = boxes["far from the others"]
    assert (far.y0 + far.y1) / 2 == pytest.approx(ax.transData.transform((0, 90.0))[1], abs=1.0)
    plt.close(fig)


def test_errorbars_draw_medians_by_x_with_interquartile_bars_in_the_look_asked_for():
    data = pd.DataFrame({"x": [4, 1, 2], "median": [3.0, 1.0, 2.0], "q25": [2.5, 0.5, 1.5], "q75": [4.0, 1.5, 2.5]})
    fig, ax = plt.subplots()
    errorbars(ax, data, "x", "plain")
    errorbars(ax, data, "x", "hollow", marker="s", markersize=4, fillstyle="none", linewidth=2.2, alpha=0.55)
    plain, hollow = (container.lines[0] for container in ax.containers)
    assert list(plain.get_xdata()) == [1, 2, 4] and list(plain.get_ydata()) == [1.0, 2.0, 3.0]
    assert (plain.get_marker(), plain.get_markersize(), plain.get_fillstyle()) == ("o", 3, "full")
    assert (hollow.get_marker(), hollow.get_markersize(), hollow.get_fillstyle()) == ("s", 4, "none")
    assert (hollow.get_linewidth(), hollow.get_alpha()) == (2.2, 0.55)
    bars = ax.containers[0].lines[2][0].get_segments()
    assert [(s[0][1], s[1][1]) for s in bars] == [(0.5, 1.5), (1.5, 2.5), (2.5, 4.0)]
    plt.close(fig)
