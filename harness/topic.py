"""What a topic is, declared once: its parts, the GPUs each needs, its results schema, its config.

A topic is a package ``workloads/<name>/`` whose ``__init__.py`` exports ``TOPIC``, a
:class:`Topic`. Everything else derives from the list :func:`discover` returns: the workflow's
rules, the measuring entry point (``python -m workloads <name> --part P``), the tests, the GPU-box
script and the report. The measuring functions live in ``workloads/<name>/parts.py``, one plain
function per part, named like the part; that module is imported only when a part is measured, so
reading the declarations (the workflow does, on every invocation) stays cheap.

A topic also owns, beside its package: ``config/<name>.yaml`` (a block of parameters per scale),
``workflow/schemas/<name>.schema.yaml`` (the schema of one such block), ``analysis/<name>.py``
(the notebook that renders its figure) and ``workflow/report/<name>.rst`` (the figure's caption).
See docs/adding_a_topic.md.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness import machine
from harness.errors import UserError
from harness.results import Schema

REPO_ROOT = Path(__file__).resolve().parent.parent
TOPIC_NAME = re.compile(r"[a-z][a-z0-9_]*")
PART_NAME = re.compile(r"[a-z0-9_]+")  # as the measuring rule's wildcard allows
# Names the workflow already uses: its rules, the figure rule's other inputs, and the attributes
# of Snakemake's input lists (a topic's results are a named input of its figure job).
RESERVED_NAMES = {
    "measure",
    "reproduce",
    "figures",
    "claims",  # config/claims.yaml is the claims' file, and claims a workflow target
    "claims_table",
    "doc_tables",
    "notebook",
    "helpers",
    "get",
    "keys",
    "items",
    "index",
    "count",
    "size",
    "size_mb",
    "size_files",
    "size_files_mb",
    "size_files_gb",
    "size_gb",
    "size_tb",
}
WORKLOADS = REPO_ROOT / "workloads"
TECHNIQUES = ("pytorch_direct", "hector", "ssdtrain")  # the thesis' three; None: the machine itself


@dataclass(frozen=True)
class Part:
    """One measuring job of a topic: one results file, ``results/<machine>/<topic>/<name>-<scale>.csv``.

    ``gpus``: the GPUs it holds on a GPU machine (the workflow's ``gpu`` resource); a machine with
    fewer does not run it. ``cpu``: whether it also runs on a machine without a GPU (then on the
    CPU path, holding no GPU). ``cores``: the CPU cores it needs (a part that measures on a given
    number of them); a machine that gives this process fewer does not run it.
    """

    name: str
    gpus: int = 1
    cpu: bool = True
    cores: int = 1

    def runs_on(self, gpu_count: int, cores: int | None = None) -> bool:
        """Whether a machine of ``gpu_count`` GPUs and ``cores`` usable cores (default: this one's)
        runs it."""
        return self.fits_gpus(gpu_count) and self.cores <= (machine.usable_cores() if cores is None else cores)

    def fits_gpus(self, gpu_count: int) -> bool:
        """Whether a machine of ``gpu_count`` GPUs runs it, whatever its cores."""
        return self.cpu if gpu_count == 0 else self.gpus <= gpu_count

    def gpus_held(self, gpu_count: int) -> int:
        return self.gpus if gpu_count else 0


@dataclass(frozen=True)
class Topic:
    """A measured subject: parts, results schema, and the other topics whose results its figure reads."""

    name: str
    title: str  # the figure's category in the report
    technique: str | None  # which of TECHNIQUES it measures; None for the machine's ceilings
    schema: Schema
    parts: tuple[Part, ...]
    reads: tuple[str, ...] = ()  # topics whose results (same machine, same scale) the figure also shows
    packages: tuple[str, ...] = ()  # libraries, besides harness.provenance's, whose versions its numbers depend on

    def __post_init__(self):
        if not TOPIC_NAME.fullmatch(self.name) or self.name in RESERVED_NAMES or self.name.endswith("_figure"):
            raise ValueError(
                f"topic name {self.name!r}: use lowercase letters, digits and _, not ending in _figure, "
                f"and none of {', '.join(sorted(RESERVED_NAMES))} (the workflow uses them)"
            )
        if self.name in self.reads:
            raise ValueError(f"topic {self.name} lists itself in reads; its own results are read anyway")
        names = [p.name for p in self.parts]
        bad = [p.name for p in self.parts if not PART_NAME.fullmatch(p.name) or p.gpus < 0 or p.cores < 1]
        if bad:
            raise ValueError(f"topic {self.name}: parts {bad} need names of [a-z0-9_], gpus >= 0 and cores >= 1")
        if not names or len(set(names)) != len(names):
            raise ValueError(f"topic {self.name}: parts must be a non-empty list of distinct names, got {names}")
        if self.schema.topic != self.name:
            raise ValueError(f"topic {self.name}: its schema is declared for topic {self.schema.topic!r}")
        if self.technique not in (None, *TECHNIQUES):
            raise ValueError(f"topic {self.name}: technique must be one of {TECHNIQUES} or None")

    @property
    def part_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parts)

    def part(self, name: str) -> Part:
        for p in self.parts:
            if p.name == name:
                return p
        raise UserError(f"topic {self.name} has no part '{name}'; its parts: {', '.join(self.part_names)}")

    def parts_on(self, gpu_count: int, cores: int | None = None) -> tuple[Part, ...]:
        """The parts that run on a machine with ``gpu_count`` GPUs (0: no GPU) and ``cores`` usable
        cores (default: this machine's; another's when reading its results)."""
        return tuple(p for p in self.parts if p.runs_on(gpu_count, cores))

    def measure_function(self, part: str) -> Callable:
        """The function that measures ``part``: ``workloads.<topic>.parts.<part>``, called as
        ``fn(params, writer, *, shared, repeat, warmup, device, scratch_dir)``."""
        module = importlib.import_module(f"workloads.{self.name}.parts")
        fn = getattr(module, self.part(part).name, None)
        if not callable(fn):
            raise TypeError(f"workloads/{self.name}/parts.py defines no function '{part}' for the part of that name")
        return fn

    # Files a topic owns outside its package, by convention.
    @property
    def config_file(self) -> Path:
        return REPO_ROOT / "config" / f"{self.name}.yaml"

    @property
    def schema_file(self) -> Path:
        return REPO_ROOT / "workflow" / "schemas" / f"{self.name}.schema.yaml"

    @property
    def notebook(self) -> str:
        return f"analysis/{self.name}.py"

    @property
    def caption(self) -> str:
        return f"workflow/report/{self.name}.rst"


def discover() -> dict[str, Topic]:
    """Every topic under workloads/, by name (a subpackage exporting ``TOPIC``), in name order.

    Refuses a package whose TOPIC is named differently from its folder, and a topic that reads
    one that does not exist."""
    topics = {}
    for info in sorted(pkgutil.iter_modules([str(WORKLOADS)]), key=lambda i: i.name):
        if not info.ispkg:
            continue
        topic = getattr(importlib.import_module(f"workloads.{info.name}"), "TOPIC", None)
        if topic is None:
            continue  # a shared package (graphs, gnn), not a topic
        if topic.name != info.name:
            raise ValueError(
                f"workloads/{info.name}/__init__.py declares topic {topic.name!r}; name it after its folder"
            )
        topics[topic.name] = topic
    for topic in topics.values():
        unknown = set(topic.reads) - set(topics)
        if unknown:
            raise ValueError(f"topic {topic.name} reads unknown topics {sorted(unknown)}")
    return topics
