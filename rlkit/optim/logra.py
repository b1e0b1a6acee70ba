"""LoGRA: low-rank gradient sketches with row-wise Adam, and predicted-KL step control (optax transforms).

For the LoGRA method (`methods/systems.md` §3). A selected weight W [m, n] never gets a dense gradient: a
zero-valued low-rank term in the layer makes autodiff return the sketch S = G·P [m, r] directly, where G is
the dense gradient and P [n, r] a Rademacher projection (entries ±1/√r, so E[P·Pᵀ] = I) regenerated each
step from a seed, the layer's index and the step. The optimizer keeps row-wise Adam moments of S and
applies the low-rank product D·Pᵀ:

  S_t = G_t·P_t,   v_t = β2·v_{t-1} + (1-β2)·mean_cols(S_t²) ∈ R^m,   m_t = β1·m_{t-1} + (1-β1)·S_t
  D_t = m̂_t / (√v̂_t + ε),   W ← W - η·(D_t·P_tᵀ + λ·W)

(β1 = 0, the default, is the spec's RowAdam: no first moment.) The state per weight is v [m] (and m_t [m, r]
with momentum) instead of Adam's 2·[m, n]; P is never stored. The projected axis is the last: for a Flax
kernel [in, out] the rows are the inputs. Only 2-D leaves are sketched (N-D kernels: reshape or mask out).

Model side (`sketched_matmul`, ours): the layer computes y = x·sg(W) + (x·B)·Pᵀ with B = 0 [m, r], which has
the value x·W; ∂L/∂B = xᵀ·δ·P = G·P. Differentiating the loss w.r.t. B (W closed over, not an argument of
`jax.grad`) yields S without an [m, n] buffer; tests/optim/test_logra.py measures it with
`jit(...).lower(...).compile().memory_analysis()`. `scale_by_logra(sketch_inputs=True)` consumes those
sketches; with `sketch_inputs=False` it sketches dense gradients itself (drop-in use, `optax.MultiSteps`).

Step control (DESIGN, following KLPO): `predicted_kl_control` wraps a whole optimizer, asks the trainer's
`kl_probe(Δ)` for q ≈ ½·Δᵀ·F·Δ on probe tokens (`softmax_fisher_quadratic`), and applies α·Δ with
α = min(α_max, √(KL_target/q)); a non-finite or non-positive q skips the step.
"""
from __future__ import annotations

import zlib
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax
from optax._src import numerics

PROJECTIONS = ("rademacher", "identity")


# ---------------------------------------------------------------------------------------------- projections

def layer_index(path) -> int:
  """A weight's layer index: a 31-bit hash of its pytree path, so it survives `optax.masked`,
  `multi_transform` and `MultiSteps` (which drop or keep other leaves) and matches the model side."""
  return zlib.crc32(jax.tree_util.keystr(path).encode()) & 0x7FFFFFFF


def _projection(seed, path, step, n: int, rank: int, kind: str) -> jax.Array:
  """P [n, r] for one weight at one projection step: regenerated, never stored."""
  if kind == "identity":     # coordinate sketch; at rank == n the transform is dense row-wise Adam
    return jnp.eye(n, rank, dtype=jnp.float32)
  key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), layer_index(path)), step)
  return jax.random.rademacher(key, (n, rank), jnp.float32) / jnp.sqrt(jnp.float32(rank))


