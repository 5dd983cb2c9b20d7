"""Measures what one NVIDIA GPU reaches, with PyTorch, for shardlab's price lists.

Run on a machine with the GPU (not part of ``make bench``: it needs CUDA and PyTorch)::

    python benchmarks/device/measure_gpu.py --out gpu_measured.json [--parts gemm,memory,attention,train,serve]

It measures, each as the median of timed repetitions after warm-ups (CUDA events):

* **GEMMs**: bf16 ``(M, K) @ (K, N)`` for square sizes 256..16384 and the skinny shapes of
  decoding and of the two models below; fp8 (``torch._scaled_mm``) on a few sizes;
* **memory-bound kernels**: a device-to-device copy and an elementwise add, 1 MiB..4 GiB;
* **attention**: ``scaled_dot_product_attention`` (causal, bf16, head width 128), forward and
  forward+backward, with each backend PyTorch offers;
* **training steps**: two LLaMA-style models written as torchtitan writes them (eager RMSNorm
  in fp32, rotary through complex numbers, SwiGLU as ``silu`` then ``*``, fp32 logits for the
  cross-entropy, flash attention), bf16 parameters with fp32 master weights and AdamW moments,
  gradient clipping; without recompute, with full recompute, and with each block
  ``torch.compile``d; step time and peak memory;
* **serving** (model 2, bf16): decode steps at a 2,048-token context for batches 1, 16 and 64,
  eager, replayed as a CUDA graph, and (batches 1 and 64) ``torch.compile(mode="reduce-overhead")``
  (fused kernels; inductor skips the CUDA graph because the K/V writes mutate inputs), with the
  kernels each launches (PyTorch's profiler); prefills of 1 and 8 prompts of 2,048 tokens.

The figures are written as JSON; ``python/shardlab/train/data/gpu_measured.py`` transcribes them
with the device named, and ``shardlab.train.validate.validate("torch-h100")`` (or ``"torch-h200"``)
estimates the same training steps; tests/python/test_gpu_measured.py checks the price lists
against the kernels.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
from torch.utils.checkpoint import checkpoint

T0 = time.time()


def timed(fn, min_seconds=0.03, warm=3, trials=5):
    """Median seconds of one call of ``fn`` (back to back, as a training step runs kernels)."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    one = max(start.elapsed_time(end) / 1e3, 1e-6)
    n = max(1, min(1000, int(min_seconds / one)))
    runs = []
    for _ in range(trials):
        start.record()
        for _ in range(n):
            fn()
        end.record()
        torch.cuda.synchronize()
        runs.append(start.elapsed_time(end) / 1e3 / n)
    runs.sort()
    return runs[len(runs) // 2]


def gemms():
    out = []
    shapes = [(s, s, s) for s in (256, 512, 1024, 2048, 4096, 8192, 16384)]
    shapes += [(m, 8192, 8192) for m in (1, 16, 64, 128, 256, 1024)]          # decoding, prefill
    shapes += [(16384, 2048, 2048), (16384, 2048, 5632), (16384, 5632, 2048), (16384, 2048, 32000),
               (8192, 4096, 4096), (8192, 4096, 14336), (8192, 14336, 4096), (8192, 4096, 32000)]
    for m, k, n in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        t = timed(lambda: torch.matmul(a, b, out=c))
        out.append({"dtype": "bfloat16", "m": m, "k": k, "n": n, "seconds": t,
                    "tflops": 2 * m * k * n / t / 1e12})
        del a, b, c
    for s in (2048, 4096, 8192, 16384):
        try:
            a = torch.randn(s, s, device="cuda").to(torch.float8_e4m3fn)
            b = torch.randn(s, s, device="cuda").to(torch.float8_e4m3fn).t()   # column-major
            one = torch.ones((), device="cuda")
            t = timed(lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16))
            out.append({"dtype": "float8_e4m3fn", "m": s, "k": s, "n": s, "seconds": t,
                        "tflops": 2 * s ** 3 / t / 1e12})
        except Exception as exc:  # noqa: BLE001 -- record what failed, go on
            out.append({"dtype": "float8_e4m3fn", "m": s, "error": repr(exc)[:200]})
    return out


