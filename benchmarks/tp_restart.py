"""The KV tier under tensor parallelism (issue 35): TP=2 rows after a restart load in full; a
TP=1 engine on the same store loads none (see vlmcache_lab.tp_restart).

    python benchmarks/tp_restart.py --geometry benchmarks/geometries/llava7b --tp 2
    flock /tmp/vlmcache-heavy.lock python benchmarks/tp_restart.py --smoke   # the CPU
"""

import sys

from vlmcache_lab.tp_restart import main

if __name__ == "__main__":
    sys.exit(main())
