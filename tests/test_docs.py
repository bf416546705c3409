"""What the suite tells its users: the README and docs/ speak to them (no work-log talk), every
relative link leads somewhere, the README's claims table is the generated one, and the
messages of `make` and `make test` help."""

import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO_ROOT, pytest_terminal_summary

README = REPO_ROOT / "README.md"
DOCS = [README, *sorted((REPO_ROOT / "docs").glob("*.md"))]
CLAIMS = REPO_ROOT / "paper_figs" / "h200" / "claims.md"

# Docs the words below are being taken out of: mark them here while they still fail.
BEING_REWRITTEN: set[str] = set()


def doc_id(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


def prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code: what links and words are read from."""
    text = re.sub(r"^```.*?^```", lambda block: "\n" * block.group(0).count("\n"), text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


# --- words that belong to a work log, not to a user's doc ----------------------------------------

WORK_LOG = {
    "an issue number": re.compile(r"\bissues?\s+\d+|(?<![\w&/#])#\d+\b", re.I),
    "a session": re.compile(r"\bsessions?\b", re.I),
    "device minutes": re.compile(r"\bdevice[- ]minutes?\b", re.I),
    "a helper": re.compile(r"\bhelpers?\b", re.I),
    "what was not lent": re.compile(r"\bwere not lent\b", re.I),
    "next time": re.compile(r"\bnext time\b", re.I),
    "a work period": re.compile(r"\bwork periods?\b", re.I),
}


def work_log_talk(text: str) -> list[str]:
    """Each line of ``text`` whose prose (code aside) uses a work-log word, with what it uses."""
    return [
        f"line {number}: {what}: {line.strip()[:100]}"
        for number, line in enumerate(prose(text).splitlines(), 1)
        for what, pattern in WORK_LOG.items()
        if pattern.search(line)
    ]


def test_work_log_talk_is_found():
    text = "Measured in session 5.\nThe fix for issue 13 and #14.\nA helper read it; x4 were not lent.\nok"
    found = work_log_talk(text)
    assert [entry.split(":")[0] for entry in found] == ["line 1", "line 2", "line 3", "line 3"]
    code = "```python\nwith offload(model) as session:  # issue 12\n```\n"
    assert work_log_talk(code + "See [the table](#known-limitations), `session.stats`, `x[#1]`, C#.") == []
    assert work_log_talk(code + "Helpers ran it.")[0].startswith("line 4: a helper")


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(path, marks=pytest.mark.xfail(reason="being rewritten", strict=False))
        if doc_id(path) in BEING_REWRITTEN
        else path
        for path in DOCS
    ],
    ids=doc_id,
)
def test_docs_speak_to_users(doc):
    found = work_log_talk(doc.read_text())
    assert not found, f"{doc_id(doc)} talks like a work log (history belongs to git):\n" + "\n".join(found)


def test_code_speaks_to_users():
    """Docstrings and comments are read by users too: no issue numbers in the code."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    issue = re.compile(r"\bissues?\s+#?\d+", re.I)
    found = [
        f"{name}:{number}: {line.strip()[:100]}"
        for name in tracked.splitlines()
        if not name.startswith(("tests/", "results/"))
        and name.endswith((".py", ".sh", ".cu", ".cuh", ".yaml", "Snakefile"))
        for number, line in enumerate((REPO_ROOT / name).read_text(errors="replace").splitlines(), 1)
        if issue.search(line)
    ]
    assert not found, "issue numbers in the code (history belongs to git):\n" + "\n".join(found)


# --- links ---------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of ``text``."""
    anchors = set()
    for heading in re.findall(r"^#+\s+(.*)$", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def broken_links(doc: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(doc.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        path = (doc.parent / path_part).resolve() if path_part else doc
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in heading_anchors(path.read_text()):
            broken.append(f"{target}: no heading with that anchor")
    return broken


def test_broken_links_are_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## Known limits\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[a](other.md) [b](other.md#known-limits) [c](missing.md) [d](other.md#nowhere) [e](#here)\n"
        "![f](img.png) [g](https://example.org/x) `[h](not-a-link.md)`\n\n## Here\n"
    )
    assert broken_links(doc) == [
        "missing.md: no such file",
        "other.md#nowhere: no heading with that anchor",
        "img.png: no such file",
    ]


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_relative_link_resolves(doc):
    broken = broken_links(doc)
    assert not broken, f"{doc_id(doc)} links to what is not there:\n" + "\n".join(broken)


# --- the README ----------------------------------------------------------------------------------


def test_the_readme_stays_short():
    lines = len(README.read_text().splitlines())
    assert lines <= 120, f"README.md has {lines} lines: move details into docs/ (at most 120)"


def table_rows(text: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the markdown table of ``text`` whose first header is ``first_header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"\|\s*{first_header}\s*\|", line))
    headers = [cell.strip() for cell in lines[start].strip().strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(headers, (cell.strip() for cell in line.strip().strip("|").split("|")), strict=True)))
    return rows


def column(row: dict[str, str], prefix: str) -> str:
    return next(value for header, value in row.items() if header.startswith(prefix))


def bold(cell: str) -> str:
    found = re.search(r"\*\*(.+?)\*\*", cell)
    return found.group(1) if found else cell


# A headline value: a number with its unit, as the claims table writes them.
VALUE = re.compile(r"[−-]?\d+(?:\.\d+)?(?:x|%|M)(?![\w])")
SPREAD = re.compile(r"one process|range \S+ to \S+ over \d+ processes|the same to the shown precision in \d+ processes")
# What the value rests on is no detail to cut either: parts at several versions of the code, or a
# baseline measured without one of its variants.
CAVEAT = re.compile(
    r"\(its parts measured at \d+ versions of the code\)"
    r"|\([\w, ]+ not measured: against [\w, ]+ alone\)"
    r"|\([\w, ]+ not measured in \d+ of \d+ groups \([^)]*\): against [\w, ]+ alone there\)"
    r"|\(\w+ measured once in \d+ of \d+ groups: one sample, not a median\)"
    r"|\([\w ]+ has no \w+ in \d+ group\(s\) where a baseline ran: [^)]*\)"
    r"|\(the committed run measured without [\w, ]+, which re-runs compare against\)"
    r"|(?:\w+ faster than \w+; )*\w+ faster than \w+ in \d+ of \d+ groups: no bound there"
)


def readme_value_fits(short: str, generated: str) -> bool:
    """The README's shortened value is pieces of the generated one, cut at '; ' or ' … ', in order,
    and keeps its first headline value."""
    position = 0
    for piece in re.split(r"; | … ", short):
        found = generated.find(piece, position)
        if not piece or found < 0:
            return False
        position = found + len(piece)
    first = VALUE.search(generated)
    # How many processes the value rests on is no detail to cut: "one process" or the range.
    spread = SPREAD.search(generated)
    kept = all(caveat in short for caveat in CAVEAT.findall(generated))
    return (first is None or first.group(0) in short) and (spread is None or spread.group(0) in short) and kept


def test_a_shortened_value_must_keep_its_pieces_and_headline_number():
    generated = "8.55x (max over 24 groups), at model=rgcn: a vs b; range 7.29x to 8.55x over 3 processes"
    assert readme_value_fits("8.55x (max over 24 groups); range 7.29x to 8.55x over 3 processes", generated)
    assert readme_value_fits("8.55x … range 7.29x to 8.55x over 3 processes", generated)
    assert not readme_value_fits("8.56x (max over 24 groups)", generated)
    assert not readme_value_fits("range 7.29x to 8.55x over 3 processes; 8.55x", generated)  # out of order
    assert not readme_value_fits("(max over 24 groups)", generated)  # the number left out
    assert not readme_value_fits("8.55x (max over 24 groups)", generated)  # how many processes left out
    assert readme_value_fits("–", "–")
    bound = generated + "; a faster than b; c faster than b in 2 of 3 groups: no bound there"
    assert not readme_value_fits(
        "8.55x … range 7.29x to 8.55x over 3 processes; c faster than b in 2 of 3 groups: no bound there", bound
    )
    assert readme_value_fits(
        "8.55x … range 7.29x to 8.55x over 3 processes; a faster than b; "
        "c faster than b in 2 of 3 groups: no bound there",
        bound,
    )
    caveated = generated + " (b_workers not measured: against b alone) (its parts measured at 2 versions of the code)"
    assert not readme_value_fits("8.55x … range 7.29x to 8.55x over 3 processes", caveated)
    assert readme_value_fits(
        "8.55x … range 7.29x to 8.55x over 3 processes … (b_workers not measured: against b alone) … "
        "(its parts measured at 2 versions of the code)",
        caveated,
    )


def test_the_readme_claims_table_is_the_generated_one():
    generated = table_rows(CLAIMS.read_text(), "technique")
    shown = table_rows(README.read_text(), "technique")
    expected = [
        {
            "technique": row["technique"],
            "claim": re.sub(r"\s*\(`\w+`\)$", "", row["claim"]),
            "paper": bold(column(row, "paper")),
            "value": column(row, "this machine"),
            "verdict": bold(row["verdict"]),
        }
        for row in generated
    ]
    readme_headers = ("technique", "claim", "paper", "H200", "verdict")
    got = [{key: column(row, header) for key, header in zip(expected[0], readme_headers, strict=True)} for row in shown]
    template = "\n".join("| " + " | ".join(row.values()) + " |" for row in expected)
    assert len(got) == len(expected), (
        f"README's claims table has {len(got)} rows, {CLAIMS.relative_to(REPO_ROOT)} {len(expected)}:\n{template}"
    )
    for mine, theirs in zip(got, expected, strict=True):
        for key in ("technique", "claim", "paper", "verdict"):
            assert mine[key] == theirs[key], f"README's claims table differs from the generated one:\n{template}"
        assert readme_value_fits(mine["value"], theirs["value"]), (
            f"README's value for {theirs['claim']!r} is not the generated one ({theirs['value']}):\n{template}"
        )


# --- what `make` and `make test` print -----------------------------------------------------------


def environment_is_set_up() -> bool:
    stamp = REPO_ROOT / ".venv" / ".installed-cpu"
    inputs = ["envs/requirements-cpu.txt", "envs/requirements-data.txt", "pyproject.toml"]
    return stamp.exists() and all((REPO_ROOT / name).stat().st_mtime <= stamp.stat().st_mtime for name in inputs)


@pytest.mark.skipif(not environment_is_set_up(), reason="the cpu environment is not set up (make setup)")
@pytest.mark.parametrize("name", ["reproduc", "docs", "README.md"])  # a file or folder here is no target either
def test_make_with_an_unknown_target_lists_the_valid_ones(name):
    result = subprocess.run(
        ["make", "--no-print-directory", name], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode != 0
    assert f"no target '{name}'" in result.stderr
    for target in ("reproduce", "test", "figures", "ceilings", "claims"):
        assert re.search(rf"\b{target}\b", result.stderr), result.stderr


class Reporter:
    """What pytest_terminal_summary uses of pytest's terminal reporter."""

    def __init__(self, skipped):
        self.stats = {"skipped": skipped}
        self.lines = []

    def section(self, title):
        self.lines.append(f"== {title}")

    def write_line(self, line):
        self.lines.append(line)


def skipped_report(reason: str, as_tuple: bool = True):
    return SimpleNamespace(longrepr=("tests/x.py", 3, f"Skipped: {reason}") if as_tuple else f"Skipped: {reason}")


def test_the_test_run_ends_with_one_line_per_skip_reason():
    reasons = ["needs a CUDA GPU", "no ruff", "needs a CUDA GPU", "needs a CUDA GPU", "no ruff", "no kvikio"]
    reporter = Reporter([skipped_report(reason, as_tuple=i != 1) for i, reason in enumerate(reasons)])
    pytest_terminal_summary(reporter)
    assert reporter.lines == [
        "== skipped, by reason",
        "     3  needs a CUDA GPU",
        "     2  no ruff",
        "     1  no kvikio",
    ]
    quiet = Reporter([])
    pytest_terminal_summary(quiet)
    assert quiet.lines == []


def rst_warnings(text: str) -> str:
    """What docutils warns of while it parses ``text`` (the report renders captions with it)."""
    import io

    import docutils.core

    warnings = io.StringIO()
    settings = {"warning_stream": warnings, "report_level": 2, "halt_level": 5}
    docutils.core.publish_string(text, writer="null", settings_overrides=settings)
    return warnings.getvalue()


@pytest.mark.parametrize("caption", sorted((REPO_ROOT / "workflow" / "report").glob("*.rst")), ids=lambda p: p.name)
def test_report_captions_are_clean_restructured_text(caption):
    """A stray markup character (a lone ``*``) is a warning printed at every reproduce and a caption
    shown with its markup broken."""
    assert not rst_warnings(caption.read_text())


def test_a_lone_asterisk_in_a_caption_is_caught():
    assert "Inline emphasis" in rst_warnings("bars marked with a *, and left out")
