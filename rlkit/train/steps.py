"""Pure jitted update steps: `sft_step` (next-token NLL) and `rl_step` (a sum of registered loss terms).

Both are built by `make_update_step`: one jitted function `step(state, batch, step_inputs) -> (state,
metrics)` (forward, loss, backward, optimizer) with the train state donated. `step_inputs` is a dict of
float32 scalars traced into the step (loss-term weights, annealed coefficients, calibration scales):
changing a value does not recompile. A batch is split into `micro_batches` equal slices scanned with
`lax.scan`; every slice's loss is normalised by the *full* batch's counts, so the summed gradient equals the
full-batch gradient for every aggregation mode (tests/train/test_steps.py checks 1x8 == 8x1).

Randomness: a stochastic policy's forward (a diffusion policy's sampled timesteps) needs a key. When
`step_inputs["key"]` holds one (a typed PRNG key: traced, so a new key does not recompile), the loss sees it
folded with the optimizer step (fresh noise at every update even under a constant key) and
`step_inputs["row_offset"]`, the micro-batch's first row in the full batch, from which `row_keys` gives each
row its own key, the same one however the batch is micro-batched. Without a key nothing of this is traced.

Non-finite guard: if the loss or the gradient norm is not finite, the update is skipped inside the step
(parameters, optimizer state and step counter unchanged) and `skipped_updates` counts it; the stage stops
after too many in a row (`max_skipped_updates`). A step that predicted-KL control skips (its prediction not
finite) counts there too.

RL loss per token (methods/llm.md §12), the terms from `rlkit.objectives.loss_terms`, for any policy
through its adapter (rlkit/train/policy.py: `forward(params, batch, keys) -> (logp [N, R], aux)`):

  logp = log_softmax(process(logits))[token]      the `llm` adapter; process = the sampler's: temperature,
                                                  top-k, top-p (another policy: its per-step log-likelihoods)
  l    = sum_terms weight_k * term_k(logp, logits, batch)         policy, kl (kl_beta), entropy, ...
  loss = aggregate(l * token_weights, loss_mask, aggregation, full-batch counts)

The PPO ratio is `exp(logp - old_logp)` with both under that processed distribution (the one the tokens
were drawn from); `batch.rollout_logp` (the sampler's own numbers) is what off-policy corrections consume.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from rlkit.core.types import ROW_SOURCES, Metric, TrainBatch
from rlkit.models.transformer import Transformer
from rlkit.objectives import aggregate, token_logprobs
from rlkit.objectives.loss_terms import LOSS_TERMS, scaled_entropy, token_mean
from rlkit.optim.logra import softmax_fisher_quadratic, softmax_kl
from rlkit.optim.optimizers import controls_kl, update_info
from rlkit.optim.trainable import DENSE, GradientPath
from rlkit.rollout.sampler import SamplingConfig
from rlkit.train.policy import POLICIES, PolicyAdapter, check_terms

Array = jax.Array


class Probe(NamedTuple):
  """The policy's (processed) logits [..., V] and the mask of the tokens that count, on a micro-batch: what
  predicted-KL control measures its step on."""
  logits: Callable[[Any, Any], Array]     # (params, micro_batch) -> logits
  mask: Callable[[Any], Array]            # micro_batch -> bool mask over the logits' leading axes


class TrainState(NamedTuple):
  step: Array          # [] int32 optimizer steps taken in this stage
  params: Any
  opt_state: Any       # the optimizer's state over `path.trainable(params)` (all params unless LoRA)


def init_train_state(params: Any, tx: optax.GradientTransformation, path: GradientPath = DENSE) -> TrainState:
  return TrainState(jnp.zeros((), jnp.int32), params, tx.init(path.trainable(params)))


def _split(tree: Any, n: int) -> Any:
  """[B, ...] -> [n, B/n, ...] for every leaf (micro-batches for lax.scan)."""
  def f(x):
    if x.shape[0] % n:
      raise ValueError(f"Batch of {x.shape[0]} rows does not split into {n} equal micro-batches; make the "
                       "batch size a multiple of micro_batches.")
    return x.reshape((n, x.shape[0] // n) + x.shape[1:])
  return jax.tree.map(f, tree)


_IDENTITY = {"mean": 0.0, "sum": 0.0, "max": -jnp.inf, "min": jnp.inf}
_COMBINE = {"mean": jnp.add, "sum": jnp.add, "max": jnp.maximum, "min": jnp.minimum}


def combine_metrics(a: dict, b: dict) -> dict:
  """Two slices' `Metric` dicts combined by each metric's declared reduction."""
  return {k: Metric(_COMBINE[a[k].reduce](a[k].value, b[k].value), a[k].reduce) for k in a}


def _accumulate(loss_fn, params: Any, batch: Any, micro_batches: int, inputs: dict):
  """(loss, grads, metrics) of `loss_fn(params, mb, inputs)` summed over micro-batches; loss_fn normalises
  globally. With a key in `inputs`, each micro-batch's inputs carry its `row_offset`."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if micro_batches == 1:
    (loss, metrics), grads = grad_fn(params, batch, inputs)
    return loss, grads, metrics

  keyed = "key" in inputs
  rows = jax.tree.leaves(batch)[0].shape[0] // micro_batches
  # Without a key the scan carries no offsets (None: no leaves), so its program is what it was without keys.
  offsets = jnp.arange(micro_batches, dtype=jnp.int32) * rows if keyed else None
  with_offset = lambda offset: dict(inputs, row_offset=offset) if keyed else inputs  # noqa: E731

  def body(carry, xs):
    mb, offset = xs
    (loss, metrics), grads = grad_fn(params, mb, with_offset(offset))
    c_loss, c_grads, c_metrics = carry
    return (c_loss + loss, jax.tree.map(jnp.add, c_grads, grads), combine_metrics(c_metrics, metrics)), None

  first = jax.tree.map(lambda x: x[0], _split(batch, micro_batches))
  (loss_s, metric_s), grad_s = jax.eval_shape(grad_fn, params, first, with_offset(offsets[0]) if keyed else inputs)
  zeros = lambda s: jnp.zeros(s.shape, s.dtype)  # noqa: E731
  init = (zeros(loss_s), jax.tree.map(zeros, grad_s),
          {k: Metric(jnp.full(m.value.shape, _IDENTITY[m.reduce], m.value.dtype), m.reduce)
           for k, m in metric_s.items()})
  (loss, grads, metrics), _ = jax.lax.scan(body, init, (_split(batch, micro_batches), offsets))
  return loss, grads, metrics


