"""Policy adapters: what the RL update differentiates, for any policy (registry `POLICIES`; ours, the
"policy adapter" of DESIGN.md's RL iteration).

The update step (`rlkit.train.steps.make_policy_step`: loss terms, corrections, aggregation, the non-finite
guard, micro-batching, every optimizer) needs one thing from the policy: the differentiable log-likelihood
of what was sampled, one number per step of each row,

  forward(params, batch: TrainBatch, keys) -> (logp [N, R] float32, aux {name: array})

  token decoder (`llm`)   logp[i, t] = log softmax(process(z_t))[y_t]    z = the logits predicting token t
  flow / diffusion        logp[i, t] = log N(x_{t+1}; mu_theta(x_t, t), sigma_t^2)   one denoising step
  Gaussian action head    logp[i, 0] = log N(a_i; mu_theta(s_i), sigma_theta^2)

so the PPO ratio exp(logp - old_logp), the KL penalty and every correction read the same [N, R] array. `keys`
is None unless the step's inputs carry a PRNG key (`step_inputs["key"]`); then it is [N] typed keys, one per
row, derived from that key, the optimizer step and the row's index in the full batch, so a stochastic forward
(a diffusion policy's sampled timesteps) draws the same noise for a row however the batch is micro-batched.

`aux` holds what other parts read: `logits` [N, R, V] (the token decoder's raw logits: the entropy term, the
distillation divergences and the logged `entropy`), or `entropy` [N, R] (a policy's own per-step entropy,
logged as `entropy`). A policy without logits says so (`has_logits=False`), and a loss term that reads the
logits argument is refused when the loss is built (`check_terms`), naming the term and the policy.
`probe_logits(params, batch) -> [N, R, V]` is the sampled distribution's logits that predicted-KL control
(`optimizer.kl_target`) measures the update on; a policy without one cannot use KL control.
"""
from __future__ import annotations

import dis
import inspect
from typing import Any, Callable, NamedTuple, Optional

import jax

from rlkit.core.errors import ConfigError
from rlkit.core.registry import Registry
from rlkit.core.types import TrainBatch
from rlkit.models.transformer import Transformer
from rlkit.rollout.sampler import SamplingConfig
from rlkit.rollout.scoring import processed_token_logprobs, response_forward

Array = jax.Array


class PolicyAdapter(NamedTuple):
  name: str                                   # the policy's name in error messages (its POLICIES key)
  forward: Callable[[Any, TrainBatch, Optional[Array]], tuple[Array, dict]]   # (params, batch, keys [N])
  has_logits: bool = False                    # aux carries "logits" [N, R, V] (a token decoder)
  probe_logits: Optional[Callable[[Any, TrainBatch], Array]] = None   # for predicted-KL control, or None
  needs_key: bool = False                     # forward draws noise: the step's inputs must carry "key"


# name -> factory(...) -> PolicyAdapter; a factory takes what its policy is built from. The RL stages build
# theirs as factory(model, section, sampling, replay_routing) from `rl.policy`; a stage whose policy is not a
# Transformer builds its own and calls make_policy_step directly.
POLICIES: Registry[Callable[..., PolicyAdapter]] = Registry("policy")


@POLICIES.register("llm")
def llm_policy(model: Transformer, cfg, sampling: SamplingConfig, replay_routing: bool = False) -> PolicyAdapter:
  """The Transformer decoder: log-probs of the response tokens under the sampler's processed distribution
  (temperature, top-k, top-p), the raw logits in aux; KL control probes softmax(z / T). `cfg` (the RL stage
  section) is taken for the factories' common signature: the decoder reads all it needs from `sampling`."""
  del cfg

  def logits_of(params, mb: TrainBatch) -> Array:
    routed = mb.extras.get("routed_experts") if replay_routing else None
    logits, _ = response_forward(model, params, mb.tokens, mb.attention_mask, mb.response_len, routed)
    return logits

  def forward(params, mb: TrainBatch, keys):
    del keys                                  # deterministic: the sampled tokens fix the log-probs
    logits = logits_of(params, mb)
    return processed_token_logprobs(logits, mb.response, sampling), {"logits": logits}

  return PolicyAdapter("llm", forward, has_logits=True,
                       probe_logits=lambda params, mb: logits_of(params, mb) / sampling.temperature)


def reads_argument(fn: Callable, index: int) -> Optional[bool]:
  """Whether `fn`'s code reads its positional parameter `index` (None when `fn` has no Python code to read,
  e.g. a builtin). A term that ignores its logits deletes or never loads them; one that reads them loads the
  name (directly, or into a closure), which is what this looks for in the bytecode."""
  code = getattr(inspect.unwrap(fn), "__code__", None)
  if code is None or code.co_argcount <= index:
    return None
  name = code.co_varnames[index]
  for ins in dis.get_instructions(code):
    # LOAD_FAST and its 3.12+ variants (LOAD_FAST_CHECK, LOAD_FAST_LOAD_FAST: a tuple of names, ...), and the
    # cell loads of a parameter that an inner function captures.
    if ins.opname.startswith("LOAD_FAST") or ins.opname in ("LOAD_DEREF", "LOAD_CLOSURE"):
      if name == ins.argval or (isinstance(ins.argval, tuple) and name in ins.argval):
        return True
  return False


def check_terms(policy: PolicyAdapter, terms: dict[str, Callable]) -> None:
  """ConfigError if a loss term reads the logits (the second argument of `term(logp, logits, batch,
  step_inputs)`) and `policy` has none."""
  if policy.has_logits:
    return
  for name, term in terms.items():
    if reads_argument(term, 1):
      raise ConfigError(
          f"loss term {name!r} reads the policy's logits (a distribution over a vocabulary), which policy "
          f"{policy.name!r} does not have: it is not a token decoder. Drop the term (entropy: rl.entropy_coef=0; "
          "others: rl.loss_terms) or train a token-decoder policy.")
