"""Shared helpers of the script tests (run by ctest with TRELLIS_BIN / TRELLIS_TMP set)."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

BIN = os.environ.get("TRELLIS_BIN", os.path.join(os.path.dirname(__file__), "..", "build", "trellis"))
TMP = os.environ.get("TRELLIS_TMP", "/tmp/trellis-test")
SOURCE = os.environ.get("TRELLIS_SOURCE", os.path.join(os.path.dirname(__file__), ".."))


def fresh_dir(name):
    path = os.path.join(TMP, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def cpu_has_bf16():
    """Whether this CPU has AVX512-BF16 (and the AVX-512 F/BW/VL that trellis asks for with it),
    from /proc/cpuinfo: what the hardware has, whatever TRELLIS_ISA caps trellis to."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return False
    return {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"} <= set(flags)


def with_precision(args):
    """`train` defaults to bf16 where the CPU has it; the suite's equivalence and oracle checks are
    fp32 ones, so a `train` that does not name a precision runs in fp32 (bf16 has its own tests)."""
    args = [str(a) for a in args]
    if args and args[0] == "train" and not any(a.startswith("--precision") for a in args):
        args += ["--precision", "fp32"]
    return args


def run(args, expect=0, timeout=600, env=None):
    """Runs trellis with args; checks the exit code; returns (stdout, stderr)."""
    cmd = [BIN] + with_precision(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if expect is not None and p.returncode != expect:
        fail(f"{' '.join(cmd)}\n  exit {p.returncode}, expected {expect}\n"
             f"  stdout: {p.stdout[-2000:]}\n  stderr: {p.stderr[-2000:]}")
    return p.stdout, p.stderr


def metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if "loss" in r], [r for r in rows if "val_loss" in r]


def write_text_corpus(path, n_lines=400):
    """A small deterministic English-like corpus."""
    words = ("the model trains on text and learns to predict the next token while ranks "
             "exchange gradients in buckets so that every layout gives the same run").split()
    lines = []
    for i in range(n_lines):
        lines.append(" ".join(words[(i * 7 + k * 3) % len(words)] for k in range(8 + i % 5)) + ".")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


SHARD_MAGIC = 20240520  # src/trellis/data/shard.h


def shard_header(version, count, magic=SHARD_MAGIC):
    """The 1024-byte header of a token shard (src/trellis/data/shard.h): magic, version, token
    count and, for version 2, the bytes per token; the rest zero."""
    return struct.pack("<256i", magic, version, count, 4 if version == 2 else 0, *([0] * 252))


def write_shard(path, tokens, version=1):
    """Writes tokens (a sequence, or a numpy array: written without a copy when its dtype fits)
    as one token shard: version 1 holds uint16 tokens (llm.c's format), version 2 uint32."""
    import numpy as np
    values = np.asarray(tokens, dtype="<u2" if version == 1 else "<u4")
    with open(path, "wb") as f:
        f.write(shard_header(version, len(values)))
        values.tofile(f)


def read_shard(path):
    """The tokens of one token shard (version 1 or 2) as a list."""
    with open(path, "rb") as f:
        blob = f.read()
    h = struct.unpack("<256i", blob[:1024])
    fmt = "H" if h[1] == 1 else "I"
    return list(struct.unpack(f"<{h[2]}{fmt}", blob[1024:]))


def check(cond, msg):
    if not cond:
        fail(msg)
    print(f"ok: {msg}")


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def read_safetensors(path):
    """{name: numpy array} from a safetensors file (F32 only, as trellis writes)."""
    import numpy as np
    with open(path, "rb") as f:
        blob = f.read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(blob[8 + n + a:8 + n + b], dtype=np.float32).reshape(e["shape"])
    return out


def _global_index(i, shape, split_dim, parts, tp, tp_rank):
    """Global flat index of element i of tp rank tp_rank's slice (ParamSpec::global_index)."""
    import numpy as np
    if split_dim < 0:
        return i
    inner = int(np.prod(shape[split_dim + 1:], dtype=np.int64))
    Dg = shape[split_dim]
    D = Dg // tp
    o, d, rest = i // (D * inner), (i // inner) % D, i % inner
    pl, pg = D // parts, Dg // parts
    gd = d // pl * pg + tp_rank * pl + d % pl
    return (o * Dg + gd) * inner + rest


def checkpoint_tensors(step_dir, state="params"):
    """{name: numpy array} of one state ("params", "exp_avg", ...) of a checkpoint as one process
    holds the model (the true vocabulary rows, as model.safetensors has them). A sharded
    checkpoint is assembled from its index with an implementation of its own, which checks that
    the pieces hold every element exactly once; a whole-file one is read from model.safetensors /
    optimizer.safetensors."""
    import numpy as np
    index_path = os.path.join(step_dir, "index.json")
    if not os.path.exists(index_path):
        if state == "params":
            return read_safetensors(os.path.join(step_dir, "model.safetensors"))
        opt = read_safetensors(os.path.join(step_dir, "optimizer.safetensors"))
        return {k[len(state) + 1:]: v for k, v in opt.items() if k.startswith(state + ".")}
    with open(index_path) as f:
        index = json.load(f)
    if state not in index["states"]:
        fail(f"{step_dir}: no state {state} (has {index['states']})")
    files = {}
    out = {}
    for name, t in index["tensors"].items():
        shape, split, parts = t["shape"], t["split_dim"], t["parts"]
        n = int(np.prod(shape, dtype=np.int64))
        whole = np.zeros(n, dtype=np.float32)
        held = np.zeros(n, dtype=np.int64)
        for p in t["pieces"]:
            if p["file"] not in files:
                files[p["file"]] = read_safetensors(os.path.join(step_dir, p["file"]))
            tp, r = (p["tp"], p["tp_rank"]) if split >= 0 else (1, 0)
            i = np.arange(p["begin"], p["end"], dtype=np.int64)
            g = _global_index(i, shape, split, parts, tp, r)
            whole[g] = files[p["file"]][state][p["at"]:p["at"] + len(i)]
            np.add.at(held, g, 1)
        if not (held == 1).all():
            fail(f"{step_dir}: {name}: {int((held == 0).sum())} elements held by no piece, "
                 f"{int((held > 1).sum())} by several")
        rows = t["export_rows"] if t["export_rows"] >= 0 else shape[0]
        out[name] = whole.reshape(shape)[:rows]
    return out


def checkpoint_optimizer(step_dir):
    """The optimizer state of a checkpoint as optimizer.safetensors names it: {state.name: array}."""
    index_path = os.path.join(step_dir, "index.json")
    if not os.path.exists(index_path):
        return read_safetensors(os.path.join(step_dir, "optimizer.safetensors"))
    with open(index_path) as f:
        states = json.load(f)["states"]
    return {f"{s}.{k}": v for s in states if s != "params"
            for k, v in checkpoint_tensors(step_dir, s).items()}


def checkpoint_bytes(step_dir, what="params"):
    """The bytes of a checkpoint's parameters ("params") or optimizer state ("optimizer"), named
    and in name order: equal bytes iff bitwise equal tensors, whatever the files' layout."""
    arrays = checkpoint_tensors(step_dir) if what == "params" else checkpoint_optimizer(step_dir)
    return b"".join(k.encode() + b"\0" + arrays[k].tobytes() for k in sorted(arrays))


def stop_and_resume(args, stop_at, steps, what, launch=None):
    """Runs `args` whole and again stopped after step stop_at, then resumed (both through launch:
    run by default, or an mpirun-like function); checks the resumed run logs each step once with
    bitwise the same losses, validation losses (every val key) and final checkpoint. Returns the
    two output directories."""
    launch = launch or run
    full, split = fresh_dir(f"{what}_full"), fresh_dir(f"{what}_split")
    launch(args + ["--out", full])
    launch(args + ["--out", split, "--stop-at", stop_at])
    launch(args + ["--out", split, "--resume"])
    (fa, fva), (sa, sva) = metrics(full), metrics(split)
    check([r["step"] for r in sa] == list(range(1, steps + 1)),
          f"{what}: the resumed run logs steps 1..{steps} once")
    check(len(fa) == steps and [r["loss"] for r in fa] == [r["loss"] for r in sa],
          f"{what}: resumed losses bitwise equal")
    vals = lambda rows: [{k: v for k, v in r.items() if k.startswith("val_")} for r in rows]
    check(len(fva) > 0 and vals(fva) == vals(sva), f"{what}: and its validation losses")
    last = f"step_{steps:08d}"
    check(same_checkpoint(os.path.join(full, last), os.path.join(split, last)),
          f"{what}: final parameters and optimizer state bitwise equal")
    return full, split


def training_ranks(out):
    """pids of the `trellis train` processes writing to `out` (the ranks: not `trellis launch`,
    mpirun, srun or slurmstepd)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 2 and argv[0].endswith(b"trellis") and argv[1] == b"train" and \
                out.encode() in argv:
            pids.append(int(pid))
    return pids


def same_checkpoint(a, b):
    """Whether two checkpoints hold bitwise equal parameters and optimizer state."""
    import numpy as np
    pa, pb = checkpoint_tensors(a), checkpoint_tensors(b)
    oa, ob = checkpoint_optimizer(a), checkpoint_optimizer(b)
    return (pa.keys() == pb.keys() and oa.keys() == ob.keys() and
            all(np.array_equal(pa[k], pb[k]) for k in pa) and
            all(np.array_equal(oa[k], ob[k]) for k in oa))


def rel_err(a, b):
    """Norm-wise relative error ||a - b|| / ||b||."""
    import numpy as np
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    nb = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (nb if nb > 0 else 1.0))


def mpirun(np_, args, expect=0, timeout=300, launcher=None):
    """Runs trellis under mpirun (oversubscribed: this suite runs on 2 cores). `launcher` replaces
    the mpirun command in front of the binary (tests/netns.py: mpirun across namespaces)."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    cmd = (launcher or ["mpirun", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "-np",
                        str(np_)]) + [BIN] + with_precision(args)
    # Each local mpirun gets its own session directory: two tests' mpiruns (ctest -j 2) sharing
    # OpenMPI's /tmp/ompi.HOST.UID can fail in orte_init ("mkdir ...: File exists") when one
    # removes it while the other creates it.
    session = None if launcher else tempfile.mkdtemp(prefix="ompi-")
    if session:
        env["OMPI_MCA_orte_tmpdir_base"] = session
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    finally:
        if session:
            shutil.rmtree(session, ignore_errors=True)
    if expect is not None and p.returncode != expect:
        fail(f"{' '.join(cmd)}\n  exit {p.returncode}, expected {expect}\n"
             f"  stdout: {p.stdout[-2000:]}\n  stderr: {p.stderr[-2000:]}")
    return p.stdout, p.stderr


