"""The suite's configuration: one YAML file, validated against a JSON schema, with named scales.

Snakemake and every entry point load it through :func:`load`, so a malformed file is refused the
same way everywhere, with the offending key named.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from harness.errors import NeedsGpuError, UserError
from harness import machine

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "config" / "config.yaml"
SCHEMA = REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(UserError):
    pass


def validate(config: dict) -> None:
    import jsonschema

    schema = yaml.safe_load(SCHEMA.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        where = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        raise ConfigError(f"config key '{where}': {err.message} (schema: {SCHEMA.relative_to(REPO_ROOT)})")


def load(path: Path | str = DEFAULT_CONFIG, overrides: dict | None = None) -> dict:
    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    config.update(overrides or {})
    validate(config)
    return config


def scale_params(config: dict, scale: str) -> dict:
    """The parameters of one named scale, refusing unknown scales and GPU scales without a GPU."""
    scales = config["scales"]
    if scale not in scales:
        raise ConfigError(f"unknown scale '{scale}'; choose one of {', '.join(scales)} (--config scale=NAME)")
    params = scales[scale]
    if params.get("needs_gpu") and not machine.has_gpu():
        raise NeedsGpuError(
            f"scale '{scale}' needs a CUDA GPU and this machine has none that torch can use; "
            "use --config scale=cpu, or render committed results with the 'figures' target")
    return params