def row_keys(step_inputs: dict, rows: int) -> Optional[Array]:
  """[rows] keys of a micro-batch's rows (see the module docstring), or None without a key in the inputs."""
  if "key" not in step_inputs:
    return None
  index = step_inputs["row_offset"] + jnp.arange(rows, dtype=jnp.int32)
  return jax.vmap(lambda i: jax.random.fold_in(step_inputs["key"], i))(index)


def jvp_by_vjp(f: Callable, primals: tuple, tangents: tuple) -> tuple[Any, Any]:
  """`jax.jvp(f, primals, tangents)` for an `f` with `custom_vjp` parts (which forward mode cannot enter):
  the VJP of `f`'s (linear) VJP at a zero cotangent, applied to the tangents, is J·t."""
  y, vjp = jax.vjp(f, *primals)
  _, vjp_of_vjp = jax.vjp(vjp, jax.tree.map(jnp.zeros_like, y))
  (dy,) = vjp_of_vjp(tuple(tangents))
  return y, dy


def make_update_step(loss_fn: Callable, tx: optax.GradientTransformation, micro_batches: int,
                     counts: Callable[[Any], dict], path: GradientPath = DENSE, probe: Optional[Probe] = None):
  """`step(state, batch, step_inputs) -> (state, {name: Metric})`, jitted, state donated.

  :param loss_fn: `(params, micro_batch, step_inputs) -> (scalar loss, {name: Metric})`, normalised by the
    full batch's counts, which the step adds to `step_inputs` from `counts(batch)`; a `"key"` in the step
    inputs reaches it folded with the step, beside `"row_offset"` (module docstring).
  :param path: what is differentiated and what the optimizer updates (`rlkit.optim.optimizers.gradient_path`;
    LoRA adapters and LoGRA sketches).
  :param probe: the policy's logits and token mask on a micro-batch, used when the optimizer has predicted-KL
    control (`optimizer.kl_target`; otherwise none of it is computed): its `kl_probe` is the softmax Fisher
    quadratic of the update on the first micro-batch's tokens, i.e. the batch being trained on (no separate
    probe set). The step then also logs `kl/realised`, the exact KL between the policy before and after the
    update on those tokens, beside the prediction for the applied step `kl/applied` (= kl/scale² ·
    kl/predicted).
  """
  tx = optax.with_extra_args_support(tx)

  # The branches see the trainable part only: frozen weights (LoRA's base) passed through a lax.cond come
  # out as copies (the LoRA step held one more base-sized buffer).
  def apply(probe, params, carry, grads, first_mb):
    step, trainable, opt_state = carry
    extra = {}
    if probe is not None:
      logits_fn = lambda t: probe.logits(path.with_trainable(params, t), first_mb)  # noqa: E731
      extra["kl_probe"] = lambda d: softmax_fisher_quadratic(logits_fn, trainable, d, where=probe.mask(first_mb),
                                                             jvp=jvp_by_vjp)
    updates, opt_state = tx.update(grads, opt_state, trainable, **extra)
    info, kl_skipped = update_info(opt_state)
    kl_skipped = jnp.asarray(kl_skipped)
    new_trainable = optax.apply_updates(trainable, updates)
    if probe is not None:
      # What the prediction (kl/applied) is judged against: two more forwards of the probe micro-batch.
      info["kl/realised"] = softmax_kl(logits_fn(trainable), logits_fn(new_trainable), where=probe.mask(first_mb))
    carry = (step + 1 - kl_skipped.astype(jnp.int32), new_trainable, opt_state)
    return carry, ({k: Metric(v) for k, v in info.items()}, kl_skipped)

  def skip(probe, params, carry, grads, first_mb):
    del params, grads, first_mb
    info, _ = update_info(carry[2])
    if probe is not None:
      info["kl/realised"] = jnp.zeros([], jnp.float32)
    return carry, ({k: Metric(v) for k, v in info.items()}, jnp.asarray(False))

  @functools.partial(jax.jit, donate_argnums=0)
  def step(state: TrainState, batch: Any, step_inputs: Optional[dict] = None):
    inputs = dict(step_inputs or {}, **counts(batch))
    if "key" in inputs:
      inputs.update(key=jax.random.fold_in(inputs["key"], state.step), row_offset=jnp.zeros((), jnp.int32))
    if probe is None and controls_kl(state.opt_state):
      raise ValueError("The optimizer has predicted-KL control (optimizer.kl_target > 0), which measures the "
                       "update on the policy's logits, and this step has none to probe (a policy that is not a "
                       "token decoder, or a model that is not a policy); set optimizer.kl_target=0.")
    trainable = path.trainable(state.params)
    args = path.grad_args(trainable, state.opt_state)
    loss_of = lambda a, mb, i: loss_fn(path.model_params(a, state.params, state.opt_state), mb, i)  # noqa: E731
    loss, grads, metrics = _accumulate(loss_of, args, batch, micro_batches, inputs)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    # The probe is used only under KL control, and its micro-batch enters the cond only then (an operand is
    # not dead code).
    kl_probe = probe if probe is not None and controls_kl(state.opt_state) else None
    first_mb = None if kl_probe is None else (
        batch if micro_batches == 1 else jax.tree.map(lambda x: x[0], _split(batch, micro_batches)))
    # lax.cond runs one branch: a skipped update costs no pass over the parameters.
    (count, trainable, opt_state), (info, kl_skipped) = jax.lax.cond(
        finite, functools.partial(apply, kl_probe, state.params), functools.partial(skip, kl_probe, state.params),
        (state.step, trainable, state.opt_state), grads, first_mb)
    state = TrainState(count, path.with_trainable(state.params, trainable), opt_state)
    skipped = jnp.logical_not(finite) | kl_skipped
    return state, {"loss": Metric(loss), **metrics, "grad_norm": Metric(grad_norm), **info,
                   "skipped_updates": Metric(skipped.astype(jnp.int32), "sum")}

  return step