def _projection_step(count, refresh_every):
  """Which projection the update after `count` steps uses; refresh_every = 0 keeps the first forever."""
  return jnp.where(refresh_every > 0, count // jnp.maximum(refresh_every, 1), 0)


def _default_mask(tree, rank: int):
  # Decided by ndim and `n >= rank`, which hold for a weight [m, n] and for its sketch [m, r] alike:
  # `multi_transform` and `masked` evaluate a callable mask on the updates, which are sketches in sketch mode.
  return jax.tree.map(lambda p: p.ndim == 2 and p.shape[-1] >= rank, tree)


def layer_projections(params, rank: int, step, *, seed=0, refresh_every=1, mask=None,
                      projection: str = "rademacher"):
  """The projections P [n, r] the optimizer will use at its next update, for the model side.

  `step` is the LoGRA count in the optimizer state (`logra_count(opt_state)`), `mask` the one given to
  `logra` (default: 2-D leaves with n >= rank). Returns a tree like `params` with P at sketched leaves and
  None elsewhere.
  """
  mask = _default_mask(params, rank) if mask is None else (mask(params) if callable(mask) else mask)
  pstep = _projection_step(step, refresh_every)
  return jax.tree_util.tree_map_with_path(
      lambda path, p, sel: _projection(seed, path, pstep, p.shape[-1], rank, projection) if sel else None,
      params, mask)


def sketched_matmul(x: jax.Array, kernel: jax.Array, sketch: jax.Array, projection: jax.Array) -> jax.Array:
  """`x @ kernel` plus a zero low-rank term whose gradient is the sketch of the kernel's gradient.

  y = x·sg(W) + (x·B)·Pᵀ with W = kernel [m, n], B = sketch [m, r] (pass zeros), P = projection [n, r].
  Its value is x·W + x·B·Pᵀ; ∂L/∂B = xᵀ·(δ·P) = G·P, computed from [tokens, r] products. Take `jax.grad`
  w.r.t. `sketch` only, with the kernel closed over: a kernel among the differentiated arguments gets a
  zero [m, n] cotangent buffer even under stop_gradient. A tangent D on B is the JVP of the low-rank
  displacement D·Pᵀ, so the logit JVP of a LoGRA update needs no dense tangent either.

  >>> import jax, jax.numpy as jnp
  >>> from rlkit.optim.logra import sketched_matmul
  >>> x, w = jnp.ones((3, 4)), jnp.ones((4, 6))
  >>> p = jnp.ones((6, 2)) / 2.0
  >>> loss = lambda b: jnp.sum(sketched_matmul(x, w, b, p) ** 2)
  >>> dense = jax.jit(jax.grad(lambda w: jnp.sum((x @ w) ** 2)))(w)
  >>> bool(jnp.allclose(jax.jit(jax.grad(loss))(jnp.zeros((4, 2))), dense @ p))
  True
  """
  dense = x @ jax.lax.stop_gradient(kernel)
  return dense + ((x @ sketch.astype(x.dtype)) @ projection.T.astype(x.dtype)).astype(dense.dtype)


# ---------------------------------------------------------------------------------------------- the transform

class ScaleByLoGRAState(NamedTuple):
  """State of `scale_by_logra`; no projection is stored."""
  count: jax.Array             # int32 []: updates taken; picks the projection (with refresh_every)
  mu: Optional[optax.Updates]  # [m, r] first moment of the sketch per weight; None when b1 == 0
  nu: optax.Updates            # float32 [m]: row-wise second moment, mean over the sketch's r columns


def logra_count(opt_state) -> jax.Array:
  """The count of the (first) `ScaleByLoGRAState` inside a nested optimizer state: the `step` for
  `layer_projections`. A step skipped by `predicted_kl_control` leaves it, and the projection, unchanged."""
  found = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(s, ScaleByLoGRAState))
           if isinstance(s, ScaleByLoGRAState)]
  if not found:
    raise ValueError("logra_count: the optimizer state holds no ScaleByLoGRAState (not a logra optimizer?).")
  return found[0].count


def _check_leaf(path, p, rank):
  if p.ndim != 2 or p.shape[-1] < rank:
    raise ValueError(f"scale_by_logra: {jax.tree_util.keystr(path)} has shape {p.shape}; it sketches 2-D "
                     f"[m, n] weights with n >= rank={rank} only. Mask it out (logra(mask=...), "
                     "optax.masked).")


