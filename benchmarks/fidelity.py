"""Fidelity of the similarity tiers (paraphrases, near-duplicate frames) on tiny-vqa.

    python benchmarks/fidelity.py                 # 60 easy-vqa test images, threshold 0.85
    python benchmarks/fidelity.py --images 20 --out /tmp/fidelity.json
"""

from vlmcache_lab.fidelity import main

if __name__ == "__main__":
    main()
