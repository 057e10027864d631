"""``MultiscaleCell``: the multiscale DEQ (MDEQ) cell (Bai, Koltun & Kolter 2020; JR App. A.3–A.5).

The state is a tuple of ``n`` feature maps, ``z[i]: [B, H/2^i, W/2^i, C_i]`` (a pytree: no hand
flattening). One application ``f_θ(z; x)``:

1. **Residual block per resolution** (MDEQ's ``BasicBlock``), with the input injection ``x``
   added at the highest resolution only::

       h = φ(GN(conv3x3(z_i)))              # C_i -> E·C_i
       h = dropout(h)                        # variational: one mask per forward pass
       h = GN(conv3x3(h) + [i == 0] · x)     # E·C_i -> C_i
       y_i = GN(φ(h + z_i))

2. **Multiscale fusion**: ``s_i = Σ_j F_ij(y_j)`` where ``F_ii`` is the identity; for ``j > i``
   (coarser to finer) a 1×1 conv ``C_j -> C_i`` + GN then nearest upsampling by ``2^(j-i)``; for
   ``j < i`` (finer to coarser) ``i - j`` stride-2 3×3 convs (the first ``i-j-1`` keep ``C_j``
   channels and are followed by GN + φ, the last maps to ``C_i`` and is followed by GN).
3. **Post-fusion**: ``z_i⁺ = GN'(conv1x1(φ(s_i)))`` with ``max(groups // 2, 1)`` groups (MDEQ).

All convolutions have no bias (GroupNorm's offset plays that role) and are weight-normalised when
``weight_norm=True`` (JR Table 4). Defaults follow the JR paper's CIFAR-10 MDEQ (Table 4, App. A.4):
4 resolutions, each half the previous, channels ``(28, 56, 112, 224)``, recurrent dropout 0.25,
weight norm on, all weights ``N(0, 0.01²)``; GroupNorm groups 4 and block expansion 5 follow
MDEQ's CIFAR configuration. ``x`` must be the stem's output at the highest resolution,
``[B, H, W, C_0]`` (the stem and the classification head live outside the cell).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable

import haiku as hk
import jax
import jax.numpy as jnp

from deqjax._src import checks
from deqjax._src.nn import norms, variational_dropout, weight_norm

_DN = ("NHWC", "HWIO", "NHWC")


def _conv(x: jax.Array, w: jax.Array, stride: int) -> jax.Array:
    """``x: [B, H, W, Cin]``, ``w: [k, k, Cin, Cout]``; PyTorch-style symmetric padding ``k//2``."""
    k = w.shape[0]
    pad = ((k // 2, k // 2), (k // 2, k // 2))
    return jax.lax.conv_general_dilated(x, w, (stride, stride), pad, dimension_numbers=_DN)


def _upsample(x: jax.Array, factor: int) -> jax.Array:
    """Nearest-neighbour upsampling of ``[B, H, W, C]`` by ``factor``."""
    return jnp.repeat(jnp.repeat(x, factor, axis=1), factor, axis=2)


class MultiscaleCell(hk.Module):
    """MDEQ cell: per-resolution residual blocks + multiscale fusion (see module docstring).

    Args:
      channels: ``C_i`` per resolution, highest first (its length is the number of resolutions;
        default ``(28, 56, 112, 224)``, JR Table 4 CIFAR-10).
      num_groups: GroupNorm groups (default 4); must divide every ``C_i``. Post-fusion norms use
        ``max(num_groups // 2, 1)``.
      expansion: width factor ``E`` of each block's inner conv (default 5).
      activation: ``φ`` (default ReLU).
      w_init: initializer of every conv kernel (``[k, k, Cin, Cout]``; Haiku or ``dq.initializers``
        family — the square-only ensembles such as GOE need ``k²·Cin == Cout`` and so do not
        apply here); ``None``: ``N(0, 0.01²)`` (JR App. A.4).
      weight_norm: weight-normalise every conv kernel (default True, JR Table 4).
      dropout_rate: variational dropout in each block (default 0.25, JR Table 4 CIFAR-10); one
        mask value per example and channel, shared across positions.
      norm_eps: the GroupNorms' variance epsilon (default 1e-5). GroupNorm makes the cell
        invariant to the scale of most of its inputs, so a large ``norm_eps`` (comparable to the
        features' variance) is the knob that makes the map strongly contractive (tests use it).
      name: module name.

    Raises:
      ValueError: bad ``channels``, ``num_groups`` not dividing every channel count, bad
        ``expansion``, non-callable ``activation``/``w_init``, ``dropout_rate`` outside
        ``[0, 1)``; at call time, ``x`` whose shape does not fit.

    Example:
      >>> cell = dq.nn.MultiscaleCell(channels=(8, 16), num_groups=2)
      >>> z, sol = dq.nn.DEQ(cell)(stem(images))   # z = (z0 [B,32,32,8], z1 [B,16,16,16])
    """

    def __init__(
        self,
        channels: Sequence[int] = (28, 56, 112, 224),
        *,
        num_groups: int = 4,
        expansion: int = 5,
        activation: Callable[[jax.Array], jax.Array] = jax.nn.relu,
        w_init: hk.initializers.Initializer | None = None,
        weight_norm: bool = True,
        dropout_rate: float = 0.25,
        norm_eps: float = 1e-5,
        name: str | None = None,
    ):
        super().__init__(name=name)
        try:
            channels = tuple(channels)
        except TypeError as e:
            raise ValueError(
                f"channels must be a sequence of positive ints, got {channels!r}."
            ) from e
        if not channels:
            raise ValueError(f"channels must be a sequence of positive ints, got {channels!r}.")
        for c in channels:
            checks.check_positive_int(c, "every entry of channels")
        checks.check_positive_int(num_groups, "num_groups")
        post_groups = max(num_groups // 2, 1)
        bad = [c for c in channels if c % num_groups]
        if bad:
            raise ValueError(f"num_groups={num_groups} must divide every channel count; {bad} not.")
        checks.check_positive_int(expansion, "expansion")
        if not callable(activation):
            raise ValueError(f"activation must be callable, got {activation!r}.")
        if w_init is not None and not callable(w_init):
            raise ValueError(f"w_init must be callable or None, got {w_init!r}.")
        self.channels = channels
        self.num_groups = num_groups
        self.post_groups = post_groups
        self.expansion = expansion
        self.activation = activation
        self.w_init = w_init
        self.weight_norm = weight_norm
        self.dropout_rate = variational_dropout.check_rate(dropout_rate, "dropout_rate")
        if not checks.check_real(norm_eps, "norm_eps") > 0:
            raise ValueError(f"norm_eps must be a positive float, got {norm_eps!r}.")
        self.norm_eps = float(norm_eps)

    @property
    def num_resolutions(self) -> int:
        return len(self.channels)

    def _check_x(self, x: jax.Array) -> None:
        n = self.num_resolutions
        if x.ndim != 4:
            raise ValueError(f"x must be [B, H, W, C], got shape {x.shape}.")
        _, h, w, c = x.shape
        if c != self.channels[0]:
            raise ValueError(f"x has {c} channels; channels[0] is {self.channels[0]}.")
        if h % 2 ** (n - 1) or w % 2 ** (n - 1):
            raise ValueError(
                f"x's height and width ({h}, {w}) must be divisible by 2^(n-1) = {2 ** (n - 1)} "
                f"for {n} resolutions."
            )

    def state_shapes(self, x_shape: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """``[(B, H/2^i, W/2^i, C_i)]`` for an input of shape ``[B, H, W, C_0]``."""
        b, h, w, _ = x_shape
        return tuple((b, h // 2**i, w // 2**i, c) for i, c in enumerate(self.channels))

    def initial_state(self, x: jax.Array) -> tuple[jax.Array, ...]:
        """Zeros of every resolution, dtype of ``x`` (used by ``DEQ`` when no ``z0`` is given)."""
        self._check_x(x)
        return tuple(jnp.zeros(s, x.dtype) for s in self.state_shapes(x.shape))

    def __call__(
        self, z: Sequence[jax.Array], x: jax.Array, *, is_training: bool = False
    ) -> tuple[jax.Array, ...]:
        """One application ``f_θ(z; x)``.

        Args:
          z: tuple of ``n`` arrays ``[B, H/2^i, W/2^i, C_i]``.
          x: injection ``[B, H, W, C_0]``.
          is_training: enables dropout (``DEQ`` passes it; direct calls default to eval).

        Returns:
          the new state, same structure as ``z``.
        """
        self._check_x(x)
        n = self.num_resolutions
        if not isinstance(z, (tuple, list)) or len(z) != n:
            raise ValueError(f"z must be a tuple of {n} arrays, got {type(z).__name__}.")
        expected = self.state_shapes(x.shape)
        if tuple(tuple(zi.shape) for zi in z) != expected:
            raise ValueError(f"z shapes {[zi.shape for zi in z]} do not match {list(expected)}.")
        dtype = z[0].dtype
        phi = self.activation
        w_init = self.w_init or hk.initializers.RandomNormal(0.01)

        def conv(name, h, cin, cout, k, stride=1):
            w = weight_norm.get_weight(
                name, [k, k, cin, cout], dtype, w_init=w_init, weight_norm=self.weight_norm
            )
            return _conv(h, w, stride)

        def gn(name, h, groups=self.num_groups):
            return norms.GroupNorm(groups, eps=self.norm_eps, name=name)(h)

        # 1. residual block per resolution.
        ys = []
        for i, (zi, c) in enumerate(zip(z, self.channels)):
            with hk.experimental.name_scope(f"block{i}"):
                h = phi(gn("gn1", conv("conv1", zi, c, self.expansion * c, 3)))  # [B,Hi,Wi,E·Ci]
                h = variational_dropout.VariationalDropout(
                    self.dropout_rate, broadcast_axes=(1, 2), name="dropout"
                )(h, is_training=is_training)
                h = conv("conv2", h, self.expansion * c, c, 3)  # [B, Hi, Wi, Ci]
                if i == 0:
                    h = h + x.astype(dtype)  # input injection at the highest resolution
                h = gn("gn2", h)
                ys.append(gn("gn3", phi(h + zi)))  # [B, Hi, Wi, Ci]

        # 2. fusion and 3. post-fusion.
        out = []
        for i, ci in enumerate(self.channels):
            with hk.experimental.name_scope(f"fuse{i}"):
                s = ys[i]
                for j, cj in enumerate(self.channels):
                    if j > i:  # coarser -> finer: 1x1 conv, GN, upsample
                        u = gn(f"up{j}_gn", conv(f"up{j}_conv", ys[j], cj, ci, 1))
                        s = s + _upsample(u, 2 ** (j - i))
                    elif j < i:  # finer -> coarser: (i - j) strided 3x3 convs
                        d = ys[j]
                        for k in range(i - j):
                            last = k == i - j - 1
                            d = conv(f"down{j}_conv{k}", d, cj, ci if last else cj, 3, stride=2)
                            d = gn(f"down{j}_gn{k}", d)
                            if not last:
                                d = phi(d)
                        s = s + d
                post = conv("post_conv", phi(s), ci, ci, 1)
                out.append(gn("post_gn", post, self.post_groups))  # [B, Hi, Wi, Ci]
        return tuple(out)
