"""The registry every technique's comparison table is built on (harness/registry.py)."""

import dataclasses
import sys
import types

import pytest

from analysis import style
from harness.errors import UserError
from harness.registry import COMPETITOR_ROLES, ENTRY_ROLES, Entry, Registry, load_plugins


def test_entries_register_in_order_and_are_found_by_name_and_role():
    reg = Registry("thing")
    a = reg.register(Entry("a_1", "baseline"))
    reg.register(Entry("b", "optimized", label="B, the technique"))
    reg.register(Entry("c", "peer"))
    assert reg["a_1"] is a and len(reg) == 3 and "b" in reg and "zz" not in reg
    assert reg.names() == ("a_1", "b", "c")
    assert reg.names(*COMPETITOR_ROLES) == ("a_1", "c")
    assert reg["b"].display == "B, the technique" and reg["c"].display == "c"


def test_an_unknown_name_is_one_line_naming_the_valid_ones():
    reg = Registry("gather variant")
    reg.register(Entry("x", "baseline"))
    with pytest.raises(UserError, match=r"unknown gather variant 'y'; one of x"):
        reg["y"]


def test_a_second_entry_of_one_name_is_refused_and_bad_names_and_roles_too():
    reg = Registry("thing")
    reg.register(Entry("a", "baseline"))
    reg.register(Entry("a", "baseline"))  # the same entry again (a module imported twice) is fine
    with pytest.raises(ValueError, match=f"registered twice, by {__name__} and by {__name__}: give one another"):
        reg.register(Entry("a", "optimized"))
    # A package's register helper is not named: the module that called it is.
    from systems.pytorch_direct.gather_variants import GATHER_VARIANTS

    existing = GATHER_VARIANTS["cpu_gather"]
    first = r"systems\.pytorch_direct\.gather_variants\.cpu_baselines"
    with pytest.raises(ValueError, match=rf"by {first} and by {__name__}"):
        GATHER_VARIANTS.register(dataclasses.replace(existing, notes="another"))
    with pytest.raises(ValueError, match="role"):
        Entry("a", "winner")
    for bad in ("", "A", "a-b", "a b", "caché", "offload_²", "ｗide"):
        with pytest.raises(ValueError, match="lowercase"):
            Entry(bad, "baseline")
    assert set(COMPETITOR_ROLES) < set(ENTRY_ROLES)


def test_missing_says_why_an_entry_cannot_run_here():
    assert Entry("a", "baseline").missing("cpu") is None
    assert "CUDA" in Entry("g", "optimized", needs_gpu=True).missing("cpu")
    assert Entry("g", "optimized", needs_gpu=True).missing("cuda:0") is None
    assert "no_such_package_xyz" in Entry("p", "peer", packages=("no_such_package_xyz",)).missing()


def test_every_module_of_the_package_registers_on_first_read(tmp_path, monkeypatch):
    pkg = tmp_path / "fake_entries"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from harness.registry import Registry, Entry\nREG = Registry('fake', __name__)\n")
    (pkg / "one.py").write_text("from fake_entries import REG, Entry\nREG.register(Entry('one', 'baseline'))\n")
    (pkg / "two.py").write_text("from fake_entries import REG, Entry\nREG.register(Entry('two', 'optimized'))\n")
    (pkg / "_private.py").write_text("raise RuntimeError('modules starting with _ are not entries')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import fake_entries

    assert fake_entries.REG.names() == ("one", "two")
    monkeypatch.delitem(sys.modules, "fake_entries")


@pytest.mark.parametrize(
    "entry, words",
    [
        ("Entry('one', 'optimized')", "ValueError: fake 'one' is registered twice, by bad_entries.first and by "),
        ("Entry('My-Entry', 'baseline')", "ValueError: entry name 'My-Entry': use lowercase"),
        ("Entry('mine', 'fast')", "ValueError: entry mine: role 'fast' is not one of"),
        # Registered, then the module fails: a second read meets the same error, not "registered twice"
        # (each import makes another entry: one holding a new object).
        ("Entry('two', 'baseline', notes=str(object()))) and (undefined_name", "NameError: name 'undefined_name'"),
    ],
)
def test_a_bad_entry_in_a_module_of_the_package_is_one_line_naming_the_module(tmp_path, monkeypatch, entry, words):
    """The path the guide teaches (a new file in the package) fails as a plugin does: one line
    naming the module and its file, and the registry is not read as whole afterwards."""
    pkg = tmp_path / "bad_entries"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from harness.registry import Registry, Entry\nREG = Registry('fake', __name__)\n")
    (pkg / "first.py").write_text("from bad_entries import REG, Entry\nREG.register(Entry('one', 'baseline'))\n")
    (pkg / "mine.py").write_text(f"from bad_entries import REG, Entry\nREG.register({entry})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import bad_entries

        where = r"^module bad_entries\.mine \(.*bad_entries/mine\.py, line 2\) raised"
        with pytest.raises(UserError, match=where) as err:
            bad_entries.REG.names()
        assert words in str(err.value)
        with pytest.raises(UserError, match=where) as again:  # again, not a partial table
            bad_entries.REG.names()
        assert words in str(again.value)
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "bad_entries"]:
            del sys.modules[name]


def test_plugins_named_in_the_environment_register_and_a_bad_one_is_one_line(monkeypatch):
    reg = Registry("thing")
    plugin = types.ModuleType("my_plugin_xyz")
    monkeypatch.setitem(sys.modules, "my_plugin_xyz", plugin)
    monkeypatch.setenv("SUITE_PLUGINS", "my_plugin_xyz")
    load_plugins()  # already imported: nothing to do, no error
    monkeypatch.setenv("SUITE_PLUGINS", " ,no_such_plugin_module_xyz")
    with pytest.raises(UserError, match="'no_such_plugin_module_xyz', which Python cannot find .*PYTHONPATH"):
        reg.names()


def test_a_plugin_that_fails_on_import_is_one_line_naming_it(monkeypatch, tmp_path):
    (tmp_path / "boom_plugin_xyz.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SUITE_PLUGINS", "boom_plugin_xyz")
    with pytest.raises(UserError, match="'boom_plugin_xyz', which raised while importing .*: RuntimeError: boom at"):
        load_plugins()
    (tmp_path / "needs_xyz_plugin.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.setenv("SUITE_PLUGINS", "needs_xyz_plugin")
    with pytest.raises(UserError, match="'needs_xyz_plugin', which failed to import: No module named 'no_such_dep"):
        load_plugins()


def test_an_unseen_variant_gets_the_same_colour_every_time_and_known_ones_keep_theirs():
    assert style.color("cpu_gather") == style.VARIANT_STYLE["cpu_gather"][0]
    new = style.style("my_new_store_variant")
    assert new == style.style("my_new_store_variant") and new[1] == "-."
    assert new[0] in style.UNSEEN_PALETTE
    assert len({style.color(f"v{i}") for i in range(40)}) > 3  # names spread over the palette
