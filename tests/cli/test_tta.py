"""Test-time augmentation of image classifiers (`eval --tta flip`), on tiny idx images (8x12
pixels in 4x3 patches: noise and a bright band whose place is the class, left, right or middle)
prepared with `prepare --task classify`, and classifiers trained on them without augmentation:

- it mirrors what the test writes itself: the test mirrors the idx test images in Python, and
  `--tta flip` on the mirrored directory gives exactly the metrics it gives on the original (each
  image is classified with its mirror either way), while plain `eval` differs between the two;
- it averages probabilities: its loss is below the mean of the two plain losses (the log of a
  mean is above the mean of the logs), and it differs from the plain loss;
- it composes with an ensemble (two checkpoints, each with its mirror);
- bad values exit 2 naming --tta: an unknown augmentation, text classification and translation
  data, a token shard, an image directory prepared without its image sizes."""
import gzip
import json
import os
import random
import shutil
import struct

from trellis_test import TMP, check, fresh_dir, prepare_task_dirs, run, write_text_corpus

ROWS, COLS = 8, 12


def write_images(d, n_train, n_test, seed=3):
    """An idx image directory whose classes a model can learn and a mirror changes: noise, and a
    bright band at the left (class 0), the right (class 1) or the middle (class 2)."""
    r = random.Random(seed)

    def image(label):
        band = {0: range(0, 3), 1: range(COLS - 3, COLS), 2: range(5, 7)}[label]
        return bytes(200 + r.randrange(56) if x in band else r.randrange(100)
                     for y in range(ROWS) for x in range(COLS))

    os.makedirs(d, exist_ok=True)
    for split, n in (("train", n_train), ("t10k", n_test)):
        labels = [k % 3 for k in range(n)]
        blobs = {f"{split}-images-idx3-ubyte": struct.pack(">IIII", 0x803, n, ROWS, COLS) +
                 b"".join(image(y) for y in labels),
                 f"{split}-labels-idx1-ubyte": struct.pack(">II", 0x801, n) + bytes(labels)}
        for name, blob in blobs.items():
            with gzip.open(os.path.join(d, name + ".gz"), "wb") as f:
                f.write(blob)


idx = os.path.join(fresh_dir("idx"), "images")
write_images(idx, n_train=48, n_test=15)


def mirror_idx(src, dst):
    """dst: src with every test image mirrored left to right (training images as they are)."""
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        with gzip.open(os.path.join(src, name), "rb") as f:
            blob = f.read()
        if name.startswith("t10k-images"):
            magic, n, rows, cols = struct.unpack(">IIII", blob[:16])
            pixels = blob[16:]
            out = bytearray()
            for k in range(n):
                img = pixels[k * rows * cols:(k + 1) * rows * cols]
                for y in range(rows):
                    out += bytes(reversed(img[y * cols:(y + 1) * cols]))
            blob = blob[:16] + bytes(out)
        with gzip.open(os.path.join(dst, name), "wb") as f:
            f.write(blob)


mirrored_idx = os.path.join(fresh_dir("idx_mirrored"), "images")
mirror_idx(idx, mirrored_idx)
img, img_m = os.path.join(TMP, "img"), os.path.join(TMP, "img_mirrored")
for src, dst in ((idx, img), (mirrored_idx, img_m)):
    run(["prepare", "--task", "classify", "--input", src, "--out", dst, "--patch", "4x3"])


def train(name, seed):
    out = fresh_dir(name)
    run(["train", "--model", "encoder-tiny", "--n-embd", 32, "--data", img, "--batch-size", 8,
         "--steps", 30, "--lr", 3e-3, "--warmup-steps", 3, "--seed", seed, "--threads", 1,
         "--val-every", 0, "--quiet", "--tensorboard", "false", "--out", out])
    return os.path.join(out, "step_00000030")


ck, ck2 = train("tta_a", 1), train("tta_b", 2)


def evaluate(data, checkpoints, *extra):
    out, _ = run(["eval", "--checkpoint", *checkpoints, "--data", data, "--batch-size", 5,
                  "--threads", 1, *extra])
    return json.loads(out.strip().splitlines()[-1])


plain, plain_m = evaluate(img, [ck]), evaluate(img_m, [ck])
tta, tta_m = evaluate(img, [ck], "--tta", "flip"), evaluate(img_m, [ck], "--tta", "flip")
check(tta["examples"] == 15 and tta.get("tta") == "flip", f"eval --tta flip reports it ({tta})")
check(plain["accuracy"] >= 0.8 and plain_m["accuracy"] <= 0.5,
      f"the classifier learnt the band's place: accuracy {plain['accuracy']} on the images, "
      f"{plain_m['accuracy']} on their mirrors (left and right swapped)")
check(tta == tta_m,
      f"--tta flip: the same metrics on the images and on their mirrors ({tta} vs {tta_m})")
check(tta["loss"] != plain["loss"], "--tta flip changes the loss")
check(tta["loss"] < (plain["loss"] + plain_m["loss"]) / 2,
      f"--tta flip averages probabilities: loss {tta['loss']:.6f} below the plain losses' mean "
      f"{(plain['loss'] + plain_m['loss']) / 2:.6f}")

both, both_m = (evaluate(d, [ck, ck2], "--tta", "flip") for d in (img, img_m))
check(both["members"] == 2 and both == both_m and both["loss"] != tta["loss"],
      f"an ensemble of two, each with its mirror ({both} vs {both_m})")

cls_dir, mt_dir = prepare_task_dirs()
old = fresh_dir("img_old")  # prepared before meta.json recorded the image sizes
for name in ("train.examples", "val.examples"):
    shutil.copy(os.path.join(img, name), old)
with open(os.path.join(img, "meta.json")) as f:
    meta = json.load(f)
del meta["image"]
with open(os.path.join(old, "meta.json"), "w") as f:
    json.dump(meta, f)
corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"), n_lines=50)
tokens = os.path.join(TMP, "tokens")
run(["prepare", "--input", corpus, "--out", tokens])
bad = {
    "token shard": ([os.path.join(tokens, "val_000000.bin"), "--tta", "flip"], "token shard"),
    "old task directory": ([old, "--tta", "flip"], "prepare the data again"),
    "unknown augmentation": ([img, "--tta", "rotate"], "unknown test-time augmentation"),
    "text data": ([cls_dir, "--tta", "flip"], "mirrors images"),
    "translation data": ([mt_dir, "--tta", "flip"], "mirrors images"),
}
for what, (extra, needle) in bad.items():
    _, err = run(["eval", "--checkpoint", ck, "--data"] + extra, expect=2)
    line = err.strip()
    check("--tta" in line and needle in line and len(line.splitlines()) == 1,
          f"{what}: exit 2 naming --tta ({line})")
print("ok: eval --tta flip")
