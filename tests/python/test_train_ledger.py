"""The training step's ledger: each collective once, in the phase where it runs (ZeRO-1/2
gradient reduce-scatter in the backward, the optimizer's all-gather in the optimizer phase, a
tied embedding's gradient all-reduced once, FSDP's table gathered only for the forward)."""

import numpy as np
import pytest

import shardlab as sl
from shardlab import train
from shardlab.models import ModelConfig, transformer

CFG = ModelConfig(num_layers=1, d_model=32, ffw_dim=64, num_heads=4, vocab_size=64, max_seq_len=8)
TIED = CFG.replace(tie_embeddings=True)
TOK = np.random.default_rng(0).integers(0, 64, (8, 8))


def _step(cfg, strategy, shape=(4,), names=("data",)):
    t = train.Trainer(cfg, strategy, sl.make_mesh(shape, names), optimizer="adamw")
    state = t.init(transformer.init_params(cfg, seed=0))
    with sl.Ledger() as ledger:
        t.step(state, TOK, TOK)
    return ledger.events


@pytest.mark.parametrize("strategy", ["zero1", "zero2"])
def test_zero_gradient_sync_is_backward_and_the_gather_is_optimizer(strategy):
    events = _step(CFG, strategy)
    scatters = [e for e in events if e["op"] == "psum_scatter"]
    gathers = [e for e in events if e["op"] == "all_gather"]
    n_params = len(train.step.tree_leaves(transformer.init_params(CFG)))
    assert scatters and {e["phase"] for e in scatters} == {"backward"}
    assert gathers and {e["phase"] for e in gathers} == {"optimizer"}
    # one reduce-scatter or psum of each gradient, one gather of each updated param (with a split)
    assert len(gathers) <= n_params and len(scatters) <= n_params
    assert all(e["label"].startswith("optimizer") for e in gathers)
    # nothing the step does after the backward pass is tagged forward
    forward = [e for e in events if e["phase"] == "forward"]
    assert not [e for e in forward if e["label"].startswith(("optimizer", "grad_sync"))]


@pytest.mark.parametrize("strategy,shape,names", [("dp", (4,), ("data",)),
                                                  ("tp", (2, 2), ("data", "model"))])
def test_a_tied_embedding_gradient_is_all_reduced_once(strategy, shape, names):
    s = train.strategy.get(strategy) if strategy == "dp" else train.strategies.tp(data="data")
    events = _step(TIED, s, shape, names)
    table = TIED.vocab_size * TIED.d_model * 4 // (2 if strategy == "tp" else 1)   # fp32, vocab split over model
    psums = [e for e in _table_psums(events, table)]
    assert len(psums) == 1 and psums[0]["phase"] == "backward"
    # untied: the table and the head each have their own gradient, each reduced once
    assert len(_table_psums(_step(CFG, s, shape, names), table)) == 2


def _table_psums(events, table):
    return [e for e in events if e["op"] == "psum" and e["axes"] == ("data",) and e["bytes_in"] == table
            and e["label"].split("/")[0] in ("embed", "head")]


def test_a_tied_embedding_under_dp_still_trains_as_one_device():
    opt = train.SGD(lr=0.1)
    t = train.Trainer(TIED, "dp", sl.make_mesh((4,), ("data",)), optimizer=opt)
    params = transformer.init_params(TIED, seed=0)
    state, _ = t.step(t.init(params), TOK, TOK)
    ref, _ = train.reference_step(TIED, params, TOK, TOK, opt, 1)
    np.testing.assert_allclose(np.asarray(state.params["embed"]), ref["embed"], rtol=1e-5, atol=1e-6)


def test_fsdp_gathers_the_embedding_table_for_the_forward_only():
    events = _step(CFG, "fsdp")
    shard = CFG.vocab_size * CFG.d_model * 4 / 4   # fp32 table split 4 ways (the input of each gather)
    table_gathers = [e for e in events if e["op"] == "all_gather" and e["label"].startswith("embed")
                     and e["bytes_in"] == shard]
    assert len(table_gathers) == 1 and table_gathers[0]["phase"] == "forward"
    # its gradient is still reduce-scattered once
    assert len([e for e in events if e["op"] == "psum_scatter" and e["label"].startswith("embed")
                and e["bytes_out"] == shard]) == 1
    # the head's matrix is gathered again in the backward: its gradient needs it
    head = [e for e in events if e["op"] == "all_gather" and e["label"].startswith("head") and e["bytes_in"] == shard]
    assert sorted(e["phase"] for e in head) == ["forward", "recompute"]
