#!/usr/bin/env python3
"""Key/value-cached decoding against its references (issue 24, "Speed goals"); bench/RESULTS.md.

translate: `trellis eval --beam 4` (loss, then BLEU/chrF of beam-4 translations) on the first N
  held-out pairs of a translation directory, cached against --no-cache, alternating, one process
  at a time; prints each run's seconds, the medians and their ratio, and checks that both print
  the same metrics. The ratio depends on how long the hypotheses are (the uncached path re-runs
  the whole prefix every step), so it also reports the mean output length of greedy decoding.

gpt2: `trellis sample` from a GPT-2 124M checkpoint (fp32, batch 1, greedy, N new tokens; the
  generation's own time, `--timing`) against an independent PyTorch GPT-2 greedy loop with its
  own key/value cache, written here as Hugging Face's GPT-2 uses `past_key_values` (keys and
  values concatenated per layer each step, the new position's query over them), on the same
  weights (`trellis export`'s model.safetensors). PyTorch gets its fair setup (DESIGN.md, "Fair
  comparisons"): OpenBLAS (bench/setup_peer.sh), MALLOC_MMAP_MAX_=0, its best of every
  torch-threads x OPENBLAS_NUM_THREADS combination, OPENBLAS_CORETYPE unset for it alone. Also
  the bandwidth bound: weight bytes read per token / a measured read bandwidth.

  /usr/bin/python3 bench/decode_bench.py translate --checkpoint C --data data/demo/translate
  /usr/bin/python3 bench/decode_bench.py gpt2 --checkpoint C --hf DIR   # DIR: trellis export
  /usr/bin/python3 bench/decode_bench.py torch-gpt2 --hf DIR ...        # the peer alone (internal)
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TRELLIS = os.path.join(ROOT, "build", "trellis")
PROMPT = "Hello world"  # GPT-2 ids [15496, 995]
PROMPT_IDS = [15496, 995]


def load(cmd, env=None):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    return p.stdout, p.stderr, time.perf_counter() - t0


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def translate(a):
    base = [a.trellis, "eval", "--checkpoint", a.checkpoint, "--data", a.data, "--examples",
            str(a.examples), "--beam", "4", "--batch-size", str(a.batch_size), "--threads",
            str(a.threads)]
    times = {"cached": [], "uncached": []}
    metrics = {}
    print(f"load average before: {loadavg()}", flush=True)
    for r in range(a.repeats):
        for name, extra in (("uncached", ["--no-cache"]), ("cached", [])):
            out, _, s = load(base + extra)
            times[name].append(s)
            metrics.setdefault(name, json.loads(out))
            print(f"round {r}: {name} {s:.2f} s {out.strip()} (load {loadavg()})", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    # How long greedy outputs are against the references (bytes of the first N pairs).
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from trellis_test import read_examples  # noqa: E402
    val = read_examples(os.path.join(a.data, "val.examples"))[:a.examples]
    src = "/tmp/kv-bench-src.txt"
    with open(src, "w") as f:
        f.write("".join(bytes(s).decode("utf-8", "replace").replace("\n", " ") + "\n"
                        for _, s, _ in val))
    out, _, _ = load([a.trellis, "translate", "--checkpoint", a.checkpoint, "--input", src,
                      "--beam", "4", "--batch-size", str(a.batch_size), "--threads", str(a.threads)])
    hyp_len = statistics.mean(len(h.encode()) for h in out.splitlines())
    ref_len = statistics.mean(len(bytes(t)) for _, _, t in val)
    print(json.dumps({"cached_s": times["cached"], "uncached_s": times["uncached"],
                      "median_cached_s": med["cached"], "median_uncached_s": med["uncached"],
                      "speedup": med["uncached"] / med["cached"],
                      "same_metrics": metrics["cached"] == metrics["uncached"],
                      "metrics": metrics["cached"], "mean_hyp_bytes": hyp_len,
                      "mean_ref_bytes": ref_len, "load_after": loadavg()}))


def read_safetensors(path):
    import torch
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        assert h["dtype"] == "F32", name
        lo, hi = h["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[lo:hi]), dtype=torch.float32).view(h["shape"])
    return out


def torch_gpt2(a):
    """The peer: GPT-2 greedy decoding with a per-layer key/value cache, batch 1, fp32."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(a.torch_threads)
    w = read_safetensors(os.path.join(a.hf, "model.safetensors"))
    cfg = json.load(open(os.path.join(a.hf, "config.json")))
    L, H, C = cfg["n_layer"], cfg["n_head"], cfg["n_embd"]
    hd = C // H
    wte, wpe = w["wte.weight"], w["wpe.weight"]

    def lin(x, name):  # Hugging Face Conv1D: x @ W + b, W [in, out]
        return torch.addmm(w[name + ".bias"], x, w[name + ".weight"])

    def ln(x, name):
        return F.layer_norm(x, (C,), w[name + ".weight"], w[name + ".bias"], 1e-5)

    @torch.inference_mode()
    def generate(ids, n):
        past = [None] * L
        x, pos, out = torch.tensor(ids), 0, []
        for _ in range(n):
            T = x.shape[0]
            h = wte[x] + wpe[pos:pos + T]
            for i in range(L):
                qkv = lin(ln(h, f"h.{i}.ln_1"), f"h.{i}.attn.c_attn")
                q, k, v = (t.view(T, H, hd).transpose(0, 1) for t in qkv.split(C, dim=1))
                if past[i] is not None:
                    k, v = torch.cat([past[i][0], k], 1), torch.cat([past[i][1], v], 1)
                past[i] = (k, v)
                s = (q @ k.transpose(1, 2)) / (hd ** 0.5)
                if T > 1:  # the prompt: causal within it
                    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
                y = (s.softmax(-1) @ v).transpose(0, 1).reshape(T, C)
                h = h + lin(y, f"h.{i}.attn.c_proj")
                m = F.gelu(lin(ln(h, f"h.{i}.ln_2"), f"h.{i}.mlp.c_fc"), approximate="tanh")
                h = h + lin(m, f"h.{i}.mlp.c_proj")
            logits = ln(h[-1:], "ln_f") @ wte.t()
            nxt = int(logits[0].argmax())
            out.append(nxt)
            x, pos = torch.tensor([nxt]), pos + T
        return out

    generate(PROMPT_IDS, 4)  # warm-up
    t0 = time.perf_counter()
    toks = generate(PROMPT_IDS, a.tokens)
    s = time.perf_counter() - t0
    print(json.dumps({"tokens": toks, "seconds": s, "tokens_per_s": a.tokens / s,
                      "torch_threads": torch.get_num_threads()}))


