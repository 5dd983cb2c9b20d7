"""The core's strided copy (device_put, reading shards back) on random transposes of every
dtype width, against numpy: the tiled transpose path and the element path give numpy's bytes."""

import numpy as np
import pytest

import shardlab._core as _core
from shardlab._src.kernels.native import copy


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.uint16, np.int64])
def test_copy_of_random_transposes_matches_numpy(dtype):
    rng = np.random.default_rng(np.dtype(dtype).itemsize)
    for _ in range(40):
        nd = int(rng.integers(2, 5))
        shape = tuple(int(v) for v in rng.integers(1, 40, nd))
        a = (rng.standard_normal(shape) * 100).astype(dtype)
        v = a.transpose(rng.permutation(nd))
        if rng.random() < 0.3:
            v = v[..., ::-1]  # negative strides too
        np.testing.assert_array_equal(copy(v), np.ascontiguousarray(v))


def test_core_concatenate_matches_numpy_on_views_and_names_bad_axes():
    rng = np.random.default_rng(7)
    y = rng.standard_normal((2, 3, 4, 10)).astype(np.float32).transpose(1, 0, 2, 3)
    pieces = [y[..., :3], y[..., 3:], np.broadcast_to(np.arange(5, dtype=np.float32), (3, 2, 4, 5))]
    np.testing.assert_array_equal(_core.concatenate(pieces, 3), np.concatenate(pieces, axis=3))
    with pytest.raises(ValueError, match=r"\[concatenate\] axis 4 is out of range for rank 4"):
        _core.concatenate(pieces, 4)
    with pytest.raises(ValueError, match=r"\[concatenate\] a piece of shape \(2, 2, 4, 10\) does not match the "
                                         r"output \(3, 2, 4, 13\) outside axis 3"):
        _core.concatenate([y[..., :3], y[:2]], 3)
