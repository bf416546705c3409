"""Where offloaded tensors go: one interface, :class:`Store` (``_base.py``), and one registry,
:data:`STORES`, that every module of this package adds its store to.

The suite's stores, by module:

- ``host``: host memory (page-locked for GPU tensors); the bound any SSD is compared with.
- ``direct_file`` (entry ``file``): one file per tensor on a real disk, O_DIRECT, a pool of I/O
  threads.
- ``kvikio_file`` (entry ``kvikio``): one file per tensor through kvikio (cuFile; GPUDirect Storage
  where the machine has it), for GPU tensors.
- ``emulated``: host memory throttled to a given bandwidth, standing in for a disk array this
  machine lacks; one store per bandwidth the part's ``emulated_gbps`` lists, labelled emulated.

A new store is one new module here (or a module of your own named in ``SUITE_PLUGINS``): a
:class:`Store` subclass and a :class:`StoreEntry` that says what it needs and how a measuring part
makes it from its parameters. A user who offloads their own model needs no entry: construct the
store and hand it to an ``Offloader`` or a policy (systems/ssdtrain/policies).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UserError
from harness.registry import Entry, Registry
from systems.ssdtrain.stores._base import READ, WRITE, Store, StoreCorrupted, StoreCounters

__all__ = ["READ", "STORES", "WRITE", "Store", "StoreCorrupted", "StoreCounters", "StoreEntry", "register"]


def one_setting(params: Mapping) -> list[dict]:
    return [{}]


@dataclass(frozen=True)
class StoreEntry(Entry):
    """One kind of store, and how a measuring part makes it.

    ``make(params, folder, **setting)`` returns a new, open store. ``params`` are the part's
    parameters (config/llm_offload.yaml: ``file_threads``, ``file_block_mib``, ...; read with a
    default what the schema does not list), ``folder`` the part's scratch folder on a real disk
    (``None`` where the part has none; an entry with ``scratch`` True is then refused).
    ``settings(params)``: one dict per store the parameters ask for, each passed to ``make`` as
    keyword arguments and recorded in the results (default: one store, no setting); an emulated
    store has one per bandwidth. ``emulated``: its speed is a setting, not a device's (results say
    so). ``columns(setting)``: results columns a setting fills (they must be in the topic's schema).
    """

    make: Callable[..., Store] | None = None
    settings: Callable[[Mapping], list[dict]] = one_setting
    scratch: bool = False  # writes files into the part's scratch folder, which must be on a real disk
    emulated: bool = False
    columns: Callable[..., dict] = lambda **setting: {}

    def __post_init__(self):
        super().__post_init__()
        if self.make is None:
            raise ValueError(f"offload store {self.name}: give make(params, folder, **setting)")

    def build(self, params: Mapping, folder: Path | None, **setting) -> Store:
        """A new store of this kind for a part with ``params`` and scratch ``folder``."""
        if self.scratch and folder is None:
            raise ValueError(f"offload store {self.name} writes files and needs a scratch folder")
        if self.scratch:
            # The suite's own scratch folder (config.yaml's scratch_dir) is made on first use; a
            # store given a folder directly refuses a missing one (fileio.make_scratch). "~/x" is
            # the home folder's x here too, not a folder named "~".
            folder = Path(folder).expanduser()
            folder.mkdir(parents=True, exist_ok=True)
        try:  # a make of another signature would fail inside, with a TypeError naming no store
            inspect.signature(self.make).bind(params, folder, **setting)
        except TypeError as error:
            raise UserError(
                f"offload store {self.name}: make{inspect.signature(self.make)} cannot be called as "
                f"make(params, folder{''.join(f', {k}=...' for k in setting)}): {error}"
            ) from None
        return self.make(params, folder, **setting)


STORES: Registry[StoreEntry] = Registry("offload store", __name__)


def register(entry: StoreEntry) -> StoreEntry:
    return STORES.register(entry)
