"""Draws docs/img/step_time_validation.png: train.estimate's step time against the measured step
time of every row of the published tables in shardlab.train.data (Megatron-LM on A100, MaxText
on TPU v5p and v5e, torchtitan on A100), and prints the per-table errors shown in docs/train.md.

    python docs/gen_step_time.py
"""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from shardlab.train import validate  # noqa: E402

STYLE = {"megatron": ("o", "#4c78a8", "Megatron-LM, A100 (fitted)"),
         "maxtext-v5p": ("s", "#f58518", "MaxText, TPU v5p"),
         "maxtext-v5e": ("^", "#54a24b", "MaxText, TPU v5e"),
         "torchtitan-a100": ("D", "#e45756", "torchtitan, A100 (held out)"),
         "torch-h100": ("v", "#72b7b2", "PyTorch, one H100 (run here, nothing fitted)"),
         "torch-h200": ("P", "#b279a2", "PyTorch, one H200 (run here, nothing fitted)")}


def main():
    fig, ax = plt.subplots(figsize=(6.4, 6.0))
    lo, hi = 1e9, 0.0
    for name in validate.TABLES:
        out = validate.validate(name, show=False)
        print(out["text"], "\n")
        xs = [r.measured_seconds for r in out["rows"]]
        ys = [r.estimated_seconds for r in out["rows"]]
        marker, colour, label = STYLE[name]
        ax.scatter(xs, ys, marker=marker, color=colour, s=30,
                   label=f"{label}: mean |err| {out['mean_abs_error']:.1%}, worst {out['max_abs_error']:.1%}")
        lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
    ax.plot([lo * 0.8, hi * 1.25], [lo * 0.8, hi * 1.25], color="grey", lw=1)
    for f in (0.9, 1.1):
        ax.plot([lo * 0.8, hi * 1.25], [lo * 0.8 * f, hi * 1.25 * f], color="grey", lw=0.6, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("train.estimate step time (s)")
    ax.set_title("Step time: estimate vs published runs (dashed: ±10 %)")
    ax.legend(fontsize=7.5, loc="upper left")
    fig.tight_layout()
    out = pathlib.Path(__file__).parent / "img" / "step_time_validation.png"
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
