"""oxygen_ros.ros.image_conversion: ROS image messages -> RGB arrays -> model input."""

from __future__ import annotations

import array

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("sensor_msgs.msg", reason="ROS 2 message packages (sensor_msgs) are not importable")

from builtin_interfaces.msg import Time  # noqa: E402
from sensor_msgs.msg import CompressedImage, Image  # noqa: E402

from oxygen_ros.ros.image_conversion import (  # noqa: E402
    SUPPORTED_ENCODINGS,
    ImageError,
    array_to_image_msg,
    compressed_msg_to_array,
    image_msg_to_array,
)

BPP = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1, "8UC1": 1, "mono16": 2, "16UC1": 2}


def rgb_image(h: int = 5, w: int = 7, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def make_msg(pixels: np.ndarray, encoding: str, pad: int = 0, bigendian: bool = False) -> Image:
    """An Image with ``pixels`` [H, W, C] (uint8 or uint16) stored row by row, each row followed by ``pad`` bytes."""
    h, w = pixels.shape[:2]
    if pixels.dtype == np.uint16:
        pixels = pixels.astype(">u2" if bigendian else "<u2")
    rows = pixels.reshape(h, -1).view(np.uint8)
    data = np.concatenate([rows, np.full((h, pad), 0xAB, np.uint8)], axis=1)
    msg = Image(height=h, width=w, encoding=encoding, is_bigendian=int(bigendian), step=data.shape[1])
    msg.data = array.array("B", data.tobytes())
    return msg


# --- decoding -------------------------------------------------------------------------------------------------

def test_round_trip_rgb8() -> None:
    rgb = rgb_image()
    msg = array_to_image_msg(rgb, Time(sec=3, nanosec=4), "cam")
    assert (msg.encoding, msg.height, msg.width, msg.step) == ("rgb8", 5, 7, 21)
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec, msg.header.frame_id) == (3, 4, "cam")
    out = image_msg_to_array(msg)
    assert out.dtype == np.uint8 and out.shape == (5, 7, 3) and out.flags.c_contiguous
    np.testing.assert_array_equal(out, rgb)


def test_output_does_not_alias_message() -> None:
    rgb = rgb_image()
    msg = array_to_image_msg(rgb)
    out = image_msg_to_array(msg)
    out[:] = 0
    np.testing.assert_array_equal(image_msg_to_array(msg), rgb)


def test_stamp_forms() -> None:
    rgb = rgb_image(2, 2)
    assert array_to_image_msg(rgb, 5_000_000_007).header.stamp == Time(sec=5, nanosec=7)
    assert array_to_image_msg(rgb).header.stamp == Time()
    with pytest.raises(TypeError):
        array_to_image_msg(rgb, "yesterday")
    with pytest.raises(ImageError):
        array_to_image_msg(rgb.astype(np.float32))


@pytest.mark.parametrize("pad", [0, 3])
def test_bgr_vs_rgb_order(pad: int) -> None:
    rgb = rgb_image()
    np.testing.assert_array_equal(image_msg_to_array(make_msg(rgb, "rgb8", pad)), rgb)
    np.testing.assert_array_equal(image_msg_to_array(make_msg(rgb[..., ::-1], "bgr8", pad)), rgb)
    # a pure red pixel stays red whichever way it is stored
    red = np.zeros((1, 1, 3), np.uint8)
    red[..., 0] = 255
    assert tuple(image_msg_to_array(make_msg(red[..., ::-1], "bgr8"))[0, 0]) == (255, 0, 0)


@pytest.mark.parametrize("pad", [0, 1])
def test_alpha_dropped(pad: int) -> None:
    rgb = rgb_image()
    alpha = np.full(rgb.shape[:2] + (1,), 17, np.uint8)
    np.testing.assert_array_equal(image_msg_to_array(make_msg(np.concatenate([rgb, alpha], 2), "rgba8", pad)), rgb)
    bgra = np.concatenate([rgb[..., ::-1], alpha], 2)
    np.testing.assert_array_equal(image_msg_to_array(make_msg(bgra, "bgra8", pad)), rgb)


@pytest.mark.parametrize("encoding", ["mono8", "8UC1"])
def test_mono8(encoding: str) -> None:
    grey = rgb_image()[..., :1]
    out = image_msg_to_array(make_msg(grey, encoding, pad=2))
    assert out.shape == (5, 7, 3)
    for c in range(3):
        np.testing.assert_array_equal(out[..., c], grey[..., 0])


@pytest.mark.parametrize("encoding", ["mono16", "16UC1"])
@pytest.mark.parametrize("bigendian", [False, True])
def test_mono16_scaled(encoding: str, bigendian: bool) -> None:
    wide = np.random.default_rng(1).integers(0, 65536, (4, 6, 1), dtype=np.uint16)
    out = image_msg_to_array(make_msg(wide, encoding, pad=2, bigendian=bigendian))
    np.testing.assert_array_equal(out, np.repeat((wide >> 8).astype(np.uint8), 3, axis=2))


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "mono8"])
def test_agrees_with_cv_bridge(encoding: str) -> None:
    """Same as the PyPI cv_bridge on unpadded rows (that port ignores ``step``, so padded rows break it)."""
    cv_bridge = pytest.importorskip("cv_bridge")
    pixels = rgb_image(6, 9, seed=2)[..., : BPP[encoding]]
    msg = make_msg(pixels, encoding)
    expected = cv_bridge.CvBridge().imgmsg_to_cv2(msg, desired_encoding="rgb8")
    np.testing.assert_array_equal(image_msg_to_array(msg), expected)


