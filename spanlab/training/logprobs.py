"""Per-token log-probabilities of a causal LM, computed only where the loss needs them.

Why: the vocabulary is 49k and prompts are long while responses are short, so full ``[B, T, V]`` logits
cost far more memory (and time in the LM head) than the logits of the N positions that are trained on. The
decoder runs on every distinct token once: the rows are packed into one row without padding, each prefix
that several rows share run once (:mod:`spanlab.training.packing`); the LM head and log-softmax run only on
the selected positions, a chunk at a time (:mod:`spanlab.training.lm_head`), and once per distinct
(position, target) pair.

Models the packed attention cannot compute exactly (sliding windows, attention soft-capping) and rows with
holes in their attention mask take the padded path: the decoder on ``[B, T]``, a prefix that all rows share
run once through the KV cache.

A model sharded with FSDP2 is wrapped in :class:`TokenLogprobs`, whose ``forward`` is this computation:
FSDP gathers the parameters outside the decoder layers (embeddings, final norm, LM head) in its root
module's forward hook, which the direct calls to the decoder and the head would skip. Every call of a
sharded layer is a collective, so all ranks must call the decoder as often: the packed path calls it once
per forward; on the padded path ranks agree on one prefix length per forward (the shortest any rank's rows
share; none when one rank has no shared prefix).

Left out: models that post-process logits (Gemma's soft-capping, Cohere's logit scale) are refused
rather than silently computed wrong.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from spanlab.errors import ConfigError
from spanlab.training.lm_head import target_logprobs
from spanlab.training.packing import PackedRows, can_pack, pack_rows, packed_attention_on

__all__ = ["TokenLogprobs", "shared_prefix_len", "token_logprobs"]

_LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale")


def shared_prefix_len(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """Length of the token prefix every row shares (and attends to), short of the shortest row by one.

    At least one token of each row stays outside the prefix so every row has a suffix to run.
    """
    if input_ids.shape[0] < 2:
        return 0
    same_T = (input_ids == input_ids[:1]).all(0) & attention_mask.bool().all(0)
    limit = int(attention_mask.sum(1).min()) - 1
    diff = (~same_T[:limit]).nonzero()
    return int(diff[0]) if len(diff) else max(limit, 0)


def _hidden_states(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   share_prefix: bool, agree: Callable[[int], int] | None = None) -> torch.Tensor:
    """``[B, T, H]`` last hidden states; a prefix shared by all rows is run once, not once per row.

    Exact, gradient included: the prefix's keys/values are computed once (with grad when enabled) and
    broadcast to every row, so backprop sums each row's gradient into that one computation, as it would
    into B identical ones. Agent prompts share long system + tools prefixes (~230 of ~330 tokens for the
    calc agent), so this cuts the trainer's work about 3x there. ``agree`` turns this rank's prefix length
    into the one all ranks use (a shorter prefix is still shared).
    """
    decoder = model.get_decoder()
    P = shared_prefix_len(input_ids, attention_mask) if share_prefix else 0
    if agree is not None:
        P = agree(P)
    if P < 16:  # not worth a second forward call
        return decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    B = input_ids.shape[0]
    prefix = decoder(input_ids=input_ids[:1, :P], use_cache=True)
    cache = prefix.past_key_values
    cache.batch_repeat_interleave(B)
    suffix_B_S_H = decoder(input_ids=input_ids[:, P:], attention_mask=attention_mask, past_key_values=cache,
                           use_cache=True).last_hidden_state
    return torch.cat([prefix.last_hidden_state.expand(B, -1, -1), suffix_B_S_H], dim=1)


class TokenLogprobs(nn.Module):
    """A causal LM ``lm`` whose forward is :func:`token_logprobs`: the module a wrapper such as FSDP2's
    ``fully_shard`` hooks, so every parameter the computation touches is gathered first."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions_mask: torch.Tensor | None,
                temperature: float, share_prefix: bool) -> torch.Tensor:
        return _token_logprobs(self.lm, input_ids, attention_mask, positions_mask, temperature, share_prefix,
                               agree=_shortest_over_ranks)


