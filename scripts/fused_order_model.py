"""A protocol model of the thirteenth session's fused warp-specialized backward's ordered dQ adds
(no GPU, no triton). Historical: since the twenty-first session the kernel keeps the order in a
writer warp (perf-notes §30), which scripts/fused_writer_model.py models.

What it modelled (tileflash/ops/backward_sm90.py, WITH_DQ and DETERMINISTIC, session 13): per program (one K
block n) a producer that loads step i of the Q/dO ring once both consumers released the slot of
step i - STAGES, and two consumers that, per step t, wait for the load, release the slot, count
the adds of step t - LAG as done (the lazy release), wait for their turn (the Q block's counter
reaching 2n + C) and add; the adds still pending are counted at the end. At most R programs are
resident, started in K-block order (the grid order the kernel relies on). One head, every K block
visiting every Q block (non-causal; causal visitors are a prefix of the K blocks, the same case).
Random schedules; prints how many deadlocked. Perf-notes §22: lag 1 (that kernel) and 2 never
deadlock, lag 3 does with a 2-slot ring.
Usage: python scripts/fused_order_model.py"""
import random

def run(NK, T, R, STAGES, LAG, seed):
    rng = random.Random(seed)
    sem = [0] * T                        # one head, Q blocks 0..T-1 (non-causal: every K block visits all)
    ctas = {}
    next_launch = 0
    done = 0
    def launch():
        nonlocal next_launch
        n = next_launch; next_launch += 1
        ctas[n] = dict(loaded=0, rel=[0] * T, cons=[dict(t=0, phase="full", pending=[], released_upto=0, fin=False) for _ in range(2)])
    while next_launch < NK and len(ctas) < R:
        launch()
    steps = 0
    while done < NK:
        actions = []
        for n, c in ctas.items():
            # producer: load step i if both consumers released slot of step i-STAGES
            i = c["loaded"]
            if i < T and (i < STAGES or c["rel"][i - STAGES] == 2):
                actions.append(("load", n, None))
            for ci, s in enumerate(c["cons"]):
                if s["fin"]:
                    continue
                t = s["t"]
                if t == T:
                    actions.append(("finish", n, ci)); continue
                if s["phase"] == "full":
                    if c["loaded"] > t:
                        actions.append(("consume", n, ci))
                elif s["phase"] == "turn":
                    if sem[t] >= 2 * n + ci:
                        actions.append(("add", n, ci))
        if not actions:
            desc = "; ".join("%d: loaded %d cons %s" % (n, c["loaded"], [(s["t"], s["phase"], s["pending"]) for s in c["cons"]]) for n, c in ctas.items())
            return "DEADLOCK after %d actions: sem=%s ctas=%s" % (steps, sem, desc)
        kind, n, ci = rng.choice(actions)
        c = ctas[n]
        steps += 1
        if kind == "load":
            c["loaded"] += 1
        elif kind == "consume":
            s = c["cons"][ci]; t = s["t"]
            c["rel"][t] += 1                     # slot released before the turn
            # lazy release: the adds of block t-LAG are counted now
            while s["pending"] and s["pending"][0] <= t - LAG:
                sem[s["pending"].pop(0)] += 1
            s["phase"] = "turn"
        elif kind == "add":
            s = c["cons"][ci]
            s["pending"].append(s["t"]); s["t"] += 1; s["phase"] = "full"
        elif kind == "finish":
            s = c["cons"][ci]
            for m in s["pending"]:
                sem[m] += 1
            s["pending"] = []; s["fin"] = True
            if all(x["fin"] for x in c["cons"]):
                del ctas[n]; done += 1
                if next_launch < NK:
                    launch()
    return None

for LAG in (1, 2, 3):
    bad = 0
    for seed in range(300):
        for (NK, T, R, ST) in ((4, 6, 2, 2), (8, 16, 3, 2), (6, 3, 6, 2), (5, 8, 5, 3), (8, 2, 4, 2)):
            r = run(NK, T, R, ST, LAG, seed)
            if r:
                bad += 1
                if bad <= 2:
                    print(f"LAG={LAG} NK={NK} T={T} R={R} STAGES={ST} seed={seed}: {r[:600]}")
    print(f"LAG={LAG}: {bad} deadlocked schedules of {300 * 5}")
