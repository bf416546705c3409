"""The policies on blocks compiled by ``torch.compile`` (inductor), each block compiled once and
its compiled forward run in every step (_compiled.py):

- ``compiled_keep``: every activation the compiled blocks save kept, with torch's default
  partitioner: the reference the compiled policies are checked against and their ratios taken to.
- ``torch_budget``: torch's own trade of compute for memory, the partitioner under
  ``torch._functorch.config.activation_memory_budget`` (one variant per budget of the part's
  ``budgets``): it keeps that fraction of the activations and recomputes the rest in backward,
  inside the compiled backward. Its recomputation can round differently from compiled keep, so it
  is checked within a tolerance, not bit for bit.
- ``offload_all_compiled``: SSDTrain's ``offload_all`` on the compiled blocks. The saved-tensor
  hooks around a compiled block's call see what its compiled forward saves for backward, so the
  offloader sends those tensors to the store as it does an eager block's.
"""

from systems.ssdtrain.policies import OffloaderPolicy, PolicyEntry, register
from systems.ssdtrain.policies.offload_all import OffloadAll


def _budgets(params) -> list[dict]:
    return [{"activation_budget": budget} for budget in params.get("budgets", [])]


register(
    PolicyEntry(
        "compiled_keep",
        "peer",
        label="torch.compile, keep",
        make=OffloaderPolicy,
        compiled=True,
        notes="each block compiled by torch.compile (inductor, default partitioner): the compiled policies' reference",
    )
)
register(
    PolicyEntry(
        "torch_budget",
        "peer",
        label="torch.compile, activation memory budget",
        make=OffloaderPolicy,
        compiled=True,
        exact=False,
        settings=_budgets,
        columns=lambda activation_budget: {"activation_budget": activation_budget},
        notes="each block compiled under torch._functorch.config.activation_memory_budget (one variant per budget)",
    )
)
register(
    PolicyEntry(
        "offload_all_compiled",
        "optimized",
        make=OffloadAll,
        uses_store=True,
        compiled=True,
        notes="SSDTrain's offload_all on blocks compiled by torch.compile",
    )
)
