"""A public app (listening beyond 127.0.0.1, or a Space): what visitors may do is decided once at start-up
(finetune/access/policy.py) and enforced in the backend facade, so the page, the handlers and an API client
(gradio_client
against a served app) all get the same answers. Publishing on a Space uses the visitor's own OAuth token, against the
stand-in Hub; the server's HF_TOKEN is never lent unless the operator says so (and logs people in).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

import gradio as gr
import pytest

import finetune.publish.hub as hubmod
from finetune.access.policy import REFUSED, AccessPolicy
from finetune.config import BUNDLED_DATASET, EMBEDDED_MODEL, FIELD_NAMES
from finetune.engines.world import free_port
from finetune.errors import ConfigError, UserError
from finetune.runs.rundir import RunDir
from finetune.studio import Studio
from tests.hub_standin import HubStandin
from tests.run_fixtures import build_run
from tests.test_ui_support import STATE_S, api_client
from ui.app import build_app, launch

ALICE = "hf_" + secrets.token_hex(16)  # a visitor's token, as their Hugging Face sign-in hands it over
SERVER = "hf_" + secrets.token_hex(16)  # the operator's token: HF_TOKEN on the server (a Space secret)
ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------- helpers
def public_studio(home: Path, **switches: Any) -> Studio:
    return Studio(home / "runs", policy=AccessPolicy(public=True, **switches))


def form(**changes: Any) -> list[Any]:
    """The Configure form's values (defaults + changes) in field order, as the browser or an API client sends them."""
    values = {**Studio.default_values(), **changes}
    return [values[n] for n in FIELD_NAMES]


def named(**changes: Any) -> dict[str, Any]:
    """The same form keyed by field name, as the page hands it to a tab's handler."""
    return dict(zip(FIELD_NAMES, form(**changes), strict=True))


def field_errors(updates: list) -> dict[str, str]:
    """The visible field errors in a list of `ConfigTab.error_outputs` updates."""
    return {n: u["value"] for n, u in zip(FIELD_NAMES, updates, strict=False) if u.get("visible")}


def data_file(folder: Path, name: str = "tiny.jsonl", n: int = 12) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    rows = [{"prompt": f"Question {i}?", "completion": "Arr, matey!"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def hub(monkeypatch):
    """A stand-in Hub knowing alice's token and the operator's; HF_TOKEN on the server is the operator's."""
    from huggingface_hub import constants

    with HubStandin(tokens={ALICE: "alice", SERVER: "operator"}) as standin:
        monkeypatch.setenv("HF_ENDPOINT", standin.url)
        monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # only HF_ENDPOINT reaches the stand-in
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("HF_TOKEN", SERVER)
        monkeypatch.setattr(hubmod, "_stored_token", lambda: None)
        yield standin


@pytest.fixture(autouse=True)
def sign_in_as_alice(monkeypatch):
    """Gradio's sign-in off a Space: its login routes are mocked (no hf.co) and hand every browser that signs in the
    profile and OAuth token of the machine's own login. Here that login is alice with a test OAuth token."""
    import gradio.oauth

    info = {
        "access_token": ALICE,
        "token_type": "bearer",
        "scope": "openid profile write-repos manage-repos",
        "expires_at": int(time.time()) + 3600,
        "userinfo": {"preferred_username": "alice", "name": "Alice", "profile": "", "picture": ""},
    }
    monkeypatch.setattr(gradio.oauth, "_get_mocked_oauth_info", lambda: dict(info))


@pytest.fixture
def served():
    """Serve `build_app(studio)` on a free 127.0.0.1 port from this process; yields a function studio -> url."""
    demos = []

    def serve(studio: Studio, auth: tuple[str, str] | None = None) -> str:
        demo = build_app(studio)
        port = free_port()
        launch(demo, port=port, auth=auth, block=False, quiet=True)
        demos.append(demo)
        return f"http://127.0.0.1:{port}/"

    yield serve
    for demo in demos:
        demo.close()


def client(url: str, **kwargs: Any):
    """A gradio_client of a visitor; it does not send this machine's HF_TOKEN (the server's, in these tests) unless
    told: on a Space that token would name its owner as the visitor."""
    return api_client(url, **{"token": False, **kwargs})


# ----------------------------------------------------------------------------------------------- the policy
@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.1.1", "localhost", "::1", "[::1]", "LOCALHOST"])
def test_loopback_hosts_keep_the_local_apps_freedom(host):
    policy = AccessPolicy.decide(host, env={})
    assert not policy.public and policy.server_paths and policy.remote_code and policy.lend_server_token


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "my-box.example.org", ""])
def test_any_other_address_makes_the_app_public_and_locked(host):
    policy = AccessPolicy.decide(host, env={})
    assert policy.public and not policy.space
    assert not (policy.server_paths or policy.remote_code or policy.lend_server_token)


