
import pytest
from hypothesis import given, settings, strategies as st

from shardlab import cost, hardware

V5E = {"X": 8, "Y": 4}
V4P = {"X": 4, "Y": 4, "Z": 4}


# ---- closed forms against hand-computed values (part 3 of the book) ----------------------

def test_quiz2_allgather_on_v5e_line():
    t = cost.all_gather_time((2048, 8192), "bfloat16", ("Y", None), mesh_shape=V5E, hardware="tpu-v5e")
    v = 2048 * 8192 * 2
    assert t.bytes == v
    assert t.book_seconds == pytest.approx(v / 9e10)            # V / W_bidi, as if the axis wrapped
    assert t.seconds == pytest.approx(3 * (v / 4) / 4.5e10)     # no wraparound: 3 hops of a shard
    assert t.links[0].topology == "line" and t.bound == "bandwidth"
    small = cost.all_gather_time((256, 256), "bfloat16", ("Y", None), mesh_shape=V5E, hardware="tpu-v5e")
    assert small.bound == "latency" and small.seconds == pytest.approx(3e-6)


def test_problem2_v4p():
    ag_x = cost.all_gather_time((1024, 4096), "bfloat16", ("X", "Y"), axes="X", mesh_shape=V4P, hardware="tpu-v4p")
    v = 2 * 1024 * 4096 / 4
    assert ag_x.book_seconds == pytest.approx(v / 9e10)
    assert ag_x.seconds == pytest.approx(v / 9e10 * 3 / 4)      # (n-1)/n of the book's figure
    ag_xy = cost.all_gather_time((1024, 4096), "bfloat16", ("X", "Y"), mesh_shape=V4P, hardware="tpu-v4p")
    assert ag_xy.book_seconds == pytest.approx(2 * 1024 * 4096 / (2 * 9e10))
    assert ag_xy.seconds == pytest.approx(15 / 64 * 2 * 1024 * 4096 / 4.5e10)
    ar_z = cost.all_reduce_time((1024, 4096), "bfloat16", ("X", "Y"), axes="Z", mesh_shape=V4P, hardware="tpu-v4p")
    assert ar_z.book_seconds == pytest.approx(4 * 1024 * 4096 / (16 * 9e10))


def test_problem3_latency_bound():
    t = cost.all_gather_time((128,), "bfloat16", ("X",), mesh_shape=V4P, hardware="tpu-v4p")
    assert t.bound == "latency" and t.hops == 2 and t.seconds == pytest.approx(2e-6)


def test_all_to_all_quarter_and_half():
    kw = dict(mesh_shape={"X": 16}, hardware="tpu-v5e")
    ag = cost.all_gather_time((4096, 4096), "bfloat16", ("X",), **kw)
    a2a = cost.all_to_all_time((4096, 4096), "bfloat16", ("X",), **kw)
    assert a2a.book_seconds == pytest.approx(ag.book_seconds / 4)
    assert a2a.bandwidth_seconds == pytest.approx(a2a.bytes / 8 / 4.5e10)
    ag_u = cost.all_gather_time((4096, 4096), "bfloat16", ("X",), topology="uni_ring", **kw)
    a2a_u = cost.all_to_all_time((4096, 4096), "bfloat16", ("X",), topology="uni_ring", **kw)
    assert a2a_u.bandwidth_seconds == pytest.approx(ag_u.bandwidth_seconds / 2)
    assert a2a_u.book_seconds == pytest.approx(ag_u.book_seconds / 2)


def test_gpu_node_and_dcn():
    t = cost.all_gather_time((1024, 16384), "bfloat16", ("G", None), mesh_shape={"G": 8}, hardware="h100")
    v = 2 * 1024 * 16384
    assert t.seconds == pytest.approx(v * 7 / 8 / 450e9)
    a2a = cost.all_to_all_time((1024, 16384), "bfloat16", ("G", None), mesh_shape={"G": 8}, hardware="h100")
    assert a2a.seconds == pytest.approx(v * 7 / 64 / 450e9)
    dcn = cost.all_reduce_time((1 << 20,), "float32", (), axes="D", mesh_shape={"D": 2, "X": 16, "Y": 16},
                               hardware="tpu-v5e")
    assert dcn.links[0].link == "dcn"
    assert dcn.bandwidth_seconds == pytest.approx(2 * 4 * (1 << 20) / 2 / 3.125e9)


