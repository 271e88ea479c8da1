"""fastText-style subword n-gram bags of GPT-2 token sequences, written for the reference models
from the description in src/trellis/model/subword_ngrams.h (not from its code):

  - a token's text is its bytes (GPT-2's encoder.json pieces mapped back through bytes_to_unicode);
    the special token <|endoftext|> (50256) has no text;
  - a word is a token whose text starts with a space (or the first token after a special token or
    at the sequence start) plus the tokens after it whose text does not; a special token has no
    n-grams and ends the word before it;
  - each token of a word gets the n-grams of "<" + the word's bytes without the leading space +
    ">": every run of min_n..max_n UTF-8 characters (a continuation byte, 10xxxxxx, belongs to the
    character before it), hashed with 32-bit FNV-1a, modulo the table's rows.

`bags(tokens, buckets, min_n, max_n)` -> one list of bucket ids per token.
"""

import json
import os

_GPT2_DIR = os.path.join(os.path.dirname(__file__), "..", "data", "gpt2")
_SPECIAL = 50256
_token_bytes = None


def token_bytes():
    """[bytes] per GPT-2 token id (the special token: b"")."""
    global _token_bytes
    if _token_bytes is None:
        with open(os.path.join(_GPT2_DIR, "encoder.json")) as f:
            enc = json.load(f)
        # GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to 256 + i.
        printable = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
        byte_of, extra = {}, 0
        for b in range(256):
            if b in printable:
                byte_of[chr(b)] = b
            else:
                byte_of[chr(256 + extra)] = b
                extra += 1
        out = [b""] * len(enc)
        for piece, i in enc.items():
            if i != _SPECIAL:
                out[i] = bytes(byte_of[c] for c in piece)
        _token_bytes = out
    return _token_bytes


def fnv1a(data):
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) % (1 << 32)
    return h


def word_ngrams(word, buckets, min_n, max_n):
    text = b"<" + word + b">"
    chars = []
    for b in text:
        if chars and (b & 0xC0) == 0x80:
            chars[-1] += bytes([b])
        else:
            chars.append(bytes([b]))
    return [fnv1a(b"".join(chars[i:i + n])) % buckets
            for n in range(min_n, max_n + 1) for i in range(len(chars) - n + 1)]


def bags(tokens, buckets, min_n, max_n):
    text = token_bytes()
    out, i = [], 0
    while i < len(tokens):
        if not text[tokens[i]]:
            out.append([])
            i += 1
            continue
        j = i + 1
        while j < len(tokens) and text[tokens[j]] and not text[tokens[j]].startswith(b" "):
            j += 1
        word = b"".join(text[t] for t in tokens[i:j])
        if word.startswith(b" "):
            word = word[1:]
        grams = word_ngrams(word, buckets, min_n, max_n)
        out.extend([grams] * (j - i))
        i = j
    return out
