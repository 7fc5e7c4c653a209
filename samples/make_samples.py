#!/usr/bin/env python3
"""Build the bundled sample gradients in samples/grads/ (numpy only).

A tiny next-token language model is trained for a few Adam steps on synthetic
Zipf-distributed token data; forward and backward are written by hand. The
gradients of three consecutive training steps are written as float32
safetensors files (plus step 0 again as bf16), and a per-tensor summary is
printed and written into samples/grads/README.md.

Model (PyTorch-style names):
  embed.weight            [V, D]      token embedding (row-sparse gradient)
  pos_embed.weight        [T, D]      learned positions
  blocks.{i}.mix.weight   [D, 1, K]   depthwise causal Conv1d (token mixing)
  blocks.{i}.mix.bias     [D]
  blocks.{i}.norm.weight  [D]         LayerNorm before the MLP
  blocks.{i}.norm.bias    [D]
  blocks.{i}.mlp.fc1.weight [H, D], .bias [H]    (ReLU in block 0, GELU in block 1)
  blocks.{i}.mlp.fc2.weight [D, H], .bias [D]
  norm.weight, norm.bias  [D]         final LayerNorm
  head.weight [V, D], head.bias [V]   untied output projection
  loss: mean next-token cross-entropy.

All math runs in float64 (so the result does not depend on BLAS kernels or
thread counts) and is rounded to float32 only when written.

Usage:
  python3 samples/make_samples.py            # write samples/grads/*
  python3 samples/make_samples.py --check    # finite-difference gradient check
  python3 samples/make_samples.py --out DIR  # write elsewhere
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

SEED = 20240607

# Sample configuration (sized so that samples/grads/ stays under 4 MB).
CFG = dict(vocab=1536, dim=64, hidden=256, seq=32, batch=16, kernel=4,
           acts=("relu", "gelu"), zipf=1.1, copy_prob=0.6)
WARMUP_STEPS = 500     # Adam steps before the recorded ones
RECORD_STEPS = 3       # consecutive steps whose gradients are written
LR = 3e-2
BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
LN_EPS = 1e-5


# ----------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------

def param_names(cfg):
    names = ["embed.weight", "pos_embed.weight"]
    for i in range(len(cfg["acts"])):
        p = "blocks.%d." % i
        names += [p + "mix.weight", p + "mix.bias",
                  p + "norm.weight", p + "norm.bias",
                  p + "mlp.fc1.weight", p + "mlp.fc1.bias",
                  p + "mlp.fc2.weight", p + "mlp.fc2.bias"]
    names += ["norm.weight", "norm.bias", "head.weight", "head.bias"]
    return names


def init_params(cfg, rng):
    """PyTorch default initialisations (nn.Embedding N(0,1), nn.Linear and
    nn.Conv1d U(+-1/sqrt(fan_in)), LayerNorm ones/zeros)."""
    V, D, H, T, K = cfg["vocab"], cfg["dim"], cfg["hidden"], cfg["seq"], cfg["kernel"]

    def unif(shape, fan_in):
        b = 1.0 / math.sqrt(fan_in)
        return rng.uniform(-b, b, size=shape)

    P = {}
    P["embed.weight"] = rng.standard_normal((V, D))
    P["pos_embed.weight"] = 0.1 * rng.standard_normal((T, D))
    for i in range(len(cfg["acts"])):
        p = "blocks.%d." % i
        P[p + "mix.weight"] = unif((D, 1, K), K)
        P[p + "mix.bias"] = unif((D,), K)
        P[p + "norm.weight"] = np.ones(D)
        P[p + "norm.bias"] = np.zeros(D)
        P[p + "mlp.fc1.weight"] = unif((H, D), D)
        P[p + "mlp.fc1.bias"] = unif((H,), D)
        P[p + "mlp.fc2.weight"] = unif((D, H), H)
        P[p + "mlp.fc2.bias"] = unif((D,), H)
    P["norm.weight"] = np.ones(D)
    P["norm.bias"] = np.zeros(D)
    P["head.weight"] = unif((V, D), D)
    P["head.bias"] = unif((V,), D)
    assert list(P) == param_names(cfg)
    return P


GELU_C = math.sqrt(2.0 / math.pi)


def act_fwd(kind, z):
    if kind == "relu":
        return np.maximum(z, 0.0)
    u = GELU_C * (z + 0.044715 * z ** 3)
    return 0.5 * z * (1.0 + np.tanh(u))


def act_bwd(kind, z, da):
    if kind == "relu":
        return da * (z > 0)
    u = GELU_C * (z + 0.044715 * z ** 3)
    th = np.tanh(u)
    d = 0.5 * (1.0 + th) + 0.5 * z * (1.0 - th * th) * GELU_C * (1.0 + 3 * 0.044715 * z * z)
    return da * d


def ln_fwd(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + LN_EPS)
    xhat = (x - mu) * rstd
    return xhat * g + b, (xhat, rstd)


def ln_bwd(dy, g, cache):
    xhat, rstd = cache
    red = tuple(range(dy.ndim - 1))
    dg = (dy * xhat).sum(red)
    db = dy.sum(red)
    dxhat = dy * g
    dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, dg, db


def conv_fwd(h, w, b):
    """Depthwise causal Conv1d: y[:, t, c] = b[c] + sum_k w[c,0,k] h[:, t-K+1+k, c]."""
    B, T, D = h.shape
    K = w.shape[2]
    hp = np.concatenate([np.zeros((B, K - 1, D)), h], axis=1)
    y = np.broadcast_to(b, (B, T, D)).copy()
    for k in range(K):
        y += hp[:, k:k + T, :] * w[:, 0, k]
    return y, hp


def conv_bwd(dy, w, hp):
    B, T, D = dy.shape
    K = w.shape[2]
    dw = np.zeros_like(w)
    dhp = np.zeros_like(hp)
    for k in range(K):
        dw[:, 0, k] = (dy * hp[:, k:k + T, :]).sum((0, 1))
        dhp[:, k:k + T, :] += dy * w[:, 0, k]
    return dhp[:, K - 1:, :], dw, dy.sum((0, 1))


def loss_and_grads(P, cfg, tokens):
    """tokens: int array [B, T+1]. Returns (mean CE loss, dict of gradients)."""
    inp, tgt = tokens[:, :-1], tokens[:, 1:]
    B, T = inp.shape
    acts = cfg["acts"]

    # forward
    h = P["embed.weight"][inp] + P["pos_embed.weight"][None, :T]
    caches = []
    for i, kind in enumerate(acts):
        p = "blocks.%d." % i
        m, hp = conv_fwd(h, P[p + "mix.weight"], P[p + "mix.bias"])
        h = h + m
        n, lnc = ln_fwd(h, P[p + "norm.weight"], P[p + "norm.bias"])
        z1 = n @ P[p + "mlp.fc1.weight"].T + P[p + "mlp.fc1.bias"]
        a = act_fwd(kind, z1)
        z2 = a @ P[p + "mlp.fc2.weight"].T + P[p + "mlp.fc2.bias"]
        h = h + z2
        caches.append((hp, lnc, n, z1, a))
    nf, lnfc = ln_fwd(h, P["norm.weight"], P["norm.bias"])
    logits = nf @ P["head.weight"].T + P["head.bias"]
    logits = logits - logits.max(-1, keepdims=True)
    ex = np.exp(logits)
    probs = ex / ex.sum(-1, keepdims=True)
    N = B * T
    bi, ti = np.meshgrid(np.arange(B), np.arange(T), indexing="ij")
    loss = -np.log(probs[bi, ti, tgt]).mean()

    # backward
    G = {}
    dlog = probs
    dlog[bi, ti, tgt] -= 1.0
    dlog /= N
    G["head.weight"] = dlog.reshape(N, -1).T @ nf.reshape(N, -1)
    G["head.bias"] = dlog.sum((0, 1))
    dnf = dlog @ P["head.weight"]
    dh, G["norm.weight"], G["norm.bias"] = ln_bwd(dnf, P["norm.weight"], lnfc)
    for i in reversed(range(len(acts))):
        p = "blocks.%d." % i
        hp, lnc, n, z1, a = caches[i]
        dz2 = dh
        H = a.shape[-1]
        G[p + "mlp.fc2.weight"] = dz2.reshape(N, -1).T @ a.reshape(N, H)
        G[p + "mlp.fc2.bias"] = dz2.sum((0, 1))
        da = dz2 @ P[p + "mlp.fc2.weight"]
        dz1 = act_bwd(acts[i], z1, da)
        G[p + "mlp.fc1.weight"] = dz1.reshape(N, H).T @ n.reshape(N, -1)
        G[p + "mlp.fc1.bias"] = dz1.sum((0, 1))
        dn = dz1 @ P[p + "mlp.fc1.weight"]
        dx, G[p + "norm.weight"], G[p + "norm.bias"] = ln_bwd(dn, P[p + "norm.weight"], lnc)
        dh = dh + dx
        dx, G[p + "mix.weight"], G[p + "mix.bias"] = conv_bwd(dh, P[p + "mix.weight"], hp)
        dh = dh + dx
    dE = np.zeros_like(P["embed.weight"])
    np.add.at(dE, inp.reshape(-1), dh.reshape(N, -1))
    G["embed.weight"] = dE
    dP = np.zeros_like(P["pos_embed.weight"])
    dP[:T] = dh.sum(0)
    G["pos_embed.weight"] = dP
    return loss, {k: G[k] for k in P}


# ----------------------------------------------------------------------------
# Data: Zipf-distributed tokens with a learnable bigram structure
# ----------------------------------------------------------------------------

class Data:
    def __init__(self, cfg, rng):
        V = cfg["vocab"]
        ranks = np.arange(1, V + 1, dtype=np.float64)
        p = ranks ** -cfg["zipf"]
        self.cdf = np.cumsum(p / p.sum())
        self.cdf[-1] = 1.0
        self.perm = rng.permutation(V)        # token id of frequency rank r
        self.succ = self.sample(rng, V)       # preferred successor of each token
        self.cfg = cfg

    def sample(self, rng, n):
        r = np.searchsorted(self.cdf, rng.random(n), side="right")
        return self.perm[np.minimum(r, len(self.cdf) - 1)]

    def batch(self, rng):
        B, T, q = self.cfg["batch"], self.cfg["seq"], self.cfg["copy_prob"]
        x = np.empty((B, T + 1), dtype=np.int64)
        x[:, 0] = self.sample(rng, B)
        for t in range(T):
            fresh = self.sample(rng, B)
            follow = rng.random(B) < q
            x[:, t + 1] = np.where(follow, self.succ[x[:, t]], fresh)
        return x


# ----------------------------------------------------------------------------
# safetensors writer (by hand) and bf16 rounding
# ----------------------------------------------------------------------------

def f32_to_bf16_bits(a):
    """float32 -> bf16 bit patterns (uint16), round to nearest even; NaN stays a quiet NaN."""
    u = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(a)
    r[nan] = (u[nan] >> 16) | 0x40
    return r.astype("<u2")


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, dtype_str, shape, little-endian bytes)."""
    header = {}
    off = 0
    for name, dt, shape, data in tensors:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * (-len(hj) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for _, _, _, data in tensors:
            f.write(data)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------

def tensor_stats(g):
    x = g.astype(np.float64).ravel()
    l2 = float(np.sqrt((x * x).sum()))
    mx = float(np.abs(x).max())
    fz = float((x == 0).mean())
    c = x - x.mean()
    var = (c * c).mean()
    kurt = float((c ** 4).mean() / var ** 2) if var > 0 else float("nan")
    return l2, mx, fz, kurt


def summary_table(grads):
    lines = ["%-24s %-12s %11s %11s %7s %9s" % ("name", "shape", "L2 norm", "max abs", "zero", "kurtosis")]
    for name, g in grads.items():
        l2, mx, fz, kurt = tensor_stats(g)
        shape = "x".join(str(s) for s in g.shape)
        lines.append("%-24s %-12s %11.4e %11.4e %7.4f %9.2f" % (name, shape, l2, mx, fz, kurt))
    return lines


def properties(grads, cfg):
    e = grads["embed.weight"]
    zero_rows = float((~e.any(axis=1)).mean())
    out = ["all-zero rows of embed.weight (tokens absent from the batch): %.1f%%" % (100 * zero_rows)]
    for i, kind in enumerate(cfg["acts"]):
        w = grads["blocks.%d.mlp.fc1.weight" % i]
        dead = int((~w.any(axis=1)).sum())
        out.append("all-zero rows of blocks.%d.mlp.fc1.weight (%s units that never fire): %d of %d"
                   % (i, kind, dead, w.shape[0]))
    norms = {k: tensor_stats(g)[0] for k, g in grads.items()}
    nz = {k: v for k, v in norms.items() if v > 0}
    hi = max(nz, key=nz.get)
    lo = min(nz, key=nz.get)
    out.append("per-tensor L2 norm spread: %.3g (%s) / %.3g (%s) = %.0fx"
               % (nz[hi], hi, nz[lo], lo, nz[hi] / nz[lo]))
    return out


# ----------------------------------------------------------------------------
# Gradient check
# ----------------------------------------------------------------------------

def grad_check():
    cfg = dict(vocab=40, dim=8, hidden=12, seq=6, batch=3, kernel=3,
               acts=("relu", "gelu"), zipf=1.1, copy_prob=0.6)
    rng = np.random.default_rng(SEED + 1)
    P = init_params(cfg, rng)
    # Make LayerNorm affine parameters non-trivial so their gradients are tested too.
    for k in P:
        if k.endswith("norm.weight"):
            P[k] = 1.0 + 0.3 * rng.standard_normal(P[k].shape)
        elif k.endswith("norm.bias"):
            P[k] = 0.3 * rng.standard_normal(P[k].shape)
    data = Data(cfg, rng)
    tokens = data.batch(rng)
    _, G = loss_and_grads(P, cfg, tokens)
    eps = 1e-5
    worst = 0.0
    ok = True
    for name in P:
        p = P[name]
        flat = p.reshape(-1)
        n = flat.size
        idx = np.arange(n) if n <= 40 else rng.choice(n, 40, replace=False)
        num = np.empty(len(idx))
        for j, ix in enumerate(idx):
            old = flat[ix]
            flat[ix] = old + eps
            lp, _ = loss_and_grads(P, cfg, tokens)
            flat[ix] = old - eps
            lm, _ = loss_and_grads(P, cfg, tokens)
            flat[ix] = old
            num[j] = (lp - lm) / (2 * eps)
        ana = G[name].reshape(-1)[idx]
        err = np.abs(num - ana).max() / max(np.abs(num).max(), np.abs(ana).max(), 1e-12)
        worst = max(worst, err)
        good = err < 1e-5
        ok &= good
        print("%-24s %-10s max rel err %.2e %s" % (name, "x".join(map(str, p.shape)), err,
                                                    "ok" if good else "FAIL"))
    print("gradient check %s (worst %.2e)" % ("passed" if ok else "FAILED", worst))
    return ok


# ----------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------

README_HEAD = """# Sample gradients

Real gradients of a tiny language model, made by `python3 samples/make_samples.py` (numpy only,
fixed seed {seed}, byte-for-byte reproducible; all math in float64, rounded to float32 when written).

- **Model** (hand-written forward/backward, checked with `--check` by finite differences): token embedding
  {V}x{D} + learned positions, 2 residual blocks of [depthwise causal Conv1d (kernel {K}) mixing ->
  LayerNorm -> MLP {D}->{H}->{D}] with ReLU in block 0 and GELU (tanh) in block 1, final LayerNorm,
  untied output projection {V}x{D} + bias, mean next-token cross-entropy.
- **Data**: synthetic tokens, unigram Zipf(s={zipf}) over a shuffled vocabulary of {V}; with probability
  {q} each next token is a fixed per-token successor (learnable bigrams). Batch {B} x {T} tokens.
- **Training**: Adam (lr {lr}) for {warm} steps from PyTorch-default init, then the gradients of the
  next {rec} steps (global steps {s0}..{s1}) are saved, before each step's update.

Files (safetensors written by hand; `__metadata__` holds step, loss, seed):
- `step_0000.safetensors`, `step_0001.safetensors`, `step_0002.safetensors`: float32 (`F32`).
- `step_0000_bf16.safetensors`: the step-0 gradients as `BF16` (round-to-nearest-even from float32).
- Tensors are stored in model order (table below), row-major, little-endian; gradients are of the mean loss.
- The vocabulary is 1536 (not 2000) to keep this folder under 4 MB.
- A ReLU unit that never fires in the batch zeroes its row of `mlp.fc1.weight`, its `mlp.fc1.bias` entry and
  its column of `mlp.fc2.weight`; a token absent from the batch zeroes its row of `embed.weight`.
- Reproducibility: rerunning gives identical bytes (checked with sha256sum on one machine); float64 BLAS on
  another CPU may differ in the last bits, which 500 training steps can amplify.

Properties visible (step_0000, as printed by the script):
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="run the finite-difference gradient check and exit")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "grads"))
    args = ap.parse_args()

    if args.check:
        return 0 if grad_check() else 1

    cfg = CFG
    rng = np.random.default_rng(SEED)
    P = init_params(cfg, rng)
    data = Data(cfg, rng)
    m = {k: np.zeros_like(v) for k, v in P.items()}
    v = {k: np.zeros_like(v) for k, v in P.items()}
    os.makedirs(args.out, exist_ok=True)
    recorded = []
    b1, b2 = BETAS
    for step in range(WARMUP_STEPS + RECORD_STEPS):
        tokens = data.batch(rng)
        loss, G = loss_and_grads(P, cfg, tokens)
        if step % 50 == 0 or step >= WARMUP_STEPS:
            print("step %3d  loss %.4f" % (step, loss), file=sys.stderr)
        if step >= WARMUP_STEPS:
            r = step - WARMUP_STEPS
            g32 = {k: g.astype(np.float32) for k, g in G.items()}
            meta = {"format": "pt", "producer": "samples/make_samples.py", "seed": SEED,
                    "step": step, "loss": "%.6f" % loss,
                    "model": "tiny conv-MLP LM V=%d D=%d H=%d" % (cfg["vocab"], cfg["dim"], cfg["hidden"])}
            write_safetensors(os.path.join(args.out, "step_%04d.safetensors" % r),
                              [(k, "F32", g.shape, g.astype("<f4").tobytes()) for k, g in g32.items()],
                              dict(meta, dtype="float32"))
            if r == 0:
                write_safetensors(os.path.join(args.out, "step_0000_bf16.safetensors"),
                                  [(k, "BF16", g.shape, f32_to_bf16_bits(g).tobytes()) for k, g in g32.items()],
                                  dict(meta, dtype="bfloat16"))
            recorded.append((step, loss, g32))
        t = step + 1
        for k in P:
            m[k] = b1 * m[k] + (1 - b1) * G[k]
            v[k] = b2 * v[k] + (1 - b2) * G[k] * G[k]
            P[k] -= LR * (m[k] / (1 - b1 ** t)) / (np.sqrt(v[k] / (1 - b2 ** t)) + ADAM_EPS)

    step0, loss0, g0 = recorded[0]
    table = summary_table(g0)
    props = properties(g0, cfg)
    later = []
    for r, (step, loss, g) in enumerate(recorded):
        e = g["embed.weight"]
        dead = [int((~g["blocks.%d.mlp.fc1.weight" % i].any(axis=1)).sum()) for i in range(len(cfg["acts"]))]
        later.append("step_%04d (global step %d): loss %.4f, total L2 norm %.4e, zero embed rows %.1f%%, "
                     "never-firing MLP units per block %s"
                     % (r, step, loss, math.sqrt(sum(tensor_stats(x)[0] ** 2 for x in g.values())),
                        100 * float((~e.any(axis=1)).mean()), dead))
    print("step_0000 (global step %d, loss %.4f)" % (step0, loss0))
    print("\n".join(table))
    print()
    print("\n".join(props))
    print("\n".join(later))

    head = README_HEAD.format(seed=SEED, V=cfg["vocab"], D=cfg["dim"], H=cfg["hidden"], K=cfg["kernel"],
                              zipf=cfg["zipf"], q=cfg["copy_prob"], B=cfg["batch"], T=cfg["seq"], lr=LR,
                              warm=WARMUP_STEPS, rec=RECORD_STEPS, s0=WARMUP_STEPS,
                              s1=WARMUP_STEPS + RECORD_STEPS - 1)
    body = ["```"] + table + ["```", ""] + ["- " + p for p in props] + ["- " + s for s in later] + [
        "",
        "kurtosis is Pearson's (3 for a Gaussian); zero is the fraction of exactly-zero elements.",
        ""]
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(head + "\n" + "\n".join(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