def _shortest_over_ranks(prefix_len: int) -> int:
    shortest = torch.tensor([prefix_len])
    dist.all_reduce(shortest, op=dist.ReduceOp.MIN)
    return int(shortest)


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    positions_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    share_prefix: bool = True,
) -> torch.Tensor:
    """``[B, T]`` log p(token_t | tokens_<t) at the positions in ``positions_mask`` (all when None), else 0.

    Position 0 and padding (``attention_mask`` 0) are always 0. Differentiable when grad is enabled.
    ``temperature`` divides the logits as the engine did when it sampled. ``share_prefix`` runs a
    prefix common to all rows once (exact; see :func:`_hidden_states`). ``model`` may be a
    :class:`TokenLogprobs` (a sharded model): the call then goes through its forward.
    """
    if isinstance(model, TokenLogprobs):
        return model(input_ids, attention_mask, positions_mask, temperature, share_prefix)
    return _token_logprobs(model, input_ids, attention_mask, positions_mask, temperature, share_prefix)


def _token_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    positions_mask: torch.Tensor | None, temperature: float, share_prefix: bool,
                    agree: Callable[[int], int] | None = None) -> torch.Tensor:
    config = getattr(model, "config", None)
    for name in _LOGIT_POSTPROCESSING:
        if getattr(config, name, None) not in (None, 1.0):
            raise ConfigError(f"token_logprobs: models with {name} are not supported")
    need_B_T = attention_mask.bool() if positions_mask is None else positions_mask.bool() & attention_mask.bool()
    need_B_T = need_B_T.clone()
    need_B_T[:, 0] = False
    rows_N, cols_N = need_B_T.nonzero(as_tuple=True)
    lengths_B = attention_mask.bool().sum(1)
    right_padded = bool((attention_mask.bool() == (torch.arange(input_ids.shape[1], device=input_ids.device)
                                                   < lengths_B[:, None])).all())
    if can_pack(model) and right_padded and bool((lengths_B > 0).all()):
        ids = input_ids.cpu().numpy()
        packed = pack_rows([ids[b, :n] for b, n in enumerate(lengths_B.tolist())], input_ids.shape[1],
                           share=share_prefix).to(input_ids.device)
        hidden_P_H = _packed_hidden_states(model, packed)
        source_N = packed.index_B_T[rows_N, cols_N - 1]
    else:
        hidden_P_H = _hidden_states(model, input_ids, attention_mask, share_prefix, agree).flatten(0, 1)
        source_N = rows_N * input_ids.shape[1] + cols_N - 1
    targets_N = input_ids[rows_N, cols_N]
    # a position whose hidden state and target two rows share (a shared prefix trained in both) is computed once
    pair_N = source_N * (int(targets_N.max()) + 1 if len(targets_N) else 1) + targets_N
    pairs_U, which_N = torch.unique(pair_N, return_inverse=True)
    first_U = torch.full(pairs_U.shape, len(pair_N), dtype=torch.long, device=pair_N.device)
    first_U = first_U.scatter_reduce(0, which_N, torch.arange(len(pair_N), device=pair_N.device), reduce="amin")
    logprobs_U = target_logprobs(hidden_P_H[source_N[first_U]], model.get_output_embeddings(), targets_N[first_U],
                                 temperature=temperature)
    out_B_T = torch.zeros(input_ids.shape, dtype=logprobs_U.dtype, device=logprobs_U.device)
    return out_B_T.index_put((rows_N, cols_N), logprobs_U[which_N])


def _packed_hidden_states(model: nn.Module, packed: PackedRows) -> torch.Tensor:
    """``[P, H]`` last hidden states of the packed row: the decoder once, with the packed attention."""
    with packed_attention_on(model):
        out = model.get_decoder()(input_ids=packed.input_ids[None], position_ids=packed.position_ids[None],
                                  use_cache=False, spanlab_packed=packed)
    return out.last_hidden_state[0]