def sum_terms(terms: dict[str, Callable], logp, logits, batch, step_inputs) -> tuple[Array, dict]:
  """`sum_k weight_k * term_k` per token (weights from step_inputs["weight/<name>"]) and the terms' metrics."""
  total, metrics = None, {}
  for name, term in terms.items():
    per_tok, m = term(logp, logits, batch, step_inputs)
    per_tok = step_inputs[f"weight/{name}"] * per_tok
    total = per_tok if total is None else total + per_tok
    metrics.update(m)
  return total, metrics


# ---------------------------------------------------------------------------------------------------- SFT

def make_sft_step(model: Transformer, tx: optax.GradientTransformation, micro_batches: int = 1,
                  path: GradientPath = DENSE):
  """`sft_step(state, batch[, step_inputs]) -> (state, metrics)`; batch: tokens, attention_mask, loss_mask
  [B, T] (loss_mask marks target tokens) and optional token_weights [B, T]. The loss is the `nll` term;
  `path`: `optimizers.gradient_path(optimizer section)`."""
  terms = {"nll": LOSS_TERMS.get("nll")(None)}

  def loss_fn(params, mb, step_inputs):
    logits = model.apply({"params": params}, mb["tokens"], attention_mask=mb["attention_mask"])
    # Position t predicts token t+1. Scoring every position against the tokens shifted left (the last
    # position's target is masked out) avoids slicing the [B, T, V] logits, a full copy in each direction.
    targets = jnp.roll(mb["tokens"], -1, axis=1)
    mask = jnp.pad(mb["loss_mask"][:, 1:], ((0, 0), (0, 1)))
    view = {"targets": targets, "target_mask": mask}
    logp = token_logprobs(logits, targets)
    per_tok, metrics = sum_terms(terms, logp, logits, view, {"weight/nll": 1.0, **step_inputs})
    if "token_weights" in mb:
      per_tok = per_tok * jnp.pad(jax.lax.stop_gradient(mb["token_weights"])[:, 1:], ((0, 0), (0, 1)))
    return aggregate(per_tok, mask, "token-mean", num_tokens_global=step_inputs["num_tokens"]), metrics

  def counts(batch):
    return {"num_tokens": jnp.maximum(jnp.sum(batch["loss_mask"][:, 1:]), 1)}

  probe = Probe(lambda p, mb: model.apply({"params": p}, mb["tokens"], attention_mask=mb["attention_mask"]),
                lambda mb: jnp.pad(mb["loss_mask"][:, 1:], ((0, 0), (0, 1))).astype(bool))
  return make_update_step(loss_fn, tx, micro_batches, counts, path, probe)


