"""polydev.models.tokenizer against llama.cpp: its recorded ids, its own tokenizer test vectors,
and (where llama-cpp-python imports) llama.cpp itself on random text."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

pytest.importorskip("regex")
pytest.importorskip("gguf")
from hypothesis import example, given, settings, strategies as st  # noqa: E402

from polydev.errors import TokenizerError  # noqa: E402
from polydev.models.gguf import GGUFFile  # noqa: E402
from polydev.models.tokenizer import Tokenizer  # noqa: E402

import needs  # noqa: E402
from llama_oracle import records  # noqa: E402
from model_files import GEMMA3, SMOLLM2, model_path, rewrite  # noqa: E402
from needs import VOCAB_DIR, vocab_dir  # noqa: E402

MODELS = [SMOLLM2, GEMMA3]
_TOKENIZERS: dict[str, Tokenizer] = {}


def tokenizer_of(path: Path) -> Tokenizer:
    key = str(path)
    if key not in _TOKENIZERS:
        with GGUFFile(path) as f:
            _TOKENIZERS[key] = Tokenizer.from_gguf(f)
    return _TOKENIZERS[key]


# --- llama.cpp's recorded ids -----------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_recorded_llama_cpp_ids(name):
    """llama.cpp's ids from tokenize(text, add_bos=True, special=True)."""
    tok = tokenizer_of(model_path(name))
    cases = dict(records(name)["tokenize"])
    gen = records(name)["generate"][0]
    cases[gen["prompt"]] = gen["prompt_ids"]
    for text, ids in cases.items():
        assert tok.encode(text, add_special=True, parse_special=True) == ids, text


@pytest.mark.parametrize("name", MODELS)
def test_generated_text_decodes_like_llama_cpp(name):
    gen = records(name)["generate"][0]
    tok = tokenizer_of(model_path(name))
    assert tok.decode(gen["greedy_ids"]) == gen["greedy_text"]
    streamed = b"".join(tok.token_to_piece(t) for t in gen["greedy_ids"])
    assert streamed.decode() == gen["greedy_text"]


def test_special_tokens_of_the_two_models():
    smol = tokenizer_of(model_path(SMOLLM2))
    assert (smol.bos_id, smol.eos_id, smol.vocab.add_bos) == (1, 2, False)
    assert {0, 2} <= smol.eog_ids                     # <|endoftext|>, <|im_end|>
    assert smol.encode("<|im_start|>hi", parse_special=True)[0] == 1
    assert smol.encode("<|im_start|>hi", parse_special=False)[0] != 1
    gemma = tokenizer_of(model_path(GEMMA3))
    assert (gemma.bos_id, gemma.eos_id, gemma.vocab.add_bos) == (2, 1, True)
    end_of_turn = gemma.encode("<end_of_turn>", add_special=False, parse_special=True)
    assert len(end_of_turn) == 1 and gemma.is_eog(end_of_turn[0]) and gemma.is_eog(1)
    assert gemma.decode([2, *end_of_turn], unparse_special=True) == "<bos><end_of_turn>"
    assert gemma.decode([2, *end_of_turn]) == ""


# --- llama.cpp's tokenizer test vectors -------------------------------------------------------

def _vocab_files() -> list:
    """A parameter per vocabulary of the test vectors; one None where they are missing (the
    test then says so)."""
    root = Path(os.environ.get("POLYDEV_LLAMA_VOCAB_DIR") or VOCAB_DIR)
    files = sorted(root.glob("ggml-vocab-*.gguf"))
    found = [pytest.param(p, id=p.name) for p in files if p.with_suffix(".gguf.inp").exists()]
    return found or [pytest.param(None, id="missing")]


def _vocab(path: Path | None) -> Path:
    """A vocabulary of the vectors; where they are missing the test skips or fails."""
    if path is None:
        vocab_dir()                     # skips, or fails where CI requires the vectors
    return path


