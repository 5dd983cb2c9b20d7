"""Building, validating and clocking a 1F1B schedule with p = 64 stages and m = 512 microbatches;
executing a 4-stage, 8-microbatch 1F1B step of a 4-layer D=256 model on real data; the same model's
3-D step (stage x data x model = 2 x 2 x 2: pipeline, data and Megatron tensor parallelism) with
1F1B and DualPipeV.

The competitor is a unit-time lock-step simulator written the way PyTorch's pipelining dry run
(torch.distributed.pipelining.schedules._simulate_comms_compute) works: at every time step each
rank looks at the head of its action list, runs it if its dependency is already in the set of
actions done (a forward needs its receive, a receive needs the peer's send, ...), else idles one
step; actions are popped from the front of Python lists. It yields a step count, not times, and
does not model durations; it is given the same schedule (our actions, same order) so both do the
same work. torch is not needed: the loop is re-implemented here, it is not PyTorch's code.

For the execution the competitor is the same step not pipelined (``pp.reference_step``: the whole
model as one stage, one vjp over the whole batch) in the same run: the ratio is what executing the
schedule (per-microbatch vjps, shard_map per action, ppermute sends) costs on top of the math.

Run with ``OMP_NUM_THREADS=1`` on a small shared machine: OpenMP's GEMM threads spin on the
small matmuls of this model and the execution time then measures the spinning.

    OMP_NUM_THREADS=1 python benchmarks/bench_pipeline.py [--p 64] [--m 512] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import shardlab as sl
from shardlab.models import ModelConfig, transformer
from shardlab.train import pipeline as pp


def lockstep_unit_time(sched: pp.Schedule) -> int:
    """Unit-time lock-step simulation in the style of PyTorch's _simulate_comms_compute."""
    order = {s: list(sched.actions[s]) for s in range(sched.p)}
    done: dict[int, set] = {s: set() for s in order}
    timeline: dict[int, list] = {s: [] for s in order}

    def ready(a: pp.Action) -> bool:
        if a.kind == pp.FORWARD:
            return sched.virtual_stage(a.stage, a.chunk) == 0 or (pp.RECV, a.chunk, a.microbatch, pp.ACTIVATION) \
                in done[a.stage] or sched.placement(sched.virtual_stage(a.stage, a.chunk) - 1)[0] == a.stage
        if a.kind in (pp.BACKWARD, pp.BACKWARD_INPUT):
            vs = sched.virtual_stage(a.stage, a.chunk)
            return vs == sched.num_virtual_stages - 1 or (pp.RECV, a.chunk, a.microbatch, pp.GRADIENT) \
                in done[a.stage] or sched.placement(vs + 1)[0] == a.stage
        if a.kind == pp.RECV:
            vs = sched.virtual_stage(a.stage, a.chunk)
            src = vs - 1 if a.payload == pp.ACTIVATION else vs + 1
            ss, sc = sched.placement(src)
            return (pp.SEND, sc, a.microbatch, a.payload) in done[ss]
        return True  # sends and weight gradients follow their compute in the list

    while order:
        progress = False
        for s in sorted(order):
            a = order[s][0]
            if ready(a):
                order[s].pop(0)
                done[s].add((a.kind, a.chunk, a.microbatch, a.payload))
                timeline[s].append(a)
                progress = True
            else:
                timeline[s].append(None)
        for s in [s for s in order if not order[s]]:
            del order[s]
        if not progress:
            raise RuntimeError("schedule is not progressing")
    return max(len(t) for t in timeline.values())


def best_of(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p", type=int, default=64)
    ap.add_argument("--m", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    p, m = args.p, args.m

    t_build, sched = best_of(lambda: pp.one_f_one_b(p, m), args.repeats)
    t_valid, _ = best_of(lambda: pp.validate(sched), args.repeats)
    t_clock, tl = best_of(lambda: pp.clock(sched, pp.Durations(forward=1, backward=2), check=False), args.repeats)
    t_theirs, steps = best_of(lambda: lockstep_unit_time(sched), 1)

    ours = t_build + t_clock
    rows = [
        ("build 1F1B", t_build), ("validate", t_valid), ("clock (timed, dependencies)", t_clock),
        ("ours: build + clock", ours), ("ours: build + validate + clock", ours + t_valid),
        ("lock-step unit-time simulation (PyTorch style)", t_theirs),
    ]
    print(f"1F1B, p={p}, m={m}: {sched.num_actions} actions (compute, sends, receives)")
    for name, t in rows:
        print(f"  {name:<48} {t * 1e3:9.1f} ms")
    print(f"  ratio lock-step / ours (build + clock, goal < 1 s): {t_theirs / ours:.2f}x; with validation: "
          f"{t_theirs / (ours + t_valid):.2f}x")
    print(f"  our step time {tl.step_time:g} (unit forward, backward 2), bubble {tl.bubble_fraction:.6f} "
          f"= formula {pp.bubble_formula(p, m):.6f}; lock-step simulation: {steps} unit steps "
          f"(every action, sends and receives included, counts as one step)")
    ex_s, ref_s, ex, zb = bench_execute(args.repeats)
    three = bench_3d(args.repeats)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"p": p, "m": m, "actions": sched.num_actions, "build_s": t_build, "validate_s": t_valid,
                       "clock_s": t_clock, "lockstep_s": t_theirs, "lockstep_steps": steps,
                       "bubble": tl.bubble_fraction, "execute_1f1b_s": ex_s, "reference_step_s": ref_s,
                       "executed_loss": ex.loss, "executed_1f1b_step_s": ex.timeline().step_time,
                       "executed_1f1b_bubble": ex.timeline().bubble_fraction,
                       "executed_zb_h1_step_s": zb.timeline().step_time,
                       "executed_zb_h1_bubble": zb.timeline().bubble_fraction, "three_d": three}, f, indent=1)


