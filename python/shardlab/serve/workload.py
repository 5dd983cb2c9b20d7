"""Requests for the serving simulator: generated (Poisson arrivals, length distributions,
shared prefixes) or read from a JSONL / CSV trace.

A length distribution is an int (constant), ``("uniform", lo, hi)``, ``("exponential", mean)``,
``("lognormal", median, sigma)`` or ``("choice", [values])``; every draw is clipped to >= 1.

A trace row has ``arrival`` (seconds), ``prompt_len``, ``output_len`` and optionally
``prefix_id`` and ``prefix_len`` (tokens of the prompt shared by every request with that id).
A malformed row is reported with its line number and skipped; the rest of the trace loads
(``Trace.errors``; ``errors="raise"`` raises instead).

Example:
    >>> from shardlab.serve.workload import poisson_requests
    >>> reqs = poisson_requests(1000, rate=50.0, prompt_len=("uniform", 100, 300), output_len=64, seed=0)
    >>> len(reqs), reqs[0].output_len, abs(len(reqs) / reqs[-1].arrival - 50) < 3
    (1000, 64, True)
"""

from __future__ import annotations

import csv
import dataclasses
import json
import pathlib
import warnings

import numpy as np

__all__ = ["Request", "poisson_requests", "load_trace", "save_trace", "Trace"]


@dataclasses.dataclass
class Request:
    """One request: arrival time (s), prompt and output lengths (tokens), an optional shared
    prefix (``prefix_id`` names it, its first ``prefix_len`` prompt tokens are common)."""

    id: int
    arrival: float
    prompt_len: int
    output_len: int
    prefix_id: int | None = None
    prefix_len: int = 0


def _draw(spec, rng, n: int, what: str) -> np.ndarray:
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        out = np.full(n, int(spec))
    elif isinstance(spec, tuple) and spec and spec[0] == "uniform":
        out = rng.integers(int(spec[1]), int(spec[2]) + 1, n)
    elif isinstance(spec, tuple) and spec and spec[0] == "exponential":
        out = np.ceil(rng.exponential(float(spec[1]), n))
    elif isinstance(spec, tuple) and spec and spec[0] == "lognormal":
        out = np.round(float(spec[1]) * np.exp(float(spec[2]) * rng.standard_normal(n)))
    elif isinstance(spec, tuple) and spec and spec[0] == "choice":
        out = rng.choice(np.asarray(spec[1]), n)
    else:
        raise ValueError(f"[poisson_requests] {what} {spec!r} is not a length distribution: use an int, "
                         f"('uniform', lo, hi), ('exponential', mean), ('lognormal', median, sigma) or "
                         f"('choice', [values])")
    return np.maximum(out, 1).astype(np.int64)


def poisson_requests(n: int, rate: float, prompt_len=512, output_len=128, *, shared_prefixes: int = 0,
                     prefix_len: int = 0, prefix_fraction: float = 1.0, seed: int = 0, start: float = 0.0) -> list[Request]:
    """``n`` requests with exponential inter-arrival times of mean 1/``rate``.

    With ``shared_prefixes`` > 0 a ``prefix_fraction`` of the requests start with one of that
    many system prompts (chosen uniformly) of ``prefix_len`` tokens, added to their prompt.
    """
    if n < 0 or not rate > 0:
        raise ValueError(f"[poisson_requests] n {n} must be >= 0 and rate {rate} > 0 requests/s")
    rng = np.random.default_rng(seed)
    t = start + np.cumsum(rng.exponential(1.0 / rate, n))
    p = _draw(prompt_len, rng, n, "prompt_len")
    o = _draw(output_len, rng, n, "output_len")
    pid = np.full(n, -1)
    if shared_prefixes > 0 and prefix_len > 0:
        use = rng.random(n) < prefix_fraction
        pid = np.where(use, rng.integers(0, shared_prefixes, n), -1)
    return [Request(i, float(t[i]), int(p[i]) + (prefix_len if pid[i] >= 0 else 0), int(o[i]),
                    int(pid[i]) if pid[i] >= 0 else None, prefix_len if pid[i] >= 0 else 0) for i in range(n)]


class Trace(list):
    """A list of Requests with ``errors``: ``(line number, message)`` of the rows skipped."""

    errors: list


_FIELDS = ("arrival", "prompt_len", "output_len")


def _row(d: dict, i: int) -> Request:
    missing = [f for f in _FIELDS if d.get(f) in (None, "")]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    arrival = float(d["arrival"])
    p, o = int(float(d["prompt_len"])), int(float(d["output_len"]))
    if not np.isfinite(arrival) or arrival < 0:
        raise ValueError(f"arrival {d['arrival']!r} must be a time >= 0")
    if p < 1 or o < 1:
        raise ValueError(f"prompt_len {p} and output_len {o} must be >= 1")
    pid = d.get("prefix_id")
    plen = int(float(d.get("prefix_len") or 0))
    if plen > p:
        raise ValueError(f"prefix_len {plen} exceeds prompt_len {p}")
    return Request(i, arrival, p, o, None if pid in (None, "") else int(float(pid)), plen)


def load_trace(path, *, errors: str = "warn") -> Trace:
    """Requests of a ``.jsonl`` or ``.csv`` trace, sorted by arrival.

    Args:
        path: the file; the suffix chooses the format.
        errors: "warn" (skip bad rows, warn once naming their lines), "ignore" or "raise".
    """
    path = pathlib.Path(path)
    if errors not in ("warn", "ignore", "raise"):
        raise ValueError(f"[load_trace] errors {errors!r} must be 'warn', 'ignore' or 'raise'")
    out, bad = Trace(), []
    with open(path, newline="") as fh:
        if path.suffix.lower() == ".csv":
            reader = csv.DictReader(fh)
            rows = ((n + 2, r) for n, r in enumerate(reader))          # line 1 is the header
        elif path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
            rows = ((n + 1, line) for n, line in enumerate(fh))
        else:
            raise ValueError(f"[load_trace] {path.name}: use a .jsonl or .csv file")
        for line, raw in rows:
            try:
                if isinstance(raw, str):
                    if not raw.strip():
                        continue
                    raw = json.loads(raw)
                    if not isinstance(raw, dict):
                        raise ValueError("a row must be a JSON object")
                out.append(_row(raw, len(out)))
            except (ValueError, TypeError, json.JSONDecodeError) as e:
                bad.append((line, str(e)))
    out.sort(key=lambda r: r.arrival)
    for i, r in enumerate(out):
        r.id = i
    out.errors = bad
    if bad:
        msg = (f"[load_trace] {path.name}: skipped {len(bad)} malformed row(s): "
               + "; ".join(f"line {n}: {m}" for n, m in bad[:10]) + (" ..." if len(bad) > 10 else ""))
        if errors == "raise":
            raise ValueError(msg)
        if errors == "warn":
            warnings.warn(msg, stacklevel=2)
    return out


def save_trace(requests, path) -> None:
    """Writes requests as JSONL (or CSV when the suffix is .csv)."""
    path = pathlib.Path(path)
    rows = [{"arrival": r.arrival, "prompt_len": r.prompt_len, "output_len": r.output_len,
             "prefix_id": r.prefix_id, "prefix_len": r.prefix_len} for r in requests]
    with open(path, "w", newline="") as fh:
        if path.suffix.lower() == ".csv":
            w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else list(_FIELDS))
            w.writeheader()
            for r in rows:
                w.writerow({k: ("" if v is None else v) for k, v in r.items()})
        else:
            for r in rows:
                fh.write(json.dumps(r) + "\n")
