"""Text to token ids and back, as llama.cpp does it, from a GGUF file's own vocabulary.

Special tokens written in the text are split out first (``polydev.models.special_split``):
control and unknown tokens only when ``parse_special`` is true, user-defined tokens always
(llama.cpp's ``tokenizer_st_partition``). Each run of plain text between them is then
encoded by the vocabulary's own model:

- ``tokenizer.ggml.model == "llama"`` (SentencePiece): llama.cpp's merge-by-score algorithm
  over the token scores (``polydev.models.spm``), with spaces escaped as U+2581 and, with
  ``add_space_prefix``, one prepended to the text at its start and after each special token.
- ``"gpt2"``: a ``tokenizers.Tokenizer`` (Rust): byte-level BPE with the file's merges and
  llama.cpp's pre-tokenizer regexes for ``tokenizer.ggml.pre``
  (``polydev.models.pretokenizers``). It is built once per distinct vocabulary and then read
  from a cache on disk, keyed by a hash of the file's metadata (``POLYDEV_CACHE_DIR``).

Decoding follows llama.cpp's ``token_to_piece``/``detokenize`` over a table of per-token
bytes, so streaming a token at a time gives the same bytes as decoding the whole list.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
from gguf import TokenType

from polydev.errors import TokenizerError

from .cache import cache_dir, write_atomic
from .gguf import GGUFFile, StringArray
from .pretokenizers import PreTokenizer, pre_tokenizer
from .special_split import SpecialTokenSplitter
from .spm import SentencePieceEncoder
from .token_texts import TokenTexts

__all__ = ["Tokenizer", "Vocab"]

log = logging.getLogger(__name__)

# Bump when the built tokenizer changes for the same file, so stale cache entries are ignored.
_BUILD_VERSION = 6
_SPACE = "\u2581"        # SentencePiece's escaped space
_MISSING = "\u0000polydev:missing\u0000"   # byte-level BPE: a character not in the vocabulary

# Texts llama.cpp treats as end of generation (and forces to control type).
_EOG_TEXTS = frozenset([
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<｜end▁of▁sentence｜>",
])
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>")
# Fill-in-the-middle tokens llama.cpp looks for by text when the file does not name them (and
# forces to control type), by the key that would name them.
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_SPECIAL_TYPES = (TokenType.CONTROL, TokenType.UNKNOWN)
_MODELS = ("llama", "gpt2")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of bytes to printable characters (byte-level BPE)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


_BYTE_DECODER = {c: b for b, c in _bytes_to_unicode().items()}


@dataclass
class Vocab:
    """What a GGUF file says about its vocabulary, with llama.cpp's defaults filled in."""

    model: str                     # "llama" (SentencePiece) or "gpt2" (byte-level BPE)
    tokens: TokenTexts
    types: np.ndarray              # gguf.TokenType per token
    scores: np.ndarray | None
    merges: list[str]
    pre: PreTokenizer | None
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    clean_spaces: bool
    eog_ids: frozenset[int] = field(default_factory=frozenset)
    rstrip_specials: bool = False  # phi-3: special tokens swallow the spaces after them

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Vocab":
        """Read the vocabulary of ``f`` (``TokenizerError`` when it has none we can use)."""
        model = f.get("tokenizer.ggml.model")
        if model not in _MODELS:
            raise TokenizerError(f"{f.path}: tokenizer model {model!r} is not supported "
                                 f"(polydev reads {', '.join(_MODELS)})")
        texts = _strings(f, "tokenizer.ggml.tokens")
        # "[EMPTY_i]": llama.cpp's name for an empty token
        tokens = TokenTexts(t or f"[EMPTY_{i}]" for i, t in enumerate(texts))
        n = len(tokens)
        types = _int_array(f, "tokenizer.ggml.token_type", n, TokenType.NORMAL)
        scores = _float_array(f, "tokenizer.ggml.scores", n)
        looked_up = set(_EOG_TEXTS)
        for key, texts in _FIM_TEXTS.items():
            if f.get(f"tokenizer.ggml.{key}_token_id") is None:
                looked_up.update(texts)
        eog_texts = sorted(i for t in looked_up for i in [tokens.id_of(t)] if i is not None)
        # llama.cpp adds the control attribute to the end-of-generation and FIM tokens it finds
        # by text; a user-defined one then acts as control (split out only with
        # parse_special, printed only with special)
        forced = np.isin(types[eog_texts], [TokenType.NORMAL, TokenType.USER_DEFINED])
        types[eog_texts] = np.where(forced, TokenType.CONTROL, types[eog_texts])
        # end of generation: llama.cpp's list, plus the FIM pad, repo and separator tokens
        ends = set(_EOG_TEXTS).union(*(_FIM_TEXTS[k] for k in ("fim_pad", "fim_rep", "fim_sep")))
        eog_texts = [i for i in eog_texts if tokens[i] in ends]
        eog_texts += [i for k in ("fim_pad", "fim_rep", "fim_sep")
                      for i in [_token_id(f, f"tokenizer.ggml.{k}_token_id", None, n)]
                      if i is not None]
        if model == "llama":
            pre, merges = None, []
            defaults = dict(bos=1, eos=2, unknown=0, add_bos=True, space_prefix=True,
                            clean=False)
        else:
            pre_name = f.get("tokenizer.ggml.pre") or "default"
            pre = pre_tokenizer(pre_name)
            if pre is None:
                raise TokenizerError(f"{f.path}: pre-tokenizer {pre_name!r} is not supported")
            merges = _strings(f, "tokenizer.ggml.merges").tolist()
            defaults = dict(bos=11, eos=11, add_bos=bool(pre.add_bos),
                            space_prefix=False, clean=pre.clean_spaces)
        special = {name: _token_id(f, f"tokenizer.ggml.{name}_token_id", defaults.get(name), n)
                   for name in ("bos", "eos", "unknown", "padding", "eot", "eom")}
        eot = special["eot"]
        if eot is None:
            eot = next((i for t in _EOT_TEXTS for i in [tokens.id_of(t)] if i is not None), None)
        eog = {i for i in (special["eos"], eot, special["eom"]) if i is not None}
        eog.update(eog_texts)
        return cls(
            model=model, tokens=tokens, types=types, scores=scores, merges=merges, pre=pre,
            bos_id=special["bos"], eos_id=special["eos"], eot_id=eot,
            unk_id=special["unknown"],
            pad_id=special["padding"],
            add_bos=bool(f.get("tokenizer.ggml.add_bos_token", defaults["add_bos"])),
            add_eos=bool(f.get("tokenizer.ggml.add_eos_token", False)),
            add_space_prefix=bool(f.get("tokenizer.ggml.add_space_prefix",
                                        defaults["space_prefix"])),
            clean_spaces=defaults["clean"], eog_ids=frozenset(eog),
            rstrip_specials=_is_phi3(f))

    def __len__(self) -> int:
        return len(self.tokens)


