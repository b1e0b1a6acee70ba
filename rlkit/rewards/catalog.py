"""Every reward module, imported so that `REWARDS` holds every registered reward: verifiers (verifier.py),
rubric aggregation (rubric.py: HealthBench additive and ProRubric), constraint rewards (calif.py: constraints,
CALIF) and process verifiers (prm.py: TIPS' outcome-only reward, the step-label reward) and trained reward models
(reward_model.py: a head of reward_heads.py / drm.py on a frozen decoder's embedding).

`rlkit.rewards.REWARDS` resolves here; a module that registers its own reward only needs to be imported
before the config is validated (as a config file or a test does)."""
from rlkit.rewards import calif, prm, reward_model, rubric, verifier  # noqa: F401  (register their rewards)
from rlkit.rewards.verifier import REWARDS  # noqa: F401
