"""Adapters: stored spans -> what an algorithm trains or reflects on (no algorithm lives here).

Each name has one module to import it from: ``samples`` (:class:`Sample`, padded batches), ``sample_reader``
(spans -> samples on the exact token IDs), ``filtered_dataset`` (the reward filter and SFT's dataset), ``credit``
(the reward each turn trains on), ``messages`` (conversations for APO's critiques), ``demonstrations`` and
``role_demos`` (warm-start demonstrations as spans and samples), ``retokenize``, ``trainable``, ``conversation``,
``recorded_calls`` and ``recorded_rollouts`` (what the store holds of a call or of a rollout). The package itself
imports nothing, so importing one adapter module (``messages``, which APO uses) never imports torch through the
others. Not to be confused with a LoRA adapter (:mod:`spanlab.policies`); docs/glossary.md has both.
"""
