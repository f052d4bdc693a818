"""``polydev run``: generate text with a GGUF model, llama-cli style.

The text streams to stdout as it is generated; logs, the load progress bar and the timing
summary go to stderr. Ctrl-C stops generation cleanly and still prints the summary.
"""

from __future__ import annotations

import argparse
import sys

from polydev.errors import InvalidArgumentError, MissingDependencyError

from .info import add_model_option, add_numerics_option, layer_ranges, mib, model_path
from .placement_options import add_placement_options, placement_settings
from .table import format_table


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """``polydev run [-m MODEL] [-p PROMPT | -f FILE] [-n N] [sampling] [placement]``."""
    p = sub.add_parser("run", parents=parents,
                       help="generate text with a GGUF model (default: gemma-3-270m)",
                       description="Generate text with a GGUF model whose layers are placed "
                                   "over the devices as llama.cpp places them. Text goes to "
                                   "stdout as it is generated; the timing summary to stderr.")
    add_model_option(p)
    p.add_argument("-p", "--prompt", default=None, help="the prompt (default: 'Once upon a "
                   "time')")
    p.add_argument("-f", "--file", metavar="PATH", help="read the prompt from a file")
    p.add_argument("-n", "--n-predict", type=int, default=128, metavar="N",
                   help="tokens to generate at most (default 128)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="end the text where TEXT appears (TEXT itself is not printed); "
                        "repeat for several")
    p.add_argument("--chat", action="store_true",
                   help="send the prompt as one user message through the model's chat template")
    p.add_argument("-i", "--interactive", action="store_true",
                   help="a conversation: read a message, reply, repeat (end with Ctrl-D)")
    p.add_argument("--show-placement", action="store_true",
                   help="print where each layer went before generating")
    p.add_argument("--no-progress", action="store_true", help="no progress bar while loading")
    add_numerics_option(p)
    s = p.add_argument_group("sampling (as llama.cpp)")
    s.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy (0.8)")
    s.add_argument("--top-k", type=int, default=40, help="top-k (40; 0 = off)")
    s.add_argument("--top-p", type=float, default=0.95, help="top-p (0.95; 1 = off)")
    s.add_argument("--min-p", type=float, default=0.05, help="min-p (0.05; 0 = off)")
    s.add_argument("--repeat-penalty", type=float, default=1.0,
                   help="penalty of repeated tokens (1.0 = off)")
    s.add_argument("--repeat-last-n", type=int, default=64,
                   help="tokens the penalty looks back over (64; -1 = the context)")
    s.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    add_placement_options(p)
    p.set_defaults(run=run)


def _prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None and args.file is not None:
        raise InvalidArgumentError("give the prompt with -p or -f, not both")
    if args.file is not None:
        try:
            with open(args.file, encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise InvalidArgumentError(f"cannot read the prompt file {args.file}: "
                                       f"{e.strerror}") from None
    return "Once upon a time" if args.prompt is None else args.prompt


def _generation_options(args: argparse.Namespace) -> dict:
    return dict(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
                seed=args.seed, stop=args.stop)


def run(args: argparse.Namespace) -> int:
    try:
        from polydev.models import load
    except ImportError as e:
        raise MissingDependencyError(f"polydev run needs the models extra: pip install "
                                     f"'polydev[models]' ({e})") from None
    prompt = _prompt(args)
    if args.n_predict < 0:
        raise InvalidArgumentError(f"-n must be 0 or more, got {args.n_predict}")
    settings = placement_settings(args)
    with load(model_path(args), settings=settings, progress=not args.no_progress,
              numerics=args.numerics) as model:
        if args.show_placement:
            _print_placement(model)
        try:
            if args.interactive:
                _converse(model, prompt if args.prompt or args.file else None, args)
            else:
                options = _generation_options(args)
                pieces = (model.chat([{"role": "user", "content": prompt}], args.n_predict,
                                     **options) if args.chat
                          else model.generate(prompt, args.n_predict, **options))
                _stream(pieces, _splitter(model, args.chat))
                print()
        except KeyboardInterrupt:
            print("\n[interrupted]", file=sys.stderr)
        _print_system_info(args)
        _print_summary(model)
    return 0


def _splitter(model, chat: bool):
    """A harmony model's chat reply is split: its reasoning to stderr, its answer to stdout."""
    from polydev.models.harmony import ChannelSplitter

    return ChannelSplitter() if chat and model.speaks_harmony else None


def _stream(pieces, splitter=None) -> str:
    """Print ``pieces`` as they come; the answer's text (without a harmony model's reasoning)
    is returned."""
    text = []
    for piece in pieces:
        parts = splitter.feed(piece) if splitter is not None else [("content", piece)]
        for kind, part in parts:
            _write(kind, part)
            if kind == "content":
                text.append(part)
    for kind, part in splitter.finish() if splitter is not None else ():
        _write(kind, part)
        if kind == "content":
            text.append(part)
    return "".join(text)


def _write(kind: str, text: str) -> None:
    out = sys.stdout if kind == "content" else sys.stderr
    out.write(text)
    out.flush()


def _converse(model, first: str | None, args: argparse.Namespace) -> None:
    """A simple chat loop: the whole conversation goes through the template each turn."""
    messages: list[dict] = []
    message = first
    while True:
        if message is None:
            try:
                message = input("> ")
            except EOFError:
                print(file=sys.stderr)
                return
        messages.append({"role": "user", "content": message})
        reply = _stream(model.chat(messages, args.n_predict, **_generation_options(args)),
                        _splitter(model, True))
        print()
        messages.append({"role": "assistant", "content": reply})
        message = None


def _print_system_info(args: argparse.Namespace) -> None:
    """As llama.cpp's system_info line: how the CPU computes (its kernels' feature level,
    and where they came from; or the numpy path) and with which numerics."""
    from polydev.backends.cpu.native import kernels

    lib = kernels()
    cpu = f"{lib.variant} ({lib.origin})" if lib is not None else "none (the numpy path)"
    print(f"polydev: system_info: CPU kernels = {cpu} | numerics = {args.numerics}",
          file=sys.stderr)


def _print_placement(model) -> None:
    plan = model.placement
    print(format_table(["device", "layers", "weights", "KV cache"],
                       [(u.device.name, layer_ranges(u.layers, plan.hparams.n_layer),
                         mib(u.weights), mib(u.kv_cache)) for u in plan.usage.values()]),
          file=sys.stderr)


def _print_summary(model) -> None:
    """llama.cpp's perf lines, then per device: splits and bytes copied into it."""
    t = model.timings
    err = sys.stderr

    def line(label: str, seconds: float, tokens: int) -> None:
        per = (f" ({seconds * 1e3 / tokens:8.2f} ms per token, {tokens / seconds:8.2f} tokens "
               f"per second)" if tokens and seconds else "")
        print(f"polydev: {label:>18} = {seconds * 1e3:10.2f} ms / {tokens:5d} tokens{per}",
              file=err)

    print(f"\npolydev: {'load time':>18} = {model.load_seconds * 1e3:10.2f} ms", file=err)
    line("prompt eval time", t.prompt_seconds, t.prompt_tokens)
    line("eval time", t.eval_seconds, t.eval_tokens)
    rows = [(name, t.splits.get(name, 0), f"{t.copied_bytes.get(name, 0) / 2**20:,.2f} MiB")
            for name in t.splits]
    print(format_table(["device", "splits per step", "copied in"], rows), file=err)
