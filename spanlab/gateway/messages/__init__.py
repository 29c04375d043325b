"""``POST /v1/messages``: the Anthropic Messages API served as chat calls, recorded like them.

:mod:`.route` is the handler, :mod:`.protocol` the request translation and its refusals, :mod:`.reply` the
answer and error shapes, :mod:`.stream` the chat chunks -> Messages events translation of a streamed call.
"""

from spanlab.gateway.messages.route import MessagesRoute

__all__ = ["MessagesRoute"]
