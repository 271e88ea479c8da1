#!/usr/bin/env python3
"""Baselines a task model must beat, on the same task directory and split it is evaluated on.

  classify DIR:  majority class, a bag-of-words multinomial Naive Bayes (add-one smoothing)
                 over the examples' tokens (bytes or GPT-2 BPE ids, as prepared), and one over
                 the character 1-5-grams of the texts the tokens decode to (byte or GPT-2
                 data; add-0.1 smoothing), trained on train.examples, scored on val.examples
                 (accuracy and macro-F1).
  translate DIR: copy-the-source, scored with `trellis bleu` (sacreBLEU's defaults) on the first
                 N validation pairs (byte or SentencePiece tokenizer; the latter decoded with
                 python3-sentencepiece and DIR/tokenizer.model).

Usage: task_baselines.py classify DIR
       task_baselines.py translate DIR [N] [--trellis build/trellis]
Prints one JSON line.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from trellis_test import read_examples  # noqa: E402


def macro_f1(labels, predicted, k):
    scores = []
    for c in range(k):
        tp = sum(1 for y, p in zip(labels, predicted) if y == c and p == c)
        fp = sum(1 for y, p in zip(labels, predicted) if y != c and p == c)
        fn = sum(1 for y, p in zip(labels, predicted) if y == c and p != c)
        scores.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return sum(scores) / k


def naive_bayes(train, val, k, alpha):
    """Multinomial Naive Bayes over (label, features) pairs: val's predicted labels."""
    prior = Counter(y for y, _ in train)
    counts = [Counter() for _ in range(k)]
    for y, feats in train:
        counts[y].update(feats)
    vocab = len(set().union(*counts))
    totals = [sum(c.values()) for c in counts]

    def predict(feats):
        def score(c):
            return math.log(prior[c] / len(train)) + sum(
                math.log((counts[c][t] + alpha) / (totals[c] + alpha * vocab)) for t in feats)
        return max(range(k), key=score)
    return [predict(feats) for _, feats in val]


def text_decoder(meta, directory):
    """Token ids -> text for byte and GPT-2 data (None for others)."""
    if meta.get("tokenizer") == "byte":
        return lambda ids: bytes(t for t in ids if t < 256).decode("utf-8", "replace")
    if meta.get("tokenizer") != "gpt2":
        return None
    # A relative tokenizer_dir is relative to the data directory (as trellis reads it).
    gpt2_dir = os.path.join(directory, meta.get("tokenizer_dir") or "")
    if not os.path.exists(os.path.join(gpt2_dir, "encoder.json")):
        gpt2_dir = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "gpt2")
    with open(os.path.join(gpt2_dir, "encoder.json")) as f:
        pieces = {i: p for p, i in json.load(f).items()}
    # GPT-2's byte <-> printable-character table (its bytes_to_unicode).
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return lambda ids: bytes(chars[c] for t in ids if t in pieces for c in pieces[t]).decode(
        "utf-8", "replace")


def char_ngrams(text, n_max=5):
    text = " " + text.lower() + " "
    return [text[i:i + n] for n in range(1, n_max + 1) for i in range(len(text) - n + 1)]


def classify(directory):
    with open(os.path.join(directory, "meta.json")) as f:
        meta = json.load(f)
    k = len(meta["classes"])
    train = read_examples(os.path.join(directory, "train.examples"))
    val = read_examples(os.path.join(directory, "val.examples"))
    labels = [y for y, _, _ in val]
    majority = Counter(y for y, _, _ in train).most_common(1)[0][0]
    bow = naive_bayes([(y, src) for y, src, _ in train], [(y, src) for y, src, _ in val], k, 1.0)
    acc = lambda pred: sum(p == y for p, y in zip(pred, labels)) / len(labels)  # noqa: E731
    result = {"examples": len(val),
              "majority": {"accuracy": acc([majority] * len(val)),
                           "macro_f1": macro_f1(labels, [majority] * len(val), k)},
              "bag_of_words_nb": {"accuracy": acc(bow), "macro_f1": macro_f1(labels, bow, k)}}
    decode = text_decoder(meta, directory)
    if decode:
        chars = naive_bayes([(y, char_ngrams(decode(src))) for y, src, _ in train],
                            [(y, char_ngrams(decode(src))) for y, src, _ in val], k, 0.1)
        result["char_ngram_nb"] = {"accuracy": acc(chars), "macro_f1": macro_f1(labels, chars, k)}
    return result


def translate(directory, n, trellis):
    val = read_examples(os.path.join(directory, "val.examples"))[:n]
    with open(os.path.join(directory, "meta.json")) as f:
        tokenizer = json.load(f)["tokenizer"]
    if tokenizer == "sentencepiece":
        import sentencepiece
        sp = sentencepiece.SentencePieceProcessor(
            model_file=os.path.join(directory, "tokenizer.model"))
        decode = lambda ids: sp.decode(list(ids))  # noqa: E731
    else:
        assert tokenizer == "byte", f"{directory}: tokenizer {tokenizer} (byte or sentencepiece)"
        decode = lambda ids: bytes(ids).decode("utf-8", "replace")  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        hyp, ref = os.path.join(tmp, "hyp"), os.path.join(tmp, "ref")
        with open(hyp, "w") as h, open(ref, "w") as r:
            for _, src, tgt in val:
                h.write(decode(src).replace("\n", " ") + "\n")
                r.write(decode(tgt).replace("\n", " ") + "\n")
        out = subprocess.run([trellis, "bleu", "--ref", ref, "--hyp", hyp], check=True,
                             capture_output=True, text=True).stdout
    return {"examples": len(val), "copy_source": json.loads(out)}


def main():
    args = sys.argv[1:]
    trellis = "build/trellis"
    if "--trellis" in args:
        i = args.index("--trellis")
        trellis = args[i + 1]
        del args[i:i + 2]
    if args[0] == "classify":
        print(json.dumps(classify(args[1])))
    else:
        print(json.dumps(translate(args[1], int(args[2]) if len(args) > 2 else 500, trellis)))


if __name__ == "__main__":
    main()
