"""The llm_offload topic on model entries the suite does not ship: odd shapes are refused in one line
before anything runs, and a part never records two models as one or measures a model that cannot fit."""

from __future__ import annotations

import pytest
import torch

from harness.errors import UserError
from tests.kept_rows import Rows
from tests.test_llm_offload import ONE_MODEL
from workloads.llm.models import build, spec
from workloads.llm_offload import parts

# test_llm_offload's settings of one tiny model, without its model: each test names its own.
PARAMS = {k: v for k, v in ONE_MODEL.items() if k != "models"} | {"compare": []}


def _policies(models, scratch):
    return parts.policies(PARAMS | {"models": models}, None, repeat=1, warmup=0, device="cpu", scratch_dir=scratch)


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
def test_rotary_families_refuse_an_odd_head_width_in_one_line(family):
    # 63 / 3 = 21 channels a head: transformers' RoPE check raised a traceback from inside the config.
    with pytest.raises(UserError, match="even head width"):
        spec(family, "tiny", hidden=63, heads=3, kv_heads=3)
    spec("gpt2", "tiny", hidden=63, heads=3)  # learned positions: any width


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"ffn_mult": "4"}, "ffn_mult must be a positive finite number, got '4'"),
        ({"ffn_mult": float("inf")}, "ffn_mult must be a positive finite number, got inf"),
        ({"dropout": "0.1"}, r"dropout must be a number in \[0, 1\), got '0.1'"),
        ({"dropout": float("nan")}, r"dropout must be a number in \[0, 1\), got nan"),
        ({"max_positions": "64"}, "max_positions must be a positive integer, got '64'"),
        ({"max_positions": 100.5}, "max_positions must be a positive integer, got 100.5"),
        ({"max_positions": True}, "max_positions must be a positive integer, got True"),
    ],
)
def test_settings_of_the_wrong_type_are_refused_in_one_line(setting, message):
    # Compared before they were checked, they raised TypeError or OverflowError tracebacks, or
    # reached transformers' config validation.
    with pytest.raises(UserError, match=f"^gpt2 {message}$"):
        spec("gpt2", "tiny", **setting)


def test_a_causal_model_of_one_token_is_refused_and_the_others_train():
    # Nothing to predict: the loss was NaN and the part blamed the reference's reproduction.
    for family in ("gpt2", "llama", "qwen2"):
        with pytest.raises(UserError, match="needs 2 tokens"):
            spec(family, "tiny", sequence=1)
    for family in ("bert", "t5"):  # masked and seq2seq heads have a target at one token
        s = spec(family, "tiny", sequence=1, micro_batch=1)
        assert s.sequence == 1 and build(s).model.training


def test_two_models_under_one_dataset_name_are_refused_before_anything_is_built(monkeypatch, tmp_path):
    # The name shows hidden, layers, sequence and micro-batch: kv_heads 4 and 1 came to one dataset,
    # found only once the first model had been measured, as "the same measurement recorded twice".
    monkeypatch.setattr(parts, "build", lambda *a, **k: pytest.fail("a model was built"))
    models = [
        {"family": "llama", "preset": "tiny", "kv_heads": 4},
        {"family": "llama", "preset": "tiny", "kv_heads": 1},
    ]
    with pytest.raises(UserError, match="both named 'llama-64x2-s32b4'.*kv_heads"):
        _policies(models, tmp_path)
    with pytest.raises(UserError, match="listed twice"):
        _policies([{"family": "t5", "preset": "tiny"}] * 2, tmp_path)
    # An invalid later entry is refused before the first is measured, too.
    with pytest.raises(UserError, match="even head width"):
        _policies(
            [{"family": "gpt2", "preset": "tiny"}, {"family": "llama", "preset": "tiny", "heads": 2, "hidden": 6}],
            tmp_path,
        )


def test_a_non_finite_reference_is_named_as_such(monkeypatch, tmp_path):
    # A NaN loss never equals itself: the reproduction check ran first and reported "nan differs from nan".
    def nan_step(model, batch, policy=None):
        return torch.tensor(float("nan")), {"w": torch.ones(1)}

    monkeypatch.setattr(parts, "one_step", nan_step)
    with pytest.raises(parts.NotBitIdentical, match="non-finite loss"):
        _policies([{"family": "gpt2", "preset": "tiny"}], tmp_path)


def test_memory_bound_refuses_a_model_whose_state_exceeds_the_emulated_cap(tmp_path):
    # The tiny T5's weights, gradients and moments (3.8 MB) are above the 3.3 MB cap: on a CPU every
    # micro-batch was recorded out of memory (and the planner planned within negative room), where a
    # GPU's build refuses the model in one line.
    params = PARAMS | {
        "model": {"family": "t5", "preset": "tiny"},
        "global_batch": 2,
        "micro_batches": [1, 2],
        "memory_cap_gib": 0.0031,
    }
    with pytest.raises(UserError, match="alone do not fit under memory_cap_gib"):
        parts.memory_bound(params, None, repeat=1, warmup=0, device="cpu", scratch_dir=tmp_path)


@pytest.mark.filterwarnings("ignore:SSDTrain offloaded nothing")
def test_an_offloading_variant_whose_check_offloaded_nothing_is_named(tmp_path):
    # min_bytes above every saved tensor: offload_all's check compared keep with keep, and passed.
    params = PARAMS | {
        "models": [{"family": "llama", "preset": "tiny"}],
        "stores": ["host"],
        "compare": ["offload_all"],
    }
    notes = parts.policies(
        params | {"min_bytes": 1 << 40}, Rows(), repeat=1, warmup=0, device="cpu", scratch_dir=tmp_path
    )
    assert notes["models"]["llama-tiny"]["checked_without_offloading"] == ["offload_all_host"]
    notes = parts.policies(params, Rows(), repeat=1, warmup=0, device="cpu", scratch_dir=tmp_path)
    assert "checked_without_offloading" not in notes["models"]["llama-tiny"]
