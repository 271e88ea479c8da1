#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/seed-*): small valid inputs of
each format, from the formats' own descriptions and tests/data. Regression inputs of past finds
(regression-*) sit next to them and are kept. Run from anywhere: python3 fuzz/make_corpus.py"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORPUS = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def read(*path):
    with open(os.path.join(ROOT, *path), "rb") as f:
        return f.read()


# ---- safetensors ----
def safetensors(tensors, metadata=None, pad=True):
    header, blob = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + blob


f32 = struct.pack("<6f", 1, -2, 0.5, 3, 1e-3, -7)
put("safetensors", "f32", safetensors([("w", "F32", [2, 3], f32), ("b", "F32", [3], f32[:12])],
                                      {"format": "pt"}))
put("safetensors", "half", safetensors([("h", "F16", [2, 2], struct.pack("<4H", 0x3c00, 0x8001, 0x7c00, 0x0400)),
                                        ("bf", "BF16", [3], struct.pack("<3H", 0x3f80, 0xff80, 0x0001)),
                                        ("ids", "I64", [2], struct.pack("<2q", 5, -1)),
                                        ("mask", "BOOL", [1], b"\x01")], pad=False))
put("safetensors", "empty", safetensors([("z", "F32", [0, 4], b""), ("s", "F32", [], f32[:4])]))
put("safetensors", "no-tensors", safetensors([], {}))
put("safetensors", "checkpoint_v1", read("tests", "data", "checkpoint_v1", "model.safetensors"))

# ---- token shards ----
def shard(version, tokens):
    header = [20240520, version, len(tokens)] + [0] * 253
    if version == 2:
        header[3] = 4
    fmt = "<%dH" % len(tokens) if version == 1 else "<%dI" % len(tokens)
    return struct.pack("<256i", *header) + struct.pack(fmt, *tokens)


put("shard", "v1", shard(1, [0, 1, 2, 65535, 300, 7]))
put("shard", "v2", shard(2, [0, 70000, 2 ** 32 - 1, 5]))
put("shard", "v1-empty", shard(1, []))

# ---- GPT-2 tokenizer: encoder.json NUL vocab.bpe ----
def byte_symbols():
    """GPT-2's bytes_to_unicode (encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + \
        list(range(0xAE, 0xFF + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


sym = byte_symbols()
vocab = {sym[b]: i for i, b in enumerate(sorted(sym))}
merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("l", "l"), ("e", "ll"), ("H", "ell"), ("o", "r")]
for a, b in merges:
    vocab.setdefault(a + b, len(vocab))
vocab["<|endoftext|>"] = len(vocab)
bpe = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
put("gpt2_tokenizer", "small", json.dumps(vocab, ensure_ascii=False) + "\0" + bpe)
put("gpt2_tokenizer", "small-crlf", json.dumps(vocab) + "\0" + bpe.replace("\n", "\r\n"))

# ---- TOML config + --set lines ----
for name in ("tiny.toml", "llama-baby.toml", "encdec-tiny.toml", "seed_classifier.toml"):
    text = read("configs", name)
    if len(text) < 8192:
        put("config", name, text)
put("config", "sets", b'model = "tiny"\nsteps = 5\n\0n_layer=3\nlr=0.001\nnorm=rmsnorm\nzero=1')
put("config", "llama", b'model = "llama-tiny"\nn_kv_head = 2\nprecision = "fp32"\n\0positions=rope')

# ---- state.json ----
put("state_json", "checkpoint_v1", read("tests", "data", "checkpoint_v1", "state.json"))
put("state_json", "minimal", '{"step": 3}')

# ---- config.json of each family ----
put("model_config_json", "gpt2", read("tests", "data", "checkpoint_v1", "config.json"))
put("model_config_json", "gpt2-blocks", json.dumps({
    "model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 8, "n_positions": 16,
    "vocab_size": 300, "n_inner": 24, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
    "trellis": {"vocab_multiple": 64, "tokenizer": "byte", "tokenizer_dir": "",
                "blocks": {"norm": "rmsnorm", "positions": "rope", "mlp": "swiglu", "bias": False,
                           "tied_head": True, "num_classes": 3, "pooling": "last"}}}))
put("model_config_json", "llama", json.dumps({
    "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_hidden_layers": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "max_position_embeddings": 64, "vocab_size": 256, "tie_word_embeddings": False,
    "hidden_act": "silu", "attention_bias": False, "mlp_bias": False}))
put("model_config_json", "encoder", json.dumps({
    "model_type": "trellis-encoder", "hidden_size": 32, "intermediate_size": 128,
    "num_attention_heads": 2, "num_hidden_layers": 2, "max_position_embeddings": 64,
    "vocab_size": 256, "layer_norm_eps": 1e-5, "tie_word_embeddings": True,
    "hidden_act": "gelu_new",
    "trellis": {"vocab_multiple": 64, "blocks": {"num_classes": 4, "pooling": "mean",
                                                  "input_features": 16, "mlp": "none"}}}))
put("model_config_json", "encdec", json.dumps({
    "model_type": "trellis-encoder-decoder", "d_model": 32, "encoder_layers": 2,
    "decoder_layers": 2, "encoder_attention_heads": 2, "decoder_attention_heads": 2,
    "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "max_position_embeddings": 64,
    "vocab_size": 256, "layer_norm_eps": 1e-5, "tie_word_embeddings": True,
    "activation_function": "gelu_new", "scale_embedding": False}))

# ---- classification inputs: selector byte (0 tsv, 1 csv, 2 jsonl, 3 idx images, 4 idx labels) ----
put("classification_readers", "tsv", b"\0sentence\tlabel\nthe film was fine\tpos\nawful\tneg\n")
put("classification_readers", "csv",
    b'\1text,label,id\n"a, quoted ""field""",1,a\r\n"two\nlines",0,b\nplain,1,c\n')
