"""Many people, one app: every run and upload belongs to who made it, through the documented API and MCP tools.

One app is served publicly with `--auth` alice, bob and carol (`--admin carol`) and small upload limits, as `app.py`
parses them; its clients are `gradio_client`s, as a user's would be. Alice uploads data, starts a run on it (held at
a step so it is certainly training) and chats with it; bob's every action on her run and upload is refused with the
line a missing run gets, and her run goes on; carol sees and stops it. A second app is a Space (Hugging Face
sign-in) with `--mcp`: MCP clients name themselves with their Hub token, and anonymous visitors may not train.

The tiny model is served as the Hub model `acme/tiny-llama` from an offline Hub cache: a public app refuses server
paths, so the run's model is a Hub id as a visitor's would be.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from finetune.access.policy import ANONYMOUS, AccessPolicy
from finetune.access.uploads import MB, UploadLimits
from finetune.engines.world import free_port
from finetune.runs.progress import TrainingState
from finetune.runs.rundir import RunDir
from finetune.studio import Studio
from tests.helpers import hold_at_step, tiny_config
from tests.hub_standin import HubStandin
from tests.run_fixtures import build_run
from tests.test_space_mode import data_file
from tests.test_ui_support import api_client
from ui.app import build_app, launch

MODEL = "acme/tiny-llama"
USERS = {name: "pw-" + secrets.token_hex(4) for name in ("alice", "bob", "carol")}
FILE_LIMIT, TOTAL_LIMIT, COUNT_LIMIT = 1000, 2001, 3  # bytes, bytes, files per person
HELD_AT = 3  # alice's run waits at the end of this step (checkpoints 1 and 2 are on disk by then)


@pytest.fixture(scope="module")
def module_patch():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def hub_model(tiny_model_dir, tmp_path_factory, module_patch) -> str:
    """The tiny model as the Hub's `acme/tiny-llama` in an offline Hub cache (what a download leaves behind)."""
    import huggingface_hub.constants

    cache = tmp_path_factory.mktemp("hub-cache")
    repo = cache / "models--acme--tiny-llama"
    shutil.copytree(tiny_model_dir, repo / "snapshots" / ("0" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    module_patch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return MODEL


@dataclass
class Served:
    url: str
    studio: Studio
    home: Path
    demo: Any = None

    def click(self, button: Any, user: str) -> Any:
        """What a page's button does for `user`, called the way gradio calls it (the request where the handler's
        signature has it)."""
        import gradio as gr
        from gradio.helpers import special_args

        deps = self.demo.config["dependencies"]
        dep = next(d for d in deps if [list(t) for t in d["targets"]] == [[button._id, "click"]])
        fn = self.demo.fns[dep["id"]].fn
        inputs, *_ = special_args(fn, [], gr.Request(username=user))
        return fn(*inputs)

    def client(self, user: str | None = None, **kwargs: Any) -> Any:
        """A visitor's gradio_client: logged in as `user` (None: not logged in); never this machine's HF token."""
        auth = (user, USERS[user]) if user else None
        return api_client(self.url, auth=auth, token=False, **kwargs)


@pytest.fixture(scope="module")
def app(hub_model, tmp_path_factory, module_patch):
    """`app.py --host 0.0.0.0 --auth alice:…,bob:…,carol:… --admin carol` with small upload limits, served from this
    process (on 127.0.0.1: the policy is the public one all the same)."""
    from app import parse_args

    home = tmp_path_factory.mktemp("visitors-home")
    argv = ["--host", "0.0.0.0", "--auth", ",".join(f"{u}:{p}" for u, p in USERS.items()), "--admin", "carol"]
    argv += ["--upload-max-mb", str(FILE_LIMIT / MB), "--uploads-total-mb", str(TOTAL_LIMIT / MB)]
    argv += ["--uploads-max-files", str(COUNT_LIMIT)]
    args = parse_args(argv, env={})
    assert args.policy.public and args.policy.admins == {"carol"} and len(args.auth) == 3
    studio = Studio(home / "runs", policy=args.policy)
    demo = build_app(studio)
    port = free_port()
    launch(demo, host="127.0.0.1", port=port, auth=args.auth, block=False, quiet=True)
    try:
        yield Served(f"http://127.0.0.1:{port}/", studio, home, demo)
    finally:
        studio.stop()
        studio.manager.wait(120)
        demo.close()


@pytest.fixture(scope="module")
def settings(tiny_model_dir) -> dict[str, Any]:
    """A run that trains in seconds on the tiny model (as the Hub's), with a checkpoint at every step."""
    return {**tiny_config(tiny_model_dir, max_steps=30, save_steps=1).to_dict(), "model": MODEL}


@pytest.fixture(scope="module")
def alice_run(app, settings, tmp_path_factory, module_patch) -> dict[str, Any]:
    """Alice uploads her data and starts a run on it; it is held training at step HELD_AT."""
    from gradio_client import handle_file

    held = hold_at_step(module_patch, HELD_AT)
    alice = app.client("alice")
    upload = handle_file(str(data_file(tmp_path_factory.mktemp("alice"), "pirates.jsonl")))
    data = alice.predict(upload, api_name="/upload")
    started = alice.predict({**settings, "dataset": data}, api_name="/start")
    assert held.wait(180), app.studio.manager.state()
    return {"run": started["run"], "data": data, "started": started}


def refusal(call: Any) -> str:
    """The one line an API call is refused with (gradio_client raises it as an AppError)."""
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as refused:
        call()
    message = str(refused.value)
    assert "\n" not in message and "Traceback" not in message
    return message


# ----------------------------------------------------------------------------------------------- alice
def test_alice_trains_on_her_upload_and_chats_with_it(app, alice_run):
    alice = app.client("alice")
    run, data, started = alice_run["run"], alice_run["data"], alice_run["started"]
    assert data == "upload:pirates.jsonl"  # the dataset field shows the file's name, never a server path
    assert "run_dir" not in started and str(app.home) not in json.dumps(started)
    status = alice.predict(run, api_name="/status")
    assert status["run"] == run and status["status"] == "running" and status["step"] == HELD_AT
    assert status["owner"] == "alice" and alice.predict("", api_name="/status")["run"] == run
    assert [r["run"] for r in alice.predict(api_name="/runs")] == [run]
    reply = alice.predict("Ahoy, who are you?", run, None, None, 8, api_name="/chat")
    assert isinstance(reply, str) and reply.strip()  # her checkpoint answered (random words: a tiny model)
    preview = alice.predict({"model": MODEL, "dataset": data}, 1, api_name="/preview")
    assert preview["rows"] == 12 and len(preview["examples"]) == 1


# ----------------------------------------------------------------------------------------------- bob
def test_bob_is_refused_everything_of_alices_as_if_it_did_not_exist(app, alice_run, settings):
    bob = app.client("bob")
    run, data = alice_run["run"], alice_run["data"]
    missing = "no-such-run"
    calls = {  # endpoint: how bob calls it with a run id
        "/stop": lambda r: bob.predict(r, api_name="/stop"),
        "/resume": lambda r: bob.predict(r, api_name="/resume"),
        "/chat": lambda r: bob.predict("Tell me her secrets", r, api_name="/chat"),
        "/chat base-of": lambda r: bob.predict("Hello", f"base-of:{r}", api_name="/chat"),
        "/export": lambda r: bob.predict(r, "merged", api_name="/export"),
        "/publish": lambda r: bob.predict(r, "bob/stolen", "hf_" + "b" * 30, api_name="/publish"),
        "/status": lambda r: bob.predict(r, api_name="/status"),
        "/classify": lambda r: bob.predict(r, "some text", api_name="/classify"),
        "/evaluate": lambda r: bob.predict(r, api_name="/evaluate"),
        "/compare": lambda r: bob.predict([r, "bobs-own"], api_name="/compare"),
    }
    for name, call in calls.items():
        theirs, nothing = refusal(lambda c=call: c(run)), refusal(lambda c=call: c(missing))
        assert theirs == f"run: {run!r} is not a run in the runs folder", name
        assert theirs.replace(run, missing) == nothing, name  # the same line as a run that does not exist
    # Her upload, by its name or by its place on the server: refused as a name never uploaded.
    kept = next(app.studio.as_visitor("alice").uploads_dir.iterdir())
    for value in (data, "upload:never-uploaded.jsonl"):
        line = refusal(lambda v=value: bob.predict({"dataset": v}, api_name="/preview"))
        assert line == f"dataset: {value!r} is not one of your uploads; upload the file again"
    assert refusal(lambda: bob.predict({"dataset": str(kept)}, api_name="/preview")).startswith(
        "dataset: files on the server are not available"
    )
    # Nothing of hers in his lists; the busy line says until when, not whose run it is.
    assert bob.predict(api_name="/runs") == [] and bob.predict("", api_name="/status") == {}
    busy = refusal(lambda: bob.predict({**settings, "dataset": "bundled:pirate"}, api_name="/start"))
    assert busy.startswith("busy: the device is training another run") and "alice" not in busy and run not in busy
    assert app.click(app.demo.studio_ui.train.stop_btn, "bob") == "Nothing is running."  # the page's Stop: the same
    # Her run goes on: still training at the step it is held at, no stop asked.
    state = app.studio.manager.state()
    assert state.run_id == run and state.status == "running" and state.step == HELD_AT
    assert not app.studio.manager._active.progress.stop_requested.is_set()
    assert "a browser at" not in json.dumps(RunDir(Path(state.run_dir)).read_status())  # no address recorded


def test_upload_limits_refuse_a_file_one_byte_over_and_keep_nothing(app, tmp_path):
    from gradio_client import handle_file

    bob = app.client("bob")

    def sized(name: str, size: int) -> Any:
        path = tmp_path / name
        path.write_bytes(b"x" * size)
        return handle_file(str(path))

    assert bob.predict(sized("a.jsonl", FILE_LIMIT), api_name="/upload") == "upload:a.jsonl"
    line = refusal(lambda: bob.predict(sized("b.jsonl", FILE_LIMIT + 1), api_name="/upload"))
    assert line == f"dataset: b.jsonl is {FILE_LIMIT + 1:,} bytes, more than the {FILE_LIMIT:,} bytes allowed per file"
    assert bob.predict(sized("c.jsonl", FILE_LIMIT), api_name="/upload") == "upload:c.jsonl"
    line = refusal(lambda: bob.predict(sized("d.jsonl", TOTAL_LIMIT - 2 * FILE_LIMIT + 1), api_name="/upload"))
    assert line.startswith("dataset: d.jsonl would bring your uploads to 2,002 bytes, more than the 2,001 bytes")
    assert bob.predict(sized("e.jsonl", TOTAL_LIMIT - 2 * FILE_LIMIT), api_name="/upload") == "upload:e.jsonl"
    line = refusal(lambda: bob.predict(sized("f.jsonl", 0), api_name="/upload"))
    assert line.startswith(f"dataset: you already keep {COUNT_LIMIT} uploads, the most allowed")
    kept = sorted(p.name for p in app.studio.as_visitor("bob").uploads_dir.iterdir())
    assert kept == ["a.jsonl", "c.jsonl", "e.jsonl"]  # a refused upload left nothing behind
    assert refusal(lambda: bob.predict({"path": "/etc/hostname"}, api_name="/upload")).startswith("file: send the file")


def test_a_zip_of_image_data_uploads_as_one_set_and_a_zip_leaving_its_folder_keeps_nothing(app, tmp_path):
    """/upload takes a zip of a data file and its pictures: unpacked into carol's own folder, the data file's value
    returned; a zip naming `../` is refused whole."""
    import zipfile

    from gradio_client import handle_file

    carol = app.client("carol")
    good, bad = tmp_path / "shapes.zip", tmp_path / "evil.zip"
    with zipfile.ZipFile(good, "w") as archive:
        archive.writestr("shapes/data.jsonl", '{"image": "pics/a.png", "caption": "A dot."}\n')
        archive.writestr("shapes/pics/a.png", b"not read here")
    with zipfile.ZipFile(bad, "w") as archive:
        archive.writestr("../data.jsonl", "{}")
    assert refusal(lambda: carol.predict(handle_file(str(bad)), api_name="/upload")).endswith("outside its folder")
    value = carol.predict(handle_file(str(good)), api_name="/upload")
    assert value == "upload:data/data.jsonl"
    studio = app.studio.as_visitor("carol")
    assert (studio.uploads.resolve("carol", value).parent / "pics" / "a.png").read_bytes() == b"not read here"
    assert [p.name for p in studio.uploads_dir.iterdir()] == ["data"]  # the refused zip left nothing


# ----------------------------------------------------------------------------------------------- carol
def test_the_admin_sees_and_stops_every_run_which_stays_its_owners(app, alice_run):
    carol = app.client("carol")
    run = alice_run["run"]
    assert run in [r["run"] for r in carol.predict(api_name="/runs")]
    assert carol.predict(run, api_name="/stop").startswith(f"stopping {run}")
    final = app.studio.manager.wait(180)
    assert final.status == "stopped" and final.owner == "alice"
    status = app.client("alice").predict(run, api_name="/status")
    assert status["status"] == "stopped" and status["resumable"]


# ----------------------------------------------------------------------------------------------- a Space and MCP
ALICE_TOKEN, BOB_TOKEN = "hf_" + secrets.token_hex(16), "hf_" + secrets.token_hex(16)


@pytest.fixture(scope="module")
def space(hub_model, tiny_model_dir, tmp_path_factory, module_patch):
    """A Space (Hugging Face sign-in) served with --mcp; a stand-in Hub knows alice's and bob's tokens; alice has a
    finished run."""
    import gradio.oauth
    from huggingface_hub import constants

    from app import parse_args

    standin = HubStandin(tokens={ALICE_TOKEN: "alice", BOB_TOKEN: "bob"}).start()
    module_patch.setenv("HF_ENDPOINT", standin.url)
    module_patch.setattr(constants, "HF_HUB_OFFLINE", False)
    module_patch.setattr(gradio.oauth, "_get_mocked_oauth_info", lambda: {})  # no sign-in here: API clients only
    args = parse_args(["--mcp"], env={"SPACE_ID": "alice/finetune-studio"})
    assert args.policy.space and args.mcp
    home = tmp_path_factory.mktemp("space-home")
    studio = Studio(home / "runs", policy=args.policy)
    run = RunDir(build_run(home / "runs" / "run-a", tiny_model_dir))
    run.write_status({**run.read_status(), "owner": "alice"})
    demo = build_app(studio)
    port = free_port()
    launch(demo, host="127.0.0.1", port=port, block=False, quiet=True, mcp=args.mcp)
    try:
        yield Served(f"http://127.0.0.1:{port}/", studio, home)
    finally:
        demo.close()
        standin.stop()


def mcp_call(url: str, token: str | None, tool: str, arguments: dict) -> tuple[bool, str, list[str]]:
    """(is it an error, its text, the tools listed) for one MCP tool call, as an MCP client makes it."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def call() -> tuple[bool, str, list[str]]:
        async with streamablehttp_client(url + "gradio_api/mcp/", headers=headers) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = [t.name for t in (await session.list_tools()).tools]
                result = await session.call_tool(tool, arguments)
                return bool(result.isError), " ".join(getattr(c, "text", "") for c in result.content), tools

    return asyncio.run(call())


def test_mcp_tools_act_for_the_visitor_their_token_names(space):
    failed, text, tools = mcp_call(space.url, ALICE_TOKEN, "runs", {})
    endpoints = {"upload", "estimate", "preview", "start", "status", "runs", "stop", "resume", "chat"}
    assert endpoints | {"classify", "export", "publish"} <= set(tools)
    assert not failed and "run-a" in text
    failed, text, _ = mcp_call(space.url, BOB_TOKEN, "runs", {})
    assert not failed and "run-a" not in text
    failed, text, _ = mcp_call(space.url, BOB_TOKEN, "stop", {"run": "run-a"})
    assert failed and "run: 'run-a' is not a run in the runs folder" in text
    failed, text, _ = mcp_call(space.url, None, "start", {"settings": {}})
    assert failed and "start: sign in with Hugging Face" in text
    assert space.studio.runs() == [] and len(space.studio.as_visitor("alice").runs()) == 1


def test_anonymous_visitors_estimate_and_chat_with_a_base_model_but_do_not_train(space, tmp_path):
    from gradio_client import handle_file

    anonymous = space.client()
    line = refusal(lambda: anonymous.predict({"model": MODEL}, api_name="/start"))
    assert line.startswith("start: sign in with Hugging Face (the button at the top of the page) to train")
    line = refusal(lambda: anonymous.predict(handle_file(str(data_file(tmp_path))), api_name="/upload"))
    assert line.startswith("dataset: sign in with Hugging Face (the button at the top of the page) to upload data")
    estimate = anonymous.predict({"model": MODEL, "max_seq_length": 64}, "cpu", api_name="/estimate")
    assert estimate["total_bytes"] > 0
    with pytest.MonkeyPatch.context() as offline:  # the model from the Hub cache at once (this Hub has no models)
        from huggingface_hub import constants

        offline.setattr(constants, "HF_HUB_OFFLINE", True)
        reply = anonymous.predict("Hello", "base", None, {"model": MODEL}, 4, api_name="/chat")
    assert isinstance(reply, str) and reply.strip()
    signed = space.client(oauth_token=ALICE_TOKEN)  # an API client names itself with its Hub token
    assert [r["run"] for r in signed.predict(api_name="/runs")] == ["run-a"]


# ----------------------------------------------------------------------------------------------- the backend
def test_open_training_lets_anonymous_visitors_train_as_one_shared_identity(
    studio_home, tmp_path, tiny_model_dir, monkeypatch
):
    policy = AccessPolicy(public=True, open_training=True, allow_server_paths=True)  # the tiny model is a folder
    studio = Studio(studio_home / "runs", policy=policy)
    owners = []

    def record(config, run, owner, *args, **kwargs):
        owners.append(owner)
        return TrainingState(run_id=run.name, run_dir=str(run.path), status="loading")

    monkeypatch.setattr(studio.manager, "_launch", record)
    first, second = studio.as_visitor(None), studio.as_visitor(None)
    data = first.add_upload(data_file(tmp_path), "shared.jsonl")
    assert second.check({"dataset": data})[1] == {}  # one identity: one uploads folder
    first.start({"model": str(tiny_model_dir), "dataset": data, "max_steps": 2})
    assert owners == [ANONYMOUS]
    closed = Studio(studio_home / "runs", policy=AccessPolicy(public=True)).as_visitor(None)
    with pytest.raises(Exception, match="^start: log in"):
        closed.start({})


def test_old_uploads_no_run_uses_are_pruned(studio_home, tmp_path, tiny_model_dir):
    studio = Studio(studio_home / "runs", policy=AccessPolicy(public=True, uploads=UploadLimits(keep_days=7)))
    alice = studio.as_visitor("alice")
    used, unused, fresh = (alice.add_upload(data_file(tmp_path / n, f"{n}.jsonl")) for n in ("used", "old", "new"))
    files = {v: alice.uploads.resolve("alice", v) for v in (used, unused, fresh)}
    run = RunDir(build_run(studio_home / "runs" / "run-u", tiny_model_dir))
    run.write_config(run.load_config().replace(dataset=str(files[used])))  # a run trains on it: kept
    week_ago = time.time() - 8 * 86400
    for value in (used, unused):
        os.utime(files[value], (week_ago, week_ago))
    assert studio.prune_uploads() == [files[unused]]
    assert files[used].exists() and files[fresh].exists() and not files[unused].exists()


def test_space_id_outside_a_space_is_one_line_at_start(monkeypatch, capsys):
    from app import main

    monkeypatch.setenv("SPACE_ID", "alice/finetune-studio")
    monkeypatch.delenv("SYSTEM", raising=False)
    for name in ("OMP_WAIT_POLICY", "PYTORCH_CUDA_ALLOC_CONF"):  # main() sets these defaults: put them back after
        monkeypatch.setenv(name, os.environ.get(name, "PASSIVE" if name == "OMP_WAIT_POLICY" else "x"))
    with pytest.raises(SystemExit) as exit_info:
        main(["--port", str(free_port())])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert lines == [err.strip().splitlines()[-1]] and "SPACE_ID is set but this is not a Hugging Face Space" in err


def test_login_files_admins_and_limits_from_the_command_line(tmp_path, capsys):
    from app import parse_args

    logins = tmp_path / "logins.txt"
    logins.write_text("# the team\nalice:pw,1\n\nbob:pw:2\n", encoding="utf-8")
    args = parse_args(["--auth-file", str(logins), "--admin", "bob", "--keep-uploads-days", "0"], env={})
    assert args.auth == [("alice", "pw,1"), ("bob", "pw:2")] and args.policy.admins == {"bob"}
    assert args.policy.uploads.keep_days == 0
    env = {"FINETUNE_UPLOAD_MAX_MB": "5", "FINETUNE_UPLOADS_MAX_FILES": "2", "FINETUNE_OPEN_TRAINING": "1"}
    policy = parse_args(["--host", "0.0.0.0"], env=env).policy
    assert policy.uploads.file_bytes == 5 * MB and policy.uploads.count == 2 and policy.open_training
    for argv, expected in (
        (["--auth", "alice:pw", "--admin", "mallory"], "error: --admin: mallory is not a user of --auth"),
        (["--auth", "alice"], "error: --auth: expected user:password"),
        (["--upload-max-mb", "lots"], "error: --upload-max-mb: 'lots' is not a number"),
        (["--auth", "a:b", "--mcp"], "error: --mcp cannot be combined with --auth"),
    ):
        with pytest.raises(SystemExit):
            parse_args(argv, env={})
        err = capsys.readouterr().err
        assert err.startswith(expected) and err.count("\n") == 1, argv
