"""trellis's dropout masks, written again from their definition (docs/training.md, "Dropout";
kernels/ops.h, ops::Dropout) with numpy: Philox4x32-10 and the mask formula. Nothing here reads
a mask that trellis wrote.

  key     = splitmix64(splitmix64(splitmix64(seed) ^ step) ^ (layer * 16 + site))   (mod 2^64)
  counter = (e // 4, t, s, x)   four 32-bit words: element, position, global sequence, extra
            (the global query head in attention, else 0)
  word    = output word e % 4 of Philox4x32-10(key, counter)
  kept    iff word >= floor(float64(float32(p)) * 2^32); kept values are scaled by
            float32(1) / (float32(1) - float32(p)).
Sites: 0 embedding output, 1 decoder embedding output (encoder-decoder), 2 self-attention
probabilities, 3 self-attention branch, 4 cross-attention probabilities, 5 cross-attention branch,
6 MLP branch, 7 classifier's pooled vector. The embeddings and the classifier use layer 0, a
block its global index (an encoder-decoder's decoder block j: n_encoder_layers + j).
Elements: residual branch / embedding [B,T,C]: e = channel c at position t; attention [B,H,Tq,Tk]:
e = key j at position t = query i, x = head h; pooled [B,C]: e = c at t = 0. Sequence s = first
+ b (b: the row in the batch).

The reference models call resid / attn / pooled below; they are the identity unless a test
sets ACTIVE (a Dropout) around its forward.
"""

import numpy as np
import torch

EMBED, DEC_EMBED, ATTN_PROBS, ATTN_OUT, CROSS_PROBS, CROSS_OUT, MLP_OUT, CLASSIFIER = range(8)
_M64 = (1 << 64) - 1
_M32 = np.uint64(0xFFFFFFFF)


def splitmix64(z):
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def dropout_key(seed, step, layer, site):
    return splitmix64(splitmix64(splitmix64(seed) ^ step) ^ (layer * 16 + site))


def philox4x32_10(ctr, key):
    """ctr: four uint64 arrays of 32-bit values (broadcastable); key: a 64-bit int (word 0 its
    low half). Returns the four output words (uint64 arrays of 32-bit values)."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in ctr)
    k0, k1 = key & 0xFFFFFFFF, key >> 32
    m0, m1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    for _ in range(10):
        p0, p1 = m0 * c0, m1 * c2  # < 2^64: exact in uint64
        hi0, lo0 = p0 >> np.uint64(32), p0 & _M32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _M32
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint64(k0), lo1, hi0 ^ c3 ^ np.uint64(k1), lo0
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return c0, c1, c2, c3


def multipliers(p, key, e, t, s, x):
    """0 or 1/(1-p) (float32) for broadcastable integer arrays e, t, s, x."""
    e, t, s, x = (np.asarray(a, dtype=np.uint64) for a in (e, t, s, x))
    shape = np.broadcast_shapes(e.shape, t.shape, s.shape, x.shape)
    words = philox4x32_10((e >> np.uint64(2), t, s, x), key)
    words = np.stack([np.broadcast_to(w, shape) for w in words])
    which = np.broadcast_to(e & np.uint64(3), shape)[None].astype(np.int64)
    word = np.take_along_axis(words, which, 0)[0]
    p32 = np.float32(p)
    threshold = int(float(p32) * 4294967296.0)
    scale = np.float32(1.0) / (np.float32(1.0) - p32)
    return np.where(word >= np.uint64(threshold), scale, np.float32(0.0)).astype(np.float32)


class Dropout:
    """The masks of one training forward: run seed, global step, probabilities, and the global
    index of the batch's first sequence."""

    def __init__(self, seed, step, p=0.0, p_attn=0.0, p_cls=0.0, first=0):
        self.seed, self.step, self.first = seed, step, first
        self.p, self.p_attn, self.p_cls = p, p_attn, p_cls

    def rows(self, x, p, layer, site):
        """x [B,T,C] (or [B,C] with T = 1) times its mask."""
        if p == 0.0:
            return x
        B, T, C = x.shape if x.dim() == 3 else (x.shape[0], 1, x.shape[1])
        m = multipliers(p, dropout_key(self.seed, self.step, layer, site),
                        np.arange(C)[None, None, :], np.arange(T)[None, :, None],
                        self.first + np.arange(B)[:, None, None], 0)
        return x * torch.from_numpy(m).to(x.dtype).reshape(x.shape)

    def attn(self, att, layer, site):
        """att [B,H,Tq,Tk] times its mask."""
        if self.p_attn == 0.0:
            return att
        B, H, Tq, Tk = att.shape
        m = multipliers(self.p_attn, dropout_key(self.seed, self.step, layer, site),
                        np.arange(Tk)[None, None, None, :], np.arange(Tq)[None, None, :, None],
                        self.first + np.arange(B)[:, None, None, None],
                        np.arange(H)[None, :, None, None])
        return att * torch.from_numpy(m).to(att.dtype)


ACTIVE = None  # the Dropout of the forward being run, or None (no dropout)


def resid(x, layer, site):
    """An embedding output or residual branch (site EMBED, DEC_EMBED, *_OUT) with its mask."""
    return x if ACTIVE is None else ACTIVE.rows(x, ACTIVE.p, layer, site)


def attn(att, layer, site):
    """Attention probabilities (site ATTN_PROBS or CROSS_PROBS) with their mask."""
    return att if ACTIVE is None else ACTIVE.attn(att, layer, site)


def pooled(x):
    """A classifier's pooled vector [B,C] with its mask."""
    return x if ACTIVE is None else ACTIVE.rows(x, ACTIVE.p_cls, 0, CLASSIFIER)
