"""Config validation and scale selection: every refusal is one line that names the problem."""

import copy

import pytest

from harness import config as suite_config
from harness.errors import NeedsGpuError
from harness.topic import discover


@pytest.fixture(scope="module")
def shipped():
    return suite_config.load()


@pytest.fixture
def cfg(shipped):
    """The shipped config, a copy of its own for each test to edit."""
    return copy.deepcopy(shipped)


def test_shipped_config_is_valid_and_every_topic_has_the_three_scales(cfg):
    assert {"tiny", "cpu", "h200"} <= set(cfg["scales"])
    assert cfg["scales"]["h200"]["needs_gpu"] is True
    assert cfg["scales"]["cpu"]["needs_gpu"] is False
    assert set(cfg["topics"]) == set(discover())
    for topic, blocks in cfg["topics"].items():
        assert set(blocks) == set(cfg["scales"]), topic


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.update(scale=3), "config key 'scale': 3 is not of type 'string'"),
        (lambda c: c.update(colour="blue"), "Additional properties are not allowed \\('colour'"),
        (
            lambda c: c["topics"]["ceilings"]["cpu"]["uva_read"].update(granularities=[100]),
            "config/ceilings.yaml: key 'cpu/uva_read/granularities/0': 100 is not one of",
        ),
        (
            lambda c: c["topics"]["ceilings"]["tiny"].pop("disk"),
            "config/ceilings.yaml: key 'tiny': 'disk' is a required",
        ),
        # A definition shared through workflow/schemas/definitions.schema.yaml is enforced too.
        (
            lambda c: c["topics"]["gnn_training"]["cpu"]["products"].update(
                models=[{"name": "gcn", "layers": 2, "fanouts": [5]}]
            ),
            "config/gnn_training.yaml: key 'cpu/products/models/0/name': 'gcn' is not one of",
        ),
        (
            lambda c: c["topics"]["ceilings"].update(huge=c["topics"]["ceilings"]["cpu"]),
            "config/ceilings.yaml: block for unknown scale 'huge'; the scales are tiny, cpu, h200",
        ),
        (lambda c: c["topics"].update(nosuch={}), "config key 'topics': no topic named nosuch"),
        (lambda c: c.update(machine="../etc"), "config key 'machine': '../etc' does not match"),
        # A value matching none of several forms says what each expected, not only that none matched.
        (
            lambda c: c["topics"]["feature_gather"]["tiny"]["row_sizes"].update(variants="Al"),
            r"key 'tiny/row_sizes/variants': 'Al' is not valid under any of the given schemas "
            r"\('all' was expected; 'Al' is not of type 'array'\)",
        ),
        (
            lambda c: c["topics"]["feature_gather"]["tiny"]["row_sizes"].update(variants=["cpu_gather"] * 2),
            r"\('all' was expected; \['cpu_gather', 'cpu_gather'\] has non-unique elements\)",
        ),
    ],
)
def test_malformed_config_is_refused_naming_the_key(cfg, edit, message):
    bad = copy.deepcopy(cfg)
    edit(bad)
    with pytest.raises(suite_config.ConfigError, match=message):
        suite_config.validate(bad)


def test_an_all_digit_machine_name_read_as_a_number_is_its_digits(cfg):
    """--config machine=2024 (and YAML's machine: 2024) give an int: the name is its digits, as the
    schema allows; a float or a bool is no name."""
    given = {k: v for k, v in cfg.items() if k != "topics"}
    assert suite_config.complete({**given, "machine": 2024})["machine"] == "2024"
    for bad in (1e3, True):
        with pytest.raises(suite_config.ConfigError, match="config key 'machine'"):
            suite_config.complete({**given, "machine": bad})


def test_unknown_scale_lists_the_known_ones_and_says_how_the_caller_names_one(cfg):
    with pytest.raises(
        suite_config.ConfigError, match=r"^unknown scale 'huge'; choose one of tiny, cpu, h200 \(--scale NAME\)$"
    ):
        suite_config.scale_params(cfg, "huge")
    with pytest.raises(suite_config.ConfigError, match=r"h200 \(--config scale=NAME\)$"):  # the workflow's
        suite_config.scale_params(cfg, "huge", choose_with="--config scale=")


