"""Provenance records say which code, machine, software, date and scale produced a number."""

from harness import machine, provenance


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
    monkeypatch.setattr(provenance, "_git", lambda *args: "feedbeef" * 5 if args[0] == "rev-parse" else " M x.py")
    monkeypatch.setenv("SUITE_GIT_COMMIT", "0123abcd" * 5)
    monkeypatch.setenv("SUITE_GIT_DIRTY", "1")
    state = provenance.git_state()
    assert state == {
        "commit": "0123abcd" * 5,
        "dirty": True,
        "source": "environment (SUITE_GIT_COMMIT, set by whoever copied the tree)",
    }
    monkeypatch.delenv("SUITE_GIT_DIRTY")
    assert provenance.git_state()["dirty"] is None  # not said is not clean
    monkeypatch.delenv("SUITE_GIT_COMMIT")
    assert provenance.git_state() == {"commit": "feedbeef" * 5, "dirty": True, "source": "git"}
    monkeypatch.setattr(provenance, "_git", lambda *args: None)
    assert provenance.git_state()["commit"] == "unknown"


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


CODE = {
    "config/topic.yaml": b"repeat: 3\n",
    "harness/timing.py": b"def f():\n    return 1\n",
    "systems/kernels/k.cu": b"\x00\xff\n\n binary-ish \r\n",  # newlines and NULs inside a blob
    "workloads/w.py": b"",  # an empty file is still a file
}


def test_the_code_digest_moves_with_the_measured_code_and_nothing_else(tmp_path):
    _tree(tmp_path, CODE)
    first = provenance.code_digest(tmp_path)
    assert len(first) == 64 and first == provenance.code_digest(tmp_path)
    _tree(tmp_path, {"docs/a.md": b"prose", "analysis/fig.py": b"x = 1", "README.md": b"hi"})
    _tree(tmp_path, {"systems/__pycache__/m.cpython-311.pyc": b"\x00", "harness/timing.pyc": b"\x01"})
    _tree(tmp_path, {"workloads/.pytest_cache/v": b"1", "systems/x.egg-info/PKG-INFO": b"1"})
    _tree(tmp_path, {provenance.RECORD_WRITER: b"# what a record holds"})
    assert provenance.code_digest(tmp_path) == first  # docs, analysis, caches and the record writer decide no number
    for change in (
        {"harness/timing.py": b"def f():\n    return 2\n"},  # one byte
        {"workloads/new.py": b""},  # a new, empty file
        {"config/topic.yaml": b"repeat: 3\n", "config/other.yaml": b"repeat: 3\n"},
    ):
        _tree(tmp_path, change)
        assert provenance.code_digest(tmp_path) != first
        first = provenance.code_digest(tmp_path)
    (tmp_path / "workloads/new.py").rename(tmp_path / "workloads/renamed.py")
    assert provenance.code_digest(tmp_path) != first  # the path counts, not only the bytes


def _git_repo(root):
    import subprocess

    def git(*args):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)

    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "code")
    return git


def test_the_digest_of_a_commits_tree_equals_the_digest_of_its_checkout(tmp_path):
    import shutil

    if shutil.which("git") is None:
        import pytest

        pytest.skip("git is not installed")
    _tree(tmp_path, {**CODE, "docs/a.md": b"prose"})
    git = _git_repo(tmp_path)
    on_disk = provenance.code_digest(tmp_path)
    assert provenance.code_digest_at("HEAD", tmp_path) == on_disk
    _tree(tmp_path, {"systems/kernels/k.cu": b"changed"})  # uncommitted: the checkout moves, the commit does not
    assert provenance.code_digest(tmp_path) != on_disk
    assert provenance.code_digest_at("HEAD", tmp_path) == on_disk
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "kernel")
    assert provenance.code_digest_at("HEAD", tmp_path) == provenance.code_digest(tmp_path)
    assert provenance.code_digest_at("HEAD~1", tmp_path) == on_disk
    assert provenance.code_digest_at("0" * 40, tmp_path) is None  # not in the history
    assert provenance.code_digest_at("HEAD", tmp_path / "docs") == provenance.code_digest(tmp_path)  # from a subfolder


def test_a_link_counts_as_its_targets_name_on_disk_and_in_git(tmp_path):
    import os
    import shutil

    import pytest

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    _tree(tmp_path, {**CODE, "shared/big.py": b"x = 1\n", "shared/lib/m.py": b"y = 2\n"})
    os.symlink("../shared/big.py", tmp_path / "systems/linked.py")
    os.symlink("../shared/lib", tmp_path / "systems/lib")  # a linked folder: its name counts, not its files
    on_disk = provenance.code_digest(tmp_path)
    _git_repo(tmp_path)
    assert provenance.code_digest_at("HEAD", tmp_path) == on_disk
    (tmp_path / "shared/lib/m.py").write_bytes(b"y = 3\n")
    assert provenance.code_digest(tmp_path) == on_disk  # the link is not followed
    (tmp_path / "systems/linked.py").unlink()
    (tmp_path / "systems/linked.py").write_bytes(b"../shared/big.py")
    assert provenance.code_digest(tmp_path) != on_disk  # a file holding the name is not the link


def test_the_digest_of_a_commit_missing_a_file_is_none_not_a_crash(tmp_path):
    import shutil
    import subprocess

    import pytest

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    _tree(tmp_path, CODE)
    _git_repo(tmp_path)
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD:harness/timing.py"], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.strip()
    (tmp_path / ".git/objects" / sha[:2] / sha[2:]).unlink()  # as in a partial clone
    assert provenance.code_digest_at("HEAD", tmp_path) is None


def test_a_record_carries_the_digest_of_the_code_on_disk():
    record = provenance.collect("tiny")
    assert record["code"]["digest"] == provenance.code_digest()
    assert record["code"]["folders"] == list(provenance.MEASURED_CODE)


def test_older_records_get_the_digest_of_their_clean_commit_and_nothing_else(tmp_path, capsys):
    import json
    import subprocess
    import sys

    import pytest

    head = provenance._git("rev-parse", "HEAD")
    if head is None or provenance.code_digest_at(head) is None:
        pytest.skip("this copy has no git history")
    sys.path.insert(0, str(provenance.REPO_ROOT / "tools"))
    try:
        import add_code_digest
    finally:
        sys.path.pop(0)
    records = {
        "clean": {"git": {"commit": head, "dirty": False}},
        "dirty": {"git": {"commit": head, "dirty": True}},
        "unsaid": {"git": {"commit": head, "dirty": None}},
        "gone": {"git": {"commit": "f" * 40, "dirty": False}},
        "has": {"git": {"commit": head, "dirty": False}, "code": {"digest": "kept"}},
    }
    for name, record in records.items():
        (tmp_path / "sub").mkdir(exist_ok=True)
        (tmp_path / "sub" / f"{name}-h200.provenance.json").write_text(json.dumps(record))
    assert add_code_digest.main(["--check", str(tmp_path)]) == 0
    assert "code" not in json.loads((tmp_path / "sub/clean-h200.provenance.json").read_text())  # --check writes nothing
    assert add_code_digest.main([str(tmp_path)]) == 0
    read = {n: json.loads((tmp_path / f"sub/{n}-h200.provenance.json").read_text()) for n in records}
    assert read["clean"]["code"]["digest"] == provenance.code_digest_at(head)
    assert read["clean"]["code"]["source"] == add_code_digest.FROM_GIT
    assert all("code" not in read[n] for n in ("dirty", "unsaid", "gone"))
    assert read["has"]["code"] == {"digest": "kept"}
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
