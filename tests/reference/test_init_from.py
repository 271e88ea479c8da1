"""`trellis train --init-from DIR`: fine-tuning from Hugging Face model directories.

The directories are built here from weights drawn with PyTorch, written by hand as Hugging Face
writes them (config.json; model.safetensors or a model.safetensors.index.json with shards; F32,
F16 or BF16 tensors; GPT-2 names with or without "transformer.", its attn.bias / attn.masked_bias
buffers, LLaMA's rotary_emb.inv_freq buffers, a saved copy of GPT-2's tied lm_head.weight). The
loss trellis logs at step 1 must equal the independent PyTorch models' (reference/torch_gpt.py,
reference/torch_llama.py, reference/torch_encoder.py) on the same batch within 1e-5 relative;
for half-precision directories the reference holds the same rounded weights. Classifiers keep the
directory's body exactly and start their head from the seed. Bad directories give one error line
and exit 2.
"""
import json
import os
import sys

if os.environ.get("TRELLIS_SOURCE"):
    sys.path.insert(0, os.path.join(os.environ["TRELLIS_SOURCE"], "tests"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from reference import torch_encoder, torch_gpt, torch_llama  # noqa: E402
from reference.torch_ref import load_safetensors, read_split, windows  # noqa: E402
from trellis_test import (TMP, check, checkpoint_tensors, expect_error_line,  # noqa: E402
                          fresh_dir, metrics, run, write_text_corpus)

TOL = 1e-5
T, B = 32, 4
V = 300  # more than the 256 byte tokens; trellis pads the embedding to 320 rows

GPT2_CONFIG = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": V,
               "n_positions": 64, "n_ctx": 64, "n_embd": 32, "n_layer": 2, "n_head": 2,
               "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
               "tie_word_embeddings": True, "torch_dtype": "float32"}
LLAMA_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 32,
                "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                "num_hidden_layers": 2, "max_position_embeddings": 64, "vocab_size": V,
                "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
                "hidden_act": "silu", "torch_dtype": "bfloat16"}
# trellis's own encoder family (fairseq/BART names), as a trellis checkpoint's config.json says it.
ENCODER_CONFIG = {"model_type": "trellis-encoder", "architectures": ["TrellisEncoder"],
                  "hidden_size": 32, "intermediate_size": 128, "num_attention_heads": 2,
                  "num_hidden_layers": 2, "max_position_embeddings": 64, "vocab_size": V,
                  "layer_norm_eps": 1e-5, "tie_word_embeddings": True, "hidden_act": "gelu_new"}


# ---------------------------------------------------------------------------------------------
# Hugging Face directories, written by hand


def tensor_bytes(dtype, t):
    t = t.detach().contiguous()
    if dtype == "F32":
        return t.to(torch.float32).numpy().tobytes()
    if dtype == "F16":
        return t.to(torch.float16).numpy().tobytes()
    if dtype == "BF16":
        return t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    if dtype == "BOOL":
        return t.to(torch.bool).numpy().tobytes()
    raise ValueError(dtype)


def write_safetensors(path, tensors):
    """tensors: {name: (dtype, tensor)} in the order given (no sorting, as other writers do)."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (dtype, t) in tensors.items():
        b = tensor_bytes(dtype, t)
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def rounded(dtype, t):
    """The float32 values a tensor stored as dtype holds."""
    return {"F32": t, "F16": t.to(torch.float16).float(), "BF16": t.to(torch.bfloat16).float()}[
        dtype]


def write_hf_dir(name, config, params, dtype="F32", prefix="", extra=None, shards=1):
    """A model directory: config.json and the weights (`prefix` before every name, `extra`
    {name: (dtype, tensor)} added as they are) in one file or `shards` files with an index.
    Returns (dir, the float32 weights the directory holds)."""
    d = fresh_dir(name)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tensors = {prefix + n: (dtype, t) for n, t in params.items()}
    tensors.update(extra or {})
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    else:
        names = list(tensors)
        weight_map = {}
        for k in range(shards):
            file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            part = names[k::shards]
            write_safetensors(os.path.join(d, file), {n: tensors[n] for n in part})
            weight_map.update({n: file for n in part})
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2)
    return d, {n: rounded(dtype, t) for n, t in params.items()}


def random_params(shapes, seed):
    """Weights far from any initialisation, so that a tensor loaded wrongly shows in the loss:
    N(0, 0.1) matrices, N(0, 0.02) biases, norm weights around 1."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        r = torch.randn(shape, generator=g, dtype=torch.float32)
        if "norm" in name or name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            out[name] = 1.0 + 0.1 * r
        elif name.endswith(".bias"):
            out[name] = 0.02 * r
        else:
            out[name] = 0.1 * r
    return out


GPT_CFG = torch_gpt.GPTConfig(2, 2, 32, 64, V)
LLAMA_CFG = torch_llama.LlamaConfig(LLAMA_CONFIG)
ENCODER_CFG = torch_encoder.EncoderConfig(ENCODER_CONFIG)


