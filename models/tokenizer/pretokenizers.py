"""llama.cpp's pre-tokenizers: how a byte-level BPE vocabulary splits text into words before
merging, one entry per ``tokenizer.ggml.pre`` value.

The regular expressions are llama.cpp's (``llm_tokenizer_bpe`` in ``llama-vocab.cpp``), which
are the Hugging Face ``tokenizer.json`` ones with ``(?i:...)`` spelled out; each one splits the
pieces the previous one left, keeping matches and the text between them as separate pieces.
The flags are llama.cpp's too: ``clean_spaces`` (detokenize drops the space before ``.,!?``
and some contractions), ``ignore_merges`` (a word that is a token is taken whole) and
``add_bos`` (BOS is added unless the file says otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PreTokenizer", "PRE_TOKENIZERS", "pre_tokenizer"]


@dataclass(frozen=True)
class PreTokenizer:
    """The splitting regexes of one pre-tokenizer type and llama.cpp's flags for it."""

    name: str
    regexes: tuple[str, ...]
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool | None = None      # None: the tokenizer model's default


_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_DEEPSEEK3 = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"
              r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Letters in the scripts DeepSeek lists; written as escapes so no editor normalises them.
_DEEPSEEK_LLM_LETTERS = (
    "\\s?"
    "[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1"
    "\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8"
    "-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-"
    "\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-"
    "\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-"
    "\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-"
    "\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149"
    "\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13"
    "-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943]+")
# tekken (Mistral) and gpt-4o (gpt-oss, llama4) as llama.cpp writes them: the tokenizer.json's
# case classes ([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}...]+) become "letters not a-z" then
# "letters not A-Z", which is what llama.cpp's ids follow.
_UPPER_THEN_LOWER = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+<tail>"
                     r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*<tail>")
_TEKKEN = (_UPPER_THEN_LOWER.replace("<tail>", "")
           + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (_UPPER_THEN_LOWER.replace("<tail>", _CONTRACTIONS + "?")
          + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CJK = "[一-龥ࠀ-一가-퟿]+"
_POETIC = r" ?[^(\s|.,!?…。，、।۔،)]+"


def _family(names: str, regexes: tuple[str, ...], **flags) -> dict[str, PreTokenizer]:
    return {name: PreTokenizer(name, regexes, **flags) for name in names.split()}


PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    **_family("default", (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")),
    **_family("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
              (_LLAMA3,), ignore_merges=True, add_bos=True),
    **_family("dbrx smaug-bpe", (_LLAMA3,)),
    **_family("deepseek-llm", ("[\r\n]", _DEEPSEEK_LLM_LETTERS, "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
                               r"\s+$", _CJK, r"\p{N}+"), clean_spaces=False),
    **_family("deepseek-coder", ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
              clean_spaces=False),
    **_family("deepseek-v3 hunyuan-dense joyai-llm",
              (r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", _DEEPSEEK3), clean_spaces=False),
    **_family("falcon", (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]")),
    **_family("gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum "
              "modern-bert mpt olmo jais exaone4 trillion granite-docling", (_GPT2,)),
    **_family("starcoder refact codeshell exaone minerva-7b", (r"\p{N}", _GPT2)),
    **_family("command-r smollm", (r"\p{N}", _GPT2), clean_spaces=False),
    **_family("stablelm2", (_QWEN2,)),
    **_family("qwen2 deepseek-r1-qwen kormo f2llmv2 megrez", (_QWEN2,), clean_spaces=False),
    **_family("qwen35", (_QWEN35,), clean_spaces=False),
    **_family("poro-chat", (_POETIC,), clean_spaces=False),
    **_family("bloom gpt3-finnish", (_POETIC,)),
    **_family("viking", (_POETIC, r"\p{N}"), clean_spaces=False),
    **_family("tekken", (_TEKKEN,), clean_spaces=False, ignore_merges=True, add_bos=True),
    **_family("gpt-4o llama4 kanana2 talkie", (_GPT4O,), clean_spaces=False),
}


def pre_tokenizer(name: str | None) -> PreTokenizer | None:
    """The pre-tokenizer llama.cpp uses for ``tokenizer.ggml.pre`` = ``name`` (a missing value
    means "default"); None when polydev does not know it."""
    return PRE_TOKENIZERS.get(name or "default")
