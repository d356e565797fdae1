"""The one search's options: combinations ranked by an honest cost (slowdown, what is trained, data cut off measured
on the data's own token lengths), the effective batch always kept, "fits" meaning headroom is left ("tight" inside
it), the 8B QLoRA case on a 24 GB card, and the proposal on the tiny model. The first screen's cases on real model
shapes are in tests/test_propose.py."""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import pytest

from finetune import memory
from finetune.cli import memory as cli_memory
from finetune.config import FIELDS, TrainConfig
from finetune.data.stats import data_stats
from finetune.errors import ConfigError
from finetune.memory.search import allowed, combinations, cut_words, whole_length
from finetune.plan import plan_for
from finetune.studio import Studio
from tests.helpers import tiny_config, write_jsonl

WORDS = "the ship sails at dawn and the crew sings "  # 42 characters


@pytest.fixture(scope="module")
def long_rows(tmp_path_factory) -> Path:
    """50 text rows of 2500 to 15000 characters: many longer than 512 tokens in any tokenizer."""
    rows = [{"text": WORDS * (60 + 50 * (i % 7))} for i in range(50)]
    return write_jsonl(tmp_path_factory.mktemp("long") / "long.jsonl", rows)


@pytest.fixture(scope="module")
def short_rows(tmp_path_factory) -> Path:
    """40 prompt/completion rows, each well under 128 tokens."""
    rows = [{"prompt": f"Question {i}?", "completion": "Arr! " * (1 + i % 9)} for i in range(40)]
    return write_jsonl(tmp_path_factory.mktemp("short") / "short.jsonl", rows)


def fitting_capacity(config: TrainConfig, share: float = 0.6) -> float:
    """GiB that hold `share` of what the run needs on the CPU (so it does not fit as it is)."""
    return share * memory.estimate(plan_for(config, "cpu")).total_bytes / memory.GiB


# ----------------------------------------------------------------------------- the data's token lengths


def test_data_stats_count_the_tokens_training_sees(tiny_model_dir, long_rows):
    from transformers import AutoTokenizer

    config = tiny_config(tiny_model_dir, dataset=str(long_rows), max_seq_length=512)
    stats = Studio().data_stats(config.to_dict())
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = [json.loads(line)["text"] for line in long_rows.read_text().splitlines()]
    eos = tokenizer.eos_token
    expected = sorted(len(tokenizer(text + eos, add_special_tokens=False)["input_ids"]) for text in rows)
    assert stats.rows == 50 and stats.lengths == expected and not stats.sampled
    assert stats.p50 <= stats.p90 <= stats.p99 <= stats.max == expected[-1]
    assert stats.fit_share == sum(n <= 512 for n in expected) / 50
    assert stats.tokens_lost(512) == pytest.approx(sum(max(0, n - 512) for n in expected) / sum(expected))
    assert stats.tokens_lost(stats.max) == 0.0 and "50 rows" in stats.summary()


