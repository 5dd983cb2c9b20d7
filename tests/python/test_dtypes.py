"""shardlab.dtypes against JAX: promotion on every pair (and triple) of the 13 CPU dtypes and the
Python scalars, with x64 off and on; canonicalization; the inexact rule of mean/tanh; errors.

JAX's answers come from jax.numpy.promote_types, jax.numpy.result_type and the dtype (and weak
flag) of ``x + y`` on JAX values, traced with ``jax.eval_shape`` for every pair and executed
for a sample. The lattice itself is checked for the laws a promotion table must obey.
"""

import itertools
import warnings

import numpy as np
import pytest

from shardlab import dtypes

try:
    import jax
    import jax.numpy as jnp
except ImportError:  # JAX is in the test extra; the tests without it still run
    jax = None

needs_jax = pytest.mark.skipif(jax is None, reason="JAX is not installed")

NAMES = [row.name for row in dtypes.TABLE]
PY_TYPES = [bool, int, float]
PY_VALUES = [True, 3, 2.5]


@pytest.fixture(params=[False, True], ids=["x64_off", "x64_on"])
def x64(request):
    """The same x64 mode in JAX and in shardlab for one test, then both restored."""
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", request.param)
    try:
        with dtypes.x64_scope(request.param), warnings.catch_warnings():
            # JAX warns that "int64" etc. are truncated with x64 off; that is the rule tested.
            warnings.filterwarnings("ignore", "Explicitly requested dtype", UserWarning)
            yield request.param
    finally:
        jax.config.update("jax_enable_x64", before)


def _show(x):
    return x.__name__ if isinstance(x, type) else repr(x)


def _mismatches(cases, ours, theirs):
    bad = []
    for case in cases:
        got, want = ours(*case), theirs(*case)
        if got != want:
            bad.append(f"{', '.join(map(_show, case))}: shardlab {got}, JAX {want}")
    return bad


# --- against JAX ---------------------------------------------------------------------------

@pytest.mark.jax
@needs_jax
def test_promote_types_every_pair(x64):
    cases = list(itertools.product(NAMES + PY_TYPES, repeat=2))
    bad = _mismatches(cases, dtypes.promote_types, jnp.promote_types)
    assert not bad, "\n".join(bad)
    assert len(cases) == 256


@pytest.mark.jax
@needs_jax
def test_promote_types_accepts_every_spelling(x64):
    spellings = [lambda n: n, np.dtype, lambda n: np.dtype(n).type]
    cases = [(f(a), g(b)) for a, b in itertools.product(NAMES, repeat=2)
             for f, g in [(spellings[0], spellings[1]), (spellings[2], spellings[0])]]
    bad = _mismatches(cases, dtypes.promote_types, jnp.promote_types)
    assert not bad, "\n".join(bad)


@pytest.mark.jax
@needs_jax
def test_result_type_every_pair_with_weak_flag(x64):
    operands = NAMES + PY_TYPES + PY_VALUES + [None]
    cases = list(itertools.product(operands, repeat=2))

    def ours(a, b):
        return dtypes.result_type(a, b, return_weak_type_flag=True)

    def theirs(a, b):
        return jax.dtypes.result_type(a, b, return_weak_type_flag=True)

    bad = _mismatches(cases, ours, theirs)
    bad += _mismatches(cases, dtypes.result_type, jnp.result_type)
    assert not bad, "\n".join(bad)


@pytest.mark.jax
@needs_jax
def test_result_type_every_triple_and_single(x64):
    operands = NAMES + PY_VALUES
    cases = list(itertools.product(operands, repeat=3)) + [(a,) for a in NAMES + PY_TYPES + PY_VALUES]

    def ours(*args):
        return dtypes.result_type(*args, return_weak_type_flag=True)

    def theirs(*args):
        return jax.dtypes.result_type(*args, return_weak_type_flag=True)

    bad = _mismatches(cases, ours, theirs)
    assert not bad, "\n".join(bad[:20]) + f"\n({len(bad)} in all)"


