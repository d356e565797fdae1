"""The prompt Ollama would send for a Modelfile, rendered in Python for tests (there is no Go toolchain here).

What is reproduced, from Ollama's server and template code: the Modelfile's `SYSTEM` is put first when the
conversation's first message is not a system one; consecutive messages of one role are merged with a blank line;
`.System` is every system message joined by a blank line; `.Messages` keeps them all; `.Prompt` is the last user
message. Of Go's text/template only what our Modelfiles use is interpreted: text, `{{ .Field }}`, `{{ range .Messages
}}`, `{{ if .Field }}`, `{{ end }}` and the `{{-` / `-}}` whitespace trims. Anything else raises, so a template this
renderer cannot interpret fails the test instead of being approximated.
"""

from __future__ import annotations

import json
import re
from typing import Any

_ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)


def parse_modelfile(text: str) -> dict[str, Any]:
    """TEMPLATE, SYSTEM (None when absent) and the stop parameters of a Modelfile."""
    template = re.search(r'^TEMPLATE """(.*?)"""', text, re.S | re.M)
    system = re.search(r'^SYSTEM """(.*?)"""', text, re.S | re.M)
    stops = [json.loads(value) for value in re.findall(r"^PARAMETER stop (.+)$", text, re.M)]
    return {
        "template": template.group(1) if template else "{{ .Prompt }}",
        "system": system.group(1) if system else None,
        "stops": stops,
    }


def ollama_prompt(modelfile: str, messages: list[dict[str, str]]) -> str:
    """The prompt text Ollama renders for `messages` with this Modelfile (chat API, before tokenization)."""
    parsed = parse_modelfile(modelfile)
    if parsed["system"] and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": parsed["system"]}, *messages]
    collated: list[dict[str, str]] = []
    for message in messages:
        if collated and collated[-1]["role"] == message["role"]:
            collated[-1] = {**collated[-1], "content": collated[-1]["content"] + "\n\n" + message["content"]}
        else:
            collated.append(dict(message))
    values = {
        "System": "\n\n".join(m["content"] for m in messages if m["role"] == "system"),
        "Messages": collated,
        "Prompt": next((m["content"] for m in reversed(messages) if m["role"] == "user"), ""),
        "Response": "",
    }
    return render_go_template(parsed["template"], values)


def render_go_template(template: str, values: dict[str, Any]) -> str:
    """Render the subset of Go's text/template described above."""
    tokens = _tokens(template)
    nodes, rest = _parse(tokens, 0)
    if rest != len(tokens):
        raise ValueError("unbalanced {{ end }}")
    return _run(nodes, values)


def _tokens(template: str) -> list[tuple[str, str]]:
    """[('text', s) | ('action', s)], with the trim markers applied to the neighbouring text."""
    out: list[tuple[str, str]] = []
    pos = 0
    for match in _ACTION.finditer(template):
        text = template[pos : match.start()]
        if match.group(1):
            text = text.rstrip()
        out.append(("text", text))
        out.append(("action", match.group(2), bool(match.group(3))))  # type: ignore[arg-type]
        pos = match.end()
    out.append(("text", template[pos:]))
    for i, token in enumerate(out):  # a trailing `-}}` trims the whitespace that follows
        if token[0] == "action" and token[2] and i + 1 < len(out):  # type: ignore[misc]
            out[i + 1] = ("text", out[i + 1][1].lstrip())
    return out


def _parse(tokens: list, i: int) -> tuple[list, int]:
    nodes: list = []
    while i < len(tokens):
        token = tokens[i]
        if token[0] == "text":
            nodes.append(("text", token[1]))
            i += 1
            continue
        action = token[1]
        if action == "end":
            return nodes, i
        block = re.fullmatch(r"(range|if) \.(\w+)", action)
        if block:
            body, i = _parse(tokens, i + 1)
            if i >= len(tokens) or tokens[i][1] != "end":
                raise ValueError(f"{{{{ {action} }}}} without {{{{ end }}}}")
            nodes.append((block.group(1), block.group(2), body))
            i += 1
            continue
        field = re.fullmatch(r"\.(\w+)", action)
        if not field:
            raise ValueError(f"this renderer does not interpret {{{{ {action} }}}}")
        nodes.append(("field", field.group(1)))
        i += 1
    return nodes, i


def _run(nodes: list, scope: dict[str, Any]) -> str:
    out = []
    for node in nodes:
        if node[0] == "text":
            out.append(node[1])
        elif node[0] == "field":
            out.append(str(_lookup(scope, node[1])))
        elif node[0] == "if":
            if _lookup(scope, node[1]):
                out.append(_run(node[2], scope))
        else:  # range: the dot becomes each element
            out.extend(_run(node[2], {**item}) for item in _lookup(scope, node[1]))
    return "".join(out)


def _lookup(scope: dict[str, Any], name: str) -> Any:
    key = name if name in scope else name.lower()  # messages are {"role", "content"}; Go fields are capitalised
    if key not in scope:
        raise KeyError(f".{name} is not defined here")
    return scope[key]
