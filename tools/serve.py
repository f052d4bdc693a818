"""``polydev serve``: an OpenAI-compatible server over a GGUF model, llama-server style.

The model loads in the background (``/health`` answers 503 until it is ready); ``-np``
sequences share the ``-c`` context and are decoded together. Ctrl-C stops taking requests,
lets the running ones finish, and exits.
"""

from __future__ import annotations

import argparse
import os
import sys

from polydev.env import env_text
from polydev.errors import InvalidArgumentError, MissingDependencyError

from .info import add_model_option, add_numerics_option, model_path
from .placement_options import add_placement_options, placement_settings

_DRAIN_SECONDS = 30             # how long Ctrl-C waits for running requests
# polydev.models.embeddings.POOLING, named here: the command line loads without the models extra
_POOLING = ("none", "mean", "cls", "last")


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """``polydev serve [-m MODEL] [-np N] [--host H] [--port P] [--api-key K] [placement]``."""
    p = sub.add_parser("serve", parents=parents,
                       help="serve a GGUF model over OpenAI's HTTP API (many requests at once)",
                       description="Serve a GGUF model (default: gemma-3-270m) over OpenAI's "
                                   "API: /v1/chat/completions, /v1/completions, /v1/models, "
                                   "/health, /metrics, /slots. Requests are batched together "
                                   "over -np sequences that share the -c context.")
    add_model_option(p)
    p.add_argument("-np", "--parallel", type=int, default=4, metavar="N",
                   help="sequences decoded at once (slots; default 4, at most 64)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--api-key", metavar="KEY", default=env_text("POLYDEV_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $POLYDEV_API_KEY, "
                        "else none)")
    p.add_argument("--alias", metavar="NAME",
                   help="the model's name in the API (default: the file's name)")
    p.add_argument("--max-queue", type=int, default=64, metavar="N",
                   help="requests that may wait for a slot; more get 503 (default 64)")
    p.add_argument("--embeddings", action="store_true",
                   help="serve embeddings only (/v1/embeddings, /embeddings), as llama-server's "
                        "--embeddings")
    p.add_argument("--pooling", choices=_POOLING,
                   help="how --embeddings pools a text's tokens (default: the file's "
                        "pooling_type, else mean)")
    p.add_argument("-v", "--verbose", dest="log_level", action="store_const", const="INFO",
                   default=argparse.SUPPRESS,
                   help="log at INFO: each request's draft acceptance, loading (--log-level "
                        "INFO)")
    spec = p.add_argument_group("speculative decoding (llama-server's options)")
    spec.add_argument("-md", "--model-draft", metavar="FILE",
                      help="a draft model of the same vocabulary, on the CPU")
    spec.add_argument("--spec-type", choices=("draft", "ngram"),
                      help="draft: the -md model; ngram: no model, the sequence's own n-grams "
                           "(default: draft with -md, else off)")
    spec.add_argument("--draft-max", type=int, default=16, metavar="N",
                      help="tokens drafted at most per step (default 16)")
    spec.add_argument("--draft-min", type=int, default=0, metavar="N",
                      help="shorter drafts are not checked (default 0)")
    spec.add_argument("--draft-p-min", type=float, default=0.75, metavar="P",
                      help="the draft model stops below this probability (default 0.75)")
    p.add_argument("--slot-save-path", metavar="DIR",
                   help="where POST /slots/{id}?action=save writes a slot's cache and restore "
                        "reads it (default: those actions are off)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar while loading")
    add_numerics_option(p)
    add_placement_options(p)
    p.set_defaults(run=run)


def _drafter(args: argparse.Namespace):
    """What makes the speculative drafter (after the model loads), or None."""
    kind = args.spec_type or ("draft" if args.model_draft else None)
    if kind is None:
        return None
    if kind == "ngram" and args.model_draft:
        raise InvalidArgumentError("-md is the draft model of --spec-type draft; n-grams "
                                   "need none")
    if args.embeddings:
        raise InvalidArgumentError("speculative decoding is for generation, not --embeddings")
    from polydev.models import load
    from polydev.models.speculative import ModelDrafter, NgramDrafter, SpeculativeSettings

    settings = SpeculativeSettings(args.draft_max, args.draft_min, args.draft_p_min)
    if kind == "ngram":
        return lambda model: NgramDrafter(settings)
    if not args.model_draft:
        raise InvalidArgumentError("--spec-type draft needs a draft model: -md FILE")
    if not os.path.isfile(args.model_draft):
        raise InvalidArgumentError(f"the draft model {args.model_draft} does not exist")

    def make(model):
        draft = load(args.model_draft, devices=[], n_ctx=model.n_ctx, progress=False)
        try:
            return ModelDrafter(draft, model.hparams.n_vocab, settings)
        except BaseException:
            draft.close()
            raise
    return make


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from polydev.models import load
        from polydev.server import ModelWorker, create_app
    except ImportError as e:
        raise MissingDependencyError(f"polydev serve needs the serve and models extras: pip "
                                     f"install 'polydev[serve,models]' ({e})") from None
    if not 1 <= args.parallel <= 64:
        raise InvalidArgumentError(f"-np must be in [1, 64], got {args.parallel}")
    if not 0 <= args.port <= 65535:
        raise InvalidArgumentError(f"--port must be in [0, 65535], got {args.port}")
    if args.max_queue < 0:
        raise InvalidArgumentError(f"--max-queue must be 0 or more, got {args.max_queue}")
    if args.pooling and not args.embeddings:
        raise InvalidArgumentError("--pooling is for --embeddings")
    if args.slot_save_path is not None and not os.path.isdir(args.slot_save_path):
        raise InvalidArgumentError(f"--slot-save-path {args.slot_save_path} is not a folder")
    drafter = _drafter(args)
    path, settings = model_path(args), placement_settings(args)
    if not os.path.isfile(path):
        raise InvalidArgumentError(f"the model file {path} does not exist")
    name = args.alias or os.path.basename(path)

    def load_model():
        return load(path, settings=settings, progress=not args.no_progress,
                    numerics=args.numerics)

    worker = ModelWorker(load_model, args.parallel, args.max_queue, embeddings=args.embeddings,
                         pooling=args.pooling, drafter=drafter)
    app = create_app(worker, model_name=name, api_key=args.api_key,
                     drain_seconds=_DRAIN_SECONDS, slot_save_path=args.slot_save_path)
    what = "embeddings" if args.embeddings else f"{args.parallel} slots"
    print(f"polydev: serving {name} on http://{args.host}:{args.port} ({what}, context "
          f"{settings.n_ctx}); Ctrl-C stops", file=sys.stderr)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                            timeout_graceful_shutdown=_DRAIN_SECONDS)
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1
