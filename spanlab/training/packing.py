"""Rows of token IDs packed into one row, each shared prefix once: a radix tree laid out flat, no padding.

Why: a padded ``[B, T]`` batch runs the decoder on padding, and GRPO rows repeat themselves: the samples of
one task share its prompt, an agent's calls share the system prompt and tools, a later call of a rollout
starts with the whole of an earlier one. Here every distinct prefix is a node of a radix tree over the rows
and each node's tokens are run once. A node's tokens attend to their ancestors' tokens and causally to
themselves, at the positions they have in the rows, so every row's hidden states are exactly those of the
row run on its own, and backprop sums each row's gradient into the shared computation as it would into
copies of it.

The attention is one ``scaled_dot_product_attention`` call per node, registered with transformers as the
attention implementation ``spanlab_packed`` and switched on only around the decoder call
(:func:`packed_attention`). Left out: sliding-window attention, attention-logit soft-capping and attention
sinks (:func:`can_pack` says no and the caller keeps the padded path).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ATTENTION_NAME", "PackedRows", "can_pack", "pack_rows", "packed_attention", "packed_micro_batches",
           "packed_size"]

ATTENTION_NAME = "spanlab_packed"
MIN_SHARED_TOKENS = 16  # fewer tokens saved are cheaper to repeat than to give an attention call of their own


@dataclass(frozen=True)
class _Node:
    start: int  # [start, end) in the packed row
    end: int
    keys: torch.Tensor | None  # packed positions of its ancestors' tokens then its own; None: its own only
    mask: torch.Tensor | None  # bool [end - start, len(keys)]: ancestors all, itself causally


@dataclass(frozen=True)
class PackedRows:
    """``B`` rows as one packed row of ``P`` tokens; ``index_B_T`` maps each row's token to its packed position."""

    input_ids: torch.Tensor  # long [P]
    position_ids: torch.Tensor  # long [P]: the position the token has in its rows
    index_B_T: torch.Tensor  # long [B, T]; 0 past a row's end
    nodes: tuple[_Node, ...]

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device) -> PackedRows:
        """The same layout on ``device``, so the attention does not copy its indices there once per layer."""
        if device.type == "cpu":
            return self
        nodes = tuple(_Node(n.start, n.end, None if n.keys is None else n.keys.to(device),
                            None if n.mask is None else n.mask.to(device)) for n in self.nodes)
        return PackedRows(self.input_ids.to(device), self.position_ids.to(device), self.index_B_T.to(device), nodes)


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def pack_rows(rows: Sequence[np.ndarray], width: int, *, share: bool = True,
              min_shared: int = MIN_SHARED_TOKENS) -> PackedRows:
    """Pack ``rows`` (1-D token IDs, each non-empty) into one row; ``width`` is the ``T`` of ``index_B_T``.

    ``share``: run a prefix common to several rows once when that saves at least ``min_shared`` tokens (a row
    that is a prefix of another, or equal to it, is always shared whole). Without it, rows are laid end to end.
    """
    if any(len(r) == 0 for r in rows):
        raise ValueError("pack_rows: every row needs at least one token")
    spans: list[tuple[int, int, int, int]] = []  # (parent node or -1, first depth, end depth, row it copies)
    end_node = [0] * len(rows)
    if share:
        order = sorted(range(len(rows)), key=lambda i: rows[i].tolist())
        stack: list[tuple[list[int], int, int]] = [(order, 0, -1)]  # (sorted rows sharing [0:start], start, parent)
        while stack:
            idxs, start, parent = stack.pop()
            common = _lcp(rows[idxs[0]], rows[idxs[-1]])
            ends = any(len(rows[i]) == common for i in idxs)  # a row that ends there: its tokens are needed once anyway
            if len(idxs) == 1 or ends or (len(idxs) - 1) * (common - start) >= min_shared:
                spans.append((parent, start, common, idxs[0]))
                parent, start = len(spans) - 1, common
                for i in idxs:
                    if len(rows[i]) == common:
                        end_node[i] = parent
                idxs = [i for i in idxs if len(rows[i]) > common]
            groups: list[list[int]] = []
            for i in idxs:  # runs of the sorted rows by their token at `common` (-1: the row ends there)
                key = int(rows[i][common]) if len(rows[i]) > common else -1
                if groups and (int(rows[groups[-1][0]][common]) if len(rows[groups[-1][0]]) > common else -1) == key:
                    groups[-1].append(i)
                else:
                    groups.append([i])
            stack.extend((g, start, parent) for g in reversed(groups))
    else:
        for i, r in enumerate(rows):
            spans.append((-1, 0, len(r), i))
            end_node[i] = i
    return _layout(rows, spans, end_node, width)


