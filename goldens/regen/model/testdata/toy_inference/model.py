"""Toy stand-in for inference/model.py (see README.md); arbitrary arithmetic, real interfaces."""
from dataclasses import dataclass, field

import torch
from torch import nn

from kernel import act_quant, fp8_gemm, hc_split_sinkhorn, sparse_attn


@dataclass
class ModelArgs:
    max_batch_size: int = 1
    max_seq_len: int = 32
    vocab_size: int = 64
    dim: int = 32
    n_layers: int = 3
    hc_mult: int = 4
    window_size: int = 4
    index_topk: int = 2
    compress_ratios: list = field(default_factory=lambda: [0, 2, 2])
    kv_source_layers: list = field(default_factory=lambda: [1, 2])
    index_source_layers: list = field(default_factory=lambda: [1, 2])
    n_routed_experts: int = 4
    n_activated_experts: int = 2
    engram_layer_ids: list = field(default_factory=lambda: [0])
    engram_max_ngram_size: int = 3
    engram_n_heads: int = 2


class Shared:
    index_k = None
    topk = None
    ckv = None


shared_attn = Shared()


class Linear8(nn.Module):
    def __init__(self, n, k):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n, k, dtype=torch.float8_e4m3fn), requires_grad=False)
        self.scale = nn.Parameter(torch.ones((n + 31) // 32, k // 32), requires_grad=False)

    def forward(self, x):
        q, s = act_quant(x.contiguous(), 32)
        return fp8_gemm(q, s, self.weight, self.scale)


class Indexer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.wk = nn.Linear(a.dim, a.dim, bias=False)
        self.register_buffer("k_cache", torch.zeros(a.max_seq_len, a.dim), persistent=False)

    def forward(self, x, start_pos, owner, emits, topk):
        end = (start_pos + x.shape[1]) // 2
        if end == 0:
            return torch.zeros(x.shape[1], 0, dtype=torch.long)
        if owner and emits:
            self.k_cache[end - 1] = self.wk(x[0, -1]).float()
            shared_attn.index_k = self.k_cache
        keys = shared_attn.index_k[:end].float()
        scores = (x[0].float() @ keys.T)
        scores[:, :] = scores.round()          # plenty of ties
        return scores.topk(min(topk, end), dim=-1).indices


class Attention(nn.Module):
    def __init__(self, a, layer_id):
        super().__init__()
        self.a, self.layer_id = a, layer_id
        self.ratio = a.compress_ratios[layer_id]
        self.wkv = Linear8(a.dim, a.dim)
        self.attn_sink = nn.Parameter(torch.zeros(1), requires_grad=False)
        self.register_buffer("ring", torch.zeros(1, a.window_size, a.dim), persistent=False)
        self.register_buffer("ccache", torch.zeros(1, a.max_seq_len, a.dim), persistent=False)
        self.indexer = Indexer(a) if layer_id in a.index_source_layers else None

    def forward(self, x, start_pos):
        a, s = self.a, x.shape[1]
        kv = self.wkv(x)
        w = a.window_size
        if start_pos == 0:
            win = kv
            idx = torch.tensor([[j if max(0, p - w + 1) <= j <= p else -1 for j in range(min(s, w))] for p in range(s)])
            offset = s
        else:
            self.ring[:, start_pos % w] = kv[:, 0]
            win = self.ring.to(kv.dtype)
            order = [(start_pos % w + 1 + i) % w for i in range(w)]
            idx = torch.tensor([[j if j <= start_pos else -1 for j in order]])
            offset = w
        for p in range(start_pos, start_pos + s):
            self.ring[:, p % w] = kv[:, p - start_pos]
        if self.ratio:
            end = (start_pos + s) // 2
            emits = end > start_pos // 2  # a group completed in this forward
            if self.layer_id in a.kv_source_layers and emits:
                self.ccache[:, end - 1] = kv[:, -1]
            if self.indexer is not None:
                sel = self.indexer(x, start_pos, self.layer_id in a.kv_source_layers, emits, a.index_topk)
                shared_attn.topk = sel if sel.shape[0] == s else sel[-1:].expand(s, -1)
            comp = shared_attn.topk + offset
            idx = torch.cat([idx, comp], dim=-1)
            kv_all = torch.cat([win, self.ccache[:, :end].to(win.dtype)], dim=1)
        else:
            kv_all = win
        q = x.unsqueeze(2)
        return sparse_attn(q, kv_all, self.attn_sink.float(), idx.unsqueeze(0).int(), 0.5)[:, :, 0]


class Gate(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(a.n_routed_experts, a.dim))
        self.k = a.n_activated_experts

    def forward(self, x):
        scores = (x.float() @ self.weight.float().T).round()
        idx = torch.topk(scores, self.k, dim=-1)[1]
        return scores.gather(-1, idx).softmax(-1), idx


class MoE(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.gate = Gate(a)
        self.experts = nn.Parameter(torch.zeros(a.n_routed_experts, a.dim))

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        w, idx = self.gate(x)
        y = (w.unsqueeze(-1) * self.experts[idx].float()).sum(1) + x.float()
        return y.to(x.dtype).reshape(shape)


class Engram(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.cols = (a.engram_max_ngram_size - 1) * a.engram_n_heads
        self.table = nn.Embedding(97, a.dim)

    def ids(self, input_ids, start_pos):
        pos = torch.arange(start_pos, start_pos + input_ids.shape[1])
        return ((input_ids.unsqueeze(-1) * 7 + pos.view(1, -1, 1) * 3 + torch.arange(self.cols)) % 97)

    def forward(self, x, hash_ids):
        return x + self.table(hash_ids).sum(2, keepdim=True).to(x.dtype)


class Block(nn.Module):
    def __init__(self, a, layer_id):
        super().__init__()
        self.attn = Attention(a, layer_id)
        self.ffn = MoE(a)
        self.hc_fn = nn.Parameter(torch.zeros(24, a.dim * 4, dtype=torch.float32))
        self.hc_scale = nn.Parameter(torch.ones(3, dtype=torch.float32))
        self.hc_base = nn.Parameter(torch.zeros(24, dtype=torch.float32))
        self.engram = Engram(a) if layer_id in a.engram_layer_ids else None

    def forward(self, x, pre, start_pos, hash_ids):
        if self.engram is not None:
            x = self.engram(x, hash_ids)
        mixes = x.flatten(2).float() @ self.hc_fn.T
        new_pre, post, comb = hc_split_sinkhorn(mixes, self.hc_scale, self.hc_base)
        u = (pre.unsqueeze(-1) * x).sum(2).to(x.dtype)
        a = self.attn(u, start_pos)
        y = x + post.unsqueeze(-1).to(x.dtype) * a.unsqueeze(2)
        f = self.ffn((new_pre.unsqueeze(-1) * y).sum(2).to(x.dtype))
        return (y + f.unsqueeze(2)).to(x.dtype), new_pre


class Transformer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        self.embed = nn.Embedding(a.vocab_size, a.dim)
        self.layers = nn.ModuleList(Block(a, l) for l in range(a.n_layers))
        self.head = nn.Linear(a.dim, a.vocab_size, bias=False)

    @torch.inference_mode()
    def forward(self, input_ids, start_pos=0):
        x = self.embed(input_ids).unsqueeze(2).expand(-1, -1, self.a.hc_mult, -1).contiguous()
        pre = torch.tensor([1.0, 0, 0, 0]).expand(x.shape[0], x.shape[1], 4)
        for block in self.layers:
            ids = block.engram.ids(input_ids, start_pos) if block.engram is not None else None
            x, pre = block(x, pre, start_pos, ids)
        return self.head((pre.unsqueeze(-1) * x).sum(2)[:, -1].to(x.dtype)).float()
