"""Chat messages to a prompt with the model's own ``tokenizer.chat_template``, rendered with
jinja2 as transformers and llama.cpp render it (sandboxed, ``trim_blocks``/``lstrip_blocks``,
``raise_exception``, ``strftime_now``, a ``tojson`` that returns plain text,
``bos_token``/``eos_token``, ``add_generation_prompt``). A model without a template is
prompted in its family's own turn format (``chat_fallback`` chooses among ``chat_formats``);
``render_chat`` itself, told no template, falls back to ChatML as llama.cpp does."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any, Sequence

from polydev.errors import InvalidArgumentError, MissingDependencyError

from .chat_formats import CHAT_FORMATS

__all__ = ["render_chat", "CHATML"]

log = logging.getLogger(__name__)
_warned: set[str] = set()      # said once per process: a server renders every request


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


CHATML: str = CHAT_FORMATS["chatml"].template      # the template's text, for render_chat


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """JSON as plain text, as transformers' templates expect: jinja2's own ``tojson`` returns
    markup, and ``"<|start|>" + x|tojson`` then HTML-escapes the plain text beside it (gpt-oss's
    tool messages, Qwen's tool lists)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys, default=_listed)


def _listed(value: Any) -> list:
    """What JSON cannot write as it is: an iterable (a template's ``map`` or ``select``
    filter gives a generator) as a list."""
    try:
        return list(value)
    except TypeError:
        raise TypeError(f"{type(value).__name__} is not JSON serializable") from None


def render_chat(template: str | None, messages: Sequence[dict[str, Any]], *, bos_token: str = "",
                eos_token: str = "", add_generation_prompt: bool = True,
                tools: Sequence[dict[str, Any]] | None = None) -> str:
    """The prompt text for ``messages`` (dicts with "role" and "content", and OpenAI's
    ``tool_calls``, ``tool_call_id`` and ``name`` where they have them); ``tools``: the
    functions the model may call (OpenAI's ``tools`` list), given to the template as
    ``tools``."""
    try:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise MissingDependencyError("chat templates need jinja2: pip install "
                                     "'polydev[models]'") from None
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise InvalidArgumentError(f"message {i} must be a dict with 'role' and 'content', "
                                       f"got {m!r}")
    if template is None:
        _warn_once("the model has no chat template; using ChatML (llama.cpp's fallback)")
        template = CHATML

    def raise_exception(message: str) -> None:
        raise InvalidArgumentError(f"the chat template refused the messages: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    extra = {"tools": list(tools)} if tools else {}
    try:
        return env.from_string(template).render(
            messages=list(messages), bos_token=bos_token, eos_token=eos_token,
            add_generation_prompt=add_generation_prompt, **extra)
    except TemplateError as e:
        raise InvalidArgumentError(f"the chat template failed: {e}") from None
