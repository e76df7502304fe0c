"""pi0.5 in PyTorch with an explicit, engine-owned KV cache.

Stages (what the engine schedules):
  ``prefill``      backbone over images + prompt (bidirectional prefix-LM), K/V written into cache slots
  ``denoise``      S Euler steps of the action expert reading the prefix K/V read-only -> action chunk
  ``decode_step``  one token per slot for a batch of language sequences, each with its own length/position

The uncached ``joint_forward`` (Mixture-of-Transformers attention over all streams at once, as in training) is
the reference the cached paths are tested against.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from .backends import decode_tokens, make_stages
from .config import Pi05Config
from .kv_cache import KVCache
from .layers import (
    GemmaStack,
    MultiModalProjector,
    SiglipVisionTower,
    apply_rope,
    gated_residual,
    gqa_attention,
    rope_cos_sin,
    sinusoidal_time_embedding,
)
from .observation import Observation
from .parts import HeadParts, Prefix
from .rtc import RTCGuide
from .stages import denoise_vjp

__all__ = ["HeadParts", "Pi05Model", "Prefix"]


# --------------------------------------------------------------------------------- module tree (= checkpoint keys)
class _PaliGemmaInner(nn.Module):
    def __init__(self, cfg: Pi05Config) -> None:
        super().__init__()
        self.vision_tower = SiglipVisionTower(cfg.vision)
        self.multi_modal_projector = MultiModalProjector(cfg.vision.width, cfg.backbone.width)
        self.language_model = GemmaStack(cfg.backbone, cfg.vocab_size)


class _PaliGemma(nn.Module):
    def __init__(self, cfg: Pi05Config) -> None:
        super().__init__()
        self.model = _PaliGemmaInner(cfg)
        self.lm_head = nn.Linear(cfg.backbone.width, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.language_model.embed_tokens.weight


class _GemmaExpert(nn.Module):
    def __init__(self, cfg: Pi05Config) -> None:
        super().__init__()
        self.model = GemmaStack(cfg.expert, vocab_size=None, cond_dim=cfg.expert.width)


class _PaliGemmaWithExpert(nn.Module):
    def __init__(self, cfg: Pi05Config) -> None:
        super().__init__()
        self.paligemma = _PaliGemma(cfg)
        self.gemma_expert = _GemmaExpert(cfg)


def _euler_times(num_steps: int, schedule: str) -> list[float]:
    dt = -1.0 / num_steps
    if schedule == "exact":  # LeRobot: float32(1 + k * dt), computed in float64
        return [float(torch.tensor(1.0 + k * dt, dtype=torch.float32)) for k in range(num_steps)]
    times, t, step = [], torch.tensor(1.0, dtype=torch.float32), torch.tensor(dt, dtype=torch.float32)
    for _ in range(num_steps):  # openpi: t += dt, accumulated in float32
        times.append(float(t))
        t = t + step
    return times


class Pi05Model(nn.Module):
    """pi0.5 (PaliGemma backbone + flow-matching action expert) whose KV cache is owned by the caller.

    ``stages`` (``backends.STAGES``), picked once here: ``fused`` (the default) runs the cached stages on
    ``backends/fast_path.py`` (fused projections, precomputed time conditioning); ``eager`` runs the module-by-module
    reference (``stages.py``), same math. :meth:`with_stages` gives the other runner over the same weights.
    """

    def __init__(self, config: Pi05Config, stages: str = "fused") -> None:
        super().__init__()
        self.config = config
        # precision.py's ``bfloat16_islands`` sets it: in a low-precision dtype, round where openpi's bf16 model
        # rounds (attention scores and probabilities, bf16 RoPE frequencies, un-fused products before each sum)
        self.openpi_rounding = False
        ew = config.expert.width
        self.paligemma_with_expert = _PaliGemmaWithExpert(config)
        self.action_in_proj = nn.Linear(config.action_dim, ew)
        self.action_out_proj = nn.Linear(ew, config.action_dim)
        self.time_mlp_in = nn.Linear(ew, ew)
        self.time_mlp_out = nn.Linear(ew, ew)
        self.stages = make_stages(stages)
        self.stages.prepare(self)

    def with_stages(self, stages: str) -> Pi05Model:
        """This model (the same modules and weights) running its cached stages with ``stages`` (the tests compare
        the fused stages with the eager reference)."""
        view = copy.copy(self)
        view.stages = make_stages(stages)
        view.stages.prepare(view)
        return view

    # ------------------------------------------------------------------------------------------ accessors
    @property
    def backbone(self) -> GemmaStack:
        return self.paligemma_with_expert.paligemma.model.language_model

    @property
    def expert(self) -> GemmaStack:
        return self.paligemma_with_expert.gemma_expert.model

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype (the backbone's weights and the KV cache; ``precision.py`` may keep islands float32)."""
        return self.backbone.layers[0].self_attn.q_proj.weight.dtype

    @property
    def input_dtype(self) -> torch.dtype:
        """The dtype images enter in: the patch embedding's (float32 in ``bfloat16_islands``, as in openpi)."""
        return self.paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.patch_embedding \
            .weight.dtype

    @property
    def rounded(self) -> bool:
        """Whether the stages round as openpi's bf16 model does (``openpi_rounding`` in a low-precision dtype)."""
        return self.openpi_rounding and self.dtype != torch.float32

    @property
    def rope_freq_dtype(self) -> torch.dtype:
        """The dtype RoPE's frequencies are rounded to (openpi's bf16 model casts HF's ``inv_freq`` buffer too)."""
        return self.dtype if self.openpi_rounding else torch.float32

    @property
    def device(self) -> torch.device:
        return self.action_in_proj.weight.device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ------------------------------------------------------------------------------------------ embeddings
    def embed_images(self, images: torch.Tensor) -> torch.Tensor:
        """[B, C, 3, H, W] in [-1, 1] -> [B, C * tokens_per_image, W] (not scaled, as in openpi)."""
        b, c = images.shape[:2]
        if c == 0:  # every camera masked out (and compacted away): the prefix is the prompt alone
            return images.new_zeros(b, 0, self.config.backbone.width, dtype=self.dtype)
        inner = self.paligemma_with_expert.paligemma.model
        feats = inner.multi_modal_projector(inner.vision_tower(images.flatten(0, 1).to(self.input_dtype)))
        # a float32 vision path (bfloat16_lerobot) enters the backbone rounded once, as LeRobot's PiGemmaModel does
        return feats.view(b, c * feats.shape[1], feats.shape[2]).to(self.dtype)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        emb = self.backbone.embed_tokens(tokens)
        return emb * math.sqrt(emb.shape[-1])

    def embed_prefix(self, obs: Observation) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefix embeddings [B, P, W] (image tokens then prompt tokens) and validity [B, P]."""
        img = self.embed_images(obs.images)
        n = self.config.vision.tokens_per_image
        img_valid = obs.image_masks.repeat_interleave(n, dim=1)
        embs = torch.cat([img, self.embed_tokens(obs.tokens)], dim=1)
        return embs, torch.cat([img_valid, obs.token_mask], dim=1)

    def head_parts(self) -> HeadParts:
        """The built-in action expert (openpi's) as the parts ``denoise`` runs."""
        return HeadParts(self.expert, self.action_in_proj, self.action_out_proj, self.time_mlp_in,
                         self.time_mlp_out, self.config.action_horizon)

    def embed_suffix(self, x_t: torch.Tensor, t: torch.Tensor, head: HeadParts | None = None):
        """Noisy actions [B, H, A] and time [B] -> action tokens [B, H, We] and adaRMS condition [B, We]."""
        head = head or self.head_parts()
        cond = sinusoidal_time_embedding(t, head.action_in_proj.out_features).to(head.time_mlp_in.weight.dtype)
        cond = F.silu(head.time_mlp_out(F.silu(head.time_mlp_in(cond))))
        return head.action_in_proj(x_t.to(head.action_in_proj.weight.dtype)).to(self.dtype), cond

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden states -> vocabulary logits (the LM head; tied to the token embedding by default)."""
        return F.linear(hidden, self.paligemma_with_expert.paligemma.lm_head.weight)

    def denoise_times(self, num_steps: int) -> list[float]:
        """The S flow-matching times t_0 = 1 > ... > t_{S-1}, as float32 values, per ``config.time_schedule``
        (computed once per S: the denoise loop asks every frame)."""
        cache = self.__dict__.setdefault("_denoise_times", {})
        if num_steps not in cache:
            cache[num_steps] = _euler_times(num_steps, self.config.time_schedule)
        return cache[num_steps]

    # ------------------------------------------------------------------------------------------ layer pieces
    def _qkv(self, layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Projected, rotated q [B, Hq, T, D] and k, v [B, Hkv, T, D]."""
        g = self.config.backbone
        b, t, _ = x.shape
        attn = layer.self_attn
        q = attn.q_proj(x).view(b, t, g.num_heads, g.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, t, g.num_kv_heads, g.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, g.num_kv_heads, g.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    @staticmethod
    def _attn_out_mlp(layer, h, attn, gate, cond):
        h = gated_residual(h, layer.self_attn.o_proj(attn), gate)
        x, gate = layer.post_attention_layernorm(h, cond)
        return gated_residual(h, layer.mlp(x), gate)

    def _rope(self, positions: torch.Tensor):
        g = self.config.backbone
        return rope_cos_sin(positions, g.head_dim, g.rope_theta, self.dtype, self.rope_freq_dtype)

    def compacts(self, layout: str | None = None) -> bool:
        """Whether the prefill drops masked cameras and padded prompt columns under ``layout``
        (observation.PREFILL_LAYOUTS; None: ``auto``), as the stage runner decides (the eager one never does)."""
        return self.stages.compacts(self, layout)

    # ------------------------------------------------------------------------------------------ cached stages
    @torch.no_grad()
    def prefill(self, obs: Observation, cache: KVCache, rows: slice | None = None,
                layout: str | None = None) -> Prefix:
        """Run the backbone over the prefix and write its K/V into ``cache`` slots ``rows`` (default 0..B).

        The fused stages run the last layer's attention output and MLP only at each row's last valid
        token (the one hidden state a prefix keeps), and with a compact ``layout`` (:meth:`compacts`) skips what the
        observation masks out (:meth:`Observation.compacted`); the eager reference computes every padded position,
        as openpi does. All give the same K/V at the valid positions and the same ``last_hidden`` up to the order of
        summation (bit-identical in openpi's bf16 roundings only in the padded layout)."""
        rows = rows if rows is not None else slice(0, obs.batch_size)
        if self.stages.compacts(self, layout):
            obs = obs.compacted()
        embs, valid = self.embed_prefix(obs)
        p = embs.shape[1]
        if p > cache.max_len:
            raise ValueError(f"prefix of {p} tokens does not fit the cache ({cache.max_len})")
        cache.valid[rows] = False
        cache.valid[rows, :p] = valid
        num_valid = valid.sum(1)
        last = torch.arange(p, device=valid.device).masked_fill(~valid, -1).argmax(1)
        last_hidden, _ = self.backbone.norm(self.stages.prefill(self, embs, valid, cache, rows, last))
        return Prefix(rows, p, num_valid, last_hidden)

    @torch.no_grad()
    def denoise(
        self, prefix: Prefix, cache: KVCache, noise: torch.Tensor | None = None, num_steps: int | None = None,
        head: HeadParts | None = None, guide: RTCGuide | None = None,
    ) -> torch.Tensor:
        """Flow-matching Euler sampling of an action chunk [B, H, A] (float32) from a cached prefix.

        The prefix K/V is only read; the H action tokens' K/V go to the scratch positions [P, P + H).
        ``noise`` is x_1 ~ N(0, I) [B, H, A]; t runs 1 -> 0 in ``num_steps`` steps of dt = -1/S (openpi).
        ``head`` selects another action expert reading the same prefix (default: the model's own).
        ``guide``: real-time chunking toward the previous chunk (``rtc.py``); ``vjp`` guidance runs every step through
        the reference modules under autograd, writing nothing to the cache (fused or not).
        """
        head = head or self.head_parts()
        b, h_len = prefix.num_valid.shape[0], head.horizon
        num_steps = num_steps or self.config.num_steps
        if prefix.length + h_len > cache.max_len:
            raise ValueError("cache too short for the action scratch")
        if noise is None:
            noise = torch.randn(b, h_len, head.action_in_proj.in_features, device=self.device)
        noise = noise.to(self.device)  # callers may draw it on the CPU (seeded per frame)
        if guide is not None:
            guide = guide.to(self.device)
            if guide.vjp:
                return denoise_vjp(self, prefix, cache, noise, num_steps, head, guide)
        return self.stages.denoise(self, prefix, cache, noise, num_steps, head, guide)

    @torch.no_grad()
    def decode_step(
        self,
        cache: KVCache,
        rows: slice,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        write_index: torch.Tensor,
        attn_len: int,
        lora=None,
    ) -> torch.Tensor:
        """Advance B language sequences by one token each; returns logits [B, V] (float32).

        tokens/positions/write_index are [B] per slot in ``rows``: each row writes its K/V at its own cache index
        and attends to its own valid positions in [0, attn_len). ``lora`` (optional) adapts the backbone's
        projections for these tokens only.
        """
        return self.stages.decode_step(self, cache, rows, tokens, positions, write_index, attn_len, lora)

    @torch.no_grad()
    def decode_tokens(self, cache: KVCache, rows: slice, tokens: torch.Tensor, positions: torch.Tensor,
                      write_index: torch.Tensor, attn_len: int, lora=None) -> torch.Tensor:
        """Advance B sequences by T tokens each ([B, T] inputs) in one forward; logits [B, T, V] (float32).

        Token j attends to the row's valid cache positions in [0, attn_len) and to its tokens 0..j; nothing is
        marked valid (the caller keeps what it accepts). Always the fused path (speculative verification)."""
        return decode_tokens(self, cache, rows, tokens, positions, write_index, attn_len, lora)

    # ------------------------------------------------------------------------------------------ public API
    @torch.no_grad()
    def sample_actions(
        self, obs: Observation, noise: torch.Tensor | None = None, num_steps: int | None = None,
        guide: RTCGuide | None = None,
    ) -> torch.Tensor:
        """openpi's ``sample_actions``: prefill once, denoise S steps; returns [B, H, action_dim] float32.
        ``guide``: real-time chunking toward a previous chunk (LeRobot's ``predict_action_chunk`` with RTC)."""
        cache = KVCache.for_model(self.config, obs.batch_size, dtype=self.dtype, device=self.device)
        return self.denoise(self.prefill(obs, cache), cache, noise, num_steps, guide=guide)

    @torch.no_grad()
    def generate(
        self,
        obs: Observation,
        max_new_tokens: int,
        prompts: list[list[int]] | None = None,
        eos_id: int = 1,
    ) -> list[list[int]]:
        """Greedy language decoding from the observation's prefix (the same KV the action expert reads).

        ``prompts`` are optional per-row request tokens (no BOS) fed after the prefix; with none, the first token
        comes from the last valid prefix position. Generation stops at EOS (included) or max_new_tokens.
        """
        b = obs.batch_size
        prompts = prompts or [[] for _ in range(b)]
        longest = max(len(p) for p in prompts) + max_new_tokens
        cache = KVCache.for_model(self.config, b, extra_tokens=longest, dtype=self.dtype, device=self.device)
        prefix = self.prefill(obs, cache)
        first = self.lm_logits(prefix.last_hidden).float().argmax(-1)
        outs: list[list[int]] = [[] for _ in range(b)]
        done = [False] * b
        nxt = [prompts[r][0] if prompts[r] else int(first[r]) for r in range(b)]
        for r in range(b):
            if not prompts[r]:
                outs[r].append(nxt[r])
                done[r] = nxt[r] == eos_id or max_new_tokens <= 1
        step = 0
        while not all(done):
            tokens = torch.tensor(nxt, device=self.device)
            logits = self.decode_step(
                cache, prefix.rows, tokens, prefix.num_valid + step,
                torch.full((b,), prefix.length + step, device=self.device), prefix.length + step + 1,
            )
            step += 1
            for r in range(b):
                if done[r]:
                    continue
                if step < len(prompts[r]):
                    nxt[r] = prompts[r][step]
                    continue
                nxt[r] = int(logits[r].argmax())
                outs[r].append(nxt[r])
                done[r] = nxt[r] == eos_id or len(outs[r]) >= max_new_tokens
        return outs

    # ------------------------------------------------------------------------------------------ reference path
    def joint_forward(
        self,
        streams: list[tuple[torch.Tensor, GemmaStack, torch.Tensor | None]],
        mask: torch.Tensor,
        positions: torch.Tensor,
    ) -> list[torch.Tensor]:
        """Uncached Mixture-of-Transformers forward (training-style).

        ``streams``: (hidden [B, T_i, W_i], expert stack, adaRMS cond or None); every stream uses its own weights,
        attention is joint over the concatenation. mask bool [B, T, T]; positions [B, T]. Returns the final-normed
        outputs per stream.
        """
        cos, sin = self._rope(positions)
        bounds = torch.tensor([0] + [h.shape[1] for h, _, _ in streams]).cumsum(0).tolist()
        spans = list(zip(bounds[:-1], bounds[1:], strict=True))
        hs = [h for h, _, _ in streams]
        for i in range(self.config.backbone.depth):
            qkv, gates = [], []
            for (_, stack, cond), h, (a, b) in zip(streams, hs, spans, strict=True):
                x, gate = stack.layers[i].input_layernorm(h, cond)
                qkv.append(self._qkv(stack.layers[i], x, cos[:, :, a:b], sin[:, :, a:b]))
                gates.append(gate)
            q, k, v = (torch.cat(t, 2) for t in zip(*qkv, strict=True))
            attn = gqa_attention(q, k, v, mask, self.rounded)
            hs = [
                self._attn_out_mlp(stack.layers[i], h, attn[:, a:b], gate, cond)
                for (_, stack, cond), h, gate, (a, b) in zip(streams, hs, gates, spans, strict=True)
            ]
        return [stack.norm(h, cond)[0] for h, (_, stack, cond) in zip(hs, streams, strict=True)]
