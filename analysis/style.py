"""One look for every figure of the suite.

A variant keeps one colour in every panel of every topic (``VARIANT_STYLE``, keyed by the name the
registries give it); models of a relational GNN differ by marker and hatch, never by colour, so a
colour always means a form. Titles and labels are plain words with units (``readable``,
``llm_model_label``, ``axis_label``); legends sit off the data (``legend_below``); re-runs show as
ranges (``ranges``); targets and ceilings are labelled lines (``reference_line``); words naming
a line sit in the margin beside it (``margin_label``, ``margin_labels``); log axes are ticked in
plain numbers (``log_ticks``); and a figure with an empty panel is refused when it is saved
(``save``), as is a figure of more than ``MAX_PANELS`` panels.
"""

from __future__ import annotations

import math
import re
import textwrap
import zlib
from pathlib import Path

from harness.errors import UserError

MAX_PANELS = 6  # a figure a reader takes in at once; more panels go to a supporting figure
DPI = 130

# variant -> (colour, line style), grouped by the registry the names come from. Within a group no
# two variants share a colour (tests/test_style.py); a name found in two registries means the same
# path in both (cpu_gather and all_in_gpu in feature gathering and in GNN training).
GATHER_VARIANTS = {  # systems/pytorch_direct/gather_variants: baselines in greys and black,
    # stock torch's zero-copy in pinks, the suite's zero-copy steps in distinct hues, bounds in purple
    "pageable": ("#a0a0a0", ":"),
    "cpu_gather": ("#000000", "-"),
    "cpu_gather_pipelined": ("#5c5c5c", "-."),
    "torch_uva": ("#e377c2", "-"),
    "torch_uva_sorted": ("#a6196b", "--"),
    "wholegraph": ("#d4a017", "-"),
    "all_in_gpu": ("#7b3294", "--"),
    "naive": ("#d62728", "-"),
    "aligned": ("#ff7f0e", "-"),
    "vectorized": ("#1f77b4", "-"),
    "vectorized_kernel": ("#8c564b", ":"),
    "sorted": ("#2ca02c", "-"),
    "hot_cache": ("#008080", "-"),  # teal: far from sorted's green, which it is drawn beside
    "split": ("#00bfff", "-"),
    "default": ("#f4a582", "-"),  # UnifiedTensor[idx]: the measured dispatch of the paths above
}
GNN_TRAINING_VARIANTS = {  # workloads/gnn_training: where features live and how they reach the GPU
    "cpu_gather": GATHER_VARIANTS["cpu_gather"],
    "all_in_gpu": GATHER_VARIANTS["all_in_gpu"],
    "uva_sampling": ("#e6550d", "-."),
    "zero_copy": GATHER_VARIANTS["vectorized"],  # the same zero-copy kernel as the gather's
    "zero_copy_overlap": ("#31a354", "-"),
    "cpu_gather_workers": ("#737373", "--"),  # the CPU baseline with loader workers: a grey by cpu_gather
    "pyg_neighbor_loader": ("#bdbdbd", "-."),  # PyG's own loader: a lighter grey of the CPU baselines
    "hot_cache": GATHER_VARIANTS["hot_cache"],
    "hot_cache_oracle": ("#7fbfbf", ":"),  # the hot cache filled by an oracle: an ideal, lighter
}
OFFLOAD_POLICIES = {  # systems/ssdtrain POLICIES: colour by policy, the store is the marker
    "keep": ("#000000", "-"),
    "recompute": ("#d62728", "-"),
    "save_on_cpu": ("#e377c2", "-"),
    "offload_all": ("#1f77b4", "-"),
    "offload_adaptive": ("#2ca02c", "-"),
    "planner": ("#ff7f0e", "-"),
    "torchtune_offload": ("#8c564b", "-"),  # a peer: torchtune's OffloadActivations
    "deepspeed_offload": ("#bcbd22", "-"),  # a peer: DeepSpeed's checkpointing, inputs on the host
    # On torch.compile'd blocks: a compiled policy is a tint of its eager one.
    "compiled_keep": ("#969696", "--"),
    "offload_all_compiled": ("#6baed6", "--"),
    "planned_compiled": ("#fdae6b", "--"),
    "torch_budget": ("#660088", "-"),  # torch.compile's activation_memory_budget, one point per budget
}
STORE_MARKERS = {"host": "o", "file": "s", "kvikio": "D", "emulated": "v", None: "o"}
RELATIONAL_FORMS = {  # systems/rgnn/forms: a compiled form is a lighter tint of its eager form
    "pyg": ("#ff7f0e", "-"),
    "pyg_fast": ("#8c564b", "-"),
    "pyg_compiled": ("#ffbb78", "--"),
    "per_edge": ("#d62728", "-"),
    "per_edge_compiled": ("#ff9896", "--"),
    "segment_mm": ("#1f77b4", "-"),
    "grouped_mm": ("#2ca02c", "-"),
    "grouped_mm_compiled": ("#98df8a", "--"),
    "dense": ("#7f7f7f", "-"),
    "dense_compiled": ("#c7c7c7", "--"),
    # Hector's generated layers: four hues a reader tells apart, the headline the darkest.
    "hector_unopt": ("#cc99dd", "-"),
    "hector_compact": ("#01665e", "-"),
    "hector_reorder": ("#e6ab02", "-"),  # gold: told apart from pyg_compiled's light orange
    "hector_best": ("#40004b", "-"),
    "hector_best_tf32": ("#e7298a", "--"),  # tensor cores: a labelled, less exact variant
}
REGISTRIES = {
    "gather variants": GATHER_VARIANTS,
    "GNN training variants": GNN_TRAINING_VARIANTS,
    "offload policies": OFFLOAD_POLICIES,
    "relational forms": RELATIONAL_FORMS,
}
VARIANT_STYLE = {name: look for registry in REGISTRIES.values() for name, look in registry.items()}
# Emulated SSDs in the offloading figures: the bandwidth is written beside the marker, and these
# blues (slowest lightest) draw their bandwidth lines.
EMULATED_RAMP = ["#9ecae1", "#6baed6", "#3182bd", "#08519c", "#08306b"]

