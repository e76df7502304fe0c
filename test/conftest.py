"""Shared fixtures: a small random pi0.5 and observations (nothing is downloaded)."""

from __future__ import annotations

import logging
import os

# Importing `launch` (the launch_pytest plugin does, when installed) makes every logger created afterwards
# non-propagating (launch.logging.LaunchLogger), which would hide the package's log records from pytest's caplog.
logging.setLoggerClass(logging.Logger)
for _name, _logger in logging.root.manager.loggerDict.items():
    if _name.startswith("oxygen_ros") and isinstance(_logger, logging.Logger):
        _logger.propagate = True

import tempfile  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# The engine stores measured kernel choices and compiled steps under $XDG_CACHE_HOME (compiled_store.py): tests
# (and the node processes they start) use a fresh one, never the user's
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="oxygen_ros_test_cache_")

from oxygen_ros.engine import Observation, Pi05Config, Pi05Model, get_config  # noqa: E402
from oxygen_ros.engine.checkpoint import init_random_weights  # noqa: E402

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

# every node preset in config/ (executor.yaml holds the chunk executor's parameters, not a node preset)
NODE_PRESETS = sorted(p for p in (Path(__file__).resolve().parents[1] / "config").glob("*.yaml")
                      if p.stem != "executor")


def make_model(config: Pi05Config | None = None, seed: int = 0, std: float = 0.1) -> Pi05Model:
    """Random tiny pi0.5 with non-zero adaRMS gates and norm weights, so every path matters
    (std >= 0.3 makes greedy text vary token to token instead of repeating one token)."""
    model = init_random_weights(Pi05Model(config or get_config("tiny")), seed=seed, std=std).eval()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed + 1)
        for name, p in model.named_parameters():
            if "norm" in name and "vision" not in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def make_heads_and_lora(model: Pi05Model, count: int = 1, seed: int = 3):
    """``count`` extra action experts with random weights (std 0.1) and a rank-4 LoRA on every target module."""
    from oxygen_ros.engine.lora import TARGETS, LoraAdapter, random_lora_weights
    from oxygen_ros.study.heads import make_extra_heads

    heads = make_extra_heads(model.config, count)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return heads, LoraAdapter(random_lora_weights(model, r=4, std=0.3, modules=TARGETS), 2.0)


@contextmanager
def eager_stages(policy) -> Iterator[None]:
    """The policy runs its model's eager reference stages (the same weights) inside the block."""
    fused = policy.model
    policy.model = fused.with_stages("eager")
    try:
        yield
    finally:
        policy.model = fused


def make_observation(config: Pi05Config, batch: int = 1, prompt_lens=None, camera_masks=None,
                     seed: int = 0, length: int | None = None) -> Observation:
    """Random observation batch; prompt i has prompt_lens[i] valid tokens (BOS first), padded to ``length``."""
    gen = torch.Generator().manual_seed(seed)
    prompt_lens = prompt_lens or [10] * batch
    length = length or max(prompt_lens)
    c, s = config.num_cameras, config.vision.image_size
    tokens = torch.zeros(batch, length, dtype=torch.long)
    mask = torch.zeros(batch, length, dtype=torch.bool)
    for i, n in enumerate(prompt_lens):
        tokens[i, :n] = torch.randint(3, config.vocab_size, (n,), generator=gen)
        tokens[i, 0] = 2
        mask[i, :n] = True
    masks = torch.ones(batch, c, dtype=torch.bool)
    if camera_masks is not None:
        masks = torch.tensor(camera_masks, dtype=torch.bool)
    images = torch.rand(batch, c, 3, s, s, generator=gen) * 2 - 1
    return Observation(images, masks, tokens, mask, torch.rand(batch, 8, generator=gen) * 2 - 1)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``): on 2 shared
    cores two threads oversubscribe badly (100x slower when another job runs)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_config() -> Pi05Config:
    return get_config("tiny")