@pytest.mark.parametrize("path", _vocab_files())
def test_llama_cpp_vocab_vectors(path):
    """Every vocabulary whose tokenizer polydev supports gives llama.cpp's ids on its .inp/.out
    pairs (tokenize(text, add_special=false, parse_special=false), as test-tokenizer-0)."""
    with GGUFFile(_vocab(path)) as f:
        try:
            tok = Tokenizer.from_gguf(f)
        except TokenizerError as e:
            assert f.get("tokenizer.ggml.model") not in ("llama", "gpt2"), e
            pytest.skip(f"unsupported tokenizer: {e}")
    texts = path.with_suffix(".gguf.inp").read_text(encoding="utf-8").split(
        "\n__ggml_vocab_test__\n")
    expected = path.with_suffix(".gguf.out").read_text().split("\n")
    assert len(texts) <= len(expected)
    for text, line in zip(texts, expected[:len(texts)], strict=True):
        assert tok.encode(text, add_special=False) == [int(x) for x in line.split()], repr(text)


def test_vocab_vectors_are_there():
    assert len(list(vocab_dir().glob("ggml-vocab-*.gguf.inp"))) >= 10


# --- llama.cpp itself on random text ----------------------------------------------------------

PIECES = list("aZ0 9\n\t.,!?'\"-()<>|/\\é中😀") + [
    "  ", "   ", "\n\n", "'s", "'re", " ' ", "...", "ﬁ", "\r\n", "\u200b", "𝕏", "ά", "\x7f",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<bos>", "<eos>", "<start_of_turn>",
    "<end_of_turn>", "<unk>", "<pad>", "Hello", " world", "1234567"]


# The random-text tests are derandomized: the same examples every run, so a CI run cannot
# fail on a corner case an earlier run never met. Longer fuzzing with fresh seeds is done
# outside the suite, and what it finds becomes an @example here.
# Text from every script and category (no lone surrogates: they are not UTF-8), mixed with
# the pieces tokenizers trip on: runs of spaces and newlines, contractions, special tokens.
TEXT = st.lists(st.one_of(st.sampled_from(PIECES),
                          st.text(st.characters(exclude_categories=("Cs",)), max_size=4)),
                max_size=12).map("".join)
_ORACLES: dict[str, tuple] = {}


@pytest.fixture(scope="module", autouse=True)
def _close_oracles():
    """llama.cpp's vocabularies are freed here, not by finalizers at interpreter exit."""
    yield
    for _, llm, _ in _ORACLES.values():
        llm.close()
    _ORACLES.clear()


def llama_cpp_and_ours(path: Path):
    """(llama_cpp module, llama.cpp's vocabulary, our tokenizer) for one file."""
    llama_cpp = needs.llama_cpp()
    key = str(path)
    if key not in _ORACLES:
        with GGUFFile(path) as f:
            try:
                ours = Tokenizer.from_gguf(f)
            except TokenizerError as e:
                pytest.skip(f"unsupported tokenizer: {e}")
        _ORACLES[key] = (llama_cpp, llama_cpp.Llama(key, vocab_only=True, verbose=False), ours)
    return _ORACLES[key]


def assert_same_as_llama_cpp(path: Path, text: str) -> None:
    """tokenize in the four add_special/parse_special modes and detokenize in the four
    remove_special/unparse_special modes give llama.cpp's ids and bytes."""
    llama_cpp, llm, tok = llama_cpp_and_ours(path)
    for add_special in (True, False):
        for parse_special in (True, False):
            want = llm.tokenize(text.encode(), add_bos=add_special, special=parse_special)
            got = tok.encode(text, add_special=add_special, parse_special=parse_special)
            assert got == want, (text, add_special, parse_special)
    ids = llm.tokenize(text.encode(), add_bos=True, special=True)
    buf = ctypes.create_string_buffer(1 << 14)
    array = (llama_cpp.llama_token * len(ids))(*ids)
    for remove_special in (True, False):
        for unparse_special in (True, False):
            n = llama_cpp.llama_detokenize(llm._model.vocab, array, len(ids), buf, len(buf),
                                           remove_special, unparse_special)
            got = tok.decode_bytes(ids, remove_special, unparse_special)
            assert got == buf.raw[:n], (text, remove_special, unparse_special)


@pytest.mark.parametrize("name", MODELS)
@settings(max_examples=150, deadline=None, derandomize=True)
@given(text=TEXT)
def test_random_text_matches_llama_cpp(name, text):
    assert_same_as_llama_cpp(model_path(name), text)


