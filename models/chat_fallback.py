"""Which turn format a model without a ``tokenizer.chat_template`` is prompted in.

llama.cpp prompts such a model in ChatML; a model of another family then reads ChatML's
markers as plain text and writes them back as text (gemma-3 answered "...<|im_end|>
<|im_start|>user ..."), since only its own end-of-turn token ends generation. Here the model's
architecture names its family's formats (``FAMILY_FORMATS``) and the vocabulary confirms one:
the first whose turn markers are all tokens of it. Where none fits (a family without a
format of its own, a fine-tune with another vocabulary), ChatML if the vocabulary has its
markers, else the plain USER:/ASSISTANT: format. The choice is logged once per model file,
with its reason.
"""

from __future__ import annotations

import logging
from collections.abc import Container
from dataclasses import dataclass

from .chat_formats import (CHATML, DEEPSEEK2, DEEPSEEK3, GEMMA, GPT_OSS, GRANITE, LLAMA3,
                           MISTRAL_V3, MISTRAL_V3_TEKKEN, MISTRAL_V7, MISTRAL_V7_TEKKEN, PHI3,
                           PHI4, VICUNA, ChatFormat)

__all__ = ["FAMILY_FORMATS", "FormatChoice", "choose_format", "fallback_format"]

log = logging.getLogger(__name__)

_MISTRAL = (MISTRAL_V7_TEKKEN, MISTRAL_V7, MISTRAL_V3_TEKKEN, MISTRAL_V3)

FAMILY_FORMATS: dict[str, tuple[ChatFormat, ...]] = {
    # a llama file may be Llama 3, SmolLM2 (ChatML) or Mistral: the vocabulary tells; Llama 2's
    # and Mistral v0.1's vocabularies have no [INST] token, so they get the plain format
    "llama": (LLAMA3, CHATML) + _MISTRAL,
    "mistral3": (MISTRAL_V7_TEKKEN, MISTRAL_V7),
    "qwen2": (CHATML,), "qwen2moe": (CHATML,), "qwen3": (CHATML,), "qwen3moe": (CHATML,),
    "smollm3": (CHATML,),
    "gemma2": (GEMMA,), "gemma3": (GEMMA,),
    # Phi-3 and Phi-4-mini speak <|user|>..., Phi-4 ChatML with <|im_sep|>
    "phi3": (PHI3, PHI4),
    "granite": (GRANITE,),
    # DeepSeek-V2.5 and V3 have <｜User｜> and <｜Assistant｜> tokens, V2 writes "User: " in text
    "deepseek2": (DEEPSEEK3, DEEPSEEK2),
    "gpt-oss": (GPT_OSS,),
    # llama.cpp has no OLMo 2 format (its files carry their template)
    "olmo2": (),
}
"""The formats of each architecture's family, the most specific first."""


@dataclass(frozen=True)
class FormatChoice:
    """The chosen ``format`` and, for the log, why (``reason``)."""

    format: ChatFormat
    reason: str


def choose_format(arch: str, tokens: Container[str], tokenizer_model: str) -> FormatChoice:
    """The format for a model of architecture ``arch`` whose vocabulary has ``tokens`` (any
    container of token texts), with tokenizer model ``tokenizer_model`` ("llama" or
    "gpt2", ``tokenizer.ggml.model``)."""
    for fmt in FAMILY_FORMATS.get(arch, ()):
        if fmt.fits(tokens, tokenizer_model):
            return FormatChoice(fmt, f"architecture {arch}; its vocabulary has "
                                     f"{_listed(fmt.markers)}")
    unmatched = (f"no turn format of architecture {arch} fits its vocabulary"
                 if FAMILY_FORMATS.get(arch) else f"architecture {arch} has no format of its own")
    if CHATML.fits(tokens, tokenizer_model):
        return FormatChoice(CHATML, f"{unmatched}, which has {_listed(CHATML.markers)}")
    return FormatChoice(VICUNA, f"{unmatched}, and it has no ChatML markers either")


_logged: set[tuple[str, str]] = set()       # (source, format): a server renders every request


def fallback_format(arch: str, tokens: Container[str], tokenizer_model: str,
                    source: str) -> ChatFormat:
    """``choose_format``'s format, the choice logged once per ``source`` (the model file)."""
    choice = choose_format(arch, tokens, tokenizer_model)
    key = (source, choice.format.name)
    if key not in _logged:
        _logged.add(key)
        log.warning("the model %s has no chat template; using %s (%s)", source,
                    choice.format.description, choice.reason)
    return choice.format


def _listed(markers: tuple[str, ...]) -> str:
    return " and ".join(", ".join(markers).rsplit(", ", 1))
