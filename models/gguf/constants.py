"""The two GGUF enumerations the model layer reads: metadata value types and token types.

Their values are the format's (``gguf_type`` in ggml's ``gguf.h``, ``llama_token_type`` in
llama.cpp); the ``gguf`` package has them too, but importing it at run time pulled in its
writer, quantizers and yaml (about 3 MiB of resident memory for two small enums), so it
stays what the tests use to write files and to check these values.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["GGUFValueType", "TokenType"]


class GGUFValueType(IntEnum):
    """The type of a metadata value (or of an array's elements)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


class TokenType(IntEnum):
    """What a vocabulary entry is (``tokenizer.ggml.token_type``)."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6
