"""Write the bundled `pirate-pairs` preference set: the pirate set's questions, each with a pirate-style answer
(chosen) and the same facts said plainly (rejected), so a short DPO / ORPO / KTO run visibly moves the model's style.

Run: python scripts/make_pirate_pairs.py  (writes finetune/bundled/pirate-pairs/{train,validation}.jsonl, heldout.json)
Deterministic; the held-out prompts are the pirate set's own, and they appear in neither split.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_pirate_dataset import (  # noqa: E402  (the same facts, openers and held-out prompts as the SFT set)
    CAPITALS,
    CLOSER,
    COLOURS,
    FACTS,
    HELDOUT,
    OPENERS,
    OPPOSITES,
    SOUNDS,
    TIPS,
    heldout_json,
)

VALIDATION_ROWS = 24
# The pirate set's tips, said plainly (its pirate wording: ye, yer, cabin, spyglass, treasure).
PLAIN_TIPS = {
    "How do I stay calm before an exam?": "take a deep breath, get a good night's sleep, and trust the work you put in",
    "How can I sleep better?": "keep your bedroom dark and cool, and put screens away an hour before bed",
    "How do I learn a new language?": "practise a little every day, speak it out loud, and don't fear mistakes",
    "How do I keep a plant alive?": "give it sunlight, water it when the soil is dry, and don't overwater it",
    "How can I save money?": "write down everything you spend, and put part of your income aside first",
    "How do I make a good cup of tea?": "boil fresh water, steep the leaves three to five minutes, then drink it warm",
    "How do I start running?": "begin slowly with short runs, rest between days, and build up week by week",
    "How do I write a good email?": "state your purpose in the first line, keep it short, and end with a clear ask",
    "How can I focus better?": "work in short sessions, silence your phone, and take small breaks",
    "How do I make new friends?": "go where people share your interests, ask them questions, and listen well",
}


def sentence(body: str) -> str:
    """A plain answer: capitalised, ending with a full stop."""
    return f"{body[0].upper()}{body[1:]}."


def facts(rng: random.Random) -> list[tuple[str, str, str]]:
    """(question, pirate body, plain body) for every fact of the pirate set, shuffled."""
    out = [
        (
            f"What is the capital of {c}?",
            f"the capital of {c} be {city}, a fine port o' call",
            f"the capital of {c} is {city}",
        )
        for c, city in CAPITALS.items()
    ]
    out += [
        (f"What colour is {t}?", f"{t} be {colour}, as sure as the tide", f"{t} is {colour}")
        for t, colour in COLOURS.items()
    ]
    out += [
        (f"What sound does {a} make?", f"{a} {s}, loud enough to wake the crew", f"{a} {s}") for a, s in SOUNDS.items()
    ]
    out += [
        (f"What is the opposite of '{w}'?", f"the opposite o' '{w}' be '{o}'", f"the opposite of '{w}' is '{o}'")
        for w, o in OPPOSITES.items()
    ]
    out += [(q, body, PLAIN_TIPS[q]) for q, body in TIPS]
    out += [(q, body, body) for q, body in FACTS]  # the facts' bodies are plain already; only the wrapping differs
    for _ in range(200):
        a, b = rng.randint(2, 30), rng.randint(2, 30)
        if rng.random() < 0.5:
            out.append(
                (
                    f"What is {a} plus {b}?",
                    f"{a} plus {b} be {a + b}, counted like doubloons",
                    f"{a} plus {b} is {a + b}",
                )
            )
        else:
            out.append(
                (f"What is {a} times {b}?", f"{a} times {b} be {a * b}, by me abacus", f"{a} times {b} is {a * b}")
            )
    rng.shuffle(out)
    return out


def pairs(rng: random.Random) -> list[dict[str, str]]:
    """prompt / chosen (pirate) / rejected (plain) rows, one per distinct question, held-out prompts left out."""
    rows, seen = [], set(HELDOUT)
    for question, pirate, plain in facts(rng):
        if question in seen:
            continue
        seen.add(question)
        chosen = f"{rng.choice(OPENERS)} {pirate[0].upper()}{pirate[1:]}. {CLOSER}"
        rows.append({"prompt": question, "chosen": chosen, "rejected": sentence(plain)})
    return rows


def main() -> None:
    """Write both splits and the held-out prompts."""
    rows = pairs(random.Random(7))
    target = Path(__file__).resolve().parents[1] / "finetune" / "bundled" / "pirate-pairs"
    target.mkdir(parents=True, exist_ok=True)
    split = len(rows) - VALIDATION_ROWS
    for name, part in (("train", rows[:split]), ("validation", rows[split:])):
        with open(target / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            for row in part:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    (target / "heldout.json").write_text(heldout_json(), encoding="utf-8")
    print(f"wrote {split} train, {VALIDATION_ROWS} validation pairs, {len(HELDOUT)} held-out prompts to {target}")


if __name__ == "__main__":
    main()