@pytest.mark.parametrize("path", _vocab_files())
@settings(max_examples=40, deadline=None, derandomize=True)
@given(text=TEXT)
@example(text="<unk>\x85")                 # phi-3: <unk> does not swallow what follows
@example(text="<|end|>\x85 \t x</s> \u00a0y")    # RSTRIP takes ASCII whitespace only
@example(text="ùa<｜fim▁begin｜>\t  Hi<pad>")       # FIM tokens found by text act as control
def test_random_text_matches_llama_cpp_on_its_test_vocabs(path, text):
    assert_same_as_llama_cpp(_vocab(path), text)


@pytest.fixture(scope="module")
def relabeled(tmp_path_factory):
    """llama-bpe's vocabulary under another ``tokenizer.ggml.pre``: the pre-tokenizers of
    models whose own vocabulary llama.cpp ships no test file for (tekken: Mistral 3; gpt-4o:
    gpt-oss; olmo: OLMo 2)."""
    import gguf

    made: dict[str, Path] = {}

    def make(pre: str) -> Path:
        if pre not in made:
            source = _vocab(next((Path(p.values[0]) for p in _vocab_files()
                                  if p.values[0] is not None and "llama-bpe" in p.id), None))
            made[pre] = rewrite(source, tmp_path_factory.mktemp(pre) / f"ggml-vocab-{pre}.gguf",
                                keys={"tokenizer.ggml.pre": (pre, gguf.GGUFValueType.STRING)})
        return made[pre]
    return make


@pytest.mark.parametrize("pre", ["tekken", "gpt-4o", "olmo"])
@settings(max_examples=60, deadline=None, derandomize=True)
@given(text=TEXT)
@example(text="HELLO World's ÉCOLE école 12345 中文\n\n  x/\r\n")
def test_pre_tokenizers_of_the_new_architectures_match_llama_cpp(relabeled, pre, text):
    assert_same_as_llama_cpp(relabeled(pre), text)


HARMONY = ["<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|return|>",
           "<|call|>"]


@pytest.fixture(scope="module")
def harmony_vocab(tmp_path_factory) -> Path:
    """llama-bpe's vocabulary with its last reserved tokens renamed to gpt-oss's harmony
    tokens (control tokens, as in gpt-oss's files)."""
    import gguf

    source = _vocab(next((Path(p.values[0]) for p in _vocab_files()
                          if p.values[0] is not None and "llama-bpe" in p.id), None))
    with GGUFFile(source) as f:
        tokens = list(f.get("tokenizer.ggml.tokens"))
        types = [int(t) for t in f.get("tokenizer.ggml.token_type")]
    tokens[-len(HARMONY):] = HARMONY
    types[-len(HARMONY):] = [3] * len(HARMONY)
    array, string, i32 = (gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING,
                          gguf.GGUFValueType.INT32)
    return rewrite(source, tmp_path_factory.mktemp("harmony") / "ggml-vocab-harmony.gguf",
                   keys={"tokenizer.ggml.tokens": (tokens, array, string),
                         "tokenizer.ggml.token_type": (types, array, i32)})


def test_harmony_end_of_generation_as_llama_cpp(harmony_vocab):
    """<|return|> and <|call|> end generation and <|end|> does not (it closes one message of
    several), as llama.cpp decides for gpt-oss's vocabulary."""
    llama_cpp, llm, tok = llama_cpp_and_ours(harmony_vocab)
    ids = [tok.vocab.tokens.id_of(t) for t in HARMONY] + [tok.vocab.eos_id]
    theirs = {i for i in ids if llama_cpp.llama_vocab_is_eog(llm._model.vocab, i)}
    assert {i for i in ids if tok.is_eog(i)} == theirs
    assert tok.vocab.tokens.id_of("<|end|>") not in theirs


@settings(max_examples=40, deadline=None, derandomize=True)
@given(text=st.lists(st.one_of(st.sampled_from(HARMONY + PIECES), TEXT), max_size=8).map("".join))
@example(text="<|start|>assistant<|channel|>final<|message|>Hi<|end|><|return|>")
def test_harmony_tokens_split_and_print_as_llama_cpp(harmony_vocab, text):
    """The structure tokens are printed even without ``special`` (llama.cpp makes them
    user-defined) and split out of text as llama.cpp does."""
    assert_same_as_llama_cpp(harmony_vocab, text)


