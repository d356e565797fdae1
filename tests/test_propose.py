"""One answer to "what should I run?": the proposal the Start tab shows and `python -m finetune propose` prints, from
the one search (finetune/memory/search.py), on the cases a new user meets.

Models come from the bundled catalogue (no weights, offline); their tokenizers cannot be loaded here, so row lengths
are estimated at 4 characters per token and the data files are written to count exactly (tests/helpers.py
`write_token_rows`). A module fixture computes each proposal once; the tests read it several ways.

- long rows (900-1,540 tokens), Llama-3.1-8B, a 24 GB card: 2048 tokens or more, the effective batch, >= 5% headroom;
- an 8 GB card and a 1B model: short rows fit whole; long ones are cut only because nothing keeps them whole, and the
  reason says how many rows lose how many tokens;
- 70B on a 24 GB card: nothing fits, one line names the card that holds QLoRA + checkpointing (not LoRA at 160 GiB);
- the data changed after a proposal: the sequence length follows the new data (never the old one's);
- `propose --json` gives the same settings as the Start tab for the same inputs; an offline Hub dataset fails Check
  and Start in one line, and Start writes nothing.
"""

from __future__ import annotations

import json

import pytest

from finetune import cli, memory
from finetune.config import TrainConfig
from finetune.errors import UserError
from finetune.memory.search import margin_bytes
from finetune.model.catalogue import GPU_CARDS
from finetune.plan import plan_for
from finetune.studio import Studio
from tests.helpers import write_token_rows

