"""Offline OCR data for the PP-OCR models of the pinned `rapidocr-onnxruntime==1.4.4` wheel (issue 30, part 8).

Rendered with PIL and matplotlib's bundled DejaVu fonts, deterministic from a seed, preprocessed as rapidocr does:

* `text_pages(n, seed)`: text pages for the PP-OCRv4 detector (`ch_PP-OCRv4_det_infer.onnx`): a white-ish page
  (paper tint, a soft shading gradient, a little noise) with several lines of words in varying fonts, sizes, ink
  and positions, sometimes a thin ruled line; [n, 3, 320, 640] float32 NCHW. rapidocr's `DetPreProcess` reads the
  image as OpenCV does (BGR), resizes it to a multiple of 32 (320×640 already is) and normalizes each channel with
  mean 0.5 and std 0.5 on the 0..1 scale: `(x/255 - 0.5)/0.5`, then HWC -> CHW.
* `text_strips(n, seed)`: single-line text crops for the direction classifier (`ch_ppocr_mobile_v2.0_cls_infer
  .onnx`), every second one (odd index) rotated 180°; returns ([n, 3, 48, 192] float32, labels 0 = upright /
  1 = '180'). rapidocr's `TextClassifier.resize_norm_img`: resize to height 48 keeping the aspect ratio, width
  min(ceil(48·w/h), 192) (bilinear; cv2.resize there, PIL's bilinear here), `(x/255 - 0.5)/0.5`, CHW, zero padding
  on the right up to width 192.

`model_path(name)` finds a model file in the installed wheel without importing the package (its __init__ wants
opencv); None when the wheel is absent.
"""
from __future__ import annotations

import importlib.util
import math
import os

import numpy as np

DET_MODEL = "ch_PP-OCRv4_det_infer.onnx"
CLS_MODEL = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
PAGE_HW = (320, 640)                    # det input H x W (multiples of 32, as DetPreProcess makes them)
STRIP_CHW = (3, 48, 192)                # rapidocr config.yaml Cls.cls_image_shape

FONTS = ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSerif.ttf",
         "DejaVuSerif-Bold.ttf", "DejaVuSerif-Italic.ttf", "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf")

WORDS = ("the", "of", "and", "invoice", "total", "amount", "date", "number", "customer", "order", "shipping",
         "address", "payment", "due", "account", "balance", "quantity", "price", "description", "item", "tax",
         "subtotal", "receipt", "reference", "contact", "phone", "email", "street", "city", "country", "report",
         "summary", "section", "chapter", "figure", "table", "page", "notes", "meeting", "agenda", "project",
         "schedule", "delivery", "warehouse", "product", "service", "discount", "signature", "approved",
         "Monday", "Friday", "January", "October", "Station", "Central", "North", "Market", "Bank", "Hotel",
         "OPEN", "EXIT", "SALE", "TOTAL", "NO.", "Tel:", "Fax:", "ID", "Ref", "Qty", "EUR", "USD", "kg", "km/h",
         "2024", "15:30", "No. 42", "12.50", "1,280.00", "#0817", "A-113", "3/4", "99%", "(ok)", "v2.0")


def model_path(name: str) -> str | None:
    """The path of `name` in the installed rapidocr_onnxruntime wheel's models/ folder, found without importing
    the package; None when the wheel (or the file) is absent."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "models", name)
    return path if os.path.isfile(path) else None


def _fonts_dir() -> str:
    import matplotlib
    return os.path.join(matplotlib.get_data_path(), "fonts", "ttf")


_FONT_CACHE: dict[tuple[str, int], object] = {}


def _font(name: str, size: int):
    from PIL import ImageFont
    key = (name, size)
    if key not in _FONT_CACHE:
        _FONT_CACHE[key] = ImageFont.truetype(os.path.join(_fonts_dir(), name), size)
    return _FONT_CACHE[key]


def _phrase(rng: np.random.Generator, lo: int, hi: int) -> str:
    return " ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), int(rng.integers(lo, hi + 1))))


def _paper(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A white-ish page [h, w, 3] float: a paper tint, a soft linear shading and a little sensor noise."""
    tint = rng.uniform(228, 252) + rng.uniform(-6, 4, 3)
    gy, gx = np.mgrid[0:h, 0:w].astype(np.float32)
    ang = rng.uniform(0, 2 * np.pi)
    shade = (np.cos(ang) * gx / w + np.sin(ang) * gy / h) * rng.uniform(0, 14)
    img = tint[None, None, :] - shade[..., None] + rng.normal(0, 2.0, (h, w, 3))
    return img


