#!/usr/bin/env python3
"""The task subcommands end to end: train on a classification and a translation directory, then
`eval`, `classify`, `translate` and `bleu` on the checkpoints, each checked against another
(classify's labels against eval's accuracy; translate against a learnable copy task)."""
import json
import os

from trellis_test import check, fresh_dir, prepare_copy_task, read_examples, run

WORDS = {"red": ["apple", "cherry", "blood", "rose", "fire"],
         "green": ["grass", "leaf", "frog", "lime", "moss"],
         "blue": ["sky", "sea", "ice", "jeans", "ink"]}


def classification(tmp):
    rows = ["sentence\tlabel"]
    for i in range(300):
        label = list(WORDS)[i % 3]
        words = WORDS[label]
        rows.append(f"the {words[i % 5]} and the {words[(i // 3) % 5]} number {i}\t{label}")
    with open(os.path.join(tmp, "colours.tsv"), "w") as f:
        f.write("\n".join(rows) + "\n")
    data = os.path.join(tmp, "colours")
    run(["prepare", "--task", "classify", "--input", os.path.join(tmp, "colours.tsv"),
         "--out", data, "--val-fraction", "0.2"])
    out = os.path.join(tmp, "run_classify")
    run(["train", "--data", data, "--model", "encoder-tiny", "--steps", "60", "--batch-size", "16",
         "--lr", "3e-3", "--out", out, "--quiet", "--val-batches", "0"])
    ck = os.path.join(out, "step_00000060")
    with open(os.path.join(out, "confusion.json")) as f:
        confusion = json.load(f)
    check(sum(map(sum, confusion["confusion"])) == 60, "confusion.json counts the 60 val examples")

    with open(os.path.join(ck, "config.json")) as f:
        config = json.load(f)
    check(config["num_labels"] == 3 and config["id2label"] == {"0": "blue", "1": "green", "2": "red"}
          and config["trellis"]["task"]["classes"] == ["blue", "green", "red"],
          "config.json names the classes (Hugging Face's num_labels/id2label, trellis.task)")
    stdout, _ = run(["eval", "--checkpoint", ck, "--data", data])
    metrics = json.loads(stdout)
    check(set(metrics) == {"loss", "accuracy", "macro_f1", "examples"} and
          metrics["examples"] == 60, f"eval prints the classification metrics: {metrics}")
    check(metrics["accuracy"] > 0.9, f"the colour words are learned (accuracy {metrics['accuracy']})")
    check(abs(metrics["accuracy"] - confusion["accuracy"]) < 1e-12,
          "eval's accuracy equals the training run's final validation")

    # classify the validation texts: its labels must reproduce eval's accuracy.
    val = read_examples(os.path.join(data, "val.examples"))
    texts = os.path.join(tmp, "val.txt")
    with open(texts, "w") as f:
        f.write("".join(bytes(src).decode() + "\n" for _, src, _ in val))
    stdout, _ = run(["classify", "--checkpoint", ck, "--input", texts, "--batch-size", "7"])
    lines = [json.loads(line) for line in stdout.splitlines()]
    classes = sorted(WORDS)
    check(len(lines) == len(val), "classify prints one line per input")
    check(all(abs(sum(r["probabilities"].values()) - 1) < 1e-9 and
              r["label"] == max(r["probabilities"], key=r["probabilities"].get) for r in lines),
          "probabilities sum to 1 and the label is the most probable class")
    correct = sum(r["label"] == classes[y] for r, (y, _, _) in zip(lines, val))
    check(correct / len(val) == metrics["accuracy"], "classify's labels give eval's accuracy")
    return ck


def translation(tmp):
    # A copy task: the target is the source; learnable in seconds, so decoding must return it.
    data, _ = prepare_copy_task(tmp, 3)
    out = os.path.join(tmp, "run_translate")
    run(["train", "--data", data, "--model", "seq2seq-tiny", "--steps", "300", "--batch-size", "16",
         "--lr", "3e-3", "--warmup-steps", "20", "--out", out, "--quiet"])
    ck = os.path.join(out, "step_00000300")
    val = read_examples(os.path.join(data, "val.examples"))
    sources = [bytes(src).decode() for _, src, _ in val]
    src_file = os.path.join(tmp, "src.txt")
    with open(src_file, "w") as f:
        f.write("\n".join(sources) + "\n")
    for beam in ("1", "3"):
        stdout, _ = run(["translate", "--checkpoint", ck, "--input", src_file, "--beam", beam])
        hyps = stdout.splitlines()
        check(len(hyps) == len(sources), f"beam {beam}: one translation per line")
        exact = sum(h == s for h, s in zip(hyps, sources)) / len(sources)
        check(exact >= 0.9, f"beam {beam}: the copy task is decoded ({exact:.2f} exact)")
    hyp_file = os.path.join(tmp, "hyp.txt")
    with open(hyp_file, "w") as f:
        f.write(stdout)
    stdout, _ = run(["bleu", "--ref", src_file, "--hyp", hyp_file])
    bleu = json.loads(stdout)
    stdout, _ = run(["eval", "--checkpoint", ck, "--data", data, "--beam", "3"])
    metrics = json.loads(stdout)
    check(set(metrics) >= {"loss", "bleu", "chrf"} and metrics["examples"] == len(val),
          f"eval prints the translation metrics: {metrics}")
    # (BLEU itself is 0 here: sentences of 1-3 words have no 4-grams, as in sacreBLEU.)
    check(bleu["chrf"] > 90, f"the copies score as copies: {bleu}")
    check(abs(metrics["bleu"] - bleu["bleu"]) < 1e-9 and abs(metrics["chrf"] - bleu["chrf"]) < 1e-9,
          "eval's BLEU and chrF equal `trellis bleu` on translate's output")
    return ck


def wrong_checkpoints(tmp, classifier, translator):
    texts = os.path.join(tmp, "one.txt")
    with open(texts, "w") as f:
        f.write("hello\n")
    _, err = run(["translate", "--checkpoint", classifier, "--input", texts], expect=2)
    check("not a translation checkpoint" in err and err.count("\n") == 1,
          f"translate refuses a classifier with one line: {err.strip()}")
    _, err = run(["classify", "--checkpoint", translator, "--input", texts], expect=2)
    check("not a classification checkpoint" in err, f"classify refuses a translator: {err.strip()}")


def main():
    tmp = fresh_dir("task_commands")
    classifier = classification(tmp)
    translator = translation(tmp)
    wrong_checkpoints(tmp, classifier, translator)


if __name__ == "__main__":
    main()
