"""float32 math with the exact bits of XLA's CPU kernels, for the samplers of ``random``.

JAX's samplers call ``log``, ``log1p``, ``erf`` and ``erf_inv``; XLA's CPU backend expands each
into a fixed sequence of float32 multiplies and adds (Cephes-style polynomials), and LLVM fuses
each multiply whose only use is an add into one fused multiply-add (one rounding) on a CPU with
FMA (every x86-64 CPU of the last decade). The functions here repeat those sequences operation
by operation, with :func:`fma32` where the kernels fuse, so their float32 results are bit-equal
to ``jax.random`` on such a CPU. numpy's own ``np.log`` differs from XLA's in about 1 value of 5.

Example:
    >>> import numpy as np
    >>> from shardlab._src.ops.random_math import fma32, log1p32
    >>> float(fma32(np.float32(0.1), np.float32(10.0), np.float32(-1.0)))
    1.4901161193847656e-08
    >>> log1p32(np.float32([0.0, 1.0])).tolist()
    [0.0, 0.6931471824645996]
"""

from __future__ import annotations

import numpy as np

f32 = np.float32
_MID_MASK = np.int64((1 << 29) - 1)
_MID = np.int64(1 << 28)


def _c(bits: int) -> np.float32:
    return np.array(bits, dtype=np.uint32).view(np.float32)[()]


def fma32(a, b, c):
    """``a * b + c`` on float32 values rounded once (a fused multiply-add).

    The product of two float32 values is exact in float64; the float64 sum is then rounded to
    float32. Double rounding can only go wrong where the float64 sum lands exactly halfway
    between two float32 values; there (rarely) the sum's exact error term decides.
    """
    p = np.atleast_1d(np.multiply(a, b, dtype=np.float64))
    s = np.add(p, c, dtype=np.float64)
    out = s.astype(f32)
    tie = (s.view(np.int64) & _MID_MASK) == _MID
    if tie.any():
        idx = np.nonzero(tie)
        pt = p[idx]
        ct = np.broadcast_to(np.asarray(c, dtype=np.float64), s.shape)[idx]
        st = s[idx]
        bb = st - pt
        err = (pt - (st - bb)) + (ct - bb)
        fixed = np.where(err != 0, np.nextafter(st, np.where(err > 0, np.inf, -np.inf)), st)
        out[idx] = fixed.astype(f32)
    return out.reshape(np.broadcast_shapes(np.shape(a), np.shape(b), np.shape(c)))


def _split_eval(mask, x, fn_true, fn_false):
    """``where(mask, fn_true(x), fn_false(x))`` evaluating each branch on its elements only."""
    out = np.empty(x.shape, dtype=f32)
    if mask.any():
        out[mask] = fn_true(x[mask])
    inv = ~mask
    if inv.any():
        out[inv] = fn_false(x[inv])
    return out


def _f(x):
    return np.asarray(x, dtype=f32)


# XLA's log (Cephes logf): mantissa in [sqrt(1/2), sqrt(2)) and a degree-9 polynomial.
_LOG_P0 = (_c(0x3D9021BB), _c(0xBDEBD1B8), _c(0x3DEF251A))
_LOG_P1 = (_c(0xBDFE5D4F), _c(0x3E11E9BF), _c(0xBE2AAE50))
_LOG_P2 = (_c(0x3E4CCEAC), _c(0xBE7FFFFC), _c(0x3EAAAAAA))
_LOG_Q1 = _c(0xB95E8083)   # -2.12194440e-4
_LOG_Q2 = _c(0x3F318000)   # 0.693359375
_SQRTHF = _c(0x3F3504F3)
_FLT_MIN = _c(0x00800000)


def log32(v):
    """XLA CPU's float32 ``log`` (bit-exact, FMA as the kernels fuse it)."""
    v = _f(v)
    with np.errstate(all="ignore"):
        v = np.where(np.abs(v) < _FLT_MIN, f32(0), v).astype(f32)  # XLA flushes subnormals to zero
        vc = np.where(v > _FLT_MIN, v, _FLT_MIN).astype(f32)
        bits = vc.view(np.int32)
        e = ((bits >> 23) - 127).astype(f32) + f32(1)
        m = ((bits & np.int32(-2139095041)) | np.int32(0x3F000000)).view(f32)
        lt = m < _SQRTHF
        e = (e - np.where(lt, f32(1), f32(0))).astype(f32)
        x = ((m + f32(-1)) + np.where(lt, m, f32(0))).astype(f32)
        z = (x * x).astype(f32)
        x3 = (z * x).astype(f32)
        p0 = fma32(fma32(x, _LOG_P0[0], _LOG_P0[1]), x, _LOG_P0[2])
        p1 = fma32(fma32(x, _LOG_P1[0], _LOG_P1[1]), x, _LOG_P1[2])
        p2 = fma32(fma32(x, _LOG_P2[0], _LOG_P2[1]), x, _LOG_P2[2])
        y = fma32(p0, x3, p1)
        y = fma32(y, x3, p2)
        y = fma32(y, x3, (e * _LOG_Q1).astype(f32))
        t = fma32(-z, f32(0.5), x)
        s = (t + y).astype(f32)
        r = fma32(e, _LOG_Q2, s)
        r = np.where(v <= 0, f32(np.nan), r)
        r = np.where(np.isnan(v), f32(np.nan), r)
        r = np.where(v == 0, f32(-np.inf), r)
        r = np.where(v == np.inf, f32(np.inf), r)
    return r.astype(f32)


