"""A paper-faithful JAX/Flax Transformer for machine translation; docs/architecture.md maps it."""
