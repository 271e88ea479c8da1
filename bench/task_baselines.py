#!/usr/bin/env python3
"""Baselines a task model must beat, on the same task directory and split it is evaluated on.

  classify DIR:  majority class, and a bag-of-words multinomial Naive Bayes (add-one smoothing)
                 over the examples' tokens (bytes or GPT-2 BPE ids, as prepared), trained on
                 train.examples, scored on val.examples (accuracy and macro-F1).
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


def classify(directory):
    with open(os.path.join(directory, "meta.json")) as f:
        k = len(json.load(f)["classes"])
    train = read_examples(os.path.join(directory, "train.examples"))
    val = read_examples(os.path.join(directory, "val.examples"))
    labels = [y for y, _, _ in val]
    prior = Counter(y for y, _, _ in train)
    majority = prior.most_common(1)[0][0]
    counts = [Counter() for _ in range(k)]
    for y, src, _ in train:
        counts[y].update(src)
    vocab = len(set().union(*counts))
    totals = [sum(c.values()) for c in counts]

    def predict(src):
        def score(c):
            return math.log(prior[c] / len(train)) + sum(
                math.log((counts[c][t] + 1) / (totals[c] + vocab)) for t in src)
        return max(range(k), key=score)

    bow = [predict(src) for _, src, _ in val]
    acc = lambda pred: sum(p == y for p, y in zip(pred, labels)) / len(labels)  # noqa: E731
    return {"examples": len(val),
            "majority": {"accuracy": acc([majority] * len(val)),
                         "macro_f1": macro_f1(labels, [majority] * len(val), k)},
            "bag_of_words_nb": {"accuracy": acc(bow), "macro_f1": macro_f1(labels, bow, k)}}


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
