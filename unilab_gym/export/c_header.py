"""A dependency-free C99 header that computes a policy's action, for microcontrollers.

The header holds the weights as ``static const float`` arrays (row-major, ``[out][in]``), the
normalization constants as ``static const double`` arrays (the normalization runs in double, as
numpy and the ONNX graph do it, then casts to float), the action bounds, and one function::

    int unilab_policy_step(const float obs[UNILAB_OBS_DIM], float action[UNILAB_ACT_DIM]);

(``UNILAB_OBS_DIM``, ``UNILAB_ACT_DIM``: the policy's widths, 48 and 12 for ``UniLab/Quadruped-v0``, the task's
for another task.) It returns ``UNILAB_OK`` (0) and writes the actions, or an error code and writes nothing
(:data:`~unilab_gym.export.policy.NONFINITE_RULE`, the ONNX graph's NaN rows):

- ``UNILAB_ERR_NONFINITE_OBS`` (1): an observation value is NaN or infinite;
- ``UNILAB_ERR_OVERFLOW`` (2): a layer's output is not finite (a huge finite observation overflowed
  float32; only possible without normalization, which clips).

The finiteness test reads the float's exponent bits (IEEE 754 binary32: all ones means NaN or
infinity), so ``-ffast-math`` cannot remove it. It needs only ``<math.h>`` (``tanhf``, ``expf``; link
with ``-lm``) and ``<stdint.h>``. Include it in one ``.c`` file: the function is defined in the header.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from unilab_gym.export._deps import require_onnx
from unilab_gym.export.policy import PolicyNet, policy_net


def weight_bytes(net: PolicyNet) -> int:
    """Bytes of constant data in ``net``'s header: float32 weights and bounds, float64 normalization constants."""
    floats = net.num_params() + 2 * net.act_dim
    doubles = 2 * net.obs_dim + 1 if net.normalizes else 0
    return 4 * floats + 8 * doubles


def export_c_header(model_or_student: Any, path: str | Path, *, vecnormalize: Any = None) -> Path:
    """Write a C99 header computing the policy's deterministic action (see the module docstring).

    Args:
        model_or_student: a SAC, TD3, DDPG, PPO or A2C model (``MlpPolicy``), a
            :class:`~unilab_gym.export.policy.PolicyNet` (e.g. ``distill(...).student``), or the
            :class:`~unilab_gym.export.distill.DistillResult` itself (its student is written).
        path: the ``.h`` file to write (its folder is created).
        vecnormalize: the model's ``VecNormalize``, the path of its saved statistics, or ``None``;
            must be ``None`` for a ``PolicyNet`` (its normalization is folded in).

    Returns:
        ``path``. ``UNILAB_POLICY_WEIGHT_BYTES`` in the header is :func:`weight_bytes`;
        ``unilab_policy_step`` returns ``UNILAB_OK`` or an error code (see the module docstring).

    Raises:
        ImportError: onnx or onnxruntime is missing (the export extra; the header itself needs neither).
        ValueError: an unsupported model, or ``vecnormalize`` given with a ``PolicyNet``.
    """
    require_onnx()
    net = getattr(model_or_student, "student", model_or_student)
    if isinstance(net, PolicyNet):
        if vecnormalize is not None:
            raise ValueError("a PolicyNet has its normalization folded in already: pass vecnormalize=None")
    else:
        net = policy_net(net, vecnormalize)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header_source(net))
    return path


def header_source(net: PolicyNet) -> str:
    """The text of the C99 header for ``net`` (see :func:`export_c_header`)."""
    data: list[str] = []
    body: list[str] = [
        f"    for (i = 0; i < {net.obs_dim}; ++i) {{\n"
        "        if (unilab_nonfinite(obs[i])) return UNILAB_ERR_NONFINITE_OBS;\n"
        "    }"
    ]
    width = net.obs_dim
    widest = net.obs_dim
    if net.normalizes:
        data += [
            _array("double", "unilab_obs_mean", net.obs_mean.numpy()),
            _array("double", "unilab_obs_std", net.obs_std.numpy()),
            f"static const double unilab_clip_obs = {_literal(net.clip_obs, 'double')};",
        ]
        body.append(
            f"    for (i = 0; i < {net.obs_dim}; ++i) {{\n"
            "        double z = ((double)obs[i] - unilab_obs_mean[i]) / unilab_obs_std[i];\n"
            "        a[i] = (float)unilab_clamp(z, -unilab_clip_obs, unilab_clip_obs);\n"
            "    }"
        )
    else:
        body.append(f"    for (i = 0; i < {net.obs_dim}; ++i) a[i] = obs[i];")
    n_linear = 0
    for layer in net.layers:
        if isinstance(layer, nn.Linear):
            w = layer.weight.detach().numpy()
            b = layer.bias.detach().numpy() if layer.bias is not None else np.zeros(w.shape[0], np.float32)
            data += [_array("float", f"unilab_w{n_linear}", w), _array("float", f"unilab_b{n_linear}", b)]
            body.append(
                f"    if (unilab_dense(&unilab_w{n_linear}[0][0], unilab_b{n_linear}, a, b, "
                f"{w.shape[1]}, {w.shape[0]})) return UNILAB_ERR_OVERFLOW;\n"
                f"    for (i = 0; i < {w.shape[0]}; ++i) a[i] = b[i];"
            )
            n_linear += 1
            width = w.shape[0]
            widest = max(widest, width)
        else:
            body.append(f"    for (i = 0; i < {width}; ++i) a[i] = {_activation(layer, 'a[i]')};")
    data += [
        _array("float", "unilab_action_low", net.action_low.numpy()),
        _array("float", "unilab_action_high", net.action_high.numpy()),
    ]
    if net.squash_output:
        out = "unilab_action_low[i] + 0.5f * (a[i] + 1.0f) * (unilab_action_high[i] - unilab_action_low[i])"
    else:
        out = "(float)unilab_clamp(a[i], unilab_action_low[i], unilab_action_high[i])"
    body.append(f"    for (i = 0; i < {net.act_dim}; ++i) action[i] = {out};\n    return UNILAB_OK;")
    return _TEMPLATE.format(
        params=net.num_params(),
        weight_bytes=weight_bytes(net),
        obs_dim=net.obs_dim,
        act_dim=net.act_dim,
        widest=widest,
        data="\n".join(data),
        body="\n".join(body),
    )


