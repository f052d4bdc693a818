"""polydev's model layer: GGUF files, weights placed over devices, llama.cpp's tokenizers,
and the models themselves (``polydev.models.load``).

It imports only the runtime (``polydev`` and its modules) and asks the registry for devices;
it never names a backend module (docs/design.md, "Rooms and arrows";
tests/test_import_directions.py keeps it). Needs the ``models`` extra
(``pip install 'polydev[models]'``).
"""

from .batch import Batch, UBatch
from .default_model import default_model_path
from .gguf import GGUFFile, GGUFTensorInfo, StringArray
from .grammar import Grammar, GrammarError
from .hparams import HParams
from .loader import ModelWeights, load_weights
from .model import Model, load
from .placement import DeviceUsage, Placement, TensorPlacement, plan_placement
from .placement_settings import PlacementSettings, parse_size
from .sampling import Sampler, SamplingParams
from .tokenizer import Tokenizer, Vocab

__all__ = [
    "Batch", "UBatch", "default_model_path", "GGUFFile", "GGUFTensorInfo", "StringArray",
    "Grammar", "GrammarError", "HParams",
    "ModelWeights", "load_weights", "Model", "load", "Sampler", "SamplingParams", "DeviceUsage",
    "Placement", "PlacementSettings", "TensorPlacement", "parse_size", "plan_placement",
    "Tokenizer", "Vocab",
]
