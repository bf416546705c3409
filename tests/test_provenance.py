"""Provenance records say which code, machine, software, date and scale produced a number."""

import re
import sys
from pathlib import Path

import pytest

from harness import code_digest, machine, provenance
from harness.errors import UserError


def test_record_has_every_field_a_reader_needs():
    record = provenance.collect("tiny", topic="demo")
    assert record["scale"] == "tiny" and record["topic"] == "demo"
    assert record["date_utc"].endswith("+00:00")
    assert set(record["git"]) == {"commit", "dirty", "source"}
    m = record["machine"]
    assert m["cpu_model"] and m["logical_cpus"] >= 1 and m["memory_bytes"] > 0
    assert "torch" in record["packages"] and "numpy" in record["packages"]
    assert record["cuda"]["available"] in (True, False)


def test_commit_named_in_the_environment_wins_over_a_stale_git_copy(monkeypatch):
    def fake_git(*args):
        if args[:2] == ("rev-parse", "--show-toplevel"):
            return str(provenance.REPO_ROOT)
        return "feedbeef" * 5 if args[0] == "rev-parse" else " M x.py"

    monkeypatch.setattr(provenance, "_git", fake_git)
    monkeypatch.setenv("SUITE_GIT_COMMIT", "0123abcd" * 5)
    monkeypatch.setenv("SUITE_GIT_DIRTY", "1")
    state = provenance.git_state()
    assert state == {
        "commit": "0123abcd" * 5,
        "dirty": True,
        "source": "environment (SUITE_GIT_COMMIT, set by whoever copied the tree)",
    }
    for word, dirty in (("yes", True), ("False", False), (" 0", False)):
        monkeypatch.setenv("SUITE_GIT_DIRTY", word)
        assert provenance.git_state()["dirty"] is dirty
    monkeypatch.setenv("SUITE_GIT_DIRTY", "maybe")
    with pytest.raises(UserError, match="SUITE_GIT_DIRTY must be 1 or 0 .*not 'maybe'"):
        provenance.git_state()
    monkeypatch.delenv("SUITE_GIT_DIRTY")
    assert provenance.git_state()["dirty"] is None  # not said is not clean
    monkeypatch.delenv("SUITE_GIT_COMMIT")
    monkeypatch.setenv("SUITE_GIT_DIRTY", "maybe")
    with pytest.raises(UserError, match="SUITE_GIT_DIRTY must be"):  # also without a commit named
        provenance.git_state()
    monkeypatch.delenv("SUITE_GIT_DIRTY")
    for typo in ("", "xyz", "HEAD", "0123ab", "0123abcd " * 2):  # recorded as the commit, it would name no measurement
        monkeypatch.setenv("SUITE_GIT_COMMIT", typo)
        with pytest.raises(UserError, match=f"SUITE_GIT_COMMIT must be a commit hash .*not {typo!r}"):
            provenance.git_state()
    monkeypatch.setenv("SUITE_GIT_COMMIT", "0123abcd" * 5)
    monkeypatch.delenv("SUITE_GIT_COMMIT")
    assert provenance.git_state() == {"commit": "feedbeef" * 5, "dirty": True, "source": "git"}
    # No tracked file changed, a new file not added yet: dirty where it is code or config only.
    for path, dirty in (("systems/pytorch_direct/gather_variants/mine.py", True), ("notes.txt", False)):

        def git(*args, path=path):
            if args[:2] == ("rev-parse", "--show-toplevel"):
                return str(provenance.REPO_ROOT)
            if args[0] == "rev-parse":
                return "feedbeef" * 5
            untracked = "--untracked-files=all" in args and any(path.startswith(f"{f}/") for f in args[3:])
            return f"?? {path}" if untracked else ""

        monkeypatch.setattr(provenance, "_git", git)
        assert provenance.git_state()["dirty"] is dirty, path
    monkeypatch.setattr(provenance, "_git", lambda *args: None)
    assert provenance.git_state()["commit"] == "unknown"