# Relational GNN models: told apart by marker and hatch, so that colour stays the form's.
MODEL_MARKERS = {"rgcn": "o", "rgat": "^", "hgt": "s", "compgcn": "D"}
MODEL_HATCHES = {"rgcn": "", "rgat": "//", "hgt": "..", "compgcn": "xx"}
MODE_LINESTYLES = {"inference": "-", "training": "--"}

# Plain words for the registries' ids. A name not here (a user's own entry) is shown as it is.
READABLE = {
    # feature gathering and GNN training
    "pageable": "pageable copy",
    "cpu_gather": "CPU gather + copy",
    "cpu_gather_pipelined": "CPU gather, pipelined",
    "torch_uva": "torch UVA",
    "torch_uva_sorted": "torch UVA, sorted",
    "wholegraph": "WholeGraph",
    "all_in_gpu": "all in GPU (bound)",
    "naive": "zero-copy, naive",
    "aligned": "zero-copy, aligned",
    "vectorized": "zero-copy, vectorized",
    "vectorized_kernel": "vectorized kernel alone",
    "sorted": "zero-copy, sorted",
    "hot_cache": "zero-copy + hot cache",
    "hot_cache_oracle": "zero-copy + oracle hot cache (ideal)",
    "cpu_gather_workers": "CPU gather in loader workers",
    "pyg_neighbor_loader": "PyG NeighborLoader",
    "split": "zero-copy, split",
    "default": "UnifiedTensor[idx]",
    "uva_sampling": "UVA sampling",
    "zero_copy": "zero-copy",
    "zero_copy_overlap": "zero-copy, overlapped",
    # offloading policies and stores
    "keep": "keep all",
    "recompute": "recompute",
    "save_on_cpu": "torch save_on_cpu",
    "offload_all": "offload all",
    "offload_adaptive": "offload adaptive",
    "planner": "planner",
    "torchtune_offload": "torchtune offload",
    "deepspeed_offload": "DeepSpeed offload",
    "compiled_keep": "keep all, compiled",
    "offload_all_compiled": "offload all, compiled",
    "planned_compiled": "planner, compiled",
    "torch_budget": "torch activation budget",
    "host": "host memory",
    "file": "file (O_DIRECT)",
    "kvikio": "file (KvikIO)",
    # relational forms and models
    "pyg": "PyG",
    "pyg_fast": "PyG fast",
    "pyg_compiled": "PyG, compiled",
    "per_edge": "per-edge",
    "per_edge_compiled": "per-edge, compiled",
    "segment_mm": "segment MM",
    "grouped_mm": "grouped MM",
    "grouped_mm_compiled": "grouped MM, compiled",
    "dense": "dense",
    "dense_compiled": "dense, compiled",
    "hector_unopt": "Hector, no passes",
    "hector_compact": "Hector, compact",
    "hector_reorder": "Hector, reorder",
    "hector_best": "Hector, all passes",
    "hector_best_tf32": "Hector, all passes, TF32",
    "rgcn": "RGCN",
    "rgat": "RGAT",
    "hgt": "HGT",
    "compgcn": "CompGCN",
}
FAMILIES = {"llama": "Llama", "gpt2": "GPT-2", "bert": "BERT", "t5": "T5", "mistral": "Mistral", "qwen2": "Qwen2"}
# Column names of the results tables -> axis labels with their units.
AXIS_LABELS = {
    "row_bytes": "row size (bytes)",
    "table_bytes": "table size (GiB)",
    "batch_rows": "rows per gather",
    "threads": "CPU threads",
    "max_threads": "thread cap of the gather",
    "window_bytes": "window size (KiB)",
    "bandwidth": "bandwidth (GB/s)",
    "time": "time per call (ms)",
    "epoch_time": "epoch time (s)",
    "micro_batch": "micro-batch (sequences)",
    "activation_peak": "activation memory peak (GiB)",
    "activation_bytes": "activation memory held (GiB)",
    "intermediate_memory": "intermediate memory (MiB)",
}

