"""SentencePiece through libsentencepiece: `trellis prepare --tokenizer sentencepiece` trains a
model (bpe and unigram) on real text, and `trellis tokenize` gives exactly the ids of
python3-sentencepiece's encode on the same tokenizer.model, line by line, over real text (the
licence texts, gettext catalogues in several scripts where the system has them) and generated edge
cases (empty lines, characters the model never saw, very long words, non-Latin scripts, runs of
spaces); `tokenize --decode` gives back each line (and python's decode of the ids). Training is
deterministic (twice the same bytes, also when it samples lines), and a model trellis did not train
(NFKC normalisation, no byte fallback: unknown characters become <unk>) is used as given by
--tokenizer-model."""
import gettext
import glob
import io
import json
import os
import random
import subprocess

import sentencepiece as spm

from trellis_test import BIN, TMP, check, fail, fresh_dir, run

LICENCES = "/usr/share/common-licenses"


def licence_lines():
    lines = []
    for path in sorted(glob.glob(os.path.join(LICENCES, "*"))):
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                lines += [line.rstrip("\r") for line in f.read().split("\n")]
    return lines


def catalogue_lines(limit=3000):
    """Translated strings of the system's gettext catalogues (German, Russian, Greek, Arabic,
    Japanese, Chinese), when they are installed."""
    lines = []
    for lang in ("de", "ru", "el", "ar", "ja", "zh_CN"):
        for path in sorted(glob.glob(f"/usr/share/locale/{lang}/LC_MESSAGES/*.mo"))[:3]:
            try:
                with open(path, "rb") as f:
                    catalog = gettext.GNUTranslations(f)._catalog
            except Exception:
                continue
            for v in catalog.values():
                lines += [s.rstrip("\r") for s in str(v).split("\n") if s.strip()][:2]
    return lines[:limit]


def edge_cases():
    r = random.Random(5)
    letters = "abcdefghijklmnopqrstuvwxyzäöüß"
    cases = [
        "", "", " ", "  ", "\t", "a", "Hello world", "  leading and trailing  ",
        "double  spaces   and    more", "tab\tinside\ttext",
        "Emoji 😀👍🏽 and a family 👨‍👩‍👧 with joiners",
        "漢字かなカナ 한국어 中文的句子。",
        "مرحبا بالعالم — نص عربي", "Привет, мир! Съешь же ещё этих мягких булок",
        "Καλημέρα κόσμε, ξεσκεπάζω την ψυχοφθόρα βδελυγμία", "עברית ודיקריטים",
        "हिन्दी देवनागरी", "ไทย ภาษา", "combining e\u0301 and n\u0303", "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ",
        "nbsp\u00a0here", "zero\u200bwidth", "control \x01\x02 bytes", "BOM \ufeff inside",
        "x" * 5000, "Donaudampfschifffahrtsgesellschaftskapitän" * 40,
        "".join(r.choice(letters) for _ in range(3000)),
        " ".join("".join(r.choice(letters) for _ in range(r.randint(1, 30))) for _ in range(300)),
        "1234567890 3.14159 1e-5 0x7f", "<s> </s> <unk> <0x0A> are plain text here", "a ▁ mark",
        "".join(chr(r.randint(0x4E00, 0x9FFF)) for _ in range(200)),
    ]
    return cases


def tokenize(args):
    """trellis tokenize's output lines, read as UTF-8 whatever the locale."""
    p = subprocess.run([BIN, "tokenize"] + [str(a) for a in args], capture_output=True)
    if p.returncode != 0:
        fail(f"tokenize {args}: exit {p.returncode}: {p.stderr.decode(errors='replace')[-2000:]}")
    return p.stdout.decode("utf-8").split("\n")[:-1]


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(line + "\n" for line in lines))


def compare(name, model_path, ids_owner, lines, inputs, exact_text):
    """tokenize (and tokenize --decode) through `ids_owner` (["--data", DIR] or
    ["--checkpoint", DIR]) against python3-sentencepiece on model_path."""
    sp = spm.SentencePieceProcessor(model_file=model_path)
    path = os.path.join(inputs, f"{name}.txt")
    write_lines(path, lines)
    got = [json.loads(line) for line in tokenize(ids_owner + ["--input", path])]
    want = [sp.encode(line) for line in lines]
    check(len(got) == len(lines), f"{name}: one array per line ({len(got)} of {len(lines)})")
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    check(not bad, f"{name}: ids equal python3-sentencepiece's on all {len(lines)} lines"
          + (f" (first difference: line {bad[0] + 1} {lines[bad[0]][:60]!r}: {got[bad[0]][:12]} vs "
             f"{want[bad[0]][:12]})" if bad else ""))
    ids_path = os.path.join(inputs, f"{name}.ids")
    write_lines(ids_path, [json.dumps(w) for w in want])
    decoded = tokenize(["--decode"] + ids_owner + ["--input", ids_path])
    check(decoded == [sp.decode(w) for w in want], f"{name}: decode equals python's decode")
    if exact_text:
        # (U+2581, SentencePiece's mark of a space, comes back as a space.)
        lost = [i for i, (d, line) in enumerate(zip(decoded, lines))
                if d != line and "\u2581" not in line]
        check(not lost, f"{name}: decode(encode(line)) == line for every line" +
              (f" (not line {lost[0] + 1}: {lines[lost[0]][:60]!r})" if lost else ""))
    return got


