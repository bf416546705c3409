"""Show what Hector makes of a model: its IR before and after each pass, and the plan of template
instances (forward, or forward and backward).

    python -m systems.hector rgat                       # IR, IR after reorder, after compact, plan
    python -m systems.hector hgt --passes compact --backward
    python -m systems.hector rgcn --cuda                # also the generated CUDA of each instance
"""

from __future__ import annotations

import argparse

from harness.errors import UserError, exit_on_user_error
from systems.hector import autodiff, codegen, lower, passes
from systems.rgnn.models import MODELS


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m systems.hector", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=sorted(m.name for m in MODELS if m.program is not None))
    parser.add_argument("--passes", default="reorder,compact", help="comma-separated, in order (default: both)")
    parser.add_argument("--backward", action="store_true", help="differentiate, then lower forward and backward")
    parser.add_argument("--cuda", action="store_true", help="print every generated kernel instance")
    args = parser.parse_args(argv)
    names = [n for n in args.passes.split(",") if n]
    unknown = [n for n in names if n not in passes.PASSES]
    if unknown:
        raise UserError(f"unknown pass {unknown[0]!r}; passes: {', '.join(passes.PASSES)}")
    program = MODELS[args.model].program()
    print(program, end="\n\n")
    for name in names:
        program = passes.PASSES[name](program)
        print(f"# after {name}\n{program}", end="\n\n")
    if args.backward:
        program = autodiff.differentiate(program)
        print(f"# with its backward\n{program}", end="\n\n")
    print(f"# plan\n{lower.lower(program)}")
    if args.cuda:
        for name, text in codegen.sources(program).items():
            print(f"\n// ---- {name}\n{text}")


if __name__ == "__main__":
    main()