# A variant this module has never seen (a user's new entry) still gets a colour, the same in every
# figure and every run: picked from these by a checksum of its name (not Python's hash(), which
# changes per process), drawn dash-dotted so it reads as "not one of the suite's own". Chosen, one
# at a time, as far as could be (CIELAB distance >= 28) from every colour above and each other, so
# that a new entry is never drawn in a colour the eye takes for one of the suite's variants.
UNSEEN_PALETTE = [
    "#0000ff", "#ff00ff", "#0165fc", "#3c4d03", "#8a2be2", "#964e02", "#d648d7", "#1e90ff",
    "#800000", "#8e7618",
]  # fmt: skip


def style(variant: str) -> tuple[str, str]:
    """(colour, line style) of ``variant``; stable for variants not listed above."""
    if variant in VARIANT_STYLE:
        return VARIANT_STYLE[variant]
    return UNSEEN_PALETTE[zlib.crc32(variant.encode()) % len(UNSEEN_PALETTE)], "-."


def color(variant: str) -> str:
    return style(variant)[0]


# An offload store this module has never seen (a user's own) gets a marker none of the suite's
# stores has: the one a checksum of its name picks, or where an unseen store drawn before took
# that one, the next free one, so that two of them in one figure never share a marker.
UNSEEN_MARKERS = ["P", "X", "*", "h", "p", "<", ">", "d"]
_UNSEEN_STORES: dict[str, str] = {}


def store_marker(store) -> str:
    """The marker of an offload store in the offloading figures (None: a policy without one)."""
    if store in STORE_MARKERS:
        return STORE_MARKERS[store]
    name = str(store)
    if name not in _UNSEEN_STORES:
        start = zlib.crc32(name.encode()) % len(UNSEEN_MARKERS)
        taken = set(_UNSEEN_STORES.values())
        free = [UNSEEN_MARKERS[(start + i) % len(UNSEEN_MARKERS)] for i in range(len(UNSEEN_MARKERS))]
        _UNSEEN_STORES[name] = next((m for m in free if m not in taken), free[0])  # past 8: shared again
    return _UNSEEN_STORES[name]


