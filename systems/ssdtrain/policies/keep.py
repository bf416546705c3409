"""``keep``: every activation stays on the device, as autograd keeps it without any hooks: the
reference each policy is checked against and every ratio is taken to. It runs under an Offloader
that offloads nothing, which counts what the step saves."""

from systems.ssdtrain.policies import OffloaderPolicy, PolicyEntry, register

register(
    PolicyEntry(
        "keep",
        "baseline",
        make=OffloaderPolicy,
        notes="every activation kept on the device (the reference)",
    )
)
