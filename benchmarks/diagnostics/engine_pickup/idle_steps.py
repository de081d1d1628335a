"""Count the engine's idle steps (no model run) by what kept it stepping, from the records
``sitecustomize.py`` writes: usage ``python idle_steps.py CORE_FILE...``."""
import collections
import json
import sys

counts = collections.Counter()
for path in sys.argv[1:]:
    for line in open(path):
        d = json.loads(line)
        if "idle_step" in d:
            counts["connector_jobs=%s manager_jobs=%s tier_reports_pending=%s" % (
                d["conn_jobs"] > 0, d["mgr_jobs"] > 0, any(d["tier_pending"]))] += 1
for key, n in counts.most_common():
    print(n, "idle engine steps with", key)
