"""A separate value model (critic) for GAE, with its own weights and optimizer.

``critics.<name>: {model, optim}`` in config, and ``policies.X.critic: <name>`` for each policy it
serves: one critic per policy, or one shared by several (they must share its tokenizer, since
the calls' token ids are scored as they are). Unlike the default value head on the policy's own
trunk, the critic's loss never moves a policy's weights.

Values come from the model's last hidden state at the positions that predict each completion
token, through a zero-initialised linear head (the same convention as the value head). After a
policy's update, its calls (with the returns GAE computed) train the critic once over
micro-batches, with the clipped value loss; metrics are reported per policy.
"""

from __future__ import annotations

import torch
from torch import nn

from masrl.algorithms.losses import value_loss


class Critic:
    def __init__(self, name: str, model_name: str, optim, *, device: str = "cpu", seed: int = 0):
        from masrl.models import load_model

        model, tok = load_model(model_name, seed=seed, device=device)
        self.name, self.model_name, self.device = name, model_name, device
        self.tokenizer = tok
        self.body = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        hidden = model.config.hidden_size
        self.head = nn.Linear(hidden, 1).to(device)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.params = list(self.body.parameters()) + list(self.head.parameters())
        self.opt = torch.optim.AdamW(self.params, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                                     weight_decay=optim.weight_decay)
        self.grad_clip = optim.grad_clip
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0

    def _values(self, samples) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, T]`` values at the completion positions, and their mask."""
        seqs = [list(s.prompt_ids) + list(s.completion_ids) for s in samples]
        L, T = max(map(len, seqs)), max(len(s.completion_ids) for s in samples)
        ids = torch.full((len(seqs), L), self.pad_id, dtype=torch.long)
        att = torch.zeros((len(seqs), L), dtype=torch.long)
        for i, q in enumerate(seqs):
            ids[i, : len(q)] = torch.tensor(q)
            att[i, : len(q)] = 1
        h = self.body(input_ids=ids.to(self.device), attention_mask=att.to(self.device)).last_hidden_state
        v = self.head(h.float()).squeeze(-1)
        out = torch.zeros((len(seqs), T), device=self.device)
        mask = torch.zeros((len(seqs), T), device=self.device)
        for i, s in enumerate(samples):
            start, n = len(s.prompt_ids) - 1, len(s.completion_ids)
            out[i, :n] = v[i, start:start + n]
            mask[i, :n] = 1.0
        return out, mask

    @torch.no_grad()
    def values(self, samples, micro_batch_size: int = 8) -> list[list[float]]:
        self.body.eval()
        out = []
        for i in range(0, len(samples), micro_batch_size):
            mb = samples[i:i + micro_batch_size]
            v, _ = self._values(mb)
            out += [v[j, : len(s.completion_ids)].tolist() for j, s in enumerate(mb)]
        return out

    def fit(self, samples, micro_batch_size: int = 8, clip: float | None = 0.2) -> dict[str, float]:
        """One optimizer step on the value loss over ``samples`` (their ``old_values`` and ``returns``)."""
        self.body.train()
        self.opt.zero_grad(set_to_none=True)
        n_tok = float(sum(len(s.completion_ids) for s in samples))
        total = 0.0
        for i in range(0, len(samples), micro_batch_size):
            mb = samples[i:i + micro_batch_size]
            v, m = self._values(mb)
            T = v.shape[1]
            old = torch.tensor([list(s.old_values) + [0.0] * (T - len(s.old_values)) for s in mb], device=self.device)
            ret = torch.tensor([list(s.returns) + [0.0] * (T - len(s.returns)) for s in mb], device=self.device)
            loss = (value_loss(v, old, ret, clip=clip) * m).sum() / n_tok
            loss.backward()
            total += float(loss.detach())
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip))
        self.opt.step()
        self.body.eval()
        return {"critic_value_loss": total, "critic_grad_norm": norm}

    def state_dict(self) -> dict:
        return {"body": {k: v.cpu() for k, v in self.body.state_dict().items()}, "head": self.head.state_dict(),
                "opt": self.opt.state_dict()}

    def load_state_dict(self, state: dict, with_optimizer: bool = True) -> None:
        self.body.load_state_dict(state["body"])
        self.head.load_state_dict(state["head"])
        if with_optimizer:
            self.opt.load_state_dict(state["opt"])
