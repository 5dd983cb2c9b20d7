"""shardlab.einsum / matmul / reshard: run plans and check them against numpy and the ledger."""

import itertools

import numpy as np
import pytest

import shardlab as sl
from shardlab import P


def _specs(axes, rank=2):
    """Every PartitionSpec of a rank-2 array over `axes` (each axis at most once, any order)."""
    out = set()
    for assign in itertools.product(range(rank + 1), repeat=len(axes)):  # rank = unused
        for perm in itertools.permutations(axes):
            dims = [tuple(a for a in perm if assign[axes.index(a)] == d) for d in range(rank)]
            out.add(tuple(dims))
    return [P(*[None if not d else d[0] if len(d) == 1 else d for d in dims]) for dims in sorted(out)]


def _mesh(shape):
    return sl.make_mesh(shape, ("x", "y"))


@pytest.mark.parametrize("shape", [(2, 2), (4, 2)])
def test_exhaustive_2d_matmul(shape):
    mesh = _mesh(shape)
    specs = _specs(["x", "y"])
    assert len(specs) == 11
    rng = np.random.default_rng(sum(shape))
    a_np = rng.standard_normal((8, 16)).astype(np.float32)
    b_np = rng.standard_normal((16, 8)).astype(np.float32)
    want = a_np @ b_np
    ran = 0
    for sa, sb in itertools.product(specs, specs):
        a = sl.device_put(a_np, sl.NamedSharding(mesh, sa))
        b = sl.device_put(b_np, sl.NamedSharding(mesh, sb))
        for so in specs + [None]:
            plan = sl.plan_einsum("ij,jk->ik", a, b, out_sharding=so)
            with sl.Ledger() as ledger:
                c = sl.run_plan(plan, a, b)
            np.testing.assert_allclose(np.asarray(c), want, rtol=1e-4, atol=1e-4)
            if so is not None:
                assert c.sharding == sl.NamedSharding(mesh, so), (sa, sb, so)
            assert not c.unreduced
            comm = [e for e in ledger.events if e["op"] != "einsum"]
            assert sum(e["bytes_sent"] for e in comm) == plan.bytes_sent, (sa, sb, so, plan)
            assert [(e["op"], e["axes"]) for e in comm] == [(s.op, s.axes) for s in plan.steps
                                                            if s.op not in ("einsum", "dynamic_slice")]
            flops = sum(e["flops"] for e in ledger.events if e["op"] == "einsum")
            assert flops == plan.flops
            ran += 1
        # A wanted output that needs one axis twice is rejected with the reason.
        with pytest.raises(ValueError, match="only one dim"):
            sl.plan_einsum("ij,jk->ik", a, b, out_sharding=P("x", "x"))
    assert ran == 11 * 11 * 12


def test_ledger_seconds_match_plan_on_hardware():
    mesh = sl.make_mesh((4, 2), ("x", "y"), hardware="tpu-v5e")
    a = sl.device_put(np.ones((64, 128), np.float32), sl.NamedSharding(mesh, P(None, "x")))
    b = sl.device_put(np.ones((128, 32), np.float32), sl.NamedSharding(mesh, P()))
    for out in (P(), P("x"), P(None, "y")):
        plan = sl.plan_einsum("ij,jk->ik", a, b, out_sharding=out)
        with sl.Ledger() as ledger:
            c = sl.run_plan(plan, a, b)
        np.testing.assert_allclose(np.asarray(c), 128.0)
        comm = sum(e["seconds"] for e in ledger.events if e["op"] != "einsum")
        assert comm == pytest.approx(plan.comm_seconds)
        assert sum(e["bytes_sent"] for e in ledger.events) == plan.bytes_sent


