"""The turn formats a model without a chat template is prompted in (``chat_formats``): each
as llama.cpp's built-in template writes it, chosen by architecture and vocabulary
(``chat_fallback``), its end of turn an end-of-generation token, and the embedded gemma-3
(whose file has no template) chatting without ChatML's markers leaking into its replies."""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("jinja2")

from polydev.models import load  # noqa: E402
from polydev.models.arch import supported  # noqa: E402
from polydev.models.chat_fallback import FAMILY_FORMATS, choose_format  # noqa: E402
from polydev.models.chat_formats import CHAT_FORMATS  # noqa: E402
from polydev.models.chat_template import render_chat  # noqa: E402
from polydev.models.gguf import GGUFFile  # noqa: E402
from polydev.models.tokenizer import Vocab  # noqa: E402

import needs  # noqa: E402
from model_files import GEMMA3, model_path, rewrite, smollm2_path, write_test_model  # noqa: E402

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]

# MESSAGES in each format, with the generation prompt, as llama.cpp's llm_chat_apply_template
# writes them (eos_token "</s>" for vicuna)
RENDERED = {
    "chatml": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
              "<|im_start|>assistant\n",
    "gemma": "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
             "Hello!<end_of_turn>\n<start_of_turn>user\n2+2?<end_of_turn>\n"
             "<start_of_turn>model\n",
    "llama3": "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "mistral-v3": "[INST] Be brief.\n\nHi[/INST] Hello!</s>[INST] 2+2?[/INST]",
    "mistral-v3-tekken": "[INST]Be brief.\n\nHi[/INST]Hello!</s>[INST]2+2?[/INST]",
    "mistral-v7": "[SYSTEM_PROMPT] Be brief.[/SYSTEM_PROMPT][INST] Hi[/INST] Hello!</s>"
                  "[INST] 2+2?[/INST]",
    "mistral-v7-tekken": "[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]Hi[/INST]Hello!</s>"
                         "[INST]2+2?[/INST]",
    "phi3": "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
            "<|user|>\n2+2?<|end|>\n<|assistant|>\n",
    "phi4": "<|im_start|>system<|im_sep|>Be brief.<|im_end|><|im_start|>user<|im_sep|>Hi"
            "<|im_end|><|im_start|>assistant<|im_sep|>Hello!<|im_end|><|im_start|>user"
            "<|im_sep|>2+2?<|im_end|><|im_start|>assistant<|im_sep|>",
    "granite": "<|start_of_role|>system<|end_of_role|>Be brief.<|end_of_text|>\n"
               "<|start_of_role|>user<|end_of_role|>Hi<|end_of_text|>\n"
               "<|start_of_role|>assistant<|end_of_role|>Hello!<|end_of_text|>\n"
               "<|start_of_role|>user<|end_of_role|>2+2?<|end_of_text|>\n"
               "<|start_of_role|>assistant<|end_of_role|>",
    "deepseek2": "Be brief.\n\nUser: Hi\n\nAssistant: Hello!<｜end▁of▁sentence｜>User: 2+2?\n\n"
                 "Assistant:",
    "deepseek3": "Be brief.\n\n<｜User｜>Hi<｜Assistant｜>Hello!<｜end▁of▁sentence｜><｜User｜>2+2?"
                 "<｜Assistant｜>",
    "gpt-oss": "<|start|>system<|message|>Be brief.<|end|><|start|>user<|message|>Hi<|end|>"
               "<|start|>assistant<|message|>Hello!<|return|><|start|>user<|message|>2+2?"
               "<|end|><|start|>assistant",
    "vicuna": "Be brief.\n\nUSER: Hi\nASSISTANT: Hello!</s>\nUSER: 2+2?\nASSISTANT:",
}

# the turn markers of every family, as text (none of the made-up vocabulary's pieces)
MARKERS = sorted({m for f in CHAT_FORMATS.values() for m in f.markers})


def test_every_format_is_written_out():
    assert set(RENDERED) == set(CHAT_FORMATS)


@pytest.mark.parametrize("name", sorted(CHAT_FORMATS))
def test_format_renders_system_user_assistant_user(name):
    assert render_chat(CHAT_FORMATS[name].template, MESSAGES, eos_token="</s>") == RENDERED[name]


