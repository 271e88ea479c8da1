"""`trellis prepare --task classify|translate`: every input format end to end (the written examples
decoded and compared with what the inputs say), and each kind of bad input: exit code 2, one line
naming the file and line, no output directory left behind."""
import glob
import gettext
import gzip
import json
import os
import shutil
import struct
import subprocess

from trellis_test import TMP, check, expect_error, fail, fresh_dir, read_examples, run

SPECIAL = 256  # the byte tokenizer's special token


def load(out):
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    return (meta, read_examples(os.path.join(out, "train.examples")),
            read_examples(os.path.join(out, "val.examples")))


def text(tokens):
    return bytes(tokens).decode("utf-8")


def write(path, content, mode="w"):
    with open(path, mode) as f:
        f.write(content)
    return path


def prepare(args, out):
    return run(["prepare", "--out", out] + args, timeout=300)[0]


def check_byte_meta(meta, task):
    check(meta["task"] == task and meta["tokenizer"] == "byte" and meta["vocab_size"] == 257 and
          meta["special_token"] == SPECIAL, f"{task}: byte tokenizer meta {meta}")


def check_counts(meta, train, val):
    check(meta["train_examples"] == len(train) and meta["val_examples"] == len(val),
          f"meta counts {meta['train_examples']}/{meta['val_examples']} match the files")
    longest = max(len(s) for _, s, _ in train + val)
    check(meta["max_source_len"] == longest, f"max_source_len {meta['max_source_len']} = longest")


shutil.rmtree(TMP, ignore_errors=True)  # outputs of an earlier run would be replaced or refused
src = fresh_dir("inputs")

# ---- TSV (SST-2 layout): stratified held-out split, seeded, input order kept ----
rows = [(f"sentence number {i} is {'good' if i % 4 == 0 else 'bad'}", "1" if i % 4 == 0 else "0")
        for i in range(40)]
