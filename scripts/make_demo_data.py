"""Build the bundled demo subset (``data/``) from a full Flickr8k copy.

Picks, from each official split, the images with the smallest
``sha256("<seed>:<image name>")`` (800 train, 100 dev, 100 test by default), which is
deterministic and independent of file order, library versions and platform.  Writes the
official layout: ``images/*.jpg`` copied byte for byte, ``Flickr8k.token.txt`` with the
chosen images' caption rows copied verbatim (original order), and the three split files
(chosen names in official order), and the CrowdFlower human judgments whose image and
caption both belong to the chosen test images (when the source has them).  Then reloads
the result with the project's reader and prints a JSON summary.

    python scripts/make_demo_data.py --source ../shared/data/flickr8k --out data
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.core.errors import VseError  # noqa: E402
from pipeline.core.fsutil import atomic_path  # noqa: E402
from pipeline.data.readers.flickr8k import FLICKR8K_SPLIT_FILES, FLICKR8K_TOKEN_FILE, load_flickr8k

MAX_TOTAL_BYTES = 40 * 1024 * 1024
CROWDFLOWER_FILE = "CrowdFlowerAnnotations.txt"


def choose(names: list[str], count: int, seed: str) -> list[str]:
    """The ``count`` names with the smallest seeded hash, returned in their given order."""
    if count > len(names):
        raise VseError(f"asked for {count} images but the split has only {len(names)}")
    rank = sorted(names, key=lambda n: hashlib.sha256(f"{seed}:{n}".encode()).hexdigest())
    chosen = set(rank[:count])
    return [n for n in names if n in chosen]


def write_text(path: Path, lines: list[str]) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def copy_images(sources: list[Path], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {p.name for p in sources}
    stray = sorted(p.name for p in folder.iterdir() if p.name not in wanted)
    if stray:
        raise VseError(f"{len(stray)} files not in the selection (e.g. {stray[0]}); "
                       "remove the folder first", folder)
    for source in sources:
        target = folder / source.name
        if target.is_file() and filecmp.cmp(source, target, shallow=False):
            continue
        with atomic_path(target) as tmp:
            shutil.copyfile(source, tmp)


def build(source: Path, out: Path, counts: dict[str, int], seed: str) -> dict:
    full = load_flickr8k(source)
    if full.report.counts.keys() - {"caption_missing_image"}:
        raise VseError("source has problems beyond the known missing-image quirk:\n"
                       + "\n".join(full.report.lines()), source)
    chosen = {split: choose([full.image_ids[i] for i in full.splits[split]], n, seed)
              for split, n in counts.items()}
    selected = {name for names in chosen.values() for name in names}
    paths = {full.image_ids[i]: full.image_paths[i] for i in range(full.num_images)}
    copy_images([paths[name] for split in chosen for name in chosen[split]], out / "images")
    token_lines = (source / FLICKR8K_TOKEN_FILE).read_text(encoding="utf-8").splitlines()
    write_text(out / FLICKR8K_TOKEN_FILE,
               [line for line in token_lines if line.split("#", 1)[0] in selected])
    for split, filename in FLICKR8K_SPLIT_FILES.items():
        write_text(out / filename, chosen.get(split, []))
    judged = source / CROWDFLOWER_FILE  # human judgments among the chosen test images
    if judged.is_file():
        test = set(chosen.get("test", []))
        write_text(out / CROWDFLOWER_FILE,
                   [line for line in judged.read_text(encoding="utf-8").splitlines()
                    if line.split("\t")[0] in test and line.split("\t")[1].split("#")[0] in test])

    demo = load_flickr8k(out)
    if demo.report.counts or demo.captions_per_image != 5:
        raise VseError("the written subset does not reload cleanly:\n" + demo.summary(), out)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    if total > MAX_TOTAL_BYTES:
        raise VseError(f"subset is {total / 2**20:.1f} MiB, over the 40 MiB budget", out)
    return {"images": demo.num_images, "captions": demo.num_captions,
            "splits": {s: len(i) for s, i in demo.splits.items()},
            "bytes": total, "seed": seed, "source": str(source)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path,
                        default=Path(__file__).resolve().parents[2] / "shared" / "data" / "flickr8k")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / "data")
    parser.add_argument("--seed", default="0")
    parser.add_argument("--train", type=int, default=800)
    parser.add_argument("--dev", type=int, default=100)
    parser.add_argument("--test", type=int, default=100)
    args = parser.parse_args(argv)
    try:
        summary = build(args.source, args.out,
                        {"train": args.train, "dev": args.dev, "test": args.test}, args.seed)
    except VseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
