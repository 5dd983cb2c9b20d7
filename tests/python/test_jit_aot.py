"""jit with JAX's arguments, its ahead-of-time stages, make_jaxpr and experimental.roofline,
compared with JAX where JAX runs the same program on CPU."""

import numpy as np
import pytest

import shardlab as sl
import shardlab.numpy as jnp
from shardlab import P
from shardlab.experimental import roofline as sl_roofline


def _sds(shape, mesh, spec, dtype=np.float32):
    return sl.ShapeDtypeStruct(shape, dtype, sharding=sl.NamedSharding(mesh, spec))


def _psum_matmul(a, b):
    return sl.lax.psum(a @ b, "y")


# -- stages on arrays and on ShapeDtypeStructs ----------------------------------------------------------
def test_trace_lower_compile_on_arrays():
    a, b = np.ones((8, 16), np.float32), np.ones((16, 4), np.float32)
    f = sl.jit(lambda a, b: jnp.tanh(a @ b))
    traced = f.trace(a, b)
    assert str(traced.out_avals) == "float32[8,4]"
    assert traced.out_info.shape == (8, 4) and traced.out_info.dtype == np.float32
    assert [i.shape for i in traced.args_info[0]] == [(8, 16), (16, 4)] and traced.args_info[1] == {}
    assert [e.prim for e in traced.jaxpr.eqns] == ["einsum", "tanh"]
    compiled = traced.lower().compile()
    np.testing.assert_allclose(np.asarray(compiled(a, b)), np.tanh(a @ b), rtol=1e-6)
    assert compiled.memory_analysis().argument_size_in_bytes == a.nbytes + b.nbytes
    assert compiled.memory_analysis().output_size_in_bytes == 8 * 4 * 4


def test_lower_on_an_abstract_16x16_v5p_mesh():
    pod = sl.make_mesh((16, 16), ("x", "y"), hardware="tpu-v5p", abstract=True)
    m, k, n = 4096, 8192, 1024
    x, w = _sds((m, k), pod, P("x", "y")), _sds((k, n), pod, P("y", None))
    lowered = sl.jit(lambda a, b: sl.matmul(a, b, out_sharding=P("x", None))).lower(x, w)
    text = lowered.as_text()
    # the local matmul on [256, 512] x [512, 1024] blocks, then the all-reduce over y the
    # sharded contraction needs
    assert "f32[256,1024]{V:(x,y)} dot(%p0, %p1)" in text
    assert "all-reduce(%0), axes={y}, groups=16x16" in text
    assert "entry_computation_layout={(f32[4096@x,8192@y], f32[8192@y,1024])->f32[4096@x,1024]}" in text
    ca = lowered.cost_analysis()
    local_m, local_k = m // 16, k // 16
    assert ca["flops"] == 2 * local_m * local_k * n + local_m * n  # the matmul, then the psum's adds
    assert ca["optimal_seconds"] > 0
    mem = lowered.compile().memory_analysis()
    assert mem.argument_size_in_bytes == (local_m * local_k + local_k * n) * 4
    assert mem.output_size_in_bytes == local_m * n * 4
    assert mem.temp_size_in_bytes == local_m * n * 4  # the partial product before the all-reduce
    out = lowered.out_info
    assert out.shape == (m, n) and out.sharding.spec == P("x")
    compiled = lowered.compile()
    assert compiled.input_shardings[0][0].spec == P("x", "y") and compiled.output_shardings.spec == P("x")


def test_shard_map_program_text_lists_each_collective():
    mesh = sl.make_mesh((4, 2), ("x", "y"))
    f = sl.shard_map(lambda a: sl.lax.psum_scatter(sl.lax.all_gather(a, "x", tiled=True), "y", tiled=True),
                     mesh=mesh, in_specs=P("x", None), out_specs=P("y", None))
    text = sl.jit(f).lower(_sds((16, 4), mesh, P("x", None))).as_text()
    assert "all-gather(%p0)" in text and 'op_name="all_gather"' in text
    assert "reduce-scatter(%0)" in text and "axes={y}, groups=4x2" in text
    assert "f32[4,4]{V:x} parameter(0)  // global f32[16@x,4]" in text


