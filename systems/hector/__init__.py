"""Hector (issue 14): relational GNN layers written in a small model language
(``lang.py``), traced into an inter-operator IR (``ir.py``), rewritten by passes (``passes.py``:
compact materialization, linear-operator reordering) and run by a backend: ``reference.py`` with
stock PyTorch operators (the oracle and the CPU path). The models are in ``models.py``."""