def test_rosbags_message_with_ndarray_data() -> None:
    """Messages deserialised by rosbags hold ``data`` as a numpy array; they decode the same way."""
    from rosbags.typesys import Stores, get_typestore

    types = get_typestore(Stores.ROS2_HUMBLE).types
    rgb = rgb_image()
    hdr = types["std_msgs/msg/Header"](stamp=types["builtin_interfaces/msg/Time"](sec=0, nanosec=0), frame_id="")
    msg = types["sensor_msgs/msg/Image"](header=hdr, height=5, width=7, encoding="bgr8", is_bigendian=0, step=21,
                                         data=np.ascontiguousarray(rgb[..., ::-1]).reshape(-1))
    np.testing.assert_array_equal(image_msg_to_array(msg), rgb)


# --- invalid messages -----------------------------------------------------------------------------------------

def test_truncated_data() -> None:
    msg = make_msg(rgb_image(), "rgb8")
    msg.data = msg.data[:-1]
    with pytest.raises(ImageError, match="truncated"):
        image_msg_to_array(msg)


def test_empty_data() -> None:
    msg = make_msg(rgb_image(), "rgb8")
    msg.data = array.array("B")
    with pytest.raises(ImageError, match="truncated"):
        image_msg_to_array(msg)


def test_oversized_data() -> None:
    msg = make_msg(rgb_image(), "rgb8")
    msg.data.extend(b"\0" * 5)
    with pytest.raises(ImageError, match="oversized"):
        image_msg_to_array(msg)


def test_step_too_small() -> None:
    msg = make_msg(rgb_image(), "rgb8")
    msg.step = 20  # width 7 * 3 = 21 bytes per row
    msg.data = msg.data[: 20 * 5]
    with pytest.raises(ImageError, match="step 20"):
        image_msg_to_array(msg)


def test_wrong_step_for_data() -> None:
    msg = make_msg(rgb_image(), "rgb8")
    msg.step = 24  # claims padded rows, but the data is not
    with pytest.raises(ImageError, match="truncated"):
        image_msg_to_array(msg)


@pytest.mark.parametrize("encoding", ["yuv422", "32FC1", "", "RGB8", "bayer_rggb8"])
def test_unknown_encoding(encoding: str) -> None:
    msg = make_msg(rgb_image(), "rgb8")
    msg.encoding = encoding
    with pytest.raises(ImageError, match="unsupported image encoding"):
        image_msg_to_array(msg)


@pytest.mark.parametrize(("h", "w"), [(0, 7), (5, 0), (0, 0)])
def test_zero_size(h: int, w: int) -> None:
    msg = Image(height=h, width=w, encoding="rgb8", step=w * 3)
    with pytest.raises(ImageError, match="zero size"):
        image_msg_to_array(msg)


def test_image_error_is_value_error() -> None:
    assert issubclass(ImageError, ValueError)


@st.composite
def image_fields(draw) -> dict:
    """Image fields that are sometimes valid, sometimes subtly wrong and sometimes arbitrary."""
    encoding = draw(st.one_of(st.sampled_from(SUPPORTED_ENCODINGS), st.text(max_size=12)))
    if draw(st.booleans()):  # near-valid: sizes consistent up to small perturbations
        h, w = draw(st.integers(0, 12)), draw(st.integers(0, 12))
        step = w * BPP.get(encoding, 3) + draw(st.integers(-2, 3))
        n = max(0, step * h + draw(st.sampled_from([0, 0, 0, -1, 1, -7])))
        data = draw(st.binary(min_size=n, max_size=n))
    else:  # arbitrary field values (within the message's type ranges)
        h, w = draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 2**32 - 1))
        step = draw(st.integers(0, 2**32 - 1))
        data = draw(st.binary(max_size=512))
    return {"height": h, "width": w, "step": max(0, step), "encoding": encoding,
            "is_bigendian": draw(st.integers(0, 255)), "data": data}


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(image_fields())
def test_arbitrary_fields_convert_or_raise_image_error(fields: dict) -> None:
    msg = Image(height=fields["height"], width=fields["width"], step=fields["step"], encoding=fields["encoding"],
                is_bigendian=fields["is_bigendian"])
    msg.data = array.array("B", fields["data"])
    try:
        out = image_msg_to_array(msg)
    except ImageError:
        return
    assert out.shape == (fields["height"], fields["width"], 3) and out.dtype == np.uint8


# --- compressed images ----------------------------------------------------------------------------------------

def compressed(rgb: np.ndarray, ext: str, fmt: str) -> CompressedImage:
    ok, buf = cv2.imencode(ext, cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    assert ok
    msg = CompressedImage(format=fmt)
    msg.data = array.array("B", buf.tobytes())
    return msg


def test_compressed_png_exact() -> None:
    rgb = rgb_image(20, 30)
    np.testing.assert_array_equal(compressed_msg_to_array(compressed(rgb, ".png", "png")), rgb)


def test_compressed_jpeg_close() -> None:
    y, x = np.mgrid[0:48, 0:64]
    rgb = np.stack([x * 4, y * 5, np.full_like(x, 200)], axis=2).astype(np.uint8)  # smooth: jpeg-friendly
    out = compressed_msg_to_array(compressed(rgb, ".jpg", "rgb8; jpeg compressed bgr8"))
    assert out.shape == rgb.shape and out.dtype == np.uint8
    assert np.abs(out.astype(int) - rgb).mean() < 4  # channel order right (a swap would be off by ~100)


@pytest.mark.parametrize("payload", [b"", b"\xff\xd8\xff garbage", bytes(range(256))])
def test_compressed_undecodable(payload: bytes) -> None:
    msg = CompressedImage(format="jpeg")
    msg.data = array.array("B", payload)
    with pytest.raises(ImageError):
        compressed_msg_to_array(msg)
