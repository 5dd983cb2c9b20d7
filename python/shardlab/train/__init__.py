"""Training: pipeline-parallel schedules (``shardlab.train.pipeline``).

Example:
    >>> from shardlab.train import pipeline as pp
    >>> round(pp.clock(pp.one_f_one_b(4, 8)).bubble_fraction, 4)
    0.2727
"""

from . import pipeline

__all__ = ["pipeline"]
