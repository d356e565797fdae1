"""Publishing a run: push to a stand-in Hub on 127.0.0.1, the model card, token handling, the `push` CLI."""

from __future__ import annotations

import io
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from finetune.cli import main
from finetune.config import EMBEDDED_MODEL, TrainConfig
from finetune.errors import ConfigError, UserError
from finetune.publish import hub as hubmod
from finetune.publish.hub import build_model_card, push_run
from finetune.publish.public import public_config
from finetune.runs.rundir import RunDir
from tests.hub_standin import HubStandin
from tests.run_fixtures import build_run, samples_at, train_run, trained_template

GOOD = "hf_" + secrets.token_hex(16)  # alice's write token, random per session so a scan cannot be fooled
BAD = "hf_" + secrets.token_hex(16)  # a token the Hub does not know
BOB = "hf_" + secrets.token_hex(16)  # bob's write token: a visitor's own token on a public Space
REPO = "alice/pirate-lora"
ADAPTER_PUSH = {
    "README.md",
    "adapter_config.json",
    "adapter_model.safetensors",
    "chat_template.jinja",
    "config.yaml",
    "loss_curve.png",
    "tokenizer.json",
    "tokenizer_config.json",
}
HUB_CALLS = {"/api/repos/create", "/api/validate-yaml", "/api/whoami-v2"}


@pytest.fixture(scope="session")
def run_template(tiny_model_dir):
    """One really trained tiny LoRA run (10 steps, evals at 5 and 10), trained once; tests get their own copy."""
    return trained_template(tiny_model_dir)


@pytest.fixture
def run_dir(run_template, tiny_model_dir, studio_home):
    return build_run(studio_home / "runs" / run_template.name, tiny_model_dir)


@pytest.fixture
def hub(monkeypatch):
    """A stand-in Hub that knows alice's token; HF_ENDPOINT points at it, the client's default does not."""
    from huggingface_hub import constants

    with HubStandin(tokens={GOOD: "alice"}) as standin:
        monkeypatch.setenv("HF_ENDPOINT", standin.url)
        # The client's import-time default points nowhere: only a push that honours HF_ENDPOINT reaches the stand-in.
        monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # conftest sets HF_HUB_OFFLINE=1 for everything else
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setattr(hubmod, "_stored_token", lambda: None)  # ignore any `hf auth login` on this machine
        yield standin


def _set_config(run_dir: Path, **changes) -> None:
    rd = RunDir(run_dir)
    rd.write_config(rd.load_config().replace(**changes))


def _card(text: str):
    from huggingface_hub import ModelCard

    return ModelCard(text)


def _unexpected_calls(standin: HubStandin) -> list[tuple[str, str]]:
    def expected(path: str) -> bool:
        return path in HUB_CALLS or path.startswith("/api/models/")

    return [(m, p) for m, p in standin.paths() if not expected(p)]


# ----------------------------------------------------------------------------------------------------- push


