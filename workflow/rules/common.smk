# Shared set-up: validated config, the machine and scale this run measures, input functions.
#
# `snakemake --lint` leaves one warning per rule, "Specify a conda environment or container for
# each rule": expected. The suite runs in the virtual environment built from the pinned
# requirements in envs/ (the machines it targets have no conda), and each results file records
# the software versions it was measured with.
import sys
from pathlib import Path

from harness import config as suite_config
from harness import machine as suite_machine
from harness.errors import UserError

# Refuse a malformed config, an unknown scale or a GPU scale without a GPU in one line, before
# any job starts (sys.exit prints just the message).
try:
    suite_config.validate(config)
    SCALE_PARAMS = suite_config.scale_params(config, config["scale"])
except UserError as err:
    sys.exit(f"error: {err}")

MACHINE = config["machine"]
SCALE = config["scale"]
HAS_GPU = suite_machine.has_gpu()
# Jobs run the Python of the environment Snakemake runs in (the suite's venv); no conda here.
PYTHON = sys.executable
CONFIG_FILE = workflow.configfiles[-1] if workflow.configfiles else "config/config.yaml"


wildcard_constraints:
    scale="[A-Za-z0-9_]+",


def committed_results(topic, expected_parts):
    """(machine, scale) pairs with results for ``topic`` under results/; for this machine only
    complete sets (all of ``expected_parts()``), so rendering never triggers a measurement."""
    pairs = set()
    for csv in Path("results").glob(f"*/{topic}/*.csv"):
        machine, scale = csv.parent.parent.name, csv.stem.rsplit("-", 1)[-1]
        folder = csv.parent
        if machine == MACHINE and not all((folder / f"{p}-{scale}.csv").exists() for p in expected_parts()):
            continue
        pairs.add((machine, scale))
    return sorted(pairs)


def committed_figures(topic, expected_parts):
    return [f"paper_figs/{m}/{topic}-{s}.png" for m, s in committed_results(topic, expected_parts)]


def topic_results(topic, expected_parts):
    """Input function for a topic's figure: the results files of one machine at one scale.

    This machine: one file per part in ``expected_parts()`` (measured if missing). Another
    machine: the files committed for it, marked ancient so they are never re-measured here.
    """

    def inputs(wildcards):
        folder = f"results/{wildcards.machine}/{topic}"
        if wildcards.machine == MACHINE:
            return [f"{folder}/{part}-{wildcards.scale}.csv" for part in expected_parts()]
        return [ancient(str(p)) for p in sorted(Path(folder).glob(f"*-{wildcards.scale}.csv"))]

    return inputs