put("classification_readers", "jsonl",
    b'\2{"text": "good", "label": "pos"}\n{"text": "bad", "label": 0}\n\n')
put("classification_readers", "idx-images",
    b"\3" + struct.pack(">4I", 0x803, 2, 2, 3) + bytes(range(12)))
put("classification_readers", "idx-labels", b"\4" + struct.pack(">2I", 0x801, 3) + b"\1\2\3")

# ---- translation inputs: selector byte (0 tsv, 1 po, 2 mo) ----
put("translation_readers", "tsv", b"\0hello\tbonjour\n\nthe cat\tle chat\r\n")
put("translation_readers", "po", ('\1# comment\nmsgid ""\nmsgstr "Content-Type: text/plain\\n"\n\n'
                                  '#, fuzzy\nmsgid "old"\nmsgstr "vieux"\n\n'
                                  'msgctxt "menu"\nmsgid "File"\nmsgstr "Fichier"\n\n'
                                  'msgid "a \\"quoted\\"\\tline"\n"continued"\nmsgstr "une \\"ligne\\""\n\n'
                                  'msgid "one"\nmsgid_plural "many"\nmsgstr[0] "un"\nmsgstr[1] "des"\n'))


def mo(entries):
    n = len(entries)
    ids = b"".join(k + b"\0" for k, _ in entries)
    strs = b"".join(v + b"\0" for _, v in entries)
    o_table, t_table = 28, 28 + 8 * n
    data = 28 + 16 * n
    out_o, out_t, pos = b"", b"", data
    for k, _ in entries:
        out_o += struct.pack("<2I", len(k), pos)
        pos += len(k) + 1
    for _, v in entries:
        out_t += struct.pack("<2I", len(v), pos)
        pos += len(v) + 1
    return struct.pack("<7I", 0x950412de, 0, n, o_table, t_table, 0, 0) + out_o + out_t + ids + strs


put("translation_readers", "mo", b"\2" + mo([(b"", b"Content-Type: text/plain\n"),
                                            (b"hello", b"bonjour"), (b"menu\4File", b"Fichier"),
                                            (b"one\0many", b"un\0des"), (b"untranslated", b"")]))


# ---- sentencepiece_model: small models as trellis trains them, and a unigram one without byte
# fallback (unknown characters are <unk>) (python3-sentencepiece; the library trellis links) ----
def sentencepiece_model(**options):
    import io
    import sentencepiece as spm
    lines = [f"the {w} cat sat on {n} mats" for n in range(40) for w in ("red", "old", "caf\u00e9")]
    blob = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=blob,
                                   minloglevel=2, num_threads=1, **options)
    return blob.getvalue()


put("sentencepiece_model", "trellis-bpe", sentencepiece_model(
    vocab_size=300, model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
    remove_extra_whitespaces=False, character_coverage=1.0))
# (identity normalisation: NFKC's table alone is 230 KB)
put("sentencepiece_model", "unk-unigram", sentencepiece_model(
    vocab_size=30, normalization_rule_name="identity"))

