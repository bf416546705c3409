"""The one command line that measures: one part of one topic, written with its provenance.

    python -m workloads TOPIC --part NAME --scale SCALE --out results/<machine>/TOPIC/NAME-SCALE.csv
    python -m workloads TOPIC --list-parts [--scale SCALE]
                                the parts that run on this machine (at that scale), one per line

The part's function (``workloads/TOPIC/parts.py``, see harness.topic) is called as
``fn(params, writer, *, shared, repeat, warmup, device, scratch_dir)``: it measures and adds rows
to ``writer``, and may return a dict of notes for the provenance record (for example why a
baseline was skipped). The Snakemake rules and tools/gpu_box_run.sh call exactly this.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import signal
import sys
import time
from pathlib import Path

from harness import config as suite_config
from harness import contention, machine, provenance
from harness.errors import NeedsGpuError, UserError, exit_on_user_error
from harness.folders import refuse_unwritable
from harness.results import ResultsWriter
from harness.topic import Topic, discover


def _parser(topics: dict[str, Topic]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m workloads", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("topic", choices=sorted(topics))
    parser.add_argument(
        "--list-parts",
        action="store_true",
        help="print the parts that run on this machine (with --scale: measured at that scale) and exit",
    )
    parser.add_argument("--part", help="the part to measure")
    parser.add_argument("--scale", help="the named scale to measure at (config/config.yaml)")
    parser.add_argument("--out", type=Path, help="results CSV to write")
    parser.add_argument(
        "--config",
        type=Path,
        default=suite_config.DEFAULT_CONFIG,
        help="the suite's config file, a YAML file (default: %(default)s); "
        "not Snakemake's KEY=VALUE: a changed topic block goes under its 'topics' key",
    )
    parser.add_argument("--scratch-dir", type=Path, help="directory for files on disk (default: config's scratch_dir)")
    parser.add_argument(
        "--whole-or-nothing",
        action="store_true",
        help="a part stopped before it ends (SIGTERM, Ctrl-C) writes nothing, rather than the rows it measured "
        "marked cut_short (the workflow passes it: a stopped job is measured again at the next run)",
    )
    return parser


def measure(
    topic: Topic,
    part_name: str,
    scale_name: str,
    out: Path,
    config_path: Path,
    scratch_dir: Path | None = None,
    whole_or_nothing: bool = False,
) -> int:
    """Measure one part and write its results file; the number of rows written. ``whole_or_nothing``:
    a part stopped before it ends writes nothing (under Snakemake, which removes a failed job's
    files when it stops, maybe before the part has written its rows: a file written after would
    be taken for a finished one)."""
    part = topic.part(part_name)
    if out.suffix != ".csv":
        raise UserError(f"--out must name a .csv file, got {out}")
    if out.is_dir():
        raise UserError(f"--out {out} is a folder: name the results file in it")
    cfg = suite_config.load(config_path)
    params = suite_config.topic_params(cfg, topic.name, scale_name)
    gpus = machine.gpu_count()
    if not part.fits_gpus(gpus):
        need = f"{part.gpus} CUDA GPU{'s' if part.gpus > 1 else ''}"
        raise NeedsGpuError(
            f"{topic.name} part '{part.name}' needs {need} and this machine has {gpus} that torch can use"
        )
    if part.cores > machine.usable_cores():
        raise UserError(
            f"{topic.name} part '{part.name}' runs on {part.cores} CPU cores and this process may use "
            f"{machine.usable_cores()}"
        )
    if not suite_config.part_configured(cfg, topic, scale_name, part.name):
        raise UserError(
            f"{topic.name} part '{part.name}' is not measured at scale '{scale_name}': "
            f"config/{topic.name}.yaml gives it no block there"
        )
    if out.stem != f"{part.name}-{scale_name}":  # what the reader takes the part and the scale from
        raise UserError(f"--out must be named {part.name}-{scale_name}.csv (part-scale), got {out.name}")
    # Where the results and the scratch files go is checked before measuring, not after.
    provenance.git_state()  # a malformed SUITE_GIT_* is refused now, not when the rows are written
    refuse_unwritable(out.parent, "--out's folder")
    _refuse_another_machines_folder(out)
    refuse_unwritable(scratch_dir or Path(cfg["scratch_dir"]), "the scratch folder")
    writer = ResultsWriter(topic.schema, scale=scale_name)
    part_params = params.get(part.name, {})  # a topic may configure its parts only in common
    topic_part_names = {p.name for p in topic.parts}
    provenance.note_code_at_start()
    started, cpu_at_start = time.perf_counter(), contention.sample()
    try:
        with _stopped_by_signal():
            notes = (
                topic.measure_function(part.name)(
                    part_params,
                    writer,
                    shared=params,
                    repeat=params["repeat"],
                    warmup=params["warmup"],
                    device="cuda" if gpus else "cpu",
                    scratch_dir=scratch_dir or Path(cfg["scratch_dir"]),
                )
                or {}
            )
        stopped_by = None
    except _CutShort as stop:
        stopped_by = stop.by
        if not writer.rows:
            raise SystemExit(f"{topic.name}/{part.name}: stopped by {stopped_by} before any row was measured") from None
        if whole_or_nothing:
            message = (
                f"{topic.name}/{part.name}: stopped by {stopped_by} after {len(writer.rows)} rows; nothing written "
                "(--whole-or-nothing): the next run measures the part again"
            )
            if stopped_by == SIGINT_STOP:
                print(message, file=sys.stderr)
                _end_as_interrupted()
            raise SystemExit(message) from None
        notes = {"cut_short": f"stopped by {stopped_by} {CUT_SHORT_NOTE}"}
    # The record and the rows are two files: a stop between them would pair this run's record with
    # an earlier run's rows. Signals wait until both are written; a part already stopped ends as
    # it was stopped, whatever arrives meanwhile (a second Ctrl-C).
    with _signals_held(deliver=stopped_by is None):
        writer.write(
            out,
            provenance.collect(
                scale_name,
                packages=topic.packages,
                this_process=True,  # this process ran the part and nothing else
                topic=topic.name,
                part=part.name,
                parameters=part_params,
                # What every part of the topic shares at this scale (repetitions, warm-up, seeds,
                # models), from the config file the part was given: Snakemake's merged one names
                # its --config overrides too.
                shared_parameters={k: v for k, v in params.items() if k not in topic_part_names},
                config_file=provenance.shown(config_path),
                # the whole part, set-up and checks included: what a reproduce run spends on it
                part_wall_s=round(time.perf_counter() - started, 1),
                **_contention_note(cpu_at_start),
                **notes,
            ),
        )
    if stopped_by:
        message = (
            f"{topic.name}/{part.name}: stopped by {stopped_by}; the {len(writer.rows)} rows measured before it are in "
            f"{out}, marked cut_short in its provenance"
        )
        if stopped_by == SIGINT_STOP:
            print(message, file=sys.stderr)
            _end_as_interrupted()
        raise SystemExit(message)
    return len(writer.rows)


def listed_parts(topic: Topic, scale_name: str | None, config_path: Path) -> list[str]:
    """The parts of ``topic`` that run on this machine; with a scale, only those the config measures
    there (the parts the workflow's rules run: a GPU part left out of the small scales is not)."""
    parts = topic.parts_on(machine.gpu_count())
    if scale_name is None:
        return [p.name for p in parts]
    cfg = suite_config.load(config_path)
    suite_config.topic_params(cfg, topic.name, scale_name)  # an unknown scale is refused in one line
    return [p.name for p in parts if suite_config.part_configured(cfg, topic, scale_name, p.name)]


def _end_as_interrupted() -> None:
    """End as an interrupted program does, killed by SIGINT: a shell loop running one part after
    another then stops too (bash goes on when a child it waits for exits with a status, as if it
    had handled the Ctrl-C itself)."""
    sys.stderr.flush()
    sys.stdout.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    raise KeyboardInterrupt  # where SIGINT is blocked in this thread, or ignored by the OS


def _contention_note(cpu_at_start) -> dict:
    """The share of the machine's CPU time other processes took while the part ran (contention.py)."""
    share = contention.others_share(cpu_at_start, contention.sample())
    return {} if share is None else {"cpu_share_of_other_processes": round(share, 3)}


def _refuse_another_machines_folder(out: Path) -> None:
    """Refuse, in one line, results written into a machine's folder (``results/<machine>/...``)
    whose records were measured on other hardware: its figures and claims would mix two machines.
    The workflow refuses the same for its own measuring targets."""
    parts = out.absolute().parts
    if "results" not in parts[:-2]:
        return  # not a results tree: a folder of the user's own
    at = len(parts) - 1 - parts[::-1].index("results")
    if at + 2 >= len(parts):
        return
    folder = Path(*parts[: at + 2])
    other = machine.other_hardware_in(folder)
    if other:
        raise UserError(
            f"{folder} holds results measured on other hardware ({' | '.join(other)}) than this machine "
            f"({machine.shown(machine.hardware())}): measure into a folder of its own (results/<another name>/)"
        )


# follows "stopped by SIGTERM" (a time limit, a cancelled job) or "stopped by Ctrl-C (SIGINT)"
CUT_SHORT_NOTE = (
    "before it ended: only the rows measured before the stop are here, and the part's own notes are missing"
)
SIGINT_STOP = "Ctrl-C (SIGINT)"


class _CutShort(BaseException):  # not an Exception: a part's own error handling must not swallow it
    def __init__(self, by: str):
        super().__init__(by)
        self.by = by  # what stopped the part, as the record says it


@contextlib.contextmanager
def _stopped_by_signal():
    """SIGTERM (``timeout``, a cancelled job) or Ctrl-C stops the part at the next Python step, so
    that the rows it measured so far are written rather than lost with the process; the exit
    stays a failure."""

    stopping = None

    def stop(signum, frame):
        nonlocal stopping
        if signum != signal.SIGALRM and stopping is None:
            stopping = "SIGTERM" if signum == signal.SIGTERM else SIGINT_STOP
            # Raised inside a finalizer or a weakref callback, the exception is printed and
            # dropped ("Exception ignored in ...") and the part runs on: raise it again each
            # second until it lands where it stops the part.
            signal.setitimer(signal.ITIMER_REAL, 1.0, 1.0)
        if stopping and not _unwinding_from_cut_short():
            raise _CutShort(stopping)

    # A process started to ignore Ctrl-C (a background job of a shell, nohup) goes on ignoring it.
    numbers = [signal.SIGTERM, signal.SIGALRM]
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        numbers.append(signal.SIGINT)
    previous = {number: signal.signal(number, stop) for number in numbers}
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def _signals_held(deliver: bool = True):
    """SIGINT and SIGTERM wait until the block ends, then arrive as sent (``deliver``) or not at
    all. (Taken by a handler, not blocked: a thread's signal mask leaves the signal to the
    process's other threads.)"""
    arrived = []
    numbers = [n for n in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(n) is not signal.SIG_IGN]
    previous = {number: signal.signal(number, lambda signum, frame: arrived.append(signum)) for number in numbers}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number in dict.fromkeys(arrived if deliver else ()):
            os.kill(os.getpid(), number)


def _unwinding_from_cut_short() -> bool:
    """Whether the stop already landed and the part's own ``finally``/``__exit__`` clean-up is
    running (closing files, joining workers): raising again there would cut the clean-up short."""
    error = sys.exc_info()[1]
    while error is not None:
        if isinstance(error, _CutShort):
            return True
        error = error.__context__
    return False


def main(argv=None) -> None:
    # `kill -USR1 <pid>` prints every thread's stack: where a long run is spending its time.
    if hasattr(signal, "SIGUSR1"):
        try:
            faulthandler.register(signal.SIGUSR1, all_threads=True)
        except (OSError, ValueError):  # stderr is not a file (captured): no stack dumps then
            pass

    @exit_on_user_error
    def run() -> None:
        topics = discover()
        parser = _parser(topics)
        args = parser.parse_args(argv)
        topic = topics[args.topic]
        if args.list_parts:
            print("\n".join(listed_parts(topic, args.scale, args.config)))
            return
        missing = [
            flag
            for flag, value in (("--part", args.part), ("--scale", args.scale), ("--out", args.out))
            if value is None
        ]
        if missing:
            parser.error(f"measuring needs {', '.join(missing)}")
        rows = measure(topic, args.part, args.scale, args.out, args.config, args.scratch_dir, args.whole_or_nothing)
        print(f"wrote {rows} rows to {args.out}")

    try:
        run()
    except KeyboardInterrupt:
        # Ctrl-C outside the measured part (while the topics load, while finished results are
        # written): one line, no traceback, and the end of an interrupted program.
        print("interrupted by Ctrl-C (SIGINT)", file=sys.stderr)
        _end_as_interrupted()
