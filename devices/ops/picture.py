"""Pictures as DVPP lays them out in memory, and the pixel arithmetic of its engines (pure numpy).

A picture is ``(format, width, height, width_stride, height_stride)`` (:class:`Pic`): the pixels are the
top-left ``width x height`` of a ``width_stride x height_stride`` canvas (CANN's acldvppPicDesc).  Layouts:

- YUV420SP (``PIXEL_FORMAT_YUV_SEMIPLANAR_420`` = NV12, U first; ``PIXEL_FORMAT_YVU_SEMIPLANAR_420`` = NV21):
  a Y plane of ``height_stride`` rows of ``width_stride`` bytes, then an interleaved chroma plane of
  ``height_stride / 2`` rows; chroma is sampled once per 2x2 pixels (``ceil(w/2) x ceil(h/2)`` samples).
  Buffer: ``width_stride * height_stride * 3 / 2`` bytes.
- YUV400: the Y plane only.
- RGB888 / BGR888 (packed): ``height_stride`` rows of ``width_stride`` BYTES (>= 3 * width, as CANN counts
  the stride of packed formats in bytes); RGBA8888 / BGRA8888 likewise with 4 bytes per pixel.

Colour: full-range BT.601 (the JFIF equations a JPEG is coded in), so a decoded JPEG's YUV converts to the
RGB an ordinary decoder gives.  Resizing is bilinear with pixel centres at half-pixel offsets (the
OpenCV / Pillow-upscale convention), or nearest-neighbour.  Nothing here blocks or touches device memory.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# acldvppPixelFormat (acl/ops/acl_dvpp.h; the public samples' constants.py repeats them)
PIXEL_FORMAT_YUV_400 = 0
PIXEL_FORMAT_YUV_SEMIPLANAR_420 = 1
PIXEL_FORMAT_YVU_SEMIPLANAR_420 = 2
PIXEL_FORMAT_RGB_888 = 12
PIXEL_FORMAT_BGR_888 = 13
PIXEL_FORMAT_RGBA_8888 = 16
PIXEL_FORMAT_BGRA_8888 = 17

YUV420SP = (PIXEL_FORMAT_YUV_SEMIPLANAR_420, PIXEL_FORMAT_YVU_SEMIPLANAR_420)
#: packed formats -> (bytes per pixel, channel order)
PACKED = {PIXEL_FORMAT_RGB_888: (3, "RGB"), PIXEL_FORMAT_BGR_888: (3, "BGR"),
          PIXEL_FORMAT_RGBA_8888: (4, "RGBA"), PIXEL_FORMAT_BGRA_8888: (4, "BGRA")}
FORMATS = (PIXEL_FORMAT_YUV_400,) + YUV420SP + tuple(PACKED)

# acldvppResizeConfig interpolation (acldvppSetResizeConfigInterpolation): 0 default (bilinear), 1 bilinear,
# 2 nearest neighbour
INTERP_DEFAULT, INTERP_BILINEAR, INTERP_NEAREST = 0, 1, 2


@dataclass(frozen=True)
class Pic:
    """Where a picture's pixels are in its buffer."""
    format: int
    width: int
    height: int
    width_stride: int
    height_stride: int

    @property
    def buffer_size(self) -> int:
        """Bytes the layout spans."""
        plane = self.width_stride * self.height_stride
        if self.format in YUV420SP:
            return plane * 3 // 2
        return plane

    @property
    def pixels(self) -> int:
        return self.width * self.height


def chroma(n: int) -> int:
    """Chroma samples along a side of ``n`` pixels (4:2:0)."""
    return (n + 1) // 2


