"""One look for every figure of the suite: a fixed colour and line style per variant, so a path
reads the same in every panel and every topic's figure."""

# variant -> (colour, line style). Baselines in greys and black, stock torch on the alias in
# pinks, the suite's zero-copy steps in a warm-to-cool ramp, upper bounds in purple.
VARIANT_STYLE = {
    "pageable": ("tab:gray", ":"),
    "cpu_gather": ("black", "-"),
    "cpu_gather_pipelined": ("dimgray", "-."),
    "torch_uva": ("tab:pink", "-"),
    "torch_uva_sorted": ("mediumvioletred", "--"),
    "wholegraph": ("goldenrod", "-"),
    "all_in_gpu": ("tab:purple", "--"),
    "naive": ("tab:red", "-"),
    "aligned": ("tab:orange", "-"),
    "vectorized": ("tab:blue", "-"),
    "vectorized_kernel": ("tab:brown", ":"),
    "sorted": ("tab:green", "-"),
    "hot_cache": ("tab:olive", "-"),
    "split": ("tab:cyan", "-"),
}


def color(variant: str) -> str:
    return VARIANT_STYLE[variant][0]
