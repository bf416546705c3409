# Shared set-up: validated config, the machine and scale this run measures, the topics (found
# under workloads/, see harness/topic.py) and the input functions every topic's rules use.
#
# `snakemake --lint` leaves one warning per rule, "Specify a conda environment or container for
# each rule": expected. The suite runs in the virtual environment built from the pinned
# requirements in envs/ (the machines it targets have no conda), and each results file records
# the software versions it was measured with.
import hashlib
import json
import os
import re
import sys
from pathlib import Path

import yaml
from snakemake.io import IOFile

from harness import config as suite_config
from harness import machine as suite_machine
from harness.errors import NeedsGpuError, UserError
from harness.results import committed, results_in, results_name
from harness.topic import discover

TOPICS = discover()

# Refuse a malformed config, an unknown scale or a topic without a block for the scale in one
# line, before any job starts (sys.exit prints just the message).
try:
    # Snakemake merged the config files with a reader that keeps a repeated key's last value.
    for path in workflow.configfiles:
        suite_config.check_config_file(path)
    config.update(suite_config.complete(config))
    for name in TOPICS:
        suite_config.topic_params(config, name, config["scale"], check_gpu=False, choose_with="--config scale=")
except UserError as err:
    sys.exit(f"error: {err}")
# A GPU scale without a GPU is refused, in one line, by the targets that measure on this machine
# only (measuring_targets): rendering committed results works at any scale.
try:
    suite_config.scale_params(config, config["scale"], choose_with="--config scale=")
    CANNOT_MEASURE_HERE = None
except NeedsGpuError as err:
    CANNOT_MEASURE_HERE = f"error: {err}"

MACHINE = config["machine"]
SCALE = config["scale"]
GPU_COUNT = suite_machine.gpu_count()


# Measuring here into a folder of another machine's results would mix the two in its figures and
# rewrite its claims: refused by the measuring targets, in one line; rendering what is there works.
FOREIGN_FOLDER = suite_machine.other_hardware_in(Path("results", MACHINE))
if FOREIGN_FOLDER and not CANNOT_MEASURE_HERE:
    CANNOT_MEASURE_HERE = (
        f"error: results/{MACHINE}/ holds results measured on other hardware ({' | '.join(FOREIGN_FOLDER)}) "
        f"than this machine ({suite_machine.shown(suite_machine.hardware())}): measure it into a folder of its own, "
        "--config machine=NAME"
    )
# Jobs run the Python of the environment Snakemake runs in (the suite's venv); no conda here.
PYTHON = sys.executable


def merged_config_file():
    """The config as Snakemake merged it (config files, topic files, profile, --config), written
    once so the measuring jobs use exactly what was validated here; named by its content."""
    text = yaml.safe_dump(dict(config), sort_keys=True)
    path = Path(".snakemake/suite") / f"config-{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(path)


CONFIG_FILE = merged_config_file()
# The renders' labels name the parts this config measures that a figure has no results of
# (analysis/common.py). Passed in the jobs' environment, not their command: a command that names
# the file would re-render every figure whenever the config changes.
suite_config.announce_config_file(CONFIG_FILE)


wildcard_constraints:
    scale="[A-Za-z0-9_]+",


# <machine>/<part>-<scale>.csv, as the measuring rule names its files (machine names as the config
# schema allows them), or .csv.gz as committed results may be (harness.results).
RESULTS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[a-z0-9_]+-[A-Za-z0-9_]+\.csv(\.gz)?")


def parts_here(topic, scale):
    """Names of the parts of ``topic`` that run on this machine at ``scale``."""
    return [
        part.name
        for part in TOPICS[topic].parts_on(GPU_COUNT)
        if suite_config.part_configured(config, TOPICS[topic], scale, part.name)
    ]


def results_of(topic, machine, scale):
    """The results files of ``topic`` for one machine at one scale.

    This machine: one file per part that runs here (measured if missing; a part kept compressed,
    ``X.csv.gz``, as committed results are, is kept too). Another machine: the files committed for
    it (the measuring rule only produces this machine's files, so they are never re-measured here;
    a newer file re-renders the figure)."""
    folder = f"results/{machine}/{topic}"
    if machine == MACHINE and not CANNOT_MEASURE_HERE:  # (a scale it cannot measure: its committed files)
        return [str(committed(f"{folder}/{part}-{scale}.csv")) for part in parts_here(topic, scale)]
    return [str(p) for p in results_in(folder, f"*-{scale}")]


