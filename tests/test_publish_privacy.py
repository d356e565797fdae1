"""Publishing never reveals the machine it ran on.

A run is really trained from files in a home directory with a recognisable user name (a model folder, a dataset and
an eval file under /…/home/alice-test), then pushed to the stand-in Hub as an adapter and as a merged model. Every
file the Hub received, and every request body, is scanned for the run's absolute paths, the home directory (the fake
one and the real one), the temp folders and the user name. The card must still say how to reproduce the run, and the
run directory on disk must be left exactly as it was (it keeps the real paths, so resume keeps working).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from finetune.cli.args import load_config
from finetune.config import TrainConfig
from finetune.errors import UserError
from finetune.publish import hub as hubmod
from finetune.publish.hub import push_run
from finetune.publish.public import public_config, scan_for_local_paths
from finetune.runs.rundir import RunDir
from tests.helpers import mini_dataset, write_jsonl
from tests.hub_standin import HubStandin
from tests.run_fixtures import train_run

REAL_HOME = str(Path.home())  # read before any test changes HOME
USER = "alice-test"
TOKEN = "hf_privacy_" + hashlib.sha256(os.urandom(16)).hexdigest()[:24]
REPO = "alice/acme-support-lora"
MODEL_NAME = "acme-base-7b"
DATA_NAME = "support-tickets.jsonl"
EVAL_NAME = "support-tickets-eval.jsonl"


@pytest.fixture(scope="session")
def alice(tiny_smollm_dir, tmp_path_factory):
    """A run trained the way alice would: everything under her home directory, HOME pointing there. Her model is the
    tiny Llama with SmolLM2's tokenizer, so the GGUF exports are ones llama.cpp would load."""
    home = tmp_path_factory.mktemp("privacy") / "home" / USER
    model = home / "models" / MODEL_NAME
    shutil.copytree(tiny_smollm_dir, model)
    data = home / "clients" / "acme" / DATA_NAME
    data.parent.mkdir(parents=True)
    shutil.copy2(mini_dataset(), data)
    rows = [{"prompt": "What is the capital of France?", "completion": "Arr, Paris!"}] * 4
    eval_data = write_jsonl(home / "clients" / "acme" / EVAL_NAME, rows)
    run_dir = home / "finetune-runs" / "acme-support"
    old_home = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    try:
        train_run(run_dir, model, steps=4, dataset=str(data), eval_split=str(eval_data), eval_steps=2, save_steps=2)
    finally:
        if old_home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = old_home
    return {"home": home, "model": model, "data": data, "eval": eval_data, "run": run_dir}


@pytest.fixture
def hub(monkeypatch, alice):
    """The stand-in Hub, with HOME set to alice's home for the push."""
    from huggingface_hub import constants

    with HubStandin(tokens={TOKEN: "alice"}) as standin:
        monkeypatch.setenv("HF_ENDPOINT", standin.url)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setattr(hubmod, "_stored_token", lambda: None)
        monkeypatch.setenv("HOME", str(alice["home"]))
        yield standin


def _needles(alice: dict) -> dict[str, str]:
    """What must never be published, found independently of finetune.publish.public."""
    config = RunDir(alice["run"]).load_config()
    needles = {
        "the model folder": str(alice["model"]),
        "the dataset": str(alice["data"]),
        "the eval file": str(alice["eval"]),
        "the run directory": str(alice["run"]),
        "the config's output_dir": config.output_dir,
        "the config's model": config.model,
        "the config's dataset": config.dataset,
        "alice's home": str(alice["home"]),
        "the user name": USER,
        "the clients folder": "clients/acme",
        "the real home": REAL_HOME.rstrip("/") + "/",
        "the temp folder": tempfile.gettempdir().rstrip("/") + "/",
        "pytest's temp folder": str(alice["home"].parents[2]),
        "the push staging folder": "finetune-push-",
        "the test run cache": "finetune-test-runs-",
    }
    if len(Path(REAL_HOME).parts) > 2:  # /home/<someone>: the real user's name too
        needles["the real home (exact)"] = REAL_HOME
    return {what: value for what, value in needles.items() if value}


def _leaks(standin: HubStandin, alice: dict) -> list[str]:
    haystacks = {}
    for repo in standin.repos.values():
        for name, data in repo.files.items():
            haystacks[f"{repo.repo_id}/{name}"] = data
    for i, request in enumerate(standin.requests):  # commit headers, create-repo bodies, validate-yaml
        haystacks[f"request {i} {request.method} {request.path}"] = request.body + request.path.encode()
    found = []
    for where, data in haystacks.items():
        variants = (data, data.replace(b"\\/", b"/"))
        for what, needle in _needles(alice).items():
            if any(needle.encode() in v for v in variants):
                found.append(f"{where}: {what}")
    return found


