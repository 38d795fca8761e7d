import json, glob, os, statistics, re
root = "/tmp/ab_load01"
rows = {}
for d in sorted(glob.glob(f"{root}/*-*-*")):
    if not os.path.isdir(d): continue
    name, n, r = os.path.basename(d).split("-")
    j = json.load(open(f"{d}/results.json"))
    md = open(f"{d}/results.md").read()
    la = re.search(r"load average at start/end ([\d. ]+) / ([\d. ]+)", md)
    st = j["steps"][-1]
    ops = float(str(st["Ops/s"]).replace(",", "")); cpu = float(str(st["Server CPU %"]).replace(",", ""))
    rows[(int(n), int(r), name)] = dict(ops=ops, cpu=cpu, cpu_ms=10 * cpu / ops if ops else 0, p50=st["p50 ms"], p99=st["p99 ms"],
        err=st["Errors"], rej=st.get("rejected"), chk=st["missing/extra/partial"], sha=st["SHA-256 ok"],
        load=la.group(1).split()[0] + "-" + la.group(2).split()[0], disk=j["disk"]["files_per_s"])
for n in (4, 16, 64):
    print(f"\n## {n} associations")
    print("| round | target | img/s | server CPU % | CPU ms/img | p50 / p99 ms | errors, rejected | missing/extra/partial, SHA | load avg (1 min, start-end) | disk files/s |")
    for r in range(3):
        for name in ("base", "ours", "orthanc"):
            x = rows.get((n, r, name))
            if x: print(f"| {r} | {name} | {x['ops']:.1f} | {x['cpu']:.1f} | {x['cpu_ms']:.2f} | {x['p50']} / {x['p99']} | {x['err']}, {x['rej']} | {x['chk']}, {x['sha']} | {x['load']} | {x['disk']} |")
    for name in ("base", "ours", "orthanc"):
        xs = [rows[(n, r, name)] for r in range(3) if (n, r, name) in rows]
        if xs: print(f"median {name}: img/s {statistics.median(x['ops'] for x in xs):.1f}, CPU ms/img {statistics.median(x['cpu_ms'] for x in xs):.2f}")
    for r in range(3):
        b, o, t = (rows.get((n, r, k)) for k in ("base", "ours", "orthanc"))
        if b and o and t: print(f"round {r}: ours/base {o['ops']/b['ops']:.2f}x, ours/orthanc {o['ops']/t['ops']:.2f}x, base/orthanc {b['ops']/t['ops']:.2f}x; CPU/img ours/base {o['cpu_ms']/b['cpu_ms']:.2f}, ours/orthanc {o['cpu_ms']/t['cpu_ms']:.2f}")
