"""Popular models without a download: the bundled `config.json` of the models people fine-tune most.

Each file in `finetune/bundled/models/` is the architecture of one Hub model (`owner--name.json`), written from the
published values (sizes, layers, heads, vocabulary, context, tied embeddings, dtype); its parameter count under the
meta device matches the published size (tests/test_catalogue.py). It lets the estimator answer for
`meta-llama/Llama-3.1-8B` and the others offline, for gated repositories, and in well under a second. Rope scaling
tables that do not change memory (Phi-3.5's longrope factors) are left out. A vision-language model's file is its
whole config.json (text_config, vision_config, the image settings: SmolVLM's scale_factor, Qwen-VL's patch and merge
sizes, Gemma 3's mm_tokens_per_image), so that it is detected as one and its image tokens are counted offline.

Also here: the common GPU cards and the memory a program can use on each (what the Start and Memory tabs offer, and
what a proposal names when a run needs a larger card); and whether the Hugging Face Hub can be reached, asked once
with a short timeout, so that an unknown id fails in seconds when the machine is offline instead of after the Hub
client's retries.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from finetune.paths import BUNDLED

BUNDLED_MODELS = BUNDLED / "models"

# Memory a process can allocate on common cards, in GiB, smallest first (torch.cuda.get_device_properties()
# .total_memory; the marketing size in the name is decimal GB and includes memory the driver keeps). The consumer
# cards' figures are about what such a card reports, rounded down.
GPU_CARDS: dict[str, float] = {
    "RTX 4060 (8 GB)": 7.6,
    "RTX 3080 (10 GB)": 9.6,
    "RTX 3060 (12 GB)": 11.6,
    "T4 (16 GB)": 14.7,
    "RTX 4080 (16 GB)": 15.6,
    "V100 (16 GB)": 15.8,
    "L4 (24 GB)": 22.0,
    "A10G (24 GB)": 22.0,
    "RTX 4090 (24 GB)": 23.6,
    "RTX 3090 (24 GB)": 23.7,
    "V100 (32 GB)": 31.7,
    "A100 (40 GB)": 39.4,
    "L40S (48 GB)": 44.4,
    "A6000 (48 GB)": 47.5,
    "A100 (80 GB)": 79.1,
    "H100 (80 GB)": 79.1,
    "H200 (141 GB)": 139.8,
}
HUB_HOST = "huggingface.co"
REACH_TIMEOUT = 3.0  # seconds to resolve and connect to the Hub before calling it unreachable
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
SIZE_IN_NAME = r"(\d+(?:\.\d+)?)([BM])\b"  # the parameter count a Hub name carries (8B, 256M)
REACH_TTL = 60.0  # seconds an answer is reused (the form asks on every edit)
_reach: dict[str, tuple[float, bool]] = {}
_reach_lock = threading.Lock()


def _file_name(model_id: str) -> str:
    """`owner/name` as the bundled file's stem."""
    return model_id.replace("/", "--")


@lru_cache(maxsize=1)
def _index() -> dict[str, Path]:
    """Lower-cased Hub id -> bundled config file (Hub ids are case-insensitive)."""
    return {p.stem.replace("--", "/").lower(): p for p in sorted(BUNDLED_MODELS.glob("*.json"))}


def names() -> list[str]:
    """The bundled Hub ids, as the Hub spells them, families together and small sizes first."""
    ids = [p.stem.replace("--", "/") for p in _index().values()]
    return sorted(ids, key=_sort_key)


def _sort_key(model_id: str) -> tuple:
    """Family, text models before vision-language ones, version, size in parameters (from the name; last when the
    name has none), then the name."""
    import re

    family, name = model_id.split("/", 1)
    match = re.search(SIZE_IN_NAME, name, re.IGNORECASE)
    size = float(match.group(1)) * (1e-3 if match.group(2).upper() == "M" else 1.0) if match else float("inf")
    version = re.findall(r"\d+(?:\.\d+)?", re.sub(SIZE_IN_NAME, "", name, flags=re.IGNORECASE))
    return (family.lower(), "VL" in name, version[0] if version else "", size, model_id.lower())


def bundled_path(model_id: str) -> Path | None:
    """The bundled config.json for a Hub id, or None when the catalogue does not hold it."""
    return _index().get(str(model_id).strip().lower())


def config_values(model_id: str) -> dict[str, Any] | None:
    """The bundled config.json of a Hub id as a dict, or None."""
    path = bundled_path(model_id)
    return json.loads(path.read_text(encoding="utf-8")) if path else None


def load_config(model_id: str) -> Any | None:
    """The transformers config of a bundled Hub id (no network), or None when the catalogue does not hold it."""
    values = config_values(model_id)
    if values is None:
        return None
    from transformers import AutoConfig

    config = AutoConfig.for_model(**values)
    config.name_or_path = bundled_path(model_id).stem.replace("--", "/")  # type: ignore[union-attr]
    return config


def hub_reachable(timeout: float = REACH_TIMEOUT) -> bool:
    """Whether the Hub answers a TCP connection within `timeout` seconds (False at once when HF_HUB_OFFLINE=1).

    The answer is kept for a minute: a form asks on every edit, and a machine seldom changes networks."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        return True  # through a proxy a direct connection proves nothing: the Hub client decides
    host, port = _hub_address()
    with _reach_lock:
        seen = _reach.get(host)
        if seen and time.monotonic() - seen[0] < REACH_TTL:
            return seen[1]
    answer = _connects(host, port, timeout)
    with _reach_lock:
        _reach[host] = (time.monotonic(), answer)
    return answer


def _hub_address() -> tuple[str, int]:
    """The Hub's host and port: HF_ENDPOINT when set (a mirror), else HUB_HOST on 443."""
    from urllib.parse import urlsplit

    endpoint = os.environ.get("HF_ENDPOINT", "").strip()
    if not endpoint:
        return HUB_HOST, 443
    parts = urlsplit(endpoint if "//" in endpoint else f"https://{endpoint}")
    return parts.hostname or HUB_HOST, parts.port or (80 if parts.scheme == "http" else 443)


def _connects(host: str, port: int, timeout: float) -> bool:
    """Resolve and connect within `timeout` seconds in total (name lookup has no timeout of its own: a thread)."""
    box: list[bool] = []

    def attempt() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                box.append(True)
        except OSError:
            box.append(False)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout)
    return bool(box and box[0])


def forget_reachability() -> None:
    """Ask the network again next time (tests, or after the user says the network is back)."""
    with _reach_lock:
        _reach.clear()


def is_hub_id(name: str) -> bool:
    """`owner/name` or `name` that is not a local path (what `from_pretrained` would look up on the Hub)."""
    text = str(name).strip()
    if not text or text.startswith((".", "/", "~", "embedded:")) or Path(text).expanduser().exists():
        return False
    return text.count("/") <= 1 and " " not in text