def _activation(layer: nn.Module, x: str) -> str:
    """The C expression of an activation layer applied to ``x`` (the same formulas as the ONNX operators)."""
    if isinstance(layer, nn.ReLU):
        return f"({x} > 0.0f ? {x} : 0.0f)"
    if isinstance(layer, nn.Tanh):
        return f"tanhf({x})"
    if isinstance(layer, nn.ELU):
        return f"({x} > 0.0f ? {x} : {_literal(layer.alpha)} * (expf({x}) - 1.0f))"
    if isinstance(layer, nn.LeakyReLU):
        return f"({x} >= 0.0f ? {x} : {_literal(layer.negative_slope)} * {x})"
    if isinstance(layer, nn.Hardtanh):
        lo, hi = _literal(layer.min_val), _literal(layer.max_val)
        return f"({x} < {lo} ? {lo} : ({x} > {hi} ? {hi} : {x}))"
    raise ValueError(f"no C implementation of {type(layer).__name__}")


def _array(ctype: str, name: str, values: np.ndarray) -> str:
    """A ``static const`` C array definition of ``values`` (1-D or 2-D), exact for its type (9 / 17 digits)."""

    def row(v: np.ndarray) -> str:
        return ", ".join(_literal(float(x), ctype) for x in v)

    if values.ndim == 1:
        inner = "    " + row(values)
    else:
        inner = ",\n".join("    {" + row(r) + "}" for r in values)
    dims = "".join(f"[{n}]" for n in values.shape)
    return f"static const {ctype} {name}{dims} = {{\n{inner}\n}};"


def _literal(x: float, ctype: str = "float") -> str:
    """``x`` as a C literal of ``ctype`` that reads back exactly: 9 significant digits for float, 17 for double."""
    text = f"{x:.9g}" if ctype == "float" else f"{x:.17g}"
    if not any(c in text for c in ".e"):
        text += ".0"
    return text + ("f" if ctype == "float" else "")


_TEMPLATE = """\
/* Generated by unilab_gym.export.export_c_header: a policy of {obs_dim} observations and {act_dim} actions.
 * C99, no dependencies but <math.h> (link with -lm) and <stdint.h>. Define the function in one .c file by
 * including this header.
 * obs: the env's raw {obs_dim} observations (float32); action: {act_dim} actions in the action space's bounds.
 * unilab_policy_step returns UNILAB_OK and writes action, or an error code and leaves action untouched:
 * UNILAB_ERR_NONFINITE_OBS (an observation is NaN or infinite), UNILAB_ERR_OVERFLOW (a layer's output is
 * not finite). Check it: a faulty sensor must not reach the motors as a plausible command.
 * {params} parameters; constant data: {weight_bytes} bytes.
 */
#ifndef UNILAB_POLICY_H
#define UNILAB_POLICY_H

#include <math.h>
#include <stdint.h>

#define UNILAB_OBS_DIM {obs_dim}
#define UNILAB_ACT_DIM {act_dim}
#define UNILAB_POLICY_PARAMS {params}
#define UNILAB_POLICY_WEIGHT_BYTES {weight_bytes}

#define UNILAB_OK 0
#define UNILAB_ERR_NONFINITE_OBS 1
#define UNILAB_ERR_OVERFLOW 2

{data}

static inline double unilab_clamp(double x, double lo, double hi) {{
    return x < lo ? lo : (x > hi ? hi : x);
}}

/* 1 if x is NaN or +-infinity: the IEEE 754 binary32 exponent bits are all ones (immune to -ffast-math) */
static inline int unilab_nonfinite(float x) {{
    union {{ float f; uint32_t u; }} bits;
    bits.f = x;
    return (bits.u & 0x7f800000u) == 0x7f800000u;
}}

/* y[o] = b[o] + sum_i w[o][i] * x[i]; returns 1 if any y[o] is not finite */
static int unilab_dense(const float *w, const float *bias, const float *x, float *y, int n_in, int n_out) {{
    int o, i, bad = 0;
    for (o = 0; o < n_out; ++o) {{
        float acc = bias[o];
        for (i = 0; i < n_in; ++i) acc += w[o * n_in + i] * x[i];
        y[o] = acc;
        bad |= unilab_nonfinite(acc);
    }}
    return bad;
}}

int unilab_policy_step(const float obs[{obs_dim}], float action[{act_dim}]) {{
    float a[{widest}], b[{widest}];
    int i;
{body}
}}

#endif /* UNILAB_POLICY_H */
"""
