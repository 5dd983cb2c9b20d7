"""The per-chip price lists and the one pricing function (shardlab.cost.price_event)."""

import pytest

import shardlab as sl
from shardlab import cost, hardware
from shardlab.models import presets
from shardlab.serve import StepModel

# XLA's measured GEMM throughput on H100 (sm_90, bf16; xla/service/gpu/model/matmul_interpolator_data.h):
# (batch, m, n, k, FLOP/s)
XLA_SM90 = [(1, 1024, 2048, 256, 139.52e12), (1, 256, 2048, 256, 41.84e12), (1, 4096, 512, 512, 238.82e12),
            (2, 1024, 2048, 1024, 493.45e12), (1, 2048, 2048, 2048, 631.98e12), (1, 256, 1024, 256, 22.67e12),
            (1, 4096, 4096, 4096, 783.33e12), (2, 4096, 2048, 4096, 783.19e12), (1, 512, 4096, 1024, 373.35e12),
            (4, 1024, 2048, 2048, 712.74e12), (1, 512, 256, 256, 11.46e12), (1, 4096, 4096, 256, 392.16e12)]


def test_every_preset_has_a_price_list_with_a_source_for_each_figure():
    for name in hardware.names():
        p = cost.price_list(name)
        assert p.chip == name
        assert 0.5 < p.matmul("bfloat16") < 1 and 0.5 < p.hbm_efficiency < 1
        for field in ("matmul_efficiency", "hbm_efficiency", "attention_efficiency"):
            assert p.sources[field]
        assert any(k.startswith("collective_efficiency") for k in p.sources)
    assert cost.price_list("h100").kernel_overhead > 0 and cost.price_list("tpu-v5p").kernel_overhead == 0


def test_the_mamf_figures_and_the_sustained_fraction():
    assert cost.MAMF["a100"][0] == pytest.approx(271.2 / 312) and cost.MAMF["b200"][1] == pytest.approx(3432.5 / 4500)
    assert cost.price_list("a100").matmul("bfloat16") == 0.70        # fitted on Megatron-LM's Table 1
    r = 0.70 / (271.2 / 312)
    assert cost.price_list("h100").matmul("bfloat16") == pytest.approx(794.5 / 989 * r, abs=1e-3)
    assert cost.price_list("b200").matmul("float8_e4m3fn") == pytest.approx(3432.5 / 4500 * r, abs=1e-3)
    assert cost.price_list("h200").matmul("float16") == cost.price_list("h200").matmul("bfloat16")
    assert cost.price_list("tpu-v5p").matmul("bfloat16") == 0.81 and cost.price_list("tpu-v5e").matmul("bfloat16") == 0.87
    assert cost.price_list("tpu-v4p").matmul("bfloat16") == 0.78                 # fitted on MaxText's v4 rows
    assert cost.price_list("tpu-v6e").matmul("bfloat16") == 0.84                 # the mean of v5p's and v5e's
    assert "fitted" in cost.price_list("tpu-v5p").sources["matmul_efficiency"]
    assert "assumed" in cost.price_list("tpu-v6e").sources["matmul_efficiency"]


def test_the_h100_price_at_mamf_reproduces_xlas_measured_gemms():
    burst = cost.price_list("h100").replace(matmul_efficiency={"bfloat16": cost.MAMF["h100"][0]})
    errs = []
    for b, m, n, k, fps in XLA_SM90:
        ev = {"op": "matmul", "flops": 2 * b * m * n * k, "hbm_bytes": 2 * b * (m * k + k * n + m * n),
              "dtype": "bfloat16"}
        errs.append(cost.price_event(ev, "h100", burst) / (2 * b * m * n * k / fps) - 1)
    assert sum(abs(e) for e in errs) / len(errs) < 0.06
    assert max(abs(e) for e in errs) < 0.2
    # the ideal roofline is 2-5x too fast on the small ones
    small = {"op": "matmul", "flops": 2 * 512 * 256 * 256, "hbm_bytes": 2 * (512 * 256 * 2 + 256 * 256), "dtype": "bfloat16"}
    assert cost.price_event(small, "h100", "ideal") < cost.price_event(small, "h100", burst) / 10


