"""Shared helpers of the script tests (run by ctest with TRELLIS_BIN / TRELLIS_TMP set)."""
import json
import os
import shutil
import subprocess
import sys

BIN = os.environ.get("TRELLIS_BIN", os.path.join(os.path.dirname(__file__), "..", "build", "trellis"))
TMP = os.environ.get("TRELLIS_TMP", "/tmp/trellis-test")
SOURCE = os.environ.get("TRELLIS_SOURCE", os.path.join(os.path.dirname(__file__), ".."))


def fresh_dir(name):
    path = os.path.join(TMP, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def run(args, expect=0, timeout=600, env=None):
    """Runs trellis with args; checks the exit code; returns (stdout, stderr)."""
    cmd = [BIN] + [str(a) for a in args]
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


def check(cond, msg):
    if not cond:
        fail(msg)
    print(f"ok: {msg}")


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)