# The labels registry entries give (``Entry.label``), by name, once a notebook has read them from
# its registry (entry_labels): how a user's own entry, one from SUITE_PLUGINS, is named in figures.
ENTRY_LABELS: dict[str, str] = {}


def entry_labels(registry) -> None:
    """Take the labels of ``registry``'s entries, for :func:`readable`."""
    ENTRY_LABELS.update({entry.name: entry.label for entry in registry if entry.label})


def readable(name, label: str = "") -> str:
    """Plain words for a registry id (``hector_best`` -> "Hector, all passes"); for a name the
    suite does not know, ``label`` (the label its registry entry gives, if any: given here, or read
    by :func:`entry_labels`) or the name as it is, so that a user's own entry is recognisable."""
    return READABLE.get(str(name), label or ENTRY_LABELS.get(str(name)) or str(name))


def axis_label(column: str, scale: str = "") -> str:
    """The axis label of a results column, with its unit, and ", log scale" for ``scale="log"``."""
    text = AXIS_LABELS.get(column, column.replace("_", " "))
    return f"{text}, log scale" if scale == "log" else text


_LLM_MODEL = re.compile(r"(?P<family>[a-z0-9]+)-(?:(?P<preset>[a-z]+)-)?(?P<hidden>\d+)x(?P<layers>\d+)"
                        r"(?:-s(?P<sequence>\d+)b(?P<batch>\d+))?")  # fmt: skip


def llm_model_label(name: str, short: bool = False) -> str:
    """``llama-8192x4-s1024b4`` -> "Llama, hidden 8192, 4 layers, seq 1024, batch 4" (``short``:
    "Llama 8192x4, seq 1024, batch 4"); a name of another form is returned as it is."""
    m = _LLM_MODEL.fullmatch(name)
    if not m:
        return name
    family = FAMILIES.get(m["family"], m["family"])
    if short:
        text = f"{family} {m['hidden']}x{m['layers']}"
    else:
        text = f"{family}, hidden {m['hidden']}, {m['layers']} layers"
    if m["sequence"]:
        text += f", seq {m['sequence']}, batch {m['batch']}"
    return text


def apply() -> None:
    """The suite's matplotlib defaults: readable sizes at 100 %, light grids, no top/right spines."""
    import matplotlib as mpl

    mpl.rcParams.update(
        {
            "font.size": 9,
            "axes.titlesize": 9.5,
            "axes.labelsize": 9,
            "xtick.labelsize": 8,
            "ytick.labelsize": 8,
            "legend.fontsize": 8,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "hatch.linewidth": 0.6,
            "savefig.dpi": DPI,
        }
    )


def panels(count: int, cols: int = 3, width: float = 4.6, height: float = 3.4, **kwargs):
    """A figure of ``count`` panels (at most ``MAX_PANELS``), ``cols`` per row; spare cells removed."""
    import matplotlib.pyplot as plt

    if not 1 <= count <= MAX_PANELS:
        raise UserError(f"a figure holds 1 to {MAX_PANELS} panels, not {count}: split it into supporting figures")
    apply()
    cols = min(cols, count)
    rows = -(-count // cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(width * cols, height * rows), squeeze=False, layout="constrained", **kwargs
    )
    axes = list(axes.flat)
    for ax in axes[count:]:
        ax.remove()
    return fig, axes[:count]


def legend_below(fig, entries: dict, columns: int = 5, title: str | None = None) -> None:
    """One legend for the whole figure, in a row under the panels (``entries``: label -> handle,
    in the order given); ``save`` makes room for it."""
    if not entries:
        return
    fig.legend(
        list(entries.values()),
        list(entries.keys()),
        loc="outside lower center",
        ncol=min(columns, len(entries)),
        frameon=False,
        title=title,
    )


def collect_legend(axes, into: dict | None = None) -> dict:
    """Label -> handle of every labelled artist of ``axes``, first seen kept (for ``legend_below``)."""
    into = {} if into is None else into
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if not label.startswith("_"):
                into.setdefault(label, handle)
    return into