def _layout(rows: Sequence[np.ndarray], spans: list[tuple[int, int, int, int]], end_node: list[int],
            width: int) -> PackedRows:
    """Nodes in creation (depth-first) order, end to end; each node's keys are its ancestors' tokens then its own."""
    offsets = np.cumsum([0] + [e - s for _, s, e, _ in spans])
    ids = np.concatenate([rows[r][s:e] for _, s, e, r in spans]).astype(np.int64)
    pos = np.concatenate([np.arange(s, e) for _, s, e, _ in spans]).astype(np.int64)
    paths: list[list[int]] = []  # the nodes from the root to each node
    nodes = []
    for k, (parent, *_) in enumerate(spans):
        paths.append((paths[parent] if parent >= 0 else []) + [k])
        start, end = int(offsets[k]), int(offsets[k + 1])
        if parent < 0:
            nodes.append(_Node(start, end, None, None))
            continue
        keys = torch.from_numpy(np.concatenate([np.arange(offsets[a], offsets[a + 1]) for a in paths[k]]))
        n_anc = len(keys) - (end - start)
        mask = torch.ones(end - start, len(keys), dtype=torch.bool).tril(diagonal=n_anc)
        nodes.append(_Node(start, end, keys, mask))
    index = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        index[i, :len(r)] = np.concatenate([np.arange(offsets[a], offsets[a + 1]) for a in paths[end_node[i]]])
    return PackedRows(torch.from_numpy(ids), torch.from_numpy(pos), torch.from_numpy(index), tuple(nodes))


def packed_size(rows: Sequence[np.ndarray]) -> int:
    """Tokens of ``rows`` packed with sharing, for rows in sorted order (at most; short prefixes are repeated)."""
    return sum(len(r) - (_lcp(rows[k - 1], r) if k else 0) for k, r in enumerate(rows))


def packed_micro_batches(rows: Sequence[np.ndarray], max_tokens: int) -> Iterator[list[int]]:
    """Indices of ``rows`` in sorted token order (rows that share a prefix side by side), in consecutive chunks
    of at most ``max_tokens`` packed tokens each; a row over the budget gets a chunk of its own.

    A chunk over the budget is cut where its neighbours share the least, so a group's rows stay together.
    """
    if max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    order = sorted(range(len(rows)), key=lambda i: rows[i].tolist())
    chunk: list[int] = []
    shared: list[int] = []  # shared[k]: tokens chunk[k] shares with chunk[k - 1] (0 for the first)
    for i in order:
        shared.append(_lcp(rows[chunk[-1]], rows[i]) if chunk else 0)
        chunk.append(i)
        while len(chunk) > 1 and sum(len(rows[k]) for k in chunk) - sum(shared) > max_tokens:
            cut = min(range(1, len(chunk)), key=lambda k: (shared[k], -k))  # the weakest link, the latest of equals
            yield chunk[:cut]
            chunk, shared = chunk[cut:], [0, *shared[cut + 1:]]
    if chunk:
        yield chunk


def can_pack(model: nn.Module) -> bool:
    """Whether :func:`packed_attention` computes this model's attention exactly (plain causal softmax attention)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        return False
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return False
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return False
    return not getattr(config, "layer_types", None) or set(config.layer_types) <= {"full_attention"}


def packed_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     *, spanlab_packed: PackedRows, **kwargs: object) -> tuple[torch.Tensor, None]:
    """transformers' attention interface over a packed row: ``[1, heads, P, dim]`` in, ``[1, P, heads, dim]`` out."""
    if kwargs.get("sliding_window") is not None or kwargs.get("s_aux") is not None:
        raise ValueError("packed attention supports neither sliding windows nor attention sinks")
    if key.shape[1] != query.shape[1]:  # grouped-query attention: repeat the key/value heads
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        value = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)
    outs = []
    for node in spanlab_packed.nodes:
        q = query[:, :, node.start:node.end]
        if node.keys is None:
            k, v = key[:, :, node.start:node.end], value[:, :, node.start:node.end]
            o = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scaling)
        else:
            k, v = key.index_select(2, node.keys), value.index_select(2, node.keys)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=node.mask, dropout_p=dropout, scale=scaling)
        outs.append(o)
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def _no_mask(*args: object, **kwargs: object) -> None:
    """The mask transformers would build: none, :func:`packed_attention` knows the layout."""
    return None


@contextlib.contextmanager
def packed_attention_on(model: nn.Module) -> Iterator[None]:
    """``model``'s attention is :func:`packed_attention` inside the block, its own implementation again after."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(ATTENTION_NAME, packed_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, _no_mask)
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = previous
