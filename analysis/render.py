"""Execute a text-based (jupytext) analysis notebook headless, with parameters.

    python -m analysis.render analysis/ceilings.py --executed logs/x.ipynb -p machine=h200 -p scale=h200

The notebook's cell tagged ``parameters`` holds defaults; the values given here are injected in a
cell right after it (the papermill convention). The executed notebook, outputs included, is
saved to ``--executed`` so a failed figure can be debugged cell by cell.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness.errors import UserError, exit_on_user_error

REPO_ROOT = Path(__file__).resolve().parent.parent


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
    parser.add_argument("-p", "--parameter", type=_parameter, action="append", default=[],
                        help="NAME=VALUE (a string) injected after the 'parameters' cell")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell")
    args = parser.parse_args(argv)

    import jupytext
    import nbclient
    import nbformat

    if not args.notebook.exists():
        raise UserError(f"notebook {args.notebook} does not exist")
    nb = jupytext.read(args.notebook)
    tagged = [i for i, cell in enumerate(nb.cells) if "parameters" in cell.metadata.get("tags", [])]
    if not tagged:
        raise UserError(f"{args.notebook} has no cell tagged 'parameters'")
    injected = "\n".join(f"{name} = {value!r}" for name, value in args.parameter)
    nb.cells.insert(tagged[0] + 1, nbformat.v4.new_code_cell(
        "# Injected by analysis.render\n" + injected, metadata={"tags": ["injected-parameters"]}))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}

    env_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    os.environ["PYTHONPATH"] = env_path  # the kernel is a child process; it must find the packages
    os.environ.setdefault("MPLBACKEND", "Agg")
    client = nbclient.NotebookClient(
        nb, timeout=args.timeout, kernel_name="python3", resources={"metadata": {"path": str(REPO_ROOT)}},
        # The kernel talks to this process over loopback only; its warning about that is noise.
        extra_arguments=["--IPKernelApp.log_level=ERROR"])
    args.executed.parent.mkdir(parents=True, exist_ok=True)
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as err:
        nbformat.write(nb, args.executed)
        print(f"error: notebook {args.notebook} failed: {err.ename}: {err.evalue} "
              f"(executed copy: {args.executed})", file=sys.stderr)
        raise SystemExit(1) from None
    nbformat.write(nb, args.executed)


if __name__ == "__main__":
    main()
