"""Padding-free packing (finetune/model/packing.py): exactly the padded batch's loss and gradients, the same training
run,
truncation as without packing, and a model whose attention cannot keep examples apart trains padded, said in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from finetune import data
from finetune.model import loading, packing
from finetune.plan import plan_for
from finetune.runs.manager import RunManager
from finetune.runs.rundir import RunDir
from tests.helpers import tiny_config, write_jsonl

WORDS = "the ship sails at dawn and the crew sings of gold and storms".split()
LENGTHS = [3, 60, 8, 140, 14, 30, 5, 90]  # answer words: mixed, one cut by max_seq_length (LONGEST_TOKENS)
MAX_SEQ = 160
EXACT = 1e-4  # relative difference a packed micro batch may have from the padded one (fp32, CPU)


@pytest.fixture(scope="module")
def chat_rows(tmp_path_factory) -> Path:
    """Chat data of mixed lengths: single- and multi-turn conversations, one longer than max_seq_length."""
    rows = []
    for i, n in enumerate(LENGTHS):
        answer = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(n))
        messages = [{"role": "user", "content": f"Tell me story {i}."}, {"role": "assistant", "content": answer}]
        if i % 3 == 0:
            messages += [{"role": "user", "content": "And then?"}, {"role": "assistant", "content": answer[:40]}]
        rows.append({"messages": messages})
    return write_jsonl(tmp_path_factory.mktemp("chat") / "chat.jsonl", rows)


def micro_batch(tiny_model_dir: Path, chat_rows: Path, **overrides):
    """The config, and every training example of the chat rows as the engine tokenises them."""
    config = tiny_config(
        tiny_model_dir, dataset=str(chat_rows), max_seq_length=MAX_SEQ, per_device_train_batch_size=8, **overrides
    )
    tokenizer = loading.load_tokenizer(config)
    prepared = data.prepare(config, tokenizer)
    return config, tokenizer, [prepared.train[i] for i in range(len(prepared.train))]


def loss_and_grads(model, batch: dict, attention: str | None = None) -> tuple[float, dict[str, torch.Tensor]]:
    if attention is not None:
        model.set_attn_implementation(attention)
    model.zero_grad()
    out = model(**batch)
    out.loss.backward()
    return float(out.loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def grad_gap(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """The largest relative difference of any parameter's gradient (its norm) from the reference."""
    return max(float((grads[n] - g).norm() / g.norm()) for n, g in reference.items() if g.norm() > 0)


def test_a_packed_micro_batch_has_the_padded_loss_and_gradients_and_naive_flattening_does_not(
    tiny_model_dir, chat_rows
):
    config, tokenizer, features = micro_batch(tiny_model_dir, chat_rows, method="full")
    assert len({len(f["input_ids"]) for f in features}) >= 6  # mixed lengths: padding is most of a padded batch
    padded = data.collator(config, tokenizer, packing=False)(features)
    packed = data.collator(config, tokenizer, packing=True)(features)
    assert packed["input_ids"].shape == (1, sum(len(f["input_ids"]) for f in features))  # no padding at all
    # The Trainer divides the summed loss by the trained tokens it counts (labels[..., 1:]): the same count.
    assert int((packed["labels"][..., 1:] != -100).sum()) == int((padded["labels"][..., 1:] != -100).sum())

    model = loading.load_model(plan_for(config, "cpu"))  # full fine-tuning, fp32: every weight's gradient is compared
    loss_padded, grads_padded = loss_and_grads(model, padded, "sdpa")
    assert packing.enable(model) is None
    loss_packed, grads_packed = loss_and_grads(model, packed)
    assert abs(loss_packed - loss_padded) <= EXACT * loss_padded, (loss_packed, loss_padded)
    assert grad_gap(grads_packed, grads_padded) <= EXACT

    # The trap: the same row with position_ids but no boundaries, under transformers' sdpa.
    naive = {key: packed[key] for key in ("input_ids", "labels", "position_ids")}
    loss_naive, grads_naive = loss_and_grads(model, naive, "sdpa")
    assert abs(loss_naive - loss_padded) > 10 * EXACT * loss_padded, (loss_naive, loss_padded)
    assert grad_gap(grads_naive, grads_padded) > 10 * EXACT


