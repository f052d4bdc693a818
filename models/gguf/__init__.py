"""The GGUF format, and nothing of models: ``reader.py`` reads a file (header, metadata, tensor
table) over ``mmap``; ``constants.py`` holds the format's enumerations."""

from .constants import GGUFValueType, TokenType
from .reader import DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUFFile, GGUFTensorInfo, StringArray

__all__ = ["GGUFFile", "GGUFTensorInfo", "StringArray", "GGUF_MAGIC", "DEFAULT_ALIGNMENT",
           "GGUFValueType", "TokenType"]
