"""Float64 NumPy references of the three optimizers with cautious decay.

Written from the papers' update rules, not from tfopt's code: the oracle the
optimizer tests compare against.
"""

import numpy as np

NS_COEFFS = (3.4445, -4.7750, 2.0315)


def cwd_apply(x, step, lr, wd, cautious):
  """x - step - lr * wd * mask * x, mask = 1[step * x >= 0] (or all ones)."""
  mask = (step * x >= 0) if cautious else np.ones_like(x, dtype=bool)
  return x - step - lr * wd * mask * x, mask


class AdamRef:
  """Keras' Adam convention: eps added to sqrt(v) before bias correction."""

  def __init__(self, lr, b1, b2, eps, wd, cautious=True):
    self.lr, self.b1, self.b2, self.eps, self.wd = lr, b1, b2, eps, wd
    self.cautious, self.t, self.m, self.v = cautious, 0, {}, {}

  def adam_step(self, key, g, lr):
    m = self.m.get(key, np.zeros_like(g))
    v = self.v.get(key, np.zeros_like(g))
    m = self.b1 * m + (1 - self.b1) * g
    v = self.b2 * v + (1 - self.b2) * g * g
    self.m[key], self.v[key] = m, v
    t = self.t + 1
    return lr * np.sqrt(1 - self.b2 ** t) / (1 - self.b1 ** t) * m / (
        np.sqrt(v) + self.eps)

  def step(self, xs, gs, lr=None):
    lr = self.lr if lr is None else lr
    out, masks = [], []
    for i, (x, g) in enumerate(zip(xs, gs)):
      new, mask = cwd_apply(x, self.adam_step(i, g, lr), lr, self.wd,
                            self.cautious)
      out.append(new)
      masks.append(mask)
    self.t += 1
    return out, masks


class LionRef:

  def __init__(self, lr, b1, b2, wd, cautious=True):
    self.lr, self.b1, self.b2, self.wd, self.cautious = lr, b1, b2, wd, cautious
    self.m = {}

  def step(self, xs, gs):
    out = []
    for i, (x, g) in enumerate(zip(xs, gs)):
      m = self.m.get(i, np.zeros_like(g))
      u = np.sign(self.b1 * m + (1 - self.b1) * g)
      self.m[i] = self.b2 * m + (1 - self.b2) * g
      out.append(cwd_apply(x, self.lr * u, self.lr, self.wd, self.cautious)[0])
    return out


def newton_schulz_ref(g, steps=5):
  a, b, c = NS_COEFFS
  x = g.T if g.shape[0] > g.shape[1] else g
  x = x / (np.linalg.norm(x) + 1e-7)
  for _ in range(steps):
    gram = x @ x.T
    x = a * x + (b * gram + c * gram @ gram) @ x
  return x.T if g.shape[0] > g.shape[1] else x


class MuonRef:
  """Muon (Nesterov) on the variables given with a matrix shape, Adam else."""

  def __init__(self, lr, mu, wd, adam_wd, b1, b2, eps, scale_mode="rms",
               rms_rate=0.2, adam_lr_ratio=1.0, cautious=True):
    self.lr, self.mu, self.wd, self.cautious = lr, mu, wd, cautious
    self.scale_mode, self.rms_rate = scale_mode, rms_rate
    self.adam = AdamRef(lr * adam_lr_ratio, b1, b2, eps, adam_wd, cautious)
    self.m = {}

  def step(self, xs, gs, matrix_shapes):
    out = []
    for i, (x, g, mshape) in enumerate(zip(xs, gs, matrix_shapes)):
      if mshape is None:
        step = self.adam.adam_step(i, g, self.adam.lr)
        out.append(cwd_apply(x, step, self.lr, self.adam.wd, self.cautious)[0])
        continue
      m = self.mu * self.m.get(i, np.zeros_like(g)) + g
      self.m[i] = m
      rows, cols = mshape
      u = newton_schulz_ref((g + self.mu * m).reshape(rows, cols))
      if self.scale_mode == "rms":
        u = u * self.rms_rate * np.sqrt(max(rows, cols))
      elif self.scale_mode == "keller":
        # As Keller Jordan's Muon writes it for a PyTorch weight (out, in):
        # update *= max(1, W.size(-2) / W.size(-1)) ** 0.5. A Keras kernel
        # is (in, out): its PyTorch twin is the transpose.
        torch_weight = u.T
        u = u * max(1.0, torch_weight.shape[-2] / torch_weight.shape[-1]) ** 0.5
      step = self.lr * u.reshape(x.shape)
      out.append(cwd_apply(x, step, self.lr, self.wd, self.cautious)[0])
    self.adam.t += 1
    return out
