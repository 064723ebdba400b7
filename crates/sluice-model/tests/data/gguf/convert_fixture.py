#!/usr/bin/env python3
"""Run llama.cpp's convert_hf_to_gguf.py on a random-weight test fixture.

The fixtures' tokenizers were trained for the tests, so the converter's
pre-tokenizer detection (a hash of the token ids of a fixed text, known only
for published models) cannot recognise them and stops. Their split regexes
are exactly those of published families, so this wrapper checks the
fixture's tokenizer.json regex against the one llama.cpp implements for the
named `tokenizer.ggml.pre` value and makes the converter write that value;
everything else is the converter, unchanged.

    python convert_fixture.py LLAMA_CPP_DIR PRE MODEL_DIR OUTFILE [converter args...]
    python convert_fixture.py LLAMA_CPP_DIR qwen2 ../tiny-qwen2 tiny-qwen2.F32.gguf --outtype f32

It imports the converter and the gguf-py package from LLAMA_CPP_DIR (the
same source tree; tested with llama.cpp 0c1e57098, vendored by
llama-cpp-python 0.3.36).
"""
import json
import sys
from pathlib import Path

# The original (tokenizer.json) regex of each pre-tokenizer type, as quoted in
# llama.cpp's src/llama-vocab.cpp.
REGEX = {
    "qwen2": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "llama-bpe": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
}


def main() -> None:
    llama_dir, pre, model_dir, outfile, *rest = sys.argv[1:]
    tok = json.loads((Path(model_dir) / "tokenizer.json").read_text())
    regexes = [p["pattern"]["Regex"] for p in tok["pre_tokenizer"]["pretokenizers"] if p["type"] == "Split"]
    if regexes != [REGEX[pre]]:
        sys.exit(f"{model_dir}: split regex {regexes} is not llama.cpp's {pre!r} regex")

    sys.path.insert(0, llama_dir)
    sys.path.insert(1, str(Path(llama_dir) / "gguf-py"))
    import conversion.base as base
    import convert_hf_to_gguf

    patched = 0
    for cls in list(vars(base).values()):
        if isinstance(cls, type) and "get_vocab_base_pre" in vars(cls):
            cls.get_vocab_base_pre = lambda self, tokenizer: pre
            patched += 1
    assert patched, "get_vocab_base_pre not found in conversion.base"
    sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outfile", outfile, *rest]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
