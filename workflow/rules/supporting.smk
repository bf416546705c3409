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


_TOLD_UNRENDERED = []


def figures_inputs(wildcards):
    """The inputs of `figures`: every figure with results to render, their supporting figures and
    the claims tables. It names, once, each figure of this machine it leaves out, its results
    incomplete (rendering never measures), and how to measure them."""
    wanted = [f for name in TOPICS for f in (*committed_figures(name), *supporting_figures(name))]
    for (topic, scale), missing in sorted(UNRENDERED.items()):
        if (topic, scale) not in _TOLD_UNRENDERED:
            _TOLD_UNRENDERED.append((topic, scale))
            print(
                f"figures: paper_figs/{MACHINE}/{topic}-{scale}.png not rendered: {len(missing)} of its results "
                f"files are missing ({missing[0]}{', ...' if len(missing) > 1 else ''}); "
                f"`snakemake --cores all {topic} --config scale={scale} machine={MACHINE}` measures them",
                file=sys.stderr,
            )
    return [*wanted, *COMMITTED_CLAIMS]