def test_ideal_prices_are_the_ledgers_seconds():
    mesh = sl.make_mesh((8,), ("x",), hardware="tpu-v5e", abstract=True)
    ev = {"op": "psum", "axes": ("x",), "group_size": 8, "bytes_in": 1e6, "bytes_out": 1e6}
    assert cost.price_event(ev, prices="ideal", mesh=mesh) == pytest.approx(cost.event_seconds(ev, mesh))
    mm = {"op": "matmul", "flops": 1e12, "hbm_bytes": 1e8, "dtype": "bfloat16"}
    assert cost.price_event(mm, "tpu-v5e", "ideal") == cost.compute_time(1e12, 1e8, "bfloat16", "tpu-v5e").seconds
    # calibrated: slower than the peaks, by the efficiency
    assert cost.price_event(mm, "tpu-v5e") == pytest.approx(cost.price_event(mm, "tpu-v5e", "ideal") / 0.87)
    assert cost.price_event(ev, mesh=mesh) > cost.price_event(ev, prices="ideal", mesh=mesh)


def test_memory_bound_work_is_bytes_at_the_reached_bandwidth():
    ev = {"op": "elementwise", "hbm_bytes": 3.35e9}
    assert cost.price_event(ev, "h100") == pytest.approx(1e-3 / 0.9 + 5.75e-6)
    assert cost.memory_seconds(3.35e9, "h100", kernels=0) == pytest.approx(1e-3 / 0.9)


def test_small_collectives_reach_less_of_the_link():
    p = cost.price_list("h100")
    assert p.collective("nvlink") == 0.8 and p.collective("ici:x") == 1.0   # a link the GPU list does not name
    mesh = sl.make_mesh((8,), ("x",), hardware="h100", abstract=True)

    def busbw(v):   # NCCL-tests' bus bandwidth of an all-reduce of v bytes over 8 GPUs
        ev = {"op": "psum", "axes": ("x",), "group_size": 8, "bytes_in": v, "bytes_out": v}
        return 2 * 7 / 8 * v / cost.price_event(ev, mesh=mesh)

    assert busbw(1e3) < 0.01 * busbw(1e9)                       # latency and the per-call overhead
    assert busbw(1e9) == pytest.approx(0.8 * 450e9, rel=0.01)   # large: 80 % of NVLink


def test_attention_uses_flash_attentions_fractions():
    f = {"op": "attention", "flops": 1e12, "dtype": "bfloat16"}
    b = {"op": "attention_vjp", "flops": 1e12, "dtype": "bfloat16"}
    p = cost.price_list("a100")
    assert cost.price_event(f, "a100") == pytest.approx(1e12 / (0.70 * 312e12) + p.kernel_overhead)
    assert cost.price_event(b, "a100") > cost.price_event(f, "a100")


def test_bad_input():
    with pytest.raises(ValueError, match="has no price list.*replace"):
        cost.price_list(hardware.get("h100").replace(name="mychip"))
    with pytest.raises(ValueError, match="must be in \\(0, 1\\]"):
        cost.PriceList("x", hbm_efficiency=1.5)
    with pytest.raises(ValueError, match="unknown event op"):
        cost.price_event({"op": "fft"}, "h100")
    with pytest.raises(ValueError, match="needs the mesh"):
        cost.price_event({"op": "psum", "axes": ("x",), "group_size": 2, "bytes_in": 1, "bytes_out": 1}, "h100")
    with pytest.raises(ValueError, match="no hardware"):
        cost.price_event({"op": "matmul", "flops": 1})
    what_if = cost.price_list("h100").replace(hbm_efficiency=0.45)
    assert cost.price_event({"op": "elementwise", "hbm_bytes": 1e9}, "h100", what_if) > \
        1.9 * cost.price_event({"op": "elementwise", "hbm_bytes": 1e9}, "h100") - 1e-5


def test_the_serving_step_model_prices_with_the_same_lists():
    cfg = presets.get("llama2-13b")
    ideal = StepModel(cfg, "h100", {"x": 8})
    chip = StepModel(cfg, "h100", {"x": 8}, prices=None)
    assert ideal.prices is cost.IDEAL and chip.prices == cost.price_list("h100")
    assert ideal.hbm_bw == pytest.approx(8 * 3.35e12) and chip.hbm_bw == pytest.approx(0.9 * 8 * 3.35e12)
    a, b = ideal.step(decode_batch=8, kv_tokens=8 * 4096), chip.step(decode_batch=8, kv_tokens=8 * 4096)
    assert b.seconds > a.seconds and chip.comm_seconds(64) > ideal.comm_seconds(64) > 0
