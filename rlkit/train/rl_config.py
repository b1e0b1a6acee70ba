"""The `rl` stage section: the fields of the RL iteration every RL-like stage kind (rl, distill, graft,
rquest) shares, plus one sub-section per component registered in `rlkit.core.sections.RL_SECTIONS`.

The built-in components register their sections on import (correction, rollout_mismatch, distill, onepo, slca,
srd, multi_turn, critic, sync), so importing this module gives the complete section; a method's own module
registers its section the same way before its config file calls `rl_defaults()`. Every field is commented once
where it is defined (the config printer, `launch.py --print_config`, reads those comments).
"""
from __future__ import annotations

import ml_collections

from rlkit.core.sections import add_sections
from rlkit.optim.optimizers import optimizer_defaults
# The built-in components whose sections every RL stage has, and the overlong reward shaper whose fields it has
# (registered on import):
from rlkit.objectives import correction  # noqa: F401
from rlkit.rollout import mismatch  # noqa: F401
from rlkit.train import async_collect, critic, distill, gar, multi_turn, onepo, overlong, slca, srd, tree_policy, weight_sync  # noqa: F401


def rl_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "rl"                 # stage kind (registry STAGES)
  c.steps = 50                  # RL iterations (sample -> score -> update)
  c.prompts_per_step = 16       # distinct prompts per iteration
  c.group_size = 8              # completions per prompt (G)
  c.max_new_tokens = 8          # response budget; also the Dr. GRPO length constant
  c.task = ml_collections.ConfigDict()   # this stage's own task (and data), overriding the run's `task`
  c.task.name = ""              # "" keeps the run's task; else a task registry name (jsonl: kwargs.path)
  c.task.kwargs = ml_collections.ConfigDict()   # that task's parameters
  c.collector = "single_turn"   # how prompts become trajectories (registry COLLECTORS, phases/collect.py)
  c.policy = "llm"              # what the update differentiates (registry POLICIES, train/policy.py): the
                                # token decoder's log-probs under the sampler's processed distribution
  c.temperature = 1.0           # sampling temperature (the trainer scores at the same temperature)
  c.top_k = 0                   # sampler top-k (0: off)
  c.top_p = 1.0                 # sampler nucleus mass (1: off)
  c.reward = ml_collections.ConfigDict()   # the reward function and how its host-side code runs
  c.reward.name = "verifier"    # reward function (registry REWARDS): verifier | verifier_format | rubric |
                                # constraints | calif | tips_outcome | step_labels | reward_model
                                # (rlkit/rewards/catalog.py)
  c.reward.kwargs = ml_collections.ConfigDict()   # the reward's own parameters
  c.reward.timeout_s = 30.0     # wall-time limit of the host-side verifier on one row (0: none, runs inline)
  c.reward.call_timeout_s = 0.0  # limit of one whole batched verifier call; rows left then fail (0: none)
  c.advantage = "group"         # group | batch | none (Dr. GRPO) | rloo | reinforce_pp | reinforce_pp_baseline |
                                # gae (PPO with a critic: trains rl.critic beside the policy)
  c.adv_eps = 1e-6              # std epsilon of the group/batch advantage
  c.gamma = 1.0                 # discount of the token rewards (gae, reinforce_pp)
  c.gae_lambda = 1.0            # GAE lambda (gae; 1: Monte-Carlo returns minus values)
  c.whiten_advantages = True    # gae: advantages to mean 0 / std 1 over the batch's loss tokens (verl does)
  c.policy_loss = "ppo_clip"    # ppo_clip | gspo | gspo_token | gmpo | cispo | cispo_trl | sapo
  c.policy_kwargs = ml_collections.ConfigDict()   # the policy loss's own parameters (e.g. sapo: tau_pos)
  c.eps_low = 0.2               # lower clip range (ratio >= 1 - eps_low)
  c.eps_high = 0.2              # upper clip range (DAPO clip-higher: eps_high > eps_low)
  c.dual_clip = 0.0             # dual-clip constant for negative advantages (0: off; verl uses 3)
  c.aggregation = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm
  c.kl_beta = 0.0               # weight of the KL penalty to the stage's initial policy (0: no reference)
  c.kl_estimator = "k3"         # k1 | k2 | k3
  c.entropy_coef = 0.0          # entropy bonus weight
  c.loss_terms = ml_collections.ConfigDict()   # extra loss terms (registry LOSS_TERMS): name -> weight
  c.schedules = ml_collections.ConfigDict()   # traced step inputs as functions of the stage step: input name
                                # (weight/<term>, rows/<source>) -> {"kind": constant | linear | cosine |
                                # piecewise, its parameters} (rlkit/optim/schedules.py); no recompiles
  c.ppo_epochs = 1              # passes over each iteration's rollouts
  c.minibatches = 1             # optimizer steps per epoch (rollouts split into this many minibatches)
  c.micro_batches = 1           # gradient accumulation slices per minibatch
  c.filter = "none"             # group filter (registry FILTERS): none | dynamic_sampling (DAPO: drop
                                # zero-variance groups and sample more prompts to refill)
  c.max_sampling_rounds = 4     # cap on extra sampling rounds of a filter that asks for more
  c.augment = "none"            # rows added to each group (registry AUGMENTERS): none | demonstration | onepo
  c.surrogate_rows = ("policy", "teacher", "peer")   # row sources the clipped surrogate trains on
  c.replay_routing = False      # MoE: the trainer reuses the sampler's expert choices (scoring and update)
  c.moe = ml_collections.ConfigDict()   # MoE stability (rlkit/models/moe.py; metrics moe/* every step)
  c.moe.replay_weights = False  # replay the sampler's experts and their combine weights (implies
                                # replay_routing; the router then learns only through the auxiliary loss)
  c.moe.aux_loss_coef = 0.0     # weight of the load-balancing loss (HF/Switch form; k at perfect balance)
  c.moe.trace = False           # model.expert_quant: round the experts' FP4 values as the rollout did (TRACE,
                                # rlkit/quant/trace.py); False: round to nearest (plain QAT)
  c.score_roles = ()            # models (config.models roles) whose log-probs of the responses the loss terms
                                # read, as TrainBatch.extras["<role>_logp"] (e.g. a teacher for distillation)
  c.overlong_cache = 0          # DAPO soft overlong penalty over the last N tokens of the budget (0: off)
  c.overlong_factor = 1.0       # penalty at the full budget
  c.eval_every = 0              # evaluate every N iterations (0: only at the end of the stage)
  c.max_skipped_updates = 10    # stop after this many update steps in a row with a non-finite loss/grad (0: never)
  c.optimizer = optimizer_defaults()
  return add_sections(c)