def test_without_the_models_tokenizer_lengths_are_estimated_and_said(long_rows):
    """A Hub model offline (conftest sets HF_HUB_OFFLINE=1) and no embedded tokenizer on disk: characters / 4."""
    config = TrainConfig(model="meta-llama/Llama-3.1-8B", dataset=str(long_rows))
    stats = data_stats(config)
    assert stats.max == -(-len(WORDS * 360) // 4) + 4 and "characters per token" in stats.notes[0]


def test_conversational_preference_pairs_are_counted_with_their_longer_answer(tmp_path):
    """Pairs whose prompt and answers are conversations (TRL's conversational shape): the prompt plus the longer
    answer, as a step holds one side at a time. (The count used to stop with "expected text, got a list".)"""
    short, long = "Aye.", "Arr, the longest answer of all, matey! " * 5
    rows = [
        {
            "prompt": [{"role": "user", "content": f"Question {i}?"}],
            "chosen": [{"role": "assistant", "content": long if i % 2 else short}],
            "rejected": [{"role": "assistant", "content": short if i % 2 else long}],
        }
        for i in range(6)
    ]
    config = TrainConfig(
        model="meta-llama/Llama-3.1-8B", objective="dpo", dataset=str(write_jsonl(tmp_path / "p.jsonl", rows))
    )
    stats = data_stats(config)
    prompt, answer = -(-len("Question 1?") // 4) + 4, -(-len(long) // 4) + 4
    assert stats.rows == 6 and stats.lengths == [prompt + answer] * 6


# ----------------------------------------------------------------------------- ranking


def test_cutting_rows_that_are_all_shorter_is_free(tiny_model_dir, short_rows):
    config = tiny_config(
        tiny_model_dir, dataset=str(short_rows), method="full", per_device_train_batch_size=8, max_seq_length=512,
        packing=False,  # padded rows: a packed micro batch already costs only its real tokens, whatever the cut
    )  # fmt: skip
    est = memory.estimate(plan_for(config, "cpu"), gpu_gib=fitting_capacity(config))
    assert est.fits is False and est.advice
    shorter = [a for a in est.advice if "max_seq_length" in a.changes]
    assert shorter and all(a.keeps_data and "every row still fits" in a.cost for a in shorter)
    assert est.advice[0].keeps_data and est.advice[0].fits


def test_cuts_are_priced_on_the_datas_lengths_and_said_in_rows_and_tokens(tiny_model_dir, long_rows):
    """Every row is longer than the 512 positions the tiny model takes: no option can keep the data whole, so each
    one says what its length cuts, measured on the data, and they rank by their whole cost."""
    config = tiny_config(
        tiny_model_dir, dataset=str(long_rows), method="full", per_device_train_batch_size=8, max_seq_length=512
    )
    est = memory.estimate(plan_for(config, "cpu"), gpu_gib=fitting_capacity(config))
    stats = data_stats(config)
    assert est.advice and whole_length(config, stats) == 512 < stats.max
    for a in est.advice:
        seq = a.changes.get("max_seq_length", 512)
        assert a.data_lost == pytest.approx(stats.tokens_lost(seq)) and a.cut == cut_words(stats, seq)
        assert f"50 of 50 rows lose up to {stats.max - seq} tokens each" in a.cost
        assert config.replace(**a.changes).effective_batch_size == config.effective_batch_size
        assert "time" in a.cost or "speed" in a.cost  # each option states its speed cost
    scores = [a.score for a in est.advice if a.fits]
    assert scores == sorted(scores)


def test_a_hub_dataset_is_never_downloaded_for_advice_and_its_cuts_rank_last(tiny_model_dir, monkeypatch):
    from finetune.data import loading

    def no_download(config):
        raise AssertionError("the estimate read the dataset")

    monkeypatch.setattr(loading, "_load_hub", no_download)
    config = tiny_config(
        tiny_model_dir, dataset="someone/a-hub-dataset", method="full", per_device_train_batch_size=8,
        max_seq_length=512,
    )  # fmt: skip
    est = memory.estimate(plan_for(config, "cpu"), gpu_gib=fitting_capacity(config, 0.3))
    assert est.advice
    cuts = [a for a in est.advice if "max_seq_length" in a.changes]
    assert cuts and all(a.data_lost is None and "data length unknown" in a.cost for a in cuts)
    whole = [a.keeps_data for a in est.advice]
    assert whole == sorted(whole, reverse=True)


# ----------------------------------------------------------------------------- the 8B QLoRA case


@pytest.fixture(scope="module")
def llama_8b_qlora(long_rows) -> TrainConfig:
    """meta-llama/Llama-3.1-8B from the bundled catalogue (offline), QLoRA, batch 8 x 2048 tokens, long rows."""
    return TrainConfig(
        model="meta-llama/Llama-3.1-8B",
        dataset=str(long_rows),
        method="qlora",
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        max_seq_length=2048,
    )


def test_8b_qlora_on_a_24gb_card_keeps_2048_tokens_and_batch_8(llama_8b_qlora, capsys):
    card = memory.GPU_CARDS["L4 (24 GB)"]  # 22.0 GiB usable: the tightest 24 GB card
    memory.estimate(plan_for(llama_8b_qlora, "cuda"))  # the replay of the settings as given (cached afterwards)
    started = time.monotonic()
    est = memory.estimate(plan_for(llama_8b_qlora, "cuda"), gpu_gib=card)
    advice_seconds = time.monotonic() - started
    assert est.fits is False and est.advice
    top = est.advice[0]
    chosen = llama_8b_qlora.replace(**top.changes)
    assert chosen.max_seq_length == 2048 and chosen.effective_batch_size == 8
    # Rows of up to 3,784 tokens: 4,096 keeps them whole, but no combination holds it; so 2048 stays, and says so.
    assert top.cut == cut_words(data_stats(llama_8b_qlora), 2048) and top.cut.startswith("28 of 50 rows lose up to")
    assert chosen.gradient_checkpointing and chosen.method == "qlora"
    assert top.fits and top.new_total_bytes <= card * memory.GiB
    assert advice_seconds < 20, f"advice took {advice_seconds:.1f} s"

    # `estimate --json` gives the same ranked list.
    parser = argparse.ArgumentParser(prog="finetune")
    cli_memory.register(parser.add_subparsers(dest="command", required=True))
    sets = [a for k in ("model", "dataset", "method", "per_device_train_batch_size", "max_seq_length")
            for a in ("--set", f"{k}={getattr(llama_8b_qlora, k)}")]  # fmt: skip
    args = parser.parse_args(["estimate", *sets, "--set", "gradient_accumulation_steps=1", "--gpu-gib", "l4", "--json"])
    assert args.func(args) == 0
    answer = json.loads(capsys.readouterr().out)
    listed = answer["advice"]
    assert [(a["title"], a["changes"], a["cost"]) for a in listed] == [(a.title, a.changes, a.cost) for a in est.advice]
    assert (answer["verdict"], answer["fits"], answer["margin_bytes"]) == ("does not fit", False, est.margin_bytes)


# ----------------------------------------------------------------------------- the first screen's proposal


def test_proposal_is_a_complete_configuration_that_fits_with_reasons(tiny_model_dir, short_rows):
    asked = tiny_config(
        tiny_model_dir, dataset=str(short_rows), method="full", per_device_train_batch_size=8, max_seq_length=512,
        packing=False,  # padded rows: max_seq_length is what a padded micro batch costs
    )  # fmt: skip
    capacity = fitting_capacity(asked, 0.5)
    proposal = Studio().propose(asked.to_dict(), device="cpu", gpu_gib=capacity)
    assert set(proposal.values) == set(FIELDS)
    chosen = TrainConfig.from_dict(proposal.values)
    assert proposal.fits is True and proposal.estimate.fits and proposal.estimate.total_bytes <= capacity * memory.GiB
    assert chosen.effective_batch_size == asked.effective_batch_size
    longest = data_stats(asked).max
    assert longest <= chosen.max_seq_length < 512  # every row still whole, less memory promised
    assert proposal.changes == {k: v for k, v in proposal.values.items() if asked.to_dict()[k] != v}
    assert 2 <= len(proposal.reasons) <= 4 and all(r.endswith(".") for r in proposal.reasons)
    assert f"{chosen.max_seq_length} tokens per row keeps them whole" in proposal.reasons[-1]


def test_proposal_keeps_settings_that_already_fit(tiny_model_dir):
    asked = tiny_config(tiny_model_dir)  # 64 tokens: the short mini data fits whole
    proposal = Studio().propose(asked.to_dict(), device="cpu", gpu_gib=64.0)
    assert proposal.fits is True and proposal.estimate.advice == []
    assert TrainConfig.from_dict(proposal.values).effective_batch_size == asked.effective_batch_size
    assert "LoRA trains small adapters" in proposal.reasons[0] and "fits as set" in proposal.reasons[1]


# ----------------------------------------------------------------------------- headroom


def test_fits_means_headroom_is_left_and_inside_the_margin_is_tight(tiny_model_dir, short_rows):
    from finetune.memory.search import margin_bytes, verdict

    assert margin_bytes(int(8 * memory.GiB)) == memory.GiB  # a GPU keeps at least 1 GiB ...
    assert margin_bytes(int(80 * memory.GiB)) == 4 * memory.GiB  # ... or 5% of it
    assert margin_bytes(1000, device="cpu") == 50  # RAM: 5%, no floor
    assert [verdict(t, 100, "cpu") for t in (95, 96, 100, 101)] == ["fits", "tight", "tight", "does not fit"]
    config = tiny_config(tiny_model_dir, dataset=str(short_rows), method="full", per_device_train_batch_size=8)
    total = memory.estimate(plan_for(config, "cpu")).total_bytes
    est = memory.estimate(plan_for(config, "cpu"), gpu_gib=total / 0.98 / memory.GiB)  # 2% left: inside the margin
    assert est.verdict == "tight" and est.fits is False and 0 < est.headroom_bytes < est.margin_bytes
    assert est.advice and est.advice[0].fits and not est.advice[0].tight
    assert est.advice[0].headroom_bytes >= est.margin_bytes  # the option shown first leaves the headroom
    assert "TIGHT" in est.render_text() and "a fit keeps" in est.render_text()


# ----------------------------------------------------------------------------- the config's rules are the search's
LIGHTER = {"full": ("full", "lora", "qlora"), "lora": ("lora", "qlora"), "qlora": ("qlora",)}  # the method lever
EIGHT_BIT = ("adamw_8bit", "paged_adamw_8bit")  # the optimizer lever, from adamw_torch


def rules_allow(config: TrainConfig, changes: dict) -> bool:
    """`TrainConfig`'s own validation of a changed config."""
    try:
        config.replace(**changes)
    except ConfigError:
        return False
    return True


def settings(start: dict, changes: dict) -> tuple:
    """(method, ZeRO stage, optimizer offload, optimizer) of a starting config after `changes`."""
    merged = {**start, "offload_optimizer": "none", **changes}
    return merged["method"], merged["zero_stage"], merged["offload_optimizer"], merged["optim"]


def test_the_search_weighs_every_combination_the_configs_rules_allow_and_prices_no_other():
    """On 2 GPUs, from every starting method, ZeRO stage, backend and optimizer: the (method, ZeRO stage, optimizer
    offload, optimizer) settings the search weighs and may price are exactly those its levers reach that
    `TrainConfig` accepts (ZeRO-1/2 with QLoRA included; QLoRA under ZeRO-3 or the DeepSpeed engine loop not)."""
    pinned = ("max_seq_length", "per_device_train_batch_size", "gradient_checkpointing", "packing")
    base = TrainConfig(model="m", dataset="d.jsonl")
    checked = 0
    for method, zero, backend, optim in itertools.product(
        LIGHTER, (0, 1, 2), ("trainer", "deepspeed"), ("adamw_torch", "adamw_8bit")
    ):
        start = {"method": method, "zero_stage": zero, "backend": backend, "optim": optim}
        if not rules_allow(base, start):
            continue
        config = TrainConfig(model="m", dataset="d.jsonl", **start)
        plan = plan_for(config, device="cuda", world_size=2)
        weighed = set()
        for combo in combinations(plan, pinned=pinned):
            ok = rules_allow(config, combo.changes)
            assert (allowed(plan, combo.changes) is not None) == ok, (start, combo.changes)  # priced iff allowed
            if ok:
                weighed.add(settings(start, combo.changes))
        # The sharding lever: a higher ZeRO stage over the 2 GPUs, or optimizer states in CPU RAM (ZeRO-2 at least).
        sharding = [(zero, "none"), *((s, "none") for s in (2, 3) if s > zero), (max(2, zero), "cpu")]
        optims = (optim, *EIGHT_BIT) if optim == "adamw_torch" else (optim,)
        reachable = set()
        for m, (s, offload), o in itertools.product(LIGHTER[method], sharding, optims):
            changes = {"method": m, "zero_stage": s, "offload_optimizer": offload, "optim": o}
            if settings(start, changes) != settings(start, {}) and rules_allow(config, changes):
                reachable.add(settings(start, changes))
        assert weighed == reachable, (start, reachable - weighed, weighed - reachable)
        checked += 1
    assert checked >= 20


def test_lora_under_zero_2_is_offered_qlora_which_the_rules_allow():
    """An 8B LoRA run sharded with ZeRO-2 over two 20 GiB GPUs (checkpointing, batch 1, a paged 8-bit optimizer
    already on) does not fit: the options are ZeRO-3, then QLoRA with ZeRO-2 kept, which `TrainConfig` allows (the
    search once offered QLoRA only without ZeRO). The data's lengths are unknown (a Hub dataset, offline)."""
    config = TrainConfig(
        model="meta-llama/Llama-3.1-8B", dataset="someone/chats", method="lora", zero_stage=2,
        gradient_checkpointing=True, per_device_train_batch_size=1, gradient_accumulation_steps=8,
        optim="paged_adamw_8bit", max_seq_length=2048,
    )  # fmt: skip
    est = memory.estimate(plan_for(config, "cuda", world_size=2), gpu_gib=20.0)
    assert est.fits is False
    assert [(a.changes, a.fits) for a in est.advice] == [({"zero_stage": 3}, True), ({"method": "qlora"}, True)]
    chosen = config.replace(**est.advice[1].changes)
    assert (chosen.method, chosen.zero_stage, chosen.backend) == ("qlora", 2, "trainer")
    assert est.advice[1].title == "QLoRA: a 4-bit base model"
