"""Replicas behind one `vlmcache proxy` (issue 35): 1 replica vs 2 round robin vs 2 affinity
(see vlmcache_lab.replicas_gpu).

    python benchmarks/replicas_gpu.py --geometry benchmarks/geometries/llava7b --gpus 0,1
    flock /tmp/vlmcache-heavy.lock python benchmarks/replicas_gpu.py --smoke   # the CPU
"""

import sys

from vlmcache_lab.replicas_gpu import main

if __name__ == "__main__":
    sys.exit(main())
