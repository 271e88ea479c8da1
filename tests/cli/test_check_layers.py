"""scripts/check_layers.py (ctest layers.check) can fail: on a copy of the tree with one upward
include planted, it exits non-zero naming the file, line and both folders; the unplanted copy
passes, so the planted line is what it caught."""
import os
import shutil
import subprocess
import sys

from trellis_test import check, fresh_dir, SOURCE

tree = fresh_dir("layers_tree")
for part in ("scripts/check_layers.py", "cmake/layers.cmake"):
    os.makedirs(os.path.join(tree, os.path.dirname(part)), exist_ok=True)
    shutil.copy(os.path.join(SOURCE, part), os.path.join(tree, part))
shutil.copytree(os.path.join(SOURCE, "src", "trellis"), os.path.join(tree, "src", "trellis"))
script = os.path.join(tree, "scripts", "check_layers.py")

clean = subprocess.run([sys.executable, script], capture_output=True, text=True)
check(clean.returncode == 0, f"the copied tree passes: {clean.stdout}{clean.stderr}")

planted = os.path.join(tree, "src", "trellis", "model", "config.cpp")
with open(planted) as f:
    lines = f.read().split("\n")
lines.insert(1, '#include "trellis/train/trainer.h"')
with open(planted, "w") as f:
    f.write("\n".join(lines))
bad = subprocess.run([sys.executable, script], capture_output=True, text=True)
out = bad.stdout + bad.stderr
check(bad.returncode != 0, "an upward include fails the check")
check("src/trellis/model/config.cpp:2" in out and "trellis/train/trainer.h" in out and
      "train is above model" in out, f"the message names file:line and both folders: {out}")
