import glob, json, os, sys
for f in sorted(glob.glob(os.environ["OUT"] + "/*/recipe.json")):
    for r in json.load(open(f))["rows"]:
        print(f.split("/")[-2], r["variant"], r.get("status"), "tok/s", round(r.get("tokens_per_s") or 0), "x", round(r.get("x_stock_tok_s") or 0, 2),
              "p50", round(r.get("iter_ms_p50") or 0, 1), "mean", round(r.get("iter_ms_mean") or 0, 1), "mfu", round(r.get("mfu_nominal") or 0, 3),
              "mem", r.get("peak_memory_gb"), r.get("peak_reserved_gb"), "pad", r.get("padding_fraction"), "caps", r.get("graph_captures"), r.get("graph_capture_phases_s"), "borrowed", r.get("graph_borrowed_steps"))
