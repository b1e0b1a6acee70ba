"""The phases of one RL iteration, each a small function in its own module (DESIGN.md, "One RL iteration,
as data"):

  collect -> reward -> filter -> augment -> score -> correct -> advantages -> update

(phase 6, the off-policy correction, lives in `rlkit.objectives.correction`; the critic of `gae` in
`rlkit.train.critic`)

`rlkit.train.rl_stage` composes them from the stage config; methods plug in by registering components in
the phases' registries (`FILTERS`, `AUGMENTERS`, `CORRECTIONS`, `ADVANTAGES`, `TOKEN_ESTIMATORS`,
`LOSS_TERMS`, `REWARDS`), not by editing them.
"""
