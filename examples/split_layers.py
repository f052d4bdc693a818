"""Split a model's layers over two devices, print where they went, and generate.

    python examples/split_layers.py [MODEL.gguf] [DEVICE]

DEVICE defaults to the first device that is not the CPU (with PoCL:
POCL_DEVICES="pthread pthread" gives OpenCL0 and OpenCL1). Half of the layers (the last
ones, as llama.cpp offloads them) go there, the rest stay on the CPU.
"""

import sys

import polydev
from polydev import models

path = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else None
others = [d.name for d in polydev.devices() if d.name != "CPU"]
device = sys.argv[2] if len(sys.argv) > 2 else (others[0] if others else "CPU")

with models.GGUFFile(path or models.default_model_path()) as f:
    n_layer = models.HParams.from_gguf(f).n_layer

with models.load(path, devices=[device], n_gpu_layers=n_layer // 2, n_ctx=1024) as model:
    for use in model.placement.usage.values():
        print(f"{use.device.name:8} layers {use.layers}  weights {use.weights / 2**20:.1f} MiB")
    for piece in model.generate("The capital of France is", 32, temperature=0):
        print(piece, end="", flush=True)
    print()
    t = model.timings
    print(f"prompt {t.prompt_tokens / t.prompt_seconds:.1f} t/s, "
          f"generation {t.eval_tokens / t.eval_seconds:.1f} t/s, splits {t.splits}")
