"""Write a uint8 video (T, H, W, 3) to GIF (Pillow) or MP4 (imageio's ffmpeg), atomically:
the file is read back before it replaces an earlier one, since ffmpeg can fail at its
trailer (a full disk) without imageio raising."""

from __future__ import annotations

import errno
from pathlib import Path

import imageio.v2 as imageio
import imageio_ffmpeg
import numpy as np
from PIL import Image

from edge.core.files import atomic_file

FORMATS = (".gif", ".mp4")
# H.264's largest frame side (level 6.2) and far beyond any screen: --scale is bounded by it
MAX_FRAME_SIDE = 8192


def check_scale(frame: tuple[int, int], scale: int) -> None:
    """A ValueError naming --scale when frames of (height, width) upscaled by `scale` would
    exceed MAX_FRAME_SIDE: refused before the generation, not after it."""
    height, width = frame
    most = max(1, MAX_FRAME_SIDE // max(height, width))
    if not 1 <= scale <= most:
        raise ValueError(f"--scale {scale}: frames of {height}x{width} upscaled x{scale} "
                         f"would be {height * scale}x{width * scale}; at most x{most} "
                         f"({MAX_FRAME_SIDE} pixels a side)")


def upscale(video: np.ndarray, factor: int) -> np.ndarray:
    """Nearest-neighbour upscaling: 32x32 frames are hard to see at their own size."""
    return video.repeat(factor, axis=1).repeat(factor, axis=2) if factor > 1 else video


def write_video(path: str | Path, video: np.ndarray, fps: int = 8, scale: int = 4) -> Path:
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"cannot write {path}: use a {' or '.join(FORMATS)} file name")
    if video.dtype != np.uint8 or video.ndim != 4 or video.shape[-1] != 3:
        raise ValueError(f"expected a uint8 video (T, H, W, 3), got {video.dtype} {video.shape}")
    check_scale(video.shape[1:3], scale)
    frames = (upscale(frame[None], scale)[0] for frame in video)  # one frame in memory at a time
    with atomic_file(path) as tmp:  # a full disk leaves the earlier video as it was
        if suffix == ".gif":
            _write_gif(tmp, frames, fps)
        else:
            # yuv420p needs even sides; macro_block_size=1 keeps our exact size
            imageio.mimwrite(tmp, list(frames), fps=fps, codec="libx264", quality=8,
                             macro_block_size=1, pixelformat="yuv420p")
        _check_reads_back(tmp, len(video))
    return path


def _write_gif(path: Path, frames, fps: int) -> None:
    """Through Pillow itself: imageio's Pillow plugin, when a write fails, writes again at
    garbage collection and prints a second traceback at exit."""
    first, *rest = (Image.fromarray(frame) for frame in frames)
    with open(path, "wb") as out:
        first.save(out, format="GIF", save_all=True, append_images=rest,
                   duration=1000 / fps, loop=0)


def _check_reads_back(path: Path, frames: int) -> None:
    """An OSError unless `path` decodes to `frames` frames."""
    try:
        if path.suffix.lower() == ".gif":
            with Image.open(path) as gif:
                found = gif.n_frames
        else:
            found, _ = imageio_ffmpeg.count_frames_and_secs(str(path))
    except (OSError, RuntimeError, ValueError) as err:
        raise OSError(errno.EIO, f"the written video does not read back: {_first_line(err)}"
                      "; is the disk full?") from err
    if found != frames:
        raise OSError(errno.EIO, f"the written video holds {found} of its {frames} frames; "
                      "is the disk full?")


def _first_line(err: BaseException) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(err).__name__
