"""OpenAI-compatible HTTP API in front of a Triton deployment (chat, completions, models, health, metrics).

Library entry points: `create_app(ApiSettings(...))` for the ASGI app, `run_api` to serve in the
foreground, `run_api_in_background` to serve on a thread of the calling process (tests, embedding).
`toolkit serve --openai-port` runs `python -m toolkit.api` as a process of its own instead.
"""

from toolkit.api.app import ApiSettings, create_app
from toolkit.api.server import ApiServerHandle, run_api, run_api_in_background

__all__ = ["ApiSettings", "ApiServerHandle", "create_app", "run_api", "run_api_in_background"]
