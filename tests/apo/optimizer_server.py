"""A scripted OpenAI-compatible chat server: the test double for APO's optimizer LLM (a vendor API).

No capable optimizer model runs on this CPU machine, so tests (and the tutorial's CPU smoke run) talk
to this real HTTP server instead: it speaks ``POST /v1/chat/completions`` and ``GET /v1/models``,
answers requests for the critique model with the scripted critiques and requests for the edit model
with the scripted edits (each list in order, cycling), and records every request it got so tests can
check what APO sent (the parent template, the rollout transcripts). Everything else about APO is real.

Run standalone: ``python -m tests.apo.optimizer_server --port 8799 --script tutorials/rooms/scripted.json``
(``{"critique_model": ..., "edit_model": ..., "critiques": [...], "edits": [...]}``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from spanlab.threaded_server import ThreadedServer

logger = logging.getLogger(__name__)


class ScriptedOptimizerServer(ThreadedServer):
    def __init__(self, *, critiques: list[str], edits: list[str], critique_model: str = "critic",
                 edit_model: str = "editor", host: str = "127.0.0.1", port: int = 0) -> None:
        self.critique_model, self.edit_model = critique_model, edit_model
        self._answers = {critique_model: itertools.cycle(critiques), edit_model: itertools.cycle(edits)}
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"]),
                                Route("/v1/models", self._models, methods=["GET"])])
        super().__init__(app, host=host, port=port, name="scripted-optimizer")

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    async def _models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": m, "object": "model"} for m in self._answers]})

    async def _chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        model = body.get("model")
        with self._lock:
            self.requests.append(body)
            answers = self._answers.get(model)
            text = next(answers) if answers is not None else None
        if text is None:
            return JSONResponse({"error": {"message": f"model {model!r} not found", "type": "not_found"}},
                                status_code=404)
        prompt_chars = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
        return JSONResponse({
            "id": f"chatcmpl-scripted-{len(self.requests)}", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": prompt_chars // 4, "completion_tokens": len(text) // 4,
                      "total_tokens": prompt_chars // 4 + len(text) // 4},
        })

    def requests_for(self, model: str) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.requests if r.get("model") == model]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8799)
    parser.add_argument("--script", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    script = json.loads(args.script.read_text())
    server = ScriptedOptimizerServer(critiques=script["critiques"], edits=script["edits"],
                                     critique_model=script.get("critique_model", "critic"),
                                     edit_model=script.get("edit_model", "editor"), port=args.port)
    with server:
        logger.info("scripted optimizer on %s (models %s, %s)", server.base_url, server.critique_model,
                    server.edit_model)
        threading.Event().wait()


if __name__ == "__main__":
    main()
