"""Write a Chrome trace (chrome://tracing or ui.perfetto.dev) of one decode step: every copy
between devices and every split's compute, one row per device.

    python examples/trace_decode_step.py [MODEL.gguf] [trace.json]
"""

import sys

import polydev
from polydev import models

path = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else None
out = sys.argv[2] if len(sys.argv) > 2 else "decode_step.json"
others = [d.name for d in polydev.devices() if d.name != "CPU"]

with models.load(path, devices=others[:1], n_gpu_layers=8, progress=False) as model:
    ids = model.tokenize("Once upon a time")
    model.eval(ids)
    next_token = int(model.logits().argmax())
    model.eval([next_token])                      # build and warm the decode graph
    sched = model.evaluator.sched
    with sched.trace() as events:
        model.eval([int(model.logits().argmax())])
    sched.write_trace(out, events)
    print(f"{len(events)} events over {sched.n_splits} splits written to {out}")
