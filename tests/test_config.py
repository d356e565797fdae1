"""TrainConfig: defaults, YAML round trip, coercion, and one clear error per bad field."""

from __future__ import annotations

import pytest

from finetune.config import FIELD_NAMES, TrainConfig, field_groups, field_help, field_label, parse_set_option
from finetune.errors import ConfigError

CONTRACT_KEYS = (
    "model dataset dataset_split eval_split task text_column prompt_column completion_column messages_column "
    "label_column num_labels method lora_r lora_alpha lora_dropout lora_target_modules quant_type double_quant "
    "precision per_device_train_batch_size gradient_accumulation_steps gradient_checkpointing max_seq_length packing "
    "learning_rate weight_decay max_grad_norm optim lr_scheduler_type warmup_steps num_train_epochs max_steps "
    "logging_steps save_steps eval_steps seed report_to backend zero_stage offload_optimizer offload_param output_dir "
    "trust_remote_code objective beta loss_type chosen_column rejected_column liger_kernel"
).split()


def test_every_contract_key_exists_with_help_and_group():
    for key in CONTRACT_KEYS:
        assert key in FIELD_NAMES, key
        assert len(field_help(key)) > 15, key
        assert field_label(key) != key and "_" not in field_label(key), key
    assert set(field_groups()) == {
        "Model",
        "Data",
        "Objective",
        "Method",
        "Optimisation",
        "Precision & memory",
        "DeepSpeed",
        "Output",
        "Where it runs",
    }


def test_defaults_are_the_embedded_demo():
    c = TrainConfig()
    assert c.model == "embedded:smollm2-135m-instruct"
    assert c.dataset == "bundled:pirate"
    assert c.method == "lora" and c.trust_remote_code is False
    assert 0 < c.max_steps <= 60


def test_yaml_round_trip_is_flat_and_lossless():
    c = TrainConfig(method="qlora", lora_r=16, learning_rate=1e-4, gradient_checkpointing=True)
    text = c.to_yaml()
    assert "lora_r: 16" in text and "\n  " not in text  # flat: one key per line
    assert TrainConfig.from_yaml(text) == c


def test_values_from_forms_and_cli_strings_are_coerced():
    c = TrainConfig.from_dict({"lora_r": "32", "learning_rate": "2e-4", "packing": "no", "max_steps": 10.0})
    assert (c.lora_r, c.learning_rate, c.packing, c.max_steps) == (32, 2e-4, False, 10)
    assert TrainConfig(lora_target_modules=["q_proj", "v_proj"]).lora_target_modules == "q_proj,v_proj"


BAD = [
    ({"lora_rr": 8}, "lora_rr: unknown config key; did you mean 'lora_r'?"),
    ({"per_device_train_batch_size": 0}, "per_device_train_batch_size: 0 is out of range; allowed: ≥ 1"),
    ({"per_device_train_batch_size": "four"}, "per_device_train_batch_size: 'four' is not a whole number"),
    ({"learning_rate": "fast"}, "learning_rate: 'fast' is not a number"),
    ({"method": "qlor"}, "method: 'qlor' is not allowed (did you mean 'qlora'?)"),
    ({"optim": "adam"}, "optim: 'adam' is not allowed"),
    ({"precision": "fp8"}, "precision: 'fp8' is not allowed"),
    ({"packing": "maybe"}, "packing: 'maybe' is not a boolean; use true or false"),
    ({"zero_stage": 4}, "zero_stage: 4 is out of range; allowed: 0 to 3"),
    ({"lora_dropout": 1.5}, "lora_dropout: 1.5 is out of range"),
    ({"max_steps": 0}, "max_steps: 0 would train nothing"),
    ({"offload_param": "cpu", "zero_stage": 2}, "offload_param: 'cpu' needs zero_stage: 3"),
    ({"offload_optimizer": "cpu"}, "offload_optimizer: 'cpu' needs zero_stage 1, 2 or 3"),
    ({"offload_optimizer": "nvme", "zero_stage": 3}, "nvme_path: NVMe offload needs nvme_path"),
    ({"model": ""}, "model: empty"),
    ({"learning_rate": float("nan")}, "learning_rate: nan is not a finite number"),
    ({"task": "regression"}, "task: 'regression' is not allowed"),
]


@pytest.mark.parametrize(("values", "message"), BAD, ids=[next(iter(v)) for v, _ in BAD])
def test_bad_values_get_one_clear_error(values, message):
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict(values)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    assert info.value.field == next(k for k in message.split(":")[:1])


def test_errors_lists_every_bad_field_at_once():
    c = TrainConfig.__new__(TrainConfig)
    for name in FIELD_NAMES:
        setattr(c, name, getattr(TrainConfig(), name))
    c.lora_r, c.learning_rate, c.optim = 0, "x", "nope"
    assert {e.field for e in c.errors()} == {"lora_r", "learning_rate", "optim"}


def test_malformed_yaml_and_set_option():
    with pytest.raises(ConfigError, match="not valid YAML at line 2"):
        TrainConfig.from_yaml("model: a\n  bad: [1,\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        TrainConfig.from_yaml("- just\n- a list\n")
    assert parse_set_option("lora_r=4") == ("lora_r", "4")
    with pytest.raises(ConfigError, match="did you mean 'max_steps'"):
        parse_set_option("max_step=4")


def test_space_default_model_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("FINETUNE_DEFAULT_MODEL", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert TrainConfig().model == "HuggingFaceTB/SmolLM2-135M-Instruct"
