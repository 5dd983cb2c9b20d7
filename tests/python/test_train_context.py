"""Context parallelism: ring attention against plain attention and JAX (forward and gradients,
causal zig-zag and not), its ledger against the closed form, and training under cp / fsdp_cp /
cp_tp against the single-device run."""

import jax
import jax.numpy as jjnp
import numpy as np
import pytest

import shardlab as sl
import shardlab.numpy as jnp
from shardlab import P, lax, train
from shardlab.models import ModelConfig, param_axes, presets, transformer
from shardlab.train import context
from shardlab.train.step import tree_map
from shardlab.train.strategy import param_sizes
from training_reference import rel_error, steps_error

B, T, N, K, H = 2, 16, 4, 2, 8  # grouped-query: 4 query heads over 2 kv heads


def _qkv(seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, N, H)).astype(np.float32)
    k = rng.standard_normal((B, T, K, H)).astype(np.float32)
    v = rng.standard_normal((B, T, K, H)).astype(np.float32)
    w = rng.standard_normal((B, T, N, H)).astype(np.float32)
    return q, k, v, w


def _ring(n, causal):
    """sum(ring_attention(q, k, v) * w) over a context axis of size n, and the global inputs
    placed in zig-zag order."""
    mesh = sl.make_mesh((n,), ("context",))
    spec = P(None, "context")

    def body(q, k, v, w):
        o = context.ring_attention(q, k, v, "context", is_causal=causal)
        return o, lax.psum(jnp.sum(o * w), "context")

    f = sl.shard_map(body, mesh=mesh, in_specs=(spec,) * 4, out_specs=(spec, P()))

    def place(x):
        return sl.device_put(context.to_zigzag(x, n), sl.NamedSharding(mesh, spec))

    return f, place


def _rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


def test_zigzag_order_gives_device_i_chunks_i_and_2n_minus_1_minus_i():
    order = context.zigzag_order(16, 4)
    chunks = order.reshape(8, 2)[:, 0] // 2
    assert chunks.tolist() == [0, 7, 1, 6, 2, 5, 3, 4]
    x = np.arange(2 * 16).reshape(2, 16)
    assert np.array_equal(context.from_zigzag(context.to_zigzag(x, 4), 4), x)
    # causal work per device (pairs of positions with key <= query) is the same on every device
    work = [int((np.arange(16)[None, :] <= p[:, None]).sum()) for p in order.reshape(4, 4)]
    assert work == [34] * 4  # 136 = 16·17/2 pairs in all


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_ring_attention_equals_plain_attention_and_jax_forward_and_gradients(n, causal):
    q, k, v, w = _qkv(n)
    f, place = _ring(n, causal)
    out, _ = f(*map(place, (q, k, v, w)))
    plain = sl.nn.dot_product_attention(q, k, v, is_causal=causal)
    assert _rel(context.from_zigzag(out, n), plain) <= 1e-5

    grads = sl.grad(lambda q, k, v: f(q, k, v, place(w))[1], argnums=(0, 1, 2))(*map(place, (q, k, v)))
    jax_grads = jax.grad(lambda q, k, v: jjnp.sum(jax.nn.dot_product_attention(q, k, v, is_causal=causal) * w),
                         argnums=(0, 1, 2))(q, k, v)
    plain_grads = sl.nn.dot_product_attention_vjp(q, k, v, w, is_causal=causal)
    for ours, theirs, flash in zip(grads, jax_grads, plain_grads):
        ours = context.from_zigzag(ours, n)
        assert _rel(ours, theirs) <= 1e-5
        assert _rel(ours, flash) <= 1e-5