def compare_params(got, want, n_embd):
    """Worst per-tensor norm-relative error, and the error of all parameters as one vector.

    The key third of every c_attn.bias is left out of the per-tensor check: adding a constant to
    all keys shifts every score of a query by the same amount, which softmax ignores, so its exact
    gradient is zero and what backward computes is float rounding noise. Adam normalises that
    noise into full-size steps, so those ~1e-6 values differ between any two summation orders (in
    PyTorch as well). They still count in the whole-vector error. The same holds for the key
    projection's bias of models with separate q/k/v projections (k_proj.bias, self- and
    cross-attention)."""
    import numpy as np
    worst, worst_name = 0.0, None
    for name, w in want.items():
        g = got[name]
        if name.endswith("attn.c_attn.bias"):
            keep = np.r_[0:n_embd, 2 * n_embd:3 * n_embd]
            g, w = g[keep], w[keep]
        if name.endswith("k_proj.bias"):
            continue
        e = rel_err(g, w)
        if e >= worst:
            worst, worst_name = e, name
    flat_g = np.concatenate([got[k].ravel() for k in sorted(want)])
    flat_w = np.concatenate([want[k].ravel() for k in sorted(want)])
    return worst, worst_name, rel_err(flat_g, flat_w)


class LayoutCheck:
    """Runs a 1-process baseline once, then compares parallel layouts of the same run with it:
    per-step train losses, validation losses and final parameters to <= tol relative."""

    def __init__(self, train_args, n_embd, steps, tol=1e-5, name="baseline", param_step=None):
        """param_step: the checkpoint whose parameters are compared (default: the last step's)."""
        self.args, self.n_embd, self.steps, self.tol = train_args, n_embd, steps, tol
        self.param_step = param_step or steps
        out = fresh_dir(name)
        run(self.args + ["--out", out])
        self.base = self._result(out)

    def _result(self, out):
        train, val = metrics(out)
        params = checkpoint_tensors(os.path.join(out, f"step_{self.param_step:08d}"))
        return [r["loss"] for r in train], [v["val_loss"] for v in val], params

    def check(self, name, ranks, layout_args, launch=mpirun):
        """Runs the layout as `name` (its output directory is TMP/name) through `launch` (an
        mpirun-like function: tests/netns.py's runs it across namespaces) and compares it;
        returns the run's stdout."""
        out = fresh_dir(name)
        stdout, _ = launch(ranks, self.args + [str(a) for a in layout_args] + ["--out", out])
        loss, val, params = self._result(out)
        base_loss, base_val, base_params = self.base
        check(len(loss) == self.steps, f"{name}: {self.steps} steps logged")
        worst = max(abs(a - b) / abs(b) for a, b in zip(loss, base_loss))
        check(worst <= self.tol, f"{name}: losses match the 1-process run (worst {worst:.1e})")
        worst_val = max(abs(a - b) / abs(b) for a, b in zip(val, base_val))
        check(len(val) == len(base_val) and worst_val <= self.tol,
              f"{name}: val losses match (worst {worst_val:.1e})")
        worst_p, where, whole = compare_params(params, base_params, self.n_embd)
        check(worst_p <= self.tol and whole <= self.tol,
              f"{name}: step {self.param_step}'s parameters match (worst tensor {worst_p:.1e} in "
              f"{where}, all parameters {whole:.1e})")
        return stdout