tsv = write(os.path.join(src, "sst2.tsv"),
            "sentence\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in rows))
out = os.path.join(TMP, "tsv")
stdout = prepare(["--task", "classify", "--input", tsv, "--val-fraction", 0.25], out)
meta, train, val = load(out)
check_byte_meta(meta, "classify")
check(meta["classes"] == ["0", "1"] and meta["val_split"] == "val", f"classes {meta['classes']}")
check_counts(meta, train, val)
got = sorted((text(s), meta["classes"][l]) for l, s, t in train + val)
check(got == sorted(rows) and all(t == [] for _, _, t in train + val),
      "tsv: train + val hold exactly the input rows, byte tokens, no target")
val_by_class = [sum(1 for l, _, _ in val if l == c) for c in range(2)]
check(val_by_class == [8, 3], f"tsv: val per class is round(0.25 * 30, 0.25 * 10): {val_by_class}")
order = [rows.index((text(s), meta["classes"][l])) for l, s, _ in train]
check(order == sorted(order), "tsv: train keeps the input order")
check(f"{len(train)} train, {len(val)} val examples" in stdout, f"summary: {stdout.splitlines()[0]}")
again = os.path.join(TMP, "tsv_again")
prepare(["--task", "classify", "--input", tsv, "--val-fraction", 0.25], again)
check(load(again)[2] == val, "tsv: same seed, same validation set")
other = os.path.join(TMP, "tsv_seed")
prepare(["--task", "classify", "--input", tsv, "--val-fraction", 0.25, "--seed", 7], other)
check(load(other)[2] != val, "tsv: another --seed, another validation set")
# Preparing again into an existing task directory replaces it.
prepare(["--task", "classify", "--input", tsv, "--val-fraction", 0.5], again)
check(len(load(again)[2]) == 20, "an existing task directory is replaced")

# ---- CSV (IMDB layout): RFC 4180 quoting, explicit validation file ----
reviews = [("A film, with \"quotes\" and commas.", "positive"),
           ("Two\nlines, one review", "negative"),
           ("plain", "negative"),
           ("Ümlaut ok", "positive")]


def csv_quote(s):
    return '"' + s.replace('"', '""') + '"'


csv = write(os.path.join(src, "imdb.csv"),
            "review,sentiment\r\n" + "".join(f"{csv_quote(t)},{l}\r\n" for t, l in reviews))
csv_val = write(os.path.join(src, "imdb_val.csv"), 'review,sentiment\n"so-so, really",negative\n')
out = os.path.join(TMP, "csv")
prepare(["--task", "classify", "--input", csv, "--val-input", csv_val], out)
meta, train, val = load(out)
check(meta["classes"] == ["negative", "positive"], f"csv: string classes sorted {meta['classes']}")
check([(text(s), meta["classes"][l]) for l, s, _ in train] == reviews,
      "csv: quoted commas, quotes, newlines decode exactly, in order")
check([(text(s), l) for l, s, _ in val] == [("so-so, really", 0)], "csv: --val-input is val")

# ---- JSONL: integer labels in numeric order, chosen columns ----
items = [("one", 1), ("ten", 10), ("two", 2), ("zero", 0), ("ten again", 10), ("one again", 1),
         ("two again", 2), ("zero again", 0)]
jsonl = write(os.path.join(src, "data.jsonl"),
              "".join(json.dumps({"body": t, "y": l, "id": i}) + "\n"
                      for i, (t, l) in enumerate(items)))
out = os.path.join(TMP, "jsonl")
prepare(["--task", "classify", "--input", jsonl, "--text-column", "body", "--label-column", "y",
         "--val-fraction", 0.5], out)
meta, train, val = load(out)
check(meta["classes"] == ["0", "1", "2", "10"], f"jsonl: numeric class order {meta['classes']}")
check(sorted((text(s), int(meta["classes"][l])) for l, s, _ in train + val) == sorted(items),
      "jsonl: texts and labels")
check(sorted(l for l, _, _ in val) == [0, 1, 2, 3], "jsonl: one of each class held out")

# ---- translation: .po, the same catalogue compiled by msgfmt, TSV ----
po = write(os.path.join(src, "de.po"), r'''# German
msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\n"

msgid "Hello"
msgstr "Hallo"

msgctxt "menu"
msgid ""
"Open "
"file"
msgstr "Datei \"öffnen\" \\ jetzt"

#, fuzzy
msgid "Maybe"
msgstr "Vielleicht"

msgid "one file"
msgid_plural "%d files"
msgstr[0] "eine Datei"
msgstr[1] "%d Dateien"

msgid "Nothing yet"
msgstr ""

msgid "Yes\tno"
msgstr "Ja\tnein"

msgid "Goodbye"
msgstr "Auf Wiedersehen"
''')
pairs = {("Hello", "Hallo"), ("Open file", 'Datei "öffnen" \\ jetzt'), ("Yes\tno", "Ja\tnein"),
         ("Goodbye", "Auf Wiedersehen")}


def decoded_pairs(train, val):
    return {(text(s), text(t)) for _, s, t in train + val}


out = os.path.join(TMP, "po")
stdout = prepare(["--task", "translate", "--input", po], out)
meta, train, val = load(out)
check_byte_meta(meta, "translate")
check(decoded_pairs(train, val) == pairs and len(train) == 3 and len(val) == 1,
      f"po: the 4 translated pairs, 1 held out: {decoded_pairs(train, val)}")
check(all(l == -1 for l, _, _ in train + val), "po: translation labels are -1")
check(meta["max_target_len"] == max(len(t) for _, _, t in train + val), "po: max_target_len")
check("skipped: 1 fuzzy, 1 header, 1 plural, 1 untranslated" in stdout,
      f"po: skip counts reported: {stdout.strip().splitlines()[-1]}")
mo = os.path.join(src, "de.mo")
subprocess.run(["msgfmt", "-o", mo, po], check=True)
out = os.path.join(TMP, "mo")
stdout = prepare(["--task", "translate", "--input", mo], out)
meta, train, val = load(out)
check(decoded_pairs(train, val) == pairs, "mo (msgfmt): the same pairs as the .po")
check("1 header" in stdout and "1 plural" in stdout, f"mo: skips {stdout.strip().splitlines()[-1]}")
ptsv = write(os.path.join(src, "pairs.tsv"), "hello\thallo\r\ncat\tKatze\n\nyes\tja\n")
out = os.path.join(TMP, "ptsv")
prepare(["--task", "translate", "--input", ptsv, "--val-input", ptsv], out)
meta, train, val = load(out)
check([(text(s), text(t)) for _, s, t in train] == [("hello", "hallo"), ("cat", "Katze"),
                                                     ("yes", "ja")], "tsv pairs in order, \\r gone")

# A real system catalogue, checked against Python's own .mo reader.
catalogues = sorted(glob.glob("/usr/share/locale/de/LC_MESSAGES/*.mo"))
if not catalogues:
    fail("no /usr/share/locale/de/LC_MESSAGES/*.mo on this machine: install a package with "
         "German messages (e.g. coreutils' locales), this test needs one")
real = max(catalogues[:20], key=os.path.getsize)
with open(real, "rb") as f:
    catalog = gettext.GNUTranslations(f)._catalog
expected = set()
for k, v in catalog.items():
    if isinstance(k, tuple) or k == "" or v == "":
        continue
    src_text = k.split("\x04")[-1]
    if max(len(src_text.encode()), len(v.encode())) <= 127:
        expected.add((src_text, v))
out = os.path.join(TMP, "real_mo")
stdout = prepare(["--task", "translate", "--input", real, "--max-len", 128, "--skip-long"], out)
meta, train, val = load(out)
check(decoded_pairs(train, val) == expected,
      f"{os.path.basename(real)}: {len(expected)} pairs match Python's gettext reader")
check(meta["max_source_len"] <= 127 and meta["max_target_len"] <= 127, "--skip-long kept <= 127")

# ---- idx images: a small gzipped directory ----
def idx_images(images, rows, cols):
    return struct.pack(">IIII", 0x803, len(images), rows, cols) + b"".join(bytes(i) for i in images)


def idx_labels(labels):
    return struct.pack(">II", 0x801, len(labels)) + bytes(labels)


def write_idx(d, train_images, train_labels, test_images, test_labels, rows, cols):
    for name, blob in (("train-images-idx3-ubyte", idx_images(train_images, rows, cols)),
                       ("train-labels-idx1-ubyte", idx_labels(train_labels)),
                       ("t10k-images-idx3-ubyte", idx_images(test_images, rows, cols)),
                       ("t10k-labels-idx1-ubyte", idx_labels(test_labels))):
        with gzip.open(os.path.join(d, name + ".gz"), "wb") as f:
            f.write(blob)


def patches(img, rows, cols, ph, pw):
    return [img[(pr + y) * cols + pc + x] for pr in range(0, rows, ph)
            for pc in range(0, cols, pw) for y in range(ph) for x in range(pw)]


R, C = 4, 6
train_imgs = [[(k * 37 + p * 11) % 256 for p in range(R * C)] for k in range(12)]
test_imgs = [[(k * 53 + p * 7) % 256 for p in range(R * C)] for k in range(5)]
train_labels = [k % 3 for k in range(12)]
test_labels = [2, 1, 0, 2, 1]
idx = fresh_dir("idx_in")
write_idx(idx, train_imgs, train_labels, test_imgs, test_labels, R, C)
out = os.path.join(TMP, "idx")
stdout = prepare(["--task", "classify", "--input", idx, "--patch", "2x3",
                  "--class-names", "shirt,shoe,bag"], out)
meta, train, val = load(out)
check(meta["feature_dim"] == 6 and meta["val_split"] == "test" and
      meta["classes"] == ["shirt", "shoe", "bag"] and meta["max_source_len"] == 4,
      f"idx: meta {meta}")
check([(l, s) for l, s, _ in train] ==
      [(l, patches(i, R, C, 2, 3)) for l, i in zip(train_labels, train_imgs)],
      "idx: train = train-* images as 2x3 patches in row-major order, labels kept")
check([(l, s) for l, s, _ in val] ==
      [(l, patches(i, R, C, 2, 3)) for l, i in zip(test_labels, test_imgs)], "idx: val = t10k-*")
out = os.path.join(TMP, "idx_rows")
prepare(["--task", "classify", "--input", idx, "--patch", "1x6"], out)
meta, train, _ = load(out)
check(meta["feature_dim"] == 6 and meta["max_source_len"] == 4 and meta["classes"] == ["0", "1", "2"]
      and train[1][1] == train_imgs[1], "idx: --patch 1x6 = rows; default class names")

fashion = "/usr/share/datasets/fashion-mnist"
if not os.path.isdir(fashion):
    fail(f"{fashion} missing: install dataset-fashion-mnist (scripts/setup.sh --tests)")
out = os.path.join(TMP, "fashion")
names = "T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot"
stdout = prepare(["--task", "classify", "--input", fashion, "--patch", 7, "--class-names", names], out)
with open(os.path.join(out, "meta.json")) as f:
    meta = json.load(f)
check(meta["train_examples"] == 60000 and meta["val_examples"] == 10000 and
      meta["feature_dim"] == 49 and meta["max_source_len"] == 16 and len(meta["classes"]) == 10,
      "Fashion-MNIST: 60000 train, 10000 test images of 16 7x7 patches")
with gzip.open(os.path.join(fashion, "t10k-images-idx3-ubyte.gz"), "rb") as f:
    first = f.read(16 + 784)[16:]
with gzip.open(os.path.join(fashion, "t10k-labels-idx1-ubyte.gz"), "rb") as f:
    first_label = f.read(9)[8]
with open(os.path.join(out, "val.examples"), "rb") as f:
    head = f.read(24 + 4)
    n = struct.unpack_from("<Q", head, 16)[0]
    f.seek(24 + 20 * n)
    values = f.read(784)
check(head[24:28] == struct.pack("<i", first_label) and list(values) == patches(first, 28, 28, 7, 7),
      "Fashion-MNIST: the first test image, patched, and its label")

# ---- lm stays as it was ----
out = fresh_dir("lm")
run(["prepare", "--input", write(os.path.join(src, "c.txt"), "hello world " * 50), "--out", out])
check(os.path.exists(os.path.join(out, "train_000000.bin")), "--task lm (default) writes shards")

help_text, _ = run(["prepare", "--help"])
max_len_help = " ".join(help_text[help_text.index("--max-len"):].split()[:40])
check("refused" in max_len_help and "not truncated" in max_len_help, "--max-len --help: refused")
check("--skip-long" in help_text, "--skip-long documented")


# ---- bad input: exit 2, one line naming the file (and line), nothing written ----
def prepare_refused(args, out, *needles):
    expect_error(["prepare", "--out", out] + list(args), *needles)
    parent = os.path.dirname(out)
    debris = [p for p in os.listdir(parent) if p.startswith(os.path.basename(out) + ".")]
    check(not os.path.exists(out) and not debris, f"{os.path.basename(out)}: nothing written")


bad = fresh_dir("bad")
outs = fresh_dir("bad_out")
f = write(os.path.join(bad, "nolabel.tsv"), "sentence\tlabel\nfine\t1\nno label here\t\nok\t0\n")
prepare_refused(["--task", "classify", "--input", f], os.path.join(outs, "a"),
                f"{f}:3:", "no label")
f = write(os.path.join(bad, "nocolumn.tsv"), "sentence\tlabel\nfine\t1\nonly text\n")
prepare_refused(["--task", "classify", "--input", f], os.path.join(outs, "b"),
                f"{f}:3:", "no label")
f = write(os.path.join(bad, "nolabel.jsonl"), '{"text": "a", "label": 1}\n{"text": "b"}\n')
prepare_refused(["--task", "classify", "--input", f], os.path.join(outs, "c"),
                f"{f}:2:", "no label")
f = write(os.path.join(bad, "empty.csv"), 'review,sentiment\n"",positive\nok,negative\n')
prepare_refused(["--task", "classify", "--input", f], os.path.join(outs, "d"),
                f"{f}:2:", "empty text")
f = write(os.path.join(bad, "quote.csv"), 'review,sentiment\nok,positive\n"never closed,neg\nx,y\n')
prepare_refused(["--task", "classify", "--input", f], os.path.join(outs, "e"), f"{f}:3:",
                "unterminated")
v = write(os.path.join(bad, "val.tsv"), "sentence\tlabel\nseen\t0\nunseen\t7\n")
prepare_refused(["--task", "classify", "--input", tsv, "--val-input", v], os.path.join(outs, "f"),
                f"{v}:3:", "label '7' never appears in the training data")
f = write(os.path.join(bad, "bad.mo"), "msgid \"a\"\nmsgstr \"b\"\n")
prepare_refused(["--task", "translate", "--input", f], os.path.join(outs, "g"),
                f"{f}: bad magic 0x", "not a gettext .mo file")
f = write(os.path.join(bad, "long.tsv"), "short\tkurz\nshort again\t" + "x" * 20 + "\n")
prepare_refused(["--task", "translate", "--input", f, "--max-len", 16], os.path.join(outs, "h"),
                f"{f}:2: the pair's target has 20 tokens, more than --max-len 16 allows "
                "(15 plus the end token)")
ok = os.path.join(TMP, "skip_long")
stdout = prepare(["--task", "translate", "--input", f, "--max-len", 16, "--skip-long",
                  "--val-input", ptsv], ok)
check(len(load(ok)[1]) == 1 and "1 longer than --max-len" in stdout,
      "--skip-long skips and counts the long pair")
f = write(os.path.join(bad, "tabs.tsv"), "a\tb\nno tab at all\n")
prepare_refused(["--task", "translate", "--input", f], os.path.join(outs, "i"), f"{f}:2:", "tab")
prepare_refused(["--task", "classify", "--input", idx, "--patch", 4], os.path.join(outs, "j"),
                "--patch 4x4", "4x6")
bad_idx = fresh_dir("bad_idx")
write_idx(bad_idx, train_imgs, train_labels, test_imgs, test_labels, R, C)
with gzip.open(os.path.join(bad_idx, "t10k-labels-idx1-ubyte.gz"), "wb") as g:
    g.write(struct.pack(">II", 0x803, 5) + bytes(5))
prepare_refused(["--task", "classify", "--input", bad_idx], os.path.join(outs, "k"),
                "t10k-labels-idx1-ubyte.gz", "bad magic")
prepare_refused(["--task", "classify", "--input", tsv, "--max-len", 8], os.path.join(outs, "l"),
                "--max-len")
# A failed prepare into an existing task directory leaves it as it was.
before = {n: open(os.path.join(again, n), "rb").read() for n in os.listdir(again)}
f = write(os.path.join(bad, "late.tsv"), "sentence\tlabel\n" + "ok\t1\n" * 50 + "late\t\n")
_, err = run(["prepare", "--task", "classify", "--input", f, "--out", again], expect=2)
check(f"{f}:52:" in err, "error at the last row")
after = {n: open(os.path.join(again, n), "rb").read() for n in os.listdir(again)}
check(before == after, "a failed prepare leaves the existing directory untouched")
