"""The model families' own turn formats, for a model file that carries no
``tokenizer.chat_template``: llama.cpp's built-in templates (``llm_chat_apply_template`` in
its ``llama-chat.cpp``), each written here as a small jinja template that ``render_chat``
renders like a file's own, under llama.cpp's name for it.

A format names the tokens that mark its turns (``markers``): it only fits a vocabulary that
has them all, since a marker the vocabulary lacks would be written as plain text the model
never learnt to end a turn with. Which format a model gets is ``chat_fallback``'s choice.

Where llama.cpp trims a message (gemma, llama3, mistral-v3's replies) these use jinja's
``trim``, which also strips Unicode spaces (a no-break space) where llama.cpp strips ASCII
whitespace only: a difference only for a message that begins or ends with one.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

__all__ = ["ChatFormat", "CHATML", "CHAT_FORMATS", "DEEPSEEK2", "DEEPSEEK3", "GEMMA", "GPT_OSS",
           "GRANITE", "LLAMA3", "MISTRAL_V3", "MISTRAL_V3_TEKKEN", "MISTRAL_V7",
           "MISTRAL_V7_TEKKEN", "PHI3", "PHI4", "VICUNA"]


@dataclass(frozen=True)
class ChatFormat:
    """One turn format: llama.cpp's ``name`` for it, a ``description`` for the log, the token
    texts a vocabulary must have for it to fit (``markers``; none for a plain-text format),
    the jinja ``template``, and where the format differs by tokenizer (Mistral's tekken
    vocabularies drop the spaces), the ``tokenizer_model`` it is for ("gpt2": byte-level
    BPE, "llama": SentencePiece)."""

    name: str
    description: str
    markers: tuple[str, ...]
    template: str
    tokenizer_model: str | None = None

    def fits(self, tokens: Container[str], tokenizer_model: str) -> bool:
        """Whether a vocabulary of ``tokens`` (anything ``in`` works on) and tokenizer model
        ``tokenizer_model`` has every marker of this format."""
        return ((self.tokenizer_model is None or self.tokenizer_model == tokenizer_model)
                and all(marker in tokens for marker in self.markers))


def _generation_prompt(text: str) -> str:
    return "{%- if add_generation_prompt -%}{{- '" + text + "' -}}{%- endif -%}"


CHATML = ChatFormat(
    "chatml", "ChatML", ("<|im_start|>", "<|im_end|>"),
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' -}}"
    "{%- endfor -%}" + _generation_prompt("<|im_start|>assistant\n"))

# gemma has no system turn: the system messages go, trimmed and joined, at the head of the
# first user turn after them; the assistant's role is "model".
GEMMA = ChatFormat(
    "gemma", "gemma's turn format", ("<start_of_turn>", "<end_of_turn>"),
    "{%- set ns = namespace(system='') -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}{%- set ns.system = ns.system + m.content | trim -%}"
    "{%- else -%}"
    "{%- set role = 'model' if m.role == 'assistant' else m.role -%}"
    "{{- '<start_of_turn>' + role + '\n' -}}"
    "{%- if ns.system and role != 'model' -%}"
    "{{- ns.system + '\n\n' -}}{%- set ns.system = '' -%}"
    "{%- endif -%}"
    "{{- m.content | trim + '<end_of_turn>\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}" + _generation_prompt("<start_of_turn>model\n"))

LLAMA3 = ChatFormat(
    "llama3", "Llama 3's turn format", ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    "{%- for m in messages -%}"
    "{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\n\n' + m.content | trim"
    " + '<|eot_id|>' -}}"
    "{%- endfor -%}" + _generation_prompt("<|start_header_id|>assistant<|end_header_id|>\n\n"))


def _mistral_v3(space: str, trim_replies: bool) -> str:
    """Mistral's v3 format: a system message opens the [INST] block the next user message
    closes; a reply ends with </s>. No generation prompt: [/INST] is where the reply starts."""
    reply = "(m.content | trim)" if trim_replies else "m.content"
    return ("{%- set ns = namespace(open=false) -%}"
            "{%- for m in messages -%}"
            "{%- if not ns.open -%}{{- '[INST]" + space + "' -}}{%- set ns.open = true -%}"
            "{%- endif -%}"
            "{%- if m.role == 'system' -%}{{- m.content + '\n\n' -}}"
            "{%- elif m.role == 'user' -%}{{- m.content + '[/INST]' -}}"
            "{%- else -%}{{- '" + space + "' + " + reply + " + '</s>' -}}"
            "{%- set ns.open = false -%}"
            "{%- endif -%}"
            "{%- endfor -%}")


def _mistral_v7(space: str) -> str:
    """Mistral's v7 format: [SYSTEM_PROMPT] and [INST] blocks; a reply ends with </s>."""
    return ("{%- for m in messages -%}"
            "{%- if m.role == 'system' -%}"
            "{{- '[SYSTEM_PROMPT]" + space + "' + m.content + '[/SYSTEM_PROMPT]' -}}"
            "{%- elif m.role == 'user' -%}{{- '[INST]" + space + "' + m.content + '[/INST]' -}}"
            "{%- else -%}{{- '" + space + "' + m.content + '</s>' -}}"
            "{%- endif -%}"
            "{%- endfor -%}")


