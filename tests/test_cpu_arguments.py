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
