"""Write the bundled image set `bundled:shapes` (finetune/bundled/shapes/): 24 small PNGs of coloured shapes drawn with
PIL, and chat rows that ask about them (what shape, what colour, a caption), so a vision-language run needs no
download beyond the model.

    python scripts/make_demo_images.py            # rewrites finetune/bundled/shapes/
    python scripts/make_demo_images.py --out DIR  # somewhere else

The drawing is deterministic: running it again gives the same files.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "finetune" / "bundled" / "shapes"
SIZE = 64
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (235, 200, 30)}
SHAPES = ("circle", "square", "triangle")
BACKGROUNDS = ((255, 255, 255), (235, 235, 235))  # white, light grey
QUESTIONS = ("What shape is in the picture?", "What colour is the shape?", "Describe the image.")


def draw(shape: str, colour: tuple[int, int, int], background: tuple[int, int, int], offset: int) -> Image.Image:
    """One 64 × 64 picture: a shape of a colour on a plain background, moved a little by `offset`."""
    image = Image.new("RGB", (SIZE, SIZE), background)
    pen = ImageDraw.Draw(image)
    lo, hi = 12 + offset, 52 - offset
    if shape == "circle":
        pen.ellipse((lo, lo, hi, hi), fill=colour)
    elif shape == "square":
        pen.rectangle((lo, lo, hi, hi), fill=colour)
    else:
        pen.polygon(((SIZE // 2, lo), (hi, hi), (lo, hi)), fill=colour)
    return image


def rows_for(file: str, shape: str, colour: str, index: int) -> dict:
    """A conversation about one picture; the question turns with the picture's index."""
    question = QUESTIONS[index % len(QUESTIONS)]
    answer = {
        QUESTIONS[0]: f"A {shape}.",
        QUESTIONS[1]: f"It is {colour}.",
        QUESTIONS[2]: f"A {colour} {shape} on a plain background.",
    }[question]
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]},
        {"role": "assistant", "content": [{"type": "text", "text": answer}]},
    ]
    return {"messages": messages, "images": [file]}


def write(out: Path) -> list[dict]:
    """Draw the pictures into `out`/images and write train.jsonl (20 rows) and validation.jsonl (4 rows)."""
    shutil.rmtree(out / "images", ignore_errors=True)
    (out / "images").mkdir(parents=True)
    rows = []
    index = 0
    for shape in SHAPES:
        for colour in COLOURS:
            for k, background in enumerate(BACKGROUNDS):
                file = f"images/{colour}-{shape}-{k}.png"
                draw(shape, COLOURS[colour], background, offset=4 * k).save(out / file, optimize=True)
                rows.append(rows_for(file, shape, colour, index))
                index += 1
    validation = rows[3::6]  # one row in six, every shape and colour kept in training
    train = [r for r in rows if r not in validation]
    for name, part in (("train", train), ("validation", validation)):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
    return rows


def main() -> None:
    """Parse --out and write the set."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder to write (default: the bundled set)")
    args = parser.parse_args()
    rows = write(args.out)
    print(f"wrote {len(rows)} pictures and their rows to {args.out}")


if __name__ == "__main__":
    main()
