# Shared set-up: validated config, the machine and scale this run measures, the topic registry
# and the input functions every topic uses.
#
# `snakemake --lint` leaves one warning per rule, "Specify a conda environment or container for
# each rule": expected. The suite runs in the virtual environment built from the pinned
# requirements in envs/ (the machines it targets have no conda), and each results file records
# the software versions it was measured with.
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

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


def merged_config_file():
    """The config as Snakemake merged it (config files, profile, --config), written once so the
    measuring jobs use exactly what was validated here; named by its content."""
    text = yaml.safe_dump(dict(config), sort_keys=True)
    path = Path(".snakemake/suite") / f"config-{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(path)


CONFIG_FILE = merged_config_file()


wildcard_constraints:
    scale="[A-Za-z0-9_]+",


@dataclass(frozen=True)
class Topic:
    """A measured topic: python -m workloads.<name> --part P writes results/<machine>/<name>/P-<scale>.csv,
    analysis/<name>.py renders paper_figs/<machine>/<name>-<scale>.png."""

    name: str
    title: str
    parts: Callable[[], tuple]  # the parts that apply on this machine
    gpus: Callable[[str], int]  # GPUs a part holds while it is measured


TOPICS = {}


def register_topic(name, title, parts, gpus=None):
    TOPICS[name] = Topic(name=name, title=title, parts=parts, gpus=gpus or (lambda part: int(HAS_GPU)))


def topic_results(topic):
    """Input function for a topic's figure: the results files of one machine at one scale.

    This machine: one file per part that applies here (measured if missing). Another machine:
    the files committed for it (the measuring rule only produces this machine's files, so they
    are never re-measured here; a newer file re-renders the figure).
    """

    def inputs(wildcards):
        folder = f"results/{wildcards.machine}/{topic}"
        if wildcards.machine == MACHINE:
            return [f"{folder}/{part}-{wildcards.scale}.csv" for part in TOPICS[topic].parts()]
        return [str(p) for p in sorted(Path(folder).glob(f"*-{wildcards.scale}.csv"))]

    return inputs


def topic_targets(topic):
    """This machine's figure of ``topic`` at the configured scale, and its results files as
    targets too, so a deleted results file is measured again (and the figure re-rendered)."""
    return [f"paper_figs/{MACHINE}/{topic}-{SCALE}.png"] + [
        f"results/{MACHINE}/{topic}/{part}-{SCALE}.csv" for part in TOPICS[topic].parts()
    ]


def committed_figures(topic):
    """Figures for every (machine, scale) with results for ``topic`` under results/; for this
    machine only complete sets, so rendering never triggers a measurement."""
    pairs = set()
    for csv in Path("results").glob(f"*/{topic}/*.csv"):
        machine, scale = csv.parent.parent.name, csv.stem.rsplit("-", 1)[-1]
        complete = all(
            (csv.parent / f"{part}-{scale}{suffix}").exists()
            for part in TOPICS[topic].parts()
            for suffix in (".csv", ".provenance.json")
        )
        if machine == MACHINE and not complete:
            continue
        pairs.add((machine, scale))
    return [f"paper_figs/{m}/{topic}-{s}.png" for m, s in sorted(pairs)]
