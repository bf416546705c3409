"""The suite's configuration: the machine, the scale and paths in config/config.yaml, and each
topic's parameters, one block per scale, in config/<topic>.yaml.

Each file is validated against its JSON schema (workflow/schemas/config.schema.yaml and
workflow/schemas/<topic>.schema.yaml, which may refer to definitions.schema.yaml). Snakemake and
every entry point load the configuration through :func:`load` or :func:`complete`, so a malformed
file is refused the same way everywhere, in one line that names the file and the key.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import yaml

from harness import machine
from harness.errors import NeedsGpuError, UserError

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "config" / "config.yaml"
# The config a workflow run measures with (Snakemake's merged one), for the processes it starts:
# its renders label a figure with the parts that config measures and the figure has no results of.
CONFIG_FILE_VARIABLE = "SUITE_CONFIG_FILE"


def announce_config_file(path: Path | str) -> None:
    """Make ``path`` the config of the processes this one starts (see CONFIG_FILE_VARIABLE)."""
    os.environ[CONFIG_FILE_VARIABLE] = str(path)


def announced_config_file() -> Path:
    """The config this process was started with by a workflow run, or config/config.yaml."""
    given = os.environ.get(CONFIG_FILE_VARIABLE)
    return Path(given) if given else DEFAULT_CONFIG


SCHEMAS = REPO_ROOT / "workflow" / "schemas"
SCHEMA = SCHEMAS / "config.schema.yaml"


class ConfigError(UserError):
    pass


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # "<<": merged keys may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def check_config_file(path) -> None:
    """Read ``path`` as the suite reads its config files, refusing in one line what they refuse (a
    key given twice, malformed YAML): for files another reader merged (Snakemake's ``configfile``
    keeps a repeated key's last value without a word)."""
    _read_yaml(Path(path))


def _read_yaml(path: Path, what: str = "config file"):
    try:
        return yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 - a safe loader
    except FileNotFoundError:
        raise ConfigError(f"{what} {_relative(path)} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{what} {_relative(path)} cannot be read: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{what} {_relative(path)} is not valid YAML{where}: {problem}") from None


def is_machine_name(name: str) -> bool:
    """Whether ``name`` is a machine's name as the config schema has it: one folder under results/."""
    return re.search(_read_yaml(SCHEMA, "schema")["properties"]["machine"]["pattern"], name) is not None


@functools.lru_cache(maxsize=1)
def _registry():
    """Every schema under workflow/schemas by file name, so one can refer to another's $defs."""
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    return Registry().with_resources(
        (path.name, Resource.from_contents(_read_yaml(path, "schema"), default_specification=DRAFT202012))
        for path in sorted(SCHEMAS.glob("*.schema.yaml"))
    )


@functools.lru_cache(maxsize=1)
def _strict_validator():
    """JSON Schema's validator with one change: an integer is an int, never a float such as 3.0
    (which the standard counts as an integer, and which a measuring part would then refuse)."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool)
    )
    return jsonschema.validators.extend(base, type_checker=checker)


def _check(document, schema_path: Path, where: str, key_prefix: str = "") -> None:
    """Refuse ``document`` in one line naming the first offending key, if it breaks the schema."""
    schema = _read_yaml(schema_path, "schema")
    validator = _strict_validator()(schema, registry=_registry())
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        key = "/".join([key_prefix, *map(str, err.absolute_path)] if key_prefix else map(str, err.absolute_path))
        raise ConfigError(f"{where}key '{key or '(top level)'}': {_said(err)} (schema: {_relative(schema_path)})")


def _said(err) -> str:
    """The error's message; where the value matched none of several forms (anyOf, oneOf), what
    each form found wrong, which says what was expected ("'Al' is not one of ['all']; 'Al' is
    not of type 'array'") where jsonschema says only that none matched."""
    why = list(dict.fromkeys(sub.message for sub in err.context or () if len(sub.relative_path) == 0))
    return f"{err.message} ({'; '.join(why)})" if why else err.message


# Every topic's block at every scale has these (the harness times each part with them).
COMMON_KEYS = ("repeat", "warmup")


def validate(config: dict, sources: dict[str, str] | None = None) -> None:
    """Check the whole configuration: the top level, then each topic's blocks. ``sources`` names
    where each topic's blocks came from, for the messages (default: its config/<topic>.yaml)."""
    from harness.topic import discover

    _check(config, SCHEMA, "config ")
    topics = discover()
    scales = [str(s) for s in config["scales"]]
    unknown = {str(name) for name in config.get("topics", {})} - set(topics)
    if unknown:
        raise ConfigError(
            f"config key 'topics': no topic named {', '.join(sorted(unknown))}; topics: {', '.join(topics)}"
        )
    for name, blocks in config.get("topics", {}).items():
        source = (sources or {}).get(name, _relative(topics[name].config_file))
        if not isinstance(blocks, dict):
            raise ConfigError(f"{source}: must map scale names to parameter blocks")
        for scale, block in blocks.items():
            if str(scale) not in scales or not isinstance(scale, str):
                known = ", ".join(scales)
                raise ConfigError(
                    f"{source}: block for unknown scale '{scale}'; the scales are {known} (the config's 'scales')"
                )
            _check(block, topics[name].schema_file, f"{source}: ", key_prefix=scale)
            missing = [key for key in COMMON_KEYS if key not in block]
            if missing:
                raise ConfigError(f"{source}: key '{scale}': needs {' and '.join(missing)} (every topic's block does)")


def complete(config: dict) -> dict:
    """``config`` with every topic's blocks (read from config/<topic>.yaml where ``config`` has
    none), validated."""
    from harness.topic import discover

    if not isinstance(config, dict):
        raise ConfigError("the config must hold a mapping at the top level")
    given = config.get("topics") or {}
    if not isinstance(given, dict):
        raise ConfigError(f"config key 'topics' must map topic names to their blocks, got {type(given).__name__}")
    topics, sources = dict(given), {name: f"the config's topics/{name}" for name in given}
    for name, topic in discover().items():
        if name not in topics:
            topics[name] = _read_yaml(topic.config_file, f"topic {name}'s config file")
            sources[name] = _relative(topic.config_file)
            if not isinstance(topics[name], dict):  # an empty file reads as None
                raise ConfigError(f"{sources[name]} must map scales to their blocks; it holds {topics[name]!r}")
    config = {**config, "topics": topics}
    if type(config.get("machine")) is int:  # an all-digit name (2024), read as a number by YAML and --config
        config["machine"] = str(config["machine"])
    validate(config, sources)
    return config


def load(path: Path | str = DEFAULT_CONFIG, overrides: dict | None = None) -> dict:
    config = _read_yaml(Path(path))
    if not isinstance(config, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    config.update(overrides or {})
    return complete(config)


def scale_params(config: dict, scale: str, check_gpu: bool = True, *, choose_with: str = "--scale ") -> dict:
    """The description of one named scale, refusing unknown scales and (unless ``check_gpu`` is
    false: rendering other machines' results at that scale) GPU scales without a GPU.
    ``choose_with``: how the caller's user names a scale (``--scale `` on the command line of the
    parts, ``--config scale=`` in the workflow), for the refusals' hints."""
    scales = config["scales"]
    if scale not in scales:
        raise ConfigError(f"unknown scale '{scale}'; choose one of {', '.join(scales)} ({choose_with}NAME)")
    params = scales[scale]
    if check_gpu and params.get("needs_gpu") and not machine.has_gpu():
        here = " or ".join(f"{choose_with}{name}" for name, it in scales.items() if not it.get("needs_gpu"))
        raise NeedsGpuError(
            f"scale '{scale}' needs a CUDA GPU and this machine has none that torch can use; "
            + (f"use {here}, or " if here else "")
            + "render committed results with the 'figures' target"
        )
    return params


def topic_params(
    config: dict, topic: str, scale: str, check_gpu: bool = True, *, choose_with: str = "--scale "
) -> dict:
    """One topic's parameters at one scale (after the checks of :func:`scale_params`)."""
    scale_params(config, scale, check_gpu, choose_with=choose_with)
    blocks = config["topics"][topic]
    if scale not in blocks:
        raise ConfigError(
            f"topic '{topic}' has no block for scale '{scale}' (config/{topic}.yaml, or the config's topics/{topic})"
        )
    return blocks[scale]


def part_configured(config: dict, topic, scale: str, part: str) -> bool:
    """Whether ``part`` of ``topic`` (a harness.topic.Topic) is measured at ``scale``: a topic that
    gives its parts blocks of their own measures at a scale only the parts its block there lists
    (a GPU part left out of the small scales is not run there, not run without its parameters); a
    topic that configures its parts only in common measures every part."""
    blocks = config["topics"][topic.name]
    names = {p.name for p in topic.parts}
    if not any(isinstance(block, dict) and names & set(block) for block in blocks.values()):
        return True
    return part in blocks.get(scale, {})
