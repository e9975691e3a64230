"""Write part of Flickr8k as a CSV in `vse`'s csv dataset format (the README's "Your own data").

One row per (image, caption): ``filepath`` (relative to the CSV's folder), ``title`` (the
caption) and ``split`` (train/dev/test, here a seeded 80/10/10 split of the chosen images:
the column shows the format; drop it and `vse extract --dataset csv` draws a seeded split of
its own). The CSV's folder gets a link ``images`` to the Flickr8k image folder, since image
paths may not leave the CSV's folder.

    python scripts/flickr8k_csv.py ../shared/data/flickr8k own/own.csv --images 1000
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("flickr8k", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--split", default="train", help="the Flickr8k split to take images from")
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from pipeline.data.readers import load_dataset
    from pipeline.data.readers.csv_file import seeded_split

    dataset = load_dataset("flickr8k", args.flickr8k)
    rows = dataset.splits[args.split][:args.images]
    names = [dataset.image_ids[r] for r in rows]
    split_of = {name: split for split, members in seeded_split(names, seed=args.seed).items()
                for name in members}
    if args.out.exists():
        sys.exit(f"error: {args.out}: exists; give another path")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    link = args.out.parent / "images"
    if not link.exists():
        link.symlink_to(Path(dataset.image_paths[rows[0]]).parent.resolve(), target_is_directory=True)
    with open(args.out, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["filepath", "title", "split"])
        caption_rows, caption_image = dataset.captions_of(rows)
        for c, k in zip(caption_rows.tolist(), caption_image.tolist()):
            writer.writerow([f"images/{names[k]}", dataset.captions[c], split_of[names[k]]])
    print(f"{args.out}: {len(names)} images of the {args.split} split, link {link}")


if __name__ == "__main__":
    main()
