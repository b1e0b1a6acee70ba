"""The phases of one RL iteration, each a small function in its own module (DESIGN.md, "One RL iteration,
as data"):

  collect -> reward -> filter -> augment -> advantages -> score -> update

`rlkit.train.rl_stage` composes them from the stage config; methods plug in by registering components in
the phases' registries (`FILTERS`, `AUGMENTERS`, `ADVANTAGES`, `LOSS_TERMS`, `REWARDS`), not by editing them.
"""