class Tokenizer:
    """llama.cpp's tokenizer for one GGUF vocabulary (see the module docstring)."""

    def __init__(self, vocab: Vocab, backend) -> None:
        """``backend`` encodes one run of plain text: a ``SentencePieceEncoder`` for a
        SentencePiece vocabulary, a ``tokenizers.Tokenizer`` for a byte-level BPE one."""
        self.vocab = vocab
        self._backend = backend
        self._splitter = SpecialTokenSplitter(vocab.tokens, vocab.types)
        self._rstrip = _rstrip_patterns(vocab)

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, f: GGUFFile, cache: bool = True) -> "Tokenizer":
        """The tokenizer of ``f``. A byte-level BPE one is built once per distinct vocabulary
        and then read from the cache (``cache=False`` always builds)."""
        vocab = Vocab.from_gguf(f)
        _check_unique(vocab.tokens)
        if vocab.model == "llama":
            return cls(vocab, SentencePieceEncoder(vocab.tokens, vocab.scores))
        path = _cache_path(f) if cache else None
        backend = _load_cached(path) if path is not None else None
        if backend is None:
            start = time.perf_counter()
            backend = _build_bpe(vocab)
            log.info("built the %s tokenizer of %s (%d tokens) in %.2f s", vocab.model, f.path,
                     len(vocab), time.perf_counter() - start)
            if path is not None:
                _store(path, backend)
        return cls(vocab, backend)

    # --- properties -----------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        """How many tokens the vocabulary has."""
        return len(self.vocab.tokens)

    @property
    def bos_id(self) -> int | None:
        return self.vocab.bos_id

    @property
    def eos_id(self) -> int | None:
        return self.vocab.eos_id

    @property
    def eot_id(self) -> int | None:
        return self.vocab.eot_id

    @property
    def eog_ids(self) -> frozenset[int]:
        """Every token that ends generation (llama.cpp's ``special_eog_ids``)."""
        return self.vocab.eog_ids

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends generation."""
        return token in self.vocab.eog_ids

    # --- encoding -------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text`` (llama.cpp's ``tokenize``): ``add_special`` adds BOS/EOS as the
        vocabulary asks; ``parse_special`` lets control tokens written in the text through."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode needs a str, got {type(text).__name__}")
        out: list[int] = []
        if add_special and self.vocab.add_bos:
            out.append(self._required("bos"))
        if text and self._rstrip is not None:
            text = self._rstrip[parse_special].sub(r"\1", text)
        if text:
            out += self._encode_text(text, parse_special)
        if add_special and self.vocab.add_eos:
            out.append(self._required("eos"))
        return out

    def _encode_text(self, text: str, parse_special: bool) -> list[int]:
        parts = self._splitter.split(text, parse_special)
        if self.vocab.model == "llama":
            return self._encode_sentencepiece(parts)
        out: list[int] = []
        missing = self.n_vocab         # a character the vocabulary lacks (see _build_bpe)
        for part in parts:
            if isinstance(part, int):
                out.append(part)
            else:
                out += [i for i in self._backend.encode(part, add_special_tokens=False).ids
                        if i != missing]
        return out

    def _encode_sentencepiece(self, parts: list[str | int]) -> list[int]:
        out: list[int] = []
        after_special = True           # llama.cpp: the text's start counts as after one
        for part in parts:
            if isinstance(part, int):
                out.append(part)
                after_special = True
                continue
            if self.vocab.add_space_prefix and after_special:
                part = " " + part
            out += self._backend.encode(part.replace(" ", _SPACE))
            after_special = False
        return out

    def _required(self, which: str) -> int:
        token = getattr(self.vocab, f"{which}_id")
        if token is None:
            raise TokenizerError(f"the vocabulary asks for a {which.upper()} token but has none")
        return token

    # --- decoding -------------------------------------------------------------------------

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        """The bytes ``token`` stands for (llama.cpp's ``token_to_piece``); control tokens give
        their text only when ``special``. A piece may be part of a UTF-8 character."""
        self._check_token(token)
        return _piece(self.vocab, token, special)

    def decode_bytes(self, tokens: Iterable[int], remove_special: bool = False,
                     unparse_special: bool = False) -> bytes:
        """llama.cpp's ``detokenize``, as bytes."""
        ids = [int(t) for t in tokens]
        for t in ids:
            self._check_token(t)
        remove_space = self.vocab.add_space_prefix
        if remove_special and self.vocab.add_bos and ids and ids[0] == self.vocab.bos_id:
            remove_space, ids = False, ids[1:]
        if remove_special and self.vocab.add_eos and ids and ids[-1] == self.vocab.eos_id:
            ids = ids[:-1]
        pieces = [_piece(self.vocab, t, unparse_special) for t in ids]
        if remove_space and pieces and pieces[0].startswith(b" "):
            pieces[0] = pieces[0][1:]
        text = b"".join(pieces)
        return _clean_spaces(text) if self.vocab.clean_spaces else text

    def decode(self, tokens: Iterable[int], remove_special: bool = False,
               unparse_special: bool = False) -> str:
        """llama.cpp's ``detokenize``: the text of ``tokens`` (invalid UTF-8 replaced)."""
        return self.decode_bytes(tokens, remove_special, unparse_special).decode(
            "utf-8", errors="replace")

    def _check_token(self, token: int) -> None:
        if not 0 <= token < self.n_vocab:
            raise TokenizerError(f"token id {token} is outside the vocabulary [0, {self.n_vocab})")

    def __repr__(self) -> str:
        pre = f", pre={self.vocab.pre.name!r}" if self.vocab.pre else ""
        return f"Tokenizer({self.vocab.model!r}{pre}, n_vocab={self.n_vocab})"


# --- reading the vocabulary ---------------------------------------------------------------

def _strings(f: GGUFFile, key: str) -> StringArray:
    value = f.get(key)
    if value is None:
        raise TokenizerError(f"{f.path}: the vocabulary has no {key}")
    if not isinstance(value, StringArray):
        raise TokenizerError(f"{f.path}: {key} must be an array of strings")
    return value


def _int_array(f: GGUFFile, key: str, n: int, default: int) -> np.ndarray:
    value = f.get(key)
    if value is None:
        return np.full(n, default, dtype=np.int32)
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "iu" or len(value) < n:
        raise TokenizerError(f"{f.path}: {key} must be an integer array of {n} entries")
    return value[:n].astype(np.int32)       # a copy: llama.cpp's type overrides apply to it


def _float_array(f: GGUFFile, key: str, n: int) -> np.ndarray | None:
    value = f.get(key)
    if value is None:
        return None
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "iuf" or len(value) < n:
        raise TokenizerError(f"{f.path}: {key} must be a numeric array of {n} entries")
    return value[:n].astype(np.float32)


def _token_id(f: GGUFFile, key: str, default: int | None, n: int) -> int | None:
    value = f.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TokenizerError(f"{f.path}: {key} must be an integer, got {value!r}")
    if not 0 <= value < n:
        log.warning("%s: %s = %d is outside the vocabulary; ignoring it", f.path, key, value)
        return None
    return value


_NOT_RSTRIPPED = ("<unk>", "<s>", "<|endoftext|>")     # llama.cpp's phi-3 exceptions


def _rstrip_patterns(vocab: Vocab) -> dict[bool, re.Pattern] | None:
    """phi-3's special tokens swallow the ASCII whitespace after them (llama.cpp's RSTRIP,
    with C's isspace; Hugging Face's rstrip would take Unicode whitespace too, so it is done
    here): by ``parse_special``, a regex matching such a token and that whitespace. Control
    tokens are split out only when special tokens are parsed; user-defined ones always."""
    if not vocab.rstrip_specials:
        return None
    types = vocab.types
    by_kind: dict[bool, list[str]] = {True: [], False: []}
    for i in np.nonzero(np.isin(types, [*_SPECIAL_TYPES, TokenType.USER_DEFINED]))[0]:
        text = vocab.tokens[i]
        if text in _NOT_RSTRIPPED:
            continue
        by_kind[True].append(text)
        if types[i] == TokenType.USER_DEFINED:
            by_kind[False].append(text)
    out = {}
    for parse_special, texts in by_kind.items():
        alternatives = "|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True))
        out[parse_special] = re.compile(f"({alternatives})[ \t\n\v\f\r]+" if texts
                                        else r"()(?!)")
    return out


def _is_phi3(f: GGUFFile) -> bool:
    name = str(f.get("general.name", "")).lower()
    return "phi-3" in name or "phi3" in name


# --- building the byte-level BPE ----------------------------------------------------------

def _check_unique(tokens: TokenTexts) -> None:
    """llama.cpp asserts that no token text is listed twice."""
    if tokens.n_distinct != len(tokens):
        seen: set[str] = set()
        dup = next(t for t in tokens if t in seen or seen.add(t))
        raise TokenizerError(f"the vocabulary lists the token {dup!r} twice")


def _build_bpe(vocab: Vocab):
    """The byte-level BPE of a "gpt2" vocabulary; special tokens are split out before it."""
    from tokenizers import Regex
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import pre_tokenizers
    from tokenizers.models import BPE

    ids = {t: i for i, t in enumerate(vocab.tokens)}
    # A character the vocabulary lacks stays a symbol of its own in llama.cpp: it blocks
    # merges across it and is then dropped. An "unknown" token one past the vocabulary does
    # the same here (encode drops its id).
    merges = _file_merges(vocab, ids)
    ids[_MISSING] = len(vocab.tokens)
    hf = HFTokenizer(BPE(vocab=ids, merges=merges, unk_token=_MISSING, fuse_unk=False,
                         ignore_merges=vocab.pre.ignore_merges))
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in vocab.pre.regexes]
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return hf


