"""Shared helpers for the bench scripts: the test model and data, the machine record, statistics, tables, results.

Every script measures ours against a baseline in the same run, alternating, and reports ratios of medians: this
machine is shared (other jobs run at the same time), so absolute figures wander while ratios hold better.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

# One long, deterministic answer text: every example is cut at max_seq_length, so every row has the same length.
_WORDS = (
    "arr matey the sea be wide and the wind be strong so hoist the sails and steer for the horizon where the "
    "treasure lies buried under the old palm tree guarded by parrots and a crew of salty dogs who sing shanties "
    "all night long about storms and gold and the captain who never sleeps"
).split()


# ----------------------------------------------------------------------------- environment
def child_env(**extra: str) -> dict[str, str]:
    """The environment every measured process gets (ours and the baseline alike): offline, quiet, repo importable."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_NO_ADVISORY_WARNINGS="1",
        TOKENIZERS_PARALLELISM="false",
        GRADIO_ANALYTICS_ENABLED="False",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
    )
    env.update(extra)
    return env


def set_offline() -> None:
    """Call before importing transformers in-process."""
    for key, value in child_env().items():
        if key != "PYTHONPATH":
            os.environ.setdefault(key, value)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def loadavg() -> tuple[float, float, float]:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())  # type: ignore[return-value]
    except OSError:
        return (0.0, 0.0, 0.0)


