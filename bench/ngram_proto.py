#!/usr/bin/env python3
"""Prototype: does fastText-style subword features help the short-text encoder?

An independent PyTorch model of configs/sections.toml's encoder (2 blocks, width 64, 4 heads,
pre-LayerNorm, learned positions, mean pooling over [S] text [S], dropout / attention dropout /
classifier dropout 0.1, label smoothing 0.1, AdamW lr 2e-3 betas (0.9, 0.999) weight decay 0.05
on matrices and embeddings, clip 1.0, 10% warmup then cosine to 1e-4), trained on a prepared
classify directory (GPT-2 BPE), with one of these inputs:

  none   the token embedding alone (the recipe as trellis trains it);
  token  + the mean of the hashed character n-gram vectors of the token's own text
           (text in GPT-2's byte form; a leading space is the word-start marker; the token is
           bracketed by '<' '>');
  word   + the mean of the hashed n-gram vectors of the whole word the token belongs to (a word
           = a token that starts with a space plus the following tokens that do not), '<word>'.

n-grams are of UTF-8 characters (a continuation byte belongs to the character before it), n in
[--nmin, --nmax], hashed with 32-bit FNV-1a (fastText's hash) into --buckets rows. --layers 0 is
the fastText-like degenerate (embeddings + n-grams, mean pooled, linear).

--mlm-epochs E first pre-trains the same encoder with BERT's masked-LM objective on the training
split's own texts (labels unused; task-adaptive pre-training): whole words are chosen with
probability --mlm-prob, their tokens replaced by a [MASK] row (80%), random tokens (10%) or kept
(10%); a chosen word's n-gram bags are emptied unless kept (they would give the word away); the
loss is the cross-entropy over the chosen positions only, with the output head tied to the token
embedding (no bias). Its own 10% warmup and cosine schedule at --mlm-lr; then the classification
recipe from those weights with fresh optimizer state. --mlm-aux W keeps W x the masked-LM loss
(on a separately masked copy of each batch) during fine-tuning.

Usage: ngram_proto.py DATA_DIR [--features none|token|word] [--layers 2] [--epochs 3] ...
Prints per-epoch validation accuracy and a JSON line at the end.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "reference"))
from trellis_test import read_examples  # noqa: E402
from subword_ngrams import token_bytes  # noqa: E402


def fnv1a(data):
    h = 2166136261
    for b in data:
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def chars(data):
    """UTF-8 characters of a byte string; a continuation byte joins the character before it."""
    out = []
    for b in data:
        if out and 0x80 <= b < 0xC0:
            out[-1] += bytes([b])
        else:
            out.append(bytes([b]))
    return out


def ngram_buckets(text, nmin, nmax, buckets, lower):
    if lower:
        text = text.lower()  # ASCII only, as a C++ version would do
    cs = chars(text)
    ids = []
    for n in range(nmin, nmax + 1):
        for i in range(len(cs) - n + 1):
            ids.append(fnv1a(b"".join(cs[i:i + n])) % buckets)
    return ids


def example_ngrams(tokens, tok_bytes, mode, args, cache):
    """Per token of `tokens`: its list of bucket ids."""
    if mode == "token":
        out = []
        for t in tokens:
            if t not in cache:
                b = tok_bytes[t]
                cache[t] = ngram_buckets(b"<" + b + b">", args.nmin, args.nmax, args.buckets,
                                         args.lower) if b else []
            out.append(cache[t])
        return out
    # word: group tokens; a word starts at a token whose text starts with a space
    out = [None] * len(tokens)
    i = 0
    while i < len(tokens):
        j = i + 1
        while j < len(tokens) and not tok_bytes[tokens[j]].startswith(b" "):
            j += 1
        word = b"".join(tok_bytes[t] for t in tokens[i:j]).strip(b" ")
        key = ("w", word)
        if key not in cache:
            cache[key] = ngram_buckets(b"<" + word + b">", args.nmin, args.nmax, args.buckets,
                                       args.lower) if word else []
        for k in range(i, j):
            out[k] = cache[key]
        i = j
    return out


class Encoder(nn.Module):
    def __init__(self, V, T, C, H, L, K, buckets, p, sparse):
        super().__init__()
        self.H, self.p = H, p
        self.V = V
        self.wte = nn.Embedding(V + 1, C)  # row V is [MASK]; dense: it is also the MLM head
        self.wpe = nn.Embedding(T, C)
        self.ngrams = nn.EmbeddingBag(buckets, C, mode="mean", sparse=sparse) if buckets else None
        self.blocks = nn.ModuleList()
        for _ in range(L):
            blk = nn.ModuleDict(dict(ln1=nn.LayerNorm(C), qkv=nn.Linear(C, 3 * C),
                                     proj=nn.Linear(C, C), ln2=nn.LayerNorm(C),
                                     fc1=nn.Linear(C, 4 * C), fc2=nn.Linear(4 * C, C)))
            self.blocks.append(blk)
        self.ln_f = nn.LayerNorm(C)
        self.head = nn.Linear(C, K)
        for name, w in self.named_parameters():
            if w.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("proj.weight", "fc2.weight")) \
                    else 0.02
                nn.init.normal_(w, 0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(w)

    def forward(self, tokens, lengths, bag_ids, bag_offsets):
        h, real = self.encode(tokens, lengths, bag_ids, bag_offsets)
        pooled = (h * real[:, :, None]).sum(1) / lengths[:, None]
        return self.head(F.dropout(pooled, self.p, self.training))

    def mlm_logits(self, h, where):
        """Vocabulary logits (the tied token embedding, [MASK] row excluded) at positions where."""
        return h[where] @ self.wte.weight[:self.V].t()

    def encode(self, tokens, lengths, bag_ids, bag_offsets):
        B, T = tokens.shape
        C = self.wte.embedding_dim
        x = self.wte(tokens) + self.wpe(torch.arange(T))[None]
        if self.ngrams is not None:
            x = x + self.ngrams(bag_ids, bag_offsets).view(B, T, C)
        x = F.dropout(x, self.p, self.training)
        real = torch.arange(T)[None, :] < lengths[:, None]  # [B,T]
        mask = real[:, None, None, :]
        hd = C // self.H
        for blk in self.blocks:
            n = blk["ln1"](x)
            q, k, v = blk["qkv"](n).view(B, T, 3, self.H, hd).permute(2, 0, 3, 1, 4)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
            att = F.dropout(torch.softmax(att.masked_fill(~mask, float("-inf")), -1), self.p,
                            self.training)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + F.dropout(blk["proj"](y), self.p, self.training)
            h = blk["fc2"](F.gelu(blk["fc1"](blk["ln2"](x)), approximate="tanh"))
            x = x + F.dropout(h, self.p, self.training)
        return self.ln_f(x), real


def clip(params, max_norm):
    """Global-norm clipping over dense and sparse (embedding) gradients."""
    params = [p for p in params if p.grad is not None]
    sq = 0.0
    for p in params:
        if p.grad.is_sparse:
            p.grad = p.grad.coalesce()
            sq += float(p.grad._values().pow(2).sum())
        else:
            sq += float(p.grad.pow(2).sum())
    coef = max_norm / (math.sqrt(sq) + 1e-6)
    if coef < 1:
        for p in params:
            p.grad.mul_(coef)


def make_batch(rows, S, T_max):
    """[S] text [S] padded with S to the batch's longest; rows = [(label, tokens, ngrams)]."""
    T = min(max(len(r[1]) for r in rows) + 2, T_max)
    B = len(rows)
    tokens = np.full((B, T), S, dtype=np.int64)
    lengths = np.zeros(B, dtype=np.int64)
    counts = np.zeros((B, T), dtype=np.int64)
    ids = []
    for b, (_, toks, grams, _) in enumerate(rows):
        toks = toks[:T - 2]
        tokens[b, 1:1 + len(toks)] = toks
        lengths[b] = len(toks) + 2
    # bags in row-major (b, t) order; specials and padding have empty bags
    for b, (_, toks, grams, _) in enumerate(rows):
        n = min(len(toks), T - 2)
        for t in range(n):
            counts[b, 1 + t] = len(grams[t]) if grams else 0
            if grams:
                ids.extend(grams[t])
    offsets = np.concatenate([[0], np.cumsum(counts.reshape(-1))[:-1]])
    return (torch.from_numpy(tokens), torch.from_numpy(lengths).float(),
            torch.tensor(ids, dtype=torch.int64), torch.from_numpy(offsets),
            torch.tensor([r[0] for r in rows]), torch.from_numpy(lengths))