def scale_by_logra(rank: int, *, seed=0, b1=0.0, b2=0.95, eps=1e-8, refresh_every=1,
                   projection: str = "rademacher", sketch_inputs: bool = False,
                   mu_dtype=None) -> optax.GradientTransformation:
  r"""Row-wise Adam on low-rank gradient sketches, returned as the low-rank product :math:`D P^\top`.

  For every leaf :math:`W \in \mathbb{R}^{m \times n}` (all leaves must be 2-D; mask the rest):

  .. math::
    P_t &= \mathrm{rademacher}(\mathrm{fold\_in}(\mathrm{fold\_in}(\mathrm{key}(s), \ell),
           \lfloor t/T \rfloor)) / \sqrt{r} \in \mathbb{R}^{n \times r} \\
    S_t &= G_t P_t \ \text{(or the incoming sketch)}, \quad
    v_t = \beta_2 v_{t-1} + (1-\beta_2)\tfrac{1}{r}\textstyle\sum_j S_{t,:j}^2, \quad
    m_t = \beta_1 m_{t-1} + (1-\beta_1) S_t \\
    u_t &= \frac{m_t / (1-\beta_1^t)}{\sqrt{v_t/(1-\beta_2^t)} + \epsilon} \, P_t^\top

  with :math:`\ell` = `layer_index(path)` and :math:`T` = `refresh_every`. :math:`u_t` has rank ≤ r and lies
  in the row space of :math:`P_t^\top`. With `b1 = 0` (default) this is RowAdam (methods/systems.md §3).

  .. warning::
    With `b1 > 0` and a projection refreshed every step, the first moment mixes sketches taken in different
    subspaces; use momentum with `refresh_every` large or 0 (fixed projection). In sketch mode the incoming
    updates are [m, r], so `optax.MultiSteps` (whose accumulator has the params' shapes) does not apply:
    accumulate sketches in the step instead. Weight decay and the learning rate come after (see `logra`).

  Args:
    rank: r, the sketch width (a Python int; list it in `static_args` under `optax.inject_hyperparams`).
    seed: seeds every layer's projection.
    b1: first-moment decay (0 = none).
    b2: decay of the row-wise second moment.
    eps: added to the root of the second moment.
    refresh_every: steps between projection refreshes; 0 keeps one projection throughout.
    projection: "rademacher", or "identity" (P = I[:, :r], for tests and the dense limit).
    sketch_inputs: the incoming updates are sketches S [m, r] (from `sketched_matmul`); `params` must then
      be passed to `update` (they give n). Otherwise they are dense gradients [m, n], sketched here.
    mu_dtype: dtype of the first moment (default: the params').

  Returns:
    An `optax.GradientTransformation` with state `ScaleByLoGRAState`.

  References:
    Zhang et al., `LoGRA: Scaling LLM Reinforcement Learning with Low-Rank Gradient Sketches
    <https://arxiv.org/abs/2610.06647>`_, 2026
  """
  if not isinstance(rank, int) or isinstance(rank, bool):
    raise TypeError(f"scale_by_logra: rank must be a Python int, got {type(rank).__name__}.")
  if rank <= 0:
    raise ValueError(f"scale_by_logra: rank must be positive, got {rank}.")
  if projection not in PROJECTIONS:
    raise ValueError(f"scale_by_logra: unknown projection {projection!r}; valid: {', '.join(PROJECTIONS)}.")
  momentum = not (isinstance(b1, (int, float)) and b1 == 0)   # a traced b1 (inject_hyperparams) keeps mu

  def init_fn(params):
    jax.tree_util.tree_map_with_path(lambda path, p: _check_leaf(path, p, rank), params)
    nu = jax.tree.map(lambda p: jnp.zeros(p.shape[:1], jnp.float32), params)
    mu = (jax.tree.map(lambda p: jnp.zeros((p.shape[0], rank), mu_dtype or p.dtype), params)
          if momentum else None)
    return ScaleByLoGRAState(jnp.zeros([], jnp.int32), mu, nu)

  def update_fn(updates, state, params=None):
    if sketch_inputs and params is None:
      raise ValueError("scale_by_logra(sketch_inputs=True): pass params to update (they give each n).")
    count = numerics.safe_increment(state.count)
    t = count.astype(jnp.float32)
    bc1, bc2 = 1 - jnp.asarray(b1, jnp.float32) ** t, 1 - jnp.asarray(b2, jnp.float32) ** t
    pstep = _projection_step(state.count, refresh_every)
    flat, treedef = jax.tree_util.tree_flatten_with_path(updates)
    nus = treedef.flatten_up_to(state.nu)
    mus = treedef.flatten_up_to(state.mu) if momentum else [None] * len(flat)
    ps = treedef.flatten_up_to(params) if params is not None else [None] * len(flat)
    out, new_mu, new_nu = [], [], []
    for (path, g), mu, nu, p in zip(flat, mus, nus, ps):
      n = p.shape[-1] if sketch_inputs else g.shape[-1]
      proj = _projection(seed, path, pstep, n, rank, projection)
      s = g.astype(jnp.float32) if sketch_inputs else g.astype(jnp.float32) @ proj
      if s.shape != (g.shape[0], rank):
        raise ValueError(f"scale_by_logra: sketch of {jax.tree_util.keystr(path)} has shape {s.shape}, "
                         f"expected {(g.shape[0], rank)}.")
      nu = b2 * nu + (1 - b2) * jnp.mean(jnp.square(s), axis=-1)
      if momentum:
        mu = (b1 * mu.astype(jnp.float32) + (1 - b1) * s).astype(mu.dtype)
        s = mu.astype(jnp.float32) / bc1
      d = s / (jnp.sqrt(nu / bc2)[:, None] + eps)
      out.append((d @ proj.T).astype(p.dtype if sketch_inputs else g.dtype))
      new_mu.append(mu)
      new_nu.append(nu.astype(jnp.float32))
    mu = treedef.unflatten(new_mu) if momentum else None
    return treedef.unflatten(out), ScaleByLoGRAState(count, mu, treedef.unflatten(new_nu))

  return optax.GradientTransformation(init_fn, update_fn)


