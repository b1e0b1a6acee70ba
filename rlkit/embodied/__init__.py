"""rlkit.embodied: RL of flow-matching action experts on control environments (rlkit/envs): the flow-policy
likelihoods and ratios (flow_rl.py), and the methods built on them."""