def word_ids(tokens, tok_bytes):
    """Per token, the index of its word (a word starts at a token whose text starts with a space)."""
    out, w = [], -1
    for i, t in enumerate(tokens):
        if i == 0 or tok_bytes[t].startswith(b" "):
            w += 1
        out.append(w)
    return out


def mask_rows(rows, V, prob, rng):
    """BERT's corruption by whole words: rows -> (corrupted rows, [B,T] targets, -100 = no loss).
    Positions are those of make_batch ([S] at 0, the text from 1)."""
    out, targets = [], []
    for (y, toks, grams, words) in rows:
        n_words = words[-1] + 1 if words else 0
        chosen = rng.random(n_words) < prob
        how = rng.random(n_words)  # < 0.8 mask, < 0.9 random, else keep
        toks2, grams2, tgt = list(toks), list(grams) if grams else None, {}
        for i, w in enumerate(words):
            if not chosen[w]:
                continue
            tgt[1 + i] = toks[i]
            if how[w] < 0.8:
                toks2[i] = V
            elif how[w] < 0.9:
                toks2[i] = int(rng.integers(V))
            if how[w] < 0.9 and grams2 is not None:
                grams2[i] = []
        out.append((y, toks2, grams2, words))
        targets.append(tgt)
    return out, targets


