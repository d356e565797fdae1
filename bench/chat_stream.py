"""Chat streaming: time to first token and tokens/s of the Chat tab's path against a plain `model.generate`.

Ours is `Studio.chat("base", ...)`: the model cache, the chat lock and `finetune.model.inference.stream_reply`
(generate in a
thread, `TextIteratorStreamer`, the text so far yielded per token), exactly what the Chat tab iterates over. The
baseline is `model.generate(**inputs, max_new_tokens=N, do_sample=False)` on a model loaded with `from_pretrained`
(its time to first token: the same call with max_new_tokens=1). Same prompt, chat template, greedy settings, dtype.
Rounds alternate which goes first; the first call of each is a warm-up and not counted.

    .venv/bin/python bench/chat_stream.py                       # embedded SmolLM2-135M, 128 tokens, 4 rounds
    .venv/bin/python bench/chat_stream.py --model tiny --max-new-tokens 16 --rounds 1 --out ''

The last line is the headline: ours / plain end-to-end tokens/s (goal >= 0.95x).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RESULTS, Report, loadavg, median, set_offline, table  # noqa: E402

PROMPT = "Write a long story about a pirate who finds a treasure map, with many details."


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded", help="embedded, tiny, or a model directory")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--threads", type=int, default=1,
        help="OMP/MKL threads (0 = torch's default); 1 keeps the OpenMP scheduling of the generate thread (ours) "
        "and the main thread (plain) alike on a shared machine",
    )  # fmt: skip
    parser.add_argument("--out", default=str(RESULTS), help="results folder or .md file; '' = do not save")
    args = parser.parse_args(argv)

    if args.threads and os.environ.get("OMP_NUM_THREADS") != str(args.threads):
        # Thread counts must be set before torch loads: start again with them.
        os.environ.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
        os.execv(sys.executable, [sys.executable, *sys.argv])

    set_offline()
    import torch
    from transformers import AutoModelForCausalLM

    from finetune.config import EMBEDDED_MODEL
    from finetune.model.inference import GenerationSettings, chat_input_ids
    from finetune.studio import Studio

    report = Report("chat_stream")
    work = Path(tempfile.mkdtemp(prefix="bench-chat-"))
    try:
        if args.model == "embedded":
            from finetune.model.loading import ensure_embedded_model

            model_name, model_dir = EMBEDDED_MODEL, ensure_embedded_model()
        elif args.model == "tiny":
            from tests.tiny import build_llama

            model_dir = build_llama(work / "tiny")
            model_name = str(model_dir)
        else:
            model_name = model_dir = args.model

        studio = Studio(runs_root=work / "runs")
        messages = [{"role": "user", "content": PROMPT}]
        settings = GenerationSettings(max_new_tokens=args.max_new_tokens)  # the Chat tab's defaults: greedy
        base_values = {"model": model_name}

        t = time.time()
        _, tokenizer = studio._chat_model("base", base_values)  # load once, as the Chat tab's first message does
        load_ours = time.time() - t
        t = time.time()
        plain_model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        load_plain = time.time() - t
        inputs = chat_input_ids(tokenizer, messages)
        prompt_tokens = int(inputs["input_ids"].shape[1])

        def ours() -> dict:
            t0 = time.time()
            first = None
            text = ""
            for text in studio.chat("base", messages, settings, base_values):
                if first is None and text:
                    first = time.time() - t0
            total = time.time() - t0
            return {"ttft": first or total, "total": total, "text": text}

        def plain() -> dict:
            with torch.no_grad():
                t0 = time.time()
                plain_model.generate(**inputs, max_new_tokens=1, do_sample=False, pad_token_id=tokenizer.pad_token_id)
                ttft = time.time() - t0
                t0 = time.time()
                out = plain_model.generate(
                    **inputs, max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
                )
                total = time.time() - t0
            new = out[0, prompt_tokens:]
            return {"ttft": ttft, "total": total, "tokens": int(new.shape[0]),
                    "text": tokenizer.decode(new, skip_special_tokens=True)}  # fmt: skip

        report.print(
            f"model: {model_name} ({sum(p.numel() for p in plain_model.parameters()) / 1e6:.1f}M params, fp32, CPU, "
            f"threads {torch.get_num_threads()}); prompt {prompt_tokens} tokens; greedy, max_new_tokens "
            f"{args.max_new_tokens}; load: ours {load_ours:.2f}s, plain {load_plain:.2f}s"
        )
        report.print(f"load average before: {loadavg()}")
        ours(), plain()  # warm-up
        rows = []
        same_text = True
        for i in range(args.rounds):
            pair = {}
            for which in ("ours", "plain") if i % 2 == 0 else ("plain", "ours"):
                pair[which] = ours() if which == "ours" else plain()
            o, p = pair["ours"], pair["plain"]
            n = p["tokens"]
            same_text = same_text and o["text"].strip() == p["text"].strip()
            o_tps, p_tps = n / o["total"], n / p["total"]
            rows.append([i + 1, n, o["ttft"], p["ttft"], o_tps, p_tps, o_tps / p_tps])
            print(f"  round {i + 1}: ours {o_tps:.1f} tok/s, plain {p_tps:.1f} tok/s, load {loadavg()[0]}", flush=True)
        report.print()
        report.print(
            table(["round", "new tokens", "ours TTFT s", "plain TTFT s", "ours tok/s", "plain tok/s", "ratio"], rows)
        )
        report.print(f"same reply text from both: {same_text}")
        report.print(f"load average after: {loadavg()}")
        ratio = median([r[6] for r in rows])
        ttft_o, ttft_p = median([r[2] for r in rows]), median([r[3] for r in rows])
        ok = "meets" if ratio >= 0.95 else "MISSES"
        headline = (
            f"chat stream: ours {median([r[4] for r in rows]):.1f} tok/s vs plain generate "
            f"{median([r[5] for r in rows]):.1f} tok/s = {ratio:.3f}x (goal >= 0.95) [{ok}]; time to first token "
            f"ours {ttft_o * 1000:.0f} ms vs plain {ttft_p * 1000:.0f} ms"
        )
        return report.finish(args.out, headline)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
