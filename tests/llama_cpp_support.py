"""Exports checked in real llama.cpp (llama-cpp-python): loading, tokenizing, next-token agreement, greedy answers.

llama-cpp-python is a test tool, not a dependency: `.ci/run` and `make test` install the prebuilt CPU wheel from
`../shared/wheels` when that folder exists; without it `available()` is False and the llama.cpp tests skip with
SKIP_REASON. `default_run_exports` trains the default run (embedded SmolLM2-135M-Instruct, bundled pirate data, LoRA)
in a studio home of its own and exports it every way; `measure` compares those files in llama.cpp with the merged
model in transformers. The tests assert on one measurement; bench/export_gguf.py reports the same figures.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import llama_cpp
except ImportError:  # the wheel is not installed: the llama.cpp checks skip
    llama_cpp = None

SKIP_REASON = "llama-cpp-python is not installed (.ci/run and make test install it from ../shared/wheels)"

# Strings a tokenizer port gets wrong first: emoji sequences, code, CJK, right-to-left scripts, spaces, specials.
HARD_STRINGS = (
    "Ahoy 👋🏽 matey! 🚀🦙 ✅ 😶‍🌫️ ❤️",
    "def area(r):\n\treturn 3.14159 * r ** 2  # {'a': [1, 22, 333]}\n",
    "我想在苹果公司工作。東京は日本の首都です。서울은 한국의 수도입니다.",
    "مرحبا بالعالم! שלום עולם",
    "   leading spaces\n\n\n  and 1234567890 3...3 ------=======\r\n",
    "Ünïcödé naïve café — “quotes” ‘single’ … I've 'RE we'Ve",
    "<|im_start|>user\nAhoy!<|im_end|>\n<|im_start|>assistant\n",
    "https://example.com/path?q=1&b=2#frag user@example.com $HOME/.cache",
    "Привет, мир! Ελληνικά κείμενα. हिन्दी पाठ",
    "\t\tTabs\tinside\ttext\t\t",
)
# Prose the default run never saw (its data is pirate answers to short questions).
UNSEEN = (
    "The lighthouse keeper counted the ships that passed each evening and wrote their names in a small blue book. "
    "Some nights the fog was so thick that he could only hear the bells, and he guessed at the names instead. "
    "In the spring a young engineer arrived with plans for an automatic lamp, and the keeper showed her the stairs, "
    "the brass fittings he polished every week, and the logbooks that went back forty years. She stayed for a month, "
    "measured the tower, and left a report recommending that the keeper stay on to maintain the new equipment. "
    "Photosynthesis converts light energy into chemical energy: chlorophyll absorbs red and blue light, water is "
    "split, oxygen is released, and the energy is stored in sugars that the plant uses to grow. A simple recipe for "
    "bread needs flour, water, salt and yeast; the dough rises for two hours before it is shaped and baked."
)
CHAT_PROMPTS = (
    "What is the capital of Japan?",
    "How many legs does a spider have?",
    "What do bees make?",
    "Name a fruit that is yellow.",
    "Why do we need sleep?",
)
ANSWER_TOKENS = 32


def available() -> bool:
    """True when llama-cpp-python can be imported."""
    return llama_cpp is not None


def load(path: Path, *, lora: Path | None = None, vocab_only: bool = False) -> Any:
    """A llama.cpp model (every position's logits kept), optionally with a LoRA GGUF applied."""
    return llama_cpp.Llama(
        model_path=str(path),
        lora_path=str(lora) if lora else None,
        vocab_only=vocab_only,
        logits_all=not vocab_only,
        n_ctx=1024,
        n_threads=threads(),
        seed=0,
        verbose=False,
    )


def threads() -> int:
    """llama.cpp's CPU threads: OMP_NUM_THREADS where set (one per pytest-xdist worker, see tests/conftest.py), so it
    does not spin on the core the other worker uses; else up to 2."""
    return int(os.environ.get("OMP_NUM_THREADS") or min(2, os.cpu_count() or 1))


def tokens(llm: Any, text: str) -> list[int]:
    """llama.cpp's token ids for `text`, special tokens parsed and BOS added only when the file says so."""
    return llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)


def logits(llm: Any, ids: list[int]) -> Any:
    """The next-token logits at every position of `ids` (numpy, positions x vocab)."""
    import numpy as np

    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)])


def greedy(llm: Any, ids: list[int], stop: int, max_new: int = ANSWER_TOKENS) -> list[int]:
    """llama.cpp's greedy continuation of `ids`, up to `stop` (excluded) or `max_new` tokens."""
    import numpy as np

    llm.reset()
    llm.eval(ids)
    out: list[int] = []
    for _ in range(max_new):
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        if token == stop:
            break
        out.append(token)
        llm.eval([token])
    return out


