#!/usr/bin/env python3
"""Key/value-cached decoding gives the uncached path's output token for token, for each family:
`sample` from GPT-2 and LLaMA (grouped-query attention, RoPE) checkpoints, greedy and sampled at a
fixed seed, past the context length (where the window slides); `translate` greedy and beam 4 and
`eval --beam 4` from an encoder-decoder, with sources of different lengths decoded in one batch
while finished hypotheses leave it. Small briefly-trained models, so the test takes seconds."""
import json
import os

from trellis_test import check, fresh_dir, prepare_copy_task, run, write_text_corpus


def same(args, what):
    cached, _ = run(args)
    uncached, _ = run(args + ["--no-cache"])
    check(cached == uncached, f"{what}: cached = --no-cache ({len(cached)} bytes)")
    return cached


def decoder_only(tmp):
    corpus = os.path.join(tmp, "corpus.txt")
    write_text_corpus(corpus)
    data = os.path.join(tmp, "lm")
    run(["prepare", "--input", corpus, "--out", data])
    for model in ("tiny", "llama-tiny"):  # block size 64; llama-tiny: 4 heads, 2 kv heads
        out = os.path.join(tmp, model)
        run(["train", "--data", data, "--model", model, "--steps", "30", "--batch-size", "8",
             "--lr", "3e-3", "--out", out, "--quiet", "--val-batches", "0"])
        ck = os.path.join(out, "step_00000030")
        # 100 new tokens after prompts of 1 and 40 bytes: the window slides past 64 positions.
        for prompt in ("t", "the model trains on text and learns to p"):
            text = same(["sample", "--checkpoint", ck, "--prompt", prompt, "--tokens", "100",
                         "--temperature", "0"], f"{model} greedy, prompt of {len(prompt)}")
            check(len(text) > len(prompt) + 50, f"{model}: {len(text)} bytes generated")
        same(["sample", "--checkpoint", ck, "--prompt", "the", "--tokens", "100",
              "--temperature", "0.9", "--top-k", "20", "--seed", "7"], f"{model} sampled, seed 7")


def encoder_decoder(tmp):
    # A copy task of one to four words, briefly trained: hypotheses end at different steps.
    data, pairs = prepare_copy_task(tmp, 4)
    out = os.path.join(tmp, "seq2seq")
    run(["train", "--data", data, "--model", "seq2seq-tiny", "--steps", "100", "--batch-size",
         "16", "--lr", "3e-3", "--warmup-steps", "10", "--out", out, "--quiet",
         "--val-batches", "0"])
    ck = os.path.join(out, "step_00000100")
    sources = list(dict.fromkeys(p.split("\t")[0] for p in pairs))[:30]
    src_file = os.path.join(tmp, "src.txt")
    with open(src_file, "w") as f:
        f.write("\n".join(sources) + "\n")
    check(len({len(s) for s in sources[:7]}) > 1, "a batch holds sources of different lengths")
    for beam in ("1", "4"):
        hyps = same(["translate", "--checkpoint", ck, "--input", src_file, "--beam", beam,
                     "--batch-size", "7"], f"translate beam {beam}").splitlines()
        check(len(hyps) == len(sources), f"beam {beam}: one translation per source")
        lengths = {len(h) for h in hyps}
        check(len(lengths) > 1, f"beam {beam}: hypotheses end at different steps {sorted(lengths)}")
    cached, _ = run(["eval", "--checkpoint", ck, "--data", data, "--beam", "4", "--batch-size", "9"])
    uncached, _ = run(["eval", "--checkpoint", ck, "--data", data, "--beam", "4", "--batch-size",
                       "9", "--no-cache"])
    check(json.loads(cached) == json.loads(uncached), f"eval --beam 4: cached = --no-cache {cached}")


def main():
    tmp = fresh_dir("kv_decode")
    decoder_only(tmp)
    encoder_decoder(tmp)


if __name__ == "__main__":
    main()