def memory_bound():
    out = []
    for mib in (1, 4, 16, 64, 256, 1024, 4096):
        n = mib * 2 ** 20 // 2
        x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        t = timed(lambda: y.copy_(x))
        out.append({"kernel": "copy", "bytes": 2 * 2 * n, "seconds": t, "gbps": 4 * n / t / 1e9})
        z = torch.empty_like(x)
        t = timed(lambda: torch.add(x, y, out=z))
        out.append({"kernel": "add", "bytes": 3 * 2 * n, "seconds": t, "gbps": 6 * n / t / 1e9})
        del x, y, z
    return out


def attention():
    out = []
    backends = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    for b, h, s in ((8, 16, 2048), (4, 32, 4096), (1, 32, 8192), (1, 16, 16384)):
        q, k, v = (torch.randn(b, h, s, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        g = torch.randn(b, h, s, 128, device="cuda", dtype=torch.bfloat16)
        for name, be in backends.items():
            def fwd():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def fwd_bwd():
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                o.backward(g)
            try:
                if be is None:
                    tf, tfb = timed(fwd), timed(fwd_bwd)
                else:
                    with sdpa_kernel([be]):
                        tf, tfb = timed(fwd), timed(fwd_bwd)
            except Exception as exc:  # noqa: BLE001 -- a backend PyTorch lacks here
                out.append({"backend": name, "b": b, "h": h, "s": s, "error": repr(exc)[:200]})
                continue
            causal_fwd = 4 * b * h * s * s * 128 / 2     # QK^T and PV over the causal half
            out.append({"backend": name, "b": b, "h": h, "s": s, "d": 128, "fwd_seconds": tf,
                        "fwd_bwd_seconds": tfb, "fwd_tflops": causal_fwd / tf / 1e12,
                        "bwd_tflops": 2.5 * causal_fwd / (tfb - tf) / 1e12})
        del q, k, v, g
    return out


# ----- a torchtitan-style LLaMA ------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotary_freqs(head_dim, seq):
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    ang = torch.outer(torch.arange(seq).float(), inv)
    return torch.polar(torch.ones_like(ang), ang)[None, :, None, :]


def rotary(x, freqs):
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs).flatten(3).type_as(x)


class Block(nn.Module):
    def __init__(self, d, f, heads):
        super().__init__()
        self.heads = heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.w1, self.w3 = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)
        self.attention_norm, self.ffn_norm = RMSNorm(d), RMSNorm(d)

    def forward(self, x, freqs):
        b, s, d = x.shape
        h = self.attention_norm(x)
        q, k, v = (w(h).view(b, s, self.heads, -1) for w in (self.wq, self.wk, self.wv))
        q, k = rotary(q, freqs), rotary(k, freqs)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, d))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, layers, d, f, heads, vocab, seq, remat):
        super().__init__()
        self.remat = remat
        self.tok = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d, f, heads) for _ in range(layers))
        self.norm, self.output = RMSNorm(d), nn.Linear(d, vocab, bias=False)
        self.freqs = rotary_freqs(d // heads, seq)    # complex64; not a buffer, so .to(bf16) keeps it

    def forward(self, tokens, targets):
        x = self.tok(tokens)
        for layer in self.layers:
            x = checkpoint(layer, x, self.freqs, use_reentrant=False) if self.remat else layer(x, self.freqs)
        logits = self.output(self.norm(x)).float()
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def train_step_time(cfg, batch, seq, remat, compiled, steps=8):
    torch.manual_seed(0)
    model = Llama(cfg["num_layers"], cfg["d_model"], cfg["ffw_dim"], cfg["num_heads"], cfg["vocab_size"],
                  seq, remat).cuda().to(torch.bfloat16)
    model.freqs = model.freqs.cuda()
    if compiled:
        for layer in model.layers:
            layer.compile()
    params = [p for p in model.parameters()]
    master = [p.detach().float().clone() for p in params]
    for m in master:
        m.grad = torch.zeros_like(m)
    opt = torch.optim.AdamW(master, lr=1e-5, fused=True)
    tokens = torch.randint(0, cfg["vocab_size"], (batch, seq), device="cuda")
    targets = torch.randint(0, cfg["vocab_size"], (batch, seq), device="cuda")

    def step():
        loss = model(tokens, targets)
        loss.backward()
        torch._foreach_copy_([m.grad for m in master], [p.grad for p in params])
        torch.nn.utils.clip_grad_norm_(master, 1.0, foreach=True)
        opt.step()
        with torch.no_grad():
            torch._foreach_copy_(params, master)
        model.zero_grad(set_to_none=True)
        return loss

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    n_params = sum(p.numel() for p in params)
    peak = torch.cuda.max_memory_allocated()
    del model, params, master, opt
    torch.cuda.empty_cache()
    times.sort()
    return {"model": cfg, "batch": batch, "seq": seq, "remat": "full" if remat else "none",
            "kernels": "fused" if compiled else "eager", "params": n_params, "step_seconds": times[len(times) // 2],
            "step_seconds_min": times[0], "peak_bytes": peak}


def decode_fn(model, caches, pos):
    """One decoding step of ``model`` at position ``pos`` with static K/V caches (B, heads, T, hd)."""
    freqs = model.freqs[:, pos:pos + 1]

    def step(tokens):
        x = model.tok(tokens)
        b = x.shape[0]
        for layer, (kc, vc) in zip(model.layers, caches):
            h = layer.attention_norm(x)
            q, k, v = (w(h).view(b, 1, layer.heads, -1) for w in (layer.wq, layer.wk, layer.wv))
            q, k = rotary(q, freqs), rotary(k, freqs)
            kc[:, :, pos] = k[:, 0]
            vc[:, :, pos] = v[:, 0]
            o = F.scaled_dot_product_attention(q.transpose(1, 2), kc[:, :, :pos + 1], vc[:, :, :pos + 1])
            x = x + layer.wo(o.transpose(1, 2).reshape(b, 1, -1))
            h = layer.ffn_norm(x)
            x = x + layer.w2(F.silu(layer.w1(h)) * layer.w3(h))
        return model.output(model.norm(x)).argmax(-1)
    return step


def kernel_count(fn):
    """GPU kernels (and copies) one call of ``fn`` launches, from the profiler's CUDA events."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def prefill_fn(model):
    """The forward pass over a prompt, logits of its last token (the K/V writes are left out)."""
    def run(tokens):
        x = model.tok(tokens)
        for layer in model.layers:
            x = layer(x, model.freqs[:, :tokens.shape[1]])
        return model.output(model.norm(x[:, -1:])).argmax(-1)
    return run


@torch.no_grad()
def serve_steps():
    """Decode steps (eager and replayed as a CUDA graph) and prefills of llama-7b-8l in bf16."""
    cfg = MODELS[1][0]
    context = 2048
    torch.manual_seed(0)
    model = Llama(cfg["num_layers"], cfg["d_model"], cfg["ffw_dim"], cfg["num_heads"], cfg["vocab_size"],
                  context + 16, False).cuda().to(torch.bfloat16).eval()
    model.freqs = model.freqs.cuda()
    hd = cfg["d_model"] // cfg["num_heads"]
    out = []
    for batch in (1, 16, 64):
        caches = [tuple(torch.randn(batch, cfg["num_heads"], context + 16, hd, device="cuda", dtype=torch.bfloat16)
                        for _ in range(2)) for _ in range(cfg["num_layers"])]
        tokens = torch.randint(0, cfg["vocab_size"], (batch, 1), device="cuda")
        step = decode_fn(model, caches, context)
        eager = timed(lambda: step(tokens))
        row = {"phase": "decode", "model": cfg["name"], "batch": batch, "context": context, "eager_seconds": eager}
        try:
            graph = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    step(tokens)
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(graph):
                step(tokens)
            row["graph_seconds"] = timed(graph.replay)
            del graph
        except Exception as exc:  # noqa: BLE001 -- keep the eager figure
            row["graph_error"] = repr(exc)[:200]
        row["kernels"] = kernel_count(lambda: step(tokens))
        if batch in (1, 64):
            try:
                fused = torch.compile(step)                                      # inductor's fused kernels
                row["compiled_kernels"] = kernel_count(lambda: fused(tokens))
                # asked to replay as a CUDA graph; inductor declines (the K/V writes mutate inputs) and
                # launches the fused kernels one by one
                fast = torch.compile(step, mode="reduce-overhead")
                row["compiled_seconds"] = timed(lambda: fast(tokens), warm=5)
            except Exception as exc:  # noqa: BLE001
                row["compiled_error"] = repr(exc)[:200]
            torch._dynamo.reset()
        out.append(row)
        print(" ", row, flush=True)
        del caches
        torch.cuda.empty_cache()
    run = prefill_fn(model)
    for batch, tokens_each in ((1, 2048), (8, 2048)):
        tokens = torch.randint(0, cfg["vocab_size"], (batch, tokens_each), device="cuda")
        out.append({"phase": "prefill", "model": cfg["name"], "batch": batch, "tokens": tokens_each,
                    "seconds": timed(lambda: run(tokens))})
        print(" ", out[-1], flush=True)
    return out


MODELS = [
    ({"name": "llama-1b", "num_layers": 16, "d_model": 2048, "ffw_dim": 5632, "num_heads": 16, "vocab_size": 32000},
     8, 2048),
    ({"name": "llama-7b-8l", "num_layers": 8, "d_model": 4096, "ffw_dim": 14336, "num_heads": 32,
      "vocab_size": 32000}, 2, 4096),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_measured.json")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds; optional parts are skipped past it")
    ap.add_argument("--parts", default="gemm,memory,attention,train,serve", help="comma-separated parts to run")
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,power.limit",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    res = {"device": props.name, "memory_bytes": props.total_memory, "sms": props.multi_processor_count,
           "nvidia_smi": smi, "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "host": platform.node(),
           "date": time.strftime("%Y-%m-%d", time.gmtime())}
    print(res, flush=True)

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    parts = set(args.parts.split(","))
    for name, fn in (("gemm", gemms), ("memory", memory_bound), ("attention", attention), ("serve", serve_steps)):
        if name not in parts:
            continue
        t = time.time()
        try:
            res[name] = fn()
        except Exception as exc:  # noqa: BLE001 -- keep the other parts
            res[name] = {"error": repr(exc)[:400]}
        print(f"{name}: {time.time() - t:.1f} s", flush=True)
        for row in res[name] if isinstance(res[name], list) else [res[name]]:
            print(" ", row, flush=True)
        save()
    if "train" not in parts:
        return
    res["train"] = []
    plan = [(0, False, False), (0, True, False), (1, False, False), (1, True, False), (0, False, True),
            (1, False, True), (0, True, True)]
    for i, remat, compiled in plan:
        if time.time() - T0 > args.budget:
            res["train"].append({"model": MODELS[i][0]["name"], "skipped": "past the time budget"})
            continue
        cfg, batch, seq = MODELS[i]
        t = time.time()
        try:
            row = train_step_time(cfg, batch, seq, remat, compiled)
        except Exception as exc:  # noqa: BLE001
            row = {"model": cfg["name"], "remat": remat, "compiled": compiled, "error": repr(exc)[:400]}
            torch.cuda.empty_cache()
        row["wall_seconds"] = time.time() - t
        print(row, flush=True)
        res["train"].append(row)
        save()
    print(f"total {time.time() - T0:.1f} s")


if __name__ == "__main__":
    main()