def test_push_sends_adapter_tokenizer_card_and_curve_in_one_commit(hub, run_dir):
    url = push_run(run_dir, REPO, token=GOOD)

    assert url == f"{hub.url}/{REPO}"
    repo = hub.repos[REPO]
    assert set(repo.files) == ADAPTER_PUSH
    assert len(repo.commits) == 1
    assert repo.private is False
    assert repo.files["adapter_model.safetensors"] == (run_dir / "adapter_model.safetensors").read_bytes()
    # config.yaml as published: the run's config with local paths replaced, still a loadable config.
    config = RunDir(run_dir).load_config()
    assert repo.files["config.yaml"].decode() == public_config(config, run_dir).to_yaml()
    published = TrainConfig.from_yaml(repo.files["config.yaml"].decode())
    assert published.replace(model=config.model, dataset=config.dataset, eval_split=config.eval_split) == (
        config.replace(output_dir="")
    )
    assert repo.files["loss_curve.png"].startswith(b"\x89PNG\r\n\x1a\n")
    assert not any("checkpoint" in f or "optimizer" in f or f in ("events.jsonl", "status.json") for f in repo.files)
    assert ("POST", "/api/validate-yaml") in hub.paths()
    assert _unexpected_calls(hub) == []
    # The pushed adapter config is the one training saved, except the base path (a local folder: no Hub id).
    saved = json.loads((run_dir / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == config.model
    assert json.loads(repo.files["adapter_config.json"]) == {**saved, "base_model_name_or_path": None}


def test_push_private_repo(hub, run_dir):
    push_run(run_dir, REPO, token=GOOD, private=True)

    assert hub.repos[REPO].private is True
    create = next(r for r in hub.requests if r.path == "/api/repos/create")
    assert json.loads(create.body)["visibility"] == "private"


def test_push_private_into_existing_public_repo_is_refused(hub, run_dir):
    hub.add_repo(REPO, private=False)

    with pytest.raises(UserError, match="already exists and is public"):
        push_run(run_dir, REPO, token=GOOD, private=True)
    assert hub.repos[REPO].commits == []


def test_push_again_updates_existing_repo(hub, run_dir):
    push_run(run_dir, REPO, token=GOOD)
    push_run(run_dir, REPO, token=GOOD)
    assert len(hub.repos[REPO].commits) == 2


def test_token_from_hf_token_env(hub, run_dir, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", GOOD)
    assert push_run(run_dir, REPO).endswith(REPO)


def test_run_given_by_name_under_runs_root(hub, run_dir):
    assert push_run(run_dir.name, REPO, token=GOOD).endswith(REPO)


# ------------------------------------------------------------------------------------------------ the card


def test_card_has_metadata_config_losses_samples_and_snippet(hub, run_dir):
    push_run(run_dir, REPO, token=GOOD)
    text = hub.repos[REPO].files["README.md"].decode()
    card = _card(text)

    assert card.data.library_name == "peft"
    assert {"finetune-studio", "lora"} <= set(card.data.tags)
    assert card.data.pipeline_tag == "text-generation"
    # The tiny base is a local directory with no Hub id: no base_model, and the card says so.
    assert card.data.base_model is None
    assert "no `base_model`" in text
    # The full resolved config (as published), the launch command, the figures of the run.
    rd = RunDir(run_dir)
    config = rd.load_config()
    assert public_config(config, run_dir).to_yaml() in text
    assert "python -m finetune train --config config.yaml --set model=" in text
    status = rd.read_status()
    assert f"| Final training loss | {status['loss']:.4f} |" in text
    assert "| Steps | 10 of 10 |" in text
    assert "| Hardware | cpu |" in text
    runtime = status["finished_at"] - status["started_at"]
    minutes, seconds = divmod(round(runtime), 60)  # a busy machine may take over a minute for the tiny run
    assert f"| Runtime | {f'{runtime:.1f} s' if runtime < 60 else f'{minutes} min {seconds} s'} |" in text
    evals = [(e["step"], e["eval_loss"]) for e in rd.read_events(("eval",))]
    assert [step for step, _ in evals] == [5, 10]
    best = min(evals, key=lambda pair: pair[1])
    assert f"| Best eval loss | {best[1]:.4f} (step {best[0]}) |" in text
    assert "![Training loss against step](loss_curve.png)" in text
    # Sample answers before and after (what training recorded), and a PEFT snippet that loads this repo.
    before, after = samples_at(run_dir, 0), samples_at(run_dir, 10)
    assert before and after and before[0]["prompt"] == "What is the capital of France?"
    assert f"**Prompt:** {before[0]['prompt']}" in text
    assert before[0]["answer"].strip("\n") in text and after[0]["answer"].strip("\n") in text
    assert "Step 0 (before)" in text and "Step 10 (after)" in text
    assert f'PeftModel.from_pretrained(base, "{REPO}")' in text
    # The dataset is named by its file name and the sha256 training recorded.
    recorded = next(e for e in rd.read_events(("dataset",)) if e["dataset"] == config.dataset)["dataset_sha256"]
    assert f"local file `{Path(config.dataset).name}` (sha256 `{recorded}`)" in text


def test_card_for_embedded_base_names_smollm2_and_its_license(run_dir):
    _set_config(run_dir, model=EMBEDDED_MODEL, dataset="tatsu-lab/alpaca")
    card = _card(build_model_card(run_dir, REPO))

    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert card.data.license == "apache-2.0"
    assert card.data.datasets == ["tatsu-lab/alpaca"]
    assert 'AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")' in card.text
    assert "revision not recorded" in card.text


def test_card_for_local_dataset_file_has_its_sha256(run_dir, tmp_path):
    data = tmp_path / "pirate.jsonl"
    data.write_text('{"prompt": "hi", "completion": "arr"}\n')
    _set_config(run_dir, dataset=str(data))
    card = _card(build_model_card(run_dir, REPO))

    import hashlib

    assert card.data.datasets is None
    assert hashlib.sha256(data.read_bytes()).hexdigest() in card.text


def test_card_for_qlora_run_loads_4bit_base(run_dir):
    _set_config(run_dir, method="qlora", model="acme/tiny-base")
    text = build_model_card(run_dir, REPO)
    assert "BitsAndBytesConfig(" in text and "load_in_4bit=True" in text
    assert "qlora" in _card(text).data.tags


def test_card_survives_a_run_without_events(run_dir):
    (run_dir / "events.jsonl").unlink()
    text = build_model_card(run_dir, REPO)
    assert "| Best training loss | not logged |" in text
    assert "loss_curve.png" not in text


def test_card_counts_steps_trained_again_after_a_resume_once(run_dir):
    """A crash after step 10 logged steps 11-12 that the resume from checkpoint-10 trained again: the card's figures
    (best training and eval loss, the sample answers) read the events as the one reader gives them, the first
    attempt's numbers dropped, and match the run without it."""
    rd = RunDir(run_dir)
    before = build_model_card(run_dir, REPO)
    with rd.events_path.open("a", encoding="utf-8") as log:
        for line in (
            {"type": "log", "step": 11, "loss": 0.0001, "time": 1.0},
            {"type": "eval", "step": 12, "eval_loss": 0.00001, "time": 2.0},
            {"type": "samples", "step": 12, "samples": [{"prompt": "What is two plus two?", "answer": "LOST"}]},
            {"type": "resume", "step": 10, "checkpoint": "checkpoint-10", "time": 3.0},
        ):
            log.write(json.dumps(line) + "\n")
    after = build_model_card(run_dir, REPO)
    assert "(step 11)" not in after and "(step 12)" not in after and "LOST" not in after
    rows = [line for line in after.splitlines() if line.startswith(("| Best ", "| Final training loss"))]
    assert len(rows) == 3 and all(row in before for row in rows), rows


def test_card_runtime_from_engine_timestamps(run_dir):
    # The engine records started_at / finished_at rather than runtime_s.
    rd = RunDir(run_dir)
    status = {k: v for k, v in rd.read_status().items() if k != "runtime_s"}
    rd.write_status({**status, "started_at": 1000.0, "finished_at": 1075.0, "device": "NVIDIA A10G"})
    text = build_model_card(run_dir, REPO)
    assert "| Runtime | 1 min 15 s |" in text and "| Hardware | NVIDIA A10G |" in text


def test_pushed_adapter_points_at_hub_base_and_run_dir_is_untouched(hub, run_dir):
    _set_config(run_dir, model="acme/tiny-base")
    hub.add_repo("acme/tiny-base", card_data={"license": "mit"})
    before = (run_dir / "adapter_config.json").read_bytes()

    push_run(run_dir, REPO, token=GOOD)

    files = hub.repos[REPO].files
    assert json.loads(files["adapter_config.json"])["base_model_name_or_path"] == "acme/tiny-base"
    assert (run_dir / "adapter_config.json").read_bytes() == before  # the staged copy was rewritten, not the run's
    card = _card(files["README.md"].decode())
    assert card.data.base_model == "acme/tiny-base"
    assert card.data.license == "mit"  # looked up on the (stand-in) Hub


# ------------------------------------------------------------------------------------------------- merged


def test_push_merged_model_matches_base_plus_adapter(hub, run_dir, tiny_model_dir, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    push_run(run_dir, REPO, token=GOOD, merged=True)

    files = hub.repos[REPO].files
    assert {"model.safetensors", "config.json", "README.md", "config.yaml", "tokenizer.json"} <= set(files)
    assert not any(name.startswith("adapter_") for name in files)
    card = _card(files["README.md"].decode())
    assert card.data.library_name == "transformers" and "merged" in card.data.tags
    assert f'AutoModelForCausalLM.from_pretrained("{REPO}")' in card.text

    pulled = tmp_path / "pulled"
    pulled.mkdir()
    for name, data in files.items():
        (pulled / name).write_bytes(data)
    ids = torch.tensor([[1, 5, 9, 17, 33, 2]])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(str(pulled)).eval()(ids).logits
        base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
        plain = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()(ids).logits
        adapted = PeftModel.from_pretrained(base, str(run_dir)).eval()(ids).logits
    assert torch.allclose(merged, adapted, atol=1e-4)
    assert not torch.allclose(merged, plain, atol=1e-4)  # the adapter really changed the weights


def test_push_full_fine_tune_sends_the_model(hub, run_dir, tiny_model_dir):
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (run_dir / name).unlink()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy2(tiny_model_dir / name, run_dir / name)
    _set_config(run_dir, method="full")

    push_run(run_dir, REPO, token=GOOD, merged=True)  # --merged means nothing for a full fine-tune

    files = hub.repos[REPO].files
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "README.md"} <= set(files)
    assert not any(name.startswith("adapter_") for name in files)
    card = _card(files["README.md"].decode())
    assert card.data.library_name == "transformers" and "full-finetune" in card.data.tags
    assert "merged" not in card.data.tags


def test_merged_qlora_is_refused_before_any_call(hub, run_dir):
    _set_config(run_dir, method="qlora")
    with pytest.raises(UserError, match="4-bit") as err:
        push_run(run_dir, REPO, token=GOOD, merged=True)
    assert "\n" not in str(err.value)
    assert hub.requests == []


# ----------------------------------------------------------------------------------------- errors and tokens


def test_wrong_token_is_refused_cleanly(hub, run_dir):
    with pytest.raises(UserError) as err:
        push_run(run_dir, REPO, token=BAD)
    message = str(err.value)
    assert "token rejected" in message
    assert BAD not in message and "\n" not in message
    assert REPO not in hub.repos
    assert any(r.status == 401 for r in hub.requests)


def test_token_without_rights_on_namespace(hub, run_dir):
    with pytest.raises(UserError, match=r"token rejected for bob/pirate-lora \(403\)"):
        push_run(run_dir, "bob/pirate-lora", token=GOOD)


def test_missing_token_says_where_to_set_it(hub, run_dir):
    with pytest.raises(UserError) as err:
        push_run(run_dir, REPO)
    message = str(err.value)
    assert "Publish tab" in message and "HF_TOKEN" in message and "Space" in message and "secret" in message
    assert hub.requests == []


@pytest.mark.parametrize("repo_id", ["pirate-lora", "alice/", "a/b/c", "alice/bad name", "alice/x--y", "-alice/x"])
def test_bad_repo_id(hub, run_dir, repo_id):
    with pytest.raises(UserError, match="repo id") as err:
        push_run(run_dir, repo_id, token=GOOD)
    assert err.value.field == "repo_id"
    assert hub.requests == []


@pytest.mark.parametrize("status", ["running", "failed", "pending"])
def test_unfinished_run_is_refused(hub, run_dir, status):
    rd = RunDir(run_dir)
    rd.write_status({**rd.read_status(), "status": status, "pid": 2**22 + 12345})
    with pytest.raises(UserError, match="not finished"):
        push_run(run_dir, REPO, token=GOOD)


def test_missing_run_dir(hub, tmp_path):
    with pytest.raises(UserError, match="run_dir: .*nope is not a run directory"):
        push_run(tmp_path / "nope", REPO, token=GOOD)


def test_offline_mode_is_explained(hub, run_dir, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError, match="HF_HUB_OFFLINE"):
        push_run(run_dir, REPO, token=GOOD)


def test_unreachable_hub(hub, run_dir, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(UserError, match="cannot reach the Hub at http://127.0.0.1:9"):
        push_run(run_dir, REPO, token=GOOD)


def test_no_token_in_run_dir_logs_or_pushed_files(hub, run_dir, caplog, capsys):
    caplog.set_level(logging.DEBUG)  # every logger, huggingface_hub's request log included
    for name in ("huggingface_hub", "finetune"):
        logging.getLogger(name).setLevel(logging.DEBUG)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logging.getLogger().addHandler(handler)
    try:
        messages = []
        push_run(run_dir, REPO, token=GOOD, progress=messages.append)
        push_run(run_dir, "alice/merged", token=GOOD, merged=True, progress=messages.append)
        for token in (BAD, GOOD):
            with pytest.raises(UserError) as err:
                push_run(run_dir, "bob/nope" if token == GOOD else REPO, token=token, progress=messages.append)
            messages.append(str(err.value))
    finally:
        logging.getLogger().removeHandler(handler)
        for name in ("huggingface_hub", "finetune"):
            logging.getLogger(name).setLevel(logging.NOTSET)

    out = capsys.readouterr()
    haystacks = {
        "log records": caplog.text + stream.getvalue(),
        "stdout/stderr": out.out + out.err,
        "progress and error messages": "\n".join(messages),
        "request bodies": hub.recorded_bytes().decode("latin-1"),
    }
    for repo in hub.repos.values():
        for name, data in repo.files.items():
            haystacks[f"pushed {repo.repo_id}/{name}"] = data.decode("latin-1")
    for path in run_dir.rglob("*"):
        if path.is_file():
            haystacks[f"run file {path.relative_to(run_dir)}"] = path.read_bytes().decode("latin-1")
    assert len(hub.repos["alice/merged"].files) > 5 and len(messages) > 4
    for token in (GOOD, BAD):
        leaks = [where for where, text in haystacks.items() if token in text]
        assert leaks == [], f"token found in {leaks}"


def test_token_in_a_staged_file_blocks_the_push(hub, run_dir):
    # Defence in depth: if a token ever slipped into a file that is published, the push stops before uploading.
    (run_dir / "tokenizer_config.json").write_text(json.dumps({"note": GOOD}))
    with pytest.raises(UserError, match="contains the Hub token") as err:
        push_run(run_dir, REPO, token=GOOD)
    assert GOOD not in str(err.value)
    assert hub.requests == []


# ---------------------------------------------------------------------------------------------------- CLI


def _cli(argv: list[str]) -> int:
    """`python -m finetune ARGV` in this process: its exit code."""
    return main(argv)


def test_cli_push_prints_the_url(hub, run_dir, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", GOOD)
    assert _cli(["push", str(run_dir), "--repo-id", REPO, "--private"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == f"{hub.url}/{REPO}"
    assert hub.repos[REPO].private is True


def test_cli_push_token_env(hub, run_dir, monkeypatch, capsys):
    monkeypatch.setenv("MY_HUB_TOKEN", GOOD)
    assert _cli(["push", str(run_dir), "--repo-id", REPO, "--token-env", "MY_HUB_TOKEN"]) == 0


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--repo-id", "not a repo"], {"HF_TOKEN": GOOD}, "repo id"),
        (["--repo-id", REPO], {}, "no Hugging Face token"),
        (["--repo-id", REPO], {"HF_TOKEN": BAD}, "token rejected"),
        (["--repo-id", REPO, "--token-env", "MISSING_VAR"], {"HF_TOKEN": GOOD}, "MISSING_VAR is not set"),
        (["--repo-id", REPO, "--merged"], {"HF_TOKEN": GOOD, "_QLORA": "1"}, "not available for a qlora run"),
    ],
)
def test_cli_push_errors_are_one_line(hub, run_dir, monkeypatch, capsys, argv, env, expected):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if env.get("_QLORA"):
        _set_config(run_dir, method="qlora")
    rc = _cli(["push", str(run_dir), *argv])
    out = capsys.readouterr()
    assert rc == 2  # a user error, as in every other command
    assert out.err.count("\n") == 1 and out.err.startswith("error: ") and expected in out.err
    assert GOOD not in out.err + out.out and BAD not in out.err + out.out


@pytest.mark.skipif(
    not (Path(__file__).parent.parent / "finetune" / "__main__.py").is_file(), reason="finetune/__main__.py not yet"
)
def test_python_m_finetune_push_reports_one_line(run_dir):
    env = {**os.environ, "HF_TOKEN": GOOD}
    proc = subprocess.run(
        [sys.executable, "-m", "finetune", "push", str(run_dir), "--repo-id", "not/a/repo"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=Path(__file__).parent.parent,
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: repo id")


@pytest.mark.skipif(
    not (Path(__file__).parent.parent / "finetune" / "__main__.py").is_file(), reason="finetune/__main__.py not yet"
)
def test_python_m_finetune_push_of_a_folder_that_is_not_a_run_exits_2(tmp_path):
    env = {**os.environ, "HF_TOKEN": GOOD}
    proc = subprocess.run(
        [sys.executable, "-m", "finetune", "push", str(tmp_path), "--repo-id", REPO],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=Path(__file__).parent.parent,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1
    assert lines[0].startswith("error: run_dir: ") and "no config.yaml" in lines[0]


def test_hub_module_stays_light():
    # The UI imports finetune.publish.hub; it must not pull in gradio, and torch only on a --merged push.
    code = (
        "import sys, finetune.publish.hub, finetune.publish.model_card; "
        "bad = [m for m in ('gradio', 'torch', 'transformers', 'peft') if m in sys.modules]; "
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent.parent).returncode == 0


def test_the_token_never_reaches_config_yaml(hub, tiny_model_dir, tmp_path, monkeypatch):
    # Train with a token in the environment, then push with it: config.yaml holds it nowhere, on disk or pushed.
    monkeypatch.setenv("HF_TOKEN", GOOD)
    run = train_run(tmp_path / "runs" / "run-with-env-token", tiny_model_dir, steps=1, eval_split="")
    push_run(run, REPO)
    assert GOOD not in (run / "config.yaml").read_text()
    assert GOOD not in hub.repos[REPO].files["config.yaml"].decode()
    # ...and a config cannot carry one: a token key is refused, and the refusal does not repeat the token.
    for key in ("token", "hf_token"):
        with pytest.raises(ConfigError, match=key) as err:
            TrainConfig.from_dict({**TrainConfig.load(run / "config.yaml").to_dict(), key: GOOD})
        assert GOOD not in str(err.value)


# ---------------------------------------------------------------------- a public Space: no borrowed token


def test_without_env_token_a_missing_token_is_refused(hub, run_dir, monkeypatch):
    # The operator's HF_TOKEN and stored login are there, and must not be used.
    monkeypatch.setenv("HF_TOKEN", GOOD)
    monkeypatch.setattr(hubmod, "_stored_token", lambda: GOOD)
    with pytest.raises(UserError) as err:
        push_run(run_dir, REPO, token="  ", allow_env_token=False)
    message = str(err.value)
    assert err.value.field == "token" and "\n" not in message
    assert "sign in with Hugging Face" in message and "paste a write token" in message
    assert "HF_TOKEN" not in message  # a visitor cannot set the server's environment
    assert hub.requests == [] and hub.repos == {}


@pytest.mark.parametrize("merged", [False, True])
def test_without_env_token_only_the_given_token_is_sent(hub, run_dir, monkeypatch, merged):
    # bob (a visitor) pushes with his own token while the server holds alice's in HF_TOKEN and a stored login:
    # every request the Hub sees is bob's, none is alice's and none goes without a token.
    hub.tokens[BOB] = "bob"
    monkeypatch.setenv("HF_TOKEN", GOOD)
    monkeypatch.setattr(hubmod, "_stored_token", lambda: GOOD)
    if not merged:  # a Hub base model: the license look-up (model_info) is one more authorised call
        _set_config(run_dir, model="bob/tiny-base")
        hub.add_repo("bob/tiny-base", card_data={"license": "mit"})

    url = push_run(run_dir, "bob/pirate", token=BOB, merged=merged, allow_env_token=False)

    assert url.endswith("bob/pirate") and len(hub.repos["bob/pirate"].commits) == 1
    calls = hub.paths()
    assert ("POST", "/api/repos/create") in calls and ("POST", "/api/models/bob/pirate/commit/main") in calls
    if not merged:
        assert ("GET", "/api/models/bob/tiny-base") in calls
        assert _card(hub.repos["bob/pirate"].files["README.md"].decode()).data.license == "mit"
    assert [r.authorized_as for r in hub.requests] == ["bob"] * len(hub.requests)


def test_env_token_is_used_when_allowed(hub, run_dir, monkeypatch):
    # The same call with the default (local use, the CLI): HF_TOKEN is the token.
    monkeypatch.setenv("HF_TOKEN", GOOD)
    push_run(run_dir, REPO)
    assert {r.authorized_as for r in hub.requests} == {"alice"}
