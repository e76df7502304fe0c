"""Episodes -> a LeRobotDataset v3.0 folder, laid out as LeRobot 0.6.1 writes it (``lerobot/datasets/``:
``dataset_writer.py``, ``dataset_metadata.py``, ``video_utils.py``, ``io_utils.py``), without LeRobot:

- ``meta/info.json`` (``codebase_version`` v3.0, fps, features with ``video.*`` info probed from the first video),
  ``meta/stats.json`` (:mod:`.stats`), ``meta/tasks.parquet`` (index ``task``, column ``task_index``, as pandas
  writes it), ``meta/episodes/chunk-000/file-000.parquet`` (one row per episode: tasks, length, data and video
  file indices, from/to indices and timestamps, ``stats/<feature>/<stat>``);
- ``data/chunk-000/file-000.parquet``: every frame (features in order, fixed-size lists, the two language
  columns);
- ``videos/<key>/chunk-CCC/file-FFF.mp4``: one file per episode and camera (LeRobot starts a new file when one
  grows past its size limit; one per episode is that layout with a zero limit), encoded with PyAV as LeRobot's
  ``encode_video_frames`` encodes (codec, ``pix_fmt``, ``g``, ``crf``, ``preset``).

Written into a temporary sibling folder and renamed onto ``out`` at the end: nothing is half-written.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..util.sched import NormalPriority
from .contract import VideoSettings
from .episode import Episode
from .stats import aggregate_stats, episode_stats, serialize_stats

__all__ = ["CHUNKS_SIZE", "CODEBASE_VERSION", "encode_video", "pick_codec", "write_dataset"]

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
LIBSVTAV1_DEFAULT_PRESET = 12  # lerobot.configs.video


def _json_type() -> pa.DataType:
    return pa.json_() if hasattr(pa, "json_") else pa.string()


def persistent_type() -> pa.DataType:
    """``language_persistent``: list<struct<role, content, style, timestamp float32, camera, tool_calls>>."""
    return pa.list_(pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string()),
                               pa.field("style", pa.string()), pa.field("timestamp", pa.float32()),
                               pa.field("camera", pa.string()), pa.field("tool_calls", pa.list_(pa.string()))]))


def events_type() -> pa.DataType:
    """``language_events``: list<struct<role, content, style, camera, tool_calls>> (no timestamp)."""
    return pa.list_(pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string()),
                               pa.field("style", pa.string()), pa.field("camera", pa.string()),
                               pa.field("tool_calls", pa.list_(pa.string()))]))


def pick_codec(settings: VideoSettings) -> str:
    """``auto`` -> libsvtav1 (LeRobot's default) when this PyAV can encode it, else h264."""
    import av

    if settings.codec != "auto":
        return settings.codec
    for name in ("libsvtav1", "h264", "libx264"):
        try:
            av.codec.Codec(name, "w")
            return name
        except Exception:  # not in this FFmpeg build
            continue
    raise RuntimeError("PyAV has neither libsvtav1 nor h264 encoders")


def codec_options(codec: str, s: VideoSettings) -> dict[str, str]:
    """LeRobot's ``VideoEncoderConfig.get_codec_options`` (``as_strings``) for the codecs used here."""
    opts = {"g": str(s.g)}
    preset = s.preset if s.preset is not None or codec != "libsvtav1" else LIBSVTAV1_DEFAULT_PRESET
    if codec in ("libsvtav1", "h264", "libx264", "hevc", "libaom-av1"):
        opts["crf"] = str(s.crf)
        if preset is not None:
            opts["preset"] = str(preset)
    return opts


def encode_video(frames: np.ndarray, path: Path, fps: int, codec: str, s: VideoSettings) -> None:
    """[N, H, W, 3] uint8 -> ``path`` (mp4) with PyAV, frame by frame as LeRobot's ``encode_video_frames``.

    Run as root, SVT-AV1 raises the caller and its encoder threads to SCHED_FIFO 99. ``NormalPriority`` puts
    them back once the first frame has opened the encoder, and the caller's own policy at the end: an export
    never outranks a robot's controllers or leaves its process real-time."""
    import av

    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its banner per stream on stderr: errors only
    path.parent.mkdir(parents=True, exist_ok=True)
    with NormalPriority() as priority, av.open(str(path), "w") as out:
        stream = out.add_stream(codec, fps, options=codec_options(codec, s))
        stream.pix_fmt = s.pix_fmt
        stream.height, stream.width = int(frames.shape[1]), int(frames.shape[2])
        for i, img in enumerate(frames):
            packets = stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24"))
            if i == 0:
                priority.restore()  # the first call opens the encoder and starts its threads
            for packet in packets:
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def _video_info(path: Path, codec_settings: VideoSettings) -> tuple[dict[str, Any], float]:
    """LeRobot's ``get_video_info`` (stream-derived keys, then the encoder's fields) and the duration in seconds."""
    import av

    with av.open(str(path)) as f:
        vs = f.streams.video[0]
        info: dict[str, Any] = {"video.height": vs.height, "video.width": vs.width,
                                "video.codec": vs.codec.canonical_name, "video.pix_fmt": vs.pix_fmt,
                                "video.fps": int(vs.base_rate), "video.channels": 3}
        has_audio = bool(f.streams.audio)
        duration = float(vs.duration * vs.time_base) if vs.duration is not None else float(f.duration / av.time_base)
    info["has_audio"] = has_audio
    preset = codec_settings.preset
    if preset is None and info["video.codec"] == "av1":
        preset = LIBSVTAV1_DEFAULT_PRESET
    for name, value in (("pix_fmt", codec_settings.pix_fmt), ("g", codec_settings.g), ("crf", codec_settings.crf),
                        ("preset", preset), ("fast_decode", 0), ("video_backend", "pyav"), ("extra_options", {})):
        info.setdefault(f"video.{name}", value)
    info["is_depth_map"] = False
    return info, duration


def _file_indices(n: int) -> tuple[int, int]:
    return divmod(n, CHUNKS_SIZE)


def features_of(ep: Episode, fps: int, video_info: dict[str, dict] | None = None) -> dict[str, dict]:
    """info.json ``features``: cameras (video), state, action, the language columns, then LeRobot's defaults."""
    feats: dict[str, dict] = {}
    for key, shape in ep.camera_shapes().items():
        feats[key] = {"dtype": "video", "shape": list(shape), "names": ["height", "width", "channels"]}
        if video_info and key in video_info:
            feats[key]["info"] = video_info[key]
    feats["observation.state"] = {"dtype": "float32", "shape": [ep.state.shape[1]], "names": list(ep.state_names)}
    feats["action"] = {"dtype": "float32", "shape": [ep.action.shape[1]], "names": list(ep.action_names)}
    feats["language_persistent"] = {"dtype": "language", "shape": [1], "names": None}
    feats["language_events"] = {"dtype": "language", "shape": [1], "names": None}
    for name, dt in (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
                     ("index", "int64"), ("task_index", "int64")):
        feats[name] = {"dtype": dt, "shape": [1], "names": None}
    return feats


def _check_same(episodes: Sequence[Episode]) -> None:
    first = episodes[0]
    for ep in episodes[1:]:
        for what, a, b in (("state names", ep.state_names, first.state_names),
                           ("action names", ep.action_names, first.action_names),
                           ("cameras", ep.camera_shapes(), first.camera_shapes())):
            if a != b:
                raise ValueError(f"{ep.bag}: {what} {a} differ from the first episode's {b}")


def write_dataset(episodes: Sequence[Episode], out: Path | str, fps: int, robot_type: str,
                  video: VideoSettings, videos_done: Sequence[dict[str, Path]] | None = None) -> dict[str, Any]:
    """Write ``episodes`` (in order: episode_index 0..) as a LeRobotDataset at ``out`` (which must not exist).

    ``videos_done``: per episode, camera key -> an mp4 already encoded (by a fleet worker); else encoded here.
    Returns a summary (frames, episodes, codec, files).
    """
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists; choose a new folder")
    if not episodes:
        raise ValueError("no episode to write")
    _check_same(episodes)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        summary = _write(episodes, tmp, fps, robot_type, video, videos_done)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def _write(episodes: Sequence[Episode], root: Path, fps: int, robot_type: str, video: VideoSettings,
           videos_done: Sequence[dict[str, Path]] | None) -> dict[str, Any]:
    codec = pick_codec(video)
    tasks: dict[str, int] = {}
    frames_total = 0
    ep_rows: list[dict[str, Any]] = []
    all_stats: list[dict] = []
    tables: list[pa.Table] = []
    video_info: dict[str, dict] = {}
    for e, ep in enumerate(episodes):
        n = ep.length
        for t in ep.tasks:
            tasks.setdefault(t, len(tasks))
        columns = {
            "observation.state": ep.state.astype(np.float32), "action": ep.action.astype(np.float32),
            # float64 as LeRobot's buffer holds them (frame_index / fps): its stats are of these; stored float32
            "timestamp": np.array([k / fps for k in range(n)]), "frame_index": np.arange(n, dtype=np.int64),
            "episode_index": np.full(n, e, dtype=np.int64),
            "index": np.arange(frames_total, frames_total + n, dtype=np.int64),
            "task_index": np.array([tasks[t] for t in ep.tasks], dtype=np.int64),
        }
        stats = episode_stats(columns, ep.images, ep.image_stats)  # cameras first, as LeRobot orders them
        all_stats.append(stats)
        tables.append(_frame_table(ep, columns))
        row: dict[str, Any] = {"episode_index": e, "tasks": list(dict.fromkeys(ep.tasks)), "length": n,
                               "data/chunk_index": 0, "data/file_index": 0, "dataset_from_index": frames_total,
                               "dataset_to_index": frames_total + n}
        for key in ep.camera_shapes():
            chunk, file = _file_indices(e)
            path = root / VIDEO_PATH.format(video_key=key, chunk_index=chunk, file_index=file)
            done = videos_done[e].get(key) if videos_done else None
            if done is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(done), path)
            else:
                encode_video(ep.images[key], path, fps, codec, video)
            info, duration = _video_info(path, video)
            video_info.setdefault(key, info)
            row.update({f"videos/{key}/chunk_index": chunk, f"videos/{key}/file_index": file,
                        f"videos/{key}/from_timestamp": 0.0, f"videos/{key}/to_timestamp": duration})
        for feat, st in stats.items():
            for name, value in st.items():
                row[f"stats/{feat}/{name}"] = np.asarray(value).tolist()
        row["meta/episodes/chunk_index"], row["meta/episodes/file_index"] = 0, 0
        ep_rows.append(row)
        frames_total += n

    features = features_of(episodes[0], fps, video_info)
    data_path = root / DATA_PATH.format(chunk_index=0, file_index=0)
    data_path.parent.mkdir(parents=True)
    table = pa.concat_tables(tables)
    table = table.replace_schema_metadata({"huggingface": json.dumps(_hf_metadata(features))})
    pq.write_table(table, data_path, compression="snappy", use_dictionary=True)

    ep_path = root / EPISODES_PATH.format(chunk_index=0, file_index=0)
    ep_path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(ep_rows), ep_path, compression="snappy", use_dictionary=True)
    _write_tasks(root, tasks)
    info = {"codebase_version": CODEBASE_VERSION, "fps": fps, "features": features,
            "total_episodes": len(episodes), "total_frames": frames_total, "total_tasks": len(tasks),
            "chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH, "robot_type": robot_type, "splits": {"train": f"0:{len(episodes)}"}}
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4, ensure_ascii=False))
    (root / "meta" / "stats.json").write_text(json.dumps(serialize_stats(aggregate_stats(all_stats)), indent=4))
    return {"episodes": len(episodes), "frames": frames_total, "tasks": len(tasks), "codec": codec}