@pytest.mark.parametrize("n", [2, 4])
def test_ring_ledger_is_2_n_minus_1_kv_hops_forward_and_the_reverse_ring_backward(n):
    q, k, v, w = _qkv()
    f, place = _ring(n, True)
    with sl.Ledger() as led:
        sl.grad(lambda q, k, v: f(q, k, v, place(w))[1], argnums=(0, 1, 2))(*map(place, (q, k, v)))
    hop = context.kv_hop_bytes(B, T, n, K, H, 4)
    assert hop == B * (T // n) * K * H * 4
    ring = tuple((j, (j + 1) % n) for j in range(n))
    reverse = tuple(sorted((d, s) for s, d in ring))
    fwd = [e for e in led.filter(phase="forward").events if e["op"] == "ppermute"]
    bwd = [e for e in led.filter(phase="backward").events if e["op"] == "ppermute"]
    assert len(fwd) == len(bwd) == 2 * (n - 1)
    assert all(e["bytes_sent"] == hop and tuple(e["perm"]) == ring for e in fwd)
    assert all(e["bytes_sent"] == hop and tuple(sorted(e["perm"])) == reverse for e in bwd)
    assert sum(e["bytes_sent"] for e in fwd) == context.ring_forward_bytes(B, T, n, K, H, 4)


@pytest.mark.parametrize("n", [2, 4])
def test_causal_ring_skips_the_future_blocks(n):
    q, k, v, w = _qkv()
    flops = {}
    for causal in (True, False):
        f, place = _ring(n, causal)
        args = [place(x) for x in (q, k, v, w)]
        with sl.Ledger() as led:
            f(*args)
        flops[causal] = sum(e["flops"] for e in led.events if e["op"] == "einsum")
    # 2n+1 of the 4n c x c blocks: about half (the diagonal blocks are computed whole)
    assert flops[True] / flops[False] == context.causal_block_fraction(n) == (2 * n + 1) / (4 * n)
    # per device: QK^T and PV of its T/n queries against every key
    assert flops[False] == 4 * B * N * (T // n) * T * H == context.ring_attention_flops(B, T, n, N, H, causal=False)
    assert flops[True] == context.ring_attention_flops(B, T, n, N, H)


# -- training under context parallelism ---------------------------------------------------------
CFG = ModelConfig(num_layers=1, d_model=32, ffw_dim=64, num_heads=4, num_kv_heads=2, vocab_size=64, max_seq_len=16)
LEARNED = CFG.replace(positions="learned")
MESHES = {"cp": ((4,), ("context",)), "fsdp_cp": ((2, 2), ("data", "context")),
          "cp_tp": ((2, 2), ("context", "model"))}


def _batch(seed=1, b=4, t=16):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 64, (b, t)), rng.integers(0, 64, (b, t))


@pytest.mark.parametrize("name,cfg", [("cp", CFG), ("fsdp_cp", CFG), ("cp_tp", CFG), ("cp", LEARNED)])
def test_five_steps_under_context_parallelism_equal_the_single_device_run(name, cfg):
    tok, tgt = _batch()
    assert steps_error(cfg, name, sl.make_mesh(*MESHES[name]), tok, tgt) <= 1e-5


@pytest.mark.parametrize("name", ["cp", "fsdp_cp", "cp_tp"])
def test_layer_ledger_moves_the_kv_blocks_around_the_ring(name):
    shape, names = MESHES[name]
    mesh = sl.make_mesh(shape, names)
    t = train.Trainer(CFG, name, mesh, optimizer="sgd")
    state = t.init(transformer.init_params(CFG, seed=0))
    tok, tgt = _batch()
    with sl.Ledger() as led:
        t.step(state, tok, tgt)
    C, (X, Y) = t.C, t.s.sizes(mesh)
    hop = context.kv_hop_bytes(tok.shape[0] // X, tok.shape[1], C, CFG.num_kv_heads // Y, CFG.head_dim, 4)
    attn = led.filter(label="layer0/attn")
    for phase in ("forward", "backward"):
        hops = [e for e in attn.filter(phase=phase).events if e["op"] == "ppermute"]
        assert len(hops) == 2 * (C - 1) and all(e["axes"] == ("context",) for e in hops)
        assert sum(e["bytes_sent"] for e in hops) == context.ring_forward_bytes(
            tok.shape[0] // X, tok.shape[1], C, CFG.num_kv_heads // Y, CFG.head_dim, 4) == 2 * (C - 1) * hop
    flops = sum(e["flops"] for e in attn.filter(phase="forward").events if e["op"] == "einsum")
    assert flops == context.ring_attention_flops(tok.shape[0] // X, tok.shape[1], C, CFG.num_heads // Y, CFG.head_dim)
    # no other block moves K/V; positions come from the axis index, so nothing but the weights'
    # own gathers and reduce-scatters crosses the data axis in the attention block
    assert not [e for e in led.events if e["op"] == "ppermute" and not e["label"].endswith("attn")]
    assert {e["op"] for e in attn.events if "data" in e["axes"]} <= {"all_gather", "psum_scatter"}


@pytest.mark.parametrize("strategy", [train.strategies.cp(data="data"),
                                      train.Strategy("zero1_cp", data="data", zero=1, context="context")])
def test_adamw_full_remat_and_zero1_with_a_data_axis_follow_the_reference(strategy):
    tok, tgt = _batch(2)
    p0 = transformer.init_params(CFG, seed=3)
    opt = train.AdamW(lr=1e-3, eps=1e-3, weight_decay=0.1)
    ref, st = p0, None
    for s in range(1, 4):
        ref, st = train.reference_step(CFG, ref, tok, tgt, opt, s, st)
    t = train.Trainer(CFG, strategy, sl.make_mesh((2, 2), ("data", "context")), optimizer=opt, remat="full")
    state = t.init(p0)
    for _ in range(3):
        state, _ = t.step(state, tok, tgt)
    assert rel_error(state.params, ref) <= 1e-5


def test_mixed_precision_moves_bf16_kv_blocks():
    t = train.Trainer(CFG, "fsdp_cp", sl.make_mesh((2, 2), ("data", "context")), precision="mixed")
    state = t.init(transformer.init_params(CFG, seed=0))
    tok, tgt = _batch()
    with sl.Ledger() as led:
        t.step(state, tok, tgt)
    hops = [e for e in led.filter(label="layer0/attn", phase="forward").events if e["op"] == "ppermute"]
    assert [e["dtype"] for e in hops] == ["bfloat16"] * 2
    assert all(e["bytes_sent"] == context.kv_hop_bytes(2, 16, 2, CFG.num_kv_heads, CFG.head_dim, 2) for e in hops)


def test_the_ring_at_scale_in_abstract_mode_equals_the_closed_forms():
    # LLaMA-3 8B (one layer, 32 heads over 8 kv heads, H = 128) at 64k tokens over 8 v5p chips, shape-only
    cfg = presets.get("llama3-8b").replace(num_layers=1)
    C, T = 8, 65536
    t = train.Trainer(cfg, "cp", sl.make_mesh((C,), ("context",), hardware="tpu-v5p", abstract=True),
                      optimizer="sgd", precision="mixed")
    sizes = param_sizes(cfg)
    params = tree_map(lambda axes: sl.ShapeDtypeStruct(tuple(sizes[a] for a in axes), t.dtype,
                                                       sharding=t.sharding(t.param_spec(axes))), param_axes(cfg))
    tok = sl.ShapeDtypeStruct((1, T), np.int32, sharding=t.sharding(t.s.batch_spec()))
    with sl.Ledger() as led:
        sl.eval_shape(lambda p, tok: t.loss(p, tok, tok, T), params, tok)
    attn = led.filter(label="layer0/attn", phase="forward")
    hops = [e for e in attn.events if e["op"] == "ppermute"]
    assert len(hops) == 2 * (C - 1)
    assert all(e["bytes_sent"] == context.kv_hop_bytes(1, T, C, 8, 128, 2) == 16 * 2**20 for e in hops)
    assert all(e["seconds"] > 0 for e in hops)
    flops = sum(e["flops"] for e in attn.events if e["op"] == "einsum")
    assert flops == context.ring_attention_flops(1, T, C, 32, 128)


# -- bad input -----------------------------------------------------------------------------------

def test_errors_name_the_sequence_and_the_context_axis():
    t = train.Trainer(CFG, "cp", sl.make_mesh((4,), ("context",)), optimizer="sgd")
    state = t.init(transformer.init_params(CFG))
    with pytest.raises(ValueError, match=r"\[cp\] sequence length 12 is not divisible by 2 x the context axis "
                                         r"'context' of size 4 \(= 8"):
        t.step(state, *_batch(t=12))
    with pytest.raises(ValueError, match=r"\[fsdp_cp\] sequence length 6 is not divisible by 2 x the context axis"):
        train.strategies.fsdp_cp().validate(CFG, sl.make_mesh((2, 2), ("data", "context")), batch=4, seq=6)
    with pytest.raises(ValueError, match=r"\[cp\] mesh axis 'context' is not in the mesh"):
        train.Trainer(CFG, "cp", sl.make_mesh((4,), ("data",)))
    with pytest.raises(ValueError, match=r"'data' is the context axis and also a data or the model axis"):
        train.Strategy("x", data="data", context="data")
    with pytest.raises(ValueError, match=r"sequence_parallel and context parallelism both split the sequence"):
        train.Strategy("x", model="model", sequence_parallel=True, context="context")
    with pytest.raises(ValueError, match=r"\[zigzag_order\] sequence length 10 is not divisible by 2 x"):
        context.zigzag_order(10, 2)
    mesh = sl.make_mesh((2,), ("context",))
    q = np.zeros((1, 8, 4, 8), np.float32)
    bad = sl.shard_map(lambda q, k: context.ring_attention(q, k, k, "context"), mesh=mesh,
                       in_specs=P(None, "context"), out_specs=P(None, "context"))
    with pytest.raises(ValueError, match=r"\[ring_attention\] local shapes q \(1, 4, 4, 8\), k \(1, 4, 3, 8\)"):
        bad(q, np.zeros((1, 8, 3, 8), np.float32))
    odd = sl.shard_map(lambda q: context.ring_attention(q, q, q, "context", is_causal=True), mesh=mesh,
                       in_specs=P(None, "context"), out_specs=P(None, "context"))
    with pytest.raises(ValueError, match=r"\[ring_attention\] causal ring attention needs the zig-zag layout: the "
                                         r"local sequence 3"):
        odd(np.zeros((1, 6, 4, 8), np.float32))
    unbound = sl.shard_map(lambda q: context.ring_attention(q, q, q, "ctx"), mesh=mesh,
                           in_specs=P(None, "context"), out_specs=P(None, "context"))
    with pytest.raises(NameError, match=r"\[ring_attention\] unbound axis name: 'ctx'"):
        unbound(q)


def test_strategy_lays_the_sequence_over_the_context_axis():
    s = train.strategies.fsdp_cp()
    assert s.batch_spec() == P("data", "context")
    assert s.activation_spec() == P("data", "context", None)
    assert s.rules()["activations"] == {"batch": ("data",), "seq": ("context",)}
    assert ("forward: K and V blocks around the ring, 2(C-1) per layer", "ppermute", ("context",)) in s.collectives()
    assert train.strategies.cp_tp().param_spec(("embed", "mlp")) == P(None, "model")


def test_estimate_prices_the_context_axis_and_counts_tokens_per_device():
    """train.estimate under CP: the ring's hops are priced on the context axis, and the
    activation memory is that of the tokens one device holds (batch·seq / (X·C))."""
    big = ModelConfig(num_layers=2, d_model=256, ffw_dim=1024, num_heads=4, vocab_size=512, max_seq_len=8192)
    cp = train.estimate(big, "fsdp_cp", {"data": 2, "context": 4}, "tpu-v5p", batch=8, seq=8192)
    flat = train.estimate(big, "fsdp", {"data": 8}, "tpu-v5p", batch=8, seq=8192)
    assert cp.comm_seconds["context"] > 0 and "context" not in flat.comm_seconds
    assert cp.memory["activations"] == flat.memory["activations"]   # 8192 tokens per device either way
    assert cp.memory["params"] == 4 * flat.memory["params"]         # FSDP over 2 devices, not 8