# ---- task data (classification, translation, images) for `trellis prepare --task` ----

_SENTIMENT = {
    "pos": ["bright", "kind", "warm", "lovely", "gentle", "clever", "happy"],
    "neg": ["cold", "rude", "dull", "grim", "awful", "noisy", "sad"],
    "mid": ["plain", "usual", "grey", "level", "normal", "common", "so-so"],
}
_NOUNS = ["day", "film", "song", "town", "meal", "book", "game", "story"]


def write_classify_tsv(path, n=60, seed=7):
    """A TSV (header sentence, label) of n texts of 1-11 words (5-80 bytes), labels cycling over
    mid, neg, pos (so a stratified split keeps every class in both parts)."""
    import random
    r = random.Random(seed)
    labels = sorted(_SENTIMENT)
    with open(path, "w") as f:
        f.write("sentence\tlabel\n")
        for i in range(n):
            label = labels[i % 3]
            words = [r.choice(_SENTIMENT[label]) if r.random() < 0.6 else r.choice(_NOUNS)
                     for _ in range(r.randint(1, 11))]
            f.write(" ".join(words) + f"\t{label}\n")


_LEXICON = {"cat": "Katze", "dog": "Hund", "house": "Haus", "tree": "Baum", "sun": "Sonne",
            "moon": "Mond", "red": "rot", "blue": "blau", "small": "klein", "old": "alt"}


