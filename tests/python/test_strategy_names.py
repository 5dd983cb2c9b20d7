"""One spelling of the strategy names everywhere (train.strategies, Trainer, estimate,
training_memory, search), the book's "fsdp+tp" accepted; clear errors for a name that does not
exist, a mesh that does not divide the model or the batch, and hardware without a preset."""

import numpy as np
import pytest

import shardlab as sl
from shardlab import train
from shardlab.models import (STRATEGIES, ModelConfig, get_hardware, presets, step_time_lower_bound, strategy_name,
                             training_memory)

CFG = ModelConfig(num_layers=2, d_model=64, ffw_dim=128, num_heads=4, vocab_size=64, max_seq_len=16)


def test_one_spelling_and_the_books_alias():
    assert set(STRATEGIES) <= set(train.strategy.NAMES)
    for alias, name in [("fsdp+tp", "fsdp_tp"), ("tp+sp", "tp_sp"), ("fsdp+cp", "fsdp_cp"), ("fsdp_tp", "fsdp_tp")]:
        assert strategy_name(alias) == name and train.strategy.get(alias).name == name
    mesh = sl.make_mesh((2, 2), ("data", "model"))
    assert train.Trainer(CFG, "fsdp+tp", mesh).s == train.Trainer(CFG, "fsdp_tp", mesh).s
    a = train.estimate(CFG, "fsdp+tp", {"data": 2, "model": 2}, "tpu-v5p", batch=4, seq=16)
    b = train.estimate(CFG, "fsdp_tp", {"data": 2, "model": 2}, "tpu-v5p", batch=4, seq=16)
    assert a.strategy == b.strategy == "fsdp_tp" and a.step_seconds == b.step_seconds
    m1 = training_memory(CFG, "fsdp+tp", {"data": 2, "model": 2}, batch=4)
    m2 = training_memory(CFG, "fsdp_tp", {"data": 2, "model": 2}, batch=4)
    assert m1.parts == m2.parts and m1.extra["sequence_parallel"]
    # training_memory of a name equals that of the train.Strategy it names
    m3 = training_memory(CFG, train.strategies.fsdp_tp(), {"data": 2, "model": 2}, batch=4)
    assert m3.parts == m2.parts


def test_estimate_memory_follows_sequence_parallelism():
    tp = train.estimate(CFG, "tp", {"model": 4}, "tpu-v5p", batch=4, seq=16, remat="full")
    sp = train.estimate(CFG, "tp_sp", {"model": 4}, "tpu-v5p", batch=4, seq=16, remat="full")
    assert sp.memory["activations"] == tp.memory["activations"] / 4


def test_an_unknown_name_lists_the_valid_ones():
    msg = (r"\[strategy\] 'fdsp' is not a strategy; use one of dp, zero1, zero2, fsdp, zero3, tp, tp_sp, fsdp_tp, "
           r"cp, fsdp_cp, cp_tp, ep, fsdp_ep .*train.Strategy\('mine'")
    with pytest.raises(ValueError, match=msg):
        train.Trainer(CFG, "fdsp", sl.make_mesh((4,), ("data",)))
    with pytest.raises(ValueError, match=msg):
        train.estimate(CFG, "fdsp", {"data": 4}, "tpu-v5p", batch=4, seq=16)
    with pytest.raises(ValueError, match=r"\[training_memory\] strategy 'fdsp' is not one of dp, fsdp, zero1, zero2, "
                                         r"zero3, tp, tp_sp, fsdp_tp"):
        training_memory(CFG, "fdsp", {"data": 4}, batch=4)
    with pytest.raises(ValueError, match=r"\[Trainer\] precision 'bf16' is not one of 'fp32', 'mixed', 'bf16_params'"):
        train.Trainer(CFG, "dp", sl.make_mesh((4,), ("data",)), precision="bf16")


@pytest.mark.parametrize("strategy,mesh,kwargs,match", [
    ("tp", {"model": 8}, {}, r"\[tp\] num_heads 4 is not divisible by the model axis 'model' of size 8"),
    ("fsdp_tp", {"data": 2, "model": 8}, {}, r"num_heads 4 is not divisible by the model axis 'model' of size 8"),
    ("dp", {"data": 4}, {"batch": 6}, r"\[dp\] batch 6 is not divisible by the data axes \('data',\) of size 4"),
    ("tp_sp", {"model": 4}, {"seq": 18}, r"sequence length 18 is not divisible by the model axis 'model' of size 4"),
    ("fsdp_cp", {"data": 2, "context": 4}, {"seq": 12},
     r"sequence length 12 is not divisible by 2 x the context axis 'context' of size 4"),
])
def test_a_mesh_that_does_not_divide_names_the_dimension_and_the_axis(strategy, mesh, kwargs, match):
    args = {"batch": 8, "seq": 16, **kwargs}
    s = train.strategy.get(strategy)
    with pytest.raises(ValueError, match=match):   # what Trainer and estimate check
        s.validate(CFG, sl.make_mesh(tuple(mesh.values()), tuple(mesh), abstract=True), **args)
    if "batch" not in kwargs and "seq" not in kwargs:
        with pytest.raises(ValueError, match=match):
            train.estimate(CFG, strategy, mesh, "tpu-v5p", **args)


def test_kv_heads_and_layers():
    gqa = CFG.replace(num_heads=8, num_kv_heads=2, d_model=64)
    with pytest.raises(ValueError, match=r"num_kv_heads 2 is not divisible by the model axis 'model' of size 4"):
        train.Trainer(gqa, "tp", sl.make_mesh((4,), ("model",)))
    with pytest.raises(ValueError, match=r"num_layers 2 is not divisible by pipeline"):
        train.estimate(CFG, "fsdp", {"data": 2}, "tpu-v5p", batch=8, seq=16, pipeline=4)


def test_hardware_without_a_preset_says_how_to_build_one():
    how = r"unknown preset 'mi300'.*Hardware\(name='my-chip', family='gpu', peak_flops=.*\.replace\("
    with pytest.raises(ValueError, match=r"\[step_time_lower_bound\] " + how):
        step_time_lower_bound(presets.get("llama2-7b"), 1_000_000, "mi300", 8)
    with pytest.raises(ValueError, match=r"\[search\] " + how):
        train.search(CFG, "mi300", chips=8, batch=8, seq=16)
    # and the Hardware it says to build works where a preset does
    chip = sl.hardware.Hardware(name="my-chip", family="gpu", peak_flops={"bfloat16": 1e15}, hbm_capacity=80e9,
                                hbm_bandwidth=3e12, node_size=8, nvlink_link_bandwidth=25e9, nvlink_links=18,
                                ib_bandwidth=50e9)
    assert get_hardware(chip) is chip
    r = train.search(CFG, chip, chips=8, batch=8, seq=16, strategies=("fsdp",), prices="ideal")
    assert r.best.fits and np.isfinite(r.best.step_seconds)
