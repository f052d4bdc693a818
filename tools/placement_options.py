"""The placement knobs on the command line, as llama.cpp spells them (-ngl, -ts, -mg, -sm,
-ot, --cpu-moe, --device, -nkvo, -c, -b), and the ``PlacementSettings`` record they make.

Each option's ``dest`` is its knob's name, so ``placement_settings`` passes every option a
subcommand has straight to the record (which checks them) and leaves the others at their
defaults. Adding a knob here: its option, and a converter in ``_FROM_TEXT`` if it is not a
plain value.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, Callable

from polydev.errors import InvalidArgumentError

if TYPE_CHECKING:        # polydev.models needs the models extra: imported when a command runs
    from polydev.models.placement_settings import PlacementSettings

__all__ = ["add_placement_options", "placement_settings"]


def add_placement_options(p: argparse.ArgumentParser) -> None:
    """The placement knobs, as llama.cpp spells them (``polydev info``, ``run``, ``serve``)."""
    g = p.add_argument_group("placement (as llama.cpp)")
    g.add_argument("-ngl", "--n-gpu-layers", type=int, default=-1, metavar="N",
                   help="layers to offload, counting the output layer; -1 (default) = all")
    g.add_argument("-ts", "--tensor-split", metavar="A,B,...",
                   help="share of the offloaded layers per device, e.g. 3,1 (default: by free "
                        "memory)")
    g.add_argument("-mg", "--main-gpu", type=int, default=0, metavar="I",
                   help="the device used with --split-mode none (default 0)")
    g.add_argument("-sm", "--split-mode", choices=("none", "layer", "row"), default="layer",
                   help="none: one device; layer (default): layers over the devices")
    g.add_argument("-ot", "--override-tensor", action="append", default=[],
                   metavar="REGEX=DEVICE",
                   help="put tensors whose name matches REGEX on DEVICE (first match wins; "
                        "may repeat)")
    g.add_argument("--cpu-moe", action="store_true",
                   help="keep the mixture-of-experts weights on the CPU")
    g.add_argument("--device", dest="devices", metavar="D1,D2",
                   help="the devices to offload to, comma-separated, or 'none' (default: every "
                        "GPU)")
    g.add_argument("-nkvo", "--no-kv-offload", action="store_true",
                   help="keep the KV cache on the CPU")
    g.add_argument("-c", "--ctx-size", dest="n_ctx", type=int, default=4096, metavar="N",
                   help="context size the KV cache is sized for (default 4096)")
    g.add_argument("-b", "--batch-size", dest="n_batch", type=int, default=512, metavar="N",
                   help="tokens per batch, for the compute estimate (default 512)")


def placement_settings(args: argparse.Namespace, **overrides: Any) -> PlacementSettings:
    """The ``PlacementSettings`` of the placement options ``args`` has (a subcommand that
    offers only some, as ``polydev bench``, leaves the rest at their defaults), with
    ``overrides`` on top."""
    from polydev.models.placement_settings import PLACEMENT_KNOBS, PlacementSettings

    given = {name: getattr(args, name) for name in PLACEMENT_KNOBS if hasattr(args, name)}
    for name, from_text in _FROM_TEXT.items():
        if isinstance(given.get(name), str):
            given[name] = from_text(given[name])
    return PlacementSettings(**{**given, **overrides})


def _device_names(text: str) -> list[str]:
    """``--device CUDA0,CUDA1`` or ``--device none`` (offload nothing)."""
    if text.strip().lower() == "none":
        return []
    return [d.strip() for d in text.split(",") if d.strip()]


def _proportions(text: str) -> list[float]:
    """``-ts 3,1`` (llama.cpp also takes 3/1)."""
    try:
        return [float(x) for x in text.replace("/", ",").split(",")]
    except ValueError:
        raise InvalidArgumentError(f"-ts {text!r}: expected numbers such as 3,1") from None


_FROM_TEXT: dict[str, Callable[[str], Any]] = {"devices": _device_names,
                                              "tensor_split": _proportions}
