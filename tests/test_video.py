import imageio.v2 as imageio
import numpy as np
import pytest

from edge.core.video import write_video


@pytest.mark.parametrize("name", ["clip.gif", "clip.mp4"])
def test_written_video_reads_back(tmp_path, name):
    video = np.zeros((16, 32, 32, 3), np.uint8)
    for t in range(16):  # moving: GIF writers merge identical consecutive frames
        video[t, 8:16, 8 + t:16 + t, 0] = 255
    path = write_video(tmp_path / name, video, scale=2)
    frames = imageio.mimread(path)
    assert len(frames) == 16 and frames[0].shape[:2] == (64, 64)
    assert np.asarray(frames[0])[20, 20, 0] > 200 and np.asarray(frames[0])[50, 50, 0] < 40


def test_refuses_unknown_format(tmp_path):
    with pytest.raises(ValueError, match=r"\.gif or \.mp4"):
        write_video(tmp_path / "clip.avi", np.zeros((2, 4, 4, 3), np.uint8))
