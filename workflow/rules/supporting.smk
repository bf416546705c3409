# The supporting figures of each topic: the kinds with a caption, and those on disk that the
# report shows (workflow/rules/report.smk declares their rules). Functions only: Snakemake's lint
# asks for rules and functions in separate files.


def supporting_kinds(topic):
    """The kinds of supporting figure of ``topic``: those with a caption file."""
    prefix = f"{topic}-"
    return sorted(p.stem.removeprefix(prefix) for p in Path("workflow/report").glob(f"{prefix}*.rst"))


def supporting_figures(topic):
    """The supporting figures on disk beside each figure of ``topic`` that `figures` renders
    (the report shows them; a render that did not run yet has none to show)."""
    found = []
    for figure in committed_figures(topic):
        stem = Path(figure).stem
        for path in sorted(Path(figure).parent.glob(f"{stem}-*.png")):
            if re.fullmatch(re.escape(stem) + r"-[a-z0-9_]+\.png", path.name):
                found.append(str(path))
    return found
