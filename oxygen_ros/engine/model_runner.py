"""The model runner: every model call of the engine, and the tensors a batched decode forward needs.

It owns the KV pool, the action heads and the optional LoRA adapters. The scheduler decides which slots decode; the
runner turns that :class:`~.scheduler.DecodeBatch` into per-row tokens, positions and write indices, the attention
length and the adapters' row masks, and runs ``Pi05Model.decode_step`` over the slot range in place.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from .backends import FrameGraphs, StageTiming, choose, resolve_backend, synthetic_observation, time_pair
from .kv_cache import KVCache
from .lora import LoraAdapter, LoraSet, batch_lora
from .model import Pi05Model, Prefix
from .modes import EngineConfig
from .observation import Observation
from .requests import LanguageRequest
from .rtc import RTCGuide, RTCPrefix
from .scheduler import DecodeBatch

log = logging.getLogger(__name__)


@dataclass
class DecodeInputs:
    """The inputs of one ``decode_step`` over cache slots ``rows``."""

    rows: slice
    tokens: torch.Tensor  # [B] ([B, T] for a multi-token forward)
    positions: torch.Tensor  # [B] RoPE position of each row's token
    write_index: torch.Tensor  # [B] cache index each row writes its K/V at
    attn_len: int  # rows attend to their valid positions in [0, attn_len)
    lora: LoraAdapter | LoraSet | None  # the adapter(s) of the active rows, row masks set (None: base model only)
    block: torch.Tensor | None = None  # [3, B] tokens / positions / write indices of a one-token forward


class ModelRunner:
    """Runs the model for one engine: prefill, denoise (every action head), first tokens and batched decode."""

    def __init__(self, model: Pi05Model, config: EngineConfig, num_slots: int, heads: nn.ModuleList | None = None,
                 adapter: LoraAdapter | None = None, adapter_tasks: set[str] | None = None,
                 adapters: Mapping[str, LoraAdapter] | None = None) -> None:
        self.model = model
        self.num_steps = config.num_steps
        self.prefill_layout = config.prefill_layout  # the fused prefill's (Pi05Model.compacts)
        self.compiled_note = ""  # graphs auto on CPU: whether the compiled steps were there, else the key that missed
        self.heads = [model.head_parts()] + [h.parts() for h in (heads or [])]
        self.adapter = adapter  # for requests of ``adapter_tasks`` that name no adapter
        self.adapter_tasks = adapter_tasks if adapter_tasks is not None else {"memory"}
        self.adapters = dict(adapters or {})  # by name, for requests that name one (LanguageRequest.adapter)
        cfg = model.config
        longest = max(max(h.horizon for h in self.heads), config.max_prompt_tokens + config.max_new_tokens)
        # + speculate: a row's drafts (and the padding of shorter rows) may run past its last real position
        length = cfg.max_prefix_len + longest + config.speculate
        self.cache = KVCache(cfg, num_slots, length, dtype=model.dtype, device=model.device)
        # which CPU kernels each stage's matrix products run on (kernel_choice.py; None: as the model is set)
        self.kernels = None if config.kernels == "keep" else choose(
            model, self.heads, self.num_steps, config.kernels, config.compile_cache_dir)
        backend = resolve_backend(config.graphs, model.device)
        # static-shape / captured denoise and decode steps (graphs.py); None: eager
        self.rtc = config.rtc if config.rtc is not None and config.rtc.enabled else None
        self.graphs = (FrameGraphs(model, self.cache, self.heads, self.num_steps, backend, self.rtc,
                                   config.compile_cache_dir, config.compile_options)
                       if backend != "off" else None)
        if config.graphs == "auto" and model.device.type == "cpu":
            # auto on CPU: the steps compiled ahead of time when the cache already holds them (oxygen-compile, or an
            # earlier graphs: aot), else eager; never a build at configure
            compiled = FrameGraphs(model, self.cache, self.heads, self.num_steps, "aot", self.rtc,
                                   config.compile_cache_dir, config.compile_options)
            where = compiled.cache_dir or "the default cache directory"
            if compiled.compiled_ready():
                self.graphs = compiled
                self.compiled_note = f"graphs auto: every step compiled in {where}; loading them"
            else:
                misses = compiled.compiled_misses()
                self.compiled_note = (f"graphs auto: no compiled steps for this model in {where}; running eager "
                                      f"(oxygen-compile --params-file builds them once). {misses[0] if misses else ''}")
            log.info(self.compiled_note)
        # a decode forward's tokens / positions / write indices, written per row into one persistent host buffer
        # (through its numpy view: no tensor built per forward) and copied to the device once
        self._device = model.device
        # flat, so a forward's [3, n] block is one contiguous (pinned, on CUDA) piece: a strided slice of a [3, slots]
        # buffer would be staged through unpinned memory by every copy
        self._host_flat = torch.zeros(3 * num_slots, dtype=torch.long, pin_memory=self._device.type == "cuda")
        self._host_numpy = self._host_flat.numpy()
        self._batch_cache: KVCache | None = None  # prefixes of a batched action frame (step_batch), grown on demand
        # which action stages run their graph step (the rest runs the fused eager path): all, until
        # choose_graph_stages measured them
        self.graph_stages: dict[str, bool] = {"prefill": True, "denoise": True}
        self.graph_timings: list[StageTiming] = []

    @property
    def device(self) -> torch.device:
        """The model's device."""
        return self.model.device

    def memory_bytes(self) -> int:
        """Parameters + KV pool."""
        params = sum(p.numel() * p.element_size() for p in self.model.parameters())
        return params + self.cache.nbytes

    # ------------------------------------------------------------------------------------------ prefix and actions
    def prepare(self, obs: Observation) -> Observation:
        """Check a frame's batch-of-one observation against the model and move it to the model's device/dtype."""
        cfg = self.model.config
        if obs.batch_size != 1:
            raise ValueError(f"the engine runs one observation per frame, got a batch of {obs.batch_size}")
        obs.validate(cfg.num_cameras, cfg.vision.image_size)
        if obs.tokens.shape[1] > cfg.max_token_len:
            raise ValueError(f"prompt of {obs.tokens.shape[1]} tokens exceeds max_token_len={cfg.max_token_len}")
        return obs.to(self.model.device, self.model.input_dtype)

    def choose_graph_stages(self) -> None:
        """Time each action stage's graph step against the fused eager path (which skips masked work, so it can win
        where a static shape pays for padding) on a synthetic frame, and keep the graph step only where it is not
        slower. CPU only: on CUDA the captured graphs stay (timing them needs synchronisation and they win)."""
        if self.graphs is None or self.device.type != "cpu":
            return
        model, slot = self.model, 0  # before any frame: slot 0 is free (warm_up used it the same way)
        obs = synthetic_observation(model, max(1, model.config.max_token_len // 2))
        head = self.heads[0]
        noise = [torch.randn(1, h.horizon, h.action_in_proj.in_features, device=self.device) for h in self.heads]
        timings = []
        with torch.no_grad():
            eager_prefix = model.prefill(obs, self.cache, slice(slot, slot + 1), self.prefill_layout)
            timings.append(StageTiming("prefill", eager_prefix.length, *time_pair(
                lambda: model.prefill(obs, self.cache, slice(slot, slot + 1), self.prefill_layout),
                lambda: self.graphs.prefill(obs, slot))))
            eager_prefix = model.prefill(obs, self.cache, slice(slot, slot + 1), self.prefill_layout)
            timings.append(StageTiming("denoise", head.horizon, *time_pair(
                lambda: [model.denoise(eager_prefix, self.cache, n, self.num_steps, h)
                         for h, n in zip(self.heads, noise, strict=True)],
                lambda: self.graphs.denoise(eager_prefix, noise))))
        self.cache.reset(slice(slot, slot + 1))
        self.graph_timings = timings
        self.graph_stages = {t.stage: t.ratio <= 1.0 for t in timings}

    def prefill(self, obs: Observation, slot: int) -> Prefix:
        """Prefill the observation into cache slot ``slot`` (static-shape, at the padded length, with graphs)."""
        if self.graphs is not None and self.graph_stages["prefill"] and self.graphs.covers_observation(obs):
            return self.graphs.prefill(obs, slot)
        return self.model.prefill(obs, self.cache, slice(slot, slot + 1), self.prefill_layout)

    def guide(self, rtc: RTCPrefix | None) -> RTCGuide | None:
        """The first head's real-time-chunking guide for a frame's remainder (None: RTC off or no remainder)."""
        if self.rtc is None or rtc is None:
            return None
        head = self.heads[0]
        return RTCGuide.build(rtc, self.rtc, head.horizon, head.action_in_proj.in_features, self.num_steps,
                              self.device)

    def denoise(self, prefix: Prefix, noise: torch.Tensor | list[torch.Tensor] | tuple | None,
                guide: RTCGuide | None = None) -> list[torch.Tensor]:
        """One [H, A] chunk per action head, each denoised from ``prefix`` (read-only); ``noise`` is one tensor for
        every head or one per head; ``guide`` (:meth:`guide`) steers the first head's."""
        noises = noise if isinstance(noise, list | tuple) else [noise] * len(self.heads)
        if self.graphs is not None and self.graph_stages["denoise"] and self.graphs.covers_prefix(prefix) \
                and self.graphs.covers_guide(guide):
            dev = self.device
            noises = [torch.randn(1, h.horizon, h.action_in_proj.in_features, device=dev) if n is None else n
                      for h, n in zip(self.heads, noises, strict=True)]
            return self.graphs.denoise(prefix, noises, guide)
        return [self.model.denoise(prefix, self.cache, n, self.num_steps, head, guide if i == 0 else None)[0]
                for i, (head, n) in enumerate(zip(self.heads, noises, strict=True))]

    # ------------------------------------------------------------------------------------------ batched actions
    def prefill_batch(self, obs: Observation) -> Prefix:
        """Prefill B observations together into rows [0, B) of the batch cache (its own K/V, not the pool's).

        Each row's prefix ends at the batch's longest (padded) length; a row's padded positions stay invalid."""
        b = obs.batch_size
        cache = self._batch_cache
        if cache is None or cache.num_slots < b:
            size = max(b, 2 * cache.num_slots if cache is not None else b)
            self._batch_cache = cache = KVCache(self.model.config, size, self.cache.max_len, dtype=self.model.dtype,
                                                device=self.device)
        return self.model.prefill(obs, cache, slice(0, b), layout=self.prefill_layout)

    def denoise_batch(self, prefix: Prefix, noises: list[torch.Tensor | list[torch.Tensor] | tuple | None]
                      ) -> list[list[torch.Tensor]]:
        """Every head denoises all B rows of a :meth:`prefill_batch` prefix in one loop; ``noises[i]`` is row i's
        noise ([1, H, A], one per head, or None: drawn). Returns, per row, one [H, A] chunk per head."""
        b = prefix.num_valid.shape[0]
        per_head = []
        for j, head in enumerate(self.heads):
            shape = (1, head.horizon, head.action_in_proj.in_features)
            rows = [n[j] if isinstance(n, list | tuple) else n for n in noises]
            rows = [torch.randn(shape) if n is None else n.reshape(shape).float().cpu() for n in rows]
            noise = torch.cat(rows).to(self.device)
            per_head.append(self.model.denoise(prefix, self._batch_cache, noise, self.num_steps, head))
        return [[chunks[i] for chunks in per_head] for i in range(b)]

    def adopt(self, prefix: Prefix, row: int, slot: int) -> Prefix:
        """Copy row ``row`` of a :meth:`prefill_batch` prefix into pool slot ``slot``: the prefix its language
        requests start from, as if the observation had been prefilled there alone."""
        src, dst, n = self._batch_cache, self.cache, prefix.length
        dst.k[:, slot, :, :n] = src.k[:, row, :, :n]
        dst.v[:, slot, :, :n] = src.v[:, row, :, :n]
        dst.valid[slot] = False
        dst.valid[slot, :n] = src.valid[row, :n]
        return Prefix(slice(slot, slot + 1), n, prefix.num_valid[row:row + 1], prefix.last_hidden[row:row + 1])

    def first_token(self, prefix: Prefix) -> int:
        """The greedy token after the prefix (a request without prompt tokens starts with it)."""
        return int(self.model.lm_logits(prefix.last_hidden[:1]).argmax(-1)[0])

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Copy the ``length``-token prefix of slot ``src`` into slot ``dst``."""
        c = self.cache
        c.k[:, dst, :, :length] = c.k[:, src, :, :length]
        c.v[:, dst, :, :length] = c.v[:, src, :, :length]
        c.valid[dst] = False
        c.valid[dst, :length] = c.valid[src, :length]

    def forget_appended(self, slot: int, prefix_len: int) -> None:
        """Forget the tokens a finished request appended to ``slot`` after its prefix (the prefix stays)."""
        self.cache.valid[slot, prefix_len:] = False

    # ------------------------------------------------------------------------------------------ decode
    def adapter_of(self, request: LanguageRequest) -> LoraAdapter | None:
        """The adapter a request's rows decode with: the one it names, else the default adapter for its task."""
        if request.adapter:
            return self.adapters[request.adapter]
        return self.adapter if self.adapter is not None and request.task in self.adapter_tasks else None

    def _lora(self, row_adapters: list[LoraAdapter | None]) -> LoraAdapter | LoraSet | None:
        return batch_lora(row_adapters, self.model.dtype, self.device)

    def prepare_decode(self, batch: DecodeBatch) -> DecodeInputs:
        """Per-row inputs of one batched decode forward.

        Free slots are dummy rows writing at index 0 of an unused slot; idle live rows write at their next position,
        which their next real step overwrites.
        """
        n = len(batch.rows)
        tokens, positions, writes = [0] * n, [0] * n, [0] * n
        active = {r.slot for r in batch.active}
        for i, r in enumerate(batch.rows):
            if r is not None:
                positions[i] = r.num_valid + r.fed
                writes[i] = r.prefix_len + r.fed
                if r.slot in active:
                    tokens[i] = r.next_token
        buf = self._host_numpy[:3 * n].reshape(3, n)  # numpy fills from lists in microseconds (torch.tensor: ~100 us)
        buf[0], buf[1], buf[2] = tokens, positions, writes
        attn_len = max(writes) + 1
        lora = None
        if self.adapter is not None or self.adapters:
            lora = self._lora([self.adapter_of(r.request) if r is not None and r.slot in active else None
                               for r in batch.rows])
        block = self._host_flat[:3 * n].view(3, n)  # contiguous: pinned memory copies straight to the device
        if lora is not None or self.graphs is None or not self.graphs.covers(batch.slots):
            # eager: a device copy, asynchronous from pinned memory: the forward's own host read (run_decode's
            # tolist) waits for it before the next prepare_decode rewrites the buffer
            block = block.to(self._device, copy=True, non_blocking=True)
        # else a static step copies the host block straight into its persistent inputs (run_decode, right away)
        return DecodeInputs(batch.slots, block[0], block[1], block[2], attn_len, lora, block)

    def prepare_decode_multi(self, batch: DecodeBatch, feeds: list[tuple[list[int], int]]) -> DecodeInputs:
        """Inputs of a forward whose active rows feed several tokens each (``feeds``, per ``batch.active``): every
        row carries T = the longest feed, shorter ones padded (their padding writes past the row's last real
        position, never marked valid)."""
        n = len(batch.rows)
        width = max(len(f) for f, _ in feeds)
        tokens = [[0] * width for _ in range(n)]
        starts, writes = [0] * n, [0] * n
        adapted: list[LoraAdapter | None] = [None] * n
        for i, r in enumerate(batch.rows):
            if r is not None:
                starts[i], writes[i] = r.num_valid + r.fed, r.prefix_len + r.fed
        for r, (feed, _) in zip(batch.active, feeds, strict=True):
            i = r.slot - batch.lo
            tokens[i][:len(feed)] = feed
            adapted[i] = self.adapter_of(r.request)
        dev = self.device
        offsets = torch.arange(width, device=dev)
        base = torch.tensor([starts, writes], device=dev)
        return DecodeInputs(batch.slots, torch.tensor(tokens, device=dev), base[0][:, None] + offsets,
                            base[1][:, None] + offsets, max(writes) + width, self._lora(adapted))

    def run_decode_multi(self, inputs: DecodeInputs) -> list[list[int]]:
        """One multi-token forward, K/V written in place (nothing marked valid); per row the argmax after each
        fed token."""
        logits = self.model.decode_tokens(self.cache, inputs.rows, inputs.tokens, inputs.positions,
                                          inputs.write_index, inputs.attn_len, inputs.lora)
        return logits.argmax(-1).tolist()

    def keep(self, kept: list[tuple[int, int, int]]) -> None:
        """Mark the kept positions ``(slot, first write index, count)`` of a multi-token forward valid."""
        for slot, start, count in kept:
            self.cache.valid[slot, start:start + count] = True

    def forward_rows(self, lo: int, hi: int) -> int:
        """Rows a one-token decode forward over slots ``[lo, hi)`` runs: the bucket ``[0, b)`` covering them when
        a static step runs it, else the span (what ``k_auto`` prices a step by; LoRA rows, which run eagerly over
        their span, are priced as the bucket: an upper bound)."""
        if self.graphs is None:
            return hi - lo
        return self.graphs.decode_bucket(hi)

    def static_rows(self, batch: DecodeBatch) -> int | None:
        """The slot count ``[0, n)`` a static decode step would widen ``batch`` to (None: it runs eagerly, as
        without graphs or with LoRA rows)."""
        if self.graphs is None or any(self.adapter_of(r.request) is not None for r in batch.active):
            return None
        return self.graphs.decode_bucket(batch.lo + len(batch.rows))

    def run_decode(self, inputs: DecodeInputs) -> list[int]:
        """One batched decode forward, in place in the cache; the greedy next token of every row. Run it before the
        next :meth:`prepare_decode` (which reuses the host buffer a static step reads)."""
        if self.graphs is not None and inputs.lora is None and self.graphs.covers(inputs.rows):
            return self.graphs.decode(inputs.rows, inputs.block)
        logits = self.model.decode_step(self.cache, inputs.rows, inputs.tokens, inputs.positions, inputs.write_index,
                                        inputs.attn_len, inputs.lora)
        return logits.argmax(-1).tolist()