GiB = memory.GiB
LLAMA_8B, LLAMA_70B, LLAMA_1B = "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.2-1B"
RTX_4090, RTX_4060 = "RTX 4090 (24 GB)", "RTX 4060 (8 GB)"
LONG = [900 + 640 * i // 59 for i in range(60)]  # 60 rows of 900 to 1,540 tokens
SHORT = [40 + 2 * i for i in range(40)]  # 40 rows of 40 to 118 tokens


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("propose-data")
    long, short = write_token_rows(folder / "long.jsonl", LONG), write_token_rows(folder / "short.jsonl", SHORT)
    return {"long": str(long), "short": str(short)}


def asked(model: str, dataset: str, **settings) -> dict:
    """The form as the Start tab holds it before a proposal: the defaults with a model, data and goal chosen."""
    return {**Studio.default_values(), "model": model, "dataset": dataset, **settings}


@pytest.fixture(scope="module")
def proposals(data, tmp_path_factory) -> dict:
    """Each case's proposal, computed once (a replay of an 8B step takes seconds here), in a home of its own (a
    module fixture runs before each test's own home is set)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FINETUNE_STUDIO_HOME", str(tmp_path_factory.mktemp("propose-home")))
        return all_cases(data)


def all_cases(data: dict) -> dict:
    studio = Studio()
    card = GPU_CARDS[RTX_4090]
    return {
        "8b": studio.propose(asked(LLAMA_8B, data["long"]), gpu_gib=card),
        "1b-short": studio.propose(asked(LLAMA_1B, data["short"]), gpu_gib=GPU_CARDS[RTX_4060]),
        "1b-long": studio.propose(asked(LLAMA_1B, data["long"]), gpu_gib=GPU_CARDS[RTX_4060]),
        "70b": studio.propose(asked(LLAMA_70B, data["long"]), gpu_gib=card),
    }


def headroom_kept(proposal, gib: float) -> None:
    capacity = int(gib * GiB)
    est = proposal.estimate
    assert proposal.fits is True and proposal.verdict == "fits" and est.fits is True
    assert est.headroom_bytes == capacity - est.total_bytes >= max(0.05 * capacity, GiB)
    assert est.margin_bytes == margin_bytes(capacity)


# ----------------------------------------------------------------------------- the cases


def test_long_rows_on_an_8b_and_a_24gb_card_keep_2048_tokens_the_batch_and_headroom(proposals):
    proposal = proposals["8b"]
    chosen = TrainConfig.from_dict(proposal.values)
    assert chosen.max_seq_length >= 2048 and proposal.rows_kept_whole == 1.0
    assert chosen.effective_batch_size == TrainConfig().effective_batch_size  # the effective batch is kept
    headroom_kept(proposal, GPU_CARDS[RTX_4090])
    assert chosen.gradient_checkpointing and chosen.method == "qlora"  # what it takes on this card
    assert proposal.reasons[-1] == "Every row is at most 1540 tokens, so 2048 tokens per row keeps them whole."
    assert "keeps the effective batch of 4" in proposal.reasons[1] and "of headroom on 23.6 GiB" in proposal.reasons[1]
    assert proposal.data["max"] == 1540 and proposal.needed is None


def test_a_1b_model_on_an_8gb_card(proposals):
    short = proposals["1b-short"]
    headroom_kept(short, GPU_CARDS[RTX_4060])
    assert short.values["max_seq_length"] == 128 and short.rows_kept_whole == 1.0
    # Long rows: 2048 tokens of a 128k vocabulary need ~3 GiB of logits alone, so no combination keeps them whole on
    # 7.6 GiB; then, and only then, the proposal cuts, and says how many rows lose how many tokens.
    long = proposals["1b-long"]
    headroom_kept(long, GPU_CARDS[RTX_4060])
    seq = long.values["max_seq_length"]
    cut = sum(n > seq for n in LONG)
    assert seq < 1540 and long.rows_kept_whole == pytest.approx((60 - cut) / 60)
    assert f"{seq} tokens per row: {cut} of 60 rows lose up to {1540 - seq} tokens each" in long.reasons[-1]
    assert "keeping every row whole (2048 tokens) does not fit with headroom" in long.reasons[-1]
    leanest = TrainConfig.from_dict(long.values).replace(
        max_seq_length=2048, method="qlora", gradient_checkpointing=True, optim="paged_adamw_8bit",
        per_device_train_batch_size=1, gradient_accumulation_steps=4,
    )  # fmt: skip
    assert memory.estimate(plan_for(leanest, "cuda"), gpu_gib=GPU_CARDS[RTX_4060], advise=False).fits is False


def test_70b_on_a_24gb_card_names_the_card_it_needs_in_one_line(proposals):
    proposal = proposals["70b"]
    assert proposal.fits is False and proposal.verdict == "does not fit"
    needed = proposal.needed
    assert needed is not None and "A100 (80 GB)" in needed.cards and needed.gpus == 1
    assert needed.changes["method"] == "qlora" and needed.changes["gradient_checkpointing"] is True
    assert 50 * GiB < needed.total_bytes < needed.gpu_gib * GiB - margin_bytes(int(needed.gpu_gib * GiB))
    assert "\n" not in needed.line and "A100 (80 GB)" in needed.line and "run out of memory" in needed.line
    assert needed.line in proposal.reasons
    # The values are that combination (for the larger card); on this card they do not fit.
    assert proposal.values["method"] == "qlora" and proposal.estimate.total_bytes > GPU_CARDS[RTX_4090] * GiB
    fastest = TrainConfig.from_dict(proposal.values).replace(
        method="lora", gradient_checkpointing=False, per_device_train_batch_size=4, gradient_accumulation_steps=1
    )  # where the proposal started (its replay is cached)
    lora = memory.estimate(plan_for(fastest, "cuda"), advise=False)
    assert lora.total_bytes > 2 * needed.total_bytes  # LoRA: ~160 GiB


def test_the_data_changed_after_a_proposal_is_measured_again(proposals, data):
    first = proposals["1b-short"]
    assert first.values["max_seq_length"] == 128  # 118 tokens at most
    # The form now holds the first proposal (128 tokens); the user picks the long rows: measured again, and the
    # answer is the one for the long rows from the defaults.
    again = Studio().propose({**first.values, "dataset": data["long"]}, gpu_gib=GPU_CARDS[RTX_4060])
    assert again.values == proposals["1b-long"].values and again.values["max_seq_length"] > 128


def test_a_length_the_user_typed_is_kept_and_its_cut_said(proposals, data):
    form = asked(LLAMA_1B, data["long"], max_seq_length=512)
    proposal = Studio().propose(form, gpu_gib=GPU_CARDS[RTX_4060], pinned=("max_seq_length",))
    assert proposal.values["max_seq_length"] == 512 and proposal.fits
    lost = sum(n - 512 for n in LONG) / sum(LONG)
    assert proposal.reasons[-1] == (
        f"512 tokens per row, as you set it: 60 of 60 rows lose up to 1028 tokens each ({lost:.1%} of the training "
        "tokens)."
    )


# ----------------------------------------------------------------------------- the command line


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_propose_json_gives_the_start_tabs_settings(proposals, data, capsys):
    code, out, _ = run_cli(["propose", "--model", LLAMA_8B, "--data", data["long"], "--goal", "sft",
                            "--gpu-gib", "rtx 4090", "--json"], capsys)  # fmt: skip
    assert code == 0
    answer = json.loads(out)
    assert answer["settings"] == proposals["8b"].values and answer["fits"] is True and answer["verdict"] == "fits"
    assert answer["headroom_bytes"] == proposals["8b"].estimate.headroom_bytes >= answer["margin_bytes"]
    assert answer["rows_kept_whole"] == 1.0 and answer["reasons"] == proposals["8b"].reasons
    assert answer["estimate"]["total_bytes"] == answer["total_bytes"] and answer["needed"] is None

    code, out, _ = run_cli(["propose", "--model", LLAMA_70B, "--data", data["long"], "--gpu-gib", "23.6"], capsys)
    assert code == 0 and out.startswith("Nothing fits 1 × 23.6 GiB with headroom: it will run out of memory there")
    assert proposals["70b"].needed.line in out and "Train it on A100 (80 GB) or H100 (80 GB): python -m finetune" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--goal", "rlhf"], "error: goal: 'rlhf' is not one of sft, dpo, grpo, classification, orpo, kto"),
        (["--gpu-gib", "lots"], "error: --gpu-gib: 'lots' is not a number of GiB or a known card"),
        (["--gpus", "0"], "error: --gpus: must be 1 or more"),
    ],
)
def test_propose_refuses_bad_input_in_one_line(argv, message, capsys):
    args = ["propose", "--model", LLAMA_1B, "--gpu-gib", "8", *argv]
    code, out, err = run_cli(args, capsys)
    assert code == 2 and err.startswith(message) and err.count("\n") == 1 and out == ""


# ----------------------------------------------------------------------------- Check and Start on Hub data


def test_an_offline_hub_dataset_fails_check_and_start_in_one_line(studio_home):
    studio = Studio(studio_home / "runs")
    form = {**Studio.default_values(), "dataset": "someone/pirate-chats"}
    assert studio.check(form)[1] == {}  # the cheap check cannot know
    config, problems = studio.verify(form)  # Check: as Start will
    assert config is None and list(problems) == ["dataset"]
    expected = (
        "dataset: someone/pirate-chats is a Hub dataset, this machine cannot reach the Hugging Face Hub (offline) "
        "and has no copy of it; use a local file or bundled:pirate, or connect and check again"
    )
    assert problems["dataset"] == expected
    with pytest.raises(UserError) as refused:
        studio.start(form)
    assert str(refused.value) == expected
    runs = studio_home / "runs"
    assert studio.runs() == [] and (not runs.exists() or not any(runs.iterdir()))


# ----------------------------------------------------------------------------- the API


def test_the_api_proposes_as_the_cli_and_the_start_tab_do(proposals, data, studio_home, tiny_model_dir):
    """/propose (ui/api.py) gives the same settings; through gradio_client, the real client, on a served app."""
    from finetune.engines.world import free_port
    from tests.test_ui_support import api_client
    from ui.api import StudioAPI
    from ui.app import build_app, launch

    answer = StudioAPI(Studio()).propose({"model": LLAMA_8B, "dataset": data["long"]}, gpu_gib=GPU_CARDS[RTX_4090])
    assert answer["settings"] == proposals["8b"].values and answer["reasons"] == proposals["8b"].reasons
    demo = build_app(Studio(studio_home / "runs"))
    port = free_port()
    launch(demo, port=port, block=False, quiet=True)
    try:
        client = api_client(f"http://127.0.0.1:{port}/")
        served = client.predict({"model": str(tiny_model_dir), "dataset": data["short"]}, "sft", 8.0, 1,
                                api_name="/propose")  # fmt: skip
    finally:
        demo.close()
    expected = Studio().propose({**Studio.default_values(), "model": str(tiny_model_dir), "dataset": data["short"]},
                                gpu_gib=8.0)  # fmt: skip
    assert served["settings"] == expected.values and served["verdict"] == "fits"