def gpt2_buffers(prefix=""):
    """GPT-2's causal-mask buffers as older transformers versions save them."""
    mask = torch.ones(64, 64).tril().view(1, 1, 64, 64)
    out = {}
    for i in range(GPT_CFG.n_layer):
        out[f"{prefix}h.{i}.attn.bias"] = ("BOOL", mask)
        out[f"{prefix}h.{i}.attn.masked_bias"] = ("F32", torch.tensor(-1e4))
    return out


def llama_buffers():
    hd = LLAMA_CFG.head_dim
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    return {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": ("F32", inv)
            for i in range(LLAMA_CFG.n_layer)}


# ---------------------------------------------------------------------------------------------
# data and runs

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"))
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data, "--tokenizer", "byte"])
tokens = read_split(data, "train")
W = (tokens.size - 1) // T
X, Y = windows(tokens, T, [j % W for j in range(B)])  # step 1's batch without shuffling

COMMON = ["--data", data, "--batch-size", B, "--seq-len", T, "--shuffle=false", "--seed", 5,
          "--val-every", 0, "--val-batches", 1, "--tensorboard=false", "--threads", 2]


def train(name, init_from, *args, expect=0, quiet=True):
    out = fresh_dir(name)
    stdout, stderr = run(["train", "--init-from", init_from, *COMMON, "--out", out, *args]
                         + (["--quiet"] if quiet else []), expect=expect)
    return out, stdout, stderr


def check_loss(case, d, loss_fn, params, cfg):
    out, _, _ = train(case, d, "--steps", 1)
    got = metrics(out)[0][0]["loss"]
    with torch.no_grad():
        want = loss_fn(params, cfg, X, Y).item()
    e = abs(got - want) / abs(want)
    check(e <= TOL, f"{case}: step-1 loss {got:.7f} equals PyTorch's {want:.7f} (rel {e:.1e})")


# ---------------------------------------------------------------------------------------------
# GPT-2

gpt_params = random_params(torch_gpt.param_shapes(GPT_CFG), seed=1)

# F32, "transformer." names, the attention buffers (a bool mask, as old versions saved it).
d_f32, w = write_hf_dir("gpt2_f32", GPT2_CONFIG, gpt_params, "F32", prefix="transformer.",
                        extra=gpt2_buffers("transformer."))
check_loss("gpt2 F32, transformer. prefix, attn buffers", d_f32, torch_gpt.gpt_loss, w, GPT_CFG)
out, stdout, _ = train("gpt2_f32_steps0", d_f32, "--steps", 0, quiet=False)
n = len(torch_gpt.param_shapes(GPT_CFG))
check(f"trellis: initialised from {d_f32} ({n} tensors)\n" in stdout,
      f"train says where the weights come from: {n} tensors")
saved = checkpoint_tensors(os.path.join(out, "step_00000000"))
check(sorted(saved) == sorted(w) and all(np.array_equal(saved[k], w[k].numpy()) for k in w),
      "the step-0 checkpoint holds exactly the directory's weights")

# F16, plain names, a saved copy of the tied head (accepted: it equals wte).
d_f16, w = write_hf_dir("gpt2_f16", GPT2_CONFIG, gpt_params, "F16",
                        extra={"lm_head.weight": ("F16", gpt_params["wte.weight"])})
check_loss("gpt2 F16 with lm_head.weight = wte", d_f16, torch_gpt.gpt_loss, w, GPT_CFG)

# BF16 in three shards with an index.
d_bf16, w = write_hf_dir("gpt2_bf16", GPT2_CONFIG, gpt_params, "BF16", shards=3,
                         extra=gpt2_buffers())
check_loss("gpt2 BF16, 3 shards", d_bf16, torch_gpt.gpt_loss, w, GPT_CFG)

# ---------------------------------------------------------------------------------------------
# LLaMA (grouped-query attention, untied head)

llama_params = random_params(torch_llama.param_shapes(LLAMA_CFG), seed=2)
d_llama, w = write_hf_dir("llama_f32", LLAMA_CONFIG, llama_params, "F32", extra=llama_buffers())
check_loss("llama F32 with rotary_emb.inv_freq", d_llama, torch_llama.llama_loss, w, LLAMA_CFG)
d_llama16, w = write_hf_dir("llama_bf16", LLAMA_CONFIG, llama_params, "BF16", shards=2)
check_loss("llama BF16, 2 shards", d_llama16, torch_llama.llama_loss, w, LLAMA_CFG)

# ---------------------------------------------------------------------------------------------
# A classifier on the pretrained body: its head (score.weight) is the task's, DIR's
# lm_head.weight (here a tied copy) is left out.

src = fresh_dir("cls_src")
with open(os.path.join(src, "reviews.tsv"), "w") as f:
    f.write("text\tlabel\n")
    for i in range(40):
        label = ("pos", "neg")[i % 2]
        words = "good fine great" if label == "pos" else "bad poor awful"
        f.write(f"{words} {words} number {i}\t{label}\n")
task = os.path.join(TMP, "cls_task")
run(["prepare", "--task", "classify", "--input", os.path.join(src, "reviews.tsv"), "--out", task])
out = fresh_dir("cls_run")
stdout, _ = run(["train", "--init-from", d_f16, "--data", task, "--out", out, "--steps", 0,
                 "--batch-size", 4, "--threads", 2, "--tensorboard=false"])