def test_shard_map_entry_that_relays_out_on_the_host_is_a_line_of_its_own():
    mesh = sl.make_mesh((4, 2), ("x", "y"))
    a = _sds((8, 4), mesh, P("x"))
    f = sl.shard_map(lambda v: v * 2, mesh=mesh, in_specs=P(None, "y"), out_specs=P(None, "y"))
    text = sl.jit(f).lower(a).as_text()
    assert "%0 = f32[8,2]{V:y} shard_map_enter(%p0), sharding=" in text
    assert "ROOT %1 = f32[8,2]{V:y} multiply(%0, f32[] constant(2.0))" in text and "custom-call" not in text
    g = sl.shard_map(lambda v: v * 2, mesh=mesh, in_specs=P("x"), out_specs=P(), check_vma=False)
    assert "ROOT %1 = f32[2,4] shard_map_exit(%0)" in sl.jit(g).lower(a).as_text()


def test_a_gradient_traces_into_one_connected_program():
    mesh = sl.make_mesh((4,), ("x",))

    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    lowered = sl.jit(sl.grad(loss)).lower(_sds((4, 2), mesh, P()), _sds((8, 4), mesh, P("x")))
    text = lowered.as_text()
    # forward matmul, the loss's all-reduce, the weight gradient's matmul and its all-reduce
    # (data parallelism); the only value made outside a primitive is the seed cotangent
    assert text.count(" dot(") == 2 and text.count(" all-reduce(") == 2
    assert text.count("custom-call()") == 1 and "ROOT %" in text.splitlines()[-3]
    assert lowered.out_info.shape == (4, 2)


def test_tracing_runs_nothing_and_compiled_runs_eagerly():
    mesh = sl.make_mesh((4, 2), ("x", "y"))
    f = sl.jit(sl.shard_map(_psum_matmul, mesh=mesh, in_specs=(P("x", "y"), P("y", None)), out_specs=P("x", None)))
    a = sl.device_put(np.arange(64 * 32, dtype=np.float32).reshape(64, 32) / 100, sl.NamedSharding(mesh, P("x", "y")))
    b = sl.device_put(np.ones((32, 16), np.float32), sl.NamedSharding(mesh, P("y", None)))
    with sl.Ledger() as ledger:
        lowered = f.lower(a, b)
    assert len(ledger) == 0
    with sl.Ledger() as ledger:
        out = lowered.compile()(a, b)
    assert [e["op"] for e in ledger.events] == ["matmul", "psum"]
    np.testing.assert_allclose(np.asarray(out), np.asarray(a) @ np.asarray(b), rtol=1e-5)
    with pytest.raises(TypeError, match="Argument types differ"):
        lowered.compile()(a, sl.device_put(np.ones((32, 8), np.float32), sl.NamedSharding(mesh, P("y", None))))
    with pytest.raises(TypeError, match="input pytree does not match"):
        lowered.compile()(a)
    # host arguments are placed as the computation was compiled for; a global array with another
    # sharding is refused, as JAX refuses it
    compiled = sl.jit(lambda v: v * 2).lower(_sds((8, 2), mesh, P("x"))).compile()
    assert compiled(np.ones((8, 2), np.float32)).sharding.is_equivalent_to(sl.NamedSharding(mesh, P("x")), 2)
    with pytest.raises(ValueError, match="compiled for input shardings that disagree"):
        compiled(sl.device_put(np.ones((8, 2), np.float32), sl.NamedSharding(mesh, P("y"))))