@pytest.mark.parametrize("path", _vocab_files() + [pytest.param("models", id="models")])
def test_end_of_generation_tokens_match_llama_cpp(path):
    """The EOG set (llama.cpp's list of texts, the FIM pad/repo/separator tokens, the ids the
    file names) equals llama_vocab_is_eog over the whole vocabulary."""
    llama_cpp = needs.llama_cpp()
    for p in ([model_path(n) for n in MODELS] if path == "models" else [_vocab(path)]):
        _, llm, tok = llama_cpp_and_ours(p)
        theirs = {i for i in range(tok.n_vocab)
                  if llama_cpp.llama_vocab_is_eog(llm._model.vocab, i)}
        assert set(tok.eog_ids) == theirs


# --- byte-level BPE and errors ---------------------------------------------------------------

def _bpe_file(tmp_path, tokens, merges, pre="gpt-2") -> Path:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "bpe.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens + ["<|endoftext|>"])
    w.add_token_types([1] * len(tokens) + [3])
    w.add_token_merges(merges)
    w.add_bos_token_id(len(tokens))
    w.add_eos_token_id(len(tokens))
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_bpe_merges_the_lowest_rank_first_and_the_leftmost_of_equals(tmp_path):
    """"abc": with "b c" ranked before "a b" the word is [a, bc]; "aaa" merges its leftmost
    pair first, [aa, a]; a merged symbol that is no token ("c" + "a") falls back to the
    one-byte tokens of its bytes."""
    tokens = ["a", "b", "c", "ab", "bc", "aa"]
    path = _bpe_file(tmp_path, tokens, ["b c", "a b", "a a", "c a"])
    with GGUFFile(path) as f:
        tok = Tokenizer.from_gguf(f)
    assert tok.encode("abc") == [0, 4]
    assert tok.encode("aaa") == [5, 0]
    assert tok.encode("ca") == [2, 0]
    assert tok.encode("ab bc") == [3, 4]     # " bc" is "Ġ", "bc": no "Ġ" token, so dropped


def test_bpe_ignore_merges_takes_a_word_that_is_a_token_whole(tmp_path):
    """llama3's pre-tokenizer sets ignore_merges: "abc" is a token, so it is taken whole
    though no merge makes it; with gpt-2's the merges decide."""
    tokens = ["a", "b", "c", "ab", "abc"]
    for pre, expected in (("llama3", [4]), ("gpt-2", [3, 2])):
        path = _bpe_file(tmp_path, tokens, ["a b"], pre=pre)
        with GGUFFile(path) as f:
            assert Tokenizer.from_gguf(f).encode("abc", add_special=False) == expected, pre


def test_bad_token_ids_and_inputs():
    tok = tokenizer_of(model_path(SMOLLM2))
    with pytest.raises(TokenizerError, match=r"token id 49152 is outside the vocabulary"):
        tok.decode([1, 49152])
    with pytest.raises(TokenizerError, match="outside"):
        tok.token_to_piece(-1)
    with pytest.raises(TokenizerError, match="needs a str"):
        tok.encode(b"bytes")


