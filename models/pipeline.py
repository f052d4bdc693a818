"""Pipeline parallelism over the devices that hold a model's layers (llama.cpp's rule).

Where every layer, the output and the KV cache are on offload devices, at least two of them,
and each of those devices copies asynchronously and has events, the scheduler keeps several
copies of its split inputs (ggml's n_copies) and the evaluator queues its pieces of a batch
without waiting between them: while the second device computes piece k, the first computes
piece k + 1. A batch of one piece (a decode step of several sequences, a prompt within
``n_batch``) is cut into as many micro-batches as there are stages, so that the devices work at
once; a single token cannot be cut. Rules that move tensors elsewhere (``override_tensor``,
``cpu_moe``) turn it off, as in llama.cpp: the CPU would wait for every piece. So do stages
that compute on the same cores (CPU devices of one host, such as the nodes of a Ray cluster on
one machine): there, pieces in flight at once only take turns, and half-size pieces cost
(a 1B-class model split over two nodes of one 2-core machine: pp512 0.91x unpipelined).
"""

from __future__ import annotations

from polydev.device import Device, DeviceType

from .placement import Placement

__all__ = ["pipeline_stages", "micro_batch_size"]


def pipeline_stages(placement: Placement) -> int:
    """How many devices the layers run through in turn (0: no pipeline)."""
    settings = placement.settings
    if settings.override_tensor or settings.cpu_moe:
        return 0
    on = [*placement.layer_devices, *placement.kv_devices]
    if any(d is placement.cpu for d in on):
        return 0
    stages = list({d.name: d for d in placement.layer_devices}.values())
    if len(stages) < 2 or len({_compute_of(d) for d in stages}) < len(stages):
        return 0                          # stages that share cores would take turns
    if not all(d.caps.async_ and d.caps.events for d in stages):
        return 0
    return len(stages)


def _compute_of(device: Device) -> tuple[str, str]:
    """What ``device`` computes with: a CPU device, its host's cores; any other, itself."""
    if device.type == DeviceType.CPU:
        return ("cores", device.host)
    return ("device", device.name)


def micro_batch_size(n_tokens: int, n_batch: int, stages: int) -> int:
    """The tokens of each piece a batch of ``n_tokens`` is evaluated in."""
    if stages < 2 or n_tokens > n_batch:
        return n_batch
    return max(1, -(-n_tokens // stages))
