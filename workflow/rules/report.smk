# What the report shows beside the headline figures, and the docs' generated tables.
#
# Supporting figures: a figure's render also writes `<topic>-<scale>-<kind>[_N].png` beside it
# (analysis/render.py); which ones depends on the results, so they are declared here, one rule
# per kind that has a caption, `workflow/report/<topic>-<kind>.rst`. The rule takes the figure
# as input (the render that writes it) and only checks that the render left the file: it never
# renders or measures anything itself.


for topic in TOPICS.values():
    for kind in supporting_kinds(topic.name):

        rule:
            name:
                f"{topic.name}_{kind}_figure"
            input:
                figure=f"paper_figs/{{machine}}/{topic.name}-{{scale}}.png",
            output:
                supporting=report(
                    update(f"paper_figs/{{machine}}/{topic.name}-{{scale}}-{kind}{{chunk}}.png"),
                    caption=f"../report/{topic.name}-{kind}.rst",
                    category=topic.title,
                    subcategory="supporting figures",
                    labels={"machine": "{machine}", "scale": "{scale}", "figure": f"{kind}{{chunk}}"},
                ),
            log:
                f"logs/{{machine}}/supporting/{topic.name}-{{scale}}-{kind}{{chunk}}.log",
            wildcard_constraints:
                chunk="(_[0-9]+)?",
            shell:
                "if test -s {output.supporting}; then touch {output.supporting}; else"
                " echo 'error: the render of {input.figure} wrote no {output.supporting}"
                " (its notebook no longer draws it: run the command again)' | tee {log} >&2; exit 1; fi"


# The measured tables quoted in docs/, rewritten from the committed results
# (analysis/doc_tables); `make doc_tables` runs it. It rewrites docs in place, so it declares no
# output and runs whenever it is asked for.
rule doc_tables:
    """Rewrite the generated tables of docs/ from the results under results/ (never measures)."""
    log:
        "logs/doc_tables.log",
    params:
        python=PYTHON,
    shell:
        "{params.python} -m analysis.doc_tables 2>&1 | tee {log}"