def logra(learning_rate: optax.ScalarOrSchedule, rank: int, *, seed=0, b1=0.0, b2=0.95, eps=1e-8,
          weight_decay=0.0, mask=None, refresh_every=1, projection: str = "rademacher",
          sketch_inputs: bool = False, adamw_b1=0.9, adamw_b2=0.999,
          adamw_eps=1e-8) -> optax.GradientTransformationExtraArgs:
  """LoGRA with decoupled weight decay on the selected matrices, AdamW on every other parameter.

  Selected leaves: `chain(scale_by_logra(...), add_decayed_weights(weight_decay),
  scale_by_learning_rate(learning_rate))`; the rest: `adamw(learning_rate, adamw_b1, adamw_b2, adamw_eps,
  weight_decay)`, through `optax.multi_transform`.

  Args:
    learning_rate: η, a scalar or schedule, shared by both groups.
    rank, seed, b1, b2, eps, refresh_every, projection, sketch_inputs: as in `scale_by_logra`.
    weight_decay: λ, decoupled, on both groups.
    mask: which leaves are sketched: a pytree of bools like params, or a callable. A callable is evaluated
      on the params at init and on the updates at update (as in `optax.masked`), which are [m, r] sketches
      in sketch mode: decide by path or ndim, or pass `mask(params)`. Default: 2-D leaves with n >= rank.
    adamw_b1, adamw_b2, adamw_eps: AdamW's moments for the unselected leaves.

  Under `optax.inject_hyperparams`, list `rank` (and a callable `mask`, which it would take for a schedule)
  in `static_args`.

  Returns:
    An `optax.GradientTransformationExtraArgs`.

  Examples:
    >>> import jax, jax.numpy as jnp, optax
    >>> from rlkit.optim.logra import logra
    >>> params = {"w": jnp.ones((8, 16)), "b": jnp.zeros((16,))}
    >>> opt = logra(learning_rate=1e-2, rank=4)
    >>> state = opt.init(params)
    >>> grads = {"w": jax.random.normal(jax.random.key(0), (8, 16)), "b": jnp.ones((16,))}
    >>> updates, state = jax.jit(opt.update)(grads, state, params)
    >>> params = optax.apply_updates(params, updates)
    >>> int(jnp.linalg.matrix_rank(updates["w"]))  # -η·D·Pᵀ has rank r
    4
    >>> state.inner_states["logra"].inner_state[0].nu["w"].shape  # one second moment per row
    (8,)
  """
  def labels(tree):
    sel = _default_mask(tree, rank) if mask is None else (mask(tree) if callable(mask) else mask)
    return jax.tree.map(lambda s: "logra" if s else "adamw", sel)

  sketched = optax.chain(
      scale_by_logra(rank, seed=seed, b1=b1, b2=b2, eps=eps, refresh_every=refresh_every,
                     projection=projection, sketch_inputs=sketch_inputs),
      optax.add_decayed_weights(weight_decay),
      optax.scale_by_learning_rate(learning_rate))
  dense = optax.adamw(learning_rate, b1=adamw_b1, b2=adamw_b2, eps=adamw_eps, weight_decay=weight_decay)
  return optax.multi_transform({"logra": sketched, "adamw": dense}, labels)


# ---------------------------------------------------------------------------------------------- KL control

def softmax_fisher_quadratic(logits_fn: Callable[[Any], jax.Array], params, delta, *, temperature=1.0,
                             where: Optional[jax.Array] = None, jvp: Callable = jax.jvp) -> jax.Array:
  r"""q = ½·Δᵀ·F·Δ for the policy softmax(z/T) on probe tokens, from one logit JVP.

  .. math:: q = \frac{1}{2T^2} \operatorname{mean}_{\text{tokens}}
            \operatorname{Var}_{p=\mathrm{softmax}(z/T)}(dz), \quad dz = J_z \Delta

  which is the second-order term of KL(p(θ) ‖ p(θ + Δ)). `logits_fn(params)` returns the probe logits
  [..., V]; `where` [...] selects the probe tokens that count (default: all). `jvp`: `jax.jvp`'s signature;
  a model with `custom_vjp` layers (rlkit's transformer) passes one computed by two VJPs.
  """
  delta = optax.tree.cast_like(delta, params)
  z, dz = jvp(logits_fn, (params,), (delta,))
  z, dz = z.astype(jnp.float32) / temperature, dz.astype(jnp.float32) / temperature
  p = jax.nn.softmax(z, axis=-1)
  centred = dz - jnp.sum(p * dz, axis=-1, keepdims=True)
  return 0.5 * jnp.mean(jnp.sum(p * jnp.square(centred), axis=-1), where=where)