def test_unsupported_tokenizer_models(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "bert.gguf"
    w = gguf.GGUFWriter(str(path), arch="bert")
    w.add_tokenizer_model("bert")
    w.add_token_list(["[PAD]", "a"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile(path) as f, pytest.raises(TokenizerError, match="'bert' is not supported"):
        Tokenizer.from_gguf(f)


def test_a_character_the_vocabulary_lacks_blocks_merges(tmp_path):
    """llama.cpp keeps an unknown character as a symbol of its own (no merge crosses it) and
    then drops it: "acb" with merges "a b" but no "c" is [a, b], never [ab]."""
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(["a", "b", "ab", "<|endoftext|>"])
    w.add_token_types([1, 1, 1, 3])
    w.add_token_merges(["a b"])
    w.add_bos_token_id(3)
    w.add_eos_token_id(3)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile(path) as f:
        tok = Tokenizer.from_gguf(f)
    assert tok.encode("ab") == [2]
    assert tok.encode("acb") == [0, 1]
    assert tok.encode("c") == []
    assert tok.encode("<|endoftext|>ab", parse_special=True) == [3, 2]


def _spm_file(tmp_path, tokens, scores, types=None) -> Path:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "spm.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types or [1] * len(tokens))
    w.add_add_bos_token(False)
    w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_sentencepiece_merges_the_highest_scoring_pair_first(tmp_path):
    """"abc": "bc" (score -1) beats "ab" (-2), and "abc" is no token, so [a, bc]; with equal
    scores the leftmost pair merges first, so [ab, c]; with "abc" a token the pieces join."""
    tokens = ["<unk>", "a", "b", "c", "ab", "bc"]
    types = [2, 1, 1, 1, 1, 1]
    for scores, expected in (([0, -5, -5, -5, -2, -1], [1, 5]),
                             ([0, -5, -5, -5, -2, -2], [4, 3])):
        with GGUFFile(_spm_file(tmp_path, tokens, scores, types)) as f:
            assert Tokenizer.from_gguf(f).encode("abc") == expected, scores
    path = _spm_file(tmp_path, tokens + ["abc"], [0, -5, -5, -5, -2, -1, -3], types + [1])
    with GGUFFile(path) as f:
        tok = Tokenizer.from_gguf(f)
    assert tok.encode("abc") == [6]
    assert tok.encode("abcb") == [6, 2]


def test_sentencepiece_falls_back_to_byte_tokens_or_says_which_byte_is_missing(tmp_path):
    tokens = ["<unk>", "a", "<0xC3>", "<0xA9>"]
    path = _spm_file(tmp_path, tokens, [0, -1, -1, -1], [2, 1, 6, 6])
    with GGUFFile(path) as f:
        tok = Tokenizer.from_gguf(f)
    assert tok.encode("aé") == [1, 2, 3]
    assert tok.decode([1, 2, 3]) == "aé"
    with pytest.raises(TokenizerError, match="no token for the byte 0x62"):
        tok.encode("ab")


def test_a_token_listed_twice_is_an_error(tmp_path):
    path = _spm_file(tmp_path, ["<unk>", "a", "a"], [0, -1, -1], [2, 1, 1])
    with GGUFFile(path) as f, pytest.raises(TokenizerError, match="'a' twice"):
        Tokenizer.from_gguf(f)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(texts=st.lists(st.text(max_size=6), max_size=40))
def test_token_texts_read_and_find_every_text_as_a_list_would(texts):
    from polydev.models.tokenizer.token_texts import TokenTexts

    table = TokenTexts(texts)
    assert len(table) == len(texts) and list(table) == texts
    assert table[-1:] == texts[-1:] and table.n_distinct == len(set(texts))
    for i, text in enumerate(texts):
        assert texts[table.id_of(text)] == text
        if texts.count(text) == 1:
            assert table.id_of(text) == i
    for absent in ("\x00never", "zzzzzzz"):
        assert (table.id_of(absent) is None) == (absent not in texts)


def _string_array(entries: list[bytes]):
    """A StringArray over ``entries`` laid out as a GGUF file lays out an array of strings."""
    import struct
    from array import array

    from polydev.models.gguf.reader import StringArray

    data, starts, lengths = bytearray(b"head"), array("q"), array("q")
    for entry in entries:
        data += struct.pack("<Q", len(entry))
        starts.append(len(data))
        lengths.append(len(entry))
        data += entry
    return StringArray(memoryview(bytes(data + b"tail")), starts, lengths)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(entries=st.lists(st.one_of(st.text(max_size=5).map(lambda t: t.encode("utf-8",
                                                                               "surrogatepass")),
                                  st.binary(max_size=4)), max_size=30))
@example(entries=["é".encode()[:1], "é".encode()[1:]])        # one character over two texts
@example(entries=[b"a", b"", "\U0001f600".encode()])
def test_token_texts_of_a_gguf_string_array_are_its_texts_decoded_one_by_one(entries):
    """The fast path (the array's bytes as they are) gives what decoding text by text does,
    whatever the bytes: invalid UTF-8, a character cut over two texts, empty texts."""
    from polydev.models.tokenizer.token_texts import TokenTexts

    strings = _string_array(entries)
    for empty in (None, lambda i: f"[EMPTY_{i}]"):
        fast = TokenTexts.from_strings(strings, empty)
        slow = TokenTexts(t or empty(i) if empty else t for i, t in enumerate(strings))
        assert list(fast) == list(slow) and fast.n_distinct == slow.n_distinct
        assert [fast.id_of(t) for t in slow] == [slow.id_of(t) for t in slow]
