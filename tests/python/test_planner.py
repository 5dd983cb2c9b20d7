"""shardlab.plan_einsum: the book's four cases, problems 4 and 9, rejections and rendering."""

import pytest

import shardlab as sl
from shardlab import P


def _mesh(shape=(4, 2), hardware=None):
    return sl.make_mesh(shape, ("X", "Y")[: len(shape)], hardware=hardware)


def _line(hardware=None):
    """A 1-D mesh: with no idle axis the planner's choices are exactly the book's."""
    return _mesh((4,), hardware)


def _plan(sa, sb, out=None, shapes=((64, 128), (128, 32)), mesh=None, **kw):
    mesh = mesh or _mesh()
    return sl.plan_einsum("ij,jk->ik", (shapes[0], sl.NamedSharding(mesh, sa)),
                          (shapes[1], sl.NamedSharding(mesh, sb)), out_sharding=out, **kw)


def test_case1_no_communication():
    plan = _plan(P("X"), P(None, "Y"))
    assert plan.ops == () and plan.bytes_sent == 0
    assert plan.out_sharding.spec == P("X", "Y")
    assert str(plan.steps[0]) == "A[I_X, J] ._J B[J, K_Y] -> C[I_X, K_Y]"
    assert plan.cases[0].startswith("case 1")
    # The FLOPs are those of the local blocks: 2 * (64/4) * 128 * (32/2).
    assert plan.flops == 2 * 16 * 128 * 16


@pytest.mark.parametrize("m, k", [(128, 32), (32, 128)])
def test_case2_gathers_or_reduces_whichever_sends_less(m, k):
    n, x = 64, 4
    plan = _plan(P(None, "X"), P(), out=P(), shapes=((n, m), (m, k)), mesh=_line())
    gather = (x - 1) * n * m // x * 4            # AllGather_X(A[I, J_X]): (n-1) local blocks
    reduce = 2 * (x - 1) / x * n * k * 4         # AllReduce_X(C[I, K]{U_X})
    assert plan.bytes_sent == min(gather, reduce)
    assert plan.ops == (("all_gather",) if gather < reduce else ("psum",))
    other = plan.alternative(("psum",) if gather < reduce else ("all_gather",))
    assert other is not None and other.bytes_sent == max(gather, reduce)
    assert plan.cases[0].startswith("case 2")


def test_case3_allreduce_reducescatter_or_unreduced():
    assert _plan(P(None, "X"), P("X"), out=P(), mesh=_line()).ops == ("psum",)
    rs = _plan(P(None, "X"), P("X"), out=P(None, "X"), mesh=_line())
    assert rs.ops == ("psum_scatter",)
    assert str(rs.steps[-1]) == "ReduceScatter_{X,K}(C[I, K]{U_X}) -> C[I, K_X]"
    left = _plan(P(None, "X"), P("X"), out=P(), unreduced=("X",), mesh=_line())
    assert left.ops == () and left.out_unreduced == {"X"}
    assert str(left.steps[-1]) == "A[I, J_X] ._J B[J_X, K] -> C[I, K]{U_X}"
    assert rs.cases[0].startswith("case 3")


def test_case4_gathers_the_cheaper_operand_that_gives_the_output():
    small_a = _plan(P("X"), P(None, "X"), shapes=((16, 64), (64, 256)), mesh=_line())
    assert small_a.collectives == [("all_gather", ("X",), "A")]
    small_b = _plan(P("X"), P(None, "X"), shapes=((256, 64), (64, 16)), mesh=_line())
    assert small_b.collectives == [("all_gather", ("X",), "B")]
    # The wanted output decides: C[I, K_X] needs X off I, so gathering B alone is not enough.
    forced = _plan(P("X"), P(None, "X"), out=P(None, "X"), shapes=((256, 64), (64, 16)), mesh=_line())
    assert forced.out_sharding.spec == P(None, "X") and forced.ops != ("all_gather",)
    gather_a = forced.alternative(("all_gather",))
    assert gather_a.collectives == [("all_gather", ("X",), "A")]
    assert forced.bytes_sent <= gather_a.bytes_sent
    assert small_a.cases[0].startswith("case 4")
    (what, why), = small_a.rejected
    assert "twice" in why and "X" in why


def test_axis_twice_is_rejected_with_the_reason():
    with pytest.raises(sl.DuplicateSpecError, match="diagonal"):
        _plan(P("X"), P(None, "X"), out=P("X", "X"))
    with pytest.raises(ValueError, match="unreduced"):  # nothing is contracted in an outer product
        sl.plan_einsum("i,k->ik", ((8,), P("X")), ((8,), P()), unreduced=("X",), mesh=_line())


