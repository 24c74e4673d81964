"""Write a uint8 video (T, H, W, 3) to GIF or MP4 through imageio, atomically."""

from __future__ import annotations

from pathlib import Path

import imageio.v2 as imageio
import numpy as np

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
            imageio.mimwrite(tmp, list(frames), duration=1000 / fps, loop=0)
        else:
            # yuv420p needs even sides; macro_block_size=1 keeps our exact size
            imageio.mimwrite(tmp, list(frames), fps=fps, codec="libx264", quality=8,
                             macro_block_size=1, pixelformat="yuv420p")
    return path