def _jax_operands():
    """JAX values: a strong 0-d array of each dtype, weak 0-d arrays (a comparison of weak
    values is a weak bool), and Python scalars."""
    weak = [jnp.asarray(3), jnp.asarray(2.5), jnp.asarray(3) > 2]
    assert all(w.weak_type for w in weak)
    return [jnp.zeros((), n) for n in NAMES] + weak + PY_VALUES


def _add_dtype(a, b):
    out = jax.eval_shape(lambda x, y: x + y, a, b)
    return out.dtype, out.weak_type


@pytest.mark.jax
@needs_jax
def test_result_type_is_the_dtype_of_jax_addition(x64):
    # Our side gets the very same values: JAX arrays carry .dtype and .weak_type.
    cases = list(itertools.product(_jax_operands(), repeat=2))
    bad = _mismatches(cases, lambda a, b: dtypes.result_type(a, b, return_weak_type_flag=True),
                      _add_dtype)
    assert not bad, "\n".join(bad)


@pytest.mark.jax
@needs_jax
def test_result_type_of_numpy_arrays_is_the_dtype_jax_computes(x64):
    # numpy arrays of 64-bit types are canonicalized, as jnp.asarray does with them.
    cases = list(itertools.product(NAMES + PY_VALUES, repeat=2))

    def ours(a, b):
        as_np = [np.zeros((), x) if isinstance(x, str) else x for x in (a, b)]
        return dtypes.result_type(*as_np, return_weak_type_flag=True)

    def theirs(a, b):
        return _add_dtype(*[jnp.zeros((), x) if isinstance(x, str) else x for x in (a, b)])

    bad = _mismatches(cases, ours, theirs)
    assert not bad, "\n".join(bad)


@pytest.mark.jax
@needs_jax
def test_traced_dtypes_are_what_jax_computes(x64):
    # eval_shape above traces; a sample run for real gives the same dtype and weak flag.
    ops = _jax_operands()
    sample = [(ops[i], ops[(i * 5 + 3) % len(ops)]) for i in range(0, len(ops), 2)]
    for a, b in sample:
        out = jnp.add(a, b)
        assert (out.dtype, out.weak_type) == _add_dtype(a, b) == dtypes.result_type(
            a, b, return_weak_type_flag=True)


@pytest.mark.jax
@needs_jax
def test_canonicalize_dtype_matches_jax(x64):
    spellings = NAMES + PY_TYPES + [np.dtype(n) for n in NAMES] + [np.dtype(n).type for n in NAMES]
    bad = _mismatches([(s,) for s in spellings], dtypes.canonicalize_dtype,
                      jax.dtypes.canonicalize_dtype)
    assert not bad, "\n".join(bad)
    # ...and it is the dtype JAX gives an array requested with that dtype.
    for name in NAMES:
        assert dtypes.canonicalize_dtype(name) == jnp.zeros((), name).dtype


@pytest.mark.jax
@needs_jax
def test_to_inexact_dtype_is_the_dtype_of_mean_and_tanh(x64):
    for x in [jnp.zeros(2, n) for n in NAMES] + PY_VALUES:
        spec = type(x) if type(x) in PY_TYPES else x.dtype
        want = dtypes.to_inexact_dtype(spec)
        for op in (jnp.tanh, jnp.mean, jnp.var):
            got = jax.eval_shape(op, x).dtype
            assert got == want, f"{op.__name__}({_show(x)}): JAX {got}, shardlab {want}"
    assert jnp.tanh(jnp.zeros(2, "int32")).dtype == dtypes.to_inexact_dtype("int32")  # run for real


