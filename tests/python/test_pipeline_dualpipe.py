"""DualPipeV (DeepSeek-V3's DualPipe in its V-shaped, cut-in-half form): the schedule built as
dualpipev.py builds it, validated, clocked with overlapped F&B pairs, drawn, executed on real data,
and its bubble against 1F1B, ZB-H1 (the paper's ZB1P) and ZB-V."""

import numpy as np
import pytest

import shardlab as sl
from shardlab.models import transformer
from shardlab.train import pipeline as pp

from pipeline_cases import CFG, TGT, TOK, leaves


@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 8), (4, 13), (8, 16)])
def test_the_schedule_is_valid_and_complete(p, m):
    s = pp.dualpipe_v(p, m)
    pp.validate(s)
    assert s.layout == "v" and s.v == 2
    for d in range(p):
        comp = s.compute(d)
        for c in (0, 1):
            fwd = [a.microbatch for a in comp if a.kind == "forward" and a.chunk == c]
            bwd = [a.microbatch for a in comp if a.kind in ("backward", "backward_input") and a.chunk == c]
            assert fwd == list(range(m)) and bwd == list(range(m))     # every chunk in microbatch order
        inputs = [(a.chunk, a.microbatch) for a in comp if a.kind == "backward_input"]
        weights = [(a.chunk, a.microbatch) for a in comp if a.kind == "backward_weight"]
        assert weights == inputs                                        # deferred weights run oldest first
        # phase 3 and phase 7 split p - 1 - d backwards each; phase 6 splits about half of its 2 (d + 1)
        assert len(inputs) == 2 * (p - 1 - d) + (d + 1)
        # pairs: 2 per main step (m - 2p + d + 1 of them; the last device's first is not overlapped),
        # 1 per phase-5 step (p - 1 - d)
        pairs = s.overlapped[d]
        assert len(pairs) == 2 * (m - 2 * p + d + 1) - (d == p - 1) + (p - 1 - d)
        for i, j in pairs:
            f, b = s.actions[d][i], s.actions[d][j]
            assert f.kind == "forward" and b.kind == "backward" and f.chunk != b.chunk
            assert all(a.kind in ("send", "recv") for a in s.actions[d][i + 1:j])


def test_bad_input():
    with pytest.raises(ValueError, match=r"\[dualpipe_v\] m=5 microbatches for p=3 devices: DualPipeV needs m >= 2p = 6"):
        pp.dualpipe_v(3, 5)
    with pytest.raises(ValueError, match=r"8 pipeline stages \(p \* v\) for 6 layers"):
        pp.dualpipe_v(4, 8, num_layers=6)
    with pytest.raises(ValueError, match=r"overlap=1.5 must be a number in \[0, 1\]"):
        pp.Durations(overlap=1.5)
    s = pp.dualpipe_v(2, 4)
    acts = s.actions[0]
    f = next(k for k, a in enumerate(acts) if a.kind == "forward")
    b = next(k for k, a in enumerate(acts) if a.kind in ("backward", "backward_input"))
    with pytest.raises(ValueError, match=r"stage 0: a compute action sits inside the overlapped pair 'F mb0 s0'"):
        pp.Schedule("x", 2, 4, 2, s.actions, "v", None, (((f, b),), ()))
    with pytest.raises(ValueError, match=rf"stage 0: overlapped pair \({b}, {b + 1}\) must name a forward"):
        pp.Schedule("x", 2, 4, 2, s.actions, "v", None, (((b, b + 1),), ()))


def test_an_overlapped_pair_is_one_max_based_block():
    s = pp.dualpipe_v(4, 8)
    for overlap, pair_time in ((0.0, 1 + 2), (1.0, 2), (0.5, 2.5)):
        t = pp.clock(s, pp.Durations(forward=1, backward=2, weight=1, overlap=overlap))
        for d in range(4):
            ev = t.events[d]
            for i, j in s.overlapped[d]:
                assert (ev[i].start, ev[i].end) == (ev[j].start, ev[j].end)
                assert ev[i].end - ev[i].start == pair_time
            # busy time: every compute once, a pair counted as its block
            singles = sum({"forward": 1, "backward": 2, "backward_input": 1, "backward_weight": 1}[a.kind]
                          for k, a in enumerate(s.actions[d]) if a.payload is None
                          and k not in {x for pr in s.overlapped[d] for x in pr})
            assert t.busy[d] == singles + len(s.overlapped[d]) * pair_time
    html = pp.clock(s)._repr_html_()
    assert "overlapped F&amp;B pair" in html


@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (8, 16), (8, 32)])
def test_bubble_ordering_the_dualpipe_paper_claims(p, m):
    """DeepSeek-V3 (table 2): bubble DualPipe < ZB1P < 1F1B, with PP + 1 activations against ZB1P's PP.
    The same model on p devices: a 1F1B / ZB-H1 stage is a V schedule's two chunks (twice their times)."""
    chunk = dict(forward=1.0, backward=2.0, weight=1.0)
    stage = {k: 2 * v for k, v in chunk.items()}
    one = pp.clock(pp.one_f_one_b(p, m), pp.Durations(**stage))
    zb1p = pp.clock(pp.zb_h1(p, m), pp.Durations(**stage))
    zbv = pp.clock(pp.zb_v(p, m), pp.Durations(**chunk))
    dpv = pp.clock(pp.dualpipe_v(p, m), pp.Durations(**chunk, overlap=1.0))
    dpv0 = pp.clock(pp.dualpipe_v(p, m), pp.Durations(**chunk))
    assert dpv.bubble_fraction < zb1p.bubble_fraction < one.bubble_fraction
    assert dpv.step_time < zb1p.step_time < one.step_time
    assert zbv.bubble_fraction < zb1p.bubble_fraction
    # the gain is the overlap: run back to back, the pairs leave DualPipeV no better than ZB1P
    assert dpv0.bubble_fraction >= zb1p.bubble_fraction - 1e-12
    # memory: 2p + 1 chunk activations on a device (PP + 1 stages' worth), ZB-V and ZB1P hold 2p (PP)
    assert max(dpv.peak_activations) == 2 * p + 1
    assert max(zbv.peak_activations) <= 2 * p and max(zb1p.peak_activations) == p


@pytest.mark.parametrize("shape,names", [((2,), ("stage",)), ((2, 2, 2), ("stage", "data", "model"))])
def test_executed_on_real_data_equals_the_non_pipelined_step(shape, names):
    params = transformer.init_params(CFG, seed=1)
    loss, grads = pp.reference_step(params, TOK, TGT, CFG)
    mesh = sl.make_mesh(shape, names, hardware="tpu-v5e")
    ex = pp.execute(pp.dualpipe_v(2, 4), params, TOK, TGT, CFG, mesh)
    assert abs(ex.loss - loss) <= 1e-5
    for a, b in zip(leaves(ex.grads), leaves(grads)):
        assert np.max(np.abs(a - b)) <= 1e-5
    assert ex.peak_live == pp.clock(ex.schedule).peak_activations == (5, 5)
    # the executed durations mix whole and split backwards; the clock runs them with the pairs
    tl = ex.timeline()
    assert tl.step_time > 0 and tl.source == "executed ledger on tpu-v5e"
    fl = ex.stage_flops()
    assert all(w > 0 for w in fl["backward_weight"]) and all(b > f for b, f in zip(fl["backward"], fl["forward"]))


