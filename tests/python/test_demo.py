"""The README's first command runs shardlab.demo; it must pass its own numpy checks."""

import shardlab.demo


def test_demo_checks_pass_and_prints_the_ledger(capsys):
    assert shardlab.demo.main() == 0
    out = capsys.readouterr().out
    assert "all checks passed" in out
    assert "all_gather" in out and "psum" in out
    assert "T_comms[x]" in out and "bound" in out
