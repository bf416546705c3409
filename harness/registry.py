"""Registries of what can be compared: one table per kind (gather variants, offload stores,
offload policies, relational-GNN forms), each entry an object that says what it is, what it is
there for and what it needs, never a branch of a string switch.

A registry is declared in the systems layer beside the technique it serves, with the package
its entries live in. Every module of that package is imported the first time the registry is
read, so a new entry is one new file in that package; an entry from outside the repository
registers from its own module, imported before the registry is read (``plugins``: the modules
named in the environment variable ``SUITE_PLUGINS``, comma-separated).

Roles are those of the results files (harness.results.ROLES) plus ``peer``: what a user would pick
instead today (another library, stock torch, a compiler), compared like a baseline.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from harness.errors import UserError

# What an entry is there for. ``baseline``: the path the paper compares against; ``peer``: what a
# user would pick instead today; both are "competitors" that speedups are quoted against (the
# fastest of them). ``optimized``: the technique or one of its steps. ``upper_bound``: the same work
# with the cost removed (no transfer, no memory limit): what nothing real can pass.
ENTRY_ROLES = ("baseline", "peer", "optimized", "upper_bound")
COMPETITOR_ROLES = ("baseline", "peer")
PLUGINS_ENV = "SUITE_PLUGINS"


@dataclass(frozen=True)
class Entry:
    """One comparable thing. Subclasses add how it is made or run.

    ``needs_gpu``: runs only with a CUDA device. ``packages``: import names it needs beyond the
    suite's requirements (checked by :meth:`missing`). ``label``: a plain-language name for figures.
    """

    name: str
    role: str
    label: str = ""
    needs_gpu: bool = False
    packages: tuple[str, ...] = ()
    notes: str = ""  # one line for docs and provenance: what it is, where it comes from

    def __post_init__(self):
        name = self.name
        if not name or not name.isascii() or not name.replace("_", "").isalnum() or not name.islower():
            raise ValueError(f"entry name {name!r}: use lowercase ASCII letters, digits and _")
        if self.role not in ENTRY_ROLES:
            raise ValueError(f"entry {self.name}: role {self.role!r} is not one of {', '.join(ENTRY_ROLES)}")

    @property
    def display(self) -> str:
        return self.label or self.name

    def missing(self, device: str = "cpu") -> str | None:
        """Why this entry cannot run here (one line), or None when it can."""
        if self.needs_gpu and not str(device).startswith("cuda"):
            return f"{self.name} needs a CUDA GPU"
        absent = [p for p in self.packages if importlib.util.find_spec(p) is None]
        if absent:
            return f"{self.name} needs the package(s) {', '.join(absent)}, which are not installed"
        return None


E = TypeVar("E", bound=Entry)


@dataclass
class Registry(Generic[E]):
    """Entries of one kind by name, in registration order; ``package`` names the package whose
    modules hold them (each imported on first read)."""

    kind: str  # e.g. "gather variant": used in messages
    package: str | None = None
    _entries: dict[str, E] = field(default_factory=dict, init=False, repr=False)
    _modules: dict[str, str] = field(default_factory=dict, init=False, repr=False)  # who registered each
    _loaded: bool = field(default=False, init=False, repr=False)

    def register(self, entry: E) -> E:
        """Add ``entry``; a second entry of the same name is refused (a typo must not shadow one),
        naming the modules that registered both."""
        module = self._registering_module()
        if entry.name in self._entries and self._entries[entry.name] != entry:
            first = self._modules.get(entry.name, "?")
            raise ValueError(
                f"{self.kind} {entry.name!r} is registered twice, by {first} and by {module}: give one another name"
            )
        self._entries[entry.name] = entry
        self._modules[entry.name] = module
        return entry

    def _registering_module(self) -> str:
        """The module whose code registers: the first caller outside this file and the registry's
        package (whose ``register`` helper passes entries on)."""
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__") in (__name__, self.package):
            frame = frame.f_back
        return frame.f_globals.get("__name__", "?") if frame is not None else "?"

    def unregister(self, name: str) -> None:
        """Remove an entry (tests register temporary entries)."""
        self._entries.pop(name, None)
        self._modules.pop(name, None)

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True  # first: a module being imported may read the registry
        try:
            if self.package:
                pkg = importlib.import_module(self.package)
                for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
                    if info.name.startswith("_"):
                        continue
                    module = f"{self.package}.{info.name}"
                    try:
                        _import_entries_module(module)
                    except BaseException:
                        # What it registered before it failed goes with it: the next read imports
                        # it anew and must meet its own error, not its earlier entries.
                        for name in [n for n, m in self._modules.items() if m == module]:
                            self.unregister(name)
                        raise
            load_plugins()
        except BaseException:
            self._loaded = False  # never read as whole while a module of it failed: the next read fails too
            raise

    def __getitem__(self, name: str) -> E:
        self._load()
        if name not in self._entries:
            raise UserError(f"unknown {self.kind} {name!r}; one of {', '.join(self._entries)}")
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[E]:
        self._load()
        return iter(list(self._entries.values()))

    def __len__(self) -> int:
        self._load()
        return len(self._entries)

    def names(self, *roles: str) -> tuple[str, ...]:
        """Entry names, in registration order; only those of ``roles`` when given."""
        return tuple(e.name for e in self if not roles or e.role in roles)


def _import_entries_module(name: str) -> None:
    """Import one module of a registry's package; whatever it raises (a name registered twice, a
    bad role, a typo in its code) becomes one line naming the module and its file."""
    try:
        importlib.import_module(name)
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - the user's new file: one line naming it
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        lines = [f.lineno for f in traceback.extract_tb(err.__traceback__) if origin and f.filename == origin]
        where = f" ({os.path.relpath(origin)}{f', line {lines[-1]}' if lines else ''})" if origin else ""
        raise UserError(
            f"module {name}{where} raised while importing (registering its entries included): "
            f"{type(err).__name__}: {err}"
        ) from err


def load_plugins() -> None:
    """Import the modules named in ``SUITE_PLUGINS`` (comma-separated): out-of-tree entries."""
    for name in filter(None, (s.strip() for s in os.environ.get(PLUGINS_ENV, "").split(","))):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name is None or not name.startswith(err.name):
                raise UserError(f"{PLUGINS_ENV} names module {name!r}, which failed to import: {err}") from err
            raise UserError(
                f"{PLUGINS_ENV} names module {name!r}, which Python cannot find ({err}): is its folder on PYTHONPATH?"
            ) from err
        except Exception as err:  # noqa: BLE001 - whatever a plugin raises, the user gets one line naming it
            raise UserError(
                f"{PLUGINS_ENV} names module {name!r}, which raised while importing (registering its entries "
                f"included): {type(err).__name__}: {err}"
            ) from err