def test_a_space_is_public_with_hugging_face_sign_in_whatever_the_host():
    policy = AccessPolicy.decide("127.0.0.1", env={"SPACE_ID": "alice/finetune-studio"})
    assert policy.public and policy.space and not policy.lend_server_token


def test_operator_switches_from_flags_or_environment():
    env = {"FINETUNE_ALLOW_SERVER_PATHS": "1", "FINETUNE_ALLOW_REMOTE_CODE": "true"}
    policy = AccessPolicy.decide("0.0.0.0", env=env)
    assert policy.server_paths and policy.remote_code and not policy.lend_server_token
    policy = AccessPolicy.decide("0.0.0.0", env={}, allow_server_paths=True)
    assert policy.server_paths and not policy.remote_code


def test_lending_the_server_token_needs_auth(capsys):
    from app import parse_args

    with pytest.raises(ValueError, match="--lend-server-token .* needs --auth"):
        AccessPolicy.decide("0.0.0.0", env={}, lend_server_token=True)
    with pytest.raises(ValueError, match="needs --auth"):
        AccessPolicy.decide("0.0.0.0", env={"FINETUNE_LEND_SERVER_TOKEN": "1"})
    assert AccessPolicy.decide("0.0.0.0", env={}, auth=True, lend_server_token=True).lend_server_token

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--host", "0.0.0.0", "--lend-server-token"], env={})
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith("error: --lend-server-token") and err.count("\n") == 1 and "usage" not in err
    with pytest.raises(SystemExit):
        parse_args([], env={"SPACE_ID": "a/b", "FINETUNE_LEND_SERVER_TOKEN": "1"})
    args = parse_args(["--lend-server-token"], env={"SPACE_ID": "a/b", "FINETUNE_AUTH": "ann:pw"})
    assert args.policy.space and args.policy.lend_server_token
    assert not parse_args([], env={}).policy.public
    assert parse_args([], env={"GRADIO_SERVER_NAME": "0.0.0.0"}).policy.public


# ----------------------------------------------------------------------------------------------- server paths
def refused_models(tiny_model_dir: Path) -> list[str]:
    """Server paths, existing or not, and names the backend would read from disk instead of the Hub."""
    return [
        str(tiny_model_dir),  # a real model folder on the server
        str(tiny_model_dir / "no-such-model"),
        "/etc",
        "/no/such/folder",
        "~",
        "./model",
        "../model",
        "a/b/c",
        "finetune",  # a folder in the app's working directory (the backend would load it, not the Hub's)
        "tests/tiny.py",
        "embedded:../../etc",
    ]


def test_server_paths_as_model_get_one_message_whether_or_not_they_exist(studio_home, tiny_model_dir, monkeypatch):
    monkeypatch.chdir(ROOT)
    studio = public_studio(studio_home)
    messages = set()
    for value in refused_models(tiny_model_dir):
        config, problems = studio.check({"model": value})
        assert config is None and set(problems) == {"model"}, value
        messages.add(problems["model"])
        with pytest.raises(ConfigError) as exc_info:  # an API caller of Start / Estimate / Preview meets the same
            studio.config({"model": value})
        assert exc_info.value.field == "model"
    assert messages == {REFUSED["model"]}


