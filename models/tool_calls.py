"""Tool calls in the formats models are trained to write them, read back out of a reply, as
llama.cpp's chat parsers read them (``common/chat.cpp``, ``common/parsers/``):

- Hermes 2 Pro, Qwen 2.5/3 and others: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
- Qwen3-Coder's XML in the same wrapper: ``<tool_call><function=NAME><parameter=P>value
  </parameter></function></tool_call>``;
- Mistral: ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]`` (Nemo), or
  ``[TOOL_CALLS]NAME[ARGS]{...}`` (Small 3.2, Devstral, Ministral);
- DeepSeek R1 and V3.1: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
  ```json {...} ```<｜tool▁call▁end｜>`` or ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}``;
- Llama 3.x: a reply that is one JSON object ``{"name": ..., "parameters": {...}}`` naming one
  of the request's functions (optionally after ``<|python_tag|>``);
- gpt-oss's commentary channel (``to=functions.NAME``) is read by ``harmony.ChannelSplitter``.

Every syntax is tried on every reply: the markers cannot be ordinary text, and a Llama-style
object counts only when it names a function the request offered. What does not parse as a
call stays content, never an error (``tool_call_stream`` reads them as a reply streams).
``call_grammar`` writes the Lark grammar that forces a call, for ``tool_choice``
"required" or a named function, and from its marker on for "auto" (``call_trigger``,
``LazyGrammar``); ``tools_prompt`` describes the functions to a model whose
template cannot (it then answers in the Hermes form).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass
from typing import Any, Callable, Sequence


__all__ = ["DEEPSEEK_FENCE", "XML_FUNCTION_CALL", "ToolCall", "call_grammar", "call_trigger",
           "first_marker", "new_call_id", "parse_tool_calls", "tools_prompt",
           "template_writes_tools", "without_tool_roles"]

HERMES, XML_FUNCTION = "<tool_call>", "<function="
MISTRAL, MISTRAL_ARGS, MISTRAL_CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
DEEPSEEK_BEGIN, DEEPSEEK_CALL = "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"
DEEPSEEK_SEP, DEEPSEEK_CALL_END = "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
DEEPSEEK_END = "<｜tool▁calls▁end｜>"
PYTHON_TAG = "<|python_tag|>"
HARMONY_CHANNEL = "<|channel|>"
MARKERS = (HERMES, XML_FUNCTION, MISTRAL, DEEPSEEK_BEGIN, DEEPSEEK_CALL, PYTHON_TAG)

JSON_SPACING = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_ID_CHARACTERS = string.ascii_letters + string.digits
_CALL_ID_PATTERN = "^[A-Za-z0-9]{9}$"          # what new_call_id makes, and Mistral demands
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
XML_FUNCTION_CALL = re.compile(r"<function=([^>\s]+)>(.*?)(?:</function>|$)", re.S)
_XML_PARAMETER = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?(?:</parameter>|$)", re.S)
DEEPSEEK_FENCE = re.compile(r"\n```(?:json)?\n")          # R1's arguments open with it
_DEEPSEEK_FENCED = re.compile(r"^(?:function)?" + re.escape(DEEPSEEK_SEP)
                              + r"(.+?)" + DEEPSEEK_FENCE.pattern + r"(.*?)\n```", re.S)


@dataclass(frozen=True)
class ToolCall:
    """One call: the function's name and its arguments as JSON text (OpenAI's form)."""

    name: str
    arguments: str
    id: str

    def openai(self, index: int | None = None) -> dict[str, Any]:
        """The call as OpenAI's ``tool_calls`` entry (with ``index`` in a stream's delta)."""
        entry = {"id": self.id, "type": "function",
                 "function": {"name": self.name, "arguments": self.arguments}}
        return entry if index is None else {"index": index, **entry}


def new_call_id() -> str:
    """A call's id: 9 letters and digits, the form Mistral's templates demand of the ids a
    client sends back (any string is an id to OpenAI's clients)."""
    return "".join(secrets.choice(_ID_CHARACTERS) for _ in range(9))


def _call(name: str, arguments: Any, call_id: str | None = None) -> ToolCall:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments,
                                                                   ensure_ascii=False)
    return ToolCall(name.strip(), text, call_id or new_call_id())


def parse_tool_calls(text: str, functions: Sequence[dict[str, Any]] = ()
                     ) -> tuple[str, list[ToolCall]]:
    """The content of a reply and the calls it makes (see the module doc). ``functions``:
    the request's tools, whose parameter schemas say which XML values stay strings."""
    schemas = {f["function"]["name"]: f["function"].get("parameters") or {}
               for f in functions}
    start = first_marker(text)
    if start < 0:
        calls = _llama_json(text, schemas)
        return ("", calls) if calls else (text, [])
    rest = text[start:]
    for parse in (_hermes, _mistral, _deepseek, _python_tag):
        calls = parse(rest, schemas)
        if calls:
            return text[:start].rstrip(), calls
    return text, []


