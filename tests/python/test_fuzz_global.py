"""Fuzzing the global view and the training / serving entry points with hypothesis (issue 29).

- Global view: random chains of jax.numpy ops on arrays put on an Explicit (2, 4) mesh with
  random NamedShardings (elementwise, reductions, transpose, reshape, matmul, reshard, jit)
  agree with numpy on the gathered values, or raise a clear error, never a crash.
- Training: one Trainer step of a random tiny transformer under a random strategy equals the
  single-device ``train.reference_step``.
- Serving: cached ``serve.generate`` of a random tiny model equals ``generate_uncached``;
  ``serve.estimate`` of random sizes gives finite, positive times or an ``[estimate]`` error.

The test command runs a few examples per test (the ``N(short)`` counts, seconds in all);
``make fuzz`` runs the long profile (HYPOTHESIS_PROFILE=fuzz, 10,000 examples, conftest.py).
"""

import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardlab as sl
import shardlab.numpy as jnp
from shardlab import P, serve, train
from shardlab.models import ModelConfig, transformer
from shardlab.sharding import AxisType, ShardingTypeError
from training_reference import rel_error

LONG = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"
N = lambda short: None if LONG else short  # noqa: E731  (None: the profile's max_examples)

MESH = sl.make_mesh((2, 4), ("X", "Y"), (AxisType.Explicit,) * 2)
SPECS = [(None, None), ("X", None), (None, "Y"), ("X", "Y"), ("Y", "X"), (("X", "Y"), None),
         (None, ("X", "Y"))]
# A clear refusal: JAX's sharding-type errors, or one of shardlab's "[op] ..." errors.
REFUSALS = (ShardingTypeError, ValueError, TypeError, NotImplementedError)


def clear(e: BaseException) -> bool:
    msg = str(e)
    return isinstance(e, ShardingTypeError) or msg.startswith("[") or "sharding" in msg.lower()


# -- the global view ---------------------------------------------------------------------------
def _ops():
    """(name, shardlab op, numpy op) on one global value, each well defined for any (8, 8) input."""
    return {
        "scale": (lambda a, b: a * 2.0 + 1.0, lambda a, b: a * 2.0 + 1.0),
        "tanh": (lambda a, b: jnp.tanh(a), lambda a, b: np.tanh(a)),
        "add": (lambda a, b: a + b, lambda a, b: a + b),
        "sum0": (lambda a, b: jnp.sum(a, axis=0, keepdims=True) + a, lambda a, b: a.sum(0, keepdims=True) + a),
        "max1": (lambda a, b: jnp.max(a, axis=1, keepdims=True) - a, lambda a, b: a.max(1, keepdims=True) - a),
        "transpose": (lambda a, b: a.T, lambda a, b: a.T),
        "reshape": (lambda a, b: jnp.reshape(jnp.reshape(a, (64,)), (8, 8)), lambda a, b: a),
        "matmul": (lambda a, b: jnp.matmul(a, b.T) / 8.0, lambda a, b: a @ b.T / 8.0),
        "einsum": (lambda a, b: jnp.einsum("ij,kj->ik", a, b) / 8.0, lambda a, b: a @ b.T / 8.0),
        "where": (lambda a, b: jnp.where(a > 0, a, b), lambda a, b: np.where(a > 0, a, b)),
        "jit": (sl.jit(lambda a, b: jnp.exp(-a * a) + b), lambda a, b: np.exp(-a * a) + b),
    }


OPS = _ops()


@st.composite
def global_programs(draw):
    specs = [draw(st.sampled_from(SPECS)) for _ in range(2)]
    steps = draw(st.lists(st.tuples(st.sampled_from(sorted(OPS) + ["reshard"]), st.sampled_from(SPECS)),
                          min_size=1, max_size=4))
    return specs, steps, draw(st.integers(0, 2**16))


@settings(max_examples=N(25))
@given(program=global_programs())
def test_random_global_view_programs_match_numpy_or_refuse_clearly(program):
    specs, steps, seed = program
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((8, 8)).astype(np.float32) for _ in range(2)]
    a, b = (sl.device_put(x, sl.NamedSharding(MESH, P(*s))) for x, s in zip(xs, specs))
    want_a, want_b = xs
    np.testing.assert_array_equal(np.asarray(a), want_a)
    for name, spec in steps:
        try:
            if name == "reshard":
                got = sl.reshard(a, sl.NamedSharding(MESH, P(*spec)))
                want = want_a
            else:
                got = OPS[name][0](a, b)
                want = OPS[name][1](want_a, want_b)
        except REFUSALS as e:
            assert clear(e), f"{type(e).__name__}: {e} (after {steps})"
            return
        assert got.shape == want.shape, (name, got.shape, want.shape)
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5, err_msg=f"{name} in {steps}")
        if name == "reshard":  # the placement asked for (JAX also pads the spec to the rank: see below)
            assert tuple(got.sharding.spec.normalized(2)) == tuple(P(*spec).normalized(2)), (got.sharding.spec, spec)
        a, want_a = got, want.astype(np.float32)


@settings(max_examples=N(25))
@given(spec=st.sampled_from(SPECS), shape=st.tuples(st.sampled_from([1, 2, 4, 8, 16]), st.sampled_from([4, 8])),
       dtype=st.sampled_from([np.float32, np.int32, np.bool_]))
