"""``polydev compare``: the cross-backend compare tool (ggml's test-backend-ops).

The case catalogue lives in ``cases_*.py`` as data plus small builders; ``runner`` runs one
case in one mode; ``report`` prints; ``command`` is the command line.
"""

from .command import add_parser, run

__all__ = ["add_parser", "run"]