def ranges(ax, x, values, color, marker="o", label=None, size=5, **kwargs) -> None:
    """One point per x at its first value (the committed run) and a bar over the range of all
    (every re-run); ``values`` holds one list per x."""
    import numpy as np

    x = np.asarray(x, dtype=float)
    first = np.array([v[0] for v in values], dtype=float)
    low = np.array([min(v) for v in values], dtype=float)
    high = np.array([max(v) for v in values], dtype=float)
    ax.errorbar(
        x,
        first,
        yerr=[first - low, high - first],
        fmt=marker,
        color=color,
        markersize=size,
        capsize=2.5,
        elinewidth=1,
        label=label,
        **kwargs,
    )


def reference_line(ax, y: float, text: str, kind: str = "target") -> None:
    """A labelled horizontal line: ``kind`` "target" (dashed: a number to reach, e.g. a paper's),
    "ceiling" (dotted: a number nothing beats on this machine) or "parity" (solid: the baseline's
    level). The label sits in the margin right of the panel, where no data is."""
    linestyle = {"target": "--", "ceiling": ":", "parity": "-"}[kind]
    ax.axhline(y, color="#444444", linestyle=linestyle, linewidth=1, zorder=1.5, label="_ref")
    margin_label(ax, y, text)


def margin_label(ax, y: float, text: str, color: str = "#444444", shift: float = 0.0, leader: bool = False) -> None:
    """Words in the margin right of the panel at height ``y`` (data units), where no data is;
    ``shift`` points higher (negative: lower), with a short leader line to ``y`` where ``leader``."""
    ax.annotate(
        text,
        (1.0, y),
        xycoords=("axes fraction", "data"),
        xytext=(14 if leader else 4, shift),  # a leader needs room to show
        textcoords="offset points",
        ha="left",
        va="center",
        fontsize=7.5,
        color=color,
        annotation_clip=False,
        # relpos: the leader meets the words at their left end, not their middle (from which it
        # crossed the words of a neighbour pushed below).
        arrowprops=dict(arrowstyle="-", color=color, linewidth=0.6, shrinkA=1, shrinkB=0, relpos=(0, 0.5))
        if leader
        else None,
    )


def margin_labels(ax, items, gap: float = 12.0) -> None:
    """Writes each (y, text, colour) of ``items`` right of the panel at its line's height, moved
    apart to ``gap`` points where lines run closer, a short leader to its line. Needs the panel's
    final height (``fig.draw_without_rendering()`` first)."""
    if not items:
        return
    pt = ax.figure.dpi / 72
    items = sorted(items, key=lambda item: item[0])
    heights = [ax.transData.transform((1, y))[1] for y, _, _ in items]
    placed = list(heights)
    for i in range(1, len(placed)):
        placed[i] = max(placed[i], placed[i - 1] + gap * pt)
    overshoot = (placed[-1] - heights[-1]) / 2  # centre the pushed stack on the lines it names
    # ... but not above the panel's top, where the panel's title is
    overshoot = max(overshoot, placed[-1] - ax.transAxes.transform((0, 1))[1])
    placed = [h - overshoot for h in placed]
    for i in range(len(placed) - 2, -1, -1):
        placed[i] = min(placed[i], placed[i + 1] - gap * pt)
    for (y, text, colour), height, at in zip(items, heights, placed):
        margin_label(ax, y, text, colour, shift=(at - height) / pt, leader=True)


# Which multiples of each power of ten a log axis is ticked at (``log_ticks``), by the decades it
# spans: (under this many decades, these multiples), narrowest first; an axis wider than every
# entry is ticked at the powers of ten alone. None: evenly spaced round numbers, for an axis so
# narrow that multiples of its powers of ten would give it one tick or none.
LOG_STEPS = ((0.4, None), (0.9, (1, 2, 3, 5, 7)), (3.0, (1, 2, 5)))


