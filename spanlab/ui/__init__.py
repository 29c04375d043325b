"""A local, read-only web UI over a span store: rollouts, calls, token view, training curves, SQL box.

Run: ``spanlab ui [--db PATH] [--port 8600]``; see docs/ui.md.
"""

from spanlab.ui.app import create_app, serve_ui

__all__ = ["create_app", "serve_ui"]
