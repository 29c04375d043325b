"""The built-in algorithms, one package each: ``grpo``, ``sft`` (reward-filtered rounds) and ``apo``.

Each package imports only what it runs (APO never imports torch); the shared job machinery is
:mod:`spanlab.jobs`, the torch training parts they share are :mod:`spanlab.training`.
"""
