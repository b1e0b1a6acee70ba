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
logged as `entropy`); `loss`, a scalar mean over the slice's rows the update adds to its loss, and `metrics`
{name: scalar mean over the slice's rows} it logs (both weighted by the slice's share of the batch: an MoE
decoder's load-balancing loss and load statistics). A policy without logits says so (`has_logits=False`), and a loss term that reads the
logits argument is refused when the loss is built (`check_terms`), naming the term and the policy.
`probe_logits(params, batch) -> [N, R, V]` is the sampled distribution's logits that predicted-KL control
(`optimizer.kl_target`) measures the update on; a policy without one cannot use KL control.
"""
from __future__ import annotations

import dis
import inspect
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from rlkit.core.errors import ConfigError
from rlkit.core.registry import Registry
from rlkit.core.types import TrainBatch
from rlkit.models.transformer import Transformer
from rlkit.rollout.sampler import SamplingConfig
from rlkit.models.moe import Routing, flip_rate, load_balancing_loss, load_stats
from rlkit.quant.trace import unpack_bits
from rlkit.rollout.scoring import processed_token_logprobs, replayed, response_forward

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
def llm_policy(model: Transformer, cfg, sampling: SamplingConfig, replay_routing=False) -> PolicyAdapter:
  """The Transformer decoder: log-probs of the response tokens under the sampler's processed distribution
  (temperature, top-k, top-p), the raw logits in aux; KL control probes softmax(z / T). `replay_routing`:
  what of the rollout's MoE record to reuse (rlkit/rollout/scoring.py's `replay`). An MoE decoder also reports
  its routing (`moe_stats`) and adds `rl.moe.aux_loss_coef` times its load-balancing loss."""
  aux_coef = float(cfg.get("moe", {}).get("aux_loss_coef", 0.0)) if cfg is not None else 0.0

  def output_of(params, mb: TrainBatch):
    return response_forward(model, params, mb.tokens, mb.attention_mask, mb.response_len,
                            **replayed(mb, replay_routing))

  def forward(params, mb: TrainBatch, keys):
    del keys                                  # deterministic: the sampled tokens fix the log-probs
    logits, out = output_of(params, mb)
    aux = {"logits": logits}
    if out.routed_experts is not None:
      aux.update(moe_stats(out, mb, aux_coef))
    return processed_token_logprobs(logits, mb.response, sampling), aux

  return PolicyAdapter("llm", forward, has_logits=True,
                       probe_logits=lambda params, mb: output_of(params, mb)[0] / sampling.temperature)


def moe_stats(out, mb: TrainBatch, aux_coef: float) -> dict:
  """An MoE forward's aux (module docstring): `loss` = aux_coef x the load-balancing loss over the attended
  tokens, and `metrics` moe/{aux_loss, load_cv, peak_load, cold_fraction} plus moe/flip_rate, the share of
  (token, layer) pairs whose chosen experts differ from the sampler's (`extras["routed_experts"]`, when the
  rollout recorded them; 0 under routing replay), and with FP4 experts (`model.expert_quant`) their code
  mismatch with the rollout's record (`trace_mismatch`). rlkit/models/moe.py defines each."""
  mask = mb.attention_mask[..., None]                    # [N, P+R, 1]: every MoE layer
  lb = load_balancing_loss(Routing(out.routed_experts, out.routed_weights, out.router_probs), mask)
  metrics = {"moe/aux_loss": lb, **{f"moe/{k}": v for k, v in load_stats(out.routed_experts,
                                                                           out.router_probs.shape[-1], mask).items()}}
  if "routed_experts" in mb.extras:
    metrics["moe/flip_rate"] = flip_rate(out.routed_experts, mb.extras["routed_experts"], mask)
  for kind, name in (("codes", "codeword_mismatch"), ("bits", "hint_mismatch")):   # trainer's FP4 vs rollout's
    if out.trace is not None and f"trace_x_{kind}" in mb.extras:
      metrics[f"moe/{name}"] = trace_mismatch(out.trace, mb.extras, mask, kind)
  return {"loss": aux_coef * lb, "metrics": metrics}


def trace_mismatch(train: dict, rollout: dict, mask: Array, kind: str = "codes") -> Array:
  """The fraction of the MoE experts' FP4 values (inputs and down-projection inputs, every FP4 MoE layer,
  attended tokens) whose E2M1 code ("codes": moe/codeword_mismatch) or whose code's LSB ("bits", the record of
  `trace_record='bits'`: moe/hint_mismatch) differs between the trainer's forward and the rollout's record
  (rlkit/quant/trace.py; with TRACE only the disagreements of non-adjacent codes can remain, and no LSB one)."""
  total = count = 0.0
  for point in ("x", "h"):
    ours, theirs = train[f"trace_{point}_{kind}"], rollout[f"trace_{point}_{kind}"]
    if kind == "bits":
      ours, theirs = unpack_bits(ours), unpack_bits(theirs)
    m = mask.reshape(mask.shape + (1,) * (ours.ndim - mask.ndim))
    differ = (ours != theirs) & m
    total, count = total + differ.sum(), count + jnp.broadcast_to(m, ours.shape).sum()
  return total / jnp.maximum(count, 1)


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
