"""Draws docs/img/step_time_validation.png: train.estimate's step time against the measured step
time of every row of the published tables in shardlab.train.data (Megatron-LM on A100, MaxText
on TPU v5p, v5e and v4, torchtitan on A100), and prints the per-table errors shown in docs/train.md.

    python docs/gen_step_time.py
"""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from shardlab.train import validate  # noqa: E402

STYLE = {"megatron": ("o", "#4c78a8", "Megatron-LM, A100 (fitted)"),
         "maxtext-v5p": ("s", "#f58518", "MaxText, TPU v5p (fitted per chip)"),
         "maxtext-v5e": ("^", "#54a24b", "MaxText, TPU v5e (fitted per chip)"),
         "maxtext-v4": ("X", "#9d755d", "MaxText, TPU v4 (fitted on 2 of 6 rows)"),
         "torchtitan-a100": ("D", "#e45756", "torchtitan, A100 (held out)"),
         "torch-h100": ("v", "#72b7b2", "PyTorch, one H100 (run here, nothing fitted)"),
         "torch-h200": ("P", "#b279a2", "PyTorch, one H200 (run here, nothing fitted)")}


def main():
    fig, (ax, ax_err) = plt.subplots(1, 2, figsize=(12.0, 6.4), gridspec_kw={"width_ratios": [1, 1.15]})
    lo, hi = 1e9, 0.0
    for name in validate.TABLES:
        out = validate.validate(name, show=False)
        print(out["text"], "\n")
        xs = [r.measured_seconds for r in out["rows"]]
        ys = [r.estimated_seconds for r in out["rows"]]
        marker, colour, label = STYLE[name]
        ax.scatter(xs, ys, marker=marker, color=colour, s=30,
                   label=f"{label}: mean |err| {out['mean_abs_error']:.2%}, worst {out['max_abs_error']:.2%}")
        ax_err.scatter(xs, [100 * r.error for r in out["rows"]], marker=marker, color=colour, s=30)
        lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
    ax.plot([lo * 0.8, hi * 1.25], [lo * 0.8, hi * 1.25], color="grey", lw=1)
    for f in (0.9, 1.1):
        ax.plot([lo * 0.8, hi * 1.25], [lo * 0.8 * f, hi * 1.25 * f], color="grey", lw=0.6, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("train.estimate step time (s)")
    ax.set_title("Step time: estimate vs measured (dashed: ±10 %)")
    # the errors themselves: on the log-log panel a 10 % miss is a hair's breadth
    ax_err.axhspan(-10, 10, color="#54a24b", alpha=0.08, lw=0)
    ax_err.axhspan(-5, 5, color="#54a24b", alpha=0.10, lw=0)
    for y, style in ((0, "-"), (-10, "--"), (10, "--")):
        ax_err.axhline(y, color="grey", lw=0.8 if y else 1, ls=style)
    ax_err.set_xscale("log")
    ax_err.set_ylim(-13, 13)
    ax_err.set_xlabel("measured step time (s)")
    ax_err.set_ylabel("error of the estimate (%)")
    ax_err.set_title("Each row's error (goal: within ±10 %, dashed)")
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.13, 1, 1))
    out = pathlib.Path(__file__).parent / "img" / "step_time_validation.png"
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