# ---------------------------------------------------------------------------------------------- layouts
def read_yuv(buf: np.ndarray, p: Pic) -> tuple[np.ndarray, np.ndarray]:
    """(Y ``h x w``, UV ``ceil(h/2) x ceil(w/2) x 2`` in U, V order) copied out of a YUV420SP buffer."""
    ws, hs = p.width_stride, p.height_stride
    y = buf[:ws * hs].reshape(hs, ws)[:p.height, :p.width].copy()
    uv = buf[ws * hs:ws * hs * 3 // 2].reshape(hs // 2, ws // 2, 2)[:chroma(p.height), :chroma(p.width)].copy()
    if p.format == PIXEL_FORMAT_YVU_SEMIPLANAR_420:
        uv = uv[:, :, ::-1]
    return y, uv


def write_yuv(buf: np.ndarray, p: Pic, y: np.ndarray, uv: np.ndarray, x0: int = 0, y0: int = 0) -> None:
    """Write Y / UV (U, V order) into a YUV420SP buffer with their top-left at pixel (``x0``, ``y0``), both
    even; the rest of the buffer keeps its bytes."""
    ws, hs = p.width_stride, p.height_stride
    h, w = y.shape
    buf[:ws * hs].reshape(hs, ws)[y0:y0 + h, x0:x0 + w] = y
    if p.format == PIXEL_FORMAT_YVU_SEMIPLANAR_420:
        uv = uv[:, :, ::-1]
    ch, cw = uv.shape[:2]
    buf[ws * hs:ws * hs * 3 // 2].reshape(hs // 2, ws // 2, 2)[y0 // 2:y0 // 2 + ch, x0 // 2:x0 // 2 + cw] = uv


def read_packed(buf: np.ndarray, p: Pic) -> np.ndarray:
    """``h x w x bpp`` pixels of a packed buffer, in the buffer's channel order."""
    bpp = PACKED[p.format][0]
    rows = buf[:p.width_stride * p.height_stride].reshape(p.height_stride, p.width_stride)
    return rows[:p.height, :p.width * bpp].reshape(p.height, p.width, bpp).copy()


def write_packed(buf: np.ndarray, p: Pic, px: np.ndarray) -> None:
    bpp = PACKED[p.format][0]
    rows = buf[:p.width_stride * p.height_stride].reshape(p.height_stride, p.width_stride)
    rows[:p.height, :p.width * bpp] = px.reshape(p.height, p.width * bpp)


# ---------------------------------------------------------------------------------------------- colour
def rgb_to_yuv420(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Full-range BT.601 (JFIF): ``h x w x 3`` RGB -> (Y, UV) with chroma averaged over 2x2 pixels."""
    f = rgb.astype(np.float64)
    r, g, b = f[..., 0], f[..., 1], f[..., 2]
    y = 0.299 * r + 0.587 * g + 0.114 * b
    u = -0.168736 * r - 0.331264 * g + 0.5 * b + 128.0
    v = 0.5 * r - 0.418688 * g - 0.081312 * b + 128.0
    uv = np.stack([_pool2(u), _pool2(v)], axis=-1)
    return _u8(y), _u8(uv)


def yuv420_to_rgb(y: np.ndarray, uv: np.ndarray) -> np.ndarray:
    """Full-range BT.601 (JFIF): (Y, UV) -> ``h x w x 3`` RGB, each chroma sample covering its 2x2 pixels."""
    h, w = y.shape
    up = uv.repeat(2, axis=0).repeat(2, axis=1)[:h, :w].astype(np.float64) - 128.0
    yf = y.astype(np.float64)
    u, v = up[..., 0], up[..., 1]
    rgb = np.stack([yf + 1.402 * v, yf - 0.344136 * u - 0.714136 * v, yf + 1.772 * u], axis=-1)
    return _u8(rgb)


def _pool2(a: np.ndarray) -> np.ndarray:
    """Mean over 2x2 blocks (an odd edge averages what it has)."""
    h, w = a.shape
    p = np.pad(a, ((0, h % 2), (0, w % 2)), mode="edge")
    return (p[0::2, 0::2] + p[1::2, 0::2] + p[0::2, 1::2] + p[1::2, 1::2]) / 4.0


def _u8(a: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(a), 0, 255).astype(np.uint8)


# ---------------------------------------------------------------------------------------------- resize
def resize(img: np.ndarray, oh: int, ow: int, interp: int = INTERP_BILINEAR) -> np.ndarray:
    """``img`` (``h x w`` or ``h x w x c``, uint8) resized to ``oh x ow``: bilinear with half-pixel centres
    and edge clamping, or nearest neighbour (``INTERP_NEAREST``)."""
    h, w = img.shape[:2]
    if (h, w) == (oh, ow):
        return img.copy()
    if interp == INTERP_NEAREST:
        ys = np.minimum((np.arange(oh) * h) // oh, h - 1)
        xs = np.minimum((np.arange(ow) * w) // ow, w - 1)
        return img[ys][:, xs].copy()
    y0, y1, fy = _taps(h, oh)
    x0, x1, fx = _taps(w, ow)
    f = img.astype(np.float64)
    if f.ndim == 3:
        fy, fx = fy[:, None, None], fx[None, :, None]
    else:
        fy, fx = fy[:, None], fx[None, :]
    top = f[y0][:, x0] * (1 - fx) + f[y0][:, x1] * fx
    bot = f[y1][:, x0] * (1 - fx) + f[y1][:, x1] * fx
    return _u8(top * (1 - fy) + bot * fy)


def _taps(n: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Source indices and weights of ``m`` outputs over ``n`` inputs (half-pixel centres, clamped)."""
    src = np.clip((np.arange(m) + 0.5) * (n / m) - 0.5, 0, n - 1)
    i0 = np.floor(src).astype(np.int64)
    i1 = np.minimum(i0 + 1, n - 1)
    return i0, i1, src - i0
