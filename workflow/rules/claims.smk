# The papers' headline claims against each machine's results: paper_figs/<machine>/claims.md,
# rendered by analysis/claims.py from config/claims.yaml (`snakemake --cores all claims`).
#
# This machine's table reads its results at the configured scale (measured if missing, as a
# topic's target does); another machine's reads the files committed for it.

CLAIMS_FILE = "config/claims.yaml"
CLAIMS_SCHEMA = "workflow/schemas/claims.schema.yaml"

# The topics the claims read, and the ceilings for the machine column. A malformed claims file is
# refused here in one line, before any job starts (the job checks the rest: topics, parts, columns).
try:
    _claims_document = suite_config._read_yaml(Path(CLAIMS_FILE), "claims file")
    suite_config._check(_claims_document, Path(CLAIMS_SCHEMA), f"{CLAIMS_FILE}: ")
except UserError as err:
    sys.exit(f"error: {err}")
CLAIM_TOPICS = sorted(
    ({claim["measure"]["topic"] for claim in _claims_document["claims"] if "measure" in claim} | {"ceilings"})
    & set(TOPICS)
)

# The scale each machine's claims are computed at: this machine's configured one; another
# machine's is the scale of its committed results (the configured one, or else the one with the
# most files, where it has several).
CLAIMS_SCALE = {} if FOREIGN_FOLDER else {MACHINE: SCALE}  # another machine's folder: its own scale
for _folder in sorted(Path("results").glob("*/")):
    _counts = {}
    for _csv in results_in(_folder, "*/*"):
        if RESULTS_NAME.fullmatch(f"{_folder.name}/{_csv.name}"):
            _scale = results_name(_csv).rsplit("-", 1)[-1]
            _counts[_scale] = _counts.get(_scale, 0) + 1
    if _counts and _folder.name not in CLAIMS_SCALE:
        CLAIMS_SCALE[_folder.name] = SCALE if SCALE in _counts else max(sorted(_counts), key=_counts.get)

# Every results file (and re-run) of the claims' topics for one machine at its claims scale.
claims_results = lambda machine: [
    path
    for topic in CLAIM_TOPICS
    for scale in [CLAIMS_SCALE.get(machine, SCALE)]
    for path in (*results_of(topic, machine, scale), *reruns_of(topic, machine, scale))
]

# The claims tables of every machine with results under results/; this machine's only when all
# the files its claims read are there, so rendering never triggers a measurement.
COMMITTED_CLAIMS = [
    f"paper_figs/{machine}/claims.md"
    for machine in sorted(CLAIMS_SCALE)
    if machine != MACHINE
    or (Path("results", MACHINE).is_dir() and all(Path(p).exists() for p in claims_results(MACHINE)))
]


rule claims:
    """The claims table of this machine (measuring what its claims read) and of every machine
    with committed results."""
    input:
        measuring_targets(claims=True),
        [path for path in COMMITTED_CLAIMS if path != f"paper_figs/{MACHINE}/claims.md"],


# As a figure's render, `update` keeps the previous table until a new one is written whole.
rule claims_table:
    """One machine's claims table: each paper's value against this machine's, with a verdict."""
    input:
        results=lambda wildcards: claims_results(wildcards.machine),
        claims=CLAIMS_FILE,
        schema=CLAIMS_SCHEMA,
        notebook="analysis/claims.py",
        helpers="analysis/common.py",
    output:
        table=report(
            update("paper_figs/{machine}/claims.md"),
            caption="../report/claims.rst",
            category="Claims",
            labels={"machine": "{machine}"},
        ),
    log:
        "logs/{machine}/claims.log",
    params:
        python=PYTHON,
        scale=lambda wildcards: CLAIMS_SCALE.get(wildcards.machine, SCALE),
    shell:
        "{params.python} -m analysis.claims --machine {wildcards.machine} --scale {params.scale}"
        " --claims {input.claims} --out {output.table} 2>&1 | tee {log}"
