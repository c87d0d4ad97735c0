#!/usr/bin/env python3
"""make_tok_seeds.py: writes the seed corpus of fuzz_tokenizer.c (tests/fuzz/corpus-tokenizer/):
small tokenizer files of every kind fp4s_tok_open reads, so the fuzzer starts inside each parser.
  - tokenizer.json: byte-level BPE (256 byte tokens + a few merges), both merge spellings, added
    special tokens, a Llama-3-like pattern, a template-bearing variant;
  - GGUF v3: a gpt2 BPE vocabulary (256 byte tokens + merges, token types, BOS/EOS) and a
    SentencePiece ("llama") one with scores and <0xNN> byte tokens;
  - llama2.c tokenizer.bin: max length, then (score, length, bytes) per token;
  - model folders (fuzz_tokenizer.c's "#cfg#" lines): tokenizer.json with a tokenizer_config.json
    (BOS/EOS as strings and AddedToken objects, add-BOS flags, a Llama 3 or ChatML template, a
    list of named templates) and a generation_config.json (stop ids).
Run from anywhere: python3 tests/fuzz/make_tok_seeds.py
The corpus's regress-* files are inputs the fuzzer once failed on, kept so CI replays them."""
import json, os, struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus-tokenizer")


def byte_cp(b):
    ok = lambda c: 0x21 <= c <= 0x7E or 0xA1 <= c <= 0xAC or 0xAE <= c <= 0xFF
    if ok(b):
        return b
    return 0x100 + sum(1 for c in range(b) if not ok(c))


def bl(s):  # raw bytes -> the byte-level alphabet
    return "".join(chr(byte_cp(b)) for b in s.encode())


MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), (" ", "w"), ("a", "a"), ("l", "o")]
MERGED = ["he", "ll", "hell", "hello", " w", "aa", "lo"]


def tok_json(pair_merges=False, added=True, llama3=False):
    vocab = {chr(byte_cp(b)): b for b in range(256)}
    for i, m in enumerate(MERGED):
        vocab[bl(m)] = 256 + i
    merges = [[bl(a), bl(b)] if pair_merges else bl(a) + " " + bl(b) for a, b in MERGES]
    pat = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
           if llama3 else " ?\\p{L}+|\\p{N}|\\s+|[^\\s\\p{L}\\p{N}]+")
    n = 256 + len(MERGED)
    t = {"version": "1.0",
         "added_tokens": [{"id": n, "content": "<|begin_of_text|>", "special": True},
                          {"id": n + 1, "content": "<|eot_id|>", "special": True},
                          {"id": n + 2, "content": "<|im_start|>", "special": True},
                          {"id": n + 3, "content": "<|im_end|>", "special": True}] if added else [],
         "normalizer": None,
         "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
             {"type": "Split", "pattern": {"Regex": pat}, "behavior": "Isolated", "invert": False},
             {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]},
         "post_processor": {"type": "TemplateProcessing", "single": [
             {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [], "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [n], "tokens": ["<|begin_of_text|>"]}}}
         if added else None,
         "decoder": {"type": "ByteLevel"},
         "model": {"type": "BPE", "ignore_merges": llama3, "vocab": vocab, "merges": merges}}
    return json.dumps(t, separators=(",", ":")).encode()


def gguf(kv):
    def s(x):
        x = x.encode() if isinstance(x, str) else x
        return struct.pack("<Q", len(x)) + x
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv))
    for k, (t, v) in kv.items():
        out += s(k) + struct.pack("<I", t)
        if t == 8:    # string
            out += s(v)
        elif t == 4:  # uint32
            out += struct.pack("<I", v)
        elif t == 7:  # bool
            out += struct.pack("<B", v)
        elif t == 9:  # array: (element type, values)
            et, vals = v
            out += struct.pack("<IQ", et, len(vals))
            for e in vals:
                out += s(e) if et == 8 else struct.pack("<f", e) if et == 6 else struct.pack("<i", e)
    return out


def gguf_bpe():
    toks = [chr(byte_cp(b)) for b in range(256)] + [bl(m) for m in MERGED] + ["<|endoftext|>"]
    types = [1] * (len(toks) - 1) + [3]
    return gguf({"general.architecture": (8, "gpt2"), "tokenizer.ggml.model": (8, "gpt2"),
                 "tokenizer.ggml.pre": (8, "gpt-2"), "tokenizer.ggml.tokens": (9, (8, toks)),
                 "tokenizer.ggml.token_type": (9, (5, types)),
                 "tokenizer.ggml.merges": (9, (8, [bl(a) + " " + bl(b) for a, b in MERGES])),
                 "tokenizer.ggml.bos_token_id": (4, len(toks) - 1), "tokenizer.ggml.eos_token_id": (4, len(toks) - 1)})


def gguf_spm():
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + \
           ["\u2581", "\u2581the", "\u2581a", "he", "llo", "\u2581hello", "wor", "ld"]
    types = [2, 3, 3] + [6] * 256 + [1] * 8
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0]
    return gguf({"tokenizer.ggml.model": (8, "llama"), "tokenizer.ggml.tokens": (9, (8, toks)),
                 "tokenizer.ggml.scores": (9, (6, scores)), "tokenizer.ggml.token_type": (9, (5, types)),
                 "tokenizer.ggml.bos_token_id": (4, 1), "tokenizer.ggml.eos_token_id": (4, 2),
                 "tokenizer.ggml.add_bos_token": (7, 1)})


def llama2c():
    toks = [(0.0, b"<unk>"), (0.0, b"\n<s>\n"), (0.0, b"\n</s>\n")] + \
           [(0.0, b"<0x%02X>" % b) for b in range(256)] + \
           [(-1.0, b" "), (-2.0, b" the"), (-3.0, b"he"), (-4.0, b"llo"), (-5.0, b" hello"), (-6.0, b"a")]
    out = struct.pack("<i", max(len(t) for _, t in toks))
    for sc, t in toks:
        out += struct.pack("<fi", sc, len(t)) + t
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    seeds = {"bpe.json": tok_json(), "bpe-pairs.json": tok_json(pair_merges=True, added=False),
             "bpe-llama3.json": tok_json(llama3=True), "bpe.gguf": gguf_bpe(), "spm.gguf": gguf_spm(),
             "llama2c.bin": llama2c()}
    sep = b"\n#cfg#\n"
    llama3_tmpl = ("{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
                   "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
                   "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}")
    chatml_tmpl = ("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\n' + message.content + "
                   "'<|im_end|>' + '\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")
    seeds["dir-llama3"] = tok_json() + sep + json.dumps(
        {"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}, "add_bos_token": True,
         "chat_template": llama3_tmpl}).encode() + sep + json.dumps({"eos_token_id": [264, 265], "bos_token_id": 263}).encode()
    seeds["dir-chatml"] = tok_json() + sep + json.dumps(
        {"eos_token": "<|im_end|>", "add_bos_token": False,
         "chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": chatml_tmpl}]}).encode()
    for name, data in seeds.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        print("%s: %d bytes" % (name, len(data)))


main()
