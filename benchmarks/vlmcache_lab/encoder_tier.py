"""Encoder time saved per image by the encoder-output tier (L1.5).

For a vision tower + LLaVA projector (random weights: timings are real, outputs are not),
measures the median time of one image through the encoder and projector, and the median
time to bring that image's stored output back from vlmcache's memory tier and from its disk
tier (checksum verified) onto the device. ``encoder_ms_saved`` = encoder time - load time.

    python benchmarks/encoder_tier.py --towers tiny clip-l-336 --out results.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

TOWERS = {
    # the tiny test model's tower (vlmcache.testing.tiny_llava defaults)
    "tiny": dict(hidden=64, layers=2, heads=2, mlp=128, image=224, patch=14, text_hidden=128),
    # CLIP ViT-L/14-336 + LLaVA-1.5-7B projector
    "clip-l-336": dict(hidden=1024, layers=24, heads=16, mlp=4096, image=336, patch=14,
                       text_hidden=4096),
}


@dataclass(frozen=True)
class TowerTiming:
    tower: str
    image_tokens: int
    output_bytes: int
    encoder_ms: float
    load_memory_ms: float
    load_disk_ms: float

    def to_dict(self) -> dict[str, object]:
        return {"tower": self.tower, "image_tokens": self.image_tokens,
                "output_bytes": self.output_bytes, "encoder_ms": round(self.encoder_ms, 3),
                "load_memory_ms": round(self.load_memory_ms, 3),
                "load_disk_ms": round(self.load_disk_ms, 3),
                "encoder_ms_saved_memory": round(self.encoder_ms - self.load_memory_ms, 3),
                "encoder_ms_saved_disk": round(self.encoder_ms - self.load_disk_ms, 3)}


def build_tower(name: str, device: str, dtype: torch.dtype) -> tuple[torch.nn.Module, int]:
    """Vision tower + 2-layer GELU projector of the named shape, random weights."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    s = TOWERS[name]
    config = CLIPVisionConfig(hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                              num_attention_heads=s["heads"], intermediate_size=s["mlp"],
                              image_size=s["image"], patch_size=s["patch"])
    vision = CLIPVisionModel(config)
    projector = torch.nn.Sequential(torch.nn.Linear(s["hidden"], s["text_hidden"]),
                                    torch.nn.GELU(),
                                    torch.nn.Linear(s["text_hidden"], s["text_hidden"]))

    class Tower(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.vision, self.projector = vision, projector

        def forward(self, pixels: torch.Tensor) -> torch.Tensor:
            hidden = self.vision(pixels, output_hidden_states=True).hidden_states[-2]
            return self.projector(hidden[:, 1:])  # LLaVA drops CLS, uses the penultimate layer

    tokens = (s["image"] // s["patch"]) ** 2
    return Tower().to(device=device, dtype=dtype).eval(), tokens


def median_ms(fn: Callable[[], object], device: str, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_tower(name: str, device: str, dtype: torch.dtype, repeats: int) -> TowerTiming:
    from vlmcache.store.disk import DiskStore
    from vlmcache.store.memory import MemoryStore

    tower, tokens = build_tower(name, device, dtype)
    size = TOWERS[name]["image"]
    pixels = torch.randn(1, 3, size, size, device=device, dtype=dtype)
    with torch.inference_mode():
        encoder_ms = median_ms(lambda: tower(pixels), device, repeats)
        output = tower(pixels)[0].to("cpu").contiguous()
    key = hashlib.sha256(name.encode()).hexdigest()
    memory = MemoryStore(1 << 34)
    memory.put(key, {"encoder_output": output})
    disk = DiskStore(Path(tempfile.mkdtemp(prefix="vlmcache-enc-")), 1 << 34)
    disk.put(key, {"encoder_output": output})

    def from_memory() -> torch.Tensor:
        return memory.get(key)["encoder_output"].to(device)

    def from_disk() -> torch.Tensor:
        return disk.get(key)["encoder_output"].to(device)

    return TowerTiming(name, tokens, output.numel() * output.element_size(), encoder_ms,
                       median_ms(from_memory, device, repeats),
                       median_ms(from_disk, device, repeats))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--towers", nargs="+", choices=sorted(TOWERS), default=["tiny"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    rows = [time_tower(t, args.device, dtype, args.repeats).to_dict() for t in args.towers]
    record = {"command": "python benchmarks/encoder_tier.py " + " ".join(
                  map(shlex.quote, sys.argv[1:] if argv is None else argv)),
              "device": _device_name(args.device), "dtype": args.dtype,
              "batch_size": 1, "weights": "random (timings only)", "towers": rows,
              "encoder_ms_saved": {r["tower"]: r["encoder_ms_saved_memory"] for r in rows}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    for r in rows:
        print(f"{r['tower']:>12}: encoder {r['encoder_ms']:.2f} ms; load from memory "
              f"{r['load_memory_ms']:.2f} ms, from disk {r['load_disk_ms']:.2f} ms; "
              f"saved {r['encoder_ms_saved_memory']:.2f} / {r['encoder_ms_saved_disk']:.2f} ms")


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return f"GPU: {torch.cuda.get_device_name()}"
    return f"CPU: {platform.machine()}, {torch.get_num_threads()} threads"


if __name__ == "__main__":
    main()