def test_an_example_longer_than_max_seq_length_is_cut_exactly_as_without_packing(tiny_model_dir, chat_rows):
    config, tokenizer, features = micro_batch(tiny_model_dir, chat_rows)
    padded = data.collator(config, tokenizer, packing=False)(features)
    packed = data.collator(config, tokenizer, packing=True)(features)
    bounds = packed["cu_seq_lens_q"].tolist()
    cut = [i for i, f in enumerate(features) if len(f["input_ids"]) == MAX_SEQ]
    assert cut, "the longest conversation should reach max_seq_length"
    for i in range(len(features)):
        start, end = bounds[i], bounds[i + 1]
        real = int(padded["attention_mask"][i].sum())
        assert end - start == real <= MAX_SEQ
        assert torch.equal(packed["input_ids"][0, start:end], padded["input_ids"][i, :real])
        assert torch.equal(packed["position_ids"][0, start:end], torch.arange(real))
        # Labels unchanged but the first, which a padded row never trains on either (it is nobody's next token).
        assert packed["labels"][0, start] == -100
        assert torch.equal(packed["labels"][0, start + 1 : end], padded["labels"][i, 1:real])


@pytest.fixture(scope="module")
def same_runs(tiny_model_dir, chat_rows, tmp_path_factory):
    """Two LoRA runs of the same config on the Trainer path, packing on and off (no dropout: it draws its masks in the
    batch's shape), and the same pair on the DeepSpeed engine loop."""
    out = {}
    for backend in ("trainer", "deepspeed"):
        for on in (True, False):
            config = tiny_config(
                tiny_model_dir, dataset=str(chat_rows), max_seq_length=MAX_SEQ, max_steps=3, lora_dropout=0.0,
                packing=on, backend=backend, output_dir=str(tmp_path_factory.mktemp("run") / "run"),
            )  # fmt: skip
            state = RunManager(tmp_path_factory.mktemp("root")).start(config, background=False)
            assert state.status == "completed", (state.status, state.error)
            out[backend, on] = RunDir(Path(state.run_dir))
    return out


@pytest.mark.parametrize("backend", ["trainer", "deepspeed"])
def test_packing_trains_the_same_examples_to_the_same_losses(same_runs, backend):
    packed, padded = same_runs[backend, True], same_runs[backend, False]
    logs = {run: run.read_events(("log",)) for run in (packed, padded)}
    assert [e["step"] for e in logs[packed]] == [1, 2, 3]
    for a, b in zip(logs[packed], logs[padded], strict=True):
        # The same examples each step; and the packed run counts every real token (the padded run counts its mask; a
        # count of the ids that are not the pad id would miss the <|im_end|> tokens inside the text).
        assert a["epoch"] == b["epoch"] and a["tokens_seen"] == b["tokens_seen"]
        assert abs(a["loss"] - b["loss"]) <= EXACT * b["loss"], (a, b)
    said = [e["text"] for e in packed.read_events(("message",))]
    assert any(line.startswith("packing: on") for line in said), said
    ran = packed.load_plan()  # plan.json: the engine that ran the step, and packing as it ran
    assert ran.packing and ran.packing_line in said
    assert ran.engine == {"trainer": "hf_trainer", "deepspeed": "deepspeed_engine"}[backend]
    assert not any("packing" in e["text"] for e in padded.read_events(("message",)))  # packing: false says nothing


def test_the_plan_says_where_packing_applies_and_why_not(tiny_model_dir):
    def decision(**changes):
        plan = plan_for(tiny_config(tiny_model_dir, **changes), device="cpu")
        return plan.packing, plan.packing_note

    assert decision() == (True, "each micro batch is one row without padding, attention confined to each example")
    assert decision(packing=False)[0] is False
    assert decision(objective="dpo")[0] is False and "TRL 1.16's DPO trainer" in decision(objective="dpo")[1]
    assert "KTO" in decision(objective="kto")[1] and "ORPO" in decision(objective="orpo")[1]
    grpo = decision(objective="grpo", rewards="number_match")
    assert grpo[0] is False and "TRL 1.16's GRPO trainer has no padding-free path" in grpo[1]
    assert "classification" in decision(task="sequence_classification")[1]
    assert "one example per micro batch" in decision(per_device_train_batch_size=1)[1]
    assert decision(backend="deepspeed")[0] is True