def _file_merges(vocab: Vocab, ids: dict[str, int]) -> list[tuple[str, str]]:
    merges = []
    for rank, merge in enumerate(vocab.merges):
        cut = merge.find(" ", 1)          # llama.cpp splits at the first space after pos 0
        if cut < 0:
            raise TokenizerError(f"merge #{rank} {merge!r} has no space between its two parts")
        left, right = merge[:cut], merge[cut + 1:]
        if left in ids and right in ids and left + right in ids:
            merges.append((left, right))
    return merges


# --- decoding ---------------------------------------------------------------------------

def _piece(vocab: Vocab, token: int, special: bool) -> bytes:
    """The bytes of one token: its text, unescaped; control tokens only when ``special``.
    Computed per call: a table of every piece held about 14 MiB for a 262k vocabulary."""
    text, kind = vocab.tokens[token], vocab.types[token]
    if kind == TokenType.NORMAL:
        return _byte_level_decode(text) if vocab.model == "gpt2" else text.replace(
            _SPACE, " ").encode()
    if kind == TokenType.BYTE:             # "<0xXX>" in SentencePiece vocabularies
        if len(text) == 6 and text.startswith("<0x"):
            return bytes([int(text[3:5], 16)])
        return _byte_level_decode(text)
    if kind == TokenType.USER_DEFINED or (special and kind in _SPECIAL_TYPES):
        return text.encode()
    return b""                            # control tokens unless special; unused, undefined