def hf_logits(model: Any, ids: list[int]) -> Any:
    """transformers' next-token logits at every position (numpy, float32)."""
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def hf_greedy(model: Any, ids: list[int], stop: int, max_new: int = ANSWER_TOKENS) -> list[int]:
    """transformers' greedy continuation, as `greedy` (a fresh GenerationConfig: no penalties from the model's own)."""
    import torch
    from transformers import GenerationConfig

    settings = GenerationConfig(do_sample=False, max_new_tokens=max_new, eos_token_id=stop, pad_token_id=stop)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)), generation_config=settings)
    new = out[0, len(ids) :].tolist()
    return new[: new.index(stop)] if stop in new else new


# f16 rounding moves a logit by a few hundredths: where the merged model's own greedy choice led its runner-up by less
# than this, llama.cpp may rightly take the other token, and the answers part ways from there.
NEAR_TIE = 0.1


def tie_free_length(model: Any, prompt: list[int], answer: list[int], stop: int) -> int:
    """How many tokens of `answer` (the merged model's greedy answer to `prompt`) were chosen by a clear margin: the
    first near tie (top-1 ahead of top-2 by under NEAR_TIE), or the whole answer and its stop token."""
    import numpy as np

    scores = hf_logits(model, prompt + answer)[len(prompt) - 1 :]
    for index, row in enumerate(scores):
        top2 = np.sort(row)[-2:]
        if top2[1] - top2[0] < NEAR_TIE:
            return index
    return len(answer) + 1


def answers_alike(got: list[int], want: list[int], clear: int) -> bool:
    """The same answer token for token up to the merged model's first near tie (the whole answer when it has none)."""
    return (got + [None])[:clear] == (want + [None])[:clear]


def agreement(got: Any, expected: Any) -> float:
    """Share of positions whose top-1 next token is the same."""
    return float((got.argmax(-1) == expected.argmax(-1)).mean())


# ------------------------------------------------------------------------------------------- the default run


@dataclass(frozen=True)
class DefaultRunExports:
    """A trained default run and everything exported from it."""

    run: Path
    base: Path  # the converted embedded model (safetensors)
    merged: Path
    f16: Path
    q8_0: Path
    lora: Path  # the adapter alone, llama.cpp LoRA GGUF (f16)
    base_gguf: Path  # the base model as f16 GGUF, for the LoRA
    modelfile: str
    seconds: dict[str, float]


@contextmanager
def studio_home(home: Path) -> Iterator[None]:
    """FINETUNE_STUDIO_HOME set to `home` for the block, restored after."""
    old = os.environ.get("FINETUNE_STUDIO_HOME")
    os.environ["FINETUNE_STUDIO_HOME"] = str(home)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("FINETUNE_STUDIO_HOME", None)
        else:
            os.environ["FINETUNE_STUDIO_HOME"] = old


def default_run_exports(home: Path, samples: bool = True, **overrides: Any) -> DefaultRunExports:
    """Train the default run in `home` (TrainConfig defaults, `overrides` applied) and export it (`export_all`).
    samples=False skips the sample answers at step 0 (the base model's greedy answers: minutes on a loaded CPU, and
    nothing the trained weights depend on)."""
    import time
    from unittest import mock

    from finetune.config import TrainConfig
    from finetune.runs.manager import RunManager
    from finetune.runs.rundir import RunDir

    with studio_home(home):
        started = time.time()
        # The engine asks `finetune.data.heldout_samples` (engines/common.py) for the prompts it answers.
        no_samples = mock.patch("finetune.data.heldout_samples", lambda *args, **kwargs: [])
        with no_samples if not samples else contextlib.nullcontext():
            state = RunManager().start(TrainConfig(**overrides), owner="tests", background=False)
        if state.status != "completed":
            raise RuntimeError(f"the default run failed: {state.status}: {state.error}")
        if not samples and RunDir(Path(state.run_dir)).read_events(("samples",)):
            raise RuntimeError(
                "the default run answered its held-out prompts: patch heldout_samples where the engine looks it up"
            )
    return export_all(Path(state.run_dir), {"train": time.time() - started})


def export_all(run_dir: Path, seconds: dict[str, float] | None = None) -> DefaultRunExports:
    """Export a finished run on the embedded model (its studio home: the runs folder's parent) merged, as f16 and
    q8_0 GGUF, and as a LoRA GGUF, and write its base model as an f16 GGUF."""
    import time

    from finetune.model.loading import embedded_cache_dir
    from finetune.publish import gguf_writer
    from finetune.publish.export import export_run

    seconds = dict(seconds or {})
    home = run_dir.parent.parent
    with studio_home(home):
        done = {}
        for fmt, quant in (("merged", None), ("gguf", "f16"), ("gguf", "q8_0"), ("gguf-lora", "f16")):
            started = time.time()
            done[f"{fmt}-{quant}"] = export_run(run_dir, fmt, quant)
            seconds[f"{fmt} {quant or ''}".strip()] = time.time() - started
        base = embedded_cache_dir()
        base_gguf = home / "base-f16.gguf"
        gguf_writer.write_gguf(base, base_gguf, "f16", "base", lambda message: None)
    f16 = done["gguf-f16"]
    return DefaultRunExports(
        run=run_dir,
        base=base,
        merged=done["merged-None"].folder,
        f16=f16.main,
        q8_0=done["gguf-q8_0"].main,
        lora=done["gguf-lora-f16"].main,
        base_gguf=base_gguf,
        modelfile=(f16.folder / "Modelfile").read_text(encoding="utf-8"),
        seconds=seconds,
    )


