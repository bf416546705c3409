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
