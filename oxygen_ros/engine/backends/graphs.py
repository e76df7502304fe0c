"""Static shapes and captured graphs for a frame's stages: the prefill, the S-step denoise and the decode step.

The loops launch thousands of small kernels per frame; at robot batch sizes that launch cost, not the
arithmetic, is the frame time on a GPU. Here each stage runs with shapes fixed in advance, so it can be captured
once and replayed:

- **prefill** at its fixed padded length (the prompt padded to ``max_token_len``): SigLIP and the backbone over
  persistent input tensors, K/V into the staging buffer, then copied into the frame's slot;
- **denoise**, per action head: the frame's prefix K/V is copied from its cache slot into a staging buffer of the
  model's longest prefix (positions past this frame's prefix masked), and the whole S-step loop
  (``fast_path.denoise_kv``) runs over it, its time conditioning computed once at construction;
- **decode**, per batch-size bucket (1, 2, 4, ... and the pool size): one step over cache slots ``[0, bucket)``
  attending over the whole slot length (invalid positions masked), inputs copied into persistent tensors, the
  greedy tokens sampled inside. Slots the frame does not advance run as idle rows, as in the eager batch.

Backends (``EngineConfig.graphs``): ``static`` runs the static-shape code eagerly (the CPU reference of what is
captured), ``cuda`` captures a CUDA graph per step and replays it, ``compile`` runs it through ``torch.compile``
(static shapes, one graph per bucket), ``aot`` loads each step compiled ahead of time by AOTInductor from a cache
directory (built there on first use: ``aot_steps.py``). The engine captures or compiles every step when it is built
(:meth:`FrameGraphs.warm_up`); used directly, a step is captured or compiled on first use, which is correct too,
since a step is idempotent. Every step is a function of explicit tensors (its persistent inputs and state: the
staging buffers, the cache, the RoPE table, the time conditioning), reading only the weights from the model, so
an exported step takes them as arguments and writes the state in place.
Forwards these shapes do not cover run eagerly: LoRA rows, speculative multi-token rows, batches of several
observations. The static prefix is always ``max_prefix_len`` long (its padding invalid), so language requests
append after it. Eager (``graphs='off'``) stays the reference; the tests hold every backend to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ..kv_cache import KVCache
from ..modes import GRAPH_BACKENDS
from ..observation import Observation
from ..parts import HeadParts, Prefix
from ..rtc import RTCConfig, RTCGuide, RTCPrefix
from . import fast_path
from .fast_path import RopeTable
from .step_weights import StepWeights


def resolve_backend(backend: str, device: torch.device) -> str:
    """``auto``: captured CUDA graphs on CUDA, eager elsewhere; ``cuda`` needs a CUDA device."""
    if backend not in GRAPH_BACKENDS:
        raise ValueError(f"graphs must be one of {GRAPH_BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "cuda" if device.type == "cuda" else "off"
    if backend == "cuda" and device.type != "cuda":
        raise ValueError(f"graphs='cuda' captures CUDA graphs: the model is on {device}")
    return backend


def allow_recompiles(n: int) -> None:
    """Let torch.compile keep at least ``n`` compiled variants per function (one per bucket or module shape)."""
    cfg = torch._dynamo.config
    limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, limit, max(getattr(cfg, limit), n))


def decode_buckets(num_slots: int) -> list[int]:
    """Batch sizes with a graph of their own: powers of two below the pool size, and the pool size."""
    sizes, b = [], 1
    while b < num_slots:
        sizes.append(b)
        b *= 2
    return [*sizes, num_slots]


class _Rope:
    """A RoPE table over a step's cos / sin arguments (``RopeTable.lookup``)."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor) -> None:
        self.cos, self.sin = cos, sin

    lookup = RopeTable.lookup


class _Valid:
    """What ``fast_path.decode_tokens`` reads of a KV cache besides the views it is given: the validity mask."""

    def __init__(self, valid: torch.Tensor) -> None:
        self.valid = valid