def test_a_status_git_could_not_give_is_not_a_clean_tree(monkeypatch):
    """A corrupt index: rev-parse answers, status fails; the tree was recorded as clean."""

    def git(*args):
        if args[:2] == ("rev-parse", "--show-toplevel"):
            return str(provenance.REPO_ROOT)
        return "feedbeef" * 5 if args[0] == "rev-parse" else None

    monkeypatch.delenv("SUITE_GIT_COMMIT", raising=False)
    monkeypatch.setattr(provenance, "_git", git)
    assert provenance.git_state() == {"commit": "feedbeef" * 5, "dirty": None, "source": "git"}


def test_a_tree_inside_another_repository_records_no_commit(tmp_path, monkeypatch):
    """A source tarball unpacked inside an unrelated repository recorded that repository's commit."""
    monkeypatch.delenv("SUITE_GIT_COMMIT", raising=False)
    monkeypatch.setattr(
        provenance, "_git", lambda *args: str(tmp_path) if args[1:2] == ("--show-toplevel",) else "0badc0de" * 5
    )
    assert provenance.git_state() == {"commit": "unknown", "dirty": None, "source": "unavailable"}


def test_a_record_names_only_the_gpus_this_python_used(monkeypatch):
    """A CPU run on a GPU host (the CPU build of torch, CUDA_VISIBLE_DEVICES empty) was labelled
    with the host's GPUs, and its GPU parts as not measured; with some GPUs visible, those."""
    gpus = tuple(machine.GpuInfo(name=f"GPU {i}", memory_mib=1024, driver="1.0", pcie="gen5 x16") for i in range(4))
    monkeypatch.setattr(machine, "_nvidia_smi_gpus", lambda: gpus)
    monkeypatch.setattr(machine, "_torch_sees_a_gpu", lambda: False)
    assert machine.describe().gpus == () and machine.hardware()[0] == ()
    monkeypatch.setattr(machine, "_torch_sees_a_gpu", lambda: True)
    monkeypatch.setattr(machine, "gpu_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert [g.name for g in machine.describe().gpus] == ["GPU 3", "GPU 1"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert [g.name for g in machine.describe().gpus] == ["GPU 0", "GPU 1"]


def test_hiding_the_gpu_in_one_test_does_not_hide_it_from_the_next(monkeypatch):
    fake = (machine.GpuInfo(name="Fake GPU", memory_mib=1024, driver="1.0", pcie="gen5 x16"),)
    monkeypatch.setattr(machine, "_nvidia_smi_gpus", lambda: fake)
    with monkeypatch.context() as hidden:
        hidden.setenv("SUITE_HIDE_GPU", "1")
        assert machine.nvidia_gpus() == () and not machine.has_gpu()
    assert machine.nvidia_gpus() == fake


# --- the digest of the measured code ---------------------------------------------------------------


def _tree(root, files):
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _all(root):
    return code_digest.digest(code_digest.files_on_disk(root))


CODE = {
    "config/topic.yaml": b"repeat: 3\n",
    "harness/timing.py": b"def f():\n    return 1\n",
    "systems/kernels/k.cu": b"\x00\xff\n\n binary-ish \r\n",  # newlines and NULs inside a blob
    "workloads/w.py": b"",  # an empty file is still a file
}


def test_the_code_digest_moves_with_the_measured_code_and_nothing_else(tmp_path):
    _tree(tmp_path, CODE)
    first = _all(tmp_path)
    assert len(first) == 64 and first == _all(tmp_path)
    _tree(tmp_path, {"docs/a.md": b"prose", "analysis/fig.py": b"x = 1", "README.md": b"hi"})
    _tree(tmp_path, {"systems/__pycache__/m.cpython-311.pyc": b"\x00", "harness/timing.pyc": b"\x01"})
    _tree(tmp_path, {"workloads/.pytest_cache/v": b"1", "systems/x.egg-info/PKG-INFO": b"1"})
    _tree(tmp_path, {writer: b"# what a record holds" for writer in code_digest.RECORD_WRITERS})
    assert _all(tmp_path) == first  # docs, analysis, caches and the record writers decide no number
    for change in (
        {"harness/timing.py": b"def f():\n    return 2\n"},  # one byte
        {"workloads/new.py": b""},  # a new, empty file
        {"config/topic.yaml": b"repeat: 3\n", "config/other.yaml": b"repeat: 3\n"},
    ):
        _tree(tmp_path, change)
        assert _all(tmp_path) != first
        first = _all(tmp_path)
    (tmp_path / "workloads/new.py").rename(tmp_path / "workloads/renamed.py")
    assert _all(tmp_path) != first  # the path counts, not only the bytes


# A suite of two topics: "mine" uses a kernel package through an import inside a function, a
# registry (which imports every module of its package) and a module named in a string; "theirs"
# uses a package of its own.
SUITE = {
    "config/config.yaml": b"scale: tiny\n",
    "config/mine.yaml": b"repeat: 3\n",
    "config/theirs.yaml": b"repeat: 5\n",
    "config/claims.yaml": b"claims: []\n",
    "harness/__init__.py": b"",
    "harness/timing.py": b"def f():\n    return 1\n",
    "workloads/__init__.py": b"",
    "workloads/__main__.py": b"from harness import timing\n",
    "workloads/mine/__init__.py": b"from workloads.mine import schema\nTOPIC = 'mine'\n",
    "workloads/mine/schema.py": b"SCHEMA = {}\n",
    "workloads/mine/parts.py": (
        b"def part():\n    import systems.fast.op as op\n    import systems.fast.loader\n    return op.run()\n"
    ),
    "workloads/theirs/__init__.py": b"TOPIC = 'theirs'\n",
    "workloads/theirs/parts.py": b"import systems.slow.op\n",
    "systems/__init__.py": b"",
    "systems/fast/__init__.py": b"",
    "systems/fast/op.py": b"from systems.fast.forms import FORMS\ndef run():\n    return 1\n",
    "systems/fast/loader.py": b"import importlib\nM = importlib.import_module('systems.fast.extra')\n",
    "systems/fast/extra.py": b"E = 1\n",
    "systems/fast/unused.py": b"U = 1\n",  # beside the used modules, imported by none
    "systems/fast/kernels/k.cu": b"__global__ void k() {}\n",
    "systems/fast/forms/__init__.py": b"FORMS = Registry('form', __name__)\n",
    "systems/fast/forms/one.py": b"ONE = 1\n",
    "systems/fast/tests_only/__init__.py": b"",  # a sub-package nothing names
    "systems/fast/tests_only/t.py": b"T = 1\n",
    "systems/slow/__init__.py": b"",
    "systems/slow/op.py": b"def run():\n    return 2\n",
}


def test_a_topics_digest_follows_its_imports_and_nothing_else(tmp_path):
    _tree(tmp_path, SUITE)
    mine = lambda: code_digest.digest(code_digest.files_on_disk(tmp_path), "mine")  # noqa: E731
    first = mine()
    files = code_digest.topic_files(code_digest.files_on_disk(tmp_path), "mine")
    assert "systems/fast/op.py" in files and "systems/fast/kernels/k.cu" in files and "config/mine.yaml" in files
    assert "workloads/theirs/__init__.py" in files  # read to find the topics
    for other in (
        {"workloads/theirs/parts.py": b"import systems.slow.op  # changed\n"},
        {"systems/slow/op.py": b"def run():\n    return 3\n"},
        {"config/theirs.yaml": b"repeat: 7\n", "config/claims.yaml": b"claims: [x]\n"},
        {"systems/fast/tests_only/t.py": b"T = 2\n"},  # a sub-package no module names
        {"systems/fast/unused.py": b"U = 2\n"},  # a module beside used ones, imported by none
        {"systems/unused.py": b"X = 1\n"},
    ):
        _tree(tmp_path, other)
        assert mine() == first, other
    for own in (
        {"systems/fast/op.py": b"from systems.fast.forms import FORMS\ndef run():\n    return 9\n"},  # lazy import
        {"systems/fast/kernels/k.cu": b"__global__ void k() { }\n"},  # a kernel beside a module
        {"systems/fast/forms/two.py": b"TWO = 2\n"},  # a new module of a registry's package
        {"systems/fast/forms/sub/__init__.py": b"S = 1\n"},  # and a sub-package of it
        {"systems/fast/extra.py": b"E = 2\n"},  # a module named in a string
        {"systems/fast/__init__.py": b"# on the path\n"},
        {"workloads/mine/schema.py": b"SCHEMA = {'a': 1}\n"},
        {"workloads/theirs/__init__.py": b"TOPIC = 'theirs'  # declared\n"},
        {"harness/new.py": b""},
        {"config/mine.yaml": b"repeat: 4\n"},
        {"config/config.yaml": b"scale: test\n"},
    ):
        _tree(tmp_path, own)
        assert mine() != first, own
        first = mine()
    try:
        code_digest.topic_files(code_digest.files_on_disk(tmp_path), "nobody")
    except ValueError as err:
        assert "no topic 'nobody'" in str(err)
    else:
        raise AssertionError("an unknown topic was accepted")


def test_relative_imports_resolve_from_the_modules_own_package(tmp_path):
    suite = dict(SUITE)
    suite["workloads/mine/parts.py"] = b"from . import schema\nfrom ..theirs import parts\n"
    suite["workloads/theirs/parts.py"] = b"from ...systems.slow import op\n"
    _tree(tmp_path, suite)
    files = code_digest.topic_files(code_digest.files_on_disk(tmp_path), "mine")
    assert {"workloads/theirs/parts.py", "systems/slow/op.py"} <= files
    assert "systems/fast/op.py" not in files


def test_the_suites_own_topics_cover_what_their_parts_import():
    from harness.topic import discover

    files = code_digest.files_on_disk(provenance.REPO_ROOT)
    for topic in discover():
        scope = code_digest.topic_files(files, topic)
        assert f"workloads/{topic}/parts.py" in scope and "harness/entry.py" in scope
        assert not any(p.startswith("analysis/") for p in scope) and "config/claims.yaml" not in scope
    assert "systems/hector/kernels/gemm.cu" in code_digest.topic_files(files, "relational_gnn")
    assert not any(p.startswith("systems/hector/") for p in code_digest.topic_files(files, "llm_offload"))
    assert not any(p.startswith("systems/ssdtrain/") for p in code_digest.topic_files(files, "relational_gnn"))


def _git_repo(root):
    import subprocess

    def git(*args):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)

    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "code")
    return git