def test_problem4_gather_then_multiply_vs_multiply_then_allreduce():
    """X[B, D] ._D Y[D_X, F] -> Z[B, F]: strategy 1 gathers Y, strategy 2 slices X and AllReduces.
    Counting bytes, strategy 2 sends less exactly when D > 2B (the book's condition)."""
    mesh = _line()
    for b, d, f in [(128, 1024, 512), (1024, 1024, 512), (256, 1024, 512), (64, 64, 64)]:
        plan = sl.plan_einsum("bd,df->bf", ((b, d), P()), ((d, f), P("X")), out_sharding=P(), mesh=mesh,
                              names="XYZ")
        s1, s2 = plan.alternative(("all_gather",)), plan.alternative(("psum",))
        assert s1.flops == 2 * b * d * f and s2.flops == 2 * b * d * f / 4
        if d != 2 * b:
            assert (plan.ops == ("psum",)) == (d > 2 * b)
        assert (s2.bytes_sent < s1.bytes_sent) == (d > 2 * b)
    assert str(s1.steps[0]) == "AllGather_X(Y[D_X, F]) -> Y[D, F]"


def test_problem4_on_tpu_v5e_in_time():
    """On hardware the plan minimises max(compute, comm): small batches favour strategy 2."""
    mesh = sl.make_mesh((4,), ("X",), hardware="tpu-v5e")

    def plans(b, d, f):
        p = sl.plan_einsum("bd,df->bf", ((b, d), P(), "bfloat16"), ((d, f), P("X"), "bfloat16"),
                           out_sharding=P(), mesh=mesh)
        return p, p.alternative(("all_gather",)), p.alternative(("psum",))

    p, s1, s2 = plans(128, 8192, 32768)
    assert p.ops == ("psum",) and s2.seconds < s1.seconds
    assert s1.comm_seconds > s1.compute_seconds  # strategy 1 is communication-bound here
    p, s1, s2 = plans(8192, 1024, 32768)
    assert p.ops == ("all_gather",) and s1.seconds < s2.seconds
    assert p.seconds == max(p.comm_seconds, p.compute_seconds)


@pytest.mark.parametrize("out", [P("X"), P(None, "X")])
def test_problem9_comm_ratio_is_m_over_k(out):
    mesh = sl.make_mesh((4,), ("X",))
    n, m, k = 64, 96, 32
    plan = sl.plan_einsum("nm,mk->nk", ((n, m), P(None, "X")), ((m, k), P()), out_sharding=out, mesh=mesh)
    gather, rs = plan.alternative(("all_gather",)), plan.alternative(("psum_scatter",))
    assert gather.bytes_sent / rs.bytes_sent == pytest.approx(m / k)
    # Both lose to a third way the book does not list: AllToAll A[I, J_X] -> A[I_X, J] (when
    # the output is row-sharded) moves only 1/|X| of A.
    assert plan.bytes_sent <= min(gather.bytes_sent, rs.bytes_sent)


def test_rendering_text_latex_html():
    mesh = _mesh((4, 2))
    plan = sl.plan_einsum("ij,jk->ik", ((64, 128), P(None, "X")), ((128, 32), P()), out_sharding=P(),
                          mesh=_line())
    text = plan.text()
    assert "AllGather_X(A[I, J_X]) -> A[I, J]" in text
    assert "rejected alternatives" in text and "AllReduce_X(C[I, K]{U_X}) -> C[I, K]" in text
    assert r"\text{AllGather}_{X}(A[I, J_{X}]) \to A[I, J]" in plan.alternative(("all_gather",))._repr_latex_()
    assert r"C[I, K]\{U_{X}\}" in plan._repr_latex_()
    assert "J<sub>X</sub>" in plan._repr_html_()
    multi = sl.plan_einsum("ij,jk->ik", ((8, 16), P(None, ("X", "Y"))), ((16, 256), P()),
                           out_sharding=P(), mesh=mesh)
    assert multi.summary() == "AllGather_{XY}(A[I, J_XY]) -> A[I, J]; A[I, J] ._J B[J, K] -> C[I, K]"


def test_predicted_seconds_need_hardware():
    assert _plan(P(None, "X"), P(), out=P()).seconds is None
    plan = _plan(P(None, "X"), P(), out=P(), mesh=_mesh(hardware="tpu-v5e"))
    assert plan.seconds > 0 and plan.comm_seconds > 0


def test_batch_dim_sharded_on_one_operand_is_sliced_not_gathered():
    mesh = _mesh()
    plan = sl.plan_einsum("bij,bjk->bik", ((8, 16, 32), P("X")), ((8, 32, 16), P()), mesh=mesh)
    assert plan.ops == () and plan.out_sharding.spec == P("X")
    assert [s.op for s in plan.steps] == ["dynamic_slice", "einsum"]