def log_ticks(axis, steps=LOG_STEPS, minor: bool = False, grouped: bool = False, suffix: str = "") -> None:
    """Ticks a reader can read on the log-scale ``axis`` (``ax.xaxis`` or ``ax.yaxis``), picked by
    ``steps`` for the decades its limits span now (set them first), written as plain numbers
    ("0.5", "20", "1000"; ``grouped``: "1,000") followed by ``suffix``; ``minor``: unlabelled
    minor ticks kept between them."""
    from matplotlib import ticker

    low, high = axis.get_view_interval()
    decades = abs(math.log10(high / low))
    subs = next((subs for widest, subs in steps if decades < widest), (1,))
    if subs is None:
        round_numbers = ticker.MaxNLocator(8, steps=[1, 2, 5, 10]).tick_values(low, high)
        axis.set_major_locator(ticker.FixedLocator([v for v in round_numbers if v > 0]))
    else:
        # numticks: every decade in range keeps its ticks. Left to itself, matplotlib thins out the
        # decades of a long range to fit the axis, and a locator of several multiples then draws none.
        axis.set_major_locator(ticker.LogLocator(subs=subs, numticks=30))

    def plain(value, _position) -> str:
        return (f"{value:,.0f}" if grouped and value >= 1 else f"{value:g}") + suffix

    axis.set_major_formatter(ticker.FuncFormatter(plain))
    axis.set_minor_formatter(ticker.NullFormatter())
    if not minor:
        axis.set_minor_locator(ticker.NullLocator())


def empty_panels(fig) -> list[str]:
    """Titles (or positions) of the panels of ``fig`` that show no data: no line, bar, point or image."""
    empty = []
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible() or not ax.axison:
            continue  # a legend's or a note's own cell
        drawn = [a for a in ax.lines if len(a.get_xdata()) and not a.get_label().startswith("_ref")]
        drawn += [p for p in ax.patches if p.get_height() != 0 or p.get_width() != 0]
        drawn += [c for c in ax.collections if len(getattr(c, "get_offsets", lambda: [])()) or c.get_paths()]
        drawn += ax.images
        if not drawn:
            empty.append(ax.get_title() or f"panel {i + 1}")
    return empty


def supporting_path(figure: str | Path, what: str) -> Path:
    """Where the supporting figure ``what`` of a topic's figure goes: ``<topic>-<scale>-<what>.png``
    beside it (a render's temporary name keeps its temporary part last, see analysis/render.py)."""
    if not re.fullmatch(r"[a-z0-9_]+", what):
        raise UserError(f"a supporting figure is named in lower case, digits and '_', not {what!r}")
    figure = Path(figure)
    stem, dot, temporary = figure.stem.partition(".tmp")
    return figure.with_name(f"{stem}-{what}{dot}{temporary}{figure.suffix}")


def save(fig, figure: str | Path, what: str | None = None) -> Path:
    """Save ``fig`` as the topic's figure (``what`` None) or as its supporting figure ``what``,
    refusing one with an empty panel; the legend row under the panels is kept in the picture."""
    empty = empty_panels(fig)
    if empty:
        raise UserError(f"figure {what or 'main'} has panels with nothing drawn: {', '.join(empty)}")
    path = Path(figure) if what is None else supporting_path(figure, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def mosaic(layout: list[list[str]], width: float, height: float):
    """A figure of named panels (``matplotlib``'s subplot mosaic, at most ``MAX_PANELS`` names),
    laid out so that titles, labels and a legend row below never overlap."""
    import matplotlib.pyplot as plt

    names = {name for row in layout for name in row if name != "."}
    if not 1 <= len(names) <= MAX_PANELS:
        raise UserError(f"a figure holds 1 to {MAX_PANELS} panels, not {len(names)}: split it into supporting figures")
    apply()
    fig = plt.figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplot_mosaic(layout)


TITLE_CHARACTERS_PER_INCH = 12  # about what fits across an inch at the title's 10 pt


def title(fig, text: str, measured: str) -> None:
    """The figure's title: what it shows in plain words, then where and when it was measured, each
    wrapped to the figure's width (a long line would widen the saved figure beyond its panels)."""
    width = max(40, int(fig.get_figwidth() * TITLE_CHARACTERS_PER_INCH))
    lines = [
        textwrap.fill(line, width, break_on_hyphens=False) for part in (text, measured) for line in part.split("\n")
    ]
    fig.suptitle("\n".join(lines), fontsize=10)