def _needs_git():
    import shutil

    import pytest

    if shutil.which("git") is None:
        pytest.skip("git is not installed")


def test_the_files_of_a_commits_tree_are_the_files_of_its_checkout(tmp_path):
    _needs_git()
    _tree(tmp_path, {**SUITE, "docs/a.md": b"prose"})
    git = _git_repo(tmp_path)
    on_disk = code_digest.files_on_disk(tmp_path)
    assert code_digest.files_at("HEAD", tmp_path) == on_disk
    _tree(tmp_path, {"systems/fast/kernels/k.cu": b"changed"})  # uncommitted: the checkout moves, the commit not
    assert code_digest.files_on_disk(tmp_path) != on_disk
    assert code_digest.files_at("HEAD", tmp_path) == on_disk
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "kernel")
    assert code_digest.files_at("HEAD", tmp_path) == code_digest.files_on_disk(tmp_path)
    assert code_digest.files_at("HEAD~1", tmp_path) == on_disk
    assert code_digest.files_at("0" * 40, tmp_path) is None  # not in the history
    assert code_digest.files_at("HEAD", tmp_path / "docs") == code_digest.files_on_disk(tmp_path)  # a subfolder


def test_a_link_counts_as_its_targets_name_on_disk_and_in_git(tmp_path):
    import os

    _needs_git()
    _tree(tmp_path, {**CODE, "shared/big.py": b"x = 1\n", "shared/lib/m.py": b"y = 2\n"})
    os.symlink("../shared/big.py", tmp_path / "systems/linked.py")
    os.symlink("../shared/lib", tmp_path / "systems/lib")  # a linked folder: its name counts, not its files
    on_disk = _all(tmp_path)
    _git_repo(tmp_path)
    assert code_digest.digest(code_digest.files_at("HEAD", tmp_path)) == on_disk
    (tmp_path / "shared/lib/m.py").write_bytes(b"y = 3\n")
    assert _all(tmp_path) == on_disk  # the link is not followed
    (tmp_path / "systems/linked.py").unlink()
    (tmp_path / "systems/linked.py").write_bytes(b"../shared/big.py")
    assert _all(tmp_path) != on_disk  # a file holding the name is not the link