def _frame_table(ep: Episode, columns: dict[str, np.ndarray]) -> pa.Table:
    n = ep.length
    arrays: dict[str, pa.Array] = {}
    for key in ("observation.state", "action"):
        v = columns[key]
        arrays[key] = pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1), pa.float32()), v.shape[1])
    arrays["timestamp"] = pa.array(columns["timestamp"], pa.float32())
    for key in ("frame_index", "episode_index", "index", "task_index"):
        arrays[key] = pa.array(columns[key], pa.int64())
    # the language columns last, as LeRobot's annotation writer appends them
    persistent = [{k: r[k] for k in ("role", "content", "style", "timestamp", "camera", "tool_calls")}
                  for r in ep.persistent]
    arrays["language_persistent"] = pa.array([persistent] * n, type=persistent_type())
    arrays["language_events"] = pa.array([ep.events.get(k, []) for k in range(n)], type=events_type())
    return pa.table(arrays)


def _hf_metadata(features: dict[str, dict]) -> dict[str, Any]:
    """The ``huggingface`` schema metadata ``datasets`` writes (its Features as JSON)."""
    def value(dt: str) -> dict:
        return {"dtype": dt, "_type": "Value"}

    def row(with_ts: bool) -> dict:
        d = {"role": value("string"), "content": value("string"), "style": value("string")}
        if with_ts:
            d["timestamp"] = value("float32")
        d.update({"camera": value("string"), "tool_calls": {"feature": {"_type": "Json"}, "_type": "List"}})
        return d

    out: dict[str, Any] = {}
    for key, ft in features.items():
        if ft["dtype"] == "video":
            continue
        if key == "language_persistent":
            out[key] = {"feature": row(True), "_type": "List"}
        elif key == "language_events":
            out[key] = {"feature": row(False), "_type": "List"}
        elif ft["shape"] == [1]:
            out[key] = value(ft["dtype"])
        else:
            out[key] = {"feature": value(ft["dtype"]), "length": ft["shape"][0], "_type": "List"}
    return {"info": {"features": out}}


def _write_tasks(root: Path, tasks: dict[str, int]) -> None:
    """meta/tasks.parquet as pandas writes ``DataFrame({"task_index": ...}, index=Index(tasks, name="task"))``."""
    table = pa.table({"task_index": pa.array(list(tasks.values()), pa.int64()),
                      "task": pa.array(list(tasks), pa.string())})
    pandas_meta = {"index_columns": ["task"], "column_indexes": [{"name": None, "field_name": None,
                   "pandas_type": "unicode", "numpy_type": "object", "metadata": {"encoding": "UTF-8"}}],
                   "columns": [{"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
                                "numpy_type": "int64", "metadata": None},
                               {"name": "task", "field_name": "task", "pandas_type": "unicode",
                                "numpy_type": "object", "metadata": None}],
                   "attributes": {}, "creator": {"library": "pyarrow", "version": pa.__version__},
                   "pandas_version": "2.3.3"}
    table = table.replace_schema_metadata({"pandas": json.dumps(pandas_meta)})
    pq.write_table(table, root / "meta" / "tasks.parquet")