def test_lowered_text_dialects_and_named_scopes():
    def f(x):
        with sl.named_scope("mlp"):
            return x + 1

    lowered = sl.jit(f).lower(np.ones(3, np.float32))
    assert 'add(%p0, f32[] constant(1.0)), op_name="mlp/add"' in lowered.as_text()
    assert lowered.as_text("hlo") == lowered.as_text() == lowered.as_text("stablehlo")
    with pytest.raises(ValueError, match="unknown dialect: mlir"):
        lowered.as_text("mlir")


# -- jit's arguments -----------------------------------------------------------------------------------
def test_in_and_out_shardings_with_pytrees_and_partition_specs():
    mesh = sl.make_mesh((4, 2), ("x", "y"))
    s = sl.NamedSharding(mesh, P("x"))
    f = sl.jit(lambda d: {"a": d["a"] * 2, "b": d["b"]}, in_shardings=({"a": s, "b": None},),
               out_shardings={"a": sl.NamedSharding(mesh, P(None, "y")), "b": None})
    out = f({"a": np.ones((8, 2), np.float32), "b": np.ones(3, np.float32)})
    assert out["a"].sharding.spec == P(None, "y") and np.asarray(out["a"]).tolist() == [[2.0, 2.0]] * 8
    with pytest.raises(RuntimeError, match="non-empty mesh in context"):
        sl.jit(lambda a: a, in_shardings=P("x"))(np.ones((8, 2)))
    with sl.set_mesh(mesh):
        g = sl.jit(lambda a: a * 2, in_shardings=P("x"), out_shardings=P(None, "y"))
        assert g(np.ones((8, 2), np.float32)).sharding.spec == P(None, "y")
        assert g.lower(np.ones((8, 2), np.float32)).compile().input_shardings[0][0].spec == P("x")


def test_out_shardings_reshard_records_the_collective():
    mesh = sl.make_mesh((4,), ("x",))
    a = sl.device_put(np.arange(16.0, dtype=np.float32).reshape(4, 4), sl.NamedSharding(mesh, P("x")))
    f = sl.jit(lambda v: v, out_shardings=sl.NamedSharding(mesh, P()))
    with sl.Ledger() as ledger:
        out = f(a)
    assert out.sharding == sl.NamedSharding(mesh, P()) and [e["op"] for e in ledger.events] == ["all_gather"]
    assert "all-gather(%p0)" in f.lower(a).as_text()


def test_committed_argument_with_another_sharding_raises_as_jax():
    mesh = sl.make_mesh((4, 2), ("x", "y"))
    a = sl.device_put(np.ones((8, 2), np.float32), sl.NamedSharding(mesh, P("y")))
    f = sl.jit(lambda v: v * 2, in_shardings=sl.NamedSharding(mesh, P("x")))
    for call in (f, f.lower):
        with pytest.raises(ValueError, match="Sharding passed to jit does not match the sharding on the respective arg"):
            call(a)


def test_static_and_donated_arguments():
    f = sl.jit(lambda a, n: a * n, static_argnums=1)
    assert np.asarray(f(np.ones(2, np.float32), 3)).tolist() == [3.0, 3.0]
    compiled = f.lower(np.ones(2, np.float32), 3).compile()
    assert np.asarray(compiled(np.ones(2, np.float32))).tolist() == [3.0, 3.0]  # static args left out, as JAX
    assert np.asarray(sl.jit(lambda a, n: a * n, static_argnames="n")(np.ones(2), n=2)).tolist() == [2.0, 2.0]
    with pytest.raises(ValueError, match=r"static_argnums=\(3,\), but only accepts 2 positional arguments"):
        sl.jit(lambda a, n: a * n, static_argnums=3)
    with pytest.raises(ValueError, match="Non-hashable static arguments are not supported"):
        sl.jit(lambda a, n: a * n, static_argnums=1)(np.ones(2), np.ones(2))
    lowered = sl.jit(lambda a: a * 2, donate_argnums=0).lower(np.ones((8, 2), np.float32))
    assert lowered.args_info[0][0].donated and lowered.donate_argnums == (0,)
    assert lowered.compile().memory_analysis().alias_size_in_bytes == 64
    g = sl.jit(lambda a: a + 1, keep_unused=True, device=None, backend=None, inline=True, compiler_options={},
               abstracted_axes=None)
    assert np.asarray(g(np.zeros(2, np.float32))).tolist() == [1.0, 1.0]