_MISTRAL_V3_MARKERS = ("[INST]", "[/INST]", "</s>")
_MISTRAL_V7_MARKERS = ("[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]") + _MISTRAL_V3_MARKERS
MISTRAL_V3 = ChatFormat("mistral-v3", "Mistral's v3 turn format", _MISTRAL_V3_MARKERS,
                        _mistral_v3(" ", trim_replies=True), tokenizer_model="llama")
MISTRAL_V3_TEKKEN = ChatFormat("mistral-v3-tekken", "Mistral's v3 (tekken) turn format",
                               _MISTRAL_V3_MARKERS, _mistral_v3("", trim_replies=False),
                               tokenizer_model="gpt2")
MISTRAL_V7 = ChatFormat("mistral-v7", "Mistral's v7 turn format", _MISTRAL_V7_MARKERS,
                        _mistral_v7(" "), tokenizer_model="llama")
MISTRAL_V7_TEKKEN = ChatFormat("mistral-v7-tekken", "Mistral's v7 (tekken) turn format",
                               _MISTRAL_V7_MARKERS, _mistral_v7(""), tokenizer_model="gpt2")

PHI3 = ChatFormat(
    "phi3", "Phi-3's turn format", ("<|user|>", "<|assistant|>", "<|end|>"),
    "{%- for m in messages -%}"
    "{{- '<|' + m.role + '|>\n' + m.content + '<|end|>\n' -}}"
    "{%- endfor -%}" + _generation_prompt("<|assistant|>\n"))

PHI4 = ChatFormat(
    "phi4", "Phi-4's turn format", ("<|im_start|>", "<|im_sep|>", "<|im_end|>"),
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m.role + '<|im_sep|>' + m.content + '<|im_end|>' -}}"
    "{%- endfor -%}" + _generation_prompt("<|im_start|>assistant<|im_sep|>"))

GRANITE = ChatFormat(
    "granite", "Granite's turn format", ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>"),
    "{%- for m in messages -%}"
    "{{- '<|start_of_role|>' + m.role + '<|end_of_role|>' + m.content + '<|end_of_text|>\n' -}}"
    "{%- endfor -%}" + _generation_prompt("<|start_of_role|>assistant<|end_of_role|>"))

_DEEPSEEK_END = "<\uff5cend\u2581of\u2581sentence\uff5c>"       # <｜end▁of▁sentence｜>
_DEEPSEEK_USER, _DEEPSEEK_ASSISTANT = "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>"

DEEPSEEK2 = ChatFormat(
    "deepseek2", "DeepSeek-V2's turn format", (_DEEPSEEK_END,),
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}{{- m.content + '\n\n' -}}"
    "{%- elif m.role == 'user' -%}{{- 'User: ' + m.content + '\n\n' -}}"
    "{%- elif m.role == 'assistant' -%}{{- 'Assistant: ' + m.content + '" + _DEEPSEEK_END
    + "' -}}"
    "{%- endif -%}"
    "{%- endfor -%}" + _generation_prompt("Assistant:"))

DEEPSEEK3 = ChatFormat(
    "deepseek3", "DeepSeek-V3's turn format", (_DEEPSEEK_USER, _DEEPSEEK_ASSISTANT, _DEEPSEEK_END),
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}{{- m.content + '\n\n' -}}"
    "{%- elif m.role == 'user' -%}{{- '" + _DEEPSEEK_USER + "' + m.content -}}"
    "{%- elif m.role == 'assistant' -%}{{- '" + _DEEPSEEK_ASSISTANT + "' + m.content + '"
    + _DEEPSEEK_END + "' -}}"
    "{%- endif -%}"
    "{%- endfor -%}" + _generation_prompt(_DEEPSEEK_ASSISTANT))

# gpt-oss's harmony, as llama.cpp's built-in writes it: without the channel declarations of
# the model's own template (every gpt-oss file we know of carries that template).
GPT_OSS = ChatFormat(
    "gpt-oss", "gpt-oss's harmony turn format",
    ("<|start|>", "<|message|>", "<|end|>", "<|return|>"),
    "{%- for m in messages -%}"
    "{{- '<|start|>' + m.role + '<|message|>' + m.content -}}"
    "{{- '<|return|>' if m.role == 'assistant' else '<|end|>' -}}"
    "{%- endfor -%}" + _generation_prompt("<|start|>assistant"))

# The plain-text format (llama.cpp's "vicuna") for a vocabulary with no turn markers at all;
# a reply ends with the model's own end-of-sequence token, where llama.cpp writes "</s>"
# (the same text in the SentencePiece vocabularies vicuna was made for).
VICUNA = ChatFormat(
    "vicuna", "the plain USER:/ASSISTANT: format", (),
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}{{- m.content + '\n\n' -}}"
    "{%- elif m.role == 'user' -%}{{- 'USER: ' + m.content + '\n' -}}"
    "{%- elif m.role == 'assistant' -%}{{- 'ASSISTANT: ' + m.content + eos_token + '\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}" + _generation_prompt("ASSISTANT:"))

CHAT_FORMATS: dict[str, ChatFormat] = {f.name: f for f in (
    CHATML, GEMMA, LLAMA3, MISTRAL_V3, MISTRAL_V3_TEKKEN, MISTRAL_V7, MISTRAL_V7_TEKKEN, PHI3,
    PHI4, GRANITE, DEEPSEEK2, DEEPSEEK3, GPT_OSS, VICUNA)}
"""Every format, by llama.cpp's name."""
