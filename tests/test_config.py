"""Config validation and scale selection: every refusal is one line that names the problem."""

import copy

import pytest

from harness import config as suite_config
from harness.errors import NeedsGpuError


@pytest.fixture
def cfg():
    return suite_config.load()


def test_shipped_config_is_valid_and_has_the_three_scales(cfg):
    assert {"tiny", "cpu", "h200"} <= set(cfg["scales"])
    assert cfg["scales"]["h200"]["needs_gpu"] is True
    assert cfg["scales"]["cpu"]["needs_gpu"] is False


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.update(scale=3), "config key 'scale': 3 is not of type 'string'"),
        (lambda c: c.update(colour="blue"), "Additional properties are not allowed \\('colour'"),
        (lambda c: c["scales"]["cpu"]["ceilings"]["uva_read"].update(granularities=[100]),
         "config key 'scales/cpu/ceilings/uva_read/granularities/0': 100 is not one of"),
        (lambda c: c["scales"]["tiny"]["ceilings"].pop("disk"), "config key 'scales/tiny/ceilings': 'disk' is a required"),
        (lambda c: c.update(machine="../etc"), "config key 'machine': '../etc' does not match"),
    ],
)
def test_malformed_config_is_refused_naming_the_key(cfg, edit, message):
    bad = copy.deepcopy(cfg)
    edit(bad)
    with pytest.raises(suite_config.ConfigError, match=message):
        suite_config.validate(bad)


def test_unknown_scale_lists_the_known_ones(cfg):
    with pytest.raises(suite_config.ConfigError, match="unknown scale 'huge'; choose one of tiny, cpu, h200"):
        suite_config.scale_params(cfg, "huge")


def test_gpu_scale_without_gpu_says_what_to_do(cfg, monkeypatch):
    monkeypatch.setenv("SUITE_HIDE_GPU", "1")
    suite_config.machine.forget()
    try:
        with pytest.raises(NeedsGpuError, match="needs a CUDA GPU.*scale=cpu.*figures"):
            suite_config.scale_params(cfg, "h200")
        assert suite_config.scale_params(cfg, "cpu")["ceilings"]["repeat"] >= 1
    finally:
        suite_config.machine.forget()


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(suite_config.ConfigError, match="does not exist"):
        suite_config.load(tmp_path / "none.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("scale: [unclosed\n")
    with pytest.raises(suite_config.ConfigError, match="not valid YAML"):
        suite_config.load(broken)