def _byte_level_decode(text: str) -> bytes:
    return b"".join(bytes([_BYTE_DECODER[c]]) if c in _BYTE_DECODER else c.encode()
                    for c in text)


def _clean_spaces(text: bytes) -> bytes:
    """llama.cpp's clean_up_tokenization_spaces, pass for pass (it edits in place, and the
    second pass's edits are seen by its next steps): no space before ``?!.,``, none around a
    lone apostrophe, none before ``'s``, ``'m``, ``'re`` and ``'ve``."""
    t = bytearray(text)
    n, total = len(t), min(len(t), 1)
    for i in range(1, n):
        if t[i - 1] == 0x20 and t[i] in b"?!.,":
            total -= 1
        t[total] = t[i]
        total += 1
    n, total, i = total, min(total, 1), 1
    while i < n:
        x = t[i]
        if x == 0x27 and i + 1 < n and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            total -= 1
            i += 1
            t[i] = 0
        t[total] = x
        total += 1
        i += 1
    n, total = total, min(total, 1)
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            if t[i + 1] in b"sm" or (i + 2 < n and bytes(t[i + 1:i + 3]) in (b"re", b"ve")):
                total -= 1
        t[total] = x
        total += 1
    return bytes(t[:total])


# --- the cache -----------------------------------------------------------------------------

def _cache_path(f: GGUFFile) -> Path | None:
    digest = hashlib.blake2b(f.header_bytes(), digest_size=16)
    digest.update(f"polydev-tokenizer-{_BUILD_VERSION}".encode())
    try:
        return cache_dir("tokenizers") / f"{digest.hexdigest()}.json"
    except OSError as e:
        log.warning("no tokenizer cache (%s); building every time", e)
        return None


def _load_cached(path: Path):
    from tokenizers import Tokenizer as HFTokenizer

    if not path.is_file():
        return None
    try:
        return HFTokenizer.from_file(str(path))
    except Exception as e:            # a damaged entry is rebuilt, never trusted
        log.warning("ignoring the damaged tokenizer cache %s (%s)", path, e)
        return None


def _store(path: Path, backend) -> None:
    try:
        write_atomic(path, backend.to_str().encode())
    except OSError as e:
        log.warning("could not cache the tokenizer in %s (%s)", path, e)
