"""``shardlab.debug``: sharding pictures, the book's notation, per-device values
(see ``shardlab._src.debug``)."""

from ._src.debug import (  # noqa: F401
    ShardingDiagram, device_values, inspect_array_sharding, notation, sharding_diagram, sharding_table,
    visualize_array_sharding, visualize_sharding,
)

__all__ = ["ShardingDiagram", "device_values", "inspect_array_sharding", "notation", "sharding_diagram", "sharding_table",
           "visualize_array_sharding", "visualize_sharding"]