# -- make_jaxpr --------------------------------------------------------------------------------------
def test_make_jaxpr_prints_the_recorded_program():
    cj = sl.make_jaxpr(lambda x: x * 2.0)(np.ones((8, 4), np.float32))
    assert str(cj) == "{ lambda ; a:f32[8,4]. let b:f32[8,4] = mul a 2.0:f32[] in (b,) }"
    assert cj.consts == [] and str(cj.in_avals[0]) == "float32[8,4]" and str(cj.out_avals[0]) == "float32[8,4]"
    long = sl.make_jaxpr(lambda x: jnp.sin(x) * 2.0 + x.sum())(np.ones((8, 4), np.float32))
    lines = str(long).splitlines()
    assert lines[0] == "{ lambda ; a:f32[8,4]. let" and lines[-1] == "  in (e,) }"
    assert [ln.split(" = ")[1].split()[0].split("[")[0] for ln in lines[1:-1]] == ["sin", "mul", "reduce_sum", "add"]
    cj, shape = sl.make_jaxpr(lambda x: x.T, return_shape=True)(np.ones((2, 3), np.float32))
    assert shape.shape == (3, 2)


def test_make_jaxpr_inside_shard_map_shows_varying_axes():
    mesh = sl.make_mesh((4, 2), ("x", "y"))
    f = sl.shard_map(_psum_matmul, mesh=mesh, in_specs=(P("x", "y"), P("y", None)), out_specs=P("x", None))
    text = str(sl.make_jaxpr(f)(_sds((64, 32), mesh, P("x", "y")), _sds((32, 16), mesh, P("y", None))))
    assert "a:f32[64@x,32@y] b:f32[32@y,16]" in text and "c:f32[64@x,16] = shard_map[" in text
    assert "jaxpr={ lambda ; d:f32[16,16]{V:(x,y)} e:f32[16,16]{V:y}. let" in text
    assert "f:f32[16,16]{V:(x,y)} = pvary[axes=('x',)] e" in text  # JAX's implicit pvary of an invariant operand
    assert "g:f32[16,16]{V:(x,y)} = dot_general" in text and "h:f32[16,16]{V:x} = psum_invariant[axes=('y',)] g" in text