class _Replay:
    """One static-shape function of explicit tensors behind a backend: called directly, compiled, captured and
    replayed, or loaded compiled ahead of time (``aot``: built by :meth:`FrameGraphs.warm_up` from ``spec``)."""

    def __init__(self, name: str, fn: Callable, args: Sequence[torch.Tensor], backend: str,
                 spec: dict | None = None, weights: StepWeights | None = None,
                 compile_options: dict | None = None, pool: Callable[[], object] | None = None) -> None:
        self.name, self.fn, self.args, self.backend, self.spec = name, fn, list(args), backend, dict(spec or {})
        self.pool = pool  # cuda: the memory pool shared by the steps of one FrameGraphs (None: a private one)
        self.weights = weights  # what the step reads from the model (the leading inputs of its exported form)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None
        self.loaded = None  # aot: the loaded package's runner
        self._call = fn
        if backend == "compile":
            self._call = torch.compile(fn, dynamic=False, fullgraph=True, options=compile_options)

    @torch.no_grad()
    def __call__(self):
        if self.backend == "aot":
            if self.loaded is None:
                raise RuntimeError(f"compiled step {self.name} is not loaded: FrameGraphs.warm_up() loads it")
            return self.loaded()
        if self.backend != "cuda":
            return self._call(*self.args)
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return self.out

    def _capture(self) -> None:
        """Capture on the device of the step's tensors (not the thread's current device, which nothing sets): its
        side stream, the capture and the replay stream all belong to that device."""
        dev = self.args[0].device
        with torch.cuda.device(dev):
            main = torch.cuda.current_stream(dev)
            side = torch.cuda.Stream(device=dev)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                self.fn(*self.args)  # warm-up (lazy inits, autotuning) outside the capture; idempotent
            main.wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            # one memory pool for every step of the engine (pool()): the steps run one at a time on one stream and
            # each output is copied out before the next replay, so their scratch (a decode bucket's [b, vocab]
            # float32 logits) can share memory instead of one pool per bucket. thread_local: the parallel
            # baseline's other worker may launch work meanwhile
            with torch.cuda.graph(self.graph, pool=self.pool() if self.pool is not None else None,
                                  capture_error_mode="thread_local"):
                self.out = self.fn(*self.args)