def test_gpu_scale_without_gpu_says_what_to_do(cfg, monkeypatch):
    monkeypatch.setenv("SUITE_HIDE_GPU", "1")
    suite_config.machine.forget()
    try:
        with pytest.raises(NeedsGpuError, match="needs a CUDA GPU.*; use --scale tiny or --scale cpu, or .*figures"):
            suite_config.scale_params(cfg, "h200")
        with pytest.raises(NeedsGpuError, match="; use --config scale=tiny or --config scale=cpu, or "):
            suite_config.scale_params(cfg, "h200", choose_with="--config scale=")
        assert suite_config.topic_params(cfg, "ceilings", "cpu")["repeat"] >= 1
        # Rendering at a GPU scale reads the scale's blocks without a GPU; unknown ones still fail.
        assert suite_config.topic_params(cfg, "ceilings", "h200", check_gpu=False)["repeat"] >= 1
        with pytest.raises(suite_config.ConfigError, match="unknown scale 'huge'"):
            suite_config.scale_params(cfg, "huge", check_gpu=False)
    finally:
        suite_config.machine.forget()


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(suite_config.ConfigError, match="does not exist"):
        suite_config.load(tmp_path / "none.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("scale: tiny\nmachine: [unclosed\n")
    with pytest.raises(suite_config.ConfigError, match=r"not valid YAML \(line 3, column 1\)"):
        suite_config.load(broken)


def test_a_key_given_twice_is_refused_and_a_merge_may_still_override(tmp_path):
    twice = tmp_path / "twice.yaml"
    twice.write_text("scale: tiny\nmatmul: {dim: 128}\nmatmul: {dim: 64}\n")
    with pytest.raises(suite_config.ConfigError, match=r"\(line 3, column 1\): key 'matmul' is given twice"):
        suite_config._read_yaml(twice)
    merged = tmp_path / "merged.yaml"
    merged.write_text("base: &b {dim: 128, repeat: 3}\nsmall:\n  <<: *b\n  dim: 64\n")
    assert suite_config._read_yaml(merged)["small"] == {"dim": 64, "repeat": 3}


def test_an_integer_written_as_a_float_is_refused(cfg):
    bad = copy.deepcopy(cfg)
    bad["topics"]["ceilings"]["tiny"]["repeat"] = 3.0
    with pytest.raises(suite_config.ConfigError, match="key 'tiny/repeat': 3.0 is not of type 'integer'"):
        suite_config.validate(bad)


def test_a_topic_without_a_block_for_the_scale_is_named(cfg):
    cfg["topics"]["gnn_training"].pop("cpu")
    with pytest.raises(
        suite_config.ConfigError, match=r"topic 'gnn_training' has no block for scale 'cpu' \(config/gnn_training.yaml"
    ):
        suite_config.topic_params(cfg, "gnn_training", "cpu")


def test_topic_blocks_come_from_their_own_files_unless_given(tmp_path):
    top = tmp_path / "config.yaml"
    top.write_text((suite_config.DEFAULT_CONFIG).read_text())
    cfg = suite_config.load(top)
    assert cfg["topics"]["ceilings"] == suite_config.load()["topics"]["ceilings"]
    given = dict(cfg["topics"]["ceilings"])
    given["tiny"] = {**given["tiny"], "repeat": 7}
    assert suite_config.load(top, {"topics": {"ceilings": given}})["topics"]["ceilings"]["tiny"]["repeat"] == 7


@pytest.mark.parametrize(
    "topics, message",
    [
        ("foo", "config key 'topics' must map topic names to their blocks, got str"),
        ({"ceilings": ["cpu"]}, r"config key 'topics/ceilings': \['cpu'\] is not of type 'object'"),
        ({"ceilings": {5: {}}}, "the config's topics/ceilings: block for unknown scale '5'"),
        ({"ceilings": {"cpu": {"repeat": 1}}}, "the config's topics/ceilings: key 'cpu': 'warmup' is a required"),
    ],
)
def test_malformed_topic_blocks_given_in_the_config_are_one_line_errors(topics, message):
    with pytest.raises(suite_config.ConfigError, match=message):
        suite_config.load(overrides={"topics": topics})


def test_every_topic_block_needs_repeat_and_warmup(cfg, monkeypatch, tmp_path):
    from harness import topic as topic_module

    schema = tmp_path / "loose.schema.yaml"
    schema.write_text("type: object\n")  # a topic schema that forgets them
    monkeypatch.setattr(topic_module.Topic, "schema_file", property(lambda self: schema))
    bad = copy.deepcopy(cfg)
    del bad["topics"]["ceilings"]["cpu"]["warmup"]
    with pytest.raises(suite_config.ConfigError, match="key 'cpu': needs warmup"):
        suite_config.validate(bad)


def test_an_unreadable_topic_file_is_one_line(monkeypatch, tmp_path):
    from harness import topic as topic_module

    monkeypatch.setattr(topic_module.Topic, "config_file", property(lambda self: tmp_path))  # a directory
    with pytest.raises(suite_config.ConfigError, match="cannot be read"):
        suite_config.load()


def test_an_empty_topic_file_is_one_line_naming_it(monkeypatch, tmp_path):
    from harness import topic as topic_module

    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    monkeypatch.setattr(topic_module.Topic, "config_file", property(lambda self: tmp_path / "empty.yaml"))
    with pytest.raises(suite_config.ConfigError, match=r"empty.yaml must map scales to their blocks; it holds None"):
        suite_config.load()
