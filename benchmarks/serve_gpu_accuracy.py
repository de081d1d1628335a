"""Accuracy with and without the cache on the GPU benchmark's trace, tiny-vqa on the CPU
(see vlmcache_lab.serve_gpu_accuracy).

    flock /tmp/vlmcache-heavy.lock python benchmarks/serve_gpu_accuracy.py --requests 400 \
        --out benchmarks/results/serve-gpu-accuracy.json
"""

import sys

from vlmcache_lab.serve_gpu_accuracy import main

if __name__ == "__main__":
    sys.exit(main())