class FrameGraphs:
    """The static-shape denoise (one per action head) and decode steps (one per bucket) of one engine's pool.

    ``cache_dir`` / ``options``: where the ``aot`` backend keeps its compiled steps (None: the XDG default,
    ``compiled_store.default_cache_dir``) and the Inductor options it compiles them with."""

    def __init__(self, model, cache: KVCache, heads: list[HeadParts], num_steps: int, backend: str,
                 rtc: RTCConfig | None = None, cache_dir: str | Path | None = None,
                 options: dict | None = None) -> None:
        self.backend = resolve_backend(backend, model.device)
        if self.backend == "off":
            raise ValueError("FrameGraphs needs a backend other than 'off'")
        if self.backend == "compile":
            allow_recompiles(64)
        self.model, self.cache, self.heads, self.num_steps = model, cache, heads, num_steps
        self.cache_dir, self.options = cache_dir, dict(options or {})
        # a model rounding as openpi does (bfloat16_islands) keeps eager's rounding after every op when compiled
        # (inductor would otherwise compute a fused chain of bf16 ops in float32 and round once)
        self.compile_options = {"emulate_precision_casts": True} if model.rounded else None
        if model.rounded:
            self.options.setdefault("emulate_precision_casts", True)
        self._pool_handle: object | None = None  # cuda: the graph memory pool the steps share (_pool)
        self.load_report: list[dict] = []  # aot: per step, loaded or built and in how many seconds (warm_up)
        g, dev = model.config.backbone, model.device
        self.prefix_len = model.config.max_prefix_len
        horizon = max(h.horizon for h in heads)
        self.rope = RopeTable(g, max(cache.max_len, self.prefix_len + horizon), model.dtype, dev, model.rope_freq_dtype)
        # staging K/V of one prefix + the action scratch, shared by the heads (they run one after another)
        shape = (g.depth, 1, g.num_kv_heads, self.prefix_len + horizon, g.head_dim)
        self.stage_k = torch.zeros(shape, dtype=cache.k.dtype, device=dev)
        self.stage_v = torch.zeros(shape, dtype=cache.v.dtype, device=dev)
        self.stage_valid = torch.zeros(1, self.prefix_len, dtype=torch.bool, device=dev)
        self.num_valid = torch.zeros(1, dtype=torch.long, device=dev)
        self.noise = [torch.zeros(1, h.horizon, h.action_in_proj.in_features, device=dev) for h in heads]
        self._denoise = [self._denoise_fn(i, h, num_steps) for i, h in enumerate(heads)]
        # identity real-time chunking of the first head: the frame's target and weights copied into persistent
        # tensors, the per-step times and gains constants of the graph (vjp guidance runs eagerly)
        self._rtc: RTCGuide | None = None
        self._denoise_rtc: _Replay | None = None
        if rtc is not None and rtc.enabled and rtc.guidance == "identity":
            h0 = heads[0]
            a0 = h0.action_in_proj.in_features
            template = RTCGuide.build(RTCPrefix(torch.zeros(0, a0), 0), rtc, h0.horizon, a0, num_steps, dev)
            self._rtc = template
            self._denoise_rtc = self._denoise_fn(0, h0, num_steps, template)
        cfg = model.config
        size = cfg.vision.image_size
        self.obs = Observation(torch.zeros(1, cfg.num_cameras, 3, size, size, dtype=model.input_dtype, device=dev),
                               torch.zeros(1, cfg.num_cameras, dtype=torch.bool, device=dev),
                               torch.zeros(1, cfg.max_token_len, dtype=torch.long, device=dev),
                               torch.zeros(1, cfg.max_token_len, dtype=torch.bool, device=dev))
        self._prefill = self._prefill_fn()
        self._staged: Prefix | None = None  # the prefix the staging buffer holds (the static prefill wrote it)
        self.buckets = decode_buckets(cache.num_slots)
        self._inputs = {b: torch.zeros(3, b, dtype=torch.long, device=dev) for b in self.buckets}
        self._decode = {b: self._decode_fn(b) for b in self.buckets}

    def steps(self) -> list[_Replay]:
        """Every step: the decode buckets, the prefill, the denoise of each head (and the guided one)."""
        runs = [*(self._decode[b] for b in self.buckets), self._prefill, *self._denoise]
        return runs + ([self._denoise_rtc] if self._denoise_rtc is not None else [])

    def warm_up(self) -> None:
        """Run (compile, capture, load or build) every step once now instead of on first use, so no frame pays for
        it. Only on an empty pool: the decode steps write at position 0 of every slot, which is then marked invalid
        again."""
        if self.backend == "aot":
            self._load_compiled()
        with torch.no_grad():
            for b in self.buckets:
                self._inputs[b].zero_()
                self._decode[b]()
            self.obs.image_masks.fill_(True)
            self.obs.token_mask[:, 0] = True  # one valid token: no all-masked softmax (NaN) in the staging K/V
            self._prefill()
            for run in self._denoise:
                run()
            if self._denoise_rtc is not None:
                self._denoise_rtc()
            self.cache.valid.zero_()
            self._staged = None

    def compiled_ready(self) -> bool:
        """aot: whether the cache directory holds every step, current and intact (nothing would be built)."""
        return not self.compiled_misses()

    def compiled_misses(self) -> list[str]:
        """aot: why each step the cache directory cannot serve is not there (the key looked for, and the fields
        in which the nearest entry of that step differs); empty when every step is there, current and intact."""
        from .aot_steps import step_key
        from .compiled_store import CompiledStore

        store = CompiledStore(self.cache_dir)
        base = {"config": self.model.config.to_dict(), "dtype": str(self.model.dtype)}
        out = []
        for run in self.steps():
            key = step_key({**base, **run.spec}, run.weights, run.args, self.options)
            reason = store.check(run.name, key)
            if reason == "missing":
                out.append(store.explain_miss(run.name, key))
            elif reason is not None:
                out.append(f"{run.name}: {reason}")
        return out

    def _load_compiled(self) -> None:
        """aot: every step from the cache directory, each built there first when it is absent, stale or corrupt."""
        from .aot_steps import load_or_build  # torch.export / Inductor: imported only by the backend that uses them
        from .compiled_store import CompiledStore

        store = CompiledStore(self.cache_dir)
        base = {"config": self.model.config.to_dict(), "dtype": str(self.model.dtype)}
        self.load_report = []
        for run in self.steps():
            entry = load_or_build(store, run.name, {**base, **run.spec}, run.fn, run.weights, run.args,
                                  isinstance(run.spec.get("outputs"), int) and run.spec["outputs"] > 1,
                                  self.options)
            run.loaded = lambda entry=entry: entry.value()
            self.load_report.append({"step": run.name, "how": entry.how, "seconds": entry.seconds,
                                     "path": str(entry.path)})

    def _step(self, name: str, fn: Callable, args: list[torch.Tensor], weights: StepWeights, spec: dict) -> _Replay:
        return _Replay(name, fn, args, self.backend, {"step": name, **spec}, weights, self.compile_options,
                       self._pool)

    def _pool(self) -> object:
        """The CUDA graph memory pool every captured step of this engine shares (made on the first capture)."""
        if self._pool_handle is None:
            with torch.cuda.device(self.model.device):
                self._pool_handle = torch.cuda.graph_pool_handle()
        return self._pool_handle

    # ------------------------------------------------------------------------------------------ prefill
    def _prefill_fn(self) -> _Replay:
        model, p = self.model, self.prefix_len
        depth = model.config.backbone.depth
        inner = model.paligemma_with_expert.paligemma.model
        weights = StepWeights({"vision_tower": inner.vision_tower, "projector": inner.multi_modal_projector,
                               "backbone": model.backbone}, [model.backbone])

        def run(images, image_masks, tokens, token_mask, stage_k, stage_v, cos, sin):
            views = ([stage_k[j] for j in range(depth)], [stage_v[j] for j in range(depth)])
            embs, valid = model.embed_prefix(Observation(images, image_masks, tokens, token_mask))
            positions = torch.arange(p, device=valid.device)
            last = positions.masked_fill(~valid[0], -1).argmax().view(1)  # a device index: no host read
            h = fast_path.prefill(model, embs, valid, None, None, _Rope(cos, sin), views, last=last)
            last_hidden, _ = model.backbone.norm(h[:, 0])
            return valid, valid.sum(1), last_hidden

        o = self.obs
        args = [o.images, o.image_masks, o.tokens, o.token_mask, self.stage_k, self.stage_v, self.rope.cos,
                self.rope.sin]
        return self._step("prefill", run, args, weights, {"outputs": 3})

    def covers_observation(self, obs: Observation) -> bool:
        """Whether ``obs`` is one observation whose prompt fits the static prefill."""
        return obs.batch_size == 1 and obs.tokens.shape[1] <= self.obs.tokens.shape[1]

    @torch.no_grad()
    def prefill(self, obs: Observation, slot: int) -> Prefix:
        """Prefill one observation (on the model's device and dtype) into cache slot ``slot``, at the padded
        length ``max_prefix_len``."""
        x, n = self.obs, obs.tokens.shape[1]
        x.images.copy_(obs.images)
        x.image_masks.copy_(obs.image_masks)
        x.tokens.zero_()
        x.tokens[:, :n].copy_(obs.tokens)
        x.token_mask.zero_()
        x.token_mask[:, :n].copy_(obs.token_mask)
        valid, num_valid, last_hidden = self._prefill()
        p, c = self.prefix_len, self.cache
        c.k[:, slot:slot + 1, :, :p].copy_(self.stage_k[:, :, :, :p])
        c.v[:, slot:slot + 1, :, :p].copy_(self.stage_v[:, :, :, :p])
        c.valid[slot] = False
        c.valid[slot:slot + 1, :p].copy_(valid)
        self.stage_valid.copy_(valid)
        self.num_valid.copy_(num_valid)
        self._staged = Prefix(slice(slot, slot + 1), p, num_valid.clone(), last_hidden.clone())
        return self._staged

    # ------------------------------------------------------------------------------------------ denoise
    def _denoise_fn(self, i: int, head: HeadParts, num_steps: int, guide: RTCGuide | None = None) -> _Replay:
        model = self.model
        times = model.denoise_times(num_steps)
        with torch.no_grad():  # t is known in advance: every step's adaRMS scale / shift / gate, once
            conds = fast_path.time_conditioning(model, head, times)
            scale, shift, gate = (torch.stack([torch.stack([n[j] for n in norms]) for norms in conds])
                                  for j in range(3))  # [S, 2L + 1, W] each
        n_layers = head.stack.cfg.depth
        weights = StepWeights({"action_in_proj": head.action_in_proj, "action_out_proj": head.action_out_proj},
                              [head.stack])

        def run(stage_k, stage_v, stage_valid, num_valid, noise, cos, sin, scale, shift, gate, *rtc):
            # per-layer views (select, not unbind: they are written in place)
            ks, vs = [stage_k[j] for j in range(n_layers)], [stage_v[j] for j in range(n_layers)]
            norms = [list(zip(sc.unbind(0), sh.unbind(0), gt.unbind(0), strict=True))
                     for sc, sh, gt in zip(scale.unbind(0), shift.unbind(0), gate.unbind(0), strict=True)]
            g = None if guide is None else RTCGuide(rtc[0], rtc[1], guide.times, guide.gains)
            return fast_path.denoise_kv(model, head, ks, vs, stage_valid, num_valid, noise, norms,
                                        _Rope(cos, sin), g)

        args = [self.stage_k, self.stage_v, self.stage_valid, self.num_valid, self.noise[i], self.rope.cos,
                self.rope.sin, scale, shift, gate]
        spec = {"num_steps": num_steps, "times": times}
        if guide is not None:
            args += [guide.target, guide.weights]
            spec["rtc"] = {"times": guide.times, "gains": guide.gains}
        return self._step("denoise_rtc" if guide is not None else "denoise", run, args, weights, spec)

    def covers_prefix(self, prefix: Prefix) -> bool:
        """Whether ``prefix`` is one observation that fits the staging buffer."""
        return prefix.rows.stop - prefix.rows.start == 1 and prefix.length <= self.prefix_len

    def covers_guide(self, guide: RTCGuide | None) -> bool:
        """Whether the static denoise runs ``guide`` (none, or identity guidance with this engine's step gains)."""
        t = self._rtc
        return guide is None or (t is not None and not guide.vjp and guide.gains == t.gains
                                 and guide.times == t.times and guide.target.shape == t.target.shape)

    @torch.no_grad()
    def denoise(self, prefix: Prefix, noises: list[torch.Tensor], guide: RTCGuide | None = None) -> list[torch.Tensor]:
        """One [H, A] chunk per head from a one-observation ``prefix`` (its slot is only read); ``guide`` (real-time
        chunking of the first head, :meth:`covers_guide`) is copied into the persistent guided step's inputs."""
        if prefix is not self._staged:  # the static prefill left this frame's prefix staged already
            slot, p = prefix.rows.start, prefix.length
            c = self.cache
            self.stage_k[:, :, :, :p].copy_(c.k[:, slot:slot + 1, :, :p])
            self.stage_v[:, :, :, :p].copy_(c.v[:, slot:slot + 1, :, :p])
            self.stage_valid.zero_()
            self.stage_valid[:, :p].copy_(c.valid[slot:slot + 1, :p])
            self.num_valid.copy_(prefix.num_valid)
        runs = list(self._denoise)
        if guide is not None:
            self._rtc.target.copy_(guide.target)
            self._rtc.weights.copy_(guide.weights)
            runs[0] = self._denoise_rtc
        chunks = []
        for run, static, noise in zip(runs, self.noise, noises, strict=True):
            static.copy_(noise)
            chunks.append(run()[0].clone())  # the static output is overwritten by the next frame
        return chunks

    # ------------------------------------------------------------------------------------------ decode
    def _decode_fn(self, b: int) -> _Replay:
        model, max_len = self.model, self.cache.max_len
        paligemma = model.paligemma_with_expert.paligemma
        weights = StepWeights({"backbone": model.backbone, "lm_head": paligemma.lm_head}, [model.backbone])
        rows = slice(0, b)

        def run(inputs, cache_k, cache_v, cache_valid, cos, sin):
            tokens, positions, writes = inputs[0], inputs[1], inputs[2]
            ar = torch.arange(b, device=inputs.device)
            true = torch.ones((), dtype=torch.bool, device=inputs.device)  # a device value: no host copy
            cache_valid[rows].index_put_((ar, writes), true)
            views = (list(cache_k[:, rows].unbind(0)), list(cache_v[:, rows].unbind(0)))
            logits = fast_path.decode_tokens(model, _Valid(cache_valid), rows, tokens[:, None], positions[:, None],
                                             writes[:, None], max_len, None, _Rope(cos, sin), views)
            return logits[:, 0].argmax(-1)

        c = self.cache
        args = [self._inputs[b], c.k, c.v, c.valid, self.rope.cos, self.rope.sin]
        return self._step(f"decode{b}", run, args, weights, {"bucket": b})

    def decode_bucket(self, hi: int) -> int:
        """The smallest bucket covering slots ``[0, hi)``."""
        return next(b for b in self.buckets if b >= hi)

    def covers(self, rows: slice) -> bool:
        """Whether a decode over ``rows`` is one of the static steps (slots ``[0, bucket)``)."""
        return rows.start == 0 and rows.stop in self._decode

    def decode(self, rows: slice, inputs: torch.Tensor) -> list[int]:
        """One decode step over slots ``rows`` (a bucket, :meth:`covers`) from ``inputs`` [3, bucket] (tokens,
        RoPE positions, write indices; on the host or the device: one copy into the step's persistent inputs);
        the greedy next token of every row."""
        self._inputs[rows.stop].copy_(inputs)
        return self._decode[rows.stop]().tolist()  # the frame's one host synchronisation per forward
