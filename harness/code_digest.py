"""Which code a measurement ran, as one sha256: runs whose digests agree measured the same code,
whatever their commits say, and count together as processes of one measurement.

A topic's digest covers the files its parts can run, found from the source itself:

* the roots: all of ``harness/`` (every part runs through it), the command line
  ``workloads/__main__.py``, the topic's package ``workloads/<topic>/``, every topic's declaration
  ``workloads/*/__init__.py`` (the runner reads them all to find the topics), and the config
  files ``config/config.yaml`` and ``config/<topic>.yaml``;
* then, followed from each module through every ``import`` (at any depth, inside functions
  too) and every dotted suite module name written in a string (``importlib.import_module``'s
  argument): the module and the ``__init__`` of each package on its path; for a package that
  declares a registry (``Registry(...)`` in its ``__init__``, which imports every module and
  sub-package of it when read: harness.registry), all of them; and the files beside each module
  that are not Python (kernel sources, tables), with the folders of them that are not packages.

A change to another topic's code, to the docs, the analysis or the figures moves no digest of this
topic. The same files read from a commit's tree in git give the same digest, so an older record
of a clean commit can get its digest afterwards (tools/add_code_digest.py). Without a topic the
digest covers everything under :data:`MEASURED_CODE`. Neither this module nor the record writer
is covered: they decide no number.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath

MEASURED_CODE = ("config", "harness", "systems", "workloads")
SUITE_PACKAGES = ("harness", "systems", "workloads")
RECORD_WRITERS = ("harness/provenance.py", "harness/code_digest.py")
# A symbolic link is hashed as this tag and its target's name, so that a link and a file holding the
# same name differ; git stores a link as a blob of that name under this mode.
LINK_TAG = b"symbolic link\0"
GIT_LINK_MODE = "120000"
_MODULE_NAME = re.compile(r"^(?:harness|systems|workloads)(?:\.[A-Za-z_]\w*)+$")  # a suite module named in a string


def digest(files: Mapping[str, bytes], topic: str | None = None) -> str:
    """sha256 over ``topic``'s files of ``files`` (posix path -> contents), by path and contents."""
    total = hashlib.sha256()
    for path in sorted(topic_files(files, topic) if topic else files):
        total.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return total.hexdigest()


def topic_files(files: Mapping[str, bytes], topic: str) -> set[str]:
    """The paths of ``files`` that ``topic``'s parts can run (the module docstring says how)."""
    if not any(path.startswith(f"workloads/{topic}/") for path in files):
        raise ValueError(f"no topic {topic!r}: there is no workloads/{topic}/ in the measured code")
    modules = _modules(files)  # module name -> path
    roots = [p for p in files if p.startswith(("harness/", f"workloads/{topic}/"))]
    roots += [p for p in files if re.fullmatch(r"workloads/(\w+/__init__|__main__)\.py", p)]
    scope = {p for p in (f"config/{topic}.yaml", "config/config.yaml") if p in files}
    todo = list(roots)
    while todo:
        path = todo.pop()
        if path in scope:
            continue
        scope.add(path)
        if not path.endswith(".py"):
            continue
        folder = PurePosixPath(path).parent
        todo += _beside(files, folder)
        todo += [p for p in _package_inits(folder) if p in files]
        tree = _parse(files[path])
        if path.endswith("/__init__.py") and _declares_registry(tree):
            todo += _package_contents(files, folder)
        for name in _named_modules(tree, _package_of(path)):
            if name in modules:
                todo.append(modules[name])
    return scope


def files_on_disk(root: os.PathLike) -> dict[str, bytes]:
    """Every measured file under ``root`` as it is on disk. A link is not followed: it counts as
    its target's name, as git stores it."""
    root = os.fspath(root)
    files = {}
    for folder in MEASURED_CODE:
        for parent, folders, names in os.walk(os.path.join(root, folder)):  # does not descend into links
            for name in names + [f for f in folders if os.path.islink(os.path.join(parent, f))]:
                path = os.path.join(parent, name)
                relative = PurePosixPath(os.path.relpath(path, root).replace(os.sep, "/"))
                if not _is_code(relative):
                    continue
                if os.path.islink(path):
                    files[relative.as_posix()] = LINK_TAG + os.readlink(path).encode()
                elif os.path.isfile(path):
                    with open(path, "rb") as f:
                        files[relative.as_posix()] = f.read()
    return files