def first_marker(text: str) -> int:
    """Where the first call marker in ``text`` begins (-1: none)."""
    found = [i for i in (text.find(m) for m in MARKERS) if i >= 0]
    return min(found) if found else -1


def _hermes(text: str, schemas: dict[str, dict]) -> list[ToolCall]:
    if not text.startswith((HERMES, XML_FUNCTION)):
        return []
    bodies = ([m.group(1) for m in _HERMES_CALL.finditer(text)] if text.startswith(HERMES)
              else [text])
    calls = []
    for body in bodies:
        if body.startswith(XML_FUNCTION):
            calls += _xml_functions(body, schemas)
            continue
        value = _json_object(body)
        if value is not None and isinstance(value.get("name"), str):
            calls.append(_call(value["name"], value.get("arguments",
                                                        value.get("parameters", {}))))
    return calls


def _xml_functions(text: str, schemas: dict[str, dict]) -> list[ToolCall]:
    """Qwen3-Coder's ``<function=NAME><parameter=P>value</parameter></function>``: a value
    is text where its schema says string, JSON where it parses as JSON, else text."""
    calls = []
    for name, body in XML_FUNCTION_CALL.findall(text):
        properties = (schemas.get(name) or {}).get("properties") or {}
        arguments = {}
        for key, value in _XML_PARAMETER.findall(body):
            arguments[key] = value if _is_string(properties.get(key)) else _json_or_text(value)
        calls.append(_call(name, arguments))
    return calls


def _is_string(schema: Any) -> bool:
    kind = schema.get("type") if isinstance(schema, dict) else None
    return kind == "string" or (isinstance(kind, list) and "string" in kind)


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _mistral(text: str, schemas: dict[str, dict]) -> list[ToolCall]:
    if not text.startswith(MISTRAL):
        return []
    calls = []
    for part in text.split(MISTRAL)[1:]:
        part = part.strip()
        if MISTRAL_ARGS in part:                    # NAME[CALL_ID]id[ARGS]{...}
            head, _, arguments = part.partition(MISTRAL_ARGS)
            name, _, call_id = head.partition(MISTRAL_CALL_ID)
            value = _json_object(arguments)
            if value is not None:
                calls.append(_call(name, value, call_id.strip() or None))
            continue
        try:                                        # [{"name": ..., "arguments": ...}, ...]
            listed, _ = json.JSONDecoder().raw_decode(part)
        except (ValueError, RecursionError):
            continue
        for item in listed if isinstance(listed, list) else [listed]:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                call_id = item.get("id") if isinstance(item.get("id"), str) else None
                calls.append(_call(item["name"], item.get("arguments", {}), call_id))
    return calls


def _deepseek(text: str, schemas: dict[str, dict]) -> list[ToolCall]:
    if not text.startswith((DEEPSEEK_BEGIN, DEEPSEEK_CALL)):
        return []
    calls = []
    for part in text.split(DEEPSEEK_CALL)[1:]:
        part = part.split(DEEPSEEK_CALL_END)[0]
        fenced = _DEEPSEEK_FENCED.match(part)       # R1: function<｜tool▁sep｜>NAME ```json
        if fenced:
            name, arguments = fenced.group(1), fenced.group(2)
        else:                                       # V3.1: NAME<｜tool▁sep｜>{...}
            name, _, arguments = part.partition(DEEPSEEK_SEP)
        value = _json_object(arguments)
        if name and value is not None:
            calls.append(_call(name, value))
    return calls


def _python_tag(text: str, schemas: dict[str, dict]) -> list[ToolCall]:
    if not text.startswith(PYTHON_TAG):
        return []
    return _llama_json(text[len(PYTHON_TAG):], schemas)


def _llama_json(text: str, schemas: dict[str, dict]) -> list[ToolCall]:
    """Llama 3.x: the whole reply is ``{"name": ..., "parameters": {...}}`` (or several,
    separated by ``;`` or whitespace), each naming one of the request's functions."""
    calls, decoder, at = [], json.JSONDecoder(), 0
    while schemas:
        while at < len(text) and (text[at].isspace() or text[at] == ";"):
            at += 1
        if at == len(text):
            return calls
        try:
            value, at = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):
            return []
        name = value.get("name") if isinstance(value, dict) else None
        if not isinstance(name, str) or name not in schemas:
            return []
        calls.append(_call(name, value.get("parameters", value.get("arguments", {}))))
    return calls


