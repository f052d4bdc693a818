"""``polydev info``: what a user checks before running a model: its architecture and
hyperparameters, tokenizer, tensors by type, and where each layer would go for the placement
knobs given (llama.cpp's spelling, ``placement_options``: -ngl, -ts, -mg, -sm, -ot, --device).
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from typing import Any

from polydev.errors import MissingDependencyError
from polydev.numerics import DEFAULT_NUMERICS, NUMERICS

from .placement_options import add_placement_options, placement_settings
from .table import format_table


def add_numerics_option(p: argparse.ArgumentParser) -> None:
    """``--numerics``: how the CPU computes (``polydev.numerics``)."""
    p.add_argument("--numerics", choices=NUMERICS, default=DEFAULT_NUMERICS,
                   help="fast (default): the CPU multiplies quantized weights by activations "
                        "quantized to int16; int8: to int8 per 32 values, as llama.cpp does "
                        "(up to 1.6x the speed of prompts and batches with AVX-512 VNNI, "
                        "logits further from float64); exact: in float32, as a float64 "
                        "evaluation gives")


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """``polydev info [-m MODEL] [placement knobs] [--json] [--tensors]``."""
    p = sub.add_parser("info", parents=parents,
                       help="describe a GGUF model and where its layers would go",
                       description="Describe a GGUF model (architecture, hyperparameters, "
                                   "tokenizer, tensors by type) and the placement of its "
                                   "weights for the knobs given. Without -m: the embedded "
                                   "default model (gemma-3-270m).")
    add_model_option(p)
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    p.add_argument("--tensors", action="store_true", help="also list every tensor's placement")
    p.add_argument("--architectures", action="store_true",
                   help="list the architectures polydev runs (general.architecture values), "
                        "and exit")
    add_placement_options(p)
    p.set_defaults(run=run)


def add_model_option(p: argparse.ArgumentParser) -> None:
    """``-m/--model``, the GGUF file (the subcommands that load a model take it)."""
    p.add_argument("-m", "--model", metavar="PATH", help="a GGUF file (default: gemma-3-270m)")


def model_path(args: argparse.Namespace) -> str:
    """The model the command line names, or the default model."""
    if args.model:
        return args.model
    from polydev.models.default_model import default_model_path

    return str(default_model_path())


def run(args: argparse.Namespace) -> int:
    try:
        from polydev.models.gguf import GGUFFile
        from polydev.models.hparams import HParams
        from polydev.models.placement import plan_placement
        from polydev.models.tokenizer import Vocab
    except ImportError as e:
        raise MissingDependencyError(f"polydev info needs the models extra: pip install "
                                     f"'polydev[models]' ({e})") from None
    if args.architectures:
        return _print_architectures(args.json)
    settings = placement_settings(args)
    with GGUFFile(model_path(args)) as f:
        hp = HParams.from_gguf(f)
        vocab = Vocab.from_gguf(f) if "tokenizer.ggml.model" in f.metadata else None
        plan = plan_placement(f, settings)
        report = _report(f, hp, vocab, plan)
    if args.json:
        report["placement"] = plan.as_dict()
        if not args.tensors:
            report["placement"].pop("tensors")
        print(json.dumps(report, indent=2))
        return 0
    print(_text(report, plan, args.tensors))
    return 0


def _print_architectures(as_json: bool) -> int:
    """The architecture table: name, models, RoPE, tensors per layer, keys read."""
    from polydev.models.arch import architecture, supported

    rows = []
    for name in supported():
        spec = architecture(name)
        rows.append({"architecture": name, "models": spec.description, "rope": spec.rope,
                     "tensors": [t.name for t in spec.tensors],
                     "keys": [f"{name}.{k.name}" for k in spec.keys]})
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    print(format_table(["architecture", "models", "rope", "tensor kinds", "keys"],
                       [(r["architecture"], r["models"], r["rope"], len(r["tensors"]),
                         len(r["keys"])) for r in rows]))
    return 0


def _report(f, hp, vocab, plan) -> dict[str, Any]:
    from polydev.models.arch import architecture

    by_type: Counter = Counter()
    count: Counter = Counter()
    for t in f.tensors.values():
        by_type[str(t.type)] += t.nbytes
        count[str(t.type)] += 1
    tokenizer = None
    if vocab is not None:
        tokenizer = {"model": vocab.model, "pre": vocab.pre.name if vocab.pre else None,
                     "n_vocab": len(vocab), "bos": _token(vocab, vocab.bos_id),
                     "eos": _token(vocab, vocab.eos_id), "eot": _token(vocab, vocab.eot_id),
                     "eog": sorted(vocab.eog_ids), "add_bos": vocab.add_bos,
                     "add_eos": vocab.add_eos, "add_space_prefix": vocab.add_space_prefix,
                     "chat_template": "tokenizer.chat_template" in f.metadata}
    return {
        "file": f.path, "file_bytes": f.size, "gguf_version": f.version,
        "name": f.get("general.name"), "architecture": hp.arch,
        "architecture_models": architecture(hp.arch).description,
        "hparams": {"n_layer": hp.n_layer, "n_ctx_train": hp.n_ctx_train, "n_embd": hp.n_embd,
                    "n_ff": hp.n_ff, "n_head": hp.n_head, "n_head_kv": sorted(set(hp.n_head_kv)),
                    "n_embd_head_k": hp.n_embd_head_k, "n_embd_head_v": hp.n_embd_head_v,
                    "n_vocab": hp.n_vocab, "n_expert": hp.n_expert,
                    "n_expert_used": hp.n_expert_used, "sliding_window": hp.sliding_window,
                    "n_sliding_layers": sum(hp.swa_layers),
                    "rope_freq_base": f.get(f"{hp.arch}.rope.freq_base")},
        "tokenizer": tokenizer,
        "tensors": {"count": len(f.tensors), "bytes": sum(by_type.values()),
                    "by_type": {k: {"count": count[k], "bytes": v}
                                for k, v in sorted(by_type.items(), key=lambda kv: -kv[1])}},
    }


def _token(vocab, token_id: int | None) -> str | None:
    return None if token_id is None else f"{token_id} {vocab.tokens[token_id]!r}"


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def layer_ranges(layers: list[int], n_layer: int) -> str:
    """[0, 1, 2, 5, 18] -> "0-2, 5, output" (n_layer = 18)."""
    parts, run_start, prev = [], None, None
    body = [il for il in layers if il < n_layer]
    for il in body + [None]:
        if run_start is not None and (il is None or il != prev + 1):
            parts.append(str(run_start) if run_start == prev else f"{run_start}-{prev}")
            run_start = None
        if il is not None and run_start is None:
            run_start = il
        prev = il
    if n_layer in layers:
        parts.append("output")
    return ", ".join(parts) or "-"


def _text(report: dict[str, Any], plan, with_tensors: bool) -> str:
    hp = report["hparams"]
    tok = report["tokenizer"]
    lines = [f"model        {os.path.basename(report['file'])} ({mib(report['file_bytes'])}, "
             f"GGUF v{report['gguf_version']})",
             f"name         {report['name'] or '-'}",
             f"architecture {report['architecture']} ({report['architecture_models']})",
             "hparams      " + ", ".join(f"{k} {v}" for k, v in hp.items()
                                          if v not in (None, 0)),
             ]
    if tok is not None:
        pre = f", pre {tok['pre']}" if tok["pre"] else ""
        lines.append(f"tokenizer    {tok['model']}{pre}, {tok['n_vocab']:,} tokens, bos "
                     f"{tok['bos']}, eos {tok['eos']}, add_bos {tok['add_bos']}, chat template "
                     f"{'yes' if tok['chat_template'] else 'no'}")
    t = report["tensors"]
    lines += ["", f"tensors: {t['count']}, {mib(t['bytes'])}",
              format_table(["type", "count", "bytes"],
                           [(k, v["count"], mib(v["bytes"])) for k, v in t["by_type"].items()]),
              "", "placement: " + _knob_summary(plan.applied_settings()),
              format_table(["device", "layers", "weights", "KV cache", "compute (est.)",
                            "total"],
                           [(u.device.name, layer_ranges(u.layers, plan.hparams.n_layer),
                             mib(u.weights), mib(u.kv_cache), mib(u.compute), mib(u.total))
                            for u in plan.usage.values()])]
    if with_tensors:
        lines += ["", format_table(
            ["tensor", "type", "bytes", "op", "device", "buffer type", "why"],
            [(tp.name, tp.type, f"{tp.nbytes:,}", tp.op, tp.device.name, tp.buffer_type.name,
              tp.cause) for tp in plan.tensors.values()])]
    return "\n".join(lines)


def _knob_summary(settings: dict[str, Any]) -> str:
    shown = {k: v for k, v in settings.items() if v not in (None, [], False)}
    return ", ".join(f"{k}={v}" for k, v in shown.items())
