"""Tokenizers: Qwen2 byte-level BPE (vocab.json + merges.txt, or tokenizer.json) via `tokenizers`.

The Qwen2 pipeline is NFC normalisation, Qwen2's pre-tokenisation regex, byte-level mapping and BPE, plus
the chat special tokens. Llama's `tokenizer.model` goes through sentencepiece.
"""
from __future__ import annotations

import os
from typing import List, Optional, Sequence

from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.compat.hf import read_json_object

QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                           r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


class Tokenizer:
    """Batch encode/decode with the ids our models use. `eos_token_id`/`pad_token_id`: the named tokens
    (a tokenizer_config.json's eos_token / pad_token), else Qwen2's (<|im_end|>, <|endoftext|>)."""

    def __init__(self, backend, source: str, eos_token: Optional[str] = None, pad_token: Optional[str] = None):
        self._tok = backend
        self.source = source
        self.pad_token_id = self.token_to_id(pad_token or "<|endoftext|>")
        self.eos_token_id = self.token_to_id(eos_token or "<|im_end|>")
        for token, found in ((eos_token, self.eos_token_id), (pad_token, self.pad_token_id)):
            if token and found is None:
                raise ConfigError(f"{source}: the special token {token!r} named in tokenizer_config.json is not in "
                                  f"the vocabulary")
        if self.eos_token_id is None:
            self.eos_token_id = self.pad_token_id
        if self.pad_token_id is None:
            self.pad_token_id = self.eos_token_id

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> Optional[int]:
        return self._tok.token_to_id(token)

    def encode(self, text: str) -> List[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> List[List[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def encode_with_offsets(self, text: str):
        """(ids, [(start, end) character span of each token in `text`])."""
        enc = self._tok.encode(text, add_special_tokens=False)
        return enc.ids, enc.offsets

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decode_batch(self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> List[str]:
        return self._tok.decode_batch([list(x) for x in batch], skip_special_tokens=skip_special_tokens)


def _qwen2_pre_tokenizer():
    """Qwen2's regex split, then byte-level mapping (no prefix space)."""
    from tokenizers import Regex, pre_tokenizers
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def _qwen2_pipeline(tok):
    from tokenizers import AddedToken, decoders, normalizers
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _qwen2_pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN2_SPECIAL_TOKENS])
    return tok


def _check_vocab_merges(vocab_path: str, merges_path: str):
    """Name the first merges.txt line whose pieces or result are not in vocab.json."""
    vocab = read_json_object(vocab_path, "vocab.json")
    with open(merges_path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#version"):
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise ConfigError(f"{merges_path}:{lineno}: expected two space-separated tokens, got {line!r}")
            for piece in (parts[0], parts[1], parts[0] + parts[1]):
                if piece not in vocab:
                    raise ConfigError(f"{merges_path}:{lineno}: token {piece!r} is not in {vocab_path} "
                                      f"(vocab.json and merges.txt do not belong together)")


def load_qwen2_tokenizer(vocab_path: str, merges_path: str, eos_token: Optional[str] = None,
                         pad_token: Optional[str] = None) -> Tokenizer:
    """Qwen2/Qwen2.5 byte-level BPE from vocab.json + merges.txt."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import BPE
    for path, what in ((vocab_path, "--vocab_path"), (merges_path, "--merges_file_path")):
        if not path or not os.path.isfile(path):
            raise ConfigError(f"{what}: file not found: {path}")
    _check_vocab_merges(vocab_path, merges_path)
    model = BPE.from_file(vocab_path, merges_path, unk_token=None, continuing_subword_prefix="",
                          end_of_word_suffix="", fuse_unk=False, byte_fallback=False)
    return Tokenizer(_qwen2_pipeline(HFTokenizer(model)), vocab_path, eos_token, pad_token)


def load_tokenizer_json(path: str) -> Tokenizer:
    """A `tokenizer.json` file, or a directory that holds one (HF fast-tokenizer format)."""
    from tokenizers import Tokenizer as HFTokenizer
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise ConfigError(f"{path}: no tokenizer.json found")
    try:
        backend = HFTokenizer.from_file(file)
    except Exception as err:  # tokenizers raises a bare Exception on bad JSON
        raise ConfigError(f"{file}: not a valid tokenizer.json ({err})") from None
    special = tokenizer_config(os.path.dirname(file))
    return Tokenizer(backend, file, token_text(special.get("eos_token")), token_text(special.get("pad_token")))


def tokenizer_config(folder: str) -> dict:
    """The folder's tokenizer_config.json ({} when there is none)."""
    path = os.path.join(folder, "tokenizer_config.json")
    return read_json_object(path) if os.path.isfile(path) else {}


def token_text(token) -> Optional[str]:
    """A special token as tokenizer_config.json gives it: a string, or {"content": ...} (AddedToken)."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) and token else None


class SentencePieceTokenizer:
    """Llama's `tokenizer.model` through sentencepiece, with the same interface as `Tokenizer`."""

    def __init__(self, path: str):
        import sentencepiece as spm
        if not os.path.isfile(path):
            raise ConfigError(f"--vocab_path: file not found: {path}")
        try:
            self._sp = spm.SentencePieceProcessor(model_file=path)
        except (RuntimeError, OSError) as err:
            raise ConfigError(f"{path}: not a sentencepiece model ({err})") from None
        self.source = path
        self.eos_token_id = self._sp.eos_id() if self._sp.eos_id() >= 0 else None
        self.pad_token_id = self._sp.pad_id() if self._sp.pad_id() >= 0 else self.eos_token_id

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def token_to_id(self, token: str) -> Optional[int]:
        i = self._sp.piece_to_id(token)
        return None if i == self._sp.unk_id() and token != self._sp.id_to_piece(i) else i

    def encode(self, text: str) -> List[int]:
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> List[List[int]]:
        return self._sp.encode(list(texts))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._sp.decode(list(ids))

    def decode_batch(self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> List[str]:
        return [self.decode(x) for x in batch]


# what a model folder's tokenizer may be, in the order transformers' AutoTokenizer prefers them
FOLDER_TOKENIZERS = (("tokenizer.json",), ("vocab.json", "merges.txt"), ("tokenizer.model",))


def folder_tokenizer_files(folder: str) -> Optional[tuple]:
    """The first of FOLDER_TOKENIZERS whose files are all in `folder`, or None."""
    for files in FOLDER_TOKENIZERS:
        if all(os.path.isfile(os.path.join(folder, f)) for f in files):
            return files
    return None


def load_folder_tokenizer(folder: str):
    """A model folder's tokenizer: its tokenizer.json (HF fast tokenizer), else Qwen2's vocab.json + merges.txt,
    else a sentencepiece tokenizer.model; eos / pad from its tokenizer_config.json."""
    files = folder_tokenizer_files(folder)
    if files is None:
        raise ConfigError(f"{folder}: holds no tokenizer (expected one of: "
                          f"{'; '.join(' + '.join(f) for f in FOLDER_TOKENIZERS)})")
    paths = [os.path.join(folder, f) for f in files]
    if files == ("tokenizer.json",):
        return load_tokenizer_json(paths[0])
    if files == ("tokenizer.model",):
        return SentencePieceTokenizer(paths[0])
    special = tokenizer_config(folder)
    return load_qwen2_tokenizer(*paths, token_text(special.get("eos_token")), token_text(special.get("pad_token")))


def load_tokenizer(vocab_path: Optional[str] = None, merges_path: Optional[str] = None,
                   tokenizer_dir: Optional[str] = None):
    """Qwen2 BPE (vocab.json + merges.txt), a tokenizer.json, Llama's tokenizer.model, or a folder holding one
    of them (load_folder_tokenizer)."""
    if vocab_path and vocab_path.endswith(".model"):
        return SentencePieceTokenizer(vocab_path)
    folder = tokenizer_dir or (vocab_path if vocab_path and os.path.isdir(vocab_path) else None)
    if folder:
        return load_folder_tokenizer(folder) if os.path.isdir(folder) else load_tokenizer_json(folder)
    return load_qwen2_tokenizer(vocab_path, merges_path)


def train_byte_level_bpe(texts: Sequence[str], vocab_size: int, out_dir: str):
    """Train a small Qwen2-style byte-level BPE and write vocab.json + merges.txt (tests and the demo)."""
    from tokenizers import Tokenizer as HFTokenizer, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer
    tok = HFTokenizer(BPE())
    tok.pre_tokenizer = _qwen2_pre_tokenizer()
    trainer = BpeTrainer(vocab_size=vocab_size, special_tokens=list(QWEN2_SPECIAL_TOKENS), show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    os.makedirs(out_dir, exist_ok=True)
    tok.model.save(out_dir)
    return os.path.join(out_dir, "vocab.json"), os.path.join(out_dir, "merges.txt")
