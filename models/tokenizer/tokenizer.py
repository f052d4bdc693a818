"""Text to token ids and back, as llama.cpp does it, from a GGUF file's own vocabulary.

Special tokens written in the text are split out first (``special_split.py``):
control and unknown tokens only when ``parse_special`` is true, user-defined tokens always
(llama.cpp's ``tokenizer_st_partition``). Each run of plain text between them is then
encoded by the vocabulary's own model:

- ``tokenizer.ggml.model == "llama"`` (SentencePiece): llama.cpp's merge-by-score algorithm
  over the token scores (``spm.py``), with spaces escaped as U+2581 and, with
  ``add_space_prefix``, one prepended to the text at its start and after each special token.
- ``"gpt2"``: llama.cpp's byte-level BPE over the file's merges (``bpe.py``),
  after llama.cpp's pre-tokenizer regexes for ``tokenizer.ggml.pre``
  (``pretokenizers.py``).

Decoding follows llama.cpp's ``token_to_piece``/``detokenize`` over a table of per-token
bytes, so streaming a token at a time gives the same bytes as decoding the whole list.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from polydev.errors import TokenizerError

from .bpe import ByteLevelBPE, byte_level_decode
from ..gguf import GGUFFile, StringArray, TokenType
from .pretokenizers import PreTokenizer, pre_tokenizer
from .special_split import SpecialTokenSplitter
from .spm import SentencePieceEncoder
from .token_texts import TokenTexts

__all__ = ["Tokenizer", "Vocab"]

log = logging.getLogger(__name__)

_SPACE = "\u2581"        # SentencePiece's escaped space

# Texts llama.cpp treats as end of generation (and forces to control type).
_EOG_TEXTS = frozenset([
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<｜end▁of▁sentence｜>",
])
# gpt-oss's harmony format: the tokens that structure a message are always printed, and
# where <|return|> and <|call|> end generation, <|end|> (which closes one message of several)
# does not (llama.cpp's workarounds for o200k_harmony and solar-open, as it words them).
_HARMONY_PRINTED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")
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
_SPECIAL_TYPES = (int(TokenType.CONTROL), int(TokenType.UNKNOWN))
# plain ints: an IntEnum member looked up per token costs more than the rest of _piece
_NORMAL, _BYTE, _USER_DEFINED = (int(TokenType.NORMAL), int(TokenType.BYTE),
                                 int(TokenType.USER_DEFINED))
_MODELS = ("llama", "gpt2")


@dataclass
class Vocab:
    """What a GGUF file says about its vocabulary, with llama.cpp's defaults filled in."""

    model: str                     # "llama" (SentencePiece) or "gpt2" (byte-level BPE)
    tokens: TokenTexts
    types: np.ndarray              # gguf.TokenType per token
    scores: np.ndarray | None
    merges: StringArray | list[str]   # byte-level BPE: "left right", by rank
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
        tokens = TokenTexts.from_strings(texts, empty=lambda i: f"[EMPTY_{i}]")
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
            merges = _strings(f, "tokenizer.ggml.merges")
            defaults = dict(bos=11, eos=11, add_bos=bool(pre.add_bos),
                            space_prefix=False, clean=pre.clean_spaces)
        special = {name: _token_id(f, f"tokenizer.ggml.{name}_token_id", defaults.get(name), n)
                   for name in ("bos", "eos", "unknown", "padding", "eot", "eom")}
        eot = special["eot"]
        if eot is None:
            eot = next((i for t in _EOT_TEXTS for i in [tokens.id_of(t)] if i is not None), None)
        eog = {i for i in (special["eos"], eot, special["eom"]) if i is not None}
        eog.update(eog_texts)
        _harmony_tokens(tokens, types, eog)
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


def _harmony_tokens(tokens: TokenTexts, types: np.ndarray, eog: set[int]) -> None:
    """Apply the harmony rules above to the token types and the end-of-generation set."""
    for text in _HARMONY_PRINTED:
        i = tokens.id_of(text)
        if i is not None:
            types[i] = TokenType.USER_DEFINED
    ends = {tokens[i]: i for i in eog}
    has_call = "<|call|>" in ends or "<|calls|>" in ends
    if "<|end|>" in ends and has_call and ("<|return|>" in ends or "<|flush|>" in ends):
        end = ends["<|end|>"]
        eog.discard(end)
        types[end] = TokenType.USER_DEFINED


class Tokenizer:
    """llama.cpp's tokenizer for one GGUF vocabulary (see the module docstring)."""

    def __init__(self, vocab: Vocab, backend: SentencePieceEncoder | ByteLevelBPE) -> None:
        """``backend`` encodes one run of plain text: a ``SentencePieceEncoder`` for a
        SentencePiece vocabulary, a ``ByteLevelBPE`` for a byte-level BPE one."""
        self.vocab = vocab
        self._backend = backend
        self._splitter = SpecialTokenSplitter(vocab.tokens, vocab.types)
        self._rstrip = _rstrip_patterns(vocab)

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Tokenizer":
        """The tokenizer of ``f``."""
        vocab = Vocab.from_gguf(f)
        _check_unique(vocab.tokens)
        if vocab.model == "llama":
            return cls(vocab, SentencePieceEncoder(vocab.tokens, vocab.scores))
        return cls(vocab, ByteLevelBPE(vocab.tokens, vocab.merges, vocab.pre))

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

    def encode_fragment(self, text: str) -> list[int]:
        """Token ids of ``text`` as a part in the middle of a text: no BOS or EOS, no
        SentencePiece space prefix, control tokens not parsed (a grammar's forced text)."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode_fragment needs a str, got {type(text).__name__}")
        if not text:
            return []
        if self.vocab.model == "llama":
            return self._backend.encode(text.replace(" ", _SPACE))
        return self._encode_text(text, parse_special=False)

    def _encode_text(self, text: str, parse_special: bool) -> list[int]:
        parts = self._splitter.split(text, parse_special)
        if self.vocab.model == "llama":
            return self._encode_sentencepiece(parts)
        out: list[int] = []
        for part in parts:
            if isinstance(part, int):
                out.append(part)
            else:
                out += self._backend.encode(part)
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


# --- checking the vocabulary ---------------------------------------------------------------

def _check_unique(tokens: TokenTexts) -> None:
    """llama.cpp asserts that no token text is listed twice."""
    if tokens.n_distinct != len(tokens):
        seen: set[str] = set()
        dup = next(t for t in tokens if t in seen or seen.add(t))
        raise TokenizerError(f"the vocabulary lists the token {dup!r} twice")


# --- decoding ---------------------------------------------------------------------------

def _piece(vocab: Vocab, token: int, special: bool) -> bytes:
    """The bytes of one token: its text, unescaped; control tokens only when ``special``.
    Computed per call: a table of every piece held about 14 MiB for a 262k vocabulary."""
    text, kind = vocab.tokens[token], int(vocab.types[token])
    if kind == _NORMAL:
        return byte_level_decode(text) if vocab.model == "gpt2" else text.replace(
            _SPACE, " ").encode()
    if kind == _BYTE:                      # "<0xXX>" in SentencePiece vocabularies
        if len(text) == 6 and text.startswith("<0x"):
            return bytes([int(text[3:5], 16)])
        return byte_level_decode(text)
    if kind == _USER_DEFINED or (special and kind in _SPECIAL_TYPES):
        return text.encode()
    return b""                            # control tokens unless special; unused, undefined


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
