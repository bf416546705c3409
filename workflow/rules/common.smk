# Shared set-up: validated config, the machine and scale this run measures, helpers for targets.
import sys
from pathlib import Path

from harness import config as suite_config
from harness import machine as suite_machine
from harness.errors import UserError

# Refuse a malformed config, an unknown scale or a GPU scale without a GPU in one line, before
# any job starts.
try:
    suite_config.validate(config)
    SCALE_PARAMS = suite_config.scale_params(config, config["scale"])
except UserError as err:
    raise WorkflowError(str(err)) from None

MACHINE = config["machine"]
SCALE = config["scale"]
HAS_GPU = suite_machine.has_gpu()
# Jobs run the Python of the environment Snakemake runs in (the suite's venv); no conda here.
PYTHON = sys.executable
CONFIG_FILE = workflow.configfiles[-1] if workflow.configfiles else "config/config.yaml"

# Wildcards never span folders; the measuring rules only ever produce this machine's results.
wildcard_constraints:
    scale="[A-Za-z0-9_]+",


def committed_results(topic):
    """(machine, scale) pairs that have results for ``topic`` under results/."""
    pairs = set()
    for csv in Path("results").glob(f"*/{topic}/*.csv"):
        scale = csv.stem.rsplit("-", 1)[-1]
        pairs.add((csv.parent.parent.name, scale))
    return sorted(pairs)


def committed_figures(topic):
    return [f"paper_figs/{m}/{topic}-{s}.png" for m, s in committed_results(topic)]
