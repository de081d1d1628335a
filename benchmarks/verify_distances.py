"""The image verifier alone on easy-vqa train images: each variant's distance to its source.

    python benchmarks/verify_distances.py --images 200 --out benchmarks/results/verify-distances.json
"""

from vlmcache_lab.verify_distances import main

if __name__ == "__main__":
    main()