def _snapshot(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------------------ pushes


def test_adapter_push_publishes_no_local_path(hub, alice):
    before = _snapshot(alice["run"])

    push_run(alice["run"], REPO, token=TOKEN)

    files = hub.repos[REPO].files
    assert {"README.md", "config.yaml", "adapter_config.json", "adapter_model.safetensors"} <= set(files)
    assert _leaks(hub, alice) == []
    assert json.loads(files["adapter_config.json"])["base_model_name_or_path"] is None
    # The run directory is exactly as training left it: it keeps the real paths for resume.
    assert _snapshot(alice["run"]) == before
    config = RunDir(alice["run"]).load_config()
    assert (config.model, config.dataset, config.output_dir) == (
        str(alice["model"]),
        str(alice["data"]),
        str(alice["run"]),
    )


def test_merged_push_publishes_no_local_path(hub, alice):
    before = _snapshot(alice["run"])

    push_run(alice["run"], "alice/acme-support-merged", token=TOKEN, merged=True)

    files = hub.repos["alice/acme-support-merged"].files
    assert {"README.md", "config.yaml", "config.json", "model.safetensors"} <= set(files)
    assert _leaks(hub, alice) == []
    assert _snapshot(alice["run"]) == before


def test_the_card_still_says_how_to_reproduce_the_run(hub, alice):
    push_run(alice["run"], REPO, token=TOKEN)
    card = hub.repos[REPO].files["README.md"].decode()
    model_sha = _sha256(alice["model"] / "model.safetensors")
    data_sha = _sha256(alice["data"])

    # Local files: named by base name and sha256.
    assert f"`{MODEL_NAME}`, model.safetensors sha256 `{model_sha}`" in card
    assert f"local file `{DATA_NAME}` (sha256 `{data_sha}`)" in card
    # The reproduce command says which values to fill in.
    assert (
        "python -m finetune train --config config.yaml "
        f"--set model='<path to your copy of {MODEL_NAME}>' "
        f"--set dataset='<path to your copy of {DATA_NAME}>' "
        f"--set eval_split='<path to your copy of {EVAL_NAME}>'"
    ) in card
    assert "`output_dir`, `nvme_path`" in card and "Left out" in card


def test_pushed_config_yaml_reproduces_the_run_once_filled_in(hub, alice, tmp_path):
    push_run(alice["run"], REPO, token=TOKEN)
    text = hub.repos[REPO].files["config.yaml"].decode()
    values = yaml.safe_load(text)
    assert "output_dir" not in values and "nvme_path" not in values
    assert values["model"] == f"<path to your copy of {MODEL_NAME}>"
    assert values["dataset"] == f"<path to your copy of {DATA_NAME}>"
    assert values["eval_split"] == f"<path to your copy of {EVAL_NAME}>"

    # A reader with their own copies runs the command the card shows: the config is the run's, output_dir aside.
    pulled = tmp_path / "config.yaml"
    pulled.write_text(text)
    mine = {"model": tmp_path / "m", "dataset": tmp_path / "d.jsonl", "eval_split": tmp_path / "e.jsonl"}
    reproduced = load_config(str(pulled), [f"{key}={value}" for key, value in mine.items()])
    original = RunDir(alice["run"]).load_config()
    expected = original.replace(output_dir="", **{key: str(value) for key, value in mine.items()})
    assert reproduced == expected


def test_a_local_path_left_in_a_staged_file_blocks_the_push(hub, alice, tmp_path):
    # The last-line guard: a path that slipped into a published file stops the push before any request.
    run = alice["home"] / "finetune-runs" / f"copy-{tmp_path.name}"
    shutil.copytree(alice["run"], run)
    try:
        config = json.loads((run / "tokenizer_config.json").read_text())
        (run / "tokenizer_config.json").write_text(json.dumps({**config, "name_or_path": str(alice["model"])}))
        with pytest.raises(UserError) as err:
            push_run(run, REPO, token=TOKEN)
        message = str(err.value)
        assert message.startswith("refusing to publish: tokenizer_config.json contains a local path")
        assert "base model" in message and "\n" not in message
        assert str(alice["home"]) not in message and USER not in message  # the refusal does not repeat the path
        assert hub.requests == []

        # A path under the home directory, even one the run never named, is caught too.
        (run / "tokenizer_config.json").write_text(json.dumps(config))
        (run / "chat_template.jinja").write_text(f"{{# see {alice['home']}/notes.txt #}}\n" + "{{ messages }}")
        with pytest.raises(UserError, match=r"chat_template.jinja contains a local path \(your home directory\)"):
            push_run(run, REPO, token=TOKEN)
        assert hub.requests == []
    finally:
        shutil.rmtree(run)


# ----------------------------------------------------------------------------------------- the helpers


def test_scan_matches_whole_paths_only(tmp_path):
    (tmp_path / "a.md").write_text("see https://huggingface.co/acme/model-x and acme/model")
    (tmp_path / "b.json").write_text('{"p": "\\/model"}')
    (tmp_path / "c.txt").write_text("weights in `/model` here")
    (tmp_path / "d.txt").write_text("/models/x and /modelling")
    hits = scan_for_local_paths(tmp_path, {"/model": "the model folder"})
    assert hits == [("b.json", "the model folder"), ("c.txt", "the model folder")]


def test_scan_reads_paths_written_with_json_escaped_slashes(tmp_path):
    # Some JSON writers escape every slash: the path's parts are then joined by backslash-slash, not by slash.
    base = "/home/alice/clients/acme/base-model"
    (tmp_path / "trainer_state.json").write_text(json.dumps({"best_model": base}).replace("/", "\\/"))
    hits = scan_for_local_paths(tmp_path, {base: "the base model's folder"})
    assert hits == [("trainer_state.json", "the base model's folder")]


def test_scan_looks_into_subfolders(tmp_path):
    (tmp_path / "a.txt").write_text("nothing local here")
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "sub" / "b.txt").write_text("trained from /home/alice/data.jsonl")
    (tmp_path / "sub" / "deeper" / "c.json").write_text('{"data": "/home/alice/data.jsonl"}')
    hits = scan_for_local_paths(tmp_path, {"/home/alice/data.jsonl": "the dataset file"})
    assert hits == [("sub/b.txt", "the dataset file"), ("sub/deeper/c.json", "the dataset file")]


