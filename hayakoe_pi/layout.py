"""The HayaKoe model layout and the default voice, named once for the package and install.sh.

Standard library only: install.sh runs this file with the system python3
before the virtualenv exists:
    python3 hayakoe_pi/layout.py default-voice
    python3 hayakoe_pi/layout.py required VOICE    # one path per line
    python3 hayakoe_pi/layout.py optional VOICE
"""

from __future__ import annotations

import sys

DEFAULT_VOICE = "jvnv-F1-jp"
BERT_PATH = "onnx/bert/q8/bert_q8.onnx"
TOKENIZER_DIR = "bert/tokenizer"
VOCAB_PATH = f"{TOKENIZER_DIR}/vocab.txt"
TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
SPEAKERS_DIR = "onnx/speakers"
VOICE_FILES = ("synthesizer.onnx", "config.json", "style_vectors.npy")
OPTIONAL_VOICE_FILES = ("duration_predictor.onnx",)  # published for some voices; not needed to speak


def required_files(voice: str) -> list[str]:
    return [BERT_PATH, *(f"{TOKENIZER_DIR}/{n}" for n in TOKENIZER_FILES),
            *(f"{SPEAKERS_DIR}/{voice}/{n}" for n in VOICE_FILES)]


def optional_files(voice: str) -> list[str]:
    return [f"{SPEAKERS_DIR}/{voice}/{n}" for n in OPTIONAL_VOICE_FILES]


if __name__ == "__main__":
    what, *args = sys.argv[1:] or ["?"]
    if what == "default-voice":
        print(DEFAULT_VOICE)
    elif what in ("required", "optional") and len(args) == 1:
        print("\n".join((required_files if what == "required" else optional_files)(args[0])))
    else:
        sys.exit("usage: layout.py default-voice | required VOICE | optional VOICE")