@pytest.mark.one_process  # reads device 2's partial sum, which lives on one rank under mpirun
def test_unreduced_output_and_reshard():
    mesh = _mesh((4, 2))
    rng = np.random.default_rng(0)
    a_np, b_np = rng.standard_normal((8, 16)), rng.standard_normal((16, 4))
    a = sl.device_put(a_np, sl.NamedSharding(mesh, P(None, "x")))
    b = sl.device_put(b_np, sl.NamedSharding(mesh, P("x")))
    with sl.Ledger() as ledger:
        c = sl.einsum("ij,jk->ik", a, b, unreduced=("x",))
    assert len([e for e in ledger.events if e["op"] != "einsum"]) == 0
    assert c.unreduced == {"x"} and c.sharding.spec == P(unreduced={"x"})  # the type carries {U:x}
    # Each device holds a partial sum; np.asarray sums them.
    partial = a_np[:, 4:8] @ b_np[4:8]
    np.testing.assert_allclose(c.addressable_data(2), partial, rtol=1e-5)  # device (1, 0), in float32 as JAX computes float64 inputs with x64 off
    np.testing.assert_allclose(np.asarray(c), a_np @ b_np, rtol=1e-5)  # float32, as JAX with x64 off
    for target in (P(), P("x"), P(None, "x"), P(("x", "y")), P("y", "x")):
        with sl.Ledger() as ledger:
            r = sl.reshard(c, target)
        assert not r.unreduced and r.sharding == sl.NamedSharding(mesh, target)
        np.testing.assert_allclose(np.asarray(r), a_np @ b_np, rtol=1e-5)
        ops = [e["op"] for e in ledger.events]
        assert ops and ops[0] in ("psum", "psum_scatter")
    with pytest.raises(ValueError, match="never created"):
        sl.reshard(sl.reshard(c, P()), P(), unreduced=("x",))


def test_reshard_every_pair_on_2x2():
    mesh = _mesh((2, 2))
    x_np = np.arange(64.0).reshape(8, 8)
    specs = _specs(["x", "y"])
    for s, t in itertools.product(specs, specs):
        x = sl.device_put(x_np, sl.NamedSharding(mesh, s))
        plan = sl.plan_reshard(x, t)
        with sl.Ledger() as ledger:
            y = sl.reshard(x, t)
        assert y.sharding == sl.NamedSharding(mesh, t)
        np.testing.assert_array_equal(np.asarray(y), x_np)
        assert ledger.total_bytes_sent == plan.bytes_sent
        if s == t:
            assert plan.steps == []


def test_reshard_prefers_all_to_all_and_slicing():
    mesh = _mesh((4, 2))
    x = sl.device_put(np.zeros((8, 8), np.float32), sl.NamedSharding(mesh, P("x")))
    assert sl.plan_reshard(x, P(None, "x")).ops == ("all_to_all",)
    assert sl.plan_reshard(x, P("x", "y")).ops == ()  # a free dynamic slice
    assert sl.plan_reshard(x, P()).ops == ("all_gather",)


def test_batch_dims_multi_axis_and_three_operands():
    mesh = _mesh((4, 2))
    rng = np.random.default_rng(1)
    x_np = rng.standard_normal((4, 8, 16)).astype(np.float32)
    w_np = rng.standard_normal((4, 16, 8)).astype(np.float32)
    x = sl.device_put(x_np, sl.NamedSharding(mesh, P("x", None, "y")))
    w = sl.device_put(w_np, sl.NamedSharding(mesh, P("x", "y")))
    with sl.Ledger() as ledger:
        c = sl.einsum("bij,bjk->bik", x, w, out_sharding=P("x"))
    np.testing.assert_allclose(np.asarray(c), np.einsum("bij,bjk->bik", x_np, w_np), rtol=1e-4, atol=1e-4)
    assert [e["op"] for e in ledger.events if e["op"] != "einsum"] == ["psum"]
    # A[I_XY, J]: multi-axis spec, no communication needed.
    a = sl.device_put(rng.standard_normal((16, 8)), sl.NamedSharding(mesh, P(("x", "y"))))
    b = sl.device_put(rng.standard_normal((8, 4)), sl.NamedSharding(mesh, P()))
    plan = sl.plan_einsum("ij,jk->ik", a, b)
    assert plan.bytes_sent == 0 and plan.out_sharding.spec == P(("x", "y"))
    np.testing.assert_allclose(np.asarray(sl.matmul(a, b)), np.asarray(a) @ np.asarray(b), rtol=1e-5)
    # Three operands contract pairwise in the cheapest order: (A B) is tiny, (B C) is not.
    m1 = sl.device_put(rng.standard_normal((8, 64)), sl.NamedSharding(mesh, P()))
    m2 = sl.device_put(rng.standard_normal((64, 8)), sl.NamedSharding(mesh, P("x")))
    m3 = sl.device_put(rng.standard_normal((8, 64)), sl.NamedSharding(mesh, P(None, "y")))
    plan = sl.plan_einsum("ij,jk,kl->il", m1, m2, m3, out_sharding=P())
    first = plan.steps[[s.op for s in plan.steps].index("einsum")]
    assert {t.name for t in first.inputs} == {"A", "B"}
    with sl.Ledger() as ledger:
        out = sl.einsum("ij,jk,kl->il", m1, m2, m3, out_sharding=P())
    np.testing.assert_allclose(np.asarray(out), np.asarray(m1) @ np.asarray(m2) @ np.asarray(m3), rtol=1e-4, atol=1e-5)
    assert ledger.total_bytes_sent == plan.bytes_sent