def test_ppermute():
    t = cost.ppermute_time((1024, 1024), "float32", ("X", None), axes="X", mesh_shape={"X": 4}, hardware="tpu-v4p")
    assert t.bytes == 256 * 1024 * 4
    assert t.seconds == pytest.approx(t.bytes / 4.5e10)
    assert t.book_seconds == pytest.approx(t.bytes / 4.5e10)


def test_compute_helpers():
    assert cost.critical_batch_size("tpu-v5e") == pytest.approx(1.97e14 / 8.2e11)
    assert round(cost.critical_batch_size("tpu-v5e")) == 240
    assert cost.critical_batch_size("tpu-v5e", weight_dtype="int8") == pytest.approx(1.97e14 / 8.2e11 / 2)
    assert cost.ici_critical_intensity("tpu-v5p") == pytest.approx(2550)
    assert cost.einsum_flops("bd,df->bf", (8, 16), (16, 32)) == 2 * 8 * 16 * 32
    # causal attention counts the T(T+1)/2 (query, key) pairs the kernel computes, as the ledger does
    assert cost.attention_flops(2, 128, 128, 4, 64, causal=True) == cost.attention_flops(2, 128, 128, 4, 64) * 129 / 256
    m = cost.matmul_time(64, 4096, 8192, "bfloat16", hardware="b200")
    assert m.bound == "memory" and m.t_hbm == pytest.approx((64 * 4096 + 4096 * 8192 + 64 * 8192) * 2 / 8e12)
    assert cost.peak_flops("tpu-v5e", "float32")[1] is not None
    assert cost.peak_flops("h100", "float8_e4m3fn") == (1.979e15, None)


def test_shard_bytes_quizzes():
    q1 = cost.shard_bytes((1024, 4096), "float32", (("X", "Y"), None), mesh_shape={"X": 8, "Y": 2})
    assert q1.local_shape == (64, 4096) and q1.bytes_per_device == 4 * 64 * 4096
    q = cost.shard_bytes((128, 2048), "int8", (("X", "Y"), None), mesh_shape={"X": 2, "Y": 8, "Z": 2})
    assert q.bytes_per_device == 16384 and q.total_bytes == 512 * 1024 and q.replication == 2
    p1 = cost.shard_bytes((64, 8, 8), "float32", ("X",), mesh_shape={"X": 4, "Y": 8, "Z": 2})
    assert p1.total_bytes / p1.array_bytes == 16


# ---- link-level counts against the closed forms -------------------------------------------

@pytest.mark.parametrize("d", [2, 3, 4, 5, 8, 12, 16])
def test_problem10_counts(d):
    n = 24 * d
    ag = cost.schedule("all_gather", d, "uni_ring", n * n)
    a2a = cost.schedule("all_to_all", d, "uni_ring", n * n)
    assert all(l.bytes == pytest.approx(n * n * (1 - 1 / d)) for l in ag.links)
    assert a2a.max_link_bytes == pytest.approx(n * n / 2 * (1 - 1 / d))
    bi_ag = cost.schedule("all_gather", d, "ring", n * n)
    bi_a2a = cost.schedule("all_to_all", d, "ring", n * n)
    assert bi_ag.max_link_bytes == pytest.approx(ag.max_link_bytes / 2)
    if d % 2 == 0:
        assert bi_a2a.max_link_bytes == pytest.approx(n * n / 8)


# ---- properties -----------------------------------------------------------------------------

ops = st.sampled_from(["all_gather", "reduce_scatter", "all_reduce", "all_to_all"])
presets = st.sampled_from(hardware.names())


@settings(max_examples=60, deadline=None)
@given(op=ops, hw=presets, n=st.integers(2, 16), b1=st.floats(0, 1e10), b2=st.floats(0, 1e10))
def test_time_grows_with_bytes(op, hw, n, b1, b2):
    lo, hi = sorted((b1, b2))
    kw = dict(axes="A", mesh_shape={"A": n if hardware.get(hw).family == "tpu" else min(n, 8)}, hardware=hw)
    assert cost.collective_time(op, lo, **kw).seconds <= cost.collective_time(op, hi, **kw).seconds * (1 + 1e-12)


