"""Streaming `trellis prepare` (issue 15): chunked reading, 2 tokenizer threads, document indexes,
bounded memory.

- On a small input (5 documents: one empty, one without any space, Unicode and runs of
  whitespace) the shards equal, byte for byte, those of the whole-file prepare that preceded
  streaming (their SHA-256 was recorded from it: the prepare of commit 1a8925d), for the byte and the
  GPT-2 tokenizers, whether the input is read whole or in 4 KiB chunks, on 1 or 2 threads.
- The document index beside each shard (`*.idx`) holds each document's start: position 0, then
  (GPT-2) the <|endoftext|> tokens that open the later documents; its token counts match the
  shards'; meta.json counts the documents.
- Bounded memory: the byte tokenizer on a generated 160 MB text file (160M tokens: 320 MB of
  shards) peaks below 48 MB resident (27 MB measured; the whole-file prepare held the text and 4
  bytes per token: ~800 MB); GPT-2 BPE on the same file peaks below 64 MB with 2 threads (35 MB
  measured: two tokenizers and their word caches). Peaks: VmHWM from /proc/PID/status, polled while it
  runs, and wait4's ru_maxrss as an upper bound.
- Reads a signal interrupts (EINTR) and short reads change nothing: with every other read of the
  inputs failing with EINTR and the rest cut to 1000 bytes (an LD_PRELOAD shim), the GPT-2 shards
  in 4 KiB chunks are still the whole-file prepare's. (Before issue 26 the read that looks for a
  cut past a chunk without one gave up on EINTR: "read failed: Interrupted system call".)
- A failing prepare (an unreadable input) leaves an existing output directory as it was and
  creates none."""
import hashlib
import os
import random
import shutil
import struct
import subprocess
import time

from trellis_test import BIN, SOURCE, TMP, check, fresh_dir, read_shard, run

GPT2_DIR = os.path.join(SOURCE, "tests", "data", "gpt2")
EOT = 50256
# SHA-256 over (name, bytes) of every *.bin, sorted by name, from the pre-streaming prepare with
# --shard-tokens 7000 on write_inputs' files (and of those inputs, to tell a changed generator
# from a changed prepare).
INPUT_SHA = "a274766c3eef0ea649c05dd4d2c2f92604576cccc2d7832192a87d1b2e52c6f0"
WHOLE_FILE_SHA = {
    "byte": "60e48d7accc957d99bf877426796d75b299a67e5c8e594b0ef81ae54bb0a2bcb",
    "gpt2": "719399fa303ecea94da8a09ba20e9ed0a7e418eaa71da29e046854ee2e6a24d6",
}


def write_inputs(d):
    """Several documents (an empty one, one without any space, one with Unicode and runs of
    whitespace), deterministic."""
    os.makedirs(d, exist_ok=True)
    r = random.Random(15)
    words = ["the", "model", "trains", "on", "text", "and", "learns", "to", "predict", "it's",
             "we'll", "café", "naïve", "Zürich", "日本語", "—", "“quoted”", "42", "3.14",
             "x+y", "(a)", "don't", "HELLO", "World", "\t", "ünïcödé", "i'd", "they're"]

    def text(n):
        out = []
        for _ in range(n):
            out.append(r.choice(words))
            out.append(r.choice([" ", " ", " ", " ", "  ", "\n", "\n\n", ", ", ". ", " \n "]))
        return "".join(out)
    with open(os.path.join(d, "a.txt"), "w") as f:
        f.write(text(6000))
    open(os.path.join(d, "b_empty.txt"), "w").close()
    with open(os.path.join(d, "c_nospace.txt"), "w") as f:
        f.write("abcdefghij" * 900 + "\n")
    with open(os.path.join(d, "d.txt"), "w") as f:
        f.write(text(3000) + "   \n\n  ")
    with open(os.path.join(d, "e.txt"), "w") as f:
        f.write("Last document. The end")


def digest(d, ext):
    m = hashlib.sha256()
    for n in sorted(os.listdir(d)):
        if n.endswith(ext):
            m.update(n.encode())
            with open(os.path.join(d, n), "rb") as f:
                m.update(f.read())
    return m.hexdigest()


