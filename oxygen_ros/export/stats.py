"""Dataset statistics computed as LeRobot 0.6.1 computes them (``lerobot/datasets/compute_stats.py``, Apache-2.0):
per-episode stats of every numeric feature (histogram quantiles of :class:`RunningQuantileStats`), images sampled
(``sample_indices``), downsampled above 300 px and reduced per channel in [0, 1], then the episodes aggregated
(count-weighted means, parallel variance, count-weighted quantiles). Ported line for line so that an export's
``meta/stats.json`` equals what LeRobot writes for the same frames (``test/test_export_lerobot.py`` compares it with
the LeRobot-made fixture). numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["DEFAULT_QUANTILES", "RunningQuantileStats", "aggregate_stats", "episode_stats", "get_feature_stats",
           "image_stats", "sample_indices", "serialize_stats"]

DEFAULT_QUANTILES = [0.01, 0.10, 0.50, 0.90, 0.99]


class RunningQuantileStats:
    """Running mean / mean of squares / min / max and histogram quantiles per vector dimension (LeRobot's)."""

    def __init__(self, quantile_list: Sequence[float] | None = None, num_quantile_bins: int = 5000) -> None:
        self._count = 0
        self._mean = self._mean_of_squares = self._min = self._max = None
        self._histograms: list[np.ndarray] = []
        self._bin_edges: list[np.ndarray] = []
        self._num_quantile_bins = num_quantile_bins
        self._quantile_list = list(quantile_list or DEFAULT_QUANTILES)
        self._quantile_keys = [f"q{int(q * 100):02d}" for q in self._quantile_list]

    def update(self, batch: np.ndarray) -> None:
        batch = batch.reshape(-1, batch.shape[-1])
        batch = batch.astype(np.result_type(batch.dtype, np.float32), copy=False)
        num_elements, vector_length = batch.shape
        if self._count == 0:
            self._mean = np.mean(batch, axis=0)
            self._mean_of_squares = np.mean(batch**2, axis=0)
            self._min = np.min(batch, axis=0)
            self._max = np.max(batch, axis=0)
            self._histograms = [np.zeros(self._num_quantile_bins) for _ in range(vector_length)]
            self._bin_edges = [np.linspace(self._min[i] - 1e-10, self._max[i] + 1e-10, self._num_quantile_bins + 1)
                               for i in range(vector_length)]
        else:
            if vector_length != self._mean.size:
                raise ValueError("The length of new vectors does not match the initialized vector length.")
            new_max, new_min = np.max(batch, axis=0), np.min(batch, axis=0)
            changed = np.any(new_max > self._max) or np.any(new_min < self._min)
            self._max, self._min = np.maximum(self._max, new_max), np.minimum(self._min, new_min)
            if changed:
                self._adjust_histograms()
        self._count += num_elements
        self._mean += (np.mean(batch, axis=0) - self._mean) * (num_elements / self._count)
        self._mean_of_squares += (np.mean(batch**2, axis=0) - self._mean_of_squares) * (num_elements / self._count)
        for i in range(batch.shape[1]):
            self._histograms[i] += np.histogram(batch[:, i], bins=self._bin_edges[i])[0]

    def get_statistics(self) -> dict[str, np.ndarray]:
        if self._count < 2:
            raise ValueError("Cannot compute statistics for less than 2 vectors.")
        std = np.sqrt(np.maximum(0, self._mean_of_squares - self._mean**2))
        stats = {"min": self._min.copy(), "max": self._max.copy(), "mean": self._mean.copy(), "std": std,
                 "count": np.array([self._count])}
        for key, q in zip(self._quantile_keys, self._quantile_list, strict=True):
            stats[key] = np.array([_quantile(h, e, q * self._count) for h, e in
                                   zip(self._histograms, self._bin_edges, strict=True)])
        return stats

    def _adjust_histograms(self) -> None:
        for i in range(len(self._histograms)):
            old_edges, old_hist = self._bin_edges[i], self._histograms[i]
            padding = (self._max[i] - self._min[i]) * 1e-10
            new_edges = np.linspace(self._min[i] - padding, self._max[i] + padding, self._num_quantile_bins + 1)
            old_centers = (old_edges[:-1] + old_edges[1:]) / 2
            new_hist = np.zeros(self._num_quantile_bins)
            for center, count in zip(old_centers, old_hist, strict=False):
                if count > 0:
                    idx = max(0, min(np.searchsorted(new_edges, center) - 1, self._num_quantile_bins - 1))
                    new_hist[idx] += count
            self._histograms[i], self._bin_edges[i] = new_hist, new_edges


def _quantile(hist: np.ndarray, edges: np.ndarray, target_count: float) -> float:
    cumsum = np.cumsum(hist)
    idx = np.searchsorted(cumsum, target_count)
    if idx == 0:
        return edges[0]
    if idx >= len(cumsum):
        return edges[-1]
    count_before = cumsum[idx - 1]
    count_in_bin = cumsum[idx] - count_before
    if count_in_bin == 0:
        return edges[idx]
    return edges[idx] + (target_count - count_before) / count_in_bin * (edges[idx + 1] - edges[idx])


def sample_indices(data_len: int, min_num_samples: int = 100, max_num_samples: int = 10_000,
                   power: float = 0.75) -> list[int]:
    """The frames LeRobot samples for image stats (``estimate_num_samples`` + ``sample_indices``)."""
    if data_len < min_num_samples:
        min_num_samples = data_len
    num = max(min_num_samples, min(int(data_len**power), max_num_samples))
    return np.round(np.linspace(0, data_len - 1, num)).astype(int).tolist()


def _downsample(img: np.ndarray, target_size: int = 150, max_size_threshold: int = 300) -> np.ndarray:
    _, height, width = img.shape
    if max(width, height) < max_size_threshold:
        return img
    factor = int(width / target_size) if width > height else int(height / target_size)
    return img[:, ::factor, ::factor]


def get_feature_stats(array: np.ndarray, image: bool) -> dict[str, np.ndarray]:
    """LeRobot's ``get_feature_stats`` for its two cases: images [N, C, H, W] per channel (axis (0, 2, 3),
    keepdims), and vectors [N] or [N, D] (axis 0, keepdims for 1-D)."""
    if image:
        n, c = array.shape[:2]
        reshaped, count = array.transpose(0, 2, 3, 1).reshape(-1, c), n
    else:
        reshaped, count = (array.reshape(-1, 1) if array.ndim == 1 else array), array.shape[0]
    if reshaped.shape[0] < 2:
        stats = {"min": np.min(reshaped, axis=0), "max": np.max(reshaped, axis=0),
                 "mean": np.mean(reshaped, axis=0), "std": np.std(reshaped, axis=0), "count": np.array([count])}
        for q in DEFAULT_QUANTILES:
            stats[f"q{int(q * 100):02d}"] = stats["mean"].copy()
    else:
        rs = RunningQuantileStats()
        rs.update(reshaped)
        stats = rs.get_statistics()
        stats["count"] = np.array([count])
    out = {}
    for key, value in stats.items():
        if key == "count":
            out[key] = value
        elif image:
            out[key] = value.reshape(1, -1, 1, 1) if value.ndim == 1 else value
        elif array.ndim == 1:
            out[key] = value.reshape(1)
        else:
            out[key] = value
    return out


def image_stats(images: Mapping[str, np.ndarray]) -> dict[str, dict]:
    """Video features' stats: each episode's frames [N, H, W, C] uint8 sampled, channel-first, downsampled as
    LeRobot does, reduced per channel, divided by 255."""
    stats: dict[str, dict] = {}
    for key, frames in images.items():
        idx = sample_indices(len(frames))
        sampled = np.stack([_downsample(np.ascontiguousarray(frames[i].transpose(2, 0, 1))) for i in idx])
        s = get_feature_stats(sampled, image=True)
        stats[key] = {k: v if k == "count" else np.squeeze(v / 255.0, axis=0) for k, v in s.items()}
    return stats


def episode_stats(columns: Mapping[str, np.ndarray], images: Mapping[str, np.ndarray] | None = None,
                  images_done: Mapping[str, dict] | None = None) -> dict[str, dict]:
    """One episode's stats in LeRobot's order (cameras, then the columns): ``columns`` numeric feature -> [N] or
    [N, D]; the cameras' from ``images`` (:func:`image_stats`) or already computed (``images_done``)."""
    stats = dict(images_done) if images_done is not None else image_stats(images or {})
    for key, data in columns.items():
        stats[key] = get_feature_stats(np.asarray(data), image=False)
    return stats


def aggregate_stats(stats_list: Sequence[Mapping[str, Mapping[str, np.ndarray]]]) -> dict[str, dict]:
    """LeRobot's ``aggregate_stats``: the union of features, each aggregated over the episodes that have it."""
    keys = {k for s in stats_list for k in s}
    out: dict[str, dict] = {}
    for key in keys:
        fts = [s[key] for s in stats_list if key in s]
        means = np.stack([s["mean"] for s in fts])
        variances = np.stack([s["std"] ** 2 for s in fts])
        counts = np.stack([s["count"] for s in fts])
        total = counts.sum(axis=0)
        while counts.ndim < means.ndim:
            counts = np.expand_dims(counts, axis=-1)
        mean = (means * counts).sum(axis=0) / total
        var = ((variances + (means - mean) ** 2) * counts).sum(axis=0) / total
        agg = {"min": np.min(np.stack([s["min"] for s in fts]), axis=0),
               "max": np.max(np.stack([s["max"] for s in fts]), axis=0),
               "mean": mean, "std": np.sqrt(var), "count": total}
        for q in [k for k in fts[0] if k.startswith("q") and k[1:].isdigit()]:
            if all(q in s for s in fts):
                agg[q] = (np.stack([s[q] for s in fts]) * counts).sum(axis=0) / total
        out[key] = agg
    return out


def serialize_stats(stats: Mapping[str, Mapping[str, np.ndarray]]) -> dict:
    """Stats as JSON lists (LeRobot's ``serialize_dict``: arrays -> ``tolist()``)."""
    return {k: {s: np.asarray(v).tolist() for s, v in d.items()} for k, d in stats.items()}
