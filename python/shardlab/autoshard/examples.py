"""Global-view programs to search: a decoder block stack written with ``shardlab.numpy`` einsums
(RMS norm, multi-head attention with softmax, tanh MLP, residuals) and its SGD training step.

These are small hand-written programs on global arrays, which is what autoshard traces and
shards (the model library's own step is `autoshard.model`'s). Shapes follow the book:
B sequences of T tokens, model dim D, H heads of K, MLP dim F.

>>> import numpy as np
>>> from shardlab.autoshard import examples
>>> params, x = examples.init(layers=2, batch=2, seq=4, d_model=8, heads=2, head_dim=4, ffw=16)
>>> loss, new = examples.train_step(params, x)
>>> round(float(loss), 4) == round(float(examples.loss(params, x)), 4), len(new)
(True, 2)
"""

from __future__ import annotations

import numpy as np

import shardlab as sl
import shardlab.numpy as jnp
from shardlab.sharding import PartitionSpec as P

__all__ = ["init", "abstract", "block", "forward", "loss", "train_step", "mlp_step", "adam_mlp_step", "strategies", "LEARNING_RATE"]

LEARNING_RATE = 0.1


def init(layers=2, batch=4, seq=8, d_model=16, heads=2, head_dim=8, ffw=32, seed=0, dtype=np.float32):
    """Random parameters (a list of per-layer dicts) and an input batch ``x[B, T, D]``."""
    rng = np.random.default_rng(seed)
    D, H, K, F = d_model, heads, head_dim, ffw

    def w(*s):
        return (rng.standard_normal(s) / np.sqrt(s[0])).astype(dtype)

    params = [dict(wq=w(D, H, K), wk=w(D, H, K), wv=w(D, H, K), wo=w(H, K, D) / np.sqrt(H), w1=w(D, F), w2=w(F, D))
              for _ in range(layers)]
    return params, rng.standard_normal((batch, seq, D)).astype(dtype)


def abstract(layers, batch, seq, d_model, heads, head_dim, ffw, dtype=np.float32):
    """The same shapes as ShapeDtypeStructs (no data), for planning at any size."""
    D, H, K, F = d_model, heads, head_dim, ffw

    def s(*shape):
        return sl.ShapeDtypeStruct(shape, dtype)

    return ([dict(wq=s(D, H, K), wk=s(D, H, K), wv=s(D, H, K), wo=s(H, K, D), w1=s(D, F), w2=s(F, D))
             for _ in range(layers)], s(batch, seq, D))


def _rms(x):
    return x * jnp.reciprocal(jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6))


def block(p, x):
    """One pre-norm decoder block: attention then MLP, each with a residual."""
    h = _rms(x)
    q = jnp.einsum("btd,dhk->bthk", h, p["wq"])
    k = jnp.einsum("btd,dhk->bthk", h, p["wk"])
    v = jnp.einsum("btd,dhk->bthk", h, p["wv"])
    s = jnp.einsum("bthk,bshk->bhts", q, k) * float(1.0 / np.sqrt(q.shape[-1]))
    s = s - jnp.max(s, axis=-1, keepdims=True)
    e = jnp.exp(s)
    a = e / jnp.sum(e, axis=-1, keepdims=True)
    o = jnp.einsum("bhts,bshk->bthk", a, v)
    x = x + jnp.einsum("bthk,hkd->btd", o, p["wo"])
    h = jnp.tanh(jnp.einsum("btd,df->btf", _rms(x), p["w1"]))
    return x + jnp.einsum("btf,fd->btd", h, p["w2"])


def forward(params, x):
    for p in params:
        x = block(p, x)
    return x


def loss(params, x):
    """Mean square of the last block's output (a stand-in for a language-model loss)."""
    y = forward(params, x)
    return jnp.mean(y * y)


def train_step(params, x):
    """One SGD step: the loss and the updated parameters."""
    value, grads = sl.value_and_grad(loss)(params, x)
    new = [{k: p[k] - LEARNING_RATE * g[k] for k in p} for p, g in zip(params, grads)]
    return value, new


def mlp_step(params, x):
    """The book's part-5 model: ``Out[B, D] = In[B, D] ·_D W_in[D, F] ·_F W_out[F, D]`` per
    layer (no attention), its loss and SGD step; `params` is a list of ``(w_in, w_out)``."""

    def f(ps, x):
        for w_in, w_out in ps:
            x = x + jnp.einsum("bf,fd->bd", jnp.tanh(jnp.einsum("bd,df->bf", x, w_in)), w_out)
        return jnp.mean(x * x)

    value, grads = sl.value_and_grad(f)(params, x)
    return value, [(w - LEARNING_RATE * gw, v - LEARNING_RATE * gv) for (w, v), (gw, gv) in zip(params, grads)]


def adam_mlp_step(params, m, v, x):
    """The book's part-5 model as LLaMA has it (a gated MLP per layer: ``(w_in, w_gate, w_out)``,
    attention left out as the book's estimate leaves it out) with Adam: the first and second
    moments are inputs and outputs, as a training step keeps them, so memory counts the
    parameters and two optimizer states per weight."""

    def f(ps, x):
        for w_in, w_gate, w_out in ps:
            h = jnp.tanh(jnp.einsum("bd,df->bf", x, w_in)) * jnp.einsum("bd,df->bf", x, w_gate)
            x = x + jnp.einsum("bf,fd->bd", h, w_out)
        return jnp.mean(x * x)

    value, grads = sl.value_and_grad(f)(params, x)
    b1, b2, eps = 0.9, 0.95, 1e-8
    new_p, new_m, new_v = [], [], []
    for p, mm, vv, g in zip(params, m, v, grads):
        mm2 = tuple(b1 * a + (1 - b1) * b for a, b in zip(mm, g))
        vv2 = tuple(b2 * a + (1 - b2) * b * b for a, b in zip(vv, g))
        new_p.append(tuple(w - LEARNING_RATE * a / (jnp.sqrt(c) + eps) for w, a, c in zip(p, mm2, vv2)))
        new_m.append(mm2)
        new_v.append(vv2)
    return value, new_p, new_m, new_v


def strategies(params, data: str = "x", model: str = "y") -> dict:
    """The hand-written strategies of ``shardlab.train.strategy`` for `train_step`'s arguments
    on a mesh with a `data` and a `model` axis, as ``{name: (param specs, batch spec)}``
    (`autoshard`'s ``in_specs``): data parallelism over both axes (``dp``), FSDP over both
    (``fsdp``), Megatron tensor parallelism over both (``tp``), and FSDP over `data` with
    Megatron over `model` (``fsdp_tp``, the book's part-5 plan)."""
    both = (data, model)
    per = {
        "dp": dict(wq=P(), wk=P(), wv=P(), wo=P(), w1=P(), w2=P()),
        "fsdp": dict(wq=P(both), wk=P(both), wv=P(both), wo=P(None, None, both), w1=P(both), w2=P(None, both)),
        "tp": dict(wq=P(None, both), wk=P(None, both), wv=P(None, both), wo=P(both), w1=P(None, both), w2=P(both)),
        "fsdp_tp": dict(wq=P(data, model), wk=P(data, model), wv=P(data, model), wo=P(model, None, data),
                        w1=P(data, model), w2=P(model, data)),
    }
    batch = {"dp": P(both), "fsdp": P(both), "tp": P(), "fsdp_tp": P(data)}
    return {name: ([dict(spec) for _ in params], batch[name]) for name, spec in per.items()}
