// The peer of `trellis prepare`'s GPT-2 tokenisation (bench/prepare_bench.py): reads FILE in
// chunks of CHUNK bytes (below), cut where trellis cuts (before " X", X an ASCII letter, after a
// printable ASCII character: a place where GPT-2's pre-tokenizer cuts anyway), encodes each chunk
// with the npm package named by LIB and counts the tokens. Prints one JSON line
// {"lib", "bytes", "tokens", "seconds"}; with IDS_OUT also writes the first ids (uint32 LE) of
// the first SAMPLE bytes there, for the comparison with trellis's ids.
//   node prepare_peer.js LIB FILE [SAMPLE IDS_OUT]   (LIB: gpt-3-encoder | tiktoken)
"use strict";
const fs = require("fs");
const [lib, file, sampleArg, idsOut] = process.argv.slice(2);
let encode;
if (lib === "gpt-3-encoder") {
  encode = require("gpt-3-encoder").encode;
} else if (lib === "tiktoken") {
  const enc = require("tiktoken").get_encoding("gpt2");
  encode = (s) => enc.encode_ordinary(s);
} else {
  throw new Error(`unknown library ${lib}`);
}
// Text per encode() call (PEER_CHUNK overrides): tiktoken 64 KiB, its fastest of 64 KiB, 1 MiB and
// 4 MiB here (1.9, 2.2, 3.1 s for 5 MB); gpt-3-encoder 4 KiB: its encode() grows the result with
// Array.concat once per pre-token (quadratic in the text length: 5 MB in 4 MiB calls ran for
// minutes), so it gets paragraph-sized calls, as its users make them.
const CHUNK = Number(process.env.PEER_CHUNK) || (lib === "gpt-3-encoder" ? 4096 : 65536);
const limit = sampleArg ? Number(sampleArg) : Infinity;

function safeCut(buf) {
  for (let p = buf.length - 2; p >= 1; --p) {
    const c = buf[p + 1] | 0x20;
    if (buf[p] === 0x20 && c >= 0x61 && c <= 0x7a && buf[p - 1] > 0x20 && buf[p - 1] < 0x7f)
      return p;
  }
  return 0;
}

const fd = fs.openSync(file, "r");
let carry = Buffer.alloc(0);
let bytes = 0, tokens = 0, eof = false;
const ids = [];
const t0 = process.hrtime.bigint();
while (!eof) {
  const want = Math.min(CHUNK, limit - bytes);
  const fresh = Buffer.alloc(Math.max(0, want));
  const n = want > 0 ? fs.readSync(fd, fresh, 0, want, null) : 0;
  bytes += n;
  if (n === 0) eof = true;
  let buf = Buffer.concat([carry, fresh.subarray(0, n)]);
  let cut = eof ? buf.length : safeCut(buf);
  if (cut === 0) cut = buf.length;  // (the licence texts always have a cut)
  const text = buf.subarray(0, cut).toString("utf8");
  carry = Buffer.from(buf.subarray(cut));
  if (text.length === 0) continue;
  const out = encode(text);
  tokens += out.length;
  if (idsOut) for (const t of out) ids.push(t);
}
const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
if (idsOut) {
  const b = Buffer.alloc(4 * ids.length);
  ids.forEach((t, i) => b.writeUInt32LE(t, 4 * i));
  fs.writeFileSync(idsOut, b);
}
console.log(JSON.stringify({ lib, bytes, tokens, seconds }));