def machine() -> dict[str, Any]:
    """Where and when the figures were taken."""
    info: dict[str, Any] = {
        "date": _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "host": socket.gethostname(),
        "nproc": os.cpu_count(),
        "loadavg": loadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import importlib.metadata as md

        info["versions"] = {
            name: md.version(name)
            for name in ("torch", "transformers", "peft", "accelerate", "datasets", "gradio", "gradio_client")
            if _installed(name)
        }
    except Exception:  # the record is a help, never a failure
        pass
    return info


def _installed(name: str) -> bool:
    import importlib.metadata as md

    try:
        md.version(name)
        return True
    except md.PackageNotFoundError:
        return False


def command_line() -> str:
    return " ".join(shlex.quote(a) for a in [".venv/bin/python", *sys.argv])


# ----------------------------------------------------------------------------- the test model and data
def embedded_tokenizer_dir() -> Path:
    """The embedded SmolLM2 directory (tokenizer + weights), converted from the shipped GGUF once."""
    set_offline()
    from finetune.model.loading import ensure_embedded_model

    return ensure_embedded_model()


def load_tokenizer(kind: str, scratch: Path) -> Any:
    """`embedded`: SmolLM2's real tokenizer (vocab 49152). `tiny`: the tests' 384-token BPE with a ChatML template."""
    set_offline()
    from transformers import AutoTokenizer

    if kind == "embedded":
        return AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    if kind == "tiny":
        from tests.tiny import build_tokenizer

        path = scratch / "tiny-tokenizer"
        path.mkdir(parents=True, exist_ok=True)
        return build_tokenizer(path)
    raise ValueError(f"tokenizer: {kind!r}; use embedded or tiny")


def build_llama(
    path: Path,
    tokenizer: Any,
    layers: int = 4,
    hidden: int = 256,
    intermediate: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    dtype: str = "float32",
    max_positions: int = 2048,
    vocab: int | None = None,
) -> Path:
    """A random-initialised Llama-shaped model built from a config, saved with `tokenizer` to `path`.

    `vocab`: the model's vocabulary when it should differ from the tokenizer's (a small tokenizer's ids fit a larger
    vocabulary, so the logits keep a realistic size without the real tokenizer)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = heads or max(1, hidden // 64)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=max(vocab or 0, len(tokenizer)),
        hidden_size=hidden,
        intermediate_size=intermediate or hidden * 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        max_position_embeddings=max_positions,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=True,
    )
    if dtype != "float32":
        torch.set_default_dtype(getattr(torch, dtype))
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(torch.float32)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def parameter_count(path: Path) -> int:
    """Parameters stored in a model directory's safetensors files."""
    from safetensors import safe_open

    total = 0
    for file in Path(path).glob("*.safetensors"):
        with safe_open(str(file), "pt") as fh:
            for key in fh.keys():
                n = 1
                for dim in fh.get_slice(key).get_shape():
                    n *= int(dim)
                total += n
    return total


def write_rows(path: Path, n: int, words: int = 160) -> Path:
    """`n` prompt/completion rows as JSON lines; every completion is long enough to be cut at max_seq_length."""
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            prompt = f"Question {i}: tell me a sea story number {i}, in pirate speak."
            start = (i * 7) % len(_WORDS)
            answer = " ".join(_WORDS[(start + k) % len(_WORDS)] for k in range(words))
            fh.write(json.dumps({"prompt": prompt, "completion": answer}) + "\n")
    return path


def train_here(config: Any, owner: str) -> tuple[list[dict[str, Any]], int]:
    """Train `config` in this process as `python -m finetune train` does (a RunManager and its training thread); its
    events and the peak memory (CUDA max allocated on a GPU, the process's max RSS on a CPU). For worker processes."""
    import resource

    import torch

    from finetune.runs.manager import RunManager

    out = Path(config.output_dir)
    manager = RunManager(out.parent / f"{out.name}-root")
    manager.start(config, owner=owner)
    final = manager.wait()
    if final is None or final.status != "completed":
        raise SystemExit(f"ours: run ended {final.status if final else '?'}: {final.error if final else ''}")
    events = [json.loads(line) for line in (out / "events.jsonl").read_text(encoding="utf-8").splitlines()]
    if torch.cuda.is_available():
        return events, int(torch.cuda.max_memory_allocated())
    return events, int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


# ----------------------------------------------------------------------------- statistics and output
def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(p / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table (readable in a terminal, and as-is in results/*.md)."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
        return str(v)

    text = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in text)) if text else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)) + " |"  # noqa: E731
    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in text]
    return "\n".join(out)


class Report:
    """Collects what a script prints; `save` writes it with the date, the machine and the exact command."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []
        self.started = machine()

    def print(self, text: str = "") -> None:
        print(text, flush=True)
        self.parts.append(text)

    def save(self, out: str | None, headline: str) -> Path | None:
        if not out:
            return None
        path = Path(out)
        if path.is_dir() or not path.suffix:
            path.mkdir(parents=True, exist_ok=True)
            path = path / f"{self.title}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        end = machine()
        started = self.started
        body = [
            f"# {self.title}",
            "",
            f"**Headline:** {headline}",
            "",
            f"- date: {started['date']}",
            f"- machine: {started.get('cpu', '?')}, nproc {started['nproc']}, {started['platform']}, "
            f"Python {started['python']}",
            f"- load average (1/5/15 min) at start {started['loadavg']}, at end {end['loadavg']}",
            f"- versions: {', '.join(f'{k} {v}' for k, v in started.get('versions', {}).items())}",
            f"- command: `{command_line()}`",
            "",
            "```",
            *self.parts,
            "```",
            "",
        ]
        path.write_text("\n".join(body), encoding="utf-8")
        return path

    def finish(self, out: str | None, headline: str) -> str:
        """Save the report (if asked), then print the headline as the script's last line."""
        saved = self.save(out, headline)
        if saved:
            print(f"saved {saved}")
        print(headline, flush=True)
        return headline


class CpuSampler:
    """Samples a process's CPU time (all its threads, from /proc/PID/stat) every `interval` in a thread."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        import threading

        self.pid = pid
        self.samples: list[tuple[float, float]] = []  # (wall time, CPU seconds so far)
        self._done = threading.Event()
        self._interval = interval
        self._tick = os.sysconf("SC_CLK_TCK")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        path = f"/proc/{self.pid}/stat"
        while not self._done.is_set():
            try:
                with open(path, encoding="utf-8") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                self.samples.append((time.time(), (int(fields[11]) + int(fields[12])) / self._tick))
            except (OSError, IndexError, ValueError):
                pass
            self._done.wait(self._interval)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def cpu_at(self, when: float, default: float | None = None) -> float:
        """CPU seconds the process had used at wall time `when` (linear between samples)."""
        pts = self.samples
        if not pts or when <= pts[0][0]:
            return pts[0][1] if pts else 0.0
        for (ta, ca), (tb, cb) in zip(pts, pts[1:], strict=False):
            if ta <= when <= tb:
                return ca + (cb - ca) * ((when - ta) / (tb - ta) if tb > ta else 0.0)
        return pts[-1][1] if default is None else default


class Measured:
    """A child process run to its end while its CPU time is sampled (`cpu_at`); `cpu` is its total CPU time."""

    def __init__(self, cmd: list[str], env: dict[str, str], cwd: Path = ROOT, interval: float = 0.02) -> None:
        import resource

        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.t0 = time.time()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sampler = CpuSampler(proc.pid, interval)
        self.stdout, self.stderr = proc.communicate()
        self.t1 = time.time()
        sampler.stop()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.sampler = sampler
        self.returncode = proc.returncode
        self.wall = self.t1 - self.t0
        self.cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    def cpu_at(self, when: float) -> float:
        return self.sampler.cpu_at(when, default=self.cpu)


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, interval: float = 0.02) -> float:
    """Poll `url` until it answers 200; returns the time it first did. Fails if `proc` exits first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before serving {url}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    response.read()
                    return time.time()
        except OSError:
            pass
        time.sleep(interval)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f}s")


def stop_process(proc: subprocess.Popen, timeout: float = 10) -> None:
    """End a process we started: terminate, then kill if it does not go."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def plain_parser(description: str, data_help: str, max_seq_length: int, max_steps: int) -> argparse.ArgumentParser:
    """The command line of a plain TRL baseline script (model, data, output folder, length, batch, steps, timing)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True, help=data_help)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--max-seq-length", type=int, default=max_seq_length)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=max_steps)
    parser.add_argument("--timing", help="write step timestamps to this JSON file")
    return parser


def step_timing(timing: dict[str, Any]) -> Any:
    """A Trainer callback that fills `timing` (measurement only, not something a user would write): when training
    begins, each logged step as [step, time, loss, real tokens seen so far], when it ends, the tokens seen."""
    from transformers import TrainerCallback

    class StepTiming(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):  # noqa: D102
            timing["train_begin"] = time.time()

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: D102
            if logs and "loss" in logs:
                step = [state.global_step, time.time(), float(logs["loss"]), state.num_input_tokens_seen]
                timing.setdefault("steps", []).append(step)

        def on_train_end(self, args, state, control, **kwargs):  # noqa: D102
            timing["train_end"] = time.time()
            timing["tokens_seen"] = state.num_input_tokens_seen

    return StepTiming()