def gpt2_text(ids):
    """GPT-2 ids -> text (tests/data/gpt2's vocabulary and GPT-2's byte <-> unicode table)."""
    enc = json.load(open(os.path.join(ROOT, "tests", "data", "gpt2", "encoder.json")))
    dec = {v: k for k, v in enc.items()}
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b), cs.append(256 + n)
            n += 1
    byte_of = {chr(c): b for b, c in zip(bs, cs)}
    return bytes(byte_of[ch] for i in ids for ch in dec[i]).decode("utf-8", "replace")


def read_bandwidth():
    """GB/s of a single-threaded sum over 512 MiB (read) and a copy of 256 MiB (read + write)."""
    import numpy as np
    a = np.ones(128 << 20, dtype=np.float32)
    b = np.empty(64 << 20, dtype=np.float32)
    read, copy = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        a.sum()
        read.append(a.nbytes / (time.perf_counter() - t0) / 1e9)
        t0 = time.perf_counter()
        np.copyto(b, a[:b.size])
        copy.append(2 * b.nbytes / (time.perf_counter() - t0) / 1e9)
    return max(read), max(copy)


def gpt2(a):
    weights = read_safetensors(os.path.join(a.hf, "model.safetensors"))
    # Read once per token: every weight (the head reads all of wte) but wpe's one row.
    weight_bytes = sum(t.numel() * 4 for n, t in weights.items() if n != "wpe.weight")
    del weights
    peer_env = dict(os.environ, MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_="4294967295")
    for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        peer_env.pop(k, None)
    combos = [(t, b) for t in (1, 2) for b in (1, 2)]
    res = {"trellis": {1: [], 2: []}, "torch": {c: [] for c in combos}}
    toks = {}
    print(f"load average before: {loadavg()}", flush=True)
    for r in range(a.repeats):
        for threads in (1, 2):
            _, err, _ = load([a.trellis, "sample", "--checkpoint", a.checkpoint, "--prompt", PROMPT,
                              "--tokens", str(a.tokens), "--temperature", "0", "--timing",
                              "--threads", str(threads)])
            out = json.loads(err.strip().splitlines()[-1])
            res["trellis"][threads].append(out["tokens_per_s"])
            print(f"round {r}: trellis threads {threads}: {out['tokens_per_s']:.2f} tok/s "
                  f"(load {loadavg()})", flush=True)
        for t, b in combos:
            env = dict(peer_env, OMP_NUM_THREADS=str(t), OPENBLAS_NUM_THREADS=str(b))
            out, _, _ = load([sys.executable, __file__, "torch-gpt2", "--hf", a.hf, "--tokens",
                              str(a.tokens), "--torch-threads", str(t)], env=env)
            out = json.loads(out)
            toks[(t, b)] = out["tokens"]
            res["torch"][(t, b)].append(out["tokens_per_s"])
            print(f"round {r}: torch {t} threads + OpenBLAS {b}: {out['tokens_per_s']:.2f} tok/s "
                  f"(load {loadavg()})", flush=True)
    text, _, _ = load([a.trellis, "sample", "--checkpoint", a.checkpoint, "--prompt", PROMPT,
                       "--tokens", str(a.tokens), "--temperature", "0"])
    peer_text = PROMPT + gpt2_text(toks[combos[0]]) + "\n"
    agree = next((i for i, (x, y) in enumerate(zip(text, peer_text)) if x != y), len(text))
    med = {f"trellis_{t}": statistics.median(v) for t, v in res["trellis"].items()}
    med.update({f"torch_{t}+{b}": statistics.median(v) for (t, b), v in res["torch"].items()})
    best_trellis = max(v for k, v in med.items() if k.startswith("trellis"))
    best_torch = max(v for k, v in med.items() if k.startswith("torch"))
    read_gbs, copy_gbs = read_bandwidth()
    print(json.dumps({"median_tokens_per_s": med, "speedup_best_vs_best": best_trellis / best_torch,
                      "same_text": text == peer_text, "first_difference_at_char": agree,
                      "weight_bytes_per_token": weight_bytes, "read_GBps_1thread": read_gbs,
                      "copy_GBps_1thread": copy_gbs,
                      "bound_tokens_per_s_1thread_read": read_gbs * 1e9 / weight_bytes,
                      "load_after": loadavg()}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("translate")
    t.add_argument("--checkpoint", required=True)
    t.add_argument("--data", default=os.path.join(ROOT, "data", "demo", "translate"))
    t.add_argument("--examples", type=int, default=1000)
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--repeats", type=int, default=3)
    g = sub.add_parser("gpt2")
    g.add_argument("--checkpoint", required=True)
    g.add_argument("--hf", required=True, help="`trellis export` of the checkpoint")
    g.add_argument("--tokens", type=int, default=256)
    g.add_argument("--repeats", type=int, default=3)
    p = sub.add_parser("torch-gpt2")
    p.add_argument("--hf", required=True)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--torch-threads", type=int, default=1)
    for s in (t, g):
        s.add_argument("--trellis", default=TRELLIS)
    a = ap.parse_args()
    {"translate": translate, "gpt2": gpt2, "torch-gpt2": torch_gpt2}[a.cmd](a)


if __name__ == "__main__":
    main()
