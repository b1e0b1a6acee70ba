"""Weight matmuls of the model, with a backward pass that chooses which operand XLA:CPU transposes.

`weight_matmul(eq, x, w)` is `einsum(eq, x, w)` with float32 accumulation; its value is exactly the
einsum's. Only the backward pass is written out:

  dx = einsum(dy, w)          dw = einsum(x, dy), the smaller of x and dy first copied token-minor

Why: XLA:CPU's matmul kernels take the left operand with its contracting axis minor. The weight gradient
contracts over the token axes, which are major in both `x` and `dy`, so one of them must first be copied
into a transposed layout. Left to autodiff, XLA copied `dy`: for the fused SwiGLU gate/up projection that
is `[tokens, 2F]`, six times the size of `x` `[tokens, D]`, about 20 ms per layer at 2048 tokens. Here the
smaller operand is transposed explicitly, behind an optimization barrier: without it XLA folds the
transpose back into the dot and picks the operand to copy again. With `swiglu`'s backward (transformer.py)
this made the M-size train step 1.06x-1.3x faster (benchmarks/README.md).

Quantized weights (the sampler's hook; `rlkit.quant`, methods/systems.md §1). A sampler copy exported by a
quantizer (`rl.sync.quantizer`) holds some kernels as `QuantizedWeight`s: a pytree of codes and scales that
presents the kernel's shape and a compute dtype. `weight_matmul` hands such a weight its own `matmul`, e.g.
int8 codes c with per-output-channel scales s:

  y = (x . c) * s          (c upcast to x's dtype, exactly; float32 accumulation; s after the contraction)

The model code needs no branch: `astype`, `reshape` and `transpose` of a QuantizedWeight are lazy (the
layout ops the model applies to a kernel before its matmul), and any other consumer (the CPU decode layout's
features-major copies, `rlkit.models.decode_layout`) reads it as an array through `__jax_array__`, i.e.
dequantized to its compute dtype. A new format (FP4) subclasses QuantizedWeight and registers a quantizer;
the training forward never sees one and runs the dense path below unchanged.
"""
from __future__ import annotations

import functools
import math
import string

import jax
import jax.numpy as jnp

Array = jax.Array


def _einsum(eq: str, a: Array, b: Array) -> Array:
  return jnp.einsum(eq, a, b, preferred_element_type=jnp.float32)


class QuantizedWeight:
  """A kernel in a low-precision format (a pytree: subclasses are dataclasses of codes and scales), as the
  sampler's params hold it. Subclasses give `shape`, `dtype` (the compute dtype it presents), `astype`
  (lazy: only the presented dtype changes), `reshape`, `transpose` and `dequantize` (the array it stands for,
  in `dtype`); they override `matmul` to multiply without materialising that array."""

  @property
  def ndim(self) -> int:
    return len(self.shape)

  @property
  def size(self) -> int:
    return math.prod(self.shape)

  @property
  def T(self):  # noqa: N802 (numpy's name)
    return self.transpose()

  def __jax_array__(self) -> Array:
    return self.dequantize()

  def matmul(self, eq: str, x: Array) -> Array:
    """`einsum(eq, x, self)` with float32 accumulation (the fallback: through the dequantized array)."""
    return _einsum(eq, x, self.dequantize())

  def part_specs(self, spec) -> list:
    """PartitionSpecs of this weight's parts (in `jax.tree.leaves` order), given the kernel's own `spec`:
    by default every part takes it (the int8 layout: codes and scales have the kernel's rank)."""
    return [spec for _ in jax.tree.leaves(self)]

  def ragged_matmul(self, x: Array, group_sizes: Array) -> Array:
    """`lax.ragged_dot(x, self, group_sizes)` for stacked expert kernels, float32 accumulation (fallback:
    through the dequantized array)."""
    return jax.lax.ragged_dot(x, self.dequantize().astype(x.dtype), group_sizes,
                              preferred_element_type=jnp.float32)