def reruns_of(topic, machine, scale):
    """Other processes of a topic's parts, committed beside a machine's results as
    ``results/<machine>/<topic>/reruns/<name>/<part>-<scale>.csv``, so that a figure can show the
    spread across processes and a table ratios over them."""
    return [str(p) for p in results_in(f"results/{machine}/{topic}/reruns", f"*/*-{scale}")]


def figure_inputs(topic):
    """Input function of a topic's figure: its results and those of the topics it reads, by topic
    name, and its reruns under ``<topic>_reruns`` (the render passes them on to the notebook,
    which never looks for files itself)."""

    def inputs(wildcards):
        names = (topic, *TOPICS[topic].reads)
        files = {name: results_of(name, wildcards.machine, wildcards.scale) for name in names}
        files[f"{topic}_reruns"] = reruns_of(topic, wildcards.machine, wildcards.scale)
        return files

    return inputs


def results_arguments(topic):
    """The render's ``--results TOPIC=FILE`` arguments for the files a figure job received."""

    def arguments(wildcards, input):
        names = (topic, *TOPICS[topic].reads, f"{topic}_reruns")
        listed = [f"--topic {name}" for name in names]  # named even when it has no files
        return " ".join(listed + [f"--results {name}={path}" for name in names for path in input[name]])

    return arguments


def topic_targets(topic):
    """This machine's figure of ``topic`` at the configured scale, and its results files as
    targets too, so a deleted results file is measured again (and the figure re-rendered);
    nothing for a topic none of whose parts runs here."""
    results = results_of(topic, MACHINE, SCALE)
    return [f"paper_figs/{MACHINE}/{topic}-{SCALE}.png", *results] if results else []


def measuring_targets(*topics, claims=False):
    """Input function of a target that measures on this machine: the figures and results files
    of ``topics`` (topic_targets) and, with ``claims``, this machine's claims table. It refuses a
    scale this machine cannot measure when the target is asked for, not when the workflow loads."""

    def inputs(wildcards):
        if CANNOT_MEASURE_HERE:
            sys.exit(CANNOT_MEASURE_HERE)
        return [
            *(path for topic in topics for path in topic_targets(topic)),
            *([f"paper_figs/{MACHINE}/claims.md"] if claims else []),
        ]

    return inputs


# This machine's figures that `figures` leaves out, their results incomplete: (topic, scale) ->
# the missing files (the `figures` rule names them).
UNRENDERED = {}


def committed_figures(topic):
    """Figures for every (machine, scale) with results for ``topic`` under results/; for this
    machine only complete sets (its own and those of the topics it reads), so rendering never
    triggers a measurement (the others are in UNRENDERED)."""
    pairs, seen = set(), set()
    for csv in results_in("results", f"*/{topic}/*"):
        if not RESULTS_NAME.fullmatch(f"{csv.parent.parent.name}/{csv.name}"):
            continue  # not a results file the workflow writes (a copy, a note): leave it alone
        machine, scale = csv.parent.parent.name, results_name(csv).rsplit("-", 1)[-1]
        if (machine, scale) in seen:
            continue  # another part of the same set: decided once
        seen.add((machine, scale))
        if machine == MACHINE:
            missing = [
                path
                for name in (topic, *TOPICS[topic].reads)
                for path in results_of(name, machine, scale)
                if not (Path(path).exists() and Path(path.removesuffix(".csv") + ".provenance.json").exists())
            ]
            if missing:
                UNRENDERED[(topic, scale)] = missing
                continue
        pairs.add((machine, scale))
    return [f"paper_figs/{m}/{topic}-{s}.png" for m, s in sorted(pairs)]


# Snakemake's words when it puts back an `update` output (a figure, a table) after its job failed.
RESTORED = re.compile(r"Restored previous version of (\S+) \(updating job failed\)")


def outdate_restored_outputs(logs):
    """Make every output that Snakemake put back after its job failed due to be made again.

    Snakemake copies the previous version back with a new modification time and records the
    failed job's inputs as the ones it was made from, so the next run would take a figure that
    failed to render from changed results as up to date, and exit 0. Each such output gets a
    modification time older than any input and loses that record."""
    text = "".join(Path(log).read_text(errors="replace") for log in logs)
    for path in sorted(set(RESTORED.findall(text))):
        if Path(path).is_file():
            os.utime(path, (1, 1))  # not 0: Snakemake reads a time of 0 as "no time"
            workflow.persistence.cleanup_metadata(IOFile(path))
