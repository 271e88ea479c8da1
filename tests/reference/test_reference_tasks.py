#!/usr/bin/env python3
"""Self-checks of the task references (reference/torch_tasks.py and the padding masks of the
reference models), no trellis binary needed; run by ctest. The task oracle
(test_torch_oracle_tasks.py) is only as good as these references:

  1. make_batch lays examples out as src/trellis/train/batches.h's SequenceFormat documents it:
     hand-written expected tensors for classification (padding and truncation), image features
     and translation.
  2. padding changes nothing: for every family and pooling the reference gives an example in a
     padded batch the same class logits (translation: the same target logits) as the example
     alone without padding (T = its own length), float64 to 1e-12.
  3. the masks are HF's/PyTorch's: a padded one-layer encoder equals
     torch.nn.TransformerEncoderLayer with src_key_padding_mask, and the padded encoder-decoder
     equals torch.nn.Transformer with src_key_padding_mask and memory_key_padding_mask (at every
     position, float64 to 1e-12).
  4. every k_proj.bias gradient stays exactly zero with padding masks (float64).
  5. the examples file writer and reader round-trip.

Exit status 0 when all pass, 1 otherwise.
"""

import copy
import os
import sys
import tempfile

if os.environ.get("TRELLIS_SOURCE"):
    sys.path.insert(0, os.path.join(os.environ["TRELLIS_SOURCE"], "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from reference import torch_encdec, torch_encoder, torch_tasks  # noqa: E402
from reference.test_reference_models import (_load_ffn, _load_ln, _load_mha,  # noqa: E402
                                              scaled, torch_nn_transformer)

failures = []
S = 10  # the special token of the configs below (vocabulary 11)


def check(cond, msg):
    print(("ok: " if cond else "FAIL: ") + msg, flush=True)
    if not cond:
        failures.append(msg)


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def task(task, T, classes=3, pooling="mean", feature_dim=0):
    t = {"task": task, "seq_len": T, "special_token": S}
    blocks = {}
    if task == "classify":
        blocks.update(num_classes=classes, pooling=pooling)
    if feature_dim:
        t["feature_dim"] = feature_dim
        blocks["input_features"] = feature_dim
    return {"task": t, "blocks": blocks}


def config(family, tr, V=11, C=16, H=4, kv=2, F_=24, L=2, block=12):
    if family == "gpt2":
        c = {"architectures": ["GPT2LMHeadModel"], "n_layer": L, "n_head": H, "n_embd": C,
             "n_positions": block, "vocab_size": V}
    elif family == "llama":
        c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C,
             "intermediate_size": F_, "num_attention_heads": H, "num_key_value_heads": kv,
             "num_hidden_layers": L, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
             "max_position_embeddings": block, "vocab_size": V, "tie_word_embeddings": False,
             "hidden_act": "silu"}
    elif family == "encoder":
        c = {"architectures": ["TrellisEncoder"], "model_type": "trellis-encoder",
             "hidden_size": C, "intermediate_size": F_, "num_attention_heads": H,
             "num_hidden_layers": L, "max_position_embeddings": block, "vocab_size": V,
             "layer_norm_eps": 1e-5, "tie_word_embeddings": True, "hidden_act": "gelu_new"}
    else:
        c = {"architectures": ["TrellisEncoderDecoder"],
             "model_type": "trellis-encoder-decoder", "d_model": C, "encoder_layers": L,
             "decoder_layers": L, "encoder_attention_heads": H, "decoder_attention_heads": H,
             "num_key_value_heads": kv, "encoder_ffn_dim": F_, "decoder_ffn_dim": F_,
             "max_position_embeddings": block, "vocab_size": V, "layer_norm_eps": 1e-5,
             "tie_word_embeddings": True, "activation_function": "gelu_new"}
    if tr["task"]["task"] == "classify":
        c["num_labels"] = tr["blocks"]["num_classes"]
    c["trellis"] = copy.deepcopy(tr)
    return torch_tasks.TaskConfig(c)


def random_params(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in torch_tasks.param_shapes(cfg).items():
        t = torch.randn(shape, generator=g, dtype=torch.float64)
        if "norm" in name and name.endswith("weight"):
            t = 1.0 + 0.1 * t
        elif name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            t = 1.0 + 0.1 * t
        else:
            t = 0.2 * t  # larger than an init, so that attention is far from uniform
        out[name] = t.requires_grad_(True)
    return out


def at_T(cfg, T):
    c = copy.copy(cfg)
    c.T = T
    return c


# ---------------------------------------------------------------------------
# 1. batch layout
# ---------------------------------------------------------------------------


def check_layout():
    ex = [(2, [1, 2, 3], []), (0, [4], []), (1, [5, 6, 7, 8, 9, 1, 2], [])]
    cfg = config("encoder", task("classify", 6))
    b = torch_tasks.make_batch(cfg, ex, [0, 1, 2])
    want = torch.tensor([[S, 1, 2, 3, S, S], [S, 4, S, S, S, S], [S, 5, 6, 7, 8, S]])
    check(torch.equal(b["tokens"], want) and b["lengths"].tolist() == [5, 3, 6] and
          b["labels"].tolist() == [2, 0, 1],
          "layout: classify = [S] text [S], padded with S, a long text truncated to T - 2")

    cfg = config("encoder", task("classify", 3, feature_dim=2))
    b = torch_tasks.make_batch(cfg, [(1, [0, 255, 51, 102], []), (0, [255, 0, 0, 255, 51, 0], [])],
                               [0, 1])
    want = torch.tensor([[[0, 1], [0.2, 0.4], [0, 0]], [[1, 0], [0, 1], [0.2, 0]]],
                        dtype=torch.float64)
    check(rel(b["features"], want) < 1e-15 and b["lengths"].tolist() == [2, 3],
          "layout: image patches = pixel bytes / 255, zero patches after the last")

    cfg = config("encdec", task("translate", 5))
    b = torch_tasks.make_batch(cfg, [(-1, [1, 2], [3, 4, 5]), (-1, [6, 7, 8, 9], [1])], [0, 1])
    check(torch.equal(b["src"], torch.tensor([[1, 2, S, S, S], [6, 7, 8, 9, S]])) and
          b["lengths"].tolist() == [3, 5] and
          torch.equal(b["tokens"], torch.tensor([[S, 3, 4, 5, S], [S, 1, S, S, S]])) and
          torch.equal(b["targets"], torch.tensor([[3, 4, 5, S, -1], [1, S, -1, -1, -1]])),
          "layout: translate = source [S] | [S] target -> target [S], padding S / -1")


# ---------------------------------------------------------------------------
# 2. padding changes nothing
# ---------------------------------------------------------------------------


def check_invariance():
    g = torch.Generator().manual_seed(4)
    texts = [(k % 3, torch.randint(0, 10, (n,), generator=g).tolist(), [])
             for k, n in enumerate([7, 2, 4, 1])]
    T = 9  # needed: 9, 4, 6, 3
    cases = [("gpt2", "last"), ("gpt2", "mean"), ("llama", "last"), ("llama", "cls"),
             ("encoder", "mean"), ("encoder", "cls"), ("encoder", "last")]
    for seed, (family, pooling) in enumerate(cases):
        cfg = config(family, task("classify", T, pooling=pooling))
        params = random_params(cfg, seed)
        padded = torch_tasks.class_logits(params, cfg, torch_tasks.make_batch(cfg, texts, range(4)))
        alone = torch.cat([torch_tasks.class_logits(params, at_T(cfg, len(s) + 2),
                                                    torch_tasks.make_batch(
                                                        at_T(cfg, len(s) + 2), texts, [i]))
                           for i, (_, s, _) in enumerate(texts)])
        e = rel(padded, alone)
        check(e < 1e-12, f"invariance: {family} classifier, {pooling} pooling: padded batch == "
              f"each example alone ({e:.1e})")

    # image features with attention-only blocks
    Fd = 3
    imgs = [(k % 3, torch.randint(0, 256, (n * Fd,), generator=g).tolist(), [])
            for k, n in enumerate([4, 1, 3])]
    tr = task("classify", 4, feature_dim=Fd)
    tr["blocks"]["mlp"] = "none"
    cfg = config("encoder", tr)
    params = random_params(cfg, 11)
    check("layers.0.fc1.weight" not in params and "embed_features.weight" in params and
          "embed_tokens.weight" not in params, "features, mlp none: embed_features, no MLP")
    padded = torch_tasks.class_logits(params, cfg, torch_tasks.make_batch(cfg, imgs, range(3)))
    alone = torch.cat([torch_tasks.class_logits(params, at_T(cfg, len(s) // Fd),
                                                torch_tasks.make_batch(at_T(cfg, len(s) // Fd),
                                                                       imgs, [i]))
                       for i, (_, s, _) in enumerate(imgs)])
    e = rel(padded, alone)
    check(e < 1e-12, f"invariance: image features, mlp none, mean pooling ({e:.1e})")

    # translation: target logits of the real positions
    pairs = [(-1, [1, 2, 3, 4, 5], [6, 7]), (-1, [8], [9, 1, 2, 3]), (-1, [4, 4], [5])]
    cfg = config("encdec", task("translate", 7))
    params = random_params(cfg, 12)
    b = torch_tasks.make_batch(cfg, pairs, range(3))
    logits = torch_encdec.seq2seq_logits(params, cfg.base, b["src"], b["tokens"], b["lengths"])
    worst = 0.0
    for i, (_, s, t) in enumerate(pairs):
        c = at_T(cfg, max(len(s), len(t)) + 1)
        one = torch_tasks.make_batch(c, pairs, [i])
        src = one["src"][:, :len(s) + 1]  # the source alone: no padding at all
        lg = torch_encdec.seq2seq_logits(params, cfg.base, src, one["tokens"], None)
        n = len(t) + 1
        worst = max(worst, rel(logits[i, :n], lg[0, :n]))
    check(worst < 1e-12, f"invariance: translation, padded batch == each pair alone with an "
          f"unpadded source ({worst:.1e})")
    loss = torch_tasks.task_loss(params, cfg, b)
    manual = -sum(float(torch.log_softmax(logits[i, p], -1)[int(b["targets"][i, p])])
                  for i in range(3) for p in range(7) if b["targets"][i, p] >= 0) / 10
    check(abs(loss.item() - manual) < 1e-12, "translation loss = mean over the 10 real targets")


# ---------------------------------------------------------------------------
# 3. PyTorch's own masks
# ---------------------------------------------------------------------------


def check_torch_masks():
    dt = torch.float64
    cfg = config("encoder", task("classify", 6), H=2, F_=32, L=1)
    base = cfg.base
    params = scaled(torch_encoder.random_model(base, seed=3, dtype=dt), 10.0)
    layer = torch.nn.TransformerEncoderLayer(
        base.n_embd, base.n_head, dim_feedforward=base.ffn_hidden, dropout=0.0,
        activation=lambda t: F.gelu(t, approximate="tanh"), layer_norm_eps=base.eps,
        batch_first=True, norm_first=True).to(dt)
    p = "layers.0."
    with torch.no_grad():
        _load_mha(layer.self_attn, params, p + "self_attn.")
        _load_ln(layer.norm1, params, p + "self_attn_layer_norm")
        _load_ln(layer.norm2, params, p + "final_layer_norm")
        _load_ffn(layer, params, p)
    layer.train()  # dropout 0; training mode keeps PyTorch off its padded-output fast path
    g = torch.Generator().manual_seed(5)
    idx = torch.randint(0, 11, (3, 6), generator=g)
    lengths = torch.tensor([6, 2, 4])
    with torch.no_grad():
        h0 = params["embed_tokens.weight"][idx] + params["embed_positions.weight"][:6]
        pad = torch.arange(6)[None] >= lengths[:, None]
        want = F.layer_norm(layer(h0, src_key_padding_mask=pad), (base.n_embd,),
                            params["layer_norm.weight"], params["layer_norm.bias"], base.eps)
        got = torch_encoder.encoder_hidden(params, base, idx, lengths)
    check(rel(got, want) < 1e-12, f"torch: padded encoder layer == nn.TransformerEncoderLayer "
          f"with src_key_padding_mask ({rel(got, want):.1e})")

    ecfg = config("encdec", task("translate", 6), H=2, kv=2, F_=32)
    eb = ecfg.base
    params = scaled(torch_encdec.random_model(eb, seed=5, dtype=dt), 10.0)
    m = torch_nn_transformer(params, eb).train()
    src = torch.randint(0, 11, (3, 7), generator=g)
    tgt = torch.randint(0, 11, (3, 5), generator=g)
    lengths = torch.tensor([7, 3, 1])
    E = params["model.shared.weight"]
    with torch.no_grad():
        pad = torch.arange(7)[None] >= lengths[:, None]
        out = m(E[src] + params["model.encoder.embed_positions.weight"][:7],
                E[tgt] + params["model.decoder.embed_positions.weight"][:5],
                tgt_mask=torch.ones(5, 5, dtype=torch.bool).triu(1), src_key_padding_mask=pad,
                memory_key_padding_mask=pad)
        want = out @ E.t()
        got = torch_encdec.seq2seq_logits(params, eb, src, tgt, lengths)
    check(rel(got, want) < 1e-12, f"torch: padded encoder-decoder == nn.Transformer with "
          f"src_key_padding_mask and memory_key_padding_mask ({rel(got, want):.1e})")


# ---------------------------------------------------------------------------
# 4. zero key-bias gradients under masks
# ---------------------------------------------------------------------------


def check_key_bias():
    g = torch.Generator().manual_seed(6)
    texts = [(k % 3, torch.randint(0, 10, (n,), generator=g).tolist(), [])
             for k, n in enumerate([5, 1, 3])]
    cfg = config("encoder", task("classify", 7), H=2)
    params = random_params(cfg, 7)
    torch_tasks.task_loss(params, cfg, torch_tasks.make_batch(cfg, texts, range(3))).backward()
    r = max(float(params[f"layers.{i}.self_attn.k_proj.bias"].grad.norm() /
                  params[f"layers.{i}.self_attn.q_proj.bias"].grad.norm()) for i in range(2))
    check(r < 1e-12,
          f"key bias: encoder classifier k_proj.bias gradients zero with padding ({r:.1e})")
    pairs = [(-1, [1, 2, 3], [4, 5]), (-1, [6], [7, 8, 9])]
    cfg = config("encdec", task("translate", 4), H=2, kv=1)
    params = random_params(cfg, 8)
    torch_tasks.task_loss(params, cfg, torch_tasks.make_batch(cfg, pairs, range(2))).backward()
    kb = [n for n in params if n.endswith("k_proj.bias")]
    r = max(float(params[n].grad.norm() / params[n[:-len("k_proj.bias")] + "q_proj.bias"]
                  .grad.norm()) for n in kb)
    check(len(kb) == 6 and r < 1e-12,
          f"key bias: encoder-decoder's {len(kb)} k_proj.bias gradients zero with padding "
          f"({r:.1e})")


def check_examples_io():
    ex = [(1, [1, 2, 300], []), (-1, [], [70000, 5]), (0, [9], [8])]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "x.examples")
        torch_tasks.write_examples(path, ex)
        check(torch_tasks.read_examples(path) == ex, "examples file: write then read round-trips")


def main():
    torch.set_num_threads(1)
    check_layout()
    check_invariance()
    check_torch_masks()
    check_key_bias()
    check_examples_io()
    print(f"task reference self-checks: "
          f"{'all passed' if not failures else f'{len(failures)} failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
