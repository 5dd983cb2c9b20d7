"""shardlab.viz.progress: a bar only for a person watching, the items unchanged either way."""

import io
import sys

import pytest

from shardlab.viz import progress


def test_not_interactive_under_pytest_and_ci(monkeypatch):
    monkeypatch.delenv("SHARDLAB_PROGRESS", raising=False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # a pipe or a log: not a tty
    assert progress.interactive() is False
    monkeypatch.setenv("SHARDLAB_PROGRESS", "1")
    assert progress.interactive() is True
    monkeypatch.setenv("SHARDLAB_PROGRESS", "0")
    assert progress.interactive() is False


def test_ci_turns_it_off_even_on_a_tty(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("SHARDLAB_PROGRESS", raising=False)
    monkeypatch.setattr(sys, "stdout", Tty())
    monkeypatch.delenv("CI", raising=False)
    assert progress.interactive() is True
    monkeypatch.setenv("CI", "true")
    assert progress.interactive() is False


def test_track_yields_every_item_and_stops_early(capsys):
    assert list(progress.track(iter([3, 1, 2]), "x", delay=0.0)) == [3, 1, 2]
    assert capsys.readouterr().out == ""  # silent when not interactive (no tty)
    gen = progress.track(range(10), "x", enabled=True, delay=0.0)
    assert [next(gen), next(gen)] == [0, 1]
    gen.close()  # a consumer that breaks out ends the bar


def test_bar_counts_and_draws_only_when_enabled(monkeypatch):
    drawn = []
    real = progress._progress

    def spy():
        p = real()
        drawn.append(p)
        return p

    monkeypatch.setattr(progress, "_progress", spy)
    with progress.bar("quiet", total=3, enabled=False) as b:
        for _ in range(3):
            b.advance()
    assert b.completed == 3 and drawn == []
    with progress.bar("shown", total=3, enabled=True, delay=0.0) as b:
        for _ in range(3):
            b.advance()
    assert len(drawn) == 1 and drawn[0].tasks[0].completed == 3 and drawn[0].tasks[0].total == 3
    with progress.bar("slow to start", total=3, enabled=True, delay=3600) as b:
        b.advance()
    assert len(drawn) == 1  # short work never shows a bar


def test_bad_total():
    with pytest.raises(ValueError, match=r"\[progress\] total=-1"):
        progress.bar("x", total=-1)
