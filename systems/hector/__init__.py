"""Hector: relational GNN layers written in a small model language
(``lang.py``), traced into an inter-operator IR (``ir.py``), rewritten by passes (``passes.py``:
compact materialization, linear-operator reordering) and run by a backend: ``reference.py`` with
stock PyTorch operators (the oracle and the CPU path), or CUDA generated from templates
(``lower.py``, ``codegen.py``), as a ``torch.library`` operator (``op.py``). The models' programs
are declared with the models (systems/rgnn/models); Hector's variants are forms there
(systems/rgnn/forms/hector.py)."""