def write_translate_tsv(path, n=60, seed=3):
    """n distinct word-for-word English/German pairs of 1-6 words, as `source\\ttarget` lines."""
    import random
    r = random.Random(seed)
    src = sorted(_LEXICON)
    seen = []
    while len(seen) < n:
        words = [r.choice(src) for _ in range(r.randint(1, 6))]
        line = " ".join(words) + "\t" + " ".join(_LEXICON[w] for w in words) + "\n"
        if line not in seen:
            seen.append(line)
    with open(path, "w") as f:
        f.write("".join(seen))


def expect_error(args, *needles, what=None, timeout=120):
    """trellis refuses args with exit code 2 and one line naming each needle (any value, as its
    str); returns that line. `what` names the case in the printed checks."""
    _, err = run(args, expect=2, timeout=timeout)
    return expect_error_line(err, *needles, what=what)


def expect_error_line(err, *needles, what=None):
    """stderr `err` is trellis's one `trellis: error:` line, naming each needle; returns it."""
    lines = [l for l in err.splitlines() if l.strip()]
    case = f"{what}: " if what else ""
    check(len(lines) == 1 and lines[0].startswith("trellis: error:"),
          f"{case}one error line: {lines}")
    for n in needles:
        check(str(n) in lines[0], f"{case}error names '{n}': {lines[0]}")
    return lines[0]