# ----------------------------------------------------------------------------------------------------- RL

def rl_counts(batch: TrainBatch) -> dict:
  """Loss-mask counts of the full batch (the normalisers of every aggregation mode)."""
  mask = batch.loss_mask
  return {"num_tokens": jnp.maximum(mask.sum(), 1), "num_seqs": mask.any(axis=-1).sum()}


def term_weights(cfg) -> dict[str, float]:
  """The stage's loss terms and their config weights: policy always, kl if kl_beta > 0, entropy if
  entropy_coef != 0, then `cfg.loss_terms` (extra registered terms)."""
  weights = {"policy": 1.0}
  if cfg.kl_beta > 0:
    weights["kl"] = cfg.kl_beta
  if cfg.entropy_coef:
    weights["entropy"] = cfg.entropy_coef
  return {**weights, **dict(cfg.loss_terms)}


def build_terms(cfg) -> dict[str, Callable]:
  """The stage's loss terms by name (see `term_weights`)."""
  return {name: LOSS_TERMS.get(name)(cfg) for name in term_weights(cfg)}


def default_step_inputs(cfg) -> dict[str, float]:
  """Each term's weight, as the traced scalars `weight/<term>` the step reads."""
  return {f"weight/{k}": jnp.float32(v) for k, v in term_weights(cfg).items()}


def row_weighted(mb: TrainBatch, step_inputs: dict) -> Array:
  """The token weights, times `step_inputs["rows/<source>"]` on the rows of each row source that has one (a
  traced weight per source, e.g. OnePO's annealed teacher weight from `rl.schedules`); as they are without."""
  weights = mb.token_weights
  for source in ROW_SOURCES:
    if f"rows/{source}" in step_inputs:
      scale = jnp.where(mb.row_source == ROW_SOURCES[source], step_inputs[f"rows/{source}"], 1.0)
      weights = weights * scale[:, None]
  return weights


