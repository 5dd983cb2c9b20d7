"""train.search: the book's part 5 question (LLaMA-2 13B, 96 x 32k = 3M tokens per step, TPU v5p
16x16x16, the FFW-output checkpoints) over ``train.search.DEFAULT_STRATEGIES`` (context
parallelism included) and every mesh factorization of 4,096 chips, then over every strategy name
(ZeRO-3, ``cp_tp``; expert parallelism: refused for a dense model, listed as skipped), full
recompute. A context-parallel plan executes its ring over 2 devices and counts the ring of ``C``
in closed form (``train.estimate``), so a context axis of 2,048 costs what one of 2 does.

Ours: ``train.search`` as it runs (each plan's estimate executes two layers shape-only and counts
the second for the rest; every plan priced once and cached by strategy and mesh factorization), the first call
(cold) and a second one asking again with another recompute policy added (warm: only the new
policy's plans are priced). Competitor: the same plans priced by estimates that execute the whole
step (``execute_layers=num_layers``), which is what a search that caches nothing per plan does;
both must give the same best plan, which the script checks. Last, one context-parallel plan
(a context axis of 128) priced with its ring in closed form against executing every ring step
(what pricing CP cost before); both give the same step, which the script checks.

    python benchmarks/bench_search.py        # writes benchmarks/results/search.json
"""

from __future__ import annotations

import importlib
import json
import pathlib
import time

from common import cpu_model
from shardlab import train
from shardlab.models import presets

search_mod = importlib.import_module("shardlab.train.search")
estimate_mod = importlib.import_module("shardlab.train.estimate")
CFG = presets.get("llama2-13b")
CASES = {
    "book 16x16x16 question (ffw_outputs)": dict(chips=4096, batch=96, seq=32768, remat="ffw_outputs"),
    "all strategies x factorizations, 4096 chips (full)": dict(
        chips=4096, batch=96, seq=32768, remat="full", strategies=train.strategy.NAMES),
}


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def reference(case: dict):
    """Every plan of the search priced by an estimate that executes the whole step."""
    best = None
    for s, mesh in search_mod.plans("tpu-v5p", case["chips"], case.get("strategies"), seq=case["seq"]):
        try:
            e = train.estimate(CFG, s, mesh, "tpu-v5p", case["batch"], case["seq"], remat=case["remat"],
                               execute_layers=CFG.num_layers)
        except ValueError:
            continue
        if e.fits and (best is None or e.step_seconds < best.step_seconds):
            best = e
    return best


def main():
    rows = []
    print(f"CPU: {cpu_model()}")
    for name, case in CASES.items():
        search_mod.clear_cache()
        cold, r = timed(lambda: train.search(CFG, "tpu-v5p", **case))
        again, _ = timed(lambda: train.search(CFG, "tpu-v5p", **case))
        warm, _ = timed(lambda: train.search(CFG, "tpu-v5p", **dict(case, remat=(case["remat"], "selective"))))
        ref, best = timed(lambda: reference(case))
        assert (best.strategy, best.mesh) == (r.best.strategy, r.best.mesh), (best.mesh, r.best.mesh)
        print(f"{name}: {len(r.table)} plans priced, {len(r.skipped)} skipped; best {r.best.strategy} "
              f"{r.best.mesh} step {r.best.step_seconds * 1e3:.0f} ms, MFU {r.best.mfu:.1%}; X_opt {r.x_opt:,.0f}")
        print(f"  ours, cold:                            {cold:.2f} s   (goal < 5 s)")
        print(f"  ours, the same question again:         {again:.3f} s")
        print(f"  ours, again with 'selective' added:    {warm:.2f} s   (the cached plans are not priced again)")
        print(f"  competitor (whole step per plan):      {ref:.2f} s   ratio {ref / cold:.1f}x")
        rows.append({"case": name, "ours_cold_s": cold, "ours_again_s": again, "ours_with_selective_s": warm, "whole_step_s": ref,
                     "plans": len(r.table), "skipped": len(r.skipped), "best": [r.best.strategy, r.best.mesh]})
    # one context-parallel plan: the ring of 128 counted in closed form against executing its 128 steps
    plan = dict(cfg=CFG, strategy=train.strategy.fsdp_cp(data=("x", "y"), context="context"),
                mesh={"x": 8, "y": 4, "context": 128}, hardware="tpu-v5p", batch=96, seq=32768, remat="full")
    closed_s, closed = timed(lambda: train.estimate(**plan))
    estimate_mod._Ring.RUN = 10**9          # no closed form: every step of the ring executed shape-only
    try:
        ring_s, ring = timed(lambda: train.estimate(**plan))
    finally:
        estimate_mod._Ring.RUN = 2
    assert abs(ring.step_seconds / closed.step_seconds - 1) < 1e-9
    print(f"fsdp_cp with a context axis of 128 (LLaMA-2 13B, 96 x 32k): step {closed.step_seconds * 1e3:.0f} ms both ways")
    print(f"  ours, the ring in closed form:         {closed_s:.2f} s")
    print(f"  competitor, the ring executed:         {ring_s:.2f} s   ratio {ring_s / closed_s:.1f}x")
    rows.append({"case": "fsdp_cp context 128", "ours_s": closed_s, "ring_executed_s": ring_s})
    out = pathlib.Path(__file__).parent / "results" / "search.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"cpu": cpu_model(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
