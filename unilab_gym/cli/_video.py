"""Write rendered frames to a video file: the one video writer of the command-line tools."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt


def write_video(path: Path, frames: Sequence[np.ndarray], fps: float) -> None:
    """Write ``frames`` to ``path``, creating its folder.

    Args:
        path: ``.gif`` (looping, needs only Pillow) or a video file such as ``.mp4`` (needs
            ``imageio-ffmpeg``).
        frames: ``(H, W, 3)`` uint8 images, in order.
        fps: frames per second (a GIF stores ``1000 / fps`` ms per frame).
    """
    import imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    images: list[npt.ArrayLike] = [np.asarray(frame) for frame in frames]
    if path.suffix == ".gif":
        imageio.mimsave(path, images, duration=1000 / fps, loop=0)
    else:
        imageio.mimsave(path, images, fps=fps)