# conversations whose details llama.cpp's built-ins treat each their own way: whitespace
# trimmed or kept, several system messages, one after a user turn, a reply last
ORACLE_CONVERSATIONS = [
    MESSAGES,
    [{"role": "system", "content": "  Be brief. "}, {"role": "user", "content": " Hi\n"},
     {"role": "assistant", "content": " Hello! "}, {"role": "user", "content": "2+2?"}],
    [{"role": "system", "content": "A"}, {"role": "system", "content": "B"},
     {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "Hi"}, {"role": "system", "content": "S"},
     {"role": "assistant", "content": "X"}, {"role": "user", "content": "Y"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],
]


def llama_cpp_renders(name: str, messages: list[dict], add_generation_prompt: bool) -> str:
    """What llama.cpp's built-in template ``name`` writes for ``messages``."""
    llama_cpp = needs.llama_cpp()
    chat = (llama_cpp.llama_chat_message * len(messages))(*[
        llama_cpp.llama_chat_message(role=m["role"].encode(), content=m["content"].encode())
        for m in messages])
    size = 1 << 14
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(name.encode(), chat, len(messages),
                                            add_generation_prompt, buf, size)
    assert 0 <= n < size, f"llama.cpp has no built-in template {name!r}"
    return buf.raw[:n].decode()


@pytest.mark.parametrize("name", sorted(CHAT_FORMATS))
def test_format_renders_as_llama_cpp_builtin(name):
    for messages in ORACLE_CONVERSATIONS:
        for add_generation_prompt in (True, False):
            ours = render_chat(CHAT_FORMATS[name].template, messages, eos_token="</s>",
                               add_generation_prompt=add_generation_prompt)
            assert ours == llama_cpp_renders(name, messages, add_generation_prompt), messages


# --- the choice -------------------------------------------------------------------------------

_LLAMA3 = {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|begin_of_text|>"}
_CHATML = {"<|im_start|>", "<|im_end|>", "<|endoftext|>"}
_MISTRAL_V3 = {"<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]"}
_MISTRAL_V7 = _MISTRAL_V3 | {"[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"}
_GEMMA = {"<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"}
_PLAIN = {"<unk>", "<s>", "</s>"}


@pytest.mark.parametrize("arch, tokens, tokenizer_model, expected", [
    ("gemma3", _GEMMA, "llama", "gemma"),
    ("gemma2", _GEMMA, "llama", "gemma"),
    ("llama", _LLAMA3, "gpt2", "llama3"),
    ("llama", _CHATML, "gpt2", "chatml"),                 # SmolLM2
    ("llama", _MISTRAL_V3, "llama", "mistral-v3"),        # Mistral 7B v0.3
    ("llama", _MISTRAL_V3, "gpt2", "mistral-v3-tekken"),  # Mistral Nemo
    ("llama", _MISTRAL_V7, "gpt2", "mistral-v7-tekken"),  # Mistral Small 3
    ("llama", _MISTRAL_V7, "llama", "mistral-v7"),        # Mistral Large 2411
    ("llama", _PLAIN, "llama", "vicuna"),                 # Llama 2, Mistral v0.1
    ("mistral3", _MISTRAL_V7, "gpt2", "mistral-v7-tekken"),
    ("qwen3", _CHATML, "gpt2", "chatml"),
    ("smollm3", _CHATML, "gpt2", "chatml"),
    ("phi3", {"<|user|>", "<|assistant|>", "<|end|>", "<|system|>"}, "llama", "phi3"),
    ("phi3", {"<|im_start|>", "<|im_sep|>", "<|im_end|>"}, "gpt2", "phi4"),
    ("granite", {"<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>"}, "gpt2", "granite"),
    ("deepseek2", {"<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"}, "gpt2", "deepseek3"),
    ("deepseek2", {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"}, "gpt2", "deepseek2"),
    ("gpt-oss", {"<|start|>", "<|message|>", "<|end|>", "<|return|>", "<|channel|>"}, "gpt2",
     "gpt-oss"),
    # no format of the family fits: ChatML where the vocabulary has its markers, else plain
    ("gemma3", _CHATML, "gpt2", "chatml"),
    ("gemma3", _PLAIN, "llama", "vicuna"),
    ("olmo2", _CHATML, "gpt2", "chatml"),
    ("olmo2", {"<|endoftext|>", "<|pad|>"}, "gpt2", "vicuna"),
    ("qwen2", {"<|endoftext|>"}, "gpt2", "vicuna"),
])
def test_format_chosen_by_architecture_and_vocabulary(arch, tokens, tokenizer_model, expected):
    choice = choose_format(arch, tokens, tokenizer_model)
    assert choice.format.name == expected
    assert f"architecture {arch}" in choice.reason


def test_the_reason_names_the_markers_found():
    assert choose_format("gemma3", _GEMMA, "llama").reason == (
        "architecture gemma3; its vocabulary has <start_of_turn> and <end_of_turn>")
    assert choose_format("gemma3", _PLAIN, "llama").reason == (
        "no turn format of architecture gemma3 fits its vocabulary, and it has no ChatML "
        "markers either")


def test_every_architecture_has_its_fallback_decided():
    """A new architecture has to say which formats its family speaks (maybe none)."""
    assert set(FAMILY_FORMATS) == set(supported())


# --- the end of a turn ends generation --------------------------------------------------------

def write_vocab(path: Path, specials: list[str], n_vocab: int = 320) -> Path:
    """A GGUF with only a SentencePiece vocabulary: <unk> <s> </s>, the bytes, ``specials``
    (control tokens), then made-up pieces up to ``n_vocab`` tokens."""
    import gguf

    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + specials
    types = [2, 3, 3] + [6] * 256 + [3] * len(specials)
    pieces += [f"\u2581w{i}" for i in range(n_vocab - len(pieces))]
    types += [1] * (n_vocab - len(types))
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores([-float(i) for i in range(n_vocab)])
    w.add_token_types(types)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("name", sorted(CHAT_FORMATS))
def test_end_of_a_reply_is_an_end_of_generation_token(tmp_path, name):
    """What a format writes after a reply is a token that ends generation, in a vocabulary
    with the format's markers (vicuna's is the model's own end-of-sequence token)."""
    fmt = CHAT_FORMATS[name]
    reply = "R3PLY"
    text = render_chat(fmt.template, [{"role": "user", "content": "Q"},
                                      {"role": "assistant", "content": reply}],
                       eos_token="</s>", add_generation_prompt=False)
    after = text[text.index(reply) + len(reply):]
    end = next(m for m in ["</s>", *fmt.markers] if after.startswith(m))
    with GGUFFile(write_vocab(tmp_path / "vocab.gguf", list(fmt.markers))) as f:
        vocab = Vocab.from_gguf(f)
    assert vocab.tokens.id_of(end) in vocab.eog_ids, end


# --- models without a chat template -----------------------------------------------------------

@pytest.fixture(scope="module")
def gemma3_test_model(tmp_path_factory):
    """A small gemma3 with random weights and no chat template, its vocabulary gemma's
    markers and made-up pieces."""
    folder = tmp_path_factory.mktemp("gemma3")
    vocab = write_vocab(folder / "vocab.gguf", ["<start_of_turn>", "<end_of_turn>"])
    return write_test_model(folder / "gemma3.gguf", arch="gemma3", head_dim=32, n_layer=2,
                            sliding_window=4, tokenizer_of=str(vocab))


def test_gemma3_file_without_template_gets_gemma_turns(gemma3_test_model, caplog):
    with load(gemma3_test_model, devices=[], n_ctx=128, progress=False) as m:
        assert m.file.get("tokenizer.chat_template") is None
        with caplog.at_level(logging.WARNING, logger="polydev.models.chat_fallback"):
            first = m.chat_prompt(MESSAGES)
            again = m.chat_prompt(MESSAGES)
        assert first == again == "<s>" + RENDERED["gemma"]       # llama.cpp's BOS ahead
        said = [r.getMessage() for r in caplog.records]
        assert said == [f"the model {gemma3_test_model} has no chat template; using "
                        "gemma's turn format (architecture gemma3; its vocabulary has "
                        "<start_of_turn> and <end_of_turn>)"]      # once, however many turns
        reply = "".join(m.chat(MESSAGES[1:2], 12, temperature=0))
        assert not any(marker in reply for marker in MARKERS)


def test_file_without_markers_gets_the_plain_format(tmp_path):
    path = write_test_model(tmp_path / "llama.gguf", n_layer=1)
    with load(path, devices=[], n_ctx=128, progress=False) as m:
        assert m.chat_prompt(MESSAGES) == "<s>" + RENDERED["vicuna"]


def test_smollm2_without_its_template_speaks_chatml_and_ends_its_turn(tmp_path):
    """SmolLM2 is a llama whose vocabulary has ChatML's markers: without its template it
    gets ChatML, and its reply ends at <|im_end|> well before the token limit."""
    path = rewrite(smollm2_path(), tmp_path / "smollm2.gguf",
                   drop_keys=("tokenizer.chat_template",))
    with load(path, devices=[], n_ctx=256, progress=False) as m:
        messages = [{"role": "user", "content": "Name three colours."}]
        assert m.chat_prompt(messages) == (
            "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n")
        reply = "".join(m.chat(messages, 64, temperature=0))
        assert reply.strip() and len(m.generated) < 64
        assert not any(marker in reply for marker in MARKERS)


# --- the embedded gemma-3 ---------------------------------------------------------------------

COLOURS = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def embedded_reply():
    """The embedded model's chat prompt and greedy reply to COLOURS (its file has no chat
    template; the issue saw ChatML's markers in this reply)."""
    path = model_path(GEMMA3)
    with load(path, devices=[], n_ctx=256, progress=False) as m:
        assert m.file.get("tokenizer.chat_template") is None
        end_of_turn = m.tokenizer.vocab.tokens.id_of("<end_of_turn>")
        assert m.tokenizer.is_eog(end_of_turn)
        return m.chat_prompt(COLOURS), "".join(m.chat(COLOURS, 48, temperature=0))


def test_embedded_model_chats_in_gemma_turns(embedded_reply):
    prompt, reply = embedded_reply
    assert prompt == ("<bos><start_of_turn>user\nName three colours.<end_of_turn>\n"
                      "<start_of_turn>model\n")
    assert reply.strip()
    assert not any(marker in reply for marker in MARKERS)


def test_embedded_model_prompt_is_llama_cpps_gemma_prompt(embedded_reply):
    prompt, _ = embedded_reply
    assert prompt == "<bos>" + llama_cpp_renders("gemma", COLOURS, True)


def test_server_chat_through_openai_client_shows_no_markers(embedded_reply):
    pytest.importorskip("openai")
    from test_server import client, live_server

    _, alone = embedded_reply
    with live_server(model_path(GEMMA3), n_slots=1) as (url, _):
        r = client(url).chat.completions.create(model="test-model", messages=COLOURS,
                                                max_tokens=48, temperature=0)
    assert r.choices[0].message.content == alone