def test_public_config_uses_a_hub_id_on_record_and_keeps_names_that_are_not_paths(tmp_path):
    snapshot = tmp_path / "hub" / "models--acme--tiny-base" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    config = TrainConfig(
        model=str(snapshot),
        dataset="tatsu-lab/alpaca",
        eval_split="validation",
        text_column="a/b",
        output_dir=str(tmp_path / "runs" / "r"),
    )
    public = public_config(config)
    assert public.values["model"] == "acme/tiny-base"
    assert public.values["dataset"] == "tatsu-lab/alpaca" and public.values["eval_split"] == "validation"
    assert public.values["text_column"] == "a/b"
    assert public.fill_in == [] and public.reproduce_command() == "python -m finetune train --config config.yaml"
    assert str(tmp_path) not in public.to_yaml()
    assert TrainConfig.from_yaml(public.to_yaml()) == config.replace(model="acme/tiny-base", output_dir="")


def test_public_config_with_nvme_offload_asks_for_a_disk(tmp_path):
    config = TrainConfig(
        dataset="bundled:pirate",
        zero_stage=3,
        offload_optimizer="nvme",
        nvme_path=str(tmp_path / "fast-disk"),
        output_dir=str(tmp_path / "run"),
    )
    public = public_config(config)
    text = public.to_yaml()
    assert str(tmp_path) not in text and "output_dir" not in yaml.safe_load(text)
    assert public.values["dataset"] == "bundled:pirate"
    assert re.search(r"--set nvme_path='<a directory on a fast local disk>'", text)
    assert TrainConfig.from_yaml(text).nvme_path.startswith("<")


# ------------------------------------------------------------------------------------------------ exports


def test_a_gguf_push_publishes_no_local_path(hub, alice):
    push_run(alice["run"], "alice/acme-support-gguf", token=TOKEN, gguf="f16")

    files = hub.repos["alice/acme-support-gguf"].files
    assert "Modelfile" in files and any(name.endswith(".gguf") for name in files)
    assert _leaks(hub, alice) == []


@pytest.mark.parametrize(("fmt", "quant"), [("merged", None), ("gguf", "q8_0")])
def test_every_exported_file_holds_no_local_path(alice, tmp_path_factory, fmt, quant):
    from finetune.publish.export import export_run

    out = tmp_path_factory.mktemp("export-out") / fmt
    result = export_run(alice["run"], fmt, quant, out=out)
    found = []
    for path in sorted(p for p in result.folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        for what, needle in _needles(alice).items():
            if needle.encode() in data or needle.encode() in data.replace(b"\\/", b"/"):
                found.append(f"{path.name}: {what}")
    assert found == []
    assert len(list(result.folder.iterdir())) >= 2  # really written: model + tokenizer, or gguf + Modelfile
