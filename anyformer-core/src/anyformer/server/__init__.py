"""``anyformer serve``: an OpenAI-compatible HTTP server with a chat page, for every installed backend.

Needs the ``serve`` extra (``pip install 'anyformer[serve]'``: Starlette and uvicorn). Nothing here
is imported by ``import anyformer``.
"""

from anyformer.server._app import create_app
from anyformer.server._pool import Generation, ModelPool, load_supports_isolation
from anyformer.server._run import serve

__all__ = ["Generation", "ModelPool", "create_app", "load_supports_isolation", "serve"]