def test_server_paths_as_data_get_one_message_whether_or_not_they_exist(studio_home, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    studio = public_studio(studio_home)
    real = data_file(tmp_path / "server")
    values = [
        str(real),
        str(real.with_name("missing.jsonl")),
        str(tmp_path),
        "/etc/passwd",
        "/no/such/data.csv",
        "~/.ssh/id_rsa",
        "../../secret.jsonl",
        "train.jsonl",  # Hub-shaped but a file name: the backend would read it from the working directory
        "README.md",  # exists in the working directory
        "bundled:../../etc",
        "bundled:pirate/../../x",
    ]
    messages = set()
    for value in values:
        config, problems = studio.check({"dataset": value})
        assert config is None and set(problems) == {"dataset"}, value
        messages.add(problems["dataset"])
    assert messages == {REFUSED["dataset"]}


def test_hub_ids_bundled_embedded_and_uploads_of_this_app_are_allowed(studio_home, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    studio = public_studio(studio_home)
    for model in ("HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2", EMBEDDED_MODEL):
        assert studio.check({"model": model})[1] == {}, model
    for dataset in (BUNDLED_DATASET, "tatsu-lab/alpaca", "imdb"):
        assert studio.check({"dataset": dataset})[1] == {}, dataset
    alice = studio.as_visitor("alice")
    upload = alice.add_upload(data_file(tmp_path / "browser"), "my data.jsonl")
    assert upload == "upload:my_data.jsonl"  # the field shows the file's name, never a server path
    assert alice.check({"dataset": upload, "eval_split": upload})[1] == {}
    # Another visitor naming it, or its path on the server: refused, as a name never uploaded is.
    kept = next(alice.uploads_dir.iterdir())
    bob = studio.as_visitor("bob")
    refusal = "dataset: 'upload:my_data.jsonl' is not one of your uploads; upload the file again"
    assert bob.check({"dataset": upload})[1] == {"dataset": refusal}
    assert alice.check({"dataset": "upload:never.jsonl"})[1]["dataset"].endswith(
        "is not one of your uploads; upload the file again"
    )
    assert bob.check({"dataset": str(kept)})[1] == {"dataset": REFUSED["dataset"]}
    assert studio.check({"dataset": upload})[1] == {"dataset": refusal}  # anonymous: no uploads at all


def test_split_fields_and_nvme_path_cannot_name_server_paths(studio_home):
    studio = public_studio(studio_home)
    for value in ("../../../home/user/secret", "/etc/x", "sub/split", "x.jsonl", "~/x"):
        assert studio.check({"dataset_split": value})[1] == {"dataset_split": REFUSED["dataset_split"]}, value
        assert studio.check({"eval_split": value})[1] == {"eval_split": REFUSED["eval_split"]}, value
    for value in ("train", "validation", "train[:10%]", "test"):
        assert studio.check({"dataset_split": value, "eval_split": value})[1] == {}, value
    assert studio.check({"eval_split": ""})[1] == {}
    assert studio.check({"nvme_path": "/mnt/nvme"})[1] == {"nvme_path": REFUSED["nvme_path"]}


def test_operator_switch_allows_server_paths(studio_home, tiny_model_dir, tmp_path):
    studio = public_studio(studio_home, allow_server_paths=True)
    data = data_file(tmp_path)
    assert studio.check({"model": str(tiny_model_dir), "dataset": str(data), "nvme_path": "/mnt/x"})[1] == {}
    assert "trust_remote_code" in studio.check({"trust_remote_code": True})[1]  # a separate switch


def test_the_local_app_keeps_its_freedom(studio_home, tiny_model_dir, tmp_path):
    studio = Studio(studio_home / "runs")
    data = data_file(tmp_path)
    values = {"model": str(tiny_model_dir), "dataset": str(data), "eval_split": str(data), "trust_remote_code": True}
    assert studio.check(values)[1] == {}


def test_trust_remote_code_is_refused_for_visitors_unless_the_operator_allows_it(studio_home, tiny_model_dir):
    studio = public_studio(studio_home)
    assert studio.check({"trust_remote_code": True})[1] == {"trust_remote_code": REFUSED["trust_remote_code"]}
    assert studio.check({"trust_remote_code": "yes"})[1] == {"trust_remote_code": REFUSED["trust_remote_code"]}
    assert public_studio(studio_home, allow_remote_code=True).check({"trust_remote_code": True})[1] == {}
    # A run started with it (by the operator, before the app went public) is not chatted with or resumed either.
    run = build_run(studio.manager.root / "run-code", tiny_model_dir, status="stopped")
    rd = RunDir(run)
    rd.write_config(rd.load_config().replace(trust_remote_code=True))
    owner = studio.as_visitor(rd.read_status()["owner"])  # the visitor whose run it is
    with pytest.raises(UserError, match="trust_remote_code: not available"):
        list(owner.chat("run-code", [{"role": "user", "content": "hi"}], None))
    with pytest.raises(UserError, match="trust_remote_code: not available"):
        owner.resume("run-code")
    assert rd.read_status()["status"] == "stopped"


def test_the_page_locks_what_visitors_cannot_use(studio_home):
    ui = build_app(public_studio(studio_home)).studio_ui
    remote = ui.config.fields["trust_remote_code"]
    assert remote.interactive is False and "Off in this public app" in remote.info
    assert "Files on the server are off" in ui.config.fields["dataset"].info
    assert ui.login is None  # no Hugging Face sign-in off a Space
    space = build_app(Studio(studio_home / "runs", policy=AccessPolicy(public=True, space=True))).studio_ui
    assert isinstance(space.login, gr.LoginButton)
    local = build_app(Studio(studio_home / "runs")).studio_ui
    assert local.login is None and local.config.fields["trust_remote_code"].interactive is not False


# ----------------------------------------------------------------------------------------------- the preview
def test_preview_answers_every_refused_path_with_the_same_neutral_message(studio_home, tmp_path, tiny_model_dir):
    ui = build_app(public_studio(studio_home)).studio_ui
    real = data_file(tmp_path / "server")
    answers = []
    for value in (str(real), str(real.with_name("missing.jsonl")), str(tmp_path), "/etc/passwd", "/no/such.csv"):
        html, *updates = ui.config.show_preview(**named(dataset=value))
        assert html == "" and field_errors(updates) == {"dataset": f"⚠ {REFUSED['dataset']}"}, value
        answers.append([html, *updates])
    assert all(a == answers[0] for a in answers)
    for value in (str(tiny_model_dir), "/no/such/model"):
        html, *updates = ui.config.show_preview(**named(model=value))
        assert field_errors(updates) == {"model": f"⚠ {REFUSED['model']}"}


def api_refusal(call: Any) -> str:
    """The one line an API call is refused with (gradio_client raises it as an AppError)."""
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as refused:
        call()
    return str(refused.value)


def test_an_api_client_is_held_to_the_same_rules(studio_home, tmp_path, served):
    studio = public_studio(studio_home, open_training=True)  # anonymous visitors may train: the data rules remain
    api = client(served(studio))
    real = data_file(tmp_path / "server")
    answers = [
        api_refusal(lambda v=value: api.predict({"dataset": v}, api_name="/preview"))
        for value in (str(real), str(real.with_name("missing.jsonl")), "/etc/passwd")
    ]
    assert answers == [REFUSED["dataset"]] * 3  # nothing of the file came back, nor whether it exists
    answers = [
        api.predict(*form(dataset=value), api_name="/preview_data")  # the page's own preview, called by name
        for value in (str(real), "/etc/passwd")
    ]
    assert answers[0] == answers[1] and REFUSED["dataset"] in json.dumps(answers[0], ensure_ascii=False)

    refusal = api_refusal(lambda: api.predict({"dataset": str(real)}, api_name="/start"))
    assert refusal.startswith("dataset: files on the server are not available")
    refusal = api_refusal(lambda: api.predict({"trust_remote_code": True}, api_name="/start"))
    assert refusal.startswith("trust_remote_code: not available")
    assert studio.state() is None and studio.runs() == []
    checked = api.predict(*form(model="/etc"), api_name="/check")
    assert REFUSED["model"] in json.dumps(checked, ensure_ascii=False)


# ----------------------------------------------------------------------------------------------- publishing
@pytest.fixture
def finished_run(studio_home, tiny_model_dir) -> str:
    """A finished run of alice's (the visitor whose sign-in hands over ALICE)."""
    run = RunDir(build_run(studio_home / "runs" / "run-a", tiny_model_dir))
    run.write_status({**run.read_status(), "owner": "alice"})
    return "run-a"


def oauth(token: str) -> gr.OAuthToken:
    return gr.OAuthToken(token=token, scope="openid profile write-repos manage-repos", expires_at=int(time.time()) + 60)


def space_ui(home: Path, **switches: Any):
    policy = AccessPolicy(public=True, space=True, **switches)
    return build_app(Studio(home / "runs", policy=policy)).studio_ui


def test_space_publish_uses_the_visitors_own_oauth_token(hub, studio_home, finished_run):
    ui = space_ui(studio_home)
    result, token_box = ui.publish.push(finished_run, "alice/pirate-lora", "", True, False, oauth(ALICE))
    assert result.startswith("✓ Pushed the adapter") and token_box == ""
    assert "README.md" in hub.repos["alice/pirate-lora"].files
    assert {r.authorized_as for r in hub.requests} == {"alice"}  # every call made with the visitor's token


def test_space_publish_never_lends_the_servers_token(hub, studio_home, finished_run):
    owned = hub.add_repo("operator/models")
    owned.files["README.md"] = b"the operator's own card"
    ui = space_ui(studio_home)
    for repo in ("operator/models", "alice/anything"):
        result, _ = ui.publish.push(finished_run, repo, "", False, False, None)
        assert result.startswith("⚠ token: sign in with Hugging Face") and "\n" not in result
    assert hub.requests == []  # nothing reached the Hub: HF_TOKEN was not used as a fallback
    # Signed in, a visitor can only write where their own token can: not the operator's repositories.
    result, _ = ui.publish.push(finished_run, "operator/models", "", False, False, oauth(ALICE))
    assert result.startswith("⚠") and hub.repos["operator/models"].files == {"README.md": b"the operator's own card"}
    assert "operator" not in {r.authorized_as for r in hub.requests}


def test_a_pasted_token_wins_over_the_sign_in(hub, studio_home, finished_run):
    hub.tokens["hf_bob_" + "x" * 20] = "bob"
    ui = space_ui(studio_home)
    result, _ = ui.publish.push(finished_run, "bob/lora", "hf_bob_" + "x" * 20, True, False, oauth(ALICE))
    pushes = [r for r in hub.requests if r.path != "/api/whoami-v2"]  # whoami: who signed in (alice)
    assert result.startswith("✓") and {r.authorized_as for r in pushes} == {"bob"}


def test_the_server_token_is_lent_only_with_the_operator_switch(hub, studio_home, finished_run):
    ui = space_ui(studio_home, operator_lends_token=True)
    result, _ = ui.publish.push(finished_run, "operator/lent", "", True, False, request=gr.Request(username="alice"))
    assert result.startswith("✓") and "operator/lent" in hub.repos
    local = build_app(Studio(studio_home / "runs")).studio_ui  # the local app: HF_TOKEN as before
    result, _ = local.publish.push(finished_run, "operator/local", "", True, False)
    assert result.startswith("✓") and "operator/local" in hub.repos


def test_a_login_alone_never_lends_the_servers_token(hub, studio_home, finished_run, served):
    """`app.py --host 0.0.0.0 --auth USER:PASSWORD`: a logged-in API client publishing without a token of its own is
    refused, and HF_TOKEN (the operator's) reaches no Hub; only `--lend-server-token` on top of the login lends it."""
    from app import parse_args

    login = ("alice", "pw-" + secrets.token_hex(4))  # the finished run is alice's
    args = parse_args(["--host", "0.0.0.0", "--auth", ":".join(login), "--runs-root", str(studio_home / "runs")], {})
    url = served(Studio(args.runs_root, policy=args.policy), auth=args.auth)
    api = client(url, auth=login)
    refusal = api_refusal(lambda: api.predict(finished_run, "operator/lent", "", True, False, api_name="/publish"))
    assert refusal.startswith("token:") and "does not lend the server's token" in refusal
    assert hub.requests == [] and "operator/lent" not in hub.repos
    lending = parse_args(["--host", "0.0.0.0", "--auth", ":".join(login), "--lend-server-token"], {})
    ui = build_app(Studio(args.runs_root, policy=lending.policy)).studio_ui
    result, _ = ui.publish.push(finished_run, "operator/lent", "", True, False, request=gr.Request(username="alice"))
    assert result.startswith("✓") and {r.authorized_as for r in hub.requests} == {"operator"}


def test_an_api_client_publishes_with_its_own_oauth_token(hub, studio_home, finished_run, served):
    url = served(Studio(studio_home / "runs", policy=AccessPolicy(public=True, space=True)))
    pushed = client(url, oauth_token=ALICE).predict(
        finished_run, "alice/api-lora", "", True, False, api_name="/publish"
    )
    assert pushed.endswith("alice/api-lora") and "alice/api-lora" in hub.repos
    before = len(hub.requests)
    refusal = api_refusal(lambda: client(url).predict(finished_run, "operator/api", api_name="/publish"))
    assert refusal.startswith("token: sign in") and len(hub.requests) == before


def test_a_signed_in_browser_publishes_and_trains_as_itself(hub, studio_home, finished_run, served, monkeypatch):
    import httpx

    from finetune.runs.progress import TrainingState

    studio = Studio(studio_home / "runs", policy=AccessPolicy(public=True, space=True))
    url = served(studio)
    # Sign in as a browser does: the login button's route, then the callback that stores the OAuth session.
    login = httpx.get(url + "login/huggingface", follow_redirects=False, timeout=STATE_S)
    callback = httpx.get(url.rstrip("/") + login.headers["location"], follow_redirects=False, timeout=STATE_S)
    session = callback.cookies.get("session")
    assert callback.status_code in (302, 307) and session
    browser = client(url, headers={"Cookie": f"session={session}"})
    pushed = browser.predict(finished_run, "alice/session-lora", "", True, False, api_name="/publish")
    assert pushed.endswith("alice/session-lora") and {r.authorized_as for r in hub.requests} == {"alice"}

    owners = []

    def record(config, run, owner, *args, **kwargs):
        owners.append(owner)
        return TrainingState(run_id=run.name, run_dir=str(run.path), status="loading")

    monkeypatch.setattr(studio.manager, "_launch", record)
    assert browser.predict({}, api_name="/start")["status"] == "loading"
    assert owners == ["alice"]  # the run is hers
    refusal = api_refusal(lambda: client(url).predict(finished_run, "alice/anon", api_name="/publish"))
    assert refusal.startswith("token: sign in")  # a browser that did not sign in has no token to lend


# ----------------------------------------------------------------------------------------------- bounded input
def test_a_chat_message_beyond_the_limit_is_refused_in_one_line_before_any_model_loads(studio_home, monkeypatch):
    from finetune import studio as studio_mod

    studio = Studio(studio_home / "runs")
    ui = build_app(studio).studio_ui
    monkeypatch.setattr(studio, "_chat_model", lambda *a: pytest.fail("no model may load for refused input"))
    long = "y" * (studio_mod.CHAT_MESSAGE_LIMIT + 1)
    steps = list(ui.chat.respond(long, [], [], "base", False, 64, 0.0, 1.0, "", **named()))
    assert len(steps) == 1
    _, history, _ = steps[0]
    assert len(history) == 1 and history[0]["role"] == "assistant"  # the long text did not join the conversation
    text = history[0]["content"]
    assert text.startswith("⚠️ message:") and "too long" in text and "\n" not in text and len(text) < 200

    big_history = [{"role": "user", "content": "z" * 7000}, {"role": "assistant", "content": "ok"}] * 10
    _, history, _ = list(ui.chat.respond("hi", big_history, [], "base", False, 64, 0, 1, "", **named()))[-1]
    assert history[-1]["content"].startswith("⚠️ chat: the conversation is") and len(history) == 21
    for tokens in (10**9, 0, "lots"):
        _, history, _ = list(ui.chat.respond("hi", [], [], "base", False, tokens, 0, 1, "", **named()))[-1]
        assert history[-1]["content"].startswith("⚠️ max new tokens:"), tokens
    _, history, _ = list(ui.chat.respond("hi", [], [], "base", False, 8, 0, 1, "s" * 9000, **named()))[-1]
    assert history[-1]["content"].startswith("⚠️ system prompt:")
    with pytest.raises(UserError, match="message: .* too long"):  # the backend refuses an API caller the same way
        list(studio.chat("base", [{"role": "user", "content": long}], None))


def test_field_text_beyond_the_limit_is_refused_naming_the_field(studio_home):
    ui = build_app(Studio(studio_home / "runs")).studio_ui
    errors = field_errors(ui.config.check(**named(model="m" * 100_000, prompt_column="c" * 100_000)))
    assert set(errors) == {"model", "prompt_column"}
    assert all("\n" not in e and len(e) < 300 and "too long" in e for e in errors.values())


def test_upload_yaml_goes_through_the_backends_bounded_parser(studio_home, tmp_path, monkeypatch):
    studio = Studio(studio_home / "runs")
    ui = build_app(studio).studio_ui
    parsed = []
    real = studio.config_from_yaml
    monkeypatch.setattr(studio, "config_from_yaml", lambda text: parsed.append(text) or real(text))
    bomb = tmp_path / "bomb.yaml"
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']  # each level 9 x the last: 9^9 strings at `model`
    lines += [f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
    bomb.write_text("\n".join(lines) + "\nmodel: *i\n", encoding="utf-8")
    t0 = time.perf_counter()
    out = ui.config.load(str(bomb))
    assert time.perf_counter() - t0 < 1.0
    assert parsed and all(u == {"__type__": "update"} for u in out[: len(FIELD_NAMES)])  # the form is unchanged
    summary = out[-1]
    assert summary.startswith("⚠ config:") and "\n" not in summary and len(summary) < 300


# ----------------------------------------------------------------------------------------------- Check = Start
def check_and_start(ui, studio, values: list) -> tuple[tuple[bool, set], tuple[bool, set]]:
    """(ok, fields with errors) for Check and for Start on the same form (Start's launch is recorded, not run)."""
    by_name = dict(zip(FIELD_NAMES, values, strict=True))
    updates = ui.config.check(**by_name)
    check = (updates[-1].startswith("✓"), set(field_errors(updates)))
    out = ui.train.start(None, **by_name)  # {component: update}
    shown = {n for n, c in ui.config.errors.items() if isinstance(out.get(c), dict) and out[c].get("visible")}
    start = (out[ui.train.message].startswith("▶"), shown)
    return check, start


def test_check_gives_the_same_verdict_as_start(studio_home, tmp_path, tiny_model_dir, monkeypatch):
    from finetune.runs.progress import TrainingState

    studio = Studio(studio_home / "runs")
    ui = build_app(studio).studio_ui
    launched = []

    def record(config, run, *args, **kwargs):
        launched.append(run.name)
        return TrainingState(run_id=run.name, run_dir=str(run.path), status="loading")

    monkeypatch.setattr(studio.manager, "_launch", record)
    data = data_file(tmp_path)
    (tmp_path / "empty.jsonl").write_text("", encoding="utf-8")
    build_run(studio.manager.root / "taken", tiny_model_dir)
    (studio.manager.root / "my-stuff").mkdir()
    (studio.manager.root / "my-stuff" / "notes.txt").write_text("mine", encoding="utf-8")
    base = {"model": str(tiny_model_dir), "dataset": str(data), "eval_split": ""}
    cases = {
        "good": {},
        "missing data file": {"dataset": str(tmp_path / "nope.jsonl")},
        "empty data file": {"dataset": str(tmp_path / "empty.jsonl")},
        "missing model folder": {"model": str(tmp_path / "no-model")},
        "run name that is a run": {"output_dir": "taken"},
        "run name with a folder of files": {"output_dir": "my-stuff"},
        "run name with a path": {"output_dir": "../escape"},
        "bad number": {"max_steps": -5},
    }
    for name, changes in cases.items():
        check, start = check_and_start(ui, studio, form(**{**base, **changes}))
        assert check[0] == start[0], name
        assert check[0] == (name == "good"), name
        if name != "good":
            assert check[1] and check[1] <= start[1] | {"config"}, name
    assert len(launched) == 1


# ----------------------------------------------------------------------------------------------- runs by id
def test_an_api_client_can_resume_and_chat_with_any_run_by_its_id(studio_home, tiny_model_dir, served, monkeypatch):
    studio = Studio(studio_home / "runs")
    url = served(studio)  # the page was built before the run existed: no dropdown of any session lists it
    build_run(studio.manager.root / "run-late", tiny_model_dir)
    api = client(url)
    refusal = api_refusal(lambda: api.predict("run-late", api_name="/resume"))
    assert refusal.startswith("resume: run-late already completed")  # the backend answered, not the dropdown
    assert api_refusal(lambda: api.predict("../etc", api_name="/resume")).startswith("run: '../etc' is not a run")

    asked = []

    def fake_chat(source, messages, settings, base_values=None):
        asked.append(source)
        yield f"Arr from {source}"

    monkeypatch.setattr(studio, "chat", fake_chat)
    assert api.predict(message="Hello?", run="run-late", api_name="/chat") == "Arr from run-late"
    assert asked == ["run-late"]
    refusal = api_refusal(lambda: api.predict("no-such-run", "alice/x", "hf_" + "z" * 30, api_name="/publish"))
    assert refusal.startswith("run: 'no-such-run' is not a run")


def test_run_ids_stay_confined_to_the_runs_folder(studio_home):
    studio = public_studio(studio_home)
    for bad in ("../etc", "/etc", "a\x00b", "r" * 5000, "", ".."):
        with pytest.raises(UserError, match="^run: ") as exc_info:
            studio.events(bad)
        assert str(studio_home) not in str(exc_info.value)  # no server paths in what visitors read


# ----------------------------------------------------------------------------------------------- files
def test_download_yaml_leaves_no_temp_folders(studio_home, tmp_path, monkeypatch):
    import tempfile

    from finetune import studio as studio_mod

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    studio = Studio(studio_home / "runs")
    ui = build_app(studio).studio_ui
    paths = [ui.config.save(**named(max_steps=n))[0]["value"] for n in (10, 10, 20)]
    assert list(scratch.iterdir()) == []
    assert paths[0] == paths[1] != paths[2] and {Path(p).name for p in paths} == {"run.yaml"}
    assert sorted(p.name for p in studio.downloads_dir.iterdir()) == sorted({Path(p).parent.name for p in paths})
    assert "max_steps: 20" in Path(paths[2]).read_text(encoding="utf-8")
    old = time.time() - studio_mod.DOWNLOAD_KEEP_SECONDS - 60
    os.utime(paths[0], (old, old))
    ui.config.save(**named(max_steps=30))
    assert not Path(paths[0]).exists() and Path(paths[2]).exists()


def test_two_uploads_never_overwrite_each_other(studio_home, tmp_path):
    studio = Studio(studio_home / "runs")
    ui = build_app(studio).studio_ui
    first = data_file(tmp_path / "a", "data.jsonl", n=3)
    second = data_file(tmp_path / "b", "data.jsonl", n=5)
    kept = [ui.config.use_data_file(str(p))[0] for p in (first, second)]
    assert kept == ["upload:data.jsonl", "upload:data-2.jsonl"]  # the same name twice: both kept
    files = [studio.uploads.resolve(studio.identity, value) for value in kept]
    assert files[0].read_bytes() == first.read_bytes() and files[1].read_bytes() == second.read_bytes()


def test_an_upload_beyond_the_limit_is_refused_in_the_backend(studio_home, tmp_path):
    from finetune.access.uploads import MB, UploadLimits

    data = data_file(tmp_path)
    size = data.stat().st_size
    studio = Studio(studio_home / "runs", policy=AccessPolicy(uploads=UploadLimits(file_mb=(size - 1) / MB)))
    with pytest.raises(UserError, match=f"^dataset: tiny.jsonl is {size:,} bytes, more than the {size - 1:,} bytes"):
        studio.add_upload(data)
    with pytest.raises(UserError, match="^dataset: .* is not a"):
        studio.add_upload(data_file(tmp_path, "x.exe"))
    assert not studio.uploads_dir.exists() or list(studio.uploads_dir.iterdir()) == []
