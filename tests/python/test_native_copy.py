"""The core's strided copy (device_put, reading shards back) on random transposes of every
dtype width, against numpy: the tiled transpose path and the element path give numpy's bytes."""

import numpy as np
import pytest

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
