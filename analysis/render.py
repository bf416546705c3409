"""Execute a text-based (jupytext) analysis notebook headless, with parameters.

    python -m analysis.render analysis/ceilings.py --executed logs/x.ipynb -p machine=h200 -p scale=h200 \
        --results ceilings=results/h200/ceilings/disk-h200.csv ... --figure F.png --summary F.md

The notebook's cell tagged ``parameters`` holds defaults; the values given here are injected in a
cell right after it (the papermill convention): each ``-p`` as a string, ``results`` as a dict
from topic name to the list of results files (the notebook reads exactly these, never globs),
and ``figure``/``summary`` as the paths to write. The notebook writes to temporary paths beside
them, which replace the figure and summary only when every cell succeeded: a failed render
leaves the previous files as they were. The executed notebook, outputs included, is saved to
``--executed`` so a failed figure can be debugged cell by cell, and the words the saved figure
shows (titles, labels, ticks, legends) beside it as ``<executed>.text.json`` (analysis/figure_text.py).

A notebook may also save supporting figures, ``<figure stem>-<what>.png`` beside the figure
(analysis/style.py: ``save(fig, figure, what)``); they are replaced with the figure, and a
supporting figure the notebook no longer writes is removed, so the folder holds one render's set.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from harness.errors import UserError, exit_on_user_error
from harness.folders import refuse_unwritable

REPO_ROOT = Path(__file__).resolve().parent.parent


def _results(text: str) -> tuple[str, str]:
    topic, sep, path = text.partition("=")
    if not sep or not topic.isidentifier() or not path:
        raise argparse.ArgumentTypeError(f"expected TOPIC=FILE, got {text!r}")
    return topic, path


def _temporary(path: Path) -> Path:
    """A path beside ``path`` (same file system, so the final rename is atomic), same suffix."""
    return path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")


def _parameter(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


@exit_on_user_error
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--executed", type=Path, required=True, help="where to save the executed .ipynb")
    parser.add_argument(
        "-p",
        "--parameter",
        type=_parameter,
        action="append",
        default=[],
        help="NAME=VALUE (a string) injected after the 'parameters' cell",
    )
    parser.add_argument(
        "--results",
        type=_results,
        action="append",
        default=[],
        help="TOPIC=FILE, a results file the notebook reads (repeat for each)",
    )
    parser.add_argument(
        "--topic", action="append", default=[], help="a topic the notebook reads, in `results` even with no files"
    )
    parser.add_argument("--figure", type=Path, required=True, help="the figure to write (PNG)")
    parser.add_argument("--summary", type=Path, required=True, help="the summary table to write (Markdown)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell")
    args = parser.parse_args(argv)
    results: dict[str, list[str]] = {topic: [] for topic in args.topic}
    for topic, path in args.results:
        results.setdefault(topic, []).append(path)
    outputs = {"figure": args.figure, "summary": args.summary}
    for flag, path in (("--executed", args.executed), *((f"--{name}", path) for name, path in outputs.items())):
        refuse_unwritable(path.parent, f"{flag}'s folder")
    temporary = {name: _temporary(path) for name, path in outputs.items()}

    import jupytext
    import nbclient
    import nbformat

    if not args.notebook.exists():
        raise UserError(f"notebook {args.notebook} does not exist")
    nb = jupytext.read(args.notebook)
    tagged = [i for i, cell in enumerate(nb.cells) if "parameters" in cell.metadata.get("tags", [])]
    if not tagged:
        raise UserError(f"{args.notebook} has no cell tagged 'parameters'")
    injected = "\n".join(
        [f"{name} = {value!r}" for name, value in args.parameter]
        + [f"results = {results!r}"]
        + [f"{name} = {str(path)!r}" for name, path in temporary.items()]
    )
    figure_text = args.executed.with_suffix(".text.json").resolve()
    # A failed render leaves no record of an older figure (nor of its supporting figures).
    for old in [figure_text, *figure_text.parent.glob(f"{args.executed.stem}-*.text.json")]:
        old.unlink(missing_ok=True)
    injected += f"\nimport analysis.figure_text as _figure_text\n_figure_text.install(figure, {str(figure_text)!r})"
    nb.cells.insert(
        tagged[0] + 1,
        nbformat.v4.new_code_cell(
            "# Injected by analysis.render\n" + injected, metadata={"tags": ["injected-parameters"]}
        ),
    )
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}

    env_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    os.environ["PYTHONPATH"] = env_path  # the kernel is a child process; it must find the packages
    os.environ.setdefault("MPLBACKEND", "Agg")
    client = nbclient.NotebookClient(
        nb,
        timeout=args.timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(REPO_ROOT)}},
        # The kernel talks to this process over loopback only; its warning about that is noise.
        extra_arguments=["--IPKernelApp.log_level=ERROR"],
    )
    args.executed.parent.mkdir(parents=True, exist_ok=True)
    for path in outputs.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    figure_tmp = temporary["figure"]
    stem, _, tmp_suffix = figure_tmp.stem.partition(".tmp")
    # The supporting figures the notebook writes beside the figure, under temporary names too.
    supporting = lambda: sorted(figure_tmp.parent.glob(f"{stem}-*.tmp{tmp_suffix}{figure_tmp.suffix}"))  # noqa: E731
    try:
        client.execute()
    except BaseException as err:
        for path in [*temporary.values(), *supporting()]:
            path.unlink(missing_ok=True)
        nbformat.write(nb, args.executed)
        if not isinstance(err, nbclient.exceptions.CellExecutionError):
            raise
        print(
            f"error: notebook {args.notebook} failed{_fault(err.traceback, args.executed)}: {err.ename}: {err.evalue} "
            f"(executed copy: {args.executed}; {', '.join(map(str, outputs.values()))} left as they were)",
            file=sys.stderr,
        )
        raise SystemExit(1) from None
    nbformat.write(nb, args.executed)
    missing = [str(path) for name, path in outputs.items() if not temporary[name].exists()]
    if missing:
        for path in [*temporary.values(), *supporting()]:
            path.unlink(missing_ok=True)
        raise UserError(
            f"notebook {args.notebook} ran but wrote no {', '.join(missing)} (it must write the "
            "paths in its 'figure' and 'summary' parameters)"
        )
    final_stem = args.figure.stem
    written = {}
    for path in supporting():
        what = path.name[len(stem) + 1 :].partition(".tmp")[0]
        written[args.figure.with_name(f"{final_stem}-{what}{args.figure.suffix}")] = path
    for stale in args.figure.parent.glob(f"{final_stem}-*{args.figure.suffix}"):
        if stale not in written and re.fullmatch(re.escape(final_stem) + r"-[a-z0-9_]+\.png", stale.name):
            stale.unlink()
    for final, path in written.items():
        os.replace(path, final)
    for name, path in temporary.items():
        os.replace(path, outputs[name])


def _fault(traceback: str, executed: Path) -> str:
    """Where a notebook's error was raised, from the kernel's (coloured) traceback: the deepest
    frame in the suite's own files (an analysis module), else the notebook cell's line in the
    executed copy; as " at FILE:LINE", or "" where the traceback names neither."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", traceback)
    in_the_suite, in_a_cell = None, None
    for file, line, cell, cell_line in re.findall(r"^(?:File (\S+?):(\d+)|Cell In\[(\d+)\], line (\d+))", plain, re.M):
        if cell:
            in_a_cell = f"{executed} cell In[{cell}], line {cell_line}"
        elif (path := Path(file).expanduser().resolve()).is_relative_to(REPO_ROOT) and not _installed(path):
            in_the_suite = f"{path.relative_to(REPO_ROOT)}:{line}"
    where = in_the_suite or in_a_cell
    return f" at {where}" if where else ""


def _installed(path: Path) -> bool:
    """Whether ``path`` is a library's (in an environment, such as the repository's .venv)."""
    return "site-packages" in path.parts or "dist-packages" in path.parts


if __name__ == "__main__":
    main()
