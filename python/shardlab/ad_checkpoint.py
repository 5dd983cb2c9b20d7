"""``shardlab.ad_checkpoint``, as ``jax.ad_checkpoint``: checkpoint (remat), checkpoint_name and
the policies (see ``shardlab._src.transforms.checkpoint_policies``)."""

from ._src.transforms.checkpoint import checkpoint  # noqa: F401
from ._src.transforms.checkpoint_policies import checkpoint_name, checkpoint_policies  # noqa: F401

remat = checkpoint

__all__ = ["checkpoint", "checkpoint_name", "checkpoint_policies", "remat"]
