"""VART-shaped runtime: runners (ref / sim), the graph runner, custom-op registry and the CLI."""
from .ops import register_op, unregister_op  # noqa: F401
from .runner import GraphRunner, Runner, create_runner  # noqa: F401