# -- against JAX -------------------------------------------------------------------------------------
@pytest.mark.jax
class TestAgainstJax:
    @pytest.fixture(autouse=True)
    def _jax(self):
        self.jax = pytest.importorskip("jax")
        self.jnp = pytest.importorskip("jax.numpy")

    def _jax_mesh(self):
        return self.jax.make_mesh((4, 2), ("x", "y"))

    def test_make_jaxpr_of_shard_map_programs_equals_jax(self):
        """The user's shard_map prints as one nested equation (its body with JAX's implicit pvary,
        psum_invariant, the mesh as given or as the context's abstract mesh), character for character."""
        jax = self.jax

        def programs(api, np_):
            mesh = api.make_mesh((4, 2), ("x", "y"))
            f = api.shard_map(lambda a, b: api.lax.psum(a @ b, "y"), mesh=mesh,
                              in_specs=(api.P("x", "y"), api.P("y", None)), out_specs=api.P("x", None))
            sds = [api.ShapeDtypeStruct(s, np.float32, sharding=api.NamedSharding(mesh, p))
                   for s, p in [((64, 32), api.P("x", "y")), ((32, 16), api.P("y", None))]]
            texts = [str(api.make_jaxpr(f)(*sds))]
            with api.set_mesh(api.make_mesh((2,), ("i",), devices=api.devices()[:2])):
                g = api.shard_map(lambda x, y: x * y, in_specs=(api.P("i"), api.P()), out_specs=api.P("i"))
                x = api.device_put(np_.arange(6.0), api.P("i"))
                y = np_.arange(3.0)
                texts.append(str(api.make_jaxpr(g)(x, y)))
                texts.append(str(api.jit(lambda x, y: g(np_.sin(x), y) * 2).trace(x, y).jaxpr))
            return texts

        assert programs(sl, jnp) == programs(jax, self.jnp)

    def test_matmul_cost_analysis_equals_jax(self):
        jax, jnpj = self.jax, self.jnp
        a, b = np.ones((8, 16), np.float32), np.ones((16, 4), np.float32)
        want = jax.jit(lambda a, b: a @ b).lower(a, b).cost_analysis()
        got = sl.jit(lambda a, b: a @ b).lower(a, b).cost_analysis()
        assert got["flops"] == want["flops"] == 2 * 8 * 16 * 4
        for key in ("bytes accessed", "bytes accessed0{}", "bytes accessed1{}", "bytes accessedout{}"):
            assert got[key] == want[key], key
        assert "transcendentals" not in got and "transcendentals" not in want  # zeros left out, as XLA
        del jnpj

    def test_elementwise_chain_flops_equal_jax(self):
        jax, jnpj = self.jax, self.jnp
        x = np.ones((128, 256), np.float32)
        want = jax.jit(lambda x: jnpj.exp(x * 2 + 1).sum()).lower(x).cost_analysis()
        got = sl.jit(lambda x: jnp.exp(x * 2 + 1).sum()).lower(x).cost_analysis()
        assert got["flops"] == want["flops"] == 2 * x.size + x.size - 1
        assert got["transcendentals"] == want["transcendentals"] == x.size

    def test_sharded_program_cost_and_memory_equal_jax(self):
        jax = self.jax
        from jax.sharding import NamedSharding, PartitionSpec as JP

        jm, mesh = self._jax_mesh(), sl.make_mesh((4, 2), ("x", "y"))
        specs = ((P("x", "y"), P("y", None)), P("x", None))
        a, b = np.ones((64, 32), np.float32), np.ones((32, 16), np.float32)
        jf = jax.jit(jax.shard_map(lambda a, b: jax.lax.psum(a @ b, "y"), mesh=jm,
                                   in_specs=(JP("x", "y"), JP("y", None)), out_specs=JP("x", None)))
        jc = jf.lower(jax.device_put(a, NamedSharding(jm, JP("x", "y"))),
                      jax.device_put(b, NamedSharding(jm, JP("y", None)))).compile()
        f = sl.jit(sl.shard_map(_psum_matmul, mesh=mesh, in_specs=specs[0], out_specs=specs[1]))
        c = f.lower(sl.device_put(a, sl.NamedSharding(mesh, P("x", "y"))),
                    sl.device_put(b, sl.NamedSharding(mesh, P("y", None)))).compile()
        want, got = jc.cost_analysis(), c.cost_analysis()
        for key in ("flops", "bytes accessed", "bytes accessed0{}", "bytes accessed1{}", "bytes accessedout{}"):
            assert got[key] == want[key], key
        jm_, m_ = jc.memory_analysis(), c.memory_analysis()
        for key in ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
                    "host_argument_size_in_bytes"):
            assert getattr(m_, key) == getattr(jm_, key), key
        assert [s.spec for s in c.input_shardings[0]] == [P("x", "y"), P("y", None)]
        assert [tuple(s.spec) for s in jc.input_shardings[0]] == [("x", "y"), ("y", None)]

    def test_donation_alias_bytes_equal_jax(self):
        jax = self.jax
        x = np.ones((8, 2), np.float32)
        want = jax.jit(lambda a: a * 2, donate_argnums=0).lower(x).compile().memory_analysis()
        got = sl.jit(lambda a: a * 2, donate_argnums=0).lower(x).compile().memory_analysis()
        assert (got.alias_size_in_bytes, got.argument_size_in_bytes, got.output_size_in_bytes) == \
            (want.alias_size_in_bytes, want.argument_size_in_bytes, want.output_size_in_bytes)

    @pytest.mark.parametrize("program", ["scale", "sin_sum", "exp_sub", "max", "gram", "tanh_div", "matmul"])
    def test_make_jaxpr_text_equals_jax(self, program):
        jnpj = self.jnp
        x, w = np.ones((8, 4), np.float32), np.ones((4, 3), np.float32)
        programs = {
            "scale": (lambda np_, x, w: x * 2.0),
            "sin_sum": (lambda np_, x, w: np_.sin(x) * 2.0 + x.sum()),
            "exp_sub": (lambda np_, x, w: np_.exp(x) - 1.0),
            "max": (lambda np_, x, w: (x * x).max(axis=1)),
            "gram": (lambda np_, x, w: x.T @ x),
            "tanh_div": (lambda np_, x, w: np_.tanh(x) / 3),
            "matmul": (lambda np_, x, w: x @ w),
        }
        f = programs[program]
        got = sl.make_jaxpr(lambda x, w: f(jnp, x, w))(x, w)
        want = self.jax.make_jaxpr(lambda x, w: f(jnpj, x, w))(x, w)
        assert str(got) == str(want)

    @pytest.mark.parametrize("case", ["matmul_psum_exp", "gather_sum", "collectives", "no_mesh", "abstract_16x16"])
    def test_roofline_fields_equal_jax(self, case):
        jax, jnpj = self.jax, self.jnp
        jroof = pytest.importorskip("jax.experimental.roofline")
        from jax.sharding import NamedSharding, PartitionSpec as JP

        jm, mesh = self._jax_mesh(), sl.make_mesh((4, 2), ("x", "y"))

        def jsds(shape, spec, m=jm):
            return jax.ShapeDtypeStruct(shape, jnpj.float32, sharding=NamedSharding(m, spec))

        ring = [(i, (i + 1) % 4) for i in range(4)]
        if case == "matmul_psum_exp":
            jf = lambda a, b: jnpj.exp(jax.lax.psum(a @ b, "y")) * 2.0  # noqa: E731
            sf = lambda a, b: jnp.exp(sl.lax.psum(a @ b, "y")) * 2.0  # noqa: E731
            specs = ((("x", "y"), ("y", None)), ("x", None))
            shapes = [(64, 32), (32, 16)]
        elif case in ("gather_sum", "abstract_16x16"):
            jf = lambda a: jax.lax.all_gather(a, "x", tiled=True).sum(0)  # noqa: E731
            sf = lambda a: sl.lax.all_gather(a, "x", tiled=True).sum(0)  # noqa: E731
            specs = ((("x",),), ("x",))
            shapes = [(64, 32)] if case == "gather_sum" else [(1024, 32)]
        elif case == "collectives":
            def jf(a):
                return (jax.lax.psum_scatter(a, ("x", "y"), tiled=True), jax.lax.all_to_all(a, "x", 0, 1, tiled=True),
                        jax.lax.ppermute(a, "x", ring), jax.lax.pmax(a, "y"))

            def sf(a):
                return (sl.lax.psum_scatter(a, ("x", "y"), tiled=True), sl.lax.all_to_all(a, "x", 0, 1, tiled=True),
                        sl.lax.ppermute(a, "x", ring), sl.lax.pmax(a, "y"))

            specs = (((),), ((("x", "y"),), (None, "x"), ("x",), ()))
            shapes = [(64, 32)]
        if case == "no_mesh":
            _, want = jroof.roofline(lambda x: (x * 2).sum())(jax.ShapeDtypeStruct((64, 32), jnpj.float32))
            _, got = sl_roofline.roofline(lambda x: (x * 2).sum())(sl.ShapeDtypeStruct((64, 32), np.float32))
        else:
            if case == "abstract_16x16":
                jm = jax.sharding.AbstractMesh((16, 16), ("x", "y"))
                mesh = sl.make_mesh((16, 16), ("x", "y"), abstract=True)
            in_j = tuple(JP(*s) for s in specs[0])
            in_s = tuple(P(*s) for s in specs[0])
            out_j = JP(*specs[1]) if case != "collectives" else tuple(JP(*s) for s in specs[1])
            out_s = P(*specs[1]) if case != "collectives" else tuple(P(*s) for s in specs[1])
            _, want = jroof.roofline(jf, mesh=jm, in_specs=in_j, out_specs=out_j)(
                *[jsds(sh, sp, jm) for sh, sp in zip(shapes, in_j)])
            out, got = sl_roofline.roofline(sf, mesh=mesh, in_specs=in_s, out_specs=out_s)(
                *[_sds(sh, mesh, sp) for sh, sp in zip(shapes, in_s)])
        for name in ("flops", "unfused_flops", "ici_bytes", "ici_latency", "hbm_bytes", "peak_hbm_bytes",
                     "unfused_hbm_bytes"):
            assert getattr(got, name) == getattr(want, name), name


