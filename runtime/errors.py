"""The exception types users can catch.

Every user mistake raises one of these with a message that says what went wrong and where
(the offending shapes, the device name, the byte range). Internal invariants use ``assert``.
"""

from __future__ import annotations


class PolydevError(Exception):
    """Base class of every error polydev raises on purpose."""


class ShapeError(PolydevError, ValueError):
    """Tensor shapes (ne) or strides (nb) do not fit the operation."""


class TensorTypeError(PolydevError, TypeError):
    """A tensor's element type is not accepted by the operation."""


class InvalidArgumentError(PolydevError, ValueError):
    """A parameter is out of its valid range."""


class ContextFullError(InvalidArgumentError):
    """A batch needs more cells of a model's context (its KV cache) than are free."""


class ConfigError(InvalidArgumentError):
    """A ``POLYDEV_*`` environment variable holds a value polydev cannot use."""


class DeviceNotFoundError(PolydevError, LookupError):
    """No registered device (or reg) matches the requested name or type."""


class UnsupportedError(PolydevError, NotImplementedError):
    """A backend, device or buffer does not implement an optional capability."""


class UnsupportedOpError(UnsupportedError):
    """A backend has no kernel for an op with these types."""


class CompileError(UnsupportedError):
    """A backend's kernels did not build (the message holds the compiler's own lines): the
    device cannot run them here."""


class OutOfBoundsError(PolydevError, IndexError):
    """A read or write would leave a tensor's or buffer's memory."""


class AllocationError(PolydevError, MemoryError):
    """A buffer could not be allocated, or a tensor does not fit its buffer."""


class NotAllocatedError(PolydevError, RuntimeError):
    """A tensor has no memory yet (it was never placed in a buffer)."""


class ClosedError(PolydevError, RuntimeError):
    """A buffer, backend or event was used after ``close()``."""


class GraphError(PolydevError, RuntimeError):
    """A graph is malformed or exceeds its capacity."""


class BackendLoadError(PolydevError, ImportError):
    """A backend registered through the entry-point group failed to load."""


class GGUFError(PolydevError, ValueError):
    """A GGUF file is truncated, corrupt or uses something polydev cannot read; the message
    names the file, what is wrong and the byte offset where it was found."""


class ModelFileError(GGUFError):
    """A readable GGUF file that is not a valid model of its architecture: a required key or
    tensor missing, a tensor unknown or of the wrong shape, a hyperparameter out of range.
    The message names the file, the key or tensor, and what was expected."""


class TokenizerError(PolydevError, ValueError):
    """A GGUF vocabulary cannot be turned into a tokenizer, or a token id is out of range."""


class MissingDependencyError(PolydevError, ImportError):
    """An optional package a feature needs is not installed; the message says which extra."""


class WireError(InvalidArgumentError):
    """What a remote device received is not what polydev sends (a malformed graph or
    transfer); the message names the tensor and the field. Nothing of it was kept."""


class RemoteDeviceError(PolydevError, RuntimeError):
    """A remote device failed to answer: its actor died, its node was lost, a call timed out,
    or the two sides' polydev differ. The message names the device."""
