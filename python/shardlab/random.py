"""``shardlab.random`` (import as ``jax.random``): JAX's default PRNG (threefry2x32), with the
same bits as JAX 0.10.2 for the same key (see ``shardlab._src.ops.random`` and docs/random.md).

Example:
    >>> import shardlab as sl
    >>> key = sl.random.key(0)
    >>> k1, k2 = sl.random.split(key)
    >>> sl.random.normal(k1, (2, 3)).shape
    (2, 3)
"""

from ._src.ops.prng import KeyTy, PRNGKeyArray  # noqa: F401
from ._src.ops.random import (  # noqa: F401
    PRNGKey, bernoulli, beta, bits, categorical, choice, clone, dirichlet, exponential, fold_in, gamma, gumbel,
    key, key_data, key_dtype, key_impl, laplace, loggamma, logistic, multivariate_normal, normal, orthogonal,
    permutation, poisson, rademacher, randint, split, truncated_normal, uniform, wrap_key_data,
)

__all__ = [
    "PRNGKey", "bernoulli", "beta", "bits", "categorical", "choice", "clone", "dirichlet", "exponential", "fold_in",
    "gamma", "gumbel", "key", "key_data", "key_dtype", "key_impl", "laplace", "loggamma", "logistic",
    "multivariate_normal", "normal", "orthogonal", "permutation", "poisson", "rademacher", "randint", "split",
    "truncated_normal", "uniform", "wrap_key_data",
]
