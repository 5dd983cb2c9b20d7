"""Draws the README's two pictures with shardlab.viz (PNG through headless Chromium), so they
show what the current code draws.

    python docs/gen_readme_images.py
"""

from __future__ import annotations

import pathlib

import numpy as np

import shardlab as sl
from shardlab import P, viz

IMG = pathlib.Path(__file__).resolve().parent / "img"


def main() -> None:
    pod = sl.make_mesh((8, 8), ("X", "Y"), hardware="tpu-v5p", abstract=True)
    a = sl.ShapeDtypeStruct((4096, 8192), np.float32,
                            sharding=sl.NamedSharding(pod, P("X", "Y")))
    viz.sharding(a, name="A", letters="IJ").save(IMG / "sharding_8x8.png")
    line = sl.make_mesh((8,), ("X",), hardware="tpu-v5e")
    viz.collective("all_gather", line, "X", nbytes=2**30).save(IMG / "all_gather_8.png")
    print("wrote", IMG / "sharding_8x8.png", "and", IMG / "all_gather_8.png")


if __name__ == "__main__":
    main()
