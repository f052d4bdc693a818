"""The argument records of the CPU kernels' packed entry points (backends/cpu/native/
arguments.py): each field is named as the C parameter it carries, in the C function's order,
one int64 word each (a tensor nine), as the packed function in the C sources reads them."""

from __future__ import annotations

import ctypes
import re

import pytest

from polydev.backends.cpu import native
from polydev.backends.cpu.native import arguments
from polydev.backends.cpu.native.arguments import PackedArguments, TensorWords

RECORDS = [cls for cls in vars(arguments).values()
           if isinstance(cls, type) and issubclass(cls, PackedArguments)
           and cls is not PackedArguments]
C_SOURCE = "\n".join(path.read_text() for path in native.SOURCES)


def _parameters(function: str) -> list[str]:
    """The parameter names of C function ``function``'s definition in the kernels' sources."""
    found = re.search(rf"\b{function}\(([^)]*)\)\s*\{{", C_SOURCE)
    assert found, f"{function} is not defined in backends/cpu/native/*.c"
    return [re.findall(r"\w+", p)[-1] for p in found.group(1).split(",")]


def _words(cls: type[ctypes.Structure]) -> int:
    return sum(ctypes.sizeof(kind) // 8 for _, kind in cls._fields_)


def test_every_record_is_checked():
    assert len(RECORDS) == 13


@pytest.mark.parametrize("record", RECORDS, ids=lambda cls: cls.__name__)
def test_fields_are_the_c_parameters_in_order(record):
    """The C function's parameters, less those its packed entry point takes beside the
    record (floats), are the record's fields."""
    assert record.C_FUNCTIONS
    for function in record.C_FUNCTIONS:
        beside = _parameters(f"{function}_packed")[1:]          # after the record itself
        in_record = [p for p in _parameters(function) if p not in beside]
        assert [name for name, _ in record._fields_] == in_record, function


@pytest.mark.parametrize("record", RECORDS, ids=lambda cls: cls.__name__)
def test_a_record_is_an_array_of_int64_words(record):
    assert ctypes.sizeof(record) == 8 * _words(record)
    assert ctypes.alignment(record) == 8


def test_a_tensor_is_its_address_ne_and_nb():
    class T:
        ne, nb = (4, 3, 2, 1), (4, 16, 48, 96)
    words = TensorWords.of(0x1000, T())
    assert ctypes.sizeof(TensorWords) == 9 * 8
    assert (words.data, list(words.ne), list(words.nb)) == (0x1000, [4, 3, 2, 1],
                                                            [4, 16, 48, 96])
    absent = TensorWords.of(0x1000, None)
    assert (absent.data, list(absent.ne), list(absent.nb)) == (0, [1, 1, 1, 1], [0, 0, 0, 0])


def test_a_field_set_by_name_is_the_word_the_kernel_reads():
    args = arguments.MulMatInterleavedArguments(type=12, M=16, K=256)
    args.p = 0xDEADBEEF000
    words = (ctypes.c_int64 * _words(type(args))).from_address(args.address)
    assert list(words)[:4] == [12, 0xDEADBEEF000, 16, 256]


def test_the_rope_angles_are_kernels_c_s_struct():
    """RopeAngles is kernels.c's pd_rope_angles, field by field, with no padding between."""
    fields = re.search(r"typedef struct \{([^}]*)\} pd_rope_angles;", C_SOURCE).group(1)
    code = re.sub(r"/\*.*?\*/", "", fields, flags=re.S)
    names = re.findall(r"(\w+)\s*[,;]", code)
    assert names == [name for name, _ in arguments.RopeAngles._fields_]
    assert ctypes.sizeof(arguments.RopeAngles) == sum(
        ctypes.sizeof(kind) for _, kind in arguments.RopeAngles._fields_) == 88


def _c_words(prefix: str) -> list[str]:
    """The names of an ``enum { PREFIX_TYPE, ... }`` of the C sources, prefix and the closing
    ``PREFIX_WORDS`` left out, lower case."""
    body = re.search(rf"enum \{{\s*({prefix}_TYPE[^}}]*)\}};", C_SOURCE).group(1)
    return [name[len(prefix) + 1:].lower() for name in re.findall(r"\w+", body)
            if name != f"{prefix}_WORDS"]


@pytest.mark.parametrize("prefix,record", [("MMI", arguments.MulMatInterleavedArguments),
                                           ("MMID", arguments.MulMatIdInterleavedArguments)])
def test_the_joined_calls_name_the_words_of_their_records(prefix, record):
    """interleaved.c reads the records of the calls it joins word by word: its named word
    positions are the records' fields, in order."""
    assert _c_words(prefix) == [name.lower() for name, _ in record._fields_]


def test_the_joined_calls_compare_the_words_shared_input_joins_on():
    """The words a joined call checks the records share are those shared_input.py groups the
    calls by, and both sides join at most as many calls."""
    from polydev.backends.cpu.call_record import CallCode
    from polydev.backends.cpu.shared_input import _JOINS, MAX_SHARED

    for prefix, code in (("MMI", CallCode.MUL_MAT_INTERLEAVED),
                         ("MMID", CallCode.MUL_MAT_ID_INTERLEAVED)):
        body = re.search(rf"{prefix}_SHARED\[\] = \{{([^}}]*)\}}", C_SOURCE).group(1)
        checked = {name[len(prefix) + 1:].lower() for name in re.findall(r"\w+", body)}
        assert checked == {word.lower() for word in _JOINS[code][1]}
    assert int(re.search(r"#define SHARED_MAX (\d+)", C_SOURCE).group(1)) == MAX_SHARED
