"""The server layer: the ASGI app, sessions, routes, and running it."""

from corral.server.app import create_app
from corral.server.config import ServerConfig
from corral.server.serve import serve

__all__ = ["ServerConfig", "create_app", "serve"]
