import json, sys, statistics, glob
mode, side = sys.argv[1], sys.argv[2]
rows = json.load(open(f"rows_{mode}_{side}.json"))
core = {}
onnew = {}
for f in glob.glob(f"core_{mode}_{side}.*"):
    for l in open(f):
        if not l.strip(): continue
        d = json.loads(l)
        if "rid" not in d: continue  # an idle engine step's record (see idle_steps.py)
        if "on_new_us" in d: onnew[d["rid"]] = d["on_new_us"]
        else: core[d["rid"]] = d
def match(rid):
    if rid in core: return core[rid]
    c = [v for k, v in core.items() if k.startswith(rid + "-") or k.split("-")[0] == rid]
    return c[0] if len(c) == 1 else None
groups = {}
for r in rows:
    c = match(r["rid"])
    if not c: continue
    g = groups.setdefault(f'{r["kind"]} gap={r["gap"]}', [])
    g.append({"ipc+decode": (c["pre0"] - r["send"]) * 1e3, "preprocess(block hash)": (c["pre1"] - c["pre0"]) * 1e3,
              "wait_main_loop": (c["pick"] - c["pre1"]) * 1e3, "pick->queued": (r["queued"] - c["pick"]) * 1e3,
              "steps_between": c["steps_between"], "on_new_us": onnew.get(c["rid"], 0.0),
              "core_send": r["core_send_ms"], "render": r["render_ms"], "pre": r.get("pre_ms", 0.0), "front": r["front_ms"]})
for k, g in groups.items():
    keys = list(g[0])
    print(k, "n=", len(g), " ".join(f"{kk}={statistics.median(x[kk] for x in g):.3f}" for kk in keys),
          " mean_wait=%.3f max_wait=%.3f" % (statistics.mean(x["wait_main_loop"] for x in g), max(x["wait_main_loop"] for x in g)))
