"""The op catalogue: ggml's op names and one builder per op.

This package is the single place that defines what an op means: its result's type and shape,
its ``op_params`` (in ggml's order) and which source goes in which slot. Builders validate the
way ggml's asserts do, but raise a typed ``polydev.errors`` exception naming the offending
shapes. Builders only record metadata; backends compute. Each module holds one family of ops;
all of them are re-exported here, so ``polydev.ops.add`` is the way to call them. What an op's
``op_params`` mean is in ``params.py``: builders pack them and backends read them as typed
records (``RopeParams.of(node)``), never by position.
"""

from ._build import _pad4  # noqa: F401  (Context validates shapes with it)
from .attention import *  # noqa: F401,F403
from .catalogue import *  # noqa: F401,F403
from .conv import *  # noqa: F401,F403
from .elementwise import *  # noqa: F401,F403
from .generate import *  # noqa: F401,F403
from .matmul import *  # noqa: F401,F403
from .norm import *  # noqa: F401,F403
from .params import *  # noqa: F401,F403
from .positional import *  # noqa: F401,F403
from .recurrent import *  # noqa: F401,F403
from .reduce import *  # noqa: F401,F403
from .rows import *  # noqa: F401,F403
from .shape import *  # noqa: F401,F403
from .views import *  # noqa: F401,F403