def target_tensor(targets, T):
    t = torch.full((len(targets), T), -100, dtype=torch.int64)
    for b, tgt in enumerate(targets):
        for pos, tok in tgt.items():
            if pos < T - 1:  # make_batch cuts the text at T - 2 tokens
                t[b, pos] = tok
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--features", default="none", choices=["none", "token", "word"])
    ap.add_argument("--buckets", type=int, default=1 << 17)
    ap.add_argument("--nmin", type=int, default=2)
    ap.add_argument("--nmax", type=int, default=5)
    ap.add_argument("--lower", action="store_true")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--epochs", type=float, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--wd", type=float, default=0.05)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--smoothing", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mlm-epochs", type=float, default=0)
    ap.add_argument("--mlm-prob", type=float, default=0.15)
    ap.add_argument("--mlm-lr", type=float, default=2e-3)
    ap.add_argument("--mlm-aux", type=float, default=0)
    ap.add_argument("--dense", dest="sparse", action="store_false",
                    help="dense AdamW on the n-gram table too (as trellis; slow here). The token "
                         "embedding is always dense AdamW: it is also the masked-LM head")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    with open(os.path.join(args.data, "meta.json")) as f:
        meta = json.load(f)
    S, K = meta["special_token"], len(meta["classes"])
    T_max = 128
    tok_bytes = token_bytes()  # GPT-2's token texts, as the oracle test reads them
    cache = {}

    def load(name):
        rows = []
        for y, src, _ in read_examples(os.path.join(args.data, name)):
            grams = (example_ngrams(src, tok_bytes, args.features, args, cache)
                     if args.features != "none" else None)
            rows.append((y, src, grams, word_ids(src, tok_bytes)))
        return rows

    t0 = time.time()
    train, val = load("train.examples"), load("val.examples")
    print(f"loaded in {time.time() - t0:.0f} s", flush=True)
    buckets = args.buckets if args.features != "none" else 0
    model = Encoder(meta["vocab_size"], T_max, args.width, args.heads, args.layers, K, buckets,
                    args.dropout, args.sparse)
    V = meta["vocab_size"]

    def optimizers(lr):
        tables = [p for n, p in model.named_parameters() if args.sparse and n.startswith("ngrams.")]
        dense = [(n, p) for n, p in model.named_parameters() if all(p is not t for t in tables)]
        decay = [p for n, p in dense if p.dim() == 2]
        no_decay = [p for n, p in dense if p.dim() != 2]
        opts = [torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=lr,
                                  betas=(0.9, 0.999), eps=1e-8)]
        if tables:  # lazy Adam: only the rows a batch touched move (no weight decay on them)
            opts.append(torch.optim.SparseAdam(tables, lr=lr, betas=(0.9, 0.999), eps=1e-8))
        return opts

    per_epoch = len(train) // args.batch

    def schedule(steps, peak):
        warmup = max(1, steps // 10)

        def lr_at(step):  # 1-based
            if step <= warmup:
                return peak * step / warmup
            prog = (step - warmup) / max(1, steps - warmup)
            return args.min_lr + 0.5 * (peak - args.min_lr) * (1 + math.cos(math.pi * prog))
        return lr_at

    def evaluate():
        model.eval()
        right = 0
        with torch.no_grad():
            for i in range(0, len(val), 256):
                tok, ln, ids, off, y, _ = make_batch(val[i:i + 256], S, T_max)
                right += int((model(tok, ln, ids, off).argmax(-1) == y).sum())
        model.train()
        return right / len(val)

    rng = np.random.default_rng(args.seed)
    mask_rng = np.random.default_rng(args.seed + 1000)

    def mlm_loss(rows):
        masked, targets = mask_rows(rows, V, args.mlm_prob, mask_rng)
        tok, ln, ids, off, _, _ = make_batch(masked, S, T_max)
        tgt = target_tensor(targets, tok.shape[1])
        where = tgt >= 0
        h, _ = model.encode(tok, ln, ids, off)
        return F.cross_entropy(model.mlm_logits(h, where), tgt[where])

    def run_phase(steps, peak, loss_fn, report):
        opts, lr_at = optimizers(peak), schedule(steps, peak)
        order, pos = rng.permutation(len(train)), 0
        for step in range(1, steps + 1):
            if pos + args.batch > len(train):
                order, pos = rng.permutation(len(train)), 0
            rows = [train[i] for i in order[pos:pos + args.batch]]
            pos += args.batch
            for opt in opts:
                for g in opt.param_groups:
                    g["lr"] = lr_at(step)
                opt.zero_grad(set_to_none=True)
            loss = loss_fn(rows)
            loss.backward()
            clip(model.parameters(), 1.0)
            for opt in opts:
                opt.step()
            if step % per_epoch == 0 or step == steps:
                report(step, loss)

    mlm_log, accs = [], []
    mlm_steps = int(round(args.mlm_epochs * per_epoch))
    if mlm_steps:
        def mlm_report(step, loss):
            mlm_log.append(round(loss.item(), 3))
            print(f"mlm step {step} loss {loss.item():.3f} ({time.time() - t0:.0f} s)", flush=True)
        run_phase(mlm_steps, args.mlm_lr, mlm_loss, mlm_report)

    def cls_loss(rows):
        tok, ln, ids, off, y, _ = make_batch(rows, S, T_max)
        loss = F.cross_entropy(model(tok, ln, ids, off), y, label_smoothing=args.smoothing)
        if args.mlm_aux:
            loss = loss + args.mlm_aux * mlm_loss(rows)
        return loss

    def cls_report(step, loss):
        accs.append(round(evaluate(), 4))
        print(f"step {step} loss {loss.item():.3f} val_acc {accs[-1]} "
              f"({time.time() - t0:.0f} s)", flush=True)
    run_phase(int(round(args.epochs * per_epoch)), args.lr, cls_loss, cls_report)
    print(json.dumps({"data": args.data, "features": args.features, "layers": args.layers,
                      "buckets": buckets, "n": [args.nmin, args.nmax], "lower": args.lower,
                      "seed": args.seed, "sparse": args.sparse,
                      "mlm_epochs": args.mlm_epochs, "mlm_prob": args.mlm_prob,
                      "mlm_lr": args.mlm_lr, "mlm_aux": args.mlm_aux, "mlm_loss": mlm_log, "acc_per_epoch": accs, "seconds": round(time.time() - t0)}))


if __name__ == "__main__":
    main()