def files_at(commit: str, root: os.PathLike) -> dict[str, bytes] | None:
    """:func:`files_on_disk` of ``commit``'s tree, from the git repository at ``root``; None where
    git, the commit or one of its files is missing (a copy without history, a shallow or a partial
    clone)."""
    try:
        listing = _run_git(["ls-tree", "-r", "-z", "--full-tree", commit, "--", *MEASURED_CODE], root)
    except (subprocess.SubprocessError, OSError):
        return None
    entries = []
    for line in listing.split(b"\0"):
        if line:
            meta, path = line.split(b"\t", 1)
            mode, kind, sha = meta.decode().split()
            if kind == "blob" and _is_code(PurePosixPath(path.decode(errors="surrogateescape"))):
                entries.append((path.decode(errors="surrogateescape"), mode, sha))
    try:
        blobs = _run_git(["cat-file", "--batch"], root, stdin="".join(f"{sha}\n" for *_, sha in entries).encode())
    except (subprocess.SubprocessError, OSError):
        return None
    files, at = {}, 0
    for path, mode, _ in entries:  # each answer: "<sha> blob <size>\n<contents>\n", or "<sha> missing\n"
        header_end = blobs.index(b"\n", at)
        header = blobs[at:header_end].split()
        if len(header) != 3:
            return None
        size = int(header[2])
        data = blobs[header_end + 1 : header_end + 1 + size]
        files[path] = LINK_TAG + data if mode == GIT_LINK_MODE else data
        at = header_end + 1 + size + 1
    return files


def _is_code(relative: PurePosixPath) -> bool:
    """Measured code: not a record writer, not a cache or a build leftover (no hidden,
    ``__pycache__`` or ``*.egg-info`` folder on the path, not compiled Python)."""
    folders_ok = all(not (p.startswith(".") or p == "__pycache__" or p.endswith(".egg-info")) for p in relative.parts)
    return folders_ok and relative.suffix not in (".pyc", ".pyo") and relative.as_posix() not in RECORD_WRITERS


def _run_git(args: list[str], root: os.PathLike, stdin: bytes | None = None) -> bytes:
    return subprocess.run(["git", *args], cwd=root, input=stdin, capture_output=True, timeout=60, check=True).stdout


def _module_of(path: str) -> str:
    """``systems/hector/op.py`` -> ``systems.hector.op``; a package's ``__init__.py`` -> the package."""
    parts = PurePosixPath(path).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(files: Iterable[str]) -> dict[str, str]:
    return {_module_of(p): p for p in files if p.endswith(".py") and p.startswith(SUITE_PACKAGES)}


def _package_of(path: str) -> list[str]:
    """The package a module's relative imports start from: its folder, as module names."""
    return list(PurePosixPath(path).parent.parts)


def _parse(source: bytes) -> ast.Module | None:
    """The module's syntax tree; None for a file that does not parse (it cannot have run either)."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def _named_modules(tree: ast.Module | None, package: list[str]) -> set[str]:
    """Every suite module ``tree`` imports or names in a string: for ``from a.b import c``, both
    ``a.b`` and ``a.b.c`` (c may be a module); a package stands for its ``__init__``."""
    names = set()
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: level 1 is the module's own package, 2 its parent, ...
                start = package[: len(package) - node.level + 1]
                base = ".".join([*start, base] if base else start)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_NAME.match(node.value):
            names.add(node.value)
    return {name for name in names if name.startswith(SUITE_PACKAGES)}


def _declares_registry(tree: ast.Module | None) -> bool:
    """Whether the module calls ``Registry(...)`` (harness.registry): reading it imports its package."""
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Call):
            func = node.func
            if (isinstance(func, ast.Name) and func.id == "Registry") or (
                isinstance(func, ast.Attribute) and func.attr == "Registry"
            ):
                return True
    return False


def _package_contents(files: Mapping[str, bytes], folder: PurePosixPath) -> list[str]:
    """Every module of the package in ``folder`` and the ``__init__`` of each sub-package."""
    found = []
    for path in files:
        p = PurePosixPath(path)
        if path.endswith(".py") and (p.parent == folder or (p.name == "__init__.py" and p.parent.parent == folder)):
            found.append(path)
    return found


def _package_inits(folder: PurePosixPath) -> list[str]:
    return [f"{PurePosixPath(*folder.parts[:n])}/__init__.py" for n in range(1, len(folder.parts) + 1)]


def _beside(files: Mapping[str, bytes], folder: PurePosixPath) -> list[str]:
    """Files in ``folder`` that are not Python, and every file in its sub-folders that are not
    packages (kernel sources, tables read at run time)."""
    found = []
    for path in files:
        p = PurePosixPath(path)
        if p.parent == folder:
            found += [] if path.endswith(".py") else [path]
        elif p.is_relative_to(folder) and not _in_package_below(files, folder, p):
            found.append(path)
    return found


def _in_package_below(files: Mapping[str, bytes], folder: PurePosixPath, path: PurePosixPath) -> bool:
    """Whether a folder between ``folder`` and ``path`` is a package of its own."""
    below = path.relative_to(folder).parts[:-1]
    return any(f"{folder.joinpath(*below[:n])}/__init__.py" in files for n in range(1, len(below) + 1))
