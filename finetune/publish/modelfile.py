"""The Ollama Modelfile beside an exported GGUF: the prompt Ollama builds must be the prompt the model was trained on.

    modelfile_text(model_dir, gguf_name) -> str      FROM / TEMPLATE / SYSTEM / PARAMETER stop / temperature
    default_system_prompt(model_dir) -> str | None   what the chat template inserts when a conversation has none

Ollama does not run the Jinja chat template: it renders the Modelfile's Go `TEMPLATE` over the messages, with the
Modelfile's `SYSTEM` put first when a conversation has no system message. A chat template that inserts a default
system prompt (SmolLM2's does) trained every example with it, so the Modelfile carries it as `SYSTEM`. The ChatML
template is written only when the tokenizer's own template renders exactly ChatML for a user-only and a system+user
conversation; any other template gets a plain fallback and a comment saying so. transformers is imported inside.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DEFAULT_TEMPERATURE = 0.7
CHATML_TEMPLATE = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
)
CHATML_STOPS = ("<|im_end|>", "<|im_start|>")
FALLBACK_TEMPLATE = "{{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}"
# Probe texts: nothing a template would add or change on its own.
_USER_PROBE = "Probe question 7?"
_SYSTEM_PROBE = "Probe system text 3."


def modelfile_text(model_dir: Path, gguf_name: str) -> str:
    """An Ollama Modelfile for the GGUF beside it: its chat template in Go-template form, stop tokens, temperature."""
    tokenizer = _tokenizer(model_dir)
    system = default_system_prompt(model_dir, tokenizer)
    chatml = _renders_chatml(tokenizer, system)
    stops = list(CHATML_STOPS) if chatml else []
    if tokenizer.eos_token and tokenizer.eos_token not in stops:
        stops.append(tokenizer.eos_token)
    lines = [f"FROM ./{gguf_name}", ""]
    if chatml:
        lines.append(f'TEMPLATE """{CHATML_TEMPLATE}"""')
    else:
        lines += [
            "# The chat template is not plain ChatML, which is the form this exporter translates; this plain template",
            "# sends the prompt as is. Replace it with the Go-template form of the model's chat template (the",
            "# original Jinja template is embedded in the GGUF as tokenizer.chat_template).",
            f'TEMPLATE """{FALLBACK_TEMPLATE}"""',
        ]
    if system:
        lines += [
            "# The chat template's default system prompt: every training conversation without its own system",
            "# message carried it, so Ollama sends it too.",
            f'SYSTEM """{system}"""',
        ]
    lines += [f"PARAMETER stop {json.dumps(stop)}" for stop in stops]
    lines.append(f"PARAMETER temperature {_temperature(model_dir)}")
    return "\n".join(lines) + "\n"


def default_system_prompt(model_dir: Path, tokenizer: Any = None) -> str | None:
    """The system prompt the chat template inserts into a conversation that has none, or None."""
    tokenizer = tokenizer or _tokenizer(model_dir)
    if not tokenizer.chat_template:
        return None
    user = [{"role": "user", "content": _USER_PROBE}]
    try:
        bare = _render(tokenizer, user)
        with_system = _render(tokenizer, [{"role": "system", "content": _SYSTEM_PROBE}, *user])
    except Exception:  # noqa: BLE001 - a template that refuses a system message has no default to find
        return None
    if with_system.count(_SYSTEM_PROBE) != 1:
        return None
    before, after = with_system.split(_SYSTEM_PROBE)
    inside = len(bare) - len(before) - len(after)
    if inside <= 0 or not (bare.startswith(before) and bare.endswith(after)):
        return None
    return bare[len(before) : len(bare) - len(after)]


def chatml(messages: list[dict[str, str]]) -> str:
    """What CHATML_TEMPLATE renders for these messages (ready for the assistant's turn)."""
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


def _renders_chatml(tokenizer: Any, system: str | None) -> bool:
    """True when the tokenizer's template renders exactly ChatML for a user-only and a system+user conversation."""
    if not tokenizer.chat_template:
        return False
    user = {"role": "user", "content": _USER_PROBE}
    given = {"role": "system", "content": _SYSTEM_PROBE}
    implied = [{"role": "system", "content": system}] if system else []
    try:
        return _render(tokenizer, [user]) == chatml([*implied, user]) and _render(tokenizer, [given, user]) == chatml(
            [given, user]
        )
    except Exception:  # noqa: BLE001 - a template that cannot render these is not ChatML
        return False


def _render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def _temperature(model_dir: Path) -> float:
    """The model's own sampling temperature when it sets one, else a common default."""
    try:
        data = json.loads((Path(model_dir) / "generation_config.json").read_text(encoding="utf-8"))
        return float(data.get("temperature") or DEFAULT_TEMPERATURE)
    except (OSError, ValueError, TypeError):
        return DEFAULT_TEMPERATURE
