"""Learning from rewards (GRPO) end to end on the tiny model: the mean reward rises under a reward the tiny model can
learn, a python: reward is called with the completions and the data's `answer` column, the live view's events carry
the rewards and a few scored completions, a stopped run resumes exactly, QLoRA and full fine-tuning (with its frozen
reference) train, the command line takes comma-separated rewards, and each kind of bad input gets one line: before
the run where it can be known, else as the run's error naming the reward and the row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from finetune.config import TrainConfig
from finetune.errors import ConfigError
from finetune.runs.manager import RunManager
from finetune.runs.rundir import RunDir
from tests.helpers import raw_events, stop_then_resume, tiny_config, train, write_jsonl
from tests.test_input_validation import assert_refused_before_a_run

ROOT = Path(__file__).resolve().parents[1]
# A reward the random tiny model learns within a few steps: about a quarter of its first answers hold a "d".
LEARNABLE = "contains:d"
RECORDER = """
import json, os

def record(prompts, completions, answer, **columns):
    with open(os.environ["REWARD_CALLS"], "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"prompts": prompts, "completions": completions, "answer": answer,
                             "columns": sorted(columns)}) + "\\n")
    return [0.0] * len(completions)
"""


def prompts_file(tmp_path: Path, n: int = 16) -> Path:
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(n)]
    return write_jsonl(tmp_path / "prompts.jsonl", rows)


def grpo_config(model_dir: Path, dataset: Path, **overrides: Any) -> TrainConfig:
    values: dict[str, Any] = {
        "objective": "grpo",
        "dataset": str(dataset),
        "rewards": LEARNABLE,
        "per_device_train_batch_size": 8,  # two prompts x four answers a step
        "max_completion_length": 16,
        "max_steps": 4,
        "save_steps": 100,
    }
    values.update(overrides)
    return tiny_config(model_dir, **values)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


@pytest.fixture(scope="module")
def learned(tiny_model_dir, tmp_path_factory):
    """One 12-step LoRA run rewarded by contains:d, with a python: reward (weight 0) that records how it is called."""
    folder = tmp_path_factory.mktemp("grpo")
    (folder / "recorder.py").write_text(RECORDER, encoding="utf-8")
    calls = folder / "calls.jsonl"
    patch = pytest.MonkeyPatch()
    patch.setenv("REWARD_CALLS", str(calls))
    patch.setenv("FINETUNE_STUDIO_HOME", str(folder / "home"))
    rewards = f"{LEARNABLE},python:{folder / 'recorder.py'}:record"
    config = grpo_config(tiny_model_dir, prompts_file(folder), rewards=rewards, reward_weights="1,0", max_steps=12)
    try:
        yield train(config), calls
    finally:
        patch.undo()


# ----------------------------------------------------------------------------- learning, and what it logs
def test_the_mean_reward_rises_under_a_learnable_reward(learned):
    run, _ = learned
    logs = run.read_events(("log",))
    assert [e["step"] for e in logs] == list(range(1, 13))
    for event in logs:
        assert {"reward", "reward_std", "completion_length", "rewards/contains", "rewards/record"} <= set(event), event
    rewarded = [e["rewards/contains"] for e in logs]
    assert mean(rewarded[-4:]) > mean(rewarded[:4]) + 0.3, rewarded
    assert mean([e["reward"] for e in logs[-4:]]) == pytest.approx(mean(rewarded[-4:]))  # weight 0 for the recorder
    (objective,) = run.read_events(("objective",))
    assert objective["rewards"] == ["contains", "record"] and objective["reference"] is None  # beta 0: TRL's default


def test_a_python_reward_is_called_with_the_completions_and_the_answer_column(learned):
    _, calls = learned
    seen = [json.loads(line) for line in calls.read_text(encoding="utf-8").splitlines()]
    assert len(seen) == 12  # once per step (one generation batch a step)
    answers = {str(i + 1) for i in range(16)}
    for call in seen:
        assert len(call["completions"]) == len(call["answer"]) == len(call["prompts"]) == 8
        assert set(call["answer"]) <= answers
        for prompt, answer in zip(call["prompts"], call["answer"], strict=True):  # each answer is its prompt's
            assert prompt[-1]["content"] == f"What is {int(answer) - 1} + 1?"
        # The tiny model has a chat template: prompts and completions are conversations, as TRL passes them.
        assert all(c[0]["role"] == "assistant" and isinstance(c[0]["content"], str) for c in call["completions"])
        assert "completion_ids" in call["columns"] and "_row" in call["columns"]


def test_the_live_view_gets_scored_completions_and_the_run_records_its_plan(learned):
    run, _ = learned
    shown = run.read_events(("completions",))
    assert [e["step"] for e in shown] == list(range(1, 13))
    last = shown[-1]["completions"]
    assert 1 <= len(last) <= 4 and set(last[0]) == {"prompt", "completion", "rewards"}
    assert set(last[0]["rewards"]) == {"contains", "record"} and last[0]["prompt"].startswith("What is")
    plan = json.loads((run.path / "plan.json").read_text(encoding="utf-8"))
    assert plan["objective"] == "grpo" and plan["beta"] == 0.0 and plan["loss_type"] == "dapo"
    assert plan["reference"] is None and plan["lora"]["r"] == 8


def test_the_card_names_the_rewards_and_chat_loads_the_runs_plan(learned):
    from finetune.model.inference import GenerationSettings, load_for_chat, stream_reply
    from finetune.publish.model_card import build_model_card

    run, _ = learned
    card = build_model_card(run.path, "someone/grpo")
    assert "trained with rewards (GRPO)" in card and "--set objective=grpo" in card
    assert "--set rewards='contains:d,python:<path to your copy of recorder.py>:record'" in card
    assert "--set num_generations=4" in card and str(run.path.parent) not in card  # no local path leaves
    model, tokenizer = load_for_chat(run.load_plan(), run.path)
    *_, reply = stream_reply(model, tokenizer, [{"role": "user", "content": "Hi"}], GenerationSettings(8))
    assert isinstance(reply, str)


# ----------------------------------------------------------------------------- stop and resume
def test_a_stopped_grpo_run_resumes_exactly(tiny_model_dir, tmp_path, monkeypatch):
    """Stop at step 2, resume: the resumed process trains steps 3-4 only, with the rewards and losses of an
    uninterrupted run (the sampling's random state came back with the checkpoint)."""
    config = grpo_config(tiny_model_dir, prompts_file(tmp_path), save_steps=2)
    reference = {e["step"]: e for e in raw_events(train(config).path)}

    before, after = stop_then_resume(monkeypatch, config, step=2)
    for event in before + after:
        want = reference[event["step"]]
        for key in ("reward", "rewards/contains", "completion_length"):
            assert event[key] == pytest.approx(want[key], abs=1e-6), (key, event, want)


# ----------------------------------------------------------------------------- methods and the command line
@pytest.mark.parametrize(
    "overrides",
    [{"method": "qlora"}, {"method": "full", "beta": 0.05, "learning_rate": 1e-3}],
    ids=["qlora", "full-with-reference"],
)
def test_qlora_and_full_fine_tuning_train(tiny_model_dir, tmp_path, overrides):
    run = train(grpo_config(tiny_model_dir, prompts_file(tmp_path), max_steps=2, **overrides))
    logs = run.read_events(("log",))
    assert [e["step"] for e in logs] == [1, 2] and all("reward" in e for e in logs)
    (objective,) = run.read_events(("objective",))
    if overrides["method"] == "full":
        # beta > 0: a KL term against a frozen copy of the starting weights, 0 at the first step
        assert objective["reference"] == "copy" and logs[0]["kl"] == pytest.approx(0, abs=1e-6)
        assert (run.path / "model.safetensors").is_file()
    else:
        assert objective["reference"] is None and (run.path / "adapter_model.safetensors").is_file()


def test_a_launched_two_process_run_trains_and_records_its_world(tiny_model_dir, tmp_path, studio_home):
    """`launch --nproc 2`: two ranks on gloo share each step's answers (every prompt's group in one step), rank 0
    writes the run, and its plan.json records both processes."""
    config = grpo_config(tiny_model_dir, prompts_file(tmp_path), per_device_train_batch_size=4, max_steps=2)
    config.save(tmp_path / "run.yaml")
    command = [sys.executable, "-m", "finetune", "launch", "--config", str(tmp_path / "run.yaml"), "--nproc", "2"]
    env = {**os.environ, "FINETUNE_STUDIO_HOME": str(studio_home), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*command, "--follow"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    run = RunDir(Path(done.stdout.splitlines()[0].strip()))
    logs = run.read_events(("log",))
    assert [e["step"] for e in logs] == [1, 2] and all("rewards/contains" in e for e in logs), logs
    plan = json.loads((run.path / "plan.json").read_text(encoding="utf-8"))
    assert plan["world_size"] == 2 and plan["effective_batch"] == 8 and plan["objective"] == "grpo"


def test_the_command_line_takes_comma_separated_rewards(tiny_model_dir, tmp_path, studio_home):
    data = prompts_file(tmp_path)
    command = [sys.executable, "-m", "finetune", "train", "--no-progress", "--set", f"model={tiny_model_dir}"]
    for key, value in {
        "dataset": data, "objective": "grpo", "rewards": "number_match,regex:\\d{1,3},max_length:8",
        "max_steps": 1, "per_device_train_batch_size": 4, "max_completion_length": 8, "eval_split": "",
        "max_seq_length": 64,
        "output_dir": tmp_path / "cli-run",
    }.items():  # fmt: skip
        command += ["--set", f"{key}={value}"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (log,) = RunDir(tmp_path / "cli-run").read_events(("log",))
    assert {"rewards/number_match", "rewards/regex", "rewards/max_length"} <= set(log)


# ----------------------------------------------------------------------------- bad input
BAD_REWARDS = {
    "raises": ("def score(prompts, completions, answer, **kw):\n    if '7' in answer:\n"
               "        raise ValueError('no 7')\n    return [1.0] * len(completions)\n",
               ["raised ValueError: no 7 on row 1 of the data"]),
    "wrong_length": ("def score(prompts, completions, **kw):\n    return [1.0]\n",
                     ["returned 1 values for 16 completions; return one number per completion"]),
    "not_numbers": ("def score(prompts, completions, **kw):\n    return ['good'] * len(completions)\n",
                    ["returned 'good' for row ", " of the data; rewards are numbers"]),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_REWARDS, ids=list(BAD_REWARDS))
def test_a_reward_that_fails_stops_the_run_with_one_line_naming_the_reward_and_row(tiny_model_dir, tmp_path, case):
    code, parts = BAD_REWARDS[case]
    (tmp_path / "bad.py").write_text(code, encoding="utf-8")
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(6, 10)]  # row 1 asks 6 + 1 = 7
    data = write_jsonl(tmp_path / "four.jsonl", rows)
    spec = f"python:{tmp_path / 'bad.py'}:score"
    config = grpo_config(tiny_model_dir, data, rewards=spec, per_device_train_batch_size=16, max_steps=1)
    state = RunManager(tmp_path / "runs").start(config, background=False)
    assert state.status == "failed" and state.user_error, (state.status, state.error)
    assert state.error.startswith(f"rewards: {spec} ") and "\n" not in state.error, state.error
    for part in parts:
        assert part in state.error, (part, state.error)


def test_bad_rewards_and_data_are_refused_before_a_run_exists(tiny_model_dir, tmp_path):
    runs = tmp_path / "runs"
    data = prompts_file(tmp_path)
    missing = tmp_path / "nowhere.py"
    config = grpo_config(tiny_model_dir, data, rewards=f"number_match,python:{missing}:score")
    assert_refused_before_a_run(config, runs, [f"rewards: python:{missing}:score: file not found"])
    no_prompt = write_jsonl(tmp_path / "no-prompt.jsonl", [{"text": "What is 1 + 1?", "answer": "2"}] * 4)
    assert_refused_before_a_run(grpo_config(tiny_model_dir, no_prompt), runs, ["prompt_column: no prompt column"])
    no_answer = write_jsonl(tmp_path / "no-answer.jsonl", [{"prompt": "What is 1 + 1?"}] * 4)
    config = grpo_config(tiny_model_dir, no_answer, rewards="number_match")
    assert_refused_before_a_run(config, runs, ["rewards: number_match compares with the 'answer' column"])


def test_num_generations_must_divide_the_batch_and_rewards_must_read():
    with pytest.raises(ConfigError) as caught:
        TrainConfig(objective="grpo", rewards="number_match", per_device_train_batch_size=6, num_generations=4)
    assert caught.value.field == "num_generations" and "do not divide the 6 completions" in str(caught.value)
    assert "num_generations 2, 3, 6" in str(caught.value)
    for rewards, part in (("", "empty"), ("max_length:x", "whole number"), ("regex:(", "not a valid regular")):
        with pytest.raises(ConfigError, match=part):
            TrainConfig(objective="grpo", rewards=rewards)
    with pytest.raises(ConfigError, match="reward_weights: 1 weights for 2 rewards"):
        TrainConfig(objective="grpo", rewards="number_match,max_length:8", reward_weights="1")


# ----------------------------------------------------------------------------- the app
def test_the_train_tab_shows_the_reward_curve_and_scored_answers(learned, studio_home):
    """The learned run opened in the Train tab: the latest rewards as numbers, the reward curves, and the last
    step's sampled answers with each reward's score."""
    import shutil

    from finetune.studio import Studio
    from tests.test_ui_wiring import on_page
    from ui.app import build_app

    run, _ = learned
    studio = Studio(studio_home / "runs")
    shutil.copytree(run.path, studio.manager.root / "run-g")
    ui = build_app(studio).studio_ui
    page = on_page(ui, ui.train.select("run-g"))
    assert "mean reward <b>" in page["prefs"] and "reward: contains <b>" in page["prefs"], page["prefs"]
    plot = page["prefs_plot"]
    assert plot["visible"] and plot["title"].startswith("Rewards:")
    series = plot["value"].dropna().groupby("series")["step"].count().to_dict()  # (KL: a blank, beta is 0)
    assert series == {"mean reward": 12, "reward: contains": 12, "reward: record": 12}, series
    answers = page["completions"]
    assert answers["visible"] and answers["label"] == "Sampled answers at step 12, with their rewards"
    assert list(answers["value"].columns) == ["Prompt", "Sampled answer", "Rewards"] and len(answers["value"]) >= 1
    assert "contains " in answers["value"].iloc[0]["Rewards"] and "record 0" in answers["value"].iloc[0]["Rewards"]
    labels = [label for label, _ in ui.train.runs_outputs(studio.runs())[ui.train.run_pick]["choices"]]
    assert " · GRPO · " in labels[0], labels


def test_the_rewards_goal_on_the_start_tab_takes_the_arithmetic_set(studio_home):
    from finetune.studio import Studio
    from ui.app import build_app
    from ui.start_tab import GOALS

    assert GOALS["grpo"] == "Rewards: answers you can check (GRPO)"
    ui = build_app(Studio(studio_home / "runs")).studio_ui
    tab, fields = ui.start, ui.start.config.fields
    page = {fields[n]: v for n, v in ui.studio.default_values().items()}
    page.update({tab.model: page[fields["model"]], tab.data: "bundled:pirate", tab.goal: "grpo", tab.hardware: "cpu"})
    answer = tab.choose(page)
    assert answer[fields["dataset"]] == "bundled:arithmetic"
    assert (answer[fields["task"]], answer[fields["objective"]]) == ("causal_lm", "grpo")
    assert answer[fields["rewards"]] == "number_match" and answer[fields["max_completion_length"]] == 32
    from ui.config_tab import hidden_fields

    shown = set(fields) - hidden_fields({**ui.studio.default_values(), "objective": "grpo"})
    assert {"rewards", "reward_weights", "num_generations", "max_completion_length", "temperature", "beta"} <= shown
    assert not {"chosen_column", "rejected_column", "num_labels"} & shown


def test_propose_with_the_rewards_goal_fills_what_the_start_tab_fills(tiny_model_dir, capsys, tmp_path):
    """`propose --goal grpo` gives the rewards the Start tab gives (a proposal, not 'rewards: empty'); a reward the
    user set with --set or in the config file is kept."""
    import json

    from finetune import cli

    base = ["propose", "--model", str(tiny_model_dir), "--data", "bundled:arithmetic", "--goal", "grpo", "--json"]
    assert cli.main([*base, "--gpu-gib", "8"]) == 0
    settings = json.loads(capsys.readouterr().out)["settings"]
    assert (settings["objective"], settings["rewards"], settings["max_completion_length"]) == (
        "grpo",
        "number_match",
        32,
    )
    assert cli.main([*base, "--gpu-gib", "8", "--set", "rewards=exact_match"]) == 0
    assert json.loads(capsys.readouterr().out)["settings"]["rewards"] == "exact_match"
    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text("rewards: contains:=\n", encoding="utf-8")  # a reward from the config file is kept too
    assert cli.main([*base, "--gpu-gib", "8", "--config", str(run_yaml)]) == 0
    assert json.loads(capsys.readouterr().out)["settings"]["rewards"] == "contains:="


# ----------------------------------------------------------------------------- the memory estimate
def test_the_estimate_follows_a_measured_grpo_step_and_names_what_sampling_adds(tiny_model_dir):
    """A real GRPO step (sampling included) through the engine's TRL trainer, live storages counted: the
    estimate is within 15%; it names the KV cache of a step's answers, and the frozen reference only when beta > 0."""
    from transformers import AutoTokenizer

    from bench.memory_accuracy import measure_grpo
    from finetune import memory
    from finetune.memory import analytic
    from finetune.plan import plan_for

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [f"Question {i}? " + "Say more. " * 6 for i in range(8)]
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in prompts]  # fmt: skip
    longest = max(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts)
    values = {"model": str(tiny_model_dir), "objective": "grpo", "rewards": "max_length:4", "eval_split": ""}
    values.update(max_seq_length=longest, max_completion_length=24, per_device_train_batch_size=8, max_steps=1)
    config = TrainConfig(save_steps=1000, warmup_steps=0, **values)
    measured = measure_grpo(config, "cpu", prompts)["peak"]
    estimate = memory.estimate(plan_for(config, "cpu"))
    assert abs(estimate.tensor_bytes - measured) <= 0.15 * measured, (estimate.tensor_bytes, measured)

    cache = estimate.sizes["generation_cache"]
    model_config = memory.model_config_of(config)
    kv = 2 * model_config.num_hidden_layers * model_config.num_key_value_heads * model_config.head_dim * 4
    assert cache >= 8 * (longest + 24) * kv  # eight answers' keys and values over prompt + answer, fp32
    longer = memory.estimate(plan_for(config.replace(max_completion_length=48), "cpu")).sizes["generation_cache"]
    assert longer - cache == 8 * 24 * kv  # linear in the answers' length
    assert estimate.sizes.get("reference_model", 0) == 0  # beta empty: TRL's 0, no reference
    full = memory.estimate(plan_for(config.replace(method="full", beta=0.04), "cpu"))
    assert full.sizes["reference_model"] == full.sizes["weights"] > 0
    phases = analytic.analyse(
        analytic.shape_of(model_config), memory.estimator.census_of(plan_for(config, "cpu")),
        analytic.settings_for(plan_for(config, "cpu")),
    ).phases  # fmt: skip
    assert analytic.GENERATION_PHASE in phases
