"""Make the small example files of solutions/data/examples/ (and bigger versions of them for measurements).

    python scripts/make_examples.py                       # rewrite solutions/data/examples/
    python scripts/make_examples.py --dates 20000 /tmp/dates.tsv   # a 20,000-pair date task

Everything is generated from a fixed seed: the same files on every machine.

- ``dates.tsv``: dates written in six common English forms → ISO 8601 (``March 3, 2021`` →
  ``2021-03-03``). The target side has no spaces, so word tokens cannot learn it.
- ``shapes/``: an ImageFolder tree (one folder per class: circle, square, triangle) of RGB
  PNGs of different sizes, one filled shape each on a plain background.
- ``shapes.npz``: the same kind of images as arrays ``images`` (N, 16, 16) and ``labels`` (N,).
"""

from __future__ import annotations

import argparse
import datetime
import random
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

EXAMPLES = Path(__file__).resolve().parent.parent / "solutions" / "data" / "examples"
MONTHS = ("January February March April May June July August September October November December").split()
SHAPES = ("circle", "square", "triangle")


def _ordinal(day: int) -> str:
    suffix = "th" if 10 <= day % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


def write_date(date: datetime.date, form: int) -> str:
    month, day, year = MONTHS[date.month - 1], date.day, date.year
    return [
        f"{month} {day}, {year}",                # March 3, 2021
        f"{day} {month} {year}",                 # 3 March 2021
        f"{month[:3]} {day} {year}",             # Mar 3 2021
        f"{date.month}/{day}/{year}",            # 3/3/2021 (US order)
        f"{day}.{date.month}.{year}",            # 3.3.2021 (European order)
        f"the {_ordinal(day)} of {month} {year}",  # the 3rd of March 2021
    ][form]


def date_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` (written date, ISO date) pairs, dates uniform over 1900-01-01 … 2099-12-31."""
    rng = random.Random(seed)
    first, days = datetime.date(1900, 1, 1), (datetime.date(2099, 12, 31) - datetime.date(1900, 1, 1)).days
    pairs = []
    for _ in range(n):
        date = first + datetime.timedelta(days=rng.randint(0, days))
        pairs.append((write_date(date, rng.randrange(6)), date.isoformat()))
    return pairs


def shape_image(shape: str, rng: random.Random, size: int) -> Image.Image:
    """One bright filled ``shape`` of random size, place and colour on a plain dark background."""
    background = tuple(rng.randint(0, 90) for _ in range(3))  # dark background, bright shape: always visible
    colour = tuple(rng.randint(150, 255) for _ in range(3))
    image = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(image)
    side = rng.randint(size // 2, size - 4)
    x, y = rng.randint(1, size - side - 1), rng.randint(1, size - side - 1)
    if shape == "circle":
        draw.ellipse((x, y, x + side, y + side), fill=colour)
    elif shape == "square":
        draw.rectangle((x, y, x + side, y + side), fill=colour)
    else:
        draw.polygon([(x + side / 2, y), (x, y + side), (x + side, y + side)], fill=colour)
    return image


def write_shapes_folder(root: Path, per_class: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    for shape in SHAPES:
        (root / shape).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            shape_image(shape, rng, rng.randint(16, 28)).save(root / shape / f"{i:02d}.png", optimize=True)


def write_shapes_npz(path: Path, per_class: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    images, labels = [], []
    for label, shape in enumerate(SHAPES):
        for _ in range(per_class):
            images.append(np.asarray(shape_image(shape, rng, 16).convert("L"), dtype=np.uint8))
            labels.append(label)
    np.savez_compressed(path, images=np.stack(images), labels=np.array(labels, dtype=np.int64))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dates", nargs=2, metavar=("N", "FILE"), help="write N date pairs to FILE and stop")
    args = parser.parse_args()
    if args.dates:
        n, path = int(args.dates[0]), Path(args.dates[1])
        path.write_text("".join(f"{s}\t{t}\n" for s, t in date_pairs(n, seed=1)), encoding="utf-8")
        return
    EXAMPLES.mkdir(parents=True, exist_ok=True)
    (EXAMPLES / "dates.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in date_pairs(400)), encoding="utf-8")
    write_shapes_folder(EXAMPLES / "shapes", per_class=30)
    write_shapes_npz(EXAMPLES / "shapes.npz", per_class=100)


if __name__ == "__main__":
    main()
