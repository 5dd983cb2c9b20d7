"""One training step (forward + backward + AdamW) of a 4-layer D=512 transformer, FSDP + TP on
8 virtual devices (mesh data=2 x model=4), shardlab against JAX in the same invocation.

shardlab: ``train.Trainer(cfg, "fsdp_tp", mesh, optimizer=AdamW)`` — FSDP gathers inside
checkpoint, Megatron + sequence-parallel collectives, vocab-parallel loss, all recorded.
JAX: the same architecture (RMSNorm, causal attention with rotary embeddings, gated SiLU MLP,
untied head, mean cross-entropy) written in jax.numpy, params laid out FSDP + TP with
NamedSharding on 8 host CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8),
``jax.jit(jax.value_and_grad)`` plus an AdamW update in jnp, jitted as one step.

Each side runs in its own child process (so peak RSS is its own): time per step (median of the
timed steps after one warm-up, which for JAX includes compilation), peak RSS and peak RSS above
the baseline taken after imports and parameter placement. ``--rounds N`` alternates the two
sides N times and reports each round's step times and the medians over the rounds (JAX's own
step varies by up to 30% between processes on a 2-core machine).

Both sides start from the same params (shardlab's ``init_params(cfg, seed=0)``, drawn the same
way on the JAX side) and the same tokens: the losses after the steps must agree to 1e-4
relative (exit status 1 otherwise). The model FLOPs per step (``models.flops_per_token``) over
the step time, as a fraction of the cores' FMA peak measured before and after the rounds,
shows how much of the machine each side uses: the GEMMs alone cannot run faster than that peak.
shardlab's side also times its calls into the core GEMM, so the report splits its step into the
GEMMs (seconds, GFLOP, fraction of the peak) and the rest, beside half of JAX's step.

    python benchmarks/bench_train.py [--steps 5] [--rounds 3] [--busy-core] [--json out.json]

``--busy-core`` runs both sides while another process spins on the last CPU, the way a shared
machine is: each side keeps the cores it can get (docs/kernels.md, "Threads under load").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

L, D, F, NH, V, T, B = 4, 512, 2048, 8, 4096, 128, 8


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_shardlab(steps: int) -> dict:
    import numpy as np

    import shardlab as sl
    from shardlab import _core, train
    from shardlab.models import ModelConfig, transformer

    # Every matmul of the step reaches the core through `_core.gemm` (kernels/gemm.py): timing it
    # splits the step into its GEMMs and the rest (two clock reads per call, 51 calls a step).
    inner, clock = _core.gemm, {"s": 0.0, "flop": 0}

    def timed_gemm(a, b, *rest, **kw):
        t0 = time.perf_counter()
        out = inner(a, b, *rest, **kw)
        clock["s"] += time.perf_counter() - t0
        clock["flop"] += 2 * out.size * a.shape[-1]
        return out

    _core.gemm = timed_gemm
    cfg = ModelConfig(num_layers=L, d_model=D, ffw_dim=F, num_heads=NH, vocab_size=V, max_seq_len=T)
    t = train.Trainer(cfg, "fsdp_tp", sl.make_mesh((2, 4), ("data", "model")), optimizer=train.AdamW(lr=1e-3))
    state = t.init(transformer.init_params(cfg, seed=0))
    rng = np.random.default_rng(0)
    tok, tgt = rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))
    base = _rss_mb()
    times, gemm_s = [], []
    for _ in range(steps + 1):
        clock["s"], clock["flop"] = 0.0, 0
        t0 = time.perf_counter()
        state, loss = t.step(state, tok, tgt)
        times.append(time.perf_counter() - t0)
        gemm_s.append(clock["s"])
    return {"step_s": statistics.median(times[1:]), "first_s": times[0], "loss": float(loss),
            "peak_rss_mb": _peak_mb(), "base_rss_mb": base, "gemm_s": statistics.median(gemm_s[1:]),
            "gemm_gflop": clock["flop"] / 1e9}


def run_jax(steps: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))  # GSPMD propagation
    H = D // NH
    # The same initial params as shardlab's ``transformer.init_params(cfg, seed=0)`` (same draws
    # in the same order) and the same tokens, so the two sides train the same model on the same
    # data: main() checks that their losses agree.
    rng = np.random.default_rng(0)
    w = lambda *s: rng.standard_normal(s, dtype=np.float32) * 0.02  # noqa: E731
    params = {"embed": (w(V, D), P("model", "data")), "final": (np.ones(D, np.float32), P()), "layers": []}
    for _ in range(L):
        params["layers"].append({
            "n1": (np.ones(D, np.float32), P()), "n2": (np.ones(D, np.float32), P()),
            "wq": (w(D, D), P("data", "model")), "wk": (w(D, D), P("data", "model")),
            "wv": (w(D, D), P("data", "model")), "wo": (w(D, D), P("model", "data")),
            "wg": (w(D, F), P("data", "model")), "wu": (w(D, F), P("data", "model")),
            "wd": (w(F, D), P("model", "data"))})
    params["head"] = (w(D, V), P("data", "model"))
    is_leaf = lambda x: isinstance(x, tuple)  # noqa: E731
    params = jax.tree.map(lambda x: jax.device_put(x[0], NamedSharding(mesh, x[1])), params, is_leaf=is_leaf)
    zeros = jax.tree.map(jnp.zeros_like, params)
    opt = (zeros, jax.tree.map(jnp.zeros_like, params))

    def rms(x, s):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-5) * s

    half = H // 2
    ang = np.outer(np.arange(T, dtype=np.float64), 1.0 / 10000.0 ** (np.arange(half) / half))  # as shardlab: float64
    cos, sin = (jnp.asarray(f(ang).astype(np.float32))[None, :, None] for f in (np.cos, np.sin))

    def rope(x):
        x1, x2 = x[..., :half], x[..., half:]
        return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)

    def loss_fn(p, tok, tgt):
        x = p["embed"][tok]
        mask = jnp.tril(jnp.ones((T, T), bool))
        for lp in p["layers"]:
            h = rms(x, lp["n1"])
            q, k, v = (jnp.reshape(h @ lp[n], (B, T, NH, H)) for n in ("wq", "wk", "wv"))
            q, k = rope(q), rope(k)
            s = jnp.einsum("bqnh,bknh->bnqk", q, k) / np.sqrt(H)
            a = jax.nn.softmax(jnp.where(mask, s, -1e30), -1)
            x = x + jnp.reshape(jnp.einsum("bnqk,bknh->bqnh", a, v), (B, T, D)) @ lp["wo"]
            h = rms(x, lp["n2"])
            x = x + (jax.nn.silu(h @ lp["wg"]) * (h @ lp["wu"])) @ lp["wd"]
        logits = rms(x, p["final"]) @ p["head"]
        lse = jax.nn.logsumexp(logits, -1)
        return jnp.mean(lse - jnp.take_along_axis(logits, tgt[..., None], -1)[..., 0])

    @jax.jit
    def step(p, opt, tok, tgt, k):
        loss, g = jax.value_and_grad(loss_fn)(p, tok, tgt)
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, opt[0], g)
        v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, opt[1], g)
        c1, c2 = 1 - 0.9 ** k, 1 - 0.999 ** k
        p = jax.tree.map(lambda p, m, v: p - 1e-3 * (m / c1) / (jnp.sqrt(v / c2) + 1e-8), p, m, v)
        return p, (m, v), loss

    bs = NamedSharding(mesh, P("data", None))
    rng = np.random.default_rng(0)  # the tokens run_shardlab draws
    tok = jax.device_put(rng.integers(0, V, (B, T)).astype(np.int32), bs)
    tgt = jax.device_put(rng.integers(0, V, (B, T)).astype(np.int32), bs)
    base = _rss_mb()
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        params, opt, loss = step(params, opt, tok, tgt, jnp.float32(i + 1))
        loss.block_until_ready()
        times.append(time.perf_counter() - t0)
    return {"step_s": statistics.median(times[1:]), "first_s": times[0], "loss": float(loss),
            "peak_rss_mb": _peak_mb(), "base_rss_mb": base}


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# A process that keeps the last CPU busy (--busy-core): another program sharing the machine.
_SPIN = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"


def _child(which: str, steps: int, busy_core: bool = False) -> dict:
    env = dict(os.environ)
    if which == "jax":
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    spinner = None
    if busy_core:
        spinner = subprocess.Popen([sys.executable, "-c", _SPIN, str(max(os.sched_getaffinity(0)))])
    try:
        out = subprocess.run([sys.executable, __file__, "--child", which, "--steps", str(steps)], env=env,
                             capture_output=True, text=True, check=True)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1, help="alternate the two sides this many times; "
                    "report each round and the medians (JAX's step varies between processes)")
    ap.add_argument("--busy-core", action="store_true", help="run each side while another process keeps "
                    "the last CPU busy (a spinning loop pinned to it), as when the machine is shared")
    ap.add_argument("--json")
    ap.add_argument("--child", choices=("shardlab", "jax"))
    a = ap.parse_args()
    if a.child:
        print(json.dumps((run_shardlab if a.child == "shardlab" else run_jax)(a.steps)))
        return 0
    # Imported here, not at the top: each child runs this file too, and the JAX child must not
    # carry shardlab in its memory figures.
    from shardlab import _core
    from shardlab.models import ModelConfig, flops_per_token

    load_before = os.getloadavg()[0]
    peaks = [_core.measure_fma_peak_gflops(os.cpu_count() or 1)]
    rounds = [(_child("shardlab", a.steps, a.busy_core), _child("jax", a.steps, a.busy_core))
              for _ in range(a.rounds)]
    peaks.append(_core.measure_fma_peak_gflops(os.cpu_count() or 1))
    print(f"CPU: {_cpu()} ({os.cpu_count()} logical cores); load {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    print(f"model: {L} layers, D={D}, F={F}, {NH} heads, V={V}; batch {B}x{T}; FSDP+TP on data=2 x model=4")
    if a.busy_core:
        print(f"one core busy: a spinning process pinned to CPU {max(os.sched_getaffinity(0))} during each side's run")
    if a.rounds > 1:
        for i, (o, j) in enumerate(rounds):
            print(f"round {i + 1}: step shardlab {o['step_s']:.3f} s, JAX {j['step_s']:.3f} s, "
                  f"JAX/ours {j['step_s'] / o['step_s']:.2f}")
        print(f"median over the {a.rounds} rounds, each side alternating in its own process:")
    ours = {k: statistics.median(o[k] for o, _ in rounds) for k in rounds[0][0]}
    jax_ = {k: statistics.median(j[k] for _, j in rounds) for k in rounds[0][1]}
    print(f"{'':26s}{'shardlab':>12s}{'JAX':>12s}{'JAX/ours':>10s}")
    rows = [("step time (s, median)", "step_s"), ("first step (s)", "first_s"), ("peak RSS (MB)", "peak_rss_mb")]
    for label, k in rows:
        print(f"{label:26s}{ours[k]:12.3f}{jax_[k]:12.3f}{jax_[k] / ours[k]:10.2f}")
    d_o, d_j = ours["peak_rss_mb"] - ours["base_rss_mb"], jax_["peak_rss_mb"] - jax_["base_rss_mb"]
    print(f"{'peak RSS above baseline':26s}{d_o:12.1f}{d_j:12.1f}{d_j / d_o if d_o else float('nan'):10.2f}")
    cfg = ModelConfig(num_layers=L, d_model=D, ffw_dim=F, num_heads=NH, vocab_size=V, max_seq_len=T)
    gflop = flops_per_token(cfg, T).total * B * T / 1e9
    peak = max(peaks)
    print(f"model FLOPs per step {gflop:.1f} GFLOP; FMA peak of the {os.cpu_count()} cores "
          f"{peaks[0]:.0f} GFLOP/s before, {peaks[1]:.0f} after; fraction of the peak: shardlab "
          f"{gflop / ours['step_s'] / peak:.2f}, JAX {gflop / jax_['step_s'] / peak:.2f}")
    # What 2x would take: the GEMMs' share of that budget, at the speed they ran.
    g_s, g_fl, budget = ours["gemm_s"], ours["gemm_gflop"], jax_["step_s"] / 2
    print(f"shardlab's step: GEMMs {g_s:.3f} s ({g_fl:.1f} GFLOP at {g_fl / g_s / peak:.2f} of the peak), "
          f"the rest {ours['step_s'] - g_s:.3f} s; 2x JAX is {budget:.3f} s, {g_s / budget:.0%} of it "
          f"taken by the GEMMs alone")
    # Both sides start from the same params and data: a loss that differs means they do not
    # run the same program, and the times above compare nothing.
    rel = abs(ours["loss"] - jax_["loss"]) / abs(jax_["loss"])
    print(f"loss after the steps: shardlab {ours['loss']:.6f}, JAX {jax_['loss']:.6f} (relative difference {rel:.1e})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": _cpu(), "shardlab": ours, "jax": jax_, "rounds": rounds, "gflop_per_step": gflop,
                       "fma_peak_gflops": peaks}, f, indent=1)
    if rel > 1e-4:
        print("the two sides' losses differ: they did not train the same model", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
