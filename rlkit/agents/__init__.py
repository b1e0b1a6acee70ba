"""Host-side environments and tools of multi-turn (agentic) rollouts: the environment registry and interface
(`envs`), the time-limited tool runner (`runner`), and the built-in environments. Pure-JAX control
environments (the embodied family) live apart, in `rlkit/envs`."""