def _json_object(text: str) -> dict[str, Any] | None:
    """``text`` as one JSON object (surrounding whitespace allowed), else None."""
    try:
        value = json.loads(text.strip())
    except (ValueError, RecursionError):       # not JSON, or nested past Python's limit
        return None
    return value if isinstance(value, dict) else None


def template_writes_tools(template: str) -> bool:
    """Whether a chat template renders the request's ``tools`` itself."""
    return "tools" in template


def without_tool_roles(messages: Sequence[dict[str, Any]],
                       functions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` for a template that knows no tools: the functions described in the system
    message (``tools_prompt``), an assistant's calls written in the Hermes form, and tool
    results as user turns in ``<tool_response>``, as llama.cpp's generic format does."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "tool":
            text = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text, "tool_results": True})
            continue
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = "\n".join(
                HERMES + json.dumps({"name": c["function"]["name"],
                                     "arguments": c["function"]["arguments"]},
                                    ensure_ascii=False) + "</tool_call>"
                for c in m["tool_calls"])
            out.append({"role": "assistant", "content": (m["content"] + "\n" + calls).strip()})
            continue
        out.append({"role": m["role"], "content": m["content"]})
    prompt = tools_prompt(functions)
    if out and out[0]["role"] == "system":
        out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + prompt}
    else:
        out.insert(0, {"role": "system", "content": prompt})
    return [{k: v for k, v in m.items() if k != "tool_results"} for m in out]


def tools_prompt(functions: Sequence[dict[str, Any]]) -> str:
    """A system message that describes ``functions`` and the Hermes form of a call, for a
    model whose chat template does not render tools."""
    listed = "\n".join(json.dumps(f["function"], ensure_ascii=False) for f in functions)
    return ("You may call one or more functions to answer. The functions:\n"
            f"<tools>\n{listed}\n</tools>\n"
            "To call a function, reply with one line per call:\n"
            '<tool_call>{"name": <function name>, "arguments": <arguments as a JSON object>}'
            "</tool_call>")


def call_trigger(template: str) -> re.Pattern[bytes] | None:
    """Where ``call_grammar``'s syntax for ``template`` begins in a reply, for ``tool_choice``
    "auto": the grammar then applies from there on (``LazyGrammar``), as llama.cpp's lazy
    grammar does from the marker that opens the calls. None where that syntax has no marker
    (Llama 3.x's bare JSON object, which llama.cpp leaves free too)."""
    if HARMONY_CHANNEL in template:
        return re.compile(rb"(?P<call><\|channel\|>)commentary to=functions\.")
    if MISTRAL in template:
        return re.compile(re.escape(MISTRAL.encode()))
    if _llama_calls(template):
        return None
    if DEEPSEEK_CALL in template:
        return re.compile(re.escape(DEEPSEEK_BEGIN.encode()))
    return re.compile(re.escape(HERMES.encode()))        # Hermes' JSON, Qwen3-Coder's XML


def _llama_calls(template: str) -> bool:
    """Whether ``template`` is Llama 3.x's, whose calls are bare JSON objects."""
    return PYTHON_TAG in template or ('"parameters"' in template
                                      and "<|start_header_id|>" in template)


def call_grammar(functions: Sequence[dict[str, Any]], choice: str, parallel: bool,
                 template: str, control_id: Callable[[str], int | None]) -> str:
    """A Lark grammar (llguidance's dialect) for a reply that is only calls, in the syntax
    of ``template``'s family (gpt-oss, Mistral's two, Llama 3.x, DeepSeek R1 and V3.1,
    Qwen3-Coder's XML, else Hermes): of the function ``choice`` names, or of any of
    ``functions`` ("required"); more than one where ``parallel``. ``control_id``: the id of
    a marker that is one control token of the vocabulary (the grammar names it by id), else
    None."""
    chosen = [f["function"] for f in functions if choice == "required"
              or f["function"]["name"] == choice]

    def marker(text: str) -> str:
        token = control_id(text)
        return f"<[{token}]>" if token is not None else json.dumps(text)

    def call_schema(key: str, ids: bool = False) -> str:
        """A call as one JSON object; ``ids``: with Mistral Nemo's optional "id" after."""
        extra = {"id": {"type": "string", "pattern": _CALL_ID_PATTERN}} if ids else {}
        return "%json " + json.dumps({"x-guidance": JSON_SPACING, "anyOf": [{
            "type": "object", "properties": {"name": {"const": f["name"]},
                                             key: f.get("parameters") or {"type": "object"},
                                             **extra},
            "required": ["name", key], "additionalProperties": False} for f in chosen]})

    def arguments(function: dict) -> str:
        schema = function.get("parameters") or {"type": "object"}
        return json.dumps({"x-guidance": JSON_SPACING, **schema})

    def repeated(one: str, separator: str) -> str:
        return f"{one} ({json.dumps(separator)} {one})*" if parallel else one

    if HARMONY_CHANNEL in template:
        heads = [json.dumps(f"commentary to=functions.{f['name']} ") for f in chosen]
        calls = " | ".join(f'{head} {marker("<|constrain|>")} "json" {marker("<|message|>")} '
                           f'%json {arguments(f)}' for head, f in zip(heads, chosen))
        return f'start: {marker(HARMONY_CHANNEL)} ({calls})\n'
    if MISTRAL in template and MISTRAL_ARGS in template:
        call_id = (f"({marker(MISTRAL_CALL_ID)} /{_CALL_ID_PATTERN[1:-1]}/)? "
                   if MISTRAL_CALL_ID in template else "")
        calls = " | ".join(f'{json.dumps(f["name"])} {call_id}{marker(MISTRAL_ARGS)} '
                           f'%json {arguments(f)}' for f in chosen)
        one = f"{marker(MISTRAL)} ({calls})"
        return f"start: ({one})+\n" if parallel else f"start: {one}\n"
    if MISTRAL in template:
        return (f'start: {marker(MISTRAL)} "[" {repeated("call", ", ")} "]"\n'
                f'call: {call_schema("arguments", ids=True)}\n')
    if _llama_calls(template):
        return f'start: {repeated("call", "; ")}\ncall: {call_schema("parameters")}\n'
    if DEEPSEEK_CALL in template:
        return _deepseek_grammar(chosen, parallel, "```json" in template, marker, arguments)
    if XML_FUNCTION in template:
        return _xml_grammar(chosen, parallel, marker)
    one = f'{marker(HERMES)} "\\n" call "\\n" {marker("</tool_call>")}'
    return f'start: {repeated(one, chr(10))}\ncall: {call_schema("arguments")}\n'


def _deepseek_grammar(chosen: Sequence[dict], parallel: bool, fenced: bool,
                      marker: Callable[[str], str], arguments: Callable[[dict], str]) -> str:
    """DeepSeek's calls between its section markers: V3.1's ``NAME<sep>{...}``, or R1's
    ``function<sep>NAME`` and the arguments fenced as JSON (``fenced``)."""
    def call(f: dict) -> str:
        name = json.dumps(f["name"])
        head = (f'"function" {marker(DEEPSEEK_SEP)} {name} "\\n```json\\n"' if fenced
                else f"{name} {marker(DEEPSEEK_SEP)}")
        tail = '"\\n```" ' if fenced else ""
        return (f"{marker(DEEPSEEK_CALL)} {head} %json {arguments(f)} "
                f"{tail}{marker(DEEPSEEK_CALL_END)}")
    one = "(" + " | ".join(call(f) for f in chosen) + ")"
    calls = f'{one} ("\\n"? {one})*' if parallel else one
    return f"start: {marker(DEEPSEEK_BEGIN)} {calls} {marker(DEEPSEEK_END)}\n"


def _xml_grammar(chosen: Sequence[dict], parallel: bool, marker: Callable[[str], str]) -> str:
    """Qwen3-Coder's ``<function=NAME>`` with a ``<parameter=P>`` per property, in the
    schema's order (the required ones always): a string is any text up to its closing tag,
    any other value JSON of its schema."""
    rules: list[str] = []

    def call(i: int, f: dict) -> str:
        schema = f.get("parameters") or {}
        required = set(schema.get("required") or ())
        parts = []
        for j, (name, value) in enumerate((schema.get("properties") or {}).items()):
            rule = f"value_{i}_{j}"
            if _is_string(value):
                rules.append(f'{rule}[suffix="\\n</parameter>\\n"]: /(.|\\n)*/')
            else:
                value_schema = json.dumps({"x-guidance": JSON_SPACING, **value})
                rules.append(f'{rule}: %json {value_schema} "\\n</parameter>\\n"')
            part = json.dumps(f"<parameter={name}>\n") + " " + rule
            parts.append(part if name in required else f"({part})?")
        opening = json.dumps(f"<function={f['name']}>\n")
        return f'{opening} {" ".join(parts)} "</function>"'
    one = "(" + " | ".join(call(i, f) for i, f in enumerate(chosen)) + ")"
    wrapped = f'{marker(HERMES)} "\\n" {one} "\\n" {marker("</tool_call>")}'
    body = f'{wrapped} ("\\n" {wrapped})*' if parallel else wrapped
    return "start: " + body + "\n" + "".join(rule + "\n" for rule in rules)
