"""TITO mode of the gateway: an attempt's chat calls served from one token buffer, so spans hold the sampled IDs.

:mod:`.mode` picks the path and serves each call (:class:`TitoMode`); :mod:`.sessions` keeps the buffers;
:mod:`.engine_path` and :mod:`.stream` serve calls on vLLM's render / generate / derender (:mod:`.primitives`),
unary and streamed; :mod:`.protocol` is the fallback path's chat <-> completions mapping and where every TITO
call is recorded and answered. See docs/tito.md.
"""

from spanlab.gateway.tito.mode import TitoMode

__all__ = ["TitoMode"]