@pytest.mark.jax
def test_roofline_and_grad_equal_jax():
    jax = pytest.importorskip("jax")
    jroof = pytest.importorskip("jax.experimental.roofline")
    from jax.sharding import NamedSharding, PartitionSpec as JP

    jm, mesh = jax.make_mesh((4,), ("x",)), sl.make_mesh((4,), ("x",))
    ja = jax.ShapeDtypeStruct((16, 8), np.float32, sharding=NamedSharding(jm, JP("x")))
    jb = jax.ShapeDtypeStruct((8, 4), np.float32, sharding=NamedSharding(jm, JP()))
    _, jf, jg = jroof.roofline_and_grad(lambda a, b: a @ b, jm, (JP("x"), JP()), JP("x"))(ja, jb)
    _, sf, sg = sl_roofline.roofline_and_grad(lambda a, b: a @ b, mesh, (P("x"), P()), P("x"))(
        _sds((16, 8), mesh, P("x")), _sds((8, 4), mesh, P()))
    for name in ("flops", "unfused_flops", "ici_bytes", "ici_latency", "hbm_bytes", "peak_hbm_bytes",
                 "unfused_hbm_bytes"):
        assert (getattr(sf, name), getattr(sg, name)) == (getattr(jf, name), getattr(jg, name)), name


def test_roofline_is_priced_on_the_mesh_hardware():
    mesh = sl.make_mesh((4, 2), ("x", "y"), hardware="tpu-v5e")
    f = sl.shard_map(_psum_matmul, mesh=mesh, in_specs=(P("x", "y"), P("y", None)), out_specs=P("x", None))
    args = (_sds((4096, 4096), mesh, P("x", "y")),
            _sds((4096, 1024), mesh, P("y", None)))
    with sl.Ledger() as ledger:
        f(*[sl.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding) for a in args])
    _, r = sl_roofline.roofline(_psum_matmul, mesh=mesh, in_specs=(P("x", "y"), P("y", None)),
                                out_specs=P("x", None))(*args)
    events = ledger.events
    assert r.hardware == "tpu-v5e"
    assert r.flops == events[0]["flops"] and r.ici_seconds["y"] == pytest.approx(events[1]["seconds"])
    assert r.seconds == max(r.flops_seconds, r.hbm_seconds, r.ici_seconds["y"]) and r.bound in (
        "compute", "memory", "communication")
    doubled = r + r
    assert doubled.flops == 2 * r.flops and doubled.ici_bytes == {"y": 2 * r.ici_bytes["y"]}