def weight_matmul(eq: str, x: Array, w) -> Array:
  """`einsum(eq, x, w)` with float32 accumulation (x, w in the compute dtype); `w` may be a
  QuantizedWeight (the sampler's copy: its own `matmul`, no gradient).

  eq is "X,W->Y" where every axis appears in exactly two of the three terms: the token axes in X and Y,
  the contracted axes in X and W, the output features in W and Y (e.g. "btd,dkgh->btkgh").
  """
  if isinstance(w, QuantizedWeight):
    _check(eq)
    return w.matmul(eq, x)
  return _dense_matmul(eq, x, w)


def expert_matmul(x: Array, w, group_sizes: Array) -> Array:
  """The MoE experts' grouped matmul, `lax.ragged_dot(x [N, D], w [E, D, F], group_sizes)` in float32; `w` may
  be a QuantizedWeight (the sampler's copy: its own `ragged_matmul`)."""
  if isinstance(w, QuantizedWeight):
    return w.ragged_matmul(x, group_sizes)
  return jax.lax.ragged_dot(x, w, group_sizes, preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _dense_matmul(eq: str, x: Array, w: Array) -> Array:
  _check(eq)
  return _einsum(eq, x, w)


def _check(eq: str) -> None:
  terms = eq.replace("->", ",").split(",")
  if len(terms) != 3 or any(sum(c in t for t in terms) != 2 for c in "".join(terms)):
    raise ValueError(f"weight_matmul({eq!r}): need 'X,W->Y' with every axis in exactly two terms (token "
                     "axes in X and Y, contracted axes in X and W, features in W and Y).")


def _fwd(eq, x, w):
  return _dense_matmul(eq, x, w), (x, w)


def _bwd(eq, res, dy):
  x, w = res
  (xs, ws), ys = eq.split("->")[0].split(","), eq.split("->")[1]
  dy = dy.astype(x.dtype)
  dx = _einsum(f"{ys},{ws}->{xs}", dy, w)
  # The weight gradient contracts the token axes, with the smaller of x and dy copied so that its token
  # axes are minor. The barrier keeps XLA from folding that transpose back into the dot, where its layout
  # assignment would pick the operand to copy itself (and picked the larger one). dx goes through the
  # same barrier, which was meant to run the weight-gradient matmul after the input-gradient one. It does
  # not: XLA:CPU's runtime orders work by data dependencies, and profiles of the M train step (eighth
  # session) show a layer's two gradient matmuls overlapping, in either order. Together they run faster
  # than either would alone on both cores (benchmarks/README.md).
  # The token axes are merged into one (left as two contracted axes, the step ran 8% slower); the feature
  # axes are not, so that a sharded feature axis (tensor parallelism) stays sharded in the gradient.
  tok = "".join(c for c in xs if c in ys)
  x_in, y_out = "".join(c for c in xs if c in ws), "".join(c for c in ys if c in ws)
  x2, y2 = (jnp.einsum(f"{s}->{tok}{f}", a) for s, f, a in ((xs, x_in, x), (ys, y_out, dy)))
  x2, y2 = (a.reshape((-1,) + a.shape[len(tok):]) for a in (x2, y2))      # [tokens, *features]
  n = next(c for c in string.ascii_letters if c not in eq)                  # the merged token axis
  if x.size <= dy.size:
    dx, xt = jax.lax.optimization_barrier((dx, jnp.moveaxis(x2, 0, -1)))
    dw = _einsum(f"{x_in}{n},{n}{y_out}->{ws}", xt, y2)
  else:
    dx, yt = jax.lax.optimization_barrier((dx, jnp.moveaxis(y2, 0, -1)))
    dw = _einsum(f"{y_out}{n},{n}{x_in}->{ws}", yt, x2)
  return dx.astype(x.dtype), dw.astype(w.dtype)


_dense_matmul.defvjp(_fwd, _bwd)
