"""Tokenizers: the project's own offline byte-level one, or a local / hub `tokenizer.json`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from framework_bench.scenario.scenario import TokenizerSpec

SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2: Llama's unk/bos/eos ids


def builtin_bytes() -> Tokenizer:
    """Byte-level, no merges: deterministic, offline, 259 ids (3 specials + 256 bytes)."""
    byte_chars = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda c: ord(c))
    vocab = {tok: i for i, tok in enumerate(SPECIALS + byte_chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return tok


def load(spec: TokenizerSpec) -> Tokenizer:
    from framework_bench.data.alpaca import DataError

    if spec.kind == "builtin-bytes":
        return builtin_bytes()
    if spec.kind == "path":
        p = Path(spec.name)
        file = p / "tokenizer.json" if p.is_dir() else p
        if not file.is_file():
            raise DataError(f"tokenizer: no tokenizer.json at {file}")
        try:
            return Tokenizer.from_file(str(file))
        except Exception as e:  # the tokenizers library raises its own Exception subclasses
            raise DataError(f"tokenizer: cannot load {file}: {_first_line(e)}") from None
    try:
        return Tokenizer.from_pretrained(spec.name)  # needs a network
    except Exception as e:
        raise DataError(f"tokenizer: cannot fetch {spec.name!r} from the hub (offline? use kind: path with a "
                        f"local tokenizer.json): {_first_line(e)}") from None


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def fingerprint(tok: Tokenizer) -> str:
    return hashlib.sha256(tok.to_str().encode()).hexdigest()


def special_id(tok: Tokenizer, *names: str) -> int | None:
    return next((tok.token_to_id(n) for n in names if tok.token_to_id(n) is not None), None)


def save_for_transformers(tok: Tokenizer, directory: Path, model_max_length: int) -> None:
    """Write files that `AutoTokenizer.from_pretrained(directory)` loads with no network."""
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    bos = "<s>" if tok.token_to_id("<s>") is not None else None
    eos = "</s>" if tok.token_to_id("</s>") is not None else None
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": "<unk>" if tok.token_to_id("<unk>") is not None else None,
        "pad_token": eos,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
