"""The words a rendered figure shows (titles, axis labels, tick labels, legend entries, annotations),
recorded when the notebook saves its figure, so a test can ask whether a variant made it into the
picture without reading pixels.

``analysis.render`` calls :func:`install` in the kernel before the notebook's own cells; the record
is written beside the executed notebook as ``<executed>.text.json``: a list of strings per axes;
a supporting figure's (``analysis.style.save(fig, figure, what)``) as ``<executed>-<what>.text.json``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path


def shown_text(fig) -> list[list[str]]:
    """Every visible string of ``fig``, one list per axes (the figure's own titles first)."""
    own = [t.get_text() for t in fig.texts]  # suptitle and supxlabel/supylabel are among them
    own += [t.get_text() for legend in fig.legends for t in (legend.get_title(), *legend.get_texts())]
    panels = [[w for w in own if w]]
    for ax in fig.axes:
        words = [ax.get_title(loc) for loc in ("left", "center", "right")]
        words += [ax.get_xlabel(), ax.get_ylabel()]
        words += [t.get_text() for t in ax.get_xticklabels() + ax.get_yticklabels()]
        words += [t.get_text() for t in ax.texts]
        legend = ax.get_legend()
        if legend is not None:
            words += [t.get_text() for t in (legend.get_title(), *legend.get_texts())]
        panels.append([w for w in words if w])
    return panels


def record_of(figure_path: str, record_path: str, saved: str) -> Path | None:
    """Where the words of the figure saved to ``saved`` are recorded: ``record_path`` for the
    figure itself, ``<record stem>-<what>.text.json`` for its supporting figure ``what``, None for
    any other file."""
    target, saved = Path(os.path.abspath(figure_path)), Path(os.path.abspath(saved))
    if saved == target:
        return Path(record_path)
    stem, dot, temporary = target.stem.partition(".tmp")
    found = re.fullmatch(re.escape(stem) + r"-([a-z0-9_]+)" + re.escape(dot + temporary + target.suffix), saved.name)
    if saved.parent != target.parent or not found:
        return None
    record = Path(record_path)
    return record.with_name(record.name.removesuffix(".text.json") + f"-{found[1]}.text.json")


def install(figure_path: str, record_path: str) -> None:
    """Record :func:`shown_text` of the figure saved to ``figure_path`` into ``record_path``, and
    of each of its supporting figures beside it (see :func:`record_of`)."""
    from matplotlib.figure import Figure

    save = Figure.savefig

    def recording_savefig(self, fname, *args, **kwargs):
        result = save(self, fname, *args, **kwargs)
        if isinstance(fname, (str, os.PathLike)):
            record = record_of(figure_path, record_path, fname)
            if record is not None:
                record.write_text(json.dumps(shown_text(self), indent=1))
        return result

    Figure.savefig = recording_savefig