def test_attention_that_does_not_confine_examples_is_caught(tiny_model_dir):
    model = loading.load_model(plan_for(tiny_config(tiny_model_dir), "cpu"))
    model.get_base_model().set_attn_implementation("sdpa")  # position_ids alone: the trap
    assert packing.confinement_problem(model) == "its attention lets packed examples see each other"
    packing.use(model)
    assert packing.confinement_problem(model) is None


@pytest.fixture(scope="module")
def softcapped_model(tmp_path_factory) -> Path:
    """A tiny Gemma-2 with the tests' tokenizer: its soft-capped attention takes no attention function but its own."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from tests.tiny import TINY_SHAPE, build_tokenizer

    path = tmp_path_factory.mktemp("gemma2")
    tokenizer = build_tokenizer(path)
    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=len(tokenizer), head_dim=16, attn_logit_softcapping=50.0, sliding_window=64,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        **TINY_SHAPE,
    )  # fmt: skip
    Gemma2ForCausalLM(config).save_pretrained(path)
    return path


def test_a_model_whose_attention_cannot_be_switched_trains_padded_and_says_why(softcapped_model, tmp_path):
    config = tiny_config(softcapped_model, max_steps=1, output_dir=str(tmp_path / "run"))
    assert plan_for(config, device="cpu").packing  # the plan would pack: only the model itself can tell
    state = RunManager(tmp_path / "root").start(config, background=False)
    assert state.status == "completed", state.error
    said = [e["text"] for e in RunDir(Path(state.run_dir)).read_events(("message",)) if "packing" in e["text"]]
    assert len(said) == 1 and said[0].startswith("packing: off: its attention cannot be switched ("), said
    assert "Gemma2ForCausalLM" in said[0] and said[0].endswith("; this run pads its micro batches instead")
    assert "\n" not in said[0]
    # The run's plan.json says what ran: packing off, with the reason the log gave, from the one decision.
    recorded = json.loads((Path(state.run_dir) / "plan.json").read_text(encoding="utf-8"))
    assert recorded["packing"] is False and recorded["engine"] == "hf_trainer"
    ran = RunDir(Path(state.run_dir)).load_plan()
    assert ran.packing_line == said[0] and ran.packing_note.startswith("its attention cannot be switched (")


def test_the_packed_attention_refuses_what_it_does_not_compute():
    """Soft-capped logits or attention sinks are refused, never computed without them (the probe then fails, and the
    run pads)."""
    q = torch.zeros(1, 2, 6, 4)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="softcap is not supported"):
        packing.packed_attention(torch.nn.Module(), q, q, q, None, cu_seq_lens_q=cu, softcap=30.0)
    out, _ = packing.packed_attention(torch.nn.Module(), q, q, q, None, cu_seq_lens_q=cu)
    assert out.shape == (1, 6, 2, 4)


def test_the_estimate_of_a_packed_run_follows_its_measured_peak_and_counts_real_tokens(tiny_model_dir, chat_rows):
    """A packed micro batch costs what its real tokens cost: the data's longest rows, not batch x max_seq_length."""
    from finetune import memory
    from finetune.data.stats import data_stats
    from tests.helpers import measured_peak

    config = tiny_config(tiny_model_dir, dataset=str(chat_rows), max_seq_length=512, max_steps=2)
    measured = measured_peak(config)  # two real packed Trainer steps of the data's 4 longest rows
    est = memory.estimate(plan_for(config, "cpu"))
    assert -0.03 <= (est.tensor_bytes - measured) / measured <= 0.03, (est.tensor_bytes, measured)
    real = sum(data_stats(config).lengths[-4:])  # the 4 longest rows, none cut at 512
    assert f"packing: a micro batch holds at most {real} real tokens" in " ".join(est.notes), est.notes
    padded = memory.estimate(plan_for(config.replace(packing=False), "cpu"))  # 4 rows x 512 tokens
    share = est.components["activations"] / padded.components["activations"]
    assert real < 0.6 * 4 * 512 and abs(share - real / (4 * 512)) < 0.05, (share, real)


