"""Training and pipelines run unchanged across ranks: a Trainer step (AdamW, FSDP + TP) and a
1F1B pipeline schedule (stages on different ranks: their sends are ppermutes between ranks)
give the one-process values and ledger."""

import numpy as np
import pytest

import shardlab as sl
from shardlab import train
from shardlab.models import ModelConfig, transformer
from shardlab.train import pipeline as pp

from common import run_both

CFG = ModelConfig(num_layers=1, d_model=32, ffw_dim=64, num_heads=4, vocab_size=64, max_seq_len=8)
PIPE_CFG = ModelConfig(num_layers=2, d_model=16, ffw_dim=32, num_heads=2, num_kv_heads=1, vocab_size=32)
_RNG = np.random.default_rng(0)
TOK, TGT = _RNG.integers(0, 64, (8, 8)), _RNG.integers(0, 64, (8, 8))


def _close(mpi, one, tol):
    (v1, e1), (v0, e0) = mpi, one
    assert e1 == e0 and e1
    for a, b in zip(v1, v0):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("strategy,shape,names", [("fsdp_tp", (2, 4), ("data", "model")), ("dp", (8,), ("data",))])
def test_trainer_steps_equal_the_one_process_run(strategy, shape, names):
    def program():
        t = train.Trainer(CFG, strategy, sl.make_mesh(shape, names), optimizer=train.AdamW(lr=1e-3))
        state = t.init(transformer.init_params(CFG, seed=3))
        losses = []
        for _ in range(2):
            state, metrics = t.step(state, TOK, TGT)
            losses.append(np.float32(metrics["loss"]) if isinstance(metrics, dict) else np.float32(metrics))
        return [state.params, losses]

    _close(*run_both(program), 1e-6)


def test_pipeline_schedule_equals_the_one_process_run():
    def program():
        mesh = sl.make_mesh((2, 2), ("stage", "data"))
        params = transformer.init_params(PIPE_CFG, seed=1)
        ex = pp.execute(pp.one_f_one_b(2, 4), params, TOK % 32, TGT % 32, PIPE_CFG, mesh)
        return [np.float32(ex.loss), ex.grads]

    _close(*run_both(program), 1e-6)