@settings(max_examples=40, deadline=None)
@given(op=ops, k=st.integers(2, 6))
def test_bandwidth_bound_time_independent_of_axis_size(op, k):
    # Book form: exactly independent of n; link-level: (n-1)/n of it, approaching it as n grows.
    v = 1e9
    times = [cost.collective_time(op, v, axes="X", mesh_shape={"X": 4 * m}, hardware="tpu-v4p") for m in (k, 2 * k)]
    assert times[0].book_seconds == pytest.approx(times[1].book_seconds)
    ratio = times[0].seconds / times[0].book_seconds
    n0 = 4 * k
    expect = (n0 - 1) / n0 if op != "all_to_all" else 1.0
    assert ratio == pytest.approx(expect)


@settings(max_examples=40, deadline=None)
@given(hw=presets, n=st.integers(2, 8), v=st.floats(1e3, 1e10))
def test_all_reduce_is_twice_all_gather(hw, n, v):
    kw = dict(axes="A", mesh_shape={"A": n}, hardware=hw)
    ag, ar = cost.collective_time("all_gather", v, **kw), cost.collective_time("all_reduce", v, **kw)
    assert ar.bandwidth_seconds == pytest.approx(2 * ag.bandwidth_seconds)
    assert ar.latency_seconds == pytest.approx(2 * ag.latency_seconds)
    assert ar.book_seconds == pytest.approx(2 * ag.book_seconds)


# ---- bad input --------------------------------------------------------------------------------

def test_bad_input():
    with pytest.raises(ValueError, match="known presets"):
        cost.collective_time("all_gather", 1e6, axes="X", mesh_shape={"X": 4}, hardware="tpu-v2")
    with pytest.raises(ValueError, match="negative"):
        cost.all_gather_time((-4, 8), "float32", ("X",), mesh_shape={"X": 4}, hardware="tpu-v4p")
    with pytest.raises(ValueError, match="bytes"):
        cost.collective_time("all_gather", -1, axes="X", mesh_shape={"X": 4}, hardware="tpu-v4p")
    with pytest.raises(ValueError, match="'Q'"):
        cost.collective_time("all_gather", 1e6, axes="Q", mesh_shape={"X": 4}, hardware="tpu-v4p")
    with pytest.raises(ValueError, match="does not shard"):
        cost.all_gather_time((8, 8), "float32", ("X",), axes="Y", mesh_shape={"X": 4, "Y": 2}, hardware="tpu-v4p")
    with pytest.raises(ValueError, match="already shards"):
        cost.all_reduce_time((8, 8), "float32", ("X",), axes="X", mesh_shape={"X": 4}, hardware="tpu-v4p")
    with pytest.raises(ValueError, match="divisible"):
        cost.all_gather_time((6, 8), "float32", ("X",), mesh_shape={"X": 4}, hardware="tpu-v4p")
    with pytest.raises(ValueError, match="unknown collective"):
        cost.collective_time("all_scatter", 1.0, axes="X", mesh_shape={"X": 4}, hardware="tpu-v4p")
    with pytest.raises(ValueError, match="appears twice"):
        cost.collective_time("ppermute", 1.0, axes="X", mesh_shape={"X": 4}, hardware="tpu-v4p", perm=[(0, 1), (0, 2)])
    with pytest.raises(ValueError, match="no hardware"):
        cost.collective_time("psum", 1.0, axes="X", mesh_shape={"X": 4})
    with pytest.raises(ValueError, match="topology"):
        cost.collective_time("psum", 1.0, axes="X", mesh_shape={"X": 4}, hardware="tpu-v4p", topology="star")
    with pytest.raises(ValueError, match="unknown dtype"):
        cost.itemsize("float128x")


# ---- ledger events and the roofline ---------------------------------------------------------

class FakeMesh:
    def __init__(self, shape, hw, physical=None):
        self.shape = shape
        self.hardware = hardware.get(hw)
        self.physical_axes = physical