def read_index(path):
    with open(path, "rb") as f:
        blob = f.read()
    h = struct.unpack("<8i", blob[:32])
    check(h[0] == 20240521 and h[1] == 1, f"{path}: index magic/version {h[:2]}")
    return h[2], list(struct.unpack(f"<{h[3]}I", blob[32:]))


inputs = os.path.join(TMP, "inputs")
write_inputs(inputs)
check(digest(inputs, ".txt") == INPUT_SHA, "the input generator writes the recorded inputs")

for tok in ("byte", "gpt2"):
    for name, extra in (("whole", []), ("chunks_1t", ["--chunk-bytes", 4096, "--threads", 1]),
                        ("chunks_2t", ["--chunk-bytes", 4096, "--threads", 2])):
        out = fresh_dir(f"{tok}_{name}")
        stdout, _ = run(["prepare", "--input", inputs, "--out", out, "--tokenizer", tok,
                         "--tokenizer-dir", GPT2_DIR, "--shard-tokens", 7000] + extra)
        check(digest(out, ".bin") == WHOLE_FILE_SHA[tok],
              f"{tok}, {name}: shards identical to the whole-file prepare's")
        check("4 documents" in stdout, f"{tok}, {name}: reports 4 documents: {stdout.strip()}")
    # Document indexes (of the last run; the others' shards are identical).
    shards = sorted(n for n in os.listdir(out) if n.endswith(".bin"))
    stream, starts = [], []
    for n in shards:
        tokens = read_shard(os.path.join(out, n))
        count, rel = read_index(os.path.join(out, n[:-4] + ".idx"))
        check(count == len(tokens), f"{tok}: {n[:-4]}.idx counts {count} tokens of {len(tokens)}")
        starts += [len(stream) + s for s in rel]
        stream += tokens
    sizes = [os.path.getsize(os.path.join(inputs, n)) for n in sorted(os.listdir(inputs))]
    check(len(starts) == 4 and starts[0] == 0, f"{tok}: 4 documents from position 0: {starts}")
    if tok == "gpt2":
        check(all(stream[s] == EOT for s in starts[1:]) and stream.count(EOT) == 3,
              f"{tok}: each later document opens with <|endoftext|>")
    else:
        want = [0]
        for n in sizes[:-1]:
            if n:
                want.append(want[-1] + n)
        check(starts == want[:4], f"byte: documents start at the files' offsets {want[:4]}")
    with open(os.path.join(out, "meta.json")) as f:
        check('"documents": 4' in f.read(), f"{tok}: meta.json counts 4 documents")


# Interrupted and short reads of the inputs: a shim around read(2) for files under READ_FAULTS_UNDER.
SHIM_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static unsigned long calls;

static int faulty(int fd) {
  const char* under = getenv("READ_FAULTS_UNDER");
  char link[64], path[PATH_MAX];
  if (!under) return 0;
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return 0;
  path[n] = 0;
  return strncmp(path, under, strlen(under)) == 0;
}

ssize_t read(int fd, void* buf, size_t count) {
  static ssize_t (*real_read)(int, void*, size_t);
  if (!real_read) real_read = (ssize_t (*)(int, void*, size_t))dlsym(RTLD_NEXT, "read");
  if (count > 0 && faulty(fd)) {
    if (calls++ % 2 == 0) {
      errno = EINTR;
      return -1;
    }
    if (count > 1000) count = 1000;
  }
  return real_read(fd, buf, count);
}
"""
compiler = next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
check(compiler is not None, "a C compiler (cc, gcc or clang) builds the read shim")
shim_c = os.path.join(TMP, "read_faults.c")
shim = os.path.join(TMP, "read_faults.so")
with open(shim_c, "w") as f:
    f.write(SHIM_SOURCE)
subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", shim, shim_c, "-ldl"], check=True)
out = fresh_dir("gpt2_interrupted_reads")
env = dict(os.environ, LD_PRELOAD=shim, READ_FAULTS_UNDER=os.path.realpath(inputs))
run(["prepare", "--input", inputs, "--out", out, "--tokenizer", "gpt2", "--tokenizer-dir",
     GPT2_DIR, "--shard-tokens", 7000, "--chunk-bytes", 4096, "--threads", 2], env=env)
check(digest(out, ".bin") == WHOLE_FILE_SHA["gpt2"],
      "gpt2 with interrupted and short reads: shards identical to the whole-file prepare's")


def peak_rss_mb(args):
    """Runs trellis; returns its peak resident set in MB: the last VmHWM (the kernel's high-water
    mark) read from /proc/PID/status while it runs, polled every 10 ms, and wait4's ru_maxrss (an
    upper bound: after a vfork+exec it also counts this Python's own peak)."""
    with open(os.path.join(TMP, "peak.err"), "w+") as err:
        p = subprocess.Popen([BIN] + [str(a) for a in args], stdout=subprocess.DEVNULL,
                             stderr=err)
        hwm = 0
        while True:
            try:
                with open(f"/proc/{p.pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            hwm = max(hwm, int(line.split()[1]))
            except OSError:
                pass
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.01)
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        check(p.returncode == 0, f"{' '.join(map(str, args))}: exit {p.returncode}: "
              f"{err.read()[-500:]}")
    return hwm / 1024.0, usage.ru_maxrss / 1024.0


