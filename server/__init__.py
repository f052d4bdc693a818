"""``polydev serve``: an OpenAI-compatible HTTP server over many sequences of one model
(continuous batching, ``polydev.models.engine``). Needs the ``serve`` extra
(``pip install 'polydev[serve]'``: Starlette and uvicorn).

``create_app(worker, model_name=...)`` is the ASGI application; ``ModelWorker`` the thread
that loads the model and runs its steps.
"""

from .app import create_app
from .worker import ModelWorker

__all__ = ["create_app", "ModelWorker"]
