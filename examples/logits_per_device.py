"""Run the same prompt with every layer on each device and compare the logits with the CPU's.

    python examples/logits_per_device.py [MODEL.gguf]
"""

import sys

import numpy as np

import polydev
from polydev import models

path = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else None
prompt = "The quick brown fox"

with models.load(path, devices=[], progress=False) as model:
    model.eval(model.tokenize(prompt))
    reference = model.logits()

print(f"CPU      top-5 {np.argsort(-reference)[:5].tolist()}")
for device in polydev.devices():
    if device.name == "CPU":
        continue
    with models.load(path, devices=[device], n_gpu_layers=-1, progress=False) as model:
        model.eval(model.tokenize(prompt))
        logits = model.logits()
    diff = np.abs(logits - reference).max()
    print(f"{device.name:8} top-5 {np.argsort(-logits)[:5].tolist()}  max |diff| {diff:.4f}")