def make_policy_loss(policy: PolicyAdapter, cfg):
  """`loss(params, batch: TrainBatch, step_inputs) -> (scalar, metrics)` of one (micro-)batch of `policy`
  (rlkit/train/policy.py); `cfg` is the RL stage section. A ConfigError if a configured loss term reads logits
  the policy does not have."""
  terms = build_terms(cfg)
  check_terms(policy, terms)
  max_len = cfg.max_new_tokens or None

  def loss_fn(params, mb: TrainBatch, step_inputs):
    if policy.needs_key and "key" not in step_inputs:
      raise ValueError(f"Policy {policy.name!r} draws noise in its forward: pass a PRNG key as "
                       "step_inputs['key'] (e.g. the iteration's key; the step folds the update count in).")
    logp, aux = policy.forward(params, mb, row_keys(step_inputs, mb.num_rows))
    logits = aux.get("logits")
    per_tok, metrics = sum_terms(terms, logp, logits, mb, step_inputs)
    per_tok = per_tok * jax.lax.stop_gradient(row_weighted(mb, step_inputs))
    if "entropy" not in metrics:     # always logged (collapse monitoring); the entropy term reports its own
      if logits is not None:
        metrics["entropy"] = token_mean(scaled_entropy(logits, cfg.temperature), mb.loss_mask, step_inputs)
      elif "entropy" in aux:
        metrics["entropy"] = token_mean(aux["entropy"], mb.loss_mask, step_inputs)
    loss = aggregate(per_tok, mb.loss_mask, cfg.aggregation, num_tokens_global=step_inputs["num_tokens"],
                     num_seqs_global=step_inputs["num_seqs"], max_len=max_len)
    # The policy's own terms (e.g. an MoE's load-balancing loss) and statistics: means over this slice's rows,
    # weighted by its share of the batch's sequences so that micro-batches add up to the batch's mean.
    share = mb.loss_mask.any(axis=-1).sum() / jnp.maximum(step_inputs["num_seqs"], 1)
    loss = loss + share * aux.get("loss", 0.0)
    metrics.update({name: Metric(share * value) for name, value in aux.get("metrics", {}).items()})
    return loss, metrics
  return loss_fn


def make_policy_step(policy: PolicyAdapter, tx: optax.GradientTransformation, cfg, micro_batches: int = 1,
                     path: GradientPath = DENSE):
  """`step(state, batch: TrainBatch, step_inputs) -> (state, metrics)` of `policy`: `make_policy_loss` in
  the shared update step, with the policy's logits as the probe of predicted-KL control if it has them."""
  probe = None if policy.probe_logits is None else Probe(policy.probe_logits, lambda mb: mb.loss_mask)
  return make_update_step(make_policy_loss(policy, cfg), tx, micro_batches, rl_counts, path, probe)


def make_rl_loss(model: Transformer, cfg, sampling: SamplingConfig, replay_routing: bool = False):
  """`make_policy_loss` of the Transformer `model` through the section's policy adapter (`cfg.policy`,
  default `llm`: the decoder's log-probs)."""
  return make_policy_loss(POLICIES.get(cfg.policy)(model, cfg, sampling, replay_routing), cfg)


def make_rl_step(model: Transformer, tx: optax.GradientTransformation, cfg, sampling: SamplingConfig,
                 micro_batches: int = 1, replay_routing: bool = False, path: GradientPath = DENSE):
  """`rl_step(state, batch: TrainBatch, step_inputs) -> (state, metrics)` of the Transformer `model` through
  the section's policy adapter (`cfg.policy`, default `llm`); `cfg` is the RL stage section (policy,
  policy_loss, eps_low/high, dual_clip, aggregation, kl_estimator, kl_beta, entropy_coef, temperature,
  max_new_tokens, loss_terms); pass `default_step_inputs(cfg)` (or annealed values) as step_inputs. `path`: `optimizers.gradient_path(cfg.optimizer)`. Predicted-KL control measures the
  sampler's softmax(z / T)."""
  return make_policy_step(POLICIES.get(cfg.policy)(model, cfg, sampling, replay_routing), tx, cfg,
                          micro_batches, path)