@pytest.mark.jax
@needs_jax
def test_default_dtypes_match_jax(x64):
    assert dtypes.default_int_dtype() == jnp.asarray(3).dtype
    assert dtypes.default_float_dtype() == jnp.asarray(2.5).dtype
    assert dtypes.default_uint_dtype() == jnp.sum(jnp.zeros(2, "uint8")).dtype


# --- the lattice's laws (no JAX needed) ----------------------------------------------------

def _jax_quirk(*names):
    """uint64 with a signed integer meets above both at JAX's weak float node, which
    promote_types reports as float64; folded pairwise with a narrower float, that float64
    sticks, while the lattice (and result_type of all three) gives the narrow float."""
    kinds = {dtypes.dtype_info(n).kind for n in names}
    return "uint64" in names and "i" in kinds and bool(set(names) & {"float16", "bfloat16", "float32"})


@pytest.mark.parametrize("x64_mode", [False, True])
def test_promotion_is_a_join_commutative_idempotent_associative(x64_mode):
    types_ = NAMES + [int, float]
    with dtypes.x64_scope(x64_mode):
        for a, b in itertools.product(types_, repeat=2):
            assert dtypes.promote_types(a, b) == dtypes.promote_types(b, a)
        for a in NAMES:
            assert dtypes.promote_types(a, a) == np.dtype(a)
        quirks = 0
        for a, b, c in itertools.product(NAMES, repeat=3):
            left = dtypes.promote_types(dtypes.promote_types(a, b), c)
            right = dtypes.promote_types(a, dtypes.promote_types(b, c))
            assert (left != right) == (_jax_quirk(a, b, c) and dtypes.float64 in (left, right)), (a, b, c)
            quirks += left != right
            # the three-way join does not depend on the grouping
            assert dtypes.result_type(a, b, c) == dtypes.result_type(c, a, b)
        assert quirks == 48


@pytest.mark.parametrize("x64_mode", [False, True])
def test_promotion_never_loses_the_kind_order(x64_mode):
    # bool < integers < floats: with a float the result is a float; integers give integers,
    # except uint64 with a signed integer, which has no integer above both (float64).
    with dtypes.x64_scope(x64_mode):
        for a, b in itertools.product(NAMES, repeat=2):
            out = dtypes.promote_types(a, b)
            kinds = {dtypes.dtype_info(a).kind, dtypes.dtype_info(b).kind}
            if "f" in kinds:
                assert dtypes.dtype_info(out).kind == "f"
            elif kinds == {"b"}:
                assert out == dtypes.bool_
            elif {a, b} & {"uint64"} and "i" in kinds:
                assert out == dtypes.float64
            else:
                assert dtypes.dtype_info(out).kind in "iu"
                assert out.itemsize >= max(np.dtype(a).itemsize, np.dtype(b).itemsize)


def test_x64_changes_only_uint32_with_signed_in_promote_types():
    with dtypes.x64_scope(False):
        off = {(a, b): dtypes.promote_types(a, b) for a, b in itertools.product(NAMES, repeat=2)}
    with dtypes.x64_scope(True):
        on = {(a, b): dtypes.promote_types(a, b) for a, b in itertools.product(NAMES, repeat=2)}
    changed = {k for k in off if off[k] != on[k]}
    assert changed == {("uint32", s) for s in ("int8", "int16", "int32")} | {
        (s, "uint32") for s in ("int8", "int16", "int32")}
    assert {on[k] for k in changed} == {dtypes.int64} and {off[k] for k in changed} == {dtypes.int32}


def test_table_rows_agree_with_numpy():
    assert len(dtypes.TABLE) == 13 and len(set(NAMES)) == 13
    assert dtypes.DTYPES == tuple(np.dtype(n) for n in NAMES)
    for row in dtypes.TABLE:
        assert row.dtype.itemsize == row.itemsize and row.dtype.name == row.name
        assert row.kind == ("f" if row.name == "bfloat16" else row.dtype.kind)
        assert getattr(dtypes, "bool_" if row.name == "bool" else row.name) == row.dtype
        assert all(up in NAMES + [dtypes.WEAK_INT, dtypes.WEAK_FLOAT] for up in row.above)