def prepare_copy_task(tmp, max_words):
    """A translation data directory (tmp/copy) of a copy task, the target the source: 400 pairs of
    one to max_words of ten words, learnable in seconds. Returns (directory, pairs as TSV lines)."""
    words = ["open", "file", "save", "close", "print", "edit", "view", "help", "quit", "find"]
    pairs = []
    for i in range(400):
        s = " ".join(words[(i * k + i // 10) % 10] for k in range(1, 2 + i % max_words))
        pairs.append(f"{s}\t{s}")
    with open(os.path.join(tmp, "copy.tsv"), "w") as f:
        f.write("\n".join(pairs) + "\n")
    data = os.path.join(tmp, "copy")
    run(["prepare", "--task", "translate", "--input", os.path.join(tmp, "copy.tsv"),
         "--out", data, "--val-fraction", "0.1"])
    return data, pairs


def write_idx_dir(d, rows=4, cols=6, n_train=16, n_test=6, seed=5):
    """A gzipped idx image directory (MNIST layout) of random pixel bytes, labels k % 3."""
    import gzip
    import random
    import struct
    r = random.Random(seed)

    def images(n):
        return [[r.randrange(256) for _ in range(rows * cols)] for _ in range(n)]

    def idx3(imgs):
        return struct.pack(">IIII", 0x803, len(imgs), rows, cols) + b"".join(bytes(i) for i in imgs)

    def idx1(labels):
        return struct.pack(">II", 0x801, len(labels)) + bytes(labels)

    os.makedirs(d, exist_ok=True)
    for name, blob in (("train-images-idx3-ubyte", idx3(images(n_train))),
                       ("train-labels-idx1-ubyte", idx1([k % 3 for k in range(n_train)])),
                       ("t10k-images-idx3-ubyte", idx3(images(n_test))),
                       ("t10k-labels-idx1-ubyte", idx1([k % 3 for k in range(n_test)]))):
        with gzip.open(os.path.join(d, name + ".gz"), "wb") as f:
            f.write(blob)


def read_examples(path):
    """[(label, source, target)] from an examples file (format in src/trellis/data/examples.h)."""
    with open(path, "rb") as f:
        blob = f.read()
    if blob[:8] != b"TRLSEXMP":
        fail(f"{path}: bad magic")
    version, width, n = struct.unpack_from("<IIQ", blob, 8)
    labels = struct.unpack_from(f"<{n}i", blob, 24)
    ends = struct.unpack_from(f"<{2 * n}Q", blob, 24 + 4 * n)
    code = {1: "B", 2: "H", 4: "I"}[width]
    count = ends[-1] if n else 0
    values = struct.unpack_from(f"<{count}{code}", blob, 24 + 20 * n)
    if len(blob) != 24 + 20 * n + count * width:
        fail(f"{path}: {len(blob)} bytes, the index says {24 + 20 * n + count * width}")
    out, begin = [], 0
    for i in range(n):
        out.append((labels[i], list(values[begin:ends[2 * i]]),
                    list(values[ends[2 * i]:ends[2 * i + 1]])))
        begin = ends[2 * i + 1]
    return out


def prepare_task_dirs():
    """A classification and a translation task directory (TMP/classify, TMP/translate) from the
    texts and pairs above, a fifth of each held out."""
    inputs = fresh_dir("inputs")
    cls_tsv, mt_tsv = os.path.join(inputs, "texts.tsv"), os.path.join(inputs, "pairs.tsv")
    write_classify_tsv(cls_tsv)
    write_translate_tsv(mt_tsv)
    cls_dir, mt_dir = os.path.join(TMP, "classify"), os.path.join(TMP, "translate")
    run(["prepare", "--task", "classify", "--input", cls_tsv, "--out", cls_dir, "--val-fraction", 0.2])
    run(["prepare", "--task", "translate", "--input", mt_tsv, "--out", mt_dir, "--val-fraction", 0.2])
    return cls_dir, mt_dir


def bf16_layout_models(steps, logging):
    """The models the bf16 layout tests train (test_bf16_layouts, test_bf16_zero): GPT-2 and LLaMA
    (GQA), 4 blocks, on a fresh 800-line corpus; `logging` the arguments that say how much they
    print. Returns {name: train arguments}."""
    corpus = fresh_dir("corpus")
    write_text_corpus(os.path.join(corpus, "text.txt"), n_lines=800)
    data = os.path.join(TMP, "data")
    run(["prepare", "--input", corpus, "--out", data])
    common = ["--data", data, "--steps", steps, "--batch-size", 8, "--micro-batch-size", 2,
              "--seq-len", 32, "--lr", 3e-3, "--warmup-steps", 4, "--val-every", 10,
              "--threads", 1, "--tensorboard", "false"] + logging
    return {
        "gpt2": ["train", "--model", "tiny", "--n-layer", 4, "--n-head", 4] + common,
        "llama": ["train", "--model", "llama-tiny", "--n-layer", 4, "--n-head", 4,
                  "--n-kv-head", 2] + common,
    }
