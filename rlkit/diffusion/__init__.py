"""Online RL for flow-matching generators (methods/embodied.md §1; issue 36): targets with known optima, rewards,
the Flow-GRPO family and DiffusionART."""