def test_the_one_search_proposes_packing_when_it_is_off_in_one_answer(tiny_model_dir, chat_rows, capsys):
    """The Memory tab's advice, `estimate --json` and the Start tab's proposal read the one search: each turns packing
    on, and each prices the packed run as the estimate of those settings does (the data's longest rows)."""
    from finetune import cli, memory
    from finetune.config import TrainConfig
    from finetune.studio import Studio

    # 512 tokens keep every row whole, so the search's first options are those that keep the data as it is.
    config = tiny_config(
        tiny_model_dir, dataset=str(chat_rows), max_seq_length=512, method="full", packing=False,
        per_device_train_batch_size=8,
    )  # fmt: skip
    padded = memory.estimate(plan_for(config, "cpu"))
    packed = memory.estimate(plan_for(config.replace(packing=True), "cpu"))
    capacity = (packed.total_bytes + padded.total_bytes) / 2 / memory.GiB  # the packed run fits, the padded not
    advice = Studio().estimate(config.to_dict(), device="cpu", gpu_gib=capacity).advice  # the Memory tab's call
    assert advice and advice[0].changes == {"packing": True} and advice[0].fits, [a.changes for a in advice]
    assert advice[0].title == "Skip padding (packing)" and advice[0].cost == "about -30% time"
    assert advice[0].new_total_bytes == packed.total_bytes  # the replay of the packed settings confirmed it

    sets = [a for k, v in config.to_dict().items() if v is not None for a in ("--set", f"{k}={v}")]  # None: unset
    assert cli.main(["estimate", *sets, "--device", "cpu", "--gpu-gib", str(capacity), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["advice"]
    assert [(a["changes"], a["new_total_bytes"]) for a in listed] == [(a.changes, a.new_total_bytes) for a in advice]

    proposal = Studio().propose(config.to_dict(), device="cpu", gpu_gib=capacity, pinned=("max_seq_length",))
    chosen = TrainConfig.from_dict(proposal.values)
    assert proposal.changes["packing"] is True and proposal.fits and chosen.effective_batch_size == 8
    assert proposal.estimate.total_bytes == memory.estimate(plan_for(chosen, "cpu")).total_bytes


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_on_a_gpu_a_packed_micro_batch_has_the_padded_loss_and_gradients(tiny_model_dir, chat_rows, dtype, monkeypatch):
    """CUDA: 16-bit packed rows go through torch's varlen flash kernel (where this torch has it), fp32 through sdpa per
    example; either way the loss and gradients are the padded batch's (bf16: within its rounding)."""
    config, tokenizer, features = micro_batch(tiny_model_dir, chat_rows, method="full")
    to_gpu = lambda batch: {k: (v.cuda() if hasattr(v, "cuda") else v) for k, v in batch.items()}  # noqa: E731
    padded = to_gpu(data.collator(config, tokenizer, packing=False)(features))
    packed = to_gpu(data.collator(config, tokenizer, packing=True)(features))
    model = loading.load_model(plan_for(config, "cpu")).to("cuda", getattr(torch, dtype))
    calls = []
    varlen = packing._varlen
    monkeypatch.setattr(packing, "_varlen", lambda *a, **k: calls.append(1) or varlen(*a, **k))
    loss_padded, grads_padded = loss_and_grads(model, padded, "sdpa")
    assert packing.enable(model) is None
    loss_packed, grads_packed = loss_and_grads(model, packed)
    tolerance = EXACT if dtype == "float32" else 2e-2
    assert abs(loss_packed - loss_padded) <= tolerance * loss_padded, (loss_packed, loss_padded)
    assert grad_gap(grads_packed, grads_padded) <= (EXACT if dtype == "float32" else 5e-2)
    uses_varlen = dtype == "bfloat16" and packing._varlen_function() is not None
    assert bool(calls) == uses_varlen, (calls, torch.__version__)


def test_the_train_tab_says_how_batches_are_laid_out_before_start(tiny_model_dir):
    from finetune.studio import Studio
    from ui.train_tab import plan_markdown

    values = tiny_config(tiny_model_dir).to_dict()
    text = plan_markdown(Studio().preview_run(values, estimate=False), [])
    assert "No compute on padding: each micro batch is packed into one row" in text
    dpo = plan_markdown(Studio().preview_run({**values, "objective": "dpo"}, estimate=False), [])
    assert "Micro batches are padded to their longest example (TRL 1.16's DPO trainer has padding-free" in dpo