def softmax_kl(logits_p: jax.Array, logits_q: jax.Array, *, temperature=1.0,
               where: Optional[jax.Array] = None) -> jax.Array:
  """KL(softmax(z_p/T) ‖ softmax(z_q/T)), the mean over probe tokens (`where`, default all) of the exact
  divergence: the realised KL of a step whose predicted value `softmax_fisher_quadratic` gives."""
  lp = jax.nn.log_softmax(logits_p.astype(jnp.float32) / temperature, axis=-1)
  lq = jax.nn.log_softmax(logits_q.astype(jnp.float32) / temperature, axis=-1)
  return jnp.mean(jnp.sum(jnp.exp(lp) * (lp - lq), axis=-1), where=where)


class PredictedKLState(NamedTuple):
  """State of `predicted_kl_control`."""
  inner_state: optax.OptState   # the wrapped optimizer's state (unchanged by a skipped step)
  skipped: jax.Array            # int32 []: steps skipped because q was not finite or not positive
  scale: jax.Array              # float32 []: α of the last step (0 when skipped)
  predicted_kl: jax.Array       # float32 []: q of the last unscaled Δ; the applied step predicts α²·q


def predicted_kl_control(inner: optax.GradientTransformation, kl_target, *,
                         alpha_max=1.0) -> optax.GradientTransformationExtraArgs:
  r"""Scales the whole displacement of `inner` so the KL it predicts on probe tokens meets a target.

  .. math:: q = \mathtt{kl\_probe}(\Delta) \approx \tfrac12 \Delta^\top F \Delta, \quad
            \alpha = \min\!\big(\alpha_{\max}, \sqrt{\mathrm{KL}_{\mathrm{target}} / q}\big), \quad
            \text{update} = \alpha \Delta

  Δ is `inner`'s update including learning rate and weight decay, hence a wrapper, not a link of the
  chain: when q is not finite or not positive the step is skipped — zero update, `inner`'s state as it
  was, `skipped` + 1 — which a chained link could not do for the state before it. (DESIGN, following
  KLPO's budget; see methods/systems.md §3.)

  Interface: `update(updates, state, params, *, kl_probe, **extra_args)`, where `kl_probe(Δ) -> scalar`
  is built by the trainer inside its jitted step, typically
  `lambda d: softmax_fisher_quadratic(probe_logits_fn, params, d, temperature=T)`; other extra args go to
  `inner`.

  Args:
    inner: the optimizer whose displacement is controlled (e.g. `logra(...)`).
    kl_target: the KL each step should predict (injectable).
    alpha_max: the largest scale; 1 only ever shrinks `inner`'s step.

  Returns:
    An `optax.GradientTransformationExtraArgs` with state `PredictedKLState`.
  """
  inner = optax.with_extra_args_support(inner)

  def init_fn(params):
    return PredictedKLState(inner.init(params), jnp.zeros([], jnp.int32), jnp.zeros([], jnp.float32),
                            jnp.zeros([], jnp.float32))

  def update_fn(updates, state, params=None, *, kl_probe=None, **extra_args):
    if not callable(kl_probe):
      raise TypeError("predicted_kl_control: update needs kl_probe=<callable: displacement -> predicted "
                      "KL quadratic q>, e.g. built with softmax_fisher_quadratic.")
    delta, inner_state = inner.update(updates, state.inner_state, params, **extra_args)
    q = jnp.asarray(kl_probe(delta), jnp.float32)
    ok = jnp.isfinite(q) & (q > 0)
    alpha = jnp.where(ok, jnp.minimum(alpha_max, jnp.sqrt(kl_target / jnp.where(ok, q, 1.0))), 0.0)
    alpha = alpha.astype(jnp.float32)
    delta = jax.tree.map(lambda d: jnp.where(ok, alpha * d, 0).astype(d.dtype), delta)
    inner_state = optax.tree.where(ok, inner_state, state.inner_state)
    return delta, PredictedKLState(inner_state, state.skipped + (~ok).astype(jnp.int32), alpha, q)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