def test_matmul_vector_and_numpy_operands():
    mesh = _mesh((2, 2))
    a_np = np.arange(16.0).reshape(4, 4)
    a = sl.device_put(a_np, sl.NamedSharding(mesh, P("x", "y")))
    v = np.arange(4.0)
    np.testing.assert_allclose(np.asarray(sl.matmul(a, sl.device_put(v, sl.NamedSharding(mesh, P("y"))))),
                               a_np @ v)
    np.testing.assert_allclose(np.asarray(sl.einsum("ij,j->i", a, v)), a_np @ v)


def test_bad_inputs_name_the_op():
    mesh = _mesh((2, 2))
    a = sl.device_put(np.ones((4, 4)), sl.NamedSharding(mesh, P("x")))
    with pytest.raises(ValueError, match=r"\[plan_einsum\].*operands"):
        sl.einsum("ij,jk,kl->il", a, a)
    with pytest.raises(ValueError, match=r"\[plan_einsum\].*size"):
        sl.einsum("ij,jk->ik", a, sl.device_put(np.ones((3, 4)), sl.NamedSharding(mesh, P())))
    with pytest.raises(ValueError, match="not divisible"):
        sl.plan_einsum("ij,jk->ik", ((6, 4), P()), ((4, 4), P()), out_sharding=P("x"),
                       mesh=sl.make_mesh((4,), ("x",)))
    with pytest.raises(ValueError, match=r"\[reshard\] a PartitionSpec P\(\) needs a mesh"):  # JAX's ValueError
        sl.reshard(np.ones(3), P())


@pytest.mark.parametrize("subscripts, shapes", [
    ("...ij,jk->...ik", [(4, 8, 6), (6, 4)]),
    ("...ij,...jk", [(2, 4, 6), (2, 6, 8)]),
    ("ij,j...->i...", [(4, 6), (6, 2, 4)]),
    ("b...,b...->b...", [(4, 2, 6), (4, 2, 6)]),
])
def test_einsum_with_ellipsis_matches_numpy(subscripts, shapes):
    mesh = sl.make_mesh((2, 2), ("X", "Y"))
    rng = np.random.default_rng(len(subscripts))
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    placed = [sl.device_put(a, sl.NamedSharding(mesh, P("X") if a.shape[0] % 2 == 0 else P())) for a in arrays]
    got = np.asarray(sl.einsum(subscripts, *placed))
    np.testing.assert_allclose(got, np.einsum(subscripts, *arrays), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sa, sb", [((4, 8, 6), (6, 4)), ((6, 4), (2, 4, 6)), ((2, 2, 4, 6), (2, 6, 4)), ((6,), (2, 6, 4))])
def test_matmul_of_different_ranks_matches_numpy(sa, sb):
    mesh = sl.make_mesh((2,), ("X",))
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    got = sl.matmul(sl.device_put(a, sl.NamedSharding(mesh, P("X"))), sl.device_put(b, sl.NamedSharding(mesh, P())))
    np.testing.assert_allclose(np.asarray(got), a @ b, rtol=1e-5, atol=1e-5)


def test_einsum_ellipsis_must_reach_the_output():
    mesh = sl.make_mesh((2,), ("X",))
    a = sl.device_put(np.ones((2, 4, 6), np.float32), sl.NamedSharding(mesh, P()))
    with pytest.raises(ValueError, match=r"\[plan_einsum\] 'b\.\.\.,b\.\.\.->b': the output must keep"):
        sl.einsum("b...,b...->b", a, a)


def test_matmul_rejects_broadcast_batch_dims_with_a_reason():
    mesh = sl.make_mesh((2,), ("X",))
    a = sl.device_put(np.ones((2, 4, 6), np.float32), sl.NamedSharding(mesh, P()))
    b = sl.device_put(np.ones((1, 6, 4), np.float32), sl.NamedSharding(mesh, P()))
    with pytest.raises(ValueError, match=r"\[matmul\] batch dims .* differ \(2 vs 1\)"):
        sl.matmul(a, b)
