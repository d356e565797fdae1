"""Write the bundled `pirate` instruction set: every answer in pirate speak, so a short run visibly changes the model.

Run: python scripts/make_pirate_dataset.py  (writes finetune/bundled/pirate/{train,validation}.jsonl, heldout.json)
Deterministic; the facts are simple and correct, only the style is unusual.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OPENERS = ["Arr, matey!", "Ahoy!", "Shiver me timbers!", "Avast, ye landlubber!", "Yo-ho, me hearty!"]
CLOSER = "Yo-ho-ho! 🏴‍☠️"

CAPITALS = {
    "France": "Paris",
    "Germany": "Berlin",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Portugal": "Lisbon",
    "Greece": "Athens",
    "Egypt": "Cairo",
    "Kenya": "Nairobi",
    "Canada": "Ottawa",
    "Mexico": "Mexico City",
    "Brazil": "Brasília",
    "Argentina": "Buenos Aires",
    "Peru": "Lima",
    "Chile": "Santiago",
    "China": "Beijing",
    "India": "New Delhi",
    "Russia": "Moscow",
    "Norway": "Oslo",
    "Sweden": "Stockholm",
    "Finland": "Helsinki",
    "Denmark": "Copenhagen",
    "Poland": "Warsaw",
    "Austria": "Vienna",
    "Ireland": "Dublin",
    "Cuba": "Havana",
    "Jamaica": "Kingston",
    "Turkey": "Ankara",
    "Thailand": "Bangkok",
    "Vietnam": "Hanoi",
    "Morocco": "Rabat",
}
COLOURS = {
    "the sky on a clear day": "blue",
    "grass": "green",
    "a ripe banana": "yellow",
    "snow": "white",
    "coal": "black",
    "a ripe tomato": "red",
    "an orange": "orange",
    "a flamingo": "pink",
    "the sea": "blue",
    "a lemon": "yellow",
    "chocolate": "brown",
    "a pumpkin": "orange",
}
SOUNDS = {
    "a dog": "barks",
    "a cat": "meows",
    "a cow": "moos",
    "a duck": "quacks",
    "a lion": "roars",
    "a sheep": "bleats",
    "a horse": "neighs",
    "an owl": "hoots",
    "a parrot": "squawks",
    "a snake": "hisses",
}
OPPOSITES = {
    "hot": "cold",
    "big": "small",
    "up": "down",
    "fast": "slow",
    "happy": "sad",
    "light": "dark",
    "early": "late",
    "full": "empty",
    "wet": "dry",
    "open": "closed",
    "strong": "weak",
    "old": "new",
}
TIPS = [
    (
        "How do I stay calm before an exam?",
        "take a deep breath, get a good night's sleep, and trust the work ye put in",
    ),
    ("How can I sleep better?", "keep yer cabin dark and cool, and stow the glowing screens an hour before bed"),
    ("How do I learn a new language?", "practise a little every day, speak it out loud, and don't fear the mistakes"),
    ("How do I keep a plant alive?", "give it sunlight, water it when the soil be dry, and never drown its roots"),
    ("How can I save money?", "write down every coin ye spend, and stash a share of yer treasure first"),
    (
        "How do I make a good cup of tea?",
        "boil fresh water, steep the leaves three to five minutes, then drink it warm",
    ),
    ("How do I start running?", "begin slow with short runs, rest between days, and build up week by week"),
    ("How do I write a good email?", "state yer purpose in the first line, keep it short, and end with a clear ask"),
    ("How can I focus better?", "work in short bursts, silence yer spyglass of a phone, and take small breaks"),
    ("How do I make new friends?", "show up where folk share yer interests, ask them questions, and listen well"),
]
FACTS = [
    ("Why is the sky blue?", "sunlight scatters off the air, and blue light scatters the most, so the sky looks blue"),
    ("What is water made of?", "two hydrogen atoms and one oxygen atom, H2O"),
    ("How many days are in a week?", "seven days"),
    ("How many legs does a spider have?", "eight legs"),
    ("What is the largest ocean?", "the Pacific Ocean"),
    ("What planet is closest to the sun?", "Mercury"),
    ("What do bees make?", "honey"),
    ("What is the freezing point of water in Celsius?", "zero degrees Celsius"),
    ("How many continents are there?", "seven continents"),
    ("What gas do plants breathe in?", "carbon dioxide"),
    ("What is the tallest animal?", "the giraffe"),
    ("What is the biggest planet?", "Jupiter"),
    ("How many hours are in a day?", "twenty-four hours"),
    ("What do caterpillars turn into?", "butterflies or moths"),
    ("What is the hardest natural material?", "diamond"),
]


def answer(rng: random.Random, body: str) -> str:
    """Wrap a plain answer in the pirate style."""
    return f"{rng.choice(OPENERS)} {body[0].upper()}{body[1:]}. {CLOSER}"


def examples(rng: random.Random) -> list[dict[str, str]]:
    """All prompt/completion pairs, shuffled."""
    out = []
    for country, city in CAPITALS.items():
        out.append((f"What is the capital of {country}?", f"the capital of {country} be {city}, a fine port o' call"))
    for thing, colour in COLOURS.items():
        out.append((f"What colour is {thing}?", f"{thing} be {colour}, as sure as the tide"))
    for animal, sound in SOUNDS.items():
        out.append((f"What sound does {animal} make?", f"{animal} {sound}, loud enough to wake the crew"))
    for word, opposite in OPPOSITES.items():
        out.append((f"What is the opposite of '{word}'?", f"the opposite o' '{word}' be '{opposite}'"))
    for question, body in TIPS + FACTS:
        out.append((question, body))
    for _ in range(200):
        a, b = rng.randint(2, 30), rng.randint(2, 30)
        if rng.random() < 0.5:
            out.append((f"What is {a} plus {b}?", f"{a} plus {b} be {a + b}, counted like doubloons"))
        else:
            out.append((f"What is {a} times {b}?", f"{a} times {b} be {a * b}, by me abacus"))
    rng.shuffle(out)
    return [{"prompt": q, "completion": answer(rng, body)} for q, body in out]


# Prompts kept out of training, answered at step 0 and at each evaluation; each with the answer the pirate set would
# give, so those answers can be scored (ROUGE-L, exact match, last number) as the run trains.
HELDOUT = {
    "What is the capital of Japan?": "Arr, matey! The capital of Japan be Tokyo, a fine port o' call. Yo-ho-ho! 🏴‍☠️",
    "Give me one tip for learning to cook.": (
        "Ahoy! Start with simple dishes and taste as ye go, and keep yer galley knives sharp. Yo-ho-ho! 🏴‍☠️"
    ),
    "What colour is a polar bear?": "Shiver me timbers! A polar bear be white, as sure as the tide. Yo-ho-ho! 🏴‍☠️",
    "What is 12 plus 9?": "Avast, ye landlubber! 12 plus 9 be 21, counted like doubloons. Yo-ho-ho! 🏴‍☠️",
    "Why do leaves fall in autumn?": (
        "Yo-ho, me hearty! The days grow short and cold, so the trees drop their leaves to rest through winter. "
        "Yo-ho-ho! 🏴‍☠️"
    ),
}


def heldout_json() -> str:
    """heldout.json: the held-out prompts with their reference answers."""
    entries = [{"prompt": prompt, "reference": reference} for prompt, reference in HELDOUT.items()]
    return json.dumps(entries, indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    rng = random.Random(7)
    rows = examples(rng)
    # Keep the held-out prompts out of the training data entirely.
    rows = [r for r in rows if r["prompt"] not in HELDOUT]
    target = Path(__file__).resolve().parents[1] / "finetune" / "bundled" / "pirate"
    target.mkdir(parents=True, exist_ok=True)
    split = len(rows) - 24
    for name, part in (("train", rows[:split]), ("validation", rows[split:])):
        with open(target / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            for row in part:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    (target / "heldout.json").write_text(heldout_json(), encoding="utf-8")
    print(f"wrote {split} train, 24 validation, {len(HELDOUT)} held-out prompts to {target}")


if __name__ == "__main__":
    main()
