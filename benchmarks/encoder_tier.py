"""Encoder + projector time of one image vs loading its stored output (the L1.5 tier).

    python benchmarks/encoder_tier.py --towers tiny --out benchmarks/results/encoder-tier.json
    python benchmarks/encoder_tier.py --towers tiny clip-l-336 --repeats 30 --out ...   # on a GPU
"""

from vlmcache_lab.encoder_tier import main

if __name__ == "__main__":
    main()