def big_text(path, mb):
    """mb MB of text: a 1 MB block of shuffled words, repeated."""
    r = random.Random(3)
    words = ("the quick brown fox jumps over a lazy dog while ranks exchange gradients and "
             "shards map pages").split()
    block = " ".join(r.choice(words) for _ in range(200_000))[: 1 << 20]
    with open(path, "w") as f:
        for _ in range(mb):
            f.write(block)


big = os.path.join(TMP, "big.txt")
big_text(big, 160)
out = fresh_dir("big_byte")
rss, bound = peak_rss_mb(["prepare", "--input", big, "--out", out, "--shard-tokens", 50_000_000])
print(f"byte tokenizer, 160 MB input: peak RSS {rss:.1f} MB (VmHWM; ru_maxrss {bound:.1f} MB)")
check(0 < rss < 48 and bound < 48, f"byte prepare of 160 MB peaks at {rss:.1f} MB (bound 48 MB)")
shards = sorted(n for n in os.listdir(out) if n.endswith(".bin"))
total = sum((os.path.getsize(os.path.join(out, n)) - 1024) // 2 for n in shards)
check(total == 160 << 20, f"all {160 << 20} tokens written ({total})")
fresh_dir("big_byte")  # free the disk

out = fresh_dir("big_gpt2")
rss, bound = peak_rss_mb(["prepare", "--input", big, "--out", out, "--tokenizer", "gpt2",
                          "--tokenizer-dir", GPT2_DIR, "--threads", 2, "--chunk-bytes", 1 << 20])
print(f"gpt2 tokenizer, 160 MB input, 2 threads: peak RSS {rss:.1f} MB (VmHWM; ru_maxrss "
      f"{bound:.1f} MB)")
check(0 < rss < 64 and bound < 64, f"gpt2 prepare of 160 MB peaks at {rss:.1f} MB (bound 64 MB)")
os.remove(big)
fresh_dir("big_gpt2")

# A failure leaves an existing output directory as it was, and creates none.
keep = os.path.join(TMP, "byte_whole")
before = {n: os.path.getmtime(os.path.join(keep, n)) for n in os.listdir(keep)}
unreadable = os.path.join(TMP, "unreadable")
os.makedirs(unreadable, exist_ok=True)
with open(os.path.join(unreadable, "a.txt"), "w") as f:
    f.write("some text " * 100)
os.symlink("/proc/self/mem", os.path.join(unreadable, "b.txt")) if not os.path.exists(
    os.path.join(unreadable, "b.txt")) else None
_, err = run(["prepare", "--input", unreadable, "--out", keep], expect=2)
lines = [l for l in err.splitlines() if l.strip()]
check(len(lines) == 1 and "b.txt" in lines[0], f"one error line naming the input: {lines}")
check({n: os.path.getmtime(os.path.join(keep, n)) for n in os.listdir(keep)} == before,
      "the existing output directory is unchanged")
new_out = os.path.join(TMP, "never_created")
run(["prepare", "--input", unreadable, "--out", new_out], expect=2)
check(not os.path.exists(new_out), "no output directory is created by a failing prepare")
print("streaming prepare: all checks passed")