def bench_execute(repeats: int):
    """A 4-stage, 8-microbatch 1F1B step of a 4-layer D=256 model, executed; and the same step unpipelined."""
    cfg = ModelConfig(num_layers=4, d_model=256, ffw_dim=1024, num_heads=4, num_kv_heads=4, vocab_size=256)
    params = transformer.init_params(cfg, seed=0)
    rng = np.random.default_rng(0)
    tokens, targets = rng.integers(0, 256, (16, 32)), rng.integers(0, 256, (16, 32))
    mesh = sl.make_mesh((4,), ("stage",), hardware="tpu-v5e")
    sched = pp.one_f_one_b(4, 8, num_layers=4)
    t_ex, ex = best_of(lambda: pp.execute(sched, params, tokens, targets, cfg, mesh), repeats)
    t_ref, (loss, grads) = best_of(lambda: pp.reference_step(params, tokens, targets, cfg), repeats)
    assert abs(ex.loss - loss) <= 1e-5, (ex.loss, loss)
    tl = ex.timeline()
    print(f"\nexecuting 1F1B p=4 m=8 on real data: 4 layers, D=256, batch 16 x 32 tokens "
          f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})")
    print(f"  {'ours: pp.execute (goal < 2 s)':<48} {t_ex * 1e3:9.1f} ms   loss {ex.loss:.6f}")
    print(f"  {'same step not pipelined (reference_step)':<48} {t_ref * 1e3:9.1f} ms   loss {loss:.6f}")
    print(f"  ratio pipelined / not pipelined: {t_ex / t_ref:.2f}x; {len(ex.ledger)} ledger events, "
          f"{len(ex.ledger.filter(op='ppermute'))} ppermute sends")
    print(f"  executed timeline on tpu-v5e: {tl.summary()}")
    t_zb, zb = best_of(lambda: pp.execute(pp.zb_h1(4, 8, num_layers=4), params, tokens, targets, cfg, mesh), 1)
    tz = zb.timeline()
    assert abs(zb.loss - loss) <= 1e-5, (zb.loss, loss)
    print("\nZB-H1 against 1F1B, both executed (same model and mesh), timelines clocked from their ledgers:")
    for name, t in (("1F1B", tl), ("ZB-H1", tz)):
        print(f"  {name:<6} step {t.step_time * 1e6:8.2f} us  bubble {t.bubble_fraction:.4f}  busy "
              f"{sum(t.busy) * 1e6:8.2f} us  peak activations {list(t.peak_activations)}")
    print(f"  ZB-H1 / 1F1B step: {tz.step_time / tl.step_time:.3f} (ZB-H1 executed in {t_zb * 1e3:.0f} ms)")
    return t_ex, t_ref, ex, zb


def bench_3d(repeats: int) -> dict:
    """The same model's step on a 2 x 2 x 2 (stage, data, model) mesh: 1F1B and DualPipeV executed,
    against the same step not pipelined; the ledger per mesh axis and the executed timelines."""
    cfg = ModelConfig(num_layers=4, d_model=256, ffw_dim=1024, num_heads=4, num_kv_heads=4, vocab_size=256)
    params = transformer.init_params(cfg, seed=0)
    rng = np.random.default_rng(0)
    tokens, targets = rng.integers(0, 256, (16, 32)), rng.integers(0, 256, (16, 32))
    mesh = sl.make_mesh((2, 2, 2), ("stage", "data", "model"), hardware="tpu-v5e")
    t_ref, (loss, _) = best_of(lambda: pp.reference_step(params, tokens, targets, cfg), repeats)
    print("\n3-D step: stage x data x model = 2 x 2 x 2 (tpu-v5e), 4 layers, D=256, batch 16 x 32 tokens")
    print(f"  {'same step not pipelined (reference_step)':<48} {t_ref * 1e3:9.1f} ms   loss {loss:.6f}")
    out = {"reference_step_s": t_ref}
    for name, sched in (("1F1B", pp.one_f_one_b(2, 8)), ("DualPipeV", pp.dualpipe_v(2, 8))):
        t, ex = best_of(lambda: pp.execute(sched, params, tokens, targets, cfg, mesh), repeats)
        assert abs(ex.loss - loss) <= 1e-5, (name, ex.loss, loss)
        tl = ex.timeline()
        by_axis: dict = {}
        for e in ex.ledger.events:
            if e.get("axes"):
                n, b = by_axis.get(e["axes"], (0, 0.0))
                by_axis[e["axes"]] = (n + 1, b + e["bytes_in"])
        axes = ", ".join(f"{'x'.join(a)}: {n} ({b / 2**20:.2f} MiB)" for a, (n, b) in sorted(by_axis.items()))
        print(f"  {'ours: pp.execute ' + name:<48} {t * 1e3:9.1f} ms   loss {ex.loss:.6f}  "
              f"({t / t_ref:.2f}x not pipelined)")
        print(f"    collectives per device by axis: {axes}")
        print(f"    executed timeline: step {tl.step_time * 1e6:.2f} us, bubble {tl.bubble_fraction:.4f}, "
              f"peak activations {list(tl.peak_activations)}")
        out[name] = {"execute_s": t, "step_s": tl.step_time, "bubble": tl.bubble_fraction,
                     "collectives": {"x".join(a): [n, b] for a, (n, b) in by_axis.items()}}
    return out


if __name__ == "__main__":
    main()