check(f"trellis: initialised from {d_f16} ({n} tensors; task head score.weight initialised)"
      in stdout, "a classifier reports its new head")
saved = checkpoint_tensors(os.path.join(out, "step_00000000"))
w16 = {k: rounded("F16", v) for k, v in gpt_params.items()}
check(sorted(saved) == sorted(list(w16) + ["score.weight"]) and saved["score.weight"].shape ==
      (2, 32) and all(np.array_equal(saved[k], w16[k].numpy()) for k in w16),
      "the classifier holds DIR's body exactly and a 2 x 32 score head")

# The encoder, F16: its language-model check, then a classifier whose head has a bias.
enc_params = random_params(torch_encoder.param_shapes(ENCODER_CFG), seed=5)
d_enc, w = write_hf_dir("encoder_f16", ENCODER_CONFIG, enc_params, "F16")
check_loss("encoder F16", d_enc, torch_encoder.encoder_loss, w, ENCODER_CFG)
out = fresh_dir("enc_cls_run")
stdout, _ = run(["train", "--init-from", d_enc, "--data", task, "--out", out, "--steps", 0,
                 "--batch-size", 4, "--threads", 2, "--tensorboard=false"])
check(f"({len(w)} tensors; task head classifier.weight, classifier.bias initialised)" in stdout,
      "an encoder classifier reports both head tensors")
saved = checkpoint_tensors(os.path.join(out, "step_00000000"))
check(all(np.array_equal(saved[k], w[k].numpy()) for k in w) and "classifier.bias" in saved,
      "the encoder classifier holds DIR's body exactly")

# ---------------------------------------------------------------------------------------------
# --resume takes precedence: a resumed run continues from its checkpoint, not from DIR.

other, _ = write_hf_dir("gpt2_other", GPT2_CONFIG, random_params(
    torch_gpt.param_shapes(GPT_CFG), seed=3), "F32")
full, _, _ = train("resume_full", d_f32, "--steps", 2)
split, _, _ = train("resume_split", d_f32, "--steps", 2, "--stop-at", 1)
run(["train", "--init-from", other, *COMMON, "--out", split, "--steps", 2, "--resume", "--quiet"])
check([r["loss"] for r in metrics(full)[0]] == [r["loss"] for r in metrics(split)[0]],
      "--resume continues from the checkpoint, not from another --init-from directory")

# ---------------------------------------------------------------------------------------------
# Bad directories: one error line, exit 2.


def init_refused(case, d, *needles, args=("--steps", 1)):
    """`train --init-from d` exits 2 with one error line naming each needle."""
    _, _, err = train("bad", d, *args, expect=2)
    expect_error_line(err, *needles, what=case)


bad = dict(gpt_params)
bad["h.0.attn.c_attn.weight"] = torch.zeros(32, 48)
d, _ = write_hf_dir("bad_shape", GPT2_CONFIG, bad)
init_refused("shape mismatch", d, f"{d}: tensor h.0.attn.c_attn.weight has shape [32, 48] in the "
             "checkpoint, the model needs [32, 96]")

d, _ = write_hf_dir("bad_arch", GPT2_CONFIG, llama_params)
init_refused("LLaMA tensors under a GPT-2 config.json", d, "model.", "not part of the configured "
             "gpt2 model")

missing = {k: v for k, v in gpt_params.items() if k != "h.1.mlp.c_proj.bias"}
d, _ = write_hf_dir("bad_missing", GPT2_CONFIG, missing)
init_refused("missing tensor", d, f"{d}: missing tensor 'h.1.mlp.c_proj.bias'")

d, _ = write_hf_dir("bad_untied", GPT2_CONFIG, gpt_params,
                    extra={"lm_head.weight": ("F32", gpt_params["wte.weight"] + 1e-3)})
init_refused("an lm_head.weight that is not the tied embedding", d, "lm_head.weight differs from "
             "wte.weight", "tie_word_embeddings")

d, _ = write_hf_dir("bad_vocab", dict(GPT2_CONFIG, vocab_size=200), random_params(
    torch_gpt.param_shapes(torch_gpt.GPTConfig(2, 2, 32, 64, 200)), seed=4))
init_refused("a vocabulary smaller than the data's", d, "256 tokens", "200", d)

d, _ = write_hf_dir("bad_override", GPT2_CONFIG, gpt_params)
init_refused("a size set next to --init-from", d, "n_layer", args=("--steps", 1, "--n-layer", 3))

d = fresh_dir("bad_empty")
with open(os.path.join(d, "config.json"), "w") as f:
    json.dump(GPT2_CONFIG, f)
init_refused("no weights", d, f"{d}: no model.safetensors or model.safetensors.index.json")

d, _ = write_hf_dir("bad_index", GPT2_CONFIG, gpt_params, shards=2)
os.remove(os.path.join(d, "model-00002-of-00002.safetensors"))
init_refused("a missing shard", d, "model-00002-of-00002.safetensors")

init_refused("no directory", os.path.join(TMP, "nonexistent"), "nonexistent", "not found")