def _ag_event(v, n):
    return dict(op="all_gather", axes=("X",), group_size=n, num_groups=1, dtype="bfloat16", bytes_in=v / n,
                bytes_out=v, bytes_sent=(n - 1) / n * v, flops=0, hbm_bytes=0, seconds=None)


def test_event_seconds_matches_standalone():
    mesh = FakeMesh({"X": 8, "Y": 4}, "tpu-v5e")
    e = _ag_event(1 << 24, 8)
    direct = cost.collective_time("all_gather", 1 << 24, axes="X", mesh_shape=mesh.shape, hardware="tpu-v5e")
    assert cost.event_seconds(e, mesh) == pytest.approx(direct.seconds)
    a2a = dict(e, op="all_to_all", bytes_in=1 << 21, bytes_out=1 << 21)
    assert cost.event_seconds(a2a, mesh) == pytest.approx(
        cost.collective_time("all_to_all", 8 << 21, axes="X", mesh_shape=mesh.shape, hardware="tpu-v5e").seconds)
    mm = dict(op="matmul", axes=(), dtype="bfloat16", flops=2e12, hbm_bytes=1e9)
    assert cost.event_seconds(mm, mesh) == pytest.approx(max(2e12 / 1.97e14, 1e9 / 8.2e11))
    with pytest.raises(ValueError, match="unknown event op"):
        cost.event_seconds(dict(op="fft"), mesh)


def test_roofline_verdicts_and_overlap():
    mesh = FakeMesh({"X": 8, "Y": 4}, "tpu-v5e")
    mm = dict(op="matmul", axes=(), dtype="bfloat16", flops=2e12, hbm_bytes=1e9)
    ag = _ag_event(1 << 24, 8)
    r = cost.roofline([mm, ag], mesh)
    assert r.bound == "compute" and r.total_seconds == pytest.approx(r.t_math)
    assert r.t_comms_by_axes == {"X": pytest.approx(cost.event_seconds(ag, mesh))}
    s = cost.roofline([mm, ag], mesh, overlap="sum")
    assert s.total_seconds == pytest.approx(r.t_math + r.t_hbm + r.t_comms)
    comm = cost.roofline([dict(mm, flops=1e6, hbm_bytes=1e3), _ag_event(1 << 30, 8)], mesh)
    assert comm.bound == "communication"
    mem = cost.roofline([dict(mm, flops=1e9, hbm_bytes=1e9)], mesh)
    assert mem.bound == "memory" and mem.arithmetic_intensity == 1.0
    assert "overlap" in r.text() and "<table" in r._repr_html_()
    with pytest.raises(ValueError, match="overlap"):
        cost.roofline([], mesh, overlap="min")
    f32 = cost.roofline([dict(mm, dtype="float32")], mesh)
    assert any("bf16 peak" in n for n in f32.notes)


def test_ledger_of_a_real_shard_map_program():
    import numpy as np

    import shardlab as sl
    from shardlab import P

    mesh = sl.make_mesh((8, 4), ("X", "Y"), hardware="tpu-v5e")
    x = sl.device_put(np.ones((256, 512), np.float32), sl.NamedSharding(mesh, P("X", "Y")))
    w = sl.device_put(np.ones((512, 128), np.float32), sl.NamedSharding(mesh, P("Y", None)))

    def f(a, b):
        return sl.lax.psum(a @ b, "Y")

    with sl.Ledger() as led:
        sl.shard_map(f, mesh=mesh, in_specs=(P("X", "Y"), P("Y", None)), out_specs=P("X", None))(x, w)
    psums = [e for e in led.events if e["op"] == "psum"]
    assert len(psums) == 1
    e = psums[0]
    want = cost.collective_time("psum", e["bytes_in"], axes=("Y",), mesh_shape={"X": 8, "Y": 4}, hardware="tpu-v5e")
    assert e["seconds"] == pytest.approx(want.seconds)
    r = led.roofline()
    assert r.t_comms_by_axes["Y"] == pytest.approx(want.seconds)
    assert r.bound in ("compute", "memory", "communication")