inputs = fresh_dir("inputs")
real = licence_lines()
mo = catalogue_lines()
edges = edge_cases()
print(f"lines: {len(real)} of licence text, {len(mo)} of gettext catalogues, {len(edges)} edge cases")
check(len(real) > 1000, f"{LICENCES} holds real text ({len(real)} lines)")
corpus = os.path.join(inputs, "corpus")
os.makedirs(corpus)
write_lines(os.path.join(corpus, "licences.txt"), real)
write_lines(os.path.join(corpus, "catalogues.txt"), mo)

# The catalogues' ~1,000 characters (CJK) need a larger vocabulary, or the rarest of them spelt in
# bytes (0.9995 of the characters covered).
train = ["--tokenizer", "sentencepiece", "--sp-character-coverage", 0.9995]
for sp_type, vocab in (("bpe", 1500), ("unigram", 1300)):
    data = os.path.join(TMP, f"data_{sp_type}")
    # Small chunks on 2 threads: cut after newlines, they encode as the whole text would.
    run(["prepare", "--input", corpus, "--out", data, "--vocab-size", vocab, "--sp-type", sp_type,
         "--chunk-bytes", 4096, "--threads", 2] + train)
    with open(os.path.join(data, "meta.json")) as f:
        meta = json.load(f)
    model = os.path.join(data, "tokenizer.model")
    sp = spm.SentencePieceProcessor(model_file=model)
    check(meta["tokenizer"] == "sentencepiece" and meta["vocab_size"] == vocab ==
          sp.get_piece_size(), f"{sp_type}: meta.json and tokenizer.model say {vocab} pieces")
    check(sp.unk_id() == 0 and sp.bos_id() == 1 and sp.eos_id() == 2 and
          sp.piece_to_id("<0x0A>") == 3 + 0x0A and sp.is_byte(3 + 0x0A),
          f"{sp_type}: <unk> <s> </s> then the 256 byte pieces")

    compare(f"{sp_type}_licences", model, ["--data", data], real, inputs, True)
    if mo:
        compare(f"{sp_type}_catalogues", model, ["--data", data], mo, inputs, True)
    got = compare(f"{sp_type}_edges", model, ["--data", data], edges, inputs, True)
    check(got[0] == [] and got[1] == [], f"{sp_type}: an empty line is []")
    emoji = got[10]
    check(any(3 <= t < 3 + 256 for t in emoji) and 0 not in emoji,
          f"{sp_type}: unseen characters (emoji) are spelt in byte pieces, never <unk>")

    # The shards are the text encoded line by line, lines joined by the newline's byte piece and
    # documents (files) by </s>: the same ids python gives (whatever the chunks and threads).
    shard = os.path.join(data, "train_000000.bin")
    with open(shard, "rb") as f:
        blob = f.read()
    import numpy as np
    header = np.frombuffer(blob[:1024], dtype=np.int32)
    tokens = np.frombuffer(blob[1024:], dtype=np.uint16 if header[1] == 1 else np.uint32)
    want = []
    for k, name in enumerate(("catalogues.txt", "licences.txt")):  # sorted by name
        with open(os.path.join(corpus, name), encoding="utf-8") as f:
            text = f.read()
        if not text:  # an empty file is no document
            continue
        text_lines = text.split("\n")
        if want:
            want.append(sp.eos_id())
        for i, line in enumerate(text_lines):
            want += sp.encode(line)
            if i + 1 < len(text_lines):
                want.append(sp.piece_to_id("<0x0A>"))
    check(tokens.tolist() == want[:len(tokens)] and len(tokens) == header[2],
          f"{sp_type}: the train shard's {len(tokens)} tokens are python's ids of the text")

    # Deterministic: the same input, the same model; also when the trainer samples lines.
    again = os.path.join(TMP, f"data_{sp_type}_again")
    run(["prepare", "--input", corpus, "--out", again, "--vocab-size", vocab, "--sp-type", sp_type]
        + train)
    with open(model, "rb") as a, open(os.path.join(again, "tokenizer.model"), "rb") as b:
        check(a.read() == b.read(), f"{sp_type}: training twice gives the same tokenizer.model")
    sampled = []
    for k in range(2):
        d = os.path.join(TMP, f"data_{sp_type}_sampled{k}")
        run(["prepare", "--input", corpus, "--out", d, "--vocab-size", vocab, "--sp-type", sp_type,
             "--sp-sentences", 2000] + train)
        with open(os.path.join(d, "tokenizer.model"), "rb") as f:
            sampled.append(f.read())
    with open(model, "rb") as f:
        whole = f.read()
    check(sampled[0] == sampled[1] and sampled[0] != whole,
          f"{sp_type}: a sample of 2000 lines is drawn the same way twice (and differs from all)")

# A model trellis did not train, used as given: SentencePiece's defaults (NFKC normalisation,
# whitespace collapsed, no byte fallback: unknown characters are <unk>).
foreign = os.path.join(inputs, "foreign.model")
blob = io.BytesIO()
spm.SentencePieceTrainer.train(sentence_iterator=iter(real), model_writer=blob, vocab_size=500,
                               minloglevel=2, num_threads=1)
with open(foreign, "wb") as f:
    f.write(blob.getvalue())
data = os.path.join(TMP, "data_foreign")
run(["prepare", "--input", corpus, "--out", data, "--tokenizer-model", foreign])
with open(os.path.join(data, "tokenizer.model"), "rb") as f:
    check(f.read() == blob.getvalue(), "--tokenizer-model: the given model is copied as it is")
got = compare("foreign_edges", foreign, ["--data", data], edges, inputs, False)
check(0 in got[11], "foreign model: characters it never saw are <unk> (id 0), as python says")
