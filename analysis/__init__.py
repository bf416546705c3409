"""Analysis notebooks (jupytext percent-format .py files) and the helper that executes them."""