# --- the x64 switch -------------------------------------------------------------------------

def test_x64_is_off_by_default_and_scopes_restore_it():
    assert dtypes.x64_enabled() is False
    assert dtypes.canonicalize_dtype("uint64") == dtypes.uint32
    with pytest.raises(RuntimeError):
        with dtypes.x64_scope(True):
            assert dtypes.x64_enabled() is True
            assert dtypes.canonicalize_dtype("uint64") == dtypes.uint64
            raise RuntimeError("leave the block early")
    assert dtypes.x64_enabled() is False
    dtypes.set_x64(True)
    try:
        assert dtypes.result_type(1, 1.0) == dtypes.float64
    finally:
        dtypes.set_x64(False)
    assert dtypes.result_type(1, 1.0) == dtypes.float32


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_set_x64_wants_a_bool(bad):
    with pytest.raises(TypeError, match=r"\[set_x64\] enabled must be True or False"):
        dtypes.set_x64(bad)
    assert dtypes.x64_enabled() is False


# --- errors ----------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, shown", [
    ("float128", "'float128'"), ("floot32", "'floot32'"), ("complex64", "'complex64'"),
    (np.dtype(np.complex128), "complex128"), (complex, "complex"), (np.str_, "str_"),
    ("float8_e4m3fn", "'float8_e4m3fn'"), (object, "object"),
])
@pytest.mark.parametrize("fn", [dtypes.canonicalize_dtype, dtypes.to_inexact_dtype,
                                dtypes.dtype_info, lambda d: dtypes.promote_types("int8", d),
                                lambda d: dtypes.result_type("int8", d)])
def test_unknown_dtypes_raise_a_type_error_naming_it_and_listing_ours(fn, bad, shown):
    with pytest.raises(TypeError) as info:
        fn(bad)
    message = str(info.value)
    assert message.startswith("[") and f"dtype {shown} is not supported" in message
    assert all(name in message for name in NAMES)


def test_result_type_errors():
    with pytest.raises(ValueError, match=r"\[result_type\] at least one"):
        dtypes.result_type()
    with pytest.raises(TypeError, match=r"\[result_type\] dtype complex is not supported"):
        dtypes.result_type(1j, "float32")
    with pytest.raises(TypeError, match=r"\[result_type\] cannot tell the dtype of object"):
        dtypes.result_type(object(), "float32")


# --- the names other modules use keep their behaviour ---------------------------------------

def test_canonicalize_is_jaxs_entry_conversion():
    assert dtypes.SUPPORTED == (np.float32, np.float64, dtypes.bfloat16, np.int32, np.int8, np.bool_)
    assert dtypes.canonicalize(np.arange(3, dtype=np.int64), "op").dtype == np.int32
    assert dtypes.canonicalize(np.zeros(2, np.float64), "op").dtype == np.float32
    assert dtypes.canonicalize(np.zeros(2, np.uint8), "op").dtype == np.uint8
    assert dtypes.canonicalize(np.zeros(2, ">f4"), "op").dtype == np.float32
    with pytest.raises(OverflowError, match=r"\[op\] integer values do not fit in int32"):
        dtypes.canonicalize(np.array([2**40]), "op")
    with pytest.raises(TypeError, match=r"\[op\] dtype complex128 is not supported"):
        dtypes.canonicalize(np.zeros(2, complex), "op")
    with dtypes.x64_scope(True):
        assert dtypes.check_dtype("float64", "op") == np.float64
        with pytest.raises(TypeError, match=r"\[op\] dtype int64 is not supported"):
            dtypes.check_dtype("int64", "op")
        kept = np.zeros(2, np.float64)
        assert dtypes.canonicalize(kept, "op") is kept
        assert dtypes.canonicalize(np.array([2**40]), "op").dtype == np.int64