_L1P_P = tuple(_c(h) for h in (0x417101AD, 0x42A6185B, 0x435DC32D, 0x439A8CA3, 0x43586D8A, 0x42707982))
_L1P_Q = tuple(_c(h) for h in (0x3EFF40C5, 0x40D284FA, 0x41EF4B9C, 0x4273CC76, 0x426473AD, 0x41A05101))
_L1P_CUT = _c(0x3ED413CD)  # sqrt(2) - 1


def log1p32(y):
    """XLA CPU's float32 ``log1p``: a rational approximation for |y| < sqrt(2) - 1, else
    ``log(1 + y)``."""
    y = _f(y)
    with np.errstate(all="ignore"):
        return _split_eval(np.abs(y) < _L1P_CUT, y, _log1p_small, lambda v: log32((v + f32(1)).astype(f32)))


def _log1p_small(y):
    y2 = (y * y).astype(f32)
    pa = np.ones_like(y)
    for c in _L1P_P:
        pa = fma32(pa, y, c)
    qb = np.full_like(y, f32(4.527e-05))
    for c in _L1P_Q:
        qb = fma32(qb, y, c)
    r = (qb / pa).astype(f32)
    t = ((y * y2).astype(f32) * r).astype(f32)
    return (y + fma32(y2, f32(-0.5), t)).astype(f32)


_EI_LT = tuple(f32(c) for c in (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                                -0.00125372503, -0.00417768164, 0.246640727, 1.50140941))
_EI_GE = tuple(f32(c) for c in (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                                -0.0076224613, 0.00943887047, 1.00167406, 2.83297682))


def erfinv32(x):
    """XLA CPU's float32 ``erf_inv`` (Giles' single-precision approximation)."""
    x = _f(x)
    with np.errstate(all="ignore"):
        w = (-log1p32((x * -x).astype(f32))).astype(f32)

        def horner(t, coeffs):
            p = np.full_like(t, coeffs[0])
            for c in coeffs[1:]:
                p = fma32(p, t, c)
            return p
        p = _split_eval(w < f32(5), w, lambda v: horner((v - f32(2.5)).astype(f32), _EI_LT),
                        lambda v: horner((np.sqrt(v).astype(f32) + f32(-3)).astype(f32), _EI_GE))
        p = np.where(np.abs(x) == f32(1), f32(np.inf), p).astype(f32)
        return (x * p).astype(f32)


_ERF_CLAMP = _c(0x406F9C68)
_ERF_P = (_c(0x39702D51), _c(0x3B5F5DA2), _c(0x3D50B6EB), _c(0x3E3DA740), _c(0x3F906EBA))
_ERF_Q = (_c(0xB3FD3906), _c(0x37C588DF), _c(0x3A856D28), _c(0x3C6687D4), _c(0x3DE34C21), _c(0x3EFEB44A),
          f32(1.0))


def erf32(x):
    """XLA CPU's float32 ``erf`` (a rational approximation on [-3.74, 3.74], sign(x) beyond)."""
    x = _f(x)
    with np.errstate(all="ignore"):
        big = np.abs(x) >= _ERF_CLAMP
        xc = np.minimum(np.maximum(x, -_ERF_CLAMP), _ERF_CLAMP).astype(f32)
        x2 = (xc * xc).astype(f32)
        p = fma32(x2, _ERF_P[0], _ERF_P[1])
        for c in _ERF_P[2:]:
            p = fma32(p, x2, c)
        num = (xc * p).astype(f32)
        q = fma32(x2, _ERF_Q[0], _ERF_Q[1])
        for c in _ERF_Q[2:]:
            q = fma32(q, x2, c)
        r = (num / q).astype(f32)
        return np.where(big, np.copysign(f32(1), x), r).astype(f32)