def measure(exports: DefaultRunExports, prompts: tuple[str, ...] = CHAT_PROMPTS, old_modelfile: bool = True) -> dict:
    """Every figure the tests and the bench use, from one load of each file (see the keys). `prompts`: the chat
    prompts answered greedily; old_modelfile: also answer them as the Modelfile without SYSTEM prompted (bench)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.ollama_render import ollama_prompt

    tokenizer = AutoTokenizer.from_pretrained(str(exports.merged))
    merged = AutoModelForCausalLM.from_pretrained(str(exports.merged), dtype=torch.float32).eval()
    stop = tokenizer.eos_token_id
    ids = tokenizer(UNSEEN)["input_ids"]
    expected = hf_logits(merged, ids)
    chats = [[{"role": "user", "content": prompt}] for prompt in prompts]
    rendered = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
    chat_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in rendered]
    answers = [hf_greedy(merged, c, stop) for c in chat_ids]
    clear = [tie_free_length(merged, c, a, stop) for c, a in zip(chat_ids, answers, strict=True)]
    result: dict[str, Any] = {
        "positions": len(ids),
        "answers": [tokenizer.decode(a) for a in answers],
        "expected_top1": expected.argmax(-1).tolist(),
    }
    f16 = load(exports.f16)
    result["hard_strings"] = len(HARD_STRINGS)
    result["tokenization_differs"] = [s for s in HARD_STRINGS if tokens(f16, s) != tokenizer(s)["input_ids"]]
    models = {"f16": f16, "q8_0": load(exports.q8_0), "lora": load(exports.base_gguf, lora=exports.lora)}
    models["base"] = load(exports.base_gguf)
    for name, llm in models.items():
        got = logits(llm, ids)
        result[f"{name}_agreement"] = agreement(got, expected)
        result[f"{name}_logit_error"] = float(abs(got - expected).mean())
    for name in ("f16", "lora"):
        result[f"{name}_same_answers"] = sum(
            answers_alike(greedy(models[name], c, stop), a, n) for c, a, n in zip(chat_ids, answers, clear, strict=True)
        )
    # The Ollama path: the prompt rendered from the Modelfile, tokenized and answered by llama.cpp.
    prompts = [ollama_prompt(exports.modelfile, chat) for chat in chats]
    result["ollama_prompt_is_the_training_prompt"] = prompts == rendered
    ollama_answers = [greedy(f16, tokens(f16, prompt), stop) for prompt in prompts]
    result["ollama_answers"] = [tokenizer.decode(a) for a in ollama_answers]
    result["ollama_same_answers"] = sum(
        answers_alike(got, want, n) for got, want, n in zip(ollama_answers, answers, clear, strict=True)
    )
    result["clear_tokens"] = clear
    if old_modelfile:
        result["answers_without_system"] = [
            tokenizer.decode(greedy(f16, tokens(f16, _no_system_prompt(chat)), stop)) for chat in chats
        ]
    return result


def _no_system_prompt(chat: list[dict[str, str]]) -> str:
    """The prompt Ollama sent before the Modelfile carried SYSTEM: the ChatML turns without a system message."""
    from finetune.publish.modelfile import chatml

    return chatml(chat)


def check_in_llama_cpp(gguf: Path, tokenizer: Any, reference: Any, floor: float, lora: Path | None = None) -> Any:
    """Where llama.cpp is installed (else None): it loads `gguf` (with the LoRA GGUF `lora`), tokenizes HARD_STRINGS
    and UNSEEN exactly as `tokenizer`, and its top-1 next token on UNSEEN agrees with `reference` (a transformers
    model) on at least `floor` of the positions. Returns the agreement."""
    if not available():
        return None
    llm = load(gguf, lora=lora)
    for text in HARD_STRINGS:
        assert tokens(llm, text) == tokenizer(text)["input_ids"], f"llama.cpp tokenizes {text!r} differently"
    ids = tokenizer(UNSEEN)["input_ids"]
    assert tokens(llm, UNSEEN) == ids
    share = agreement(logits(llm, ids), hf_logits(reference, ids))
    assert share >= floor, f"llama.cpp agrees with transformers on {share:.1%} of {len(ids)} positions"
    return share
