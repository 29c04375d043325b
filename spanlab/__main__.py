"""``python -m spanlab``: the CLI, for launchers that start a module (``torchrun ... -m spanlab train cfg.yaml``)."""

from spanlab.cli import app

app(prog_name="spanlab")