@pytest.fixture(scope="session")
def tiny_model(tiny_config: Pi05Config) -> Pi05Model:
    return make_model(tiny_config)


TWO_CAMERAS = ("base_0_rgb", "left_wrist_0_rgb")


def random_policy(tmp_path_factory: pytest.TempPathFactory, max_token_len: int = 64, std: float | None = 0.3):
    """A generated tiny checkpoint (our layout, identity normalisation, a test tokenizer) loaded as a Policy: three
    camera slots, the first two of them fed by ``TWO_CAMERAS``-named tests. ``std``: the init width (0.3: texts
    that vary token to token; None: make_random_checkpoint's default)."""
    from oxygen_ros.policy import load_policy
    from oxygen_ros.policy.synthetic import make_random_checkpoint

    extra = {} if std is None else {"std": std}
    path = make_random_checkpoint(tmp_path_factory.mktemp("ckpt"), "tiny", None, tokenizer=True,
                                  camera_names=(*TWO_CAMERAS, "right_wrist_0_rgb"), max_token_len=max_token_len,
                                  **extra)
    return load_policy(path, generated=True)


def this_host() -> dict:
    """This machine as the bf16 fixture generators record their host (``expected_bf16.json``: CPU model, its bf16 /
    AMX flags, torch and its CPU capability); the same host reproduces their bits."""
    from oxygen_ros.util.host import cpu_flags, cpu_name

    flags = cpu_flags()
    return {"cpu": cpu_name(), "cpu_bf16_flags": sorted(f for f in flags if "bf16" in f or f.startswith("amx")),
            "torch": torch.__version__, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def assert_plot(path: Path, min_px: int = 200) -> None:
    """``path`` is a drawn matplotlib figure: a PNG at least ``min_px`` on each side with data drawn in colour
    (matplotlib's colour cycle), not a blank or axes-only canvas (black, white and greys)."""
    import matplotlib.image as mpimg

    img = mpimg.imread(path)
    assert img.ndim == 3 and min(img.shape[:2]) >= min_px, (path, img.shape)
    rgb = img[..., :3]
    coloured = (rgb.max(axis=-1) - rgb.min(axis=-1)) > 0.05  # a tinted pixel: not black, white or grey
    assert coloured.mean() > 1e-3, (path, f"{coloured.mean():.2e} of the pixels in colour")


def made_on_this_host(host: dict) -> bool:
    """Whether a fixture's recorded ``host`` (:func:`this_host`'s fields) is this machine: then its bits reproduce."""
    return all(host.get(k) == v for k, v in this_host().items())


# The ROS test preamble, once: modules that talk over DDS call require_ros() before importing anything of rclpy, take
# their domain from ros_domain() and open in-process contexts with ros_context().


def require_ros(messages: bool = True) -> None:
    """Skip the calling module (or test) unless rclpy and, with ``messages``, the built oxygen_ros interfaces (its
    messages and actions, one build) import; keep DDS discovery on this host (the children the tests start inherit
    it)."""
    pytest.importorskip("rclpy", reason="rclpy is not installed")
    if messages:
        for interfaces in ("oxygen_ros.msg", "oxygen_ros.action"):
            pytest.importorskip(interfaces, reason="the oxygen_ros interfaces are not built (run `make setup`)")
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"


_DOMAINS: list[int] = []


def ros_domain() -> int:
    """A ROS domain id no other caller in this test process gets (sequential from a pid-based start, 20-219: Fast
    DDS accepts up to 232), so that modules, and pytest runs on other pids, do not hear each other's nodes."""
    domain = 20 + ((os.getpid() * 7) % 200 + len(_DOMAINS)) % 200
    _DOMAINS.append(domain)
    return domain


@contextmanager
def ros_context(domain: int) -> Iterator:
    """An initialised rclpy context of its own on ``domain``, shut down on exit."""
    import rclpy

    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=domain)
    try:
        yield ctx
    finally:
        rclpy.try_shutdown(context=ctx)
