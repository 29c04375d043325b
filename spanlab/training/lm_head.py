"""Log-probabilities of target tokens through the LM head, a chunk of positions at a time.

Why: ``[N, vocab]`` logits are the largest tensors of an update (49k vocab: 200 kB per position in fp32), and
autograd through ``cross_entropy`` keeps a softmax of that size for the backward. Here the forward keeps only
each position's log-normalizer; the backward recomputes a chunk's logits, turns them into their gradient in
place and adds that chunk's share to the hidden states' and the head's gradients (as TRL's fused LM-head kernel
does on a GPU). The price is one more ``[chunk, hidden] x [hidden, vocab]`` product per chunk in the backward.
Under autocast the products run in the autocast dtype, as ``nn.Linear`` would; gradients add up in fp32.
"""

from __future__ import annotations

import torch

__all__ = ["CHUNK_ELEMENTS", "target_logprobs"]

CHUNK_ELEMENTS = 1 << 24  # logits per chunk: 64 MB in fp32


class _TargetLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,  # type: ignore[override]
                targets: torch.Tensor, temperature: float, chunk: int) -> torch.Tensor:
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        w = weight.to(dtype)
        log_z = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        out = torch.empty_like(log_z)
        for s in range(0, hidden.shape[0], chunk):
            z = _logits(hidden[s:s + chunk].to(dtype), w, bias, temperature)
            log_z[s:s + chunk] = torch.logsumexp(z, dim=1)
            out[s:s + chunk] = z.gather(1, targets[s:s + chunk, None]).squeeze(1) - log_z[s:s + chunk]
        ctx.save_for_backward(hidden, weight, bias, targets, log_z)
        ctx.dtype, ctx.temperature, ctx.chunk = dtype, temperature, chunk
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        hidden, weight, bias, targets, log_z = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        w = weight.to(ctx.dtype)
        grad_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_bias else None
        grad_out = grad_out.float()
        for s in range(0, hidden.shape[0], ctx.chunk):
            h = hidden[s:s + ctx.chunk].to(ctx.dtype)
            g_n = grad_out[s:s + ctx.chunk]
            # d logp / d z = (onehot(target) - softmax(z)) / temperature, times the incoming gradient
            grad_z = _logits(h, w, bias, ctx.temperature).sub_(log_z[s:s + ctx.chunk, None]).exp_().mul_(-g_n[:, None])
            grad_z.scatter_add_(1, targets[s:s + ctx.chunk, None], g_n[:, None])
            if ctx.temperature != 1.0:
                grad_z.div_(ctx.temperature)
            if grad_bias is not None:
                grad_bias += grad_z.sum(0)
            grad_z = grad_z.to(ctx.dtype)
            if grad_hidden is not None:
                grad_hidden[s:s + ctx.chunk] = grad_z @ w
            if grad_weight is not None and ctx.dtype == torch.float32:
                grad_weight.addmm_(grad_z.t(), h)
            elif grad_weight is not None:
                grad_weight += (grad_z.t() @ h).float()
        return (grad_hidden.to(hidden.dtype) if grad_hidden is not None else None,
                grad_weight.to(weight.dtype) if grad_weight is not None else None,
                grad_bias.to(bias.dtype) if grad_bias is not None else None, None, None, None)


def _logits(h: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, temperature: float) -> torch.Tensor:
    z = h @ w.t()
    if bias is not None:
        z = z + bias.to(z.dtype)
    z = z.float()
    return z / temperature if temperature != 1.0 else z


def target_logprobs(hidden_N_H: torch.Tensor, head: torch.nn.Module, targets_N: torch.Tensor, *,
                    temperature: float = 1.0, chunk_elements: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """``[N]`` log softmax(head(hidden) / temperature)[target], differentiable, never all ``[N, vocab]`` at once."""
    weight, bias = head.weight, getattr(head, "bias", None)
    chunk = max(1, chunk_elements // weight.shape[0])
    return _TargetLogprobs.apply(hidden_N_H, weight, bias, targets_N.long(), temperature, chunk)