def _ink(rng: np.random.Generator) -> tuple[int, int, int]:
    """A dark ink: near black, or dark blue / red / grey."""
    base = rng.uniform(0, 70)
    tone = rng.choice(4)
    c = np.full(3, base)
    if tone == 1:
        c[2] += rng.uniform(40, 90)       # blue (RGB)
    elif tone == 2:
        c[0] += rng.uniform(50, 100)      # red
    return tuple(int(v) for v in np.clip(c, 0, 255))


def _to_bgr_norm(rgb: np.ndarray) -> np.ndarray:
    """uint8 RGB [H, W, 3] -> float32 CHW as rapidocr feeds its models: OpenCV's BGR order, (x/255 - 0.5)/0.5."""
    bgr = rgb[..., ::-1].astype(np.float32)
    return ((bgr / 255.0 - 0.5) / 0.5).transpose(2, 0, 1).astype(np.float32)


def render_page(rng: np.random.Generator, hw: tuple[int, int] = PAGE_HW) -> np.ndarray:
    """One text page, uint8 RGB [H, W, 3]: 4 to 9 lines of 1 to 6 words, each line its own font, size (11 to
    34 px), ink and left margin; lines never overlap and stay on the page."""
    from PIL import Image, ImageDraw
    h, w = hw
    img = Image.fromarray(np.clip(_paper(rng, h, w), 0, 255).astype(np.uint8))
    d = ImageDraw.Draw(img)
    y = int(rng.integers(6, 30))
    for _ in range(int(rng.integers(4, 10))):
        size = int(rng.integers(11, 35))
        font = _font(FONTS[int(rng.integers(len(FONTS)))], size)
        text = _phrase(rng, 1, 6)
        x = int(rng.integers(8, max(9, w // 3)))
        left, top, right, bottom = d.textbbox((x, y), text, font=font)
        while right > w - 6 and " " in text:            # shorten the line until it fits the page
            text = text.rsplit(" ", 1)[0]
            left, top, right, bottom = d.textbbox((x, y), text, font=font)
        if bottom > h - 4:
            break
        d.text((x, y), text, fill=_ink(rng), font=font)
        if rng.random() < 0.15:                         # a thin ruled line under the text
            ly = bottom + 3
            d.line([(8, ly), (w - 8, ly)], fill=(150, 150, 150), width=1)
        y = bottom + int(rng.integers(6, 26))
    return np.asarray(img)


def text_pages(n: int, seed: int = 0, hw: tuple[int, int] = PAGE_HW) -> np.ndarray:
    """n rendered pages preprocessed for the det model: float32 [n, 3, H, W]."""
    rng = np.random.default_rng(seed)
    return np.stack([_to_bgr_norm(render_page(rng, hw)) for _ in range(n)])


def render_strip(rng: np.random.Generator) -> np.ndarray:
    """One text-line crop, uint8 RGB [h, w, 3], as a detector box would cut it: 1 to 4 words, 18 to 40 px text,
    a few pixels of margin, a light background."""
    from PIL import Image, ImageDraw
    size = int(rng.integers(18, 41))
    font = _font(FONTS[int(rng.integers(len(FONTS)))], size)
    text = _phrase(rng, 1, 4)
    probe = ImageDraw.Draw(Image.new("RGB", (8, 8)))
    left, top, right, bottom = probe.textbbox((0, 0), text, font=font)
    mx, my = int(rng.integers(2, 10)), int(rng.integers(2, 8))
    w, h = right - left + 2 * mx, bottom - top + 2 * my
    img = Image.fromarray(np.clip(_paper(rng, h, w), 0, 255).astype(np.uint8))
    ImageDraw.Draw(img).text((mx - left, my - top), text, fill=_ink(rng), font=font)
    return np.asarray(img)


def resize_norm_strip(rgb: np.ndarray, chw: tuple[int, int, int] = STRIP_CHW) -> np.ndarray:
    """rapidocr's TextClassifier.resize_norm_img: height to 48 keeping the aspect ratio, width
    min(ceil(48·w/h), 192), (x/255 - 0.5)/0.5 in BGR order, CHW, zeros on the right."""
    from PIL import Image
    c, ih, iw = chw
    h, w = rgb.shape[:2]
    rw = min(iw, int(math.ceil(ih * w / float(h))))
    resized = np.asarray(Image.fromarray(rgb).resize((rw, ih), Image.BILINEAR))
    out = np.zeros((c, ih, iw), np.float32)
    out[:, :, :rw] = _to_bgr_norm(resized)
    return out


def text_strips(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n rendered strips preprocessed for the cls model ([n, 3, 48, 192] float32) and their labels (int64: 0
    upright, 1 rotated 180°; every odd index is rotated)."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for i in range(n):
        s = render_strip(rng)
        rot = i % 2 == 1
        if rot:
            s = s[::-1, ::-1]
        xs.append(resize_norm_strip(np.ascontiguousarray(s)))
        ys.append(int(rot))
    return np.stack(xs), np.asarray(ys, np.int64)
