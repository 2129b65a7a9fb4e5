"""Generate the seed scenario's dataset: 13-channel tiles (uint8) in class folders 0/ and 1/.

    python examples/satellite/make_dataset.py /data/satellite --samples 2000            # full size, 299x299
    python examples/satellite/make_dataset.py /tmp/sat --samples 64 --size 67           # reduced, for tests

Class 1 tiles are brighter in a few bands, so that the classifier has something to learn.
"""

import argparse
import os

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="folder to write into (class folders 0/ and 1/)")
    parser.add_argument("--samples", type=int, default=2000, help="number of tiles (default 2000)")
    parser.add_argument("--size", type=int, default=299, help="tile height and width (default 299)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    for label in (0, 1):
        os.makedirs(os.path.join(args.out, str(label)), exist_ok=True)
    for i in range(args.samples):
        label = i % 2
        tile = rng.integers(0, 200, (13, args.size, args.size), dtype=np.uint8)
        if label:
            tile[[3, 7, 11]] += 40  # a signal in three bands
        np.save(os.path.join(args.out, str(label), f"{i:06d}.npy"), tile)
    mb = args.samples * 13 * args.size * args.size / 1e6
    print(f"wrote {args.samples} tiles of 13x{args.size}x{args.size} uint8 ({mb:.0f} MB) to {args.out}")


if __name__ == "__main__":
    main()