def test_device_put_with_a_named_sharding_holds_each_devices_block(spec, shape, dtype):
    x = (np.arange(math.prod(shape)).reshape(shape) % 7).astype(dtype)
    sharding = sl.NamedSharding(MESH, P(*spec))
    try:
        y = sl.device_put(x, sharding)
    except ValueError as e:     # a dim the spec's axes do not divide: JAX's error, with the dims
        assert "divisible" in str(e) or str(e).startswith("["), e
        return
    assert y.dtype == x.dtype and y.shape == shape
    np.testing.assert_array_equal(np.asarray(y), x)
    index = sharding.devices_indices_map(shape)
    for shard in y.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), x[index[shard.device]])


def test_reshard_spells_the_result_spec_as_jax():
    """Found by the fuzzing above: reshard kept the planner's spelling (P('X',)); JAX keeps a
    NamedSharding's spec as given and pads a bare PartitionSpec to the rank."""
    x = sl.device_put(np.ones((8, 8), np.float32), sl.NamedSharding(MESH, P()))
    assert sl.reshard(x, sl.NamedSharding(MESH, P("X", None))).sharding.spec == P("X", None)
    assert sl.reshard(x, sl.NamedSharding(MESH, P("X"))).sharding.spec == P("X")
    with sl.set_mesh(MESH):
        assert sl.reshard(x, P("X")).sharding.spec == P("X", None)


# -- training ----------------------------------------------------------------------------------
STRATEGY_MESHES = {"dp": ((8,), ("data",)), "fsdp": ((8,), ("data",)), "zero1": ((8,), ("data",)),
                   "tp": ((2,), ("model",)), "fsdp_tp": ((2, 2), ("data", "model"))}


@st.composite
def tiny_models(draw):
    heads = draw(st.sampled_from([2, 4]))   # divisible by every model axis below, so no strategy refuses
    return ModelConfig(num_layers=draw(st.integers(1, 2)), d_model=8 * heads, ffw_dim=draw(st.sampled_from([8, 16])),
                       num_heads=heads, vocab_size=draw(st.sampled_from([16, 24])), max_seq_len=8,
                       gated_mlp=draw(st.booleans()))


@settings(max_examples=N(3))
@given(cfg=tiny_models(), name=st.sampled_from(sorted(STRATEGY_MESHES)), seed=st.integers(0, 2**16),
       batch=st.sampled_from([8, 16]), seq=st.sampled_from([4, 8]))
def test_a_trainer_step_of_a_random_tiny_model_equals_the_single_device_step(cfg, name, seed, batch, seq):
    rng = np.random.default_rng(seed)
    tok, tgt = (rng.integers(0, cfg.vocab_size, (batch, seq)) for _ in range(2))
    p0 = transformer.init_params(cfg, seed=seed)
    opt = train.SGD(lr=0.5)
    ref, _ = train.reference_step(cfg, p0, tok, tgt, opt, 1)
    trainer = train.Trainer(cfg, name, sl.make_mesh(*STRATEGY_MESHES[name]), optimizer=opt)
    state, metrics = trainer.step(trainer.init(p0), tok, tgt)
    assert math.isfinite(float(np.asarray(metrics["loss"] if isinstance(metrics, dict) else metrics)))
    assert rel_error(state.params, ref) <= 1e-5


# -- serving -----------------------------------------------------------------------------------
@settings(max_examples=N(4))
@given(cfg=tiny_models(), kv_heads=st.sampled_from([1, None]), seed=st.integers(0, 2**16),
       batch=st.integers(1, 3), prompt=st.integers(1, 4), new=st.integers(1, 4))
def test_cached_generation_of_a_random_tiny_model_equals_recomputation(cfg, kv_heads, seed, batch, prompt, new):
    cfg = cfg.replace(num_kv_heads=kv_heads or cfg.num_heads)
    params = transformer.init_params(cfg, seed=seed)
    tokens = np.random.default_rng(seed).integers(0, cfg.vocab_size, (batch, prompt))
    out = serve.generate(params, cfg, tokens, new)
    assert out.shape == (batch, new)
    assert (out == serve.generate_uncached(params, cfg, tokens, new)).all()


@settings(max_examples=N(40))
@given(hardware=st.sampled_from(["tpu-v5e", "tpu-v5p", "h100", "b200"]), chips=st.sampled_from([1, 2, 4, 8, 16]),
       batch=st.one_of(st.integers(1, 512), st.integers(-2, 0)), context=st.one_of(st.integers(1, 32768), st.just(0)),
       layers=st.integers(1, 8), kv_heads=st.sampled_from([1, 2, 8]))
def test_serve_estimate_of_random_sizes_is_finite_or_refused_clearly(hardware, chips, batch, context, layers, kv_heads):
    cfg = ModelConfig(num_layers=layers, d_model=512, ffw_dim=2048, num_heads=8, num_kv_heads=kv_heads,
                      vocab_size=1000, max_seq_len=32768)
    try:
        est = serve.estimate(cfg, hardware, {"x": chips}, batch, context)
    except ValueError as e:
        msg = str(e)
        assert msg.startswith("[estimate]"), msg
        if batch < 1 or context < 1:
            assert ("batch" if batch < 1 else "context") in msg, msg
        else:   # the only other refusal: a model axis that does not divide the heads
            assert 8 % chips and "not divisible" in msg, msg
        return
    assert batch >= 1 and context >= 1 and 8 % chips == 0
    for phase in (est.prefill, est.decode):
        seconds = phase.seconds if hasattr(phase, "seconds") else phase["seconds"]
        assert math.isfinite(seconds) and seconds > 0
    assert est.memory_bytes == pytest.approx(est.param_bytes + est.kv_bytes)