def test_the_files_of_a_commit_missing_one_are_none_not_a_crash(tmp_path):
    import subprocess

    _needs_git()
    _tree(tmp_path, CODE)
    _git_repo(tmp_path)
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD:harness/timing.py"], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.strip()
    (tmp_path / ".git/objects" / sha[:2] / sha[2:]).unlink()  # as in a partial clone
    assert code_digest.files_at("HEAD", tmp_path) is None


def test_a_record_carries_the_digest_of_its_topics_code_on_disk():
    record = provenance.collect("tiny", topic="relational_gnn")
    files = code_digest.files_on_disk(provenance.REPO_ROOT)
    assert record["code"]["digest"] == code_digest.digest(files, "relational_gnn")
    assert record["code"]["topic"] == "relational_gnn" and record["code"]["files"] > 20
    assert provenance.collect("tiny", topic="demo")["code"]["digest"] == code_digest.digest(files)  # not a topic


def test_older_records_get_the_digest_of_their_clean_commit_and_nothing_else(tmp_path, capsys):
    import json
    import subprocess
    import sys

    import pytest

    head = provenance._git("rev-parse", "HEAD")
    files = code_digest.files_at(head, provenance.REPO_ROOT) if head else None
    if files is None:
        pytest.skip("this copy has no git history")
    sys.path.insert(0, str(provenance.REPO_ROOT / "tools"))
    try:
        import add_code_digest
    finally:
        sys.path.pop(0)
    older = {"digest": "of every measured folder", "folders": ["config"], "source": add_code_digest.FROM_GIT}
    records = {
        "clean": {"git": {"commit": head, "dirty": False}, "topic": "llm_offload"},
        "folders": {"git": {"commit": head, "dirty": False}, "topic": "relational_gnn", "code": older},
        "dirty": {"git": {"commit": head, "dirty": True}, "topic": "llm_offload"},
        "unsaid": {"git": {"commit": head, "dirty": None}, "topic": "llm_offload"},
        "gone": {"git": {"commit": "f" * 40, "dirty": False}, "topic": "llm_offload"},
        "has": {"git": {"commit": head, "dirty": False}, "code": {"digest": "kept", "topic": "llm_offload"}},
    }
    for name, record in records.items():
        (tmp_path / "sub").mkdir(exist_ok=True)
        (tmp_path / "sub" / f"{name}-h200.provenance.json").write_text(json.dumps(record))
    assert add_code_digest.main(["--check", str(tmp_path)]) == 0
    assert "code" not in json.loads((tmp_path / "sub/clean-h200.provenance.json").read_text())  # --check writes nothing
    assert add_code_digest.main([str(tmp_path)]) == 0
    read = {n: json.loads((tmp_path / f"sub/{n}-h200.provenance.json").read_text()) for n in records}
    assert read["clean"]["code"]["digest"] == code_digest.digest(files, "llm_offload")
    assert read["clean"]["code"]["source"] == add_code_digest.FROM_GIT
    assert read["folders"]["code"]["digest"] == code_digest.digest(files, "relational_gnn")  # recomputed
    assert all("code" not in read[n] for n in ("dirty", "unsaid", "gone"))
    assert read["has"]["code"] == {"digest": "kept", "topic": "llm_offload"}
    said = capsys.readouterr().out
    assert "dirty or its state unknown" in said and "not in this clone's git history" in said
    with pytest.raises(SystemExit):
        add_code_digest.main([str(tmp_path / "missing")])
    done = subprocess.run(
        [sys.executable, "tools/add_code_digest.py", str(tmp_path)],
        cwd=provenance.REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and "clean" not in done.stdout  # a record that has one is not touched again


def test_a_record_says_what_changed_during_its_run_and_which_plugins_it_loaded(monkeypatch):
    start = code_digest.files_on_disk(provenance.REPO_ROOT)
    start["harness/timing.py"] = b"# the file as it was when the run began\n"
    monkeypatch.setattr(provenance, "_FILES_AT_START", start)
    monkeypatch.setenv("SUITE_PLUGINS", "my_variants")
    code = provenance.collect("tiny", topic="relational_gnn", this_process=True)["code"]
    assert code["changed_during_run"] == ["harness/timing.py"] and code["plugins"] == {"my_variants": "not loaded"}
    assert "changed_during_run" not in provenance.collect("tiny", topic="relational_gnn")["code"]  # not a part's


def test_a_loaded_plugin_is_recorded_with_a_digest_of_its_source(tmp_path, monkeypatch):
    import importlib

    plugin = tmp_path / "my_plugin_variants.py"
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SUITE_PLUGINS", " my_plugin_variants , ")
    digests = []
    for source in ("X = 1\n", "X = 2\n"):
        plugin.write_text(source)
        sys.modules.pop("my_plugin_variants", None)
        importlib.import_module("my_plugin_variants")
        digests.append(provenance.collect("tiny", topic="feature_gather")["code"]["plugins"]["my_plugin_variants"])
    sys.modules.pop("my_plugin_variants", None)
    assert len(set(digests)) == 2 and all(re.fullmatch(r"[0-9a-f]{16,64}", d) for d in digests)


@pytest.mark.full  # a fresh process per topic: about two minutes on two cores
def test_the_modules_a_topics_parts_and_registries_load_are_its_files():
    """Each topic's parts, with every registry they can read loaded, in a fresh process: every suite
    module loaded is among the files its digest covers (the workflow test runs the CPU parts too)."""
    import json
    import subprocess
    import sys

    from harness.topic import discover

    probe = (
        "import importlib, json, sys\n"
        "from harness.registry import Registry\n"
        "importlib.import_module(f'workloads.{sys.argv[1]}.parts')\n"
        "for module in list(sys.modules.values()):\n"
        "    for value in list(vars(module).values()):\n"
        "        if isinstance(value, Registry):\n"
        "            list(value)\n"
        "print(json.dumps(sorted({m.__file__ for m in list(sys.modules.values()) if getattr(m, '__file__', None)})))\n"
    )
    files = code_digest.files_on_disk(provenance.REPO_ROOT)
    root = provenance.REPO_ROOT.resolve()
    for topic in discover():
        done = subprocess.run(
            [sys.executable, "-c", probe, topic], cwd=root, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        loaded = {Path(f).resolve() for f in json.loads(done.stdout.splitlines()[-1])}
        suite = {p.relative_to(root).as_posix() for p in loaded if p.is_relative_to(root)}
        outside = {p for p in suite if p in files} - code_digest.topic_files(files, topic)
        assert not outside, (topic, sorted(outside))


def test_a_parts_record_names_what_its_topic_shares_and_the_config_file_overrides_included(tmp_path):
    """Beside the part's own parameters, the record holds what every part of its topic shares at
    the scale (repetitions, warm-up) from the config file the part was given: a merged file, as
    Snakemake writes one with a --config override, is named with its override."""
    import json

    import yaml

    from harness import config as suite_config
    from harness.entry import main as entry

    merged = suite_config.load()
    merged["topics"]["ceilings"]["tiny"]["repeat"] = 4  # the override
    config_file = tmp_path / "merged.yaml"
    config_file.write_text(yaml.safe_dump(merged, sort_keys=True))
    out = tmp_path / "results" / "matmul-tiny.csv"
    entry(["ceilings", "--part", "matmul", "--scale", "tiny", "--out", str(out), "--config", str(config_file)])
    record = json.loads(out.with_suffix(".provenance.json").read_text())
    assert record["config_file"] == str(config_file)
    assert 0 <= record["cpu_share_of_other_processes"] <= 1  # what others took of the machine meanwhile
    assert record["shared_parameters"] == {"repeat": 4, "warmup": 1}  # the parts' blocks are not shared
    assert record["parameters"] == merged["topics"]["ceilings"]["tiny"]["matmul"]
    entry(["ceilings", "--part", "matmul", "--scale", "tiny", "--out", str(out)])  # the default config
    record = json.loads(out.with_suffix(".provenance.json").read_text())
    assert record["config_file"] == "config/config.yaml" and record["shared_parameters"]["repeat"] == 3


def test_a_record_says_the_thread_settings_it_ran_with(monkeypatch):
    """Two CPU runs at OMP_NUM_THREADS=1 and 2 left records that differed in nothing but their
    command and date, while their medians differed."""
    import torch

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    record = provenance.collect("tiny")
    assert record["threads"]["OMP_NUM_THREADS"] == "3"
    assert record["threads"]["torch_threads"] == torch.get_num_threads()
