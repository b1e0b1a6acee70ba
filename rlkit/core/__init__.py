"""Shared vocabulary of rlkit: registries (registry.py), user-facing errors (errors.py), the config sections
components own (sections.py), label ids (labels.py) and the pytree types of one RL step (types.py).

Nothing is imported here, so host-side code that needs only the plain-Python parts (the reward worker process
reads `labels`) does not import JAX."""
