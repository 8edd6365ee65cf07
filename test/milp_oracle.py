#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""milp_oracle.py: the exact optimum of a coarsened profile, as a test oracle for `auto`.

    test/milp_oracle.py [--stages S] [--fractions F,...] [--time-limit T] [--ooc-plan PATH]
                        [--min-proved N] [--keep DIR] PROFILE_DIR...

For each profile: merge its ops into S stages of consecutive ops (durations summed, references
united, no producers: a merged stage is no verified producer), write that as a profile, plan it
with `ooc-plan --policy auto` at budgets a fraction F of the way from the largest stage's own
buffers to the in-core peak (persistent buffers added), and solve a mixed-integer program of the same instance with HiGHS
(scipy.optimize.milp):

  per buffer b and stage s of its life: k (mapped), v (its data valid on the device), i (copied
  in during s), o (copied out during s), h (a valid host copy at the start of s);
  v = 1 at b's uses; v, i, o <= k; v[s] <= v[s-1] + i[s-1] (data is kept or arrives);
  i[s] <= h[s]; a copy out only of valid data and never during a use (the copy follows the use);
  h[s+1] <= h[s] + o[s] between uses, h = 0 after a use (any use may write);
  sum over b of footprint x k[s] <= budget - persistent footprint (persistent buffers stay);
  stage time t[s] >= its compute, >= bytes in / h2d bandwidth, >= bytes out / d2h bandwidth,
  >= bytes both ways / bidirectional bandwidth; minimise the sum of the stage times.

That is a stage-synchronous keep/swap schedule (Checkmate and POET's discretisation with
transfers on two links), which the simulator can replay as a plan (a copy out during stage s is a
swap-out after op s-1, a copy in a swap-in before op s), so its optimum is a time the planner
should reach (the simulator overlaps copies with compute across stages, so auto may beat it).
Persistent buffers stay resident and nothing is recomputed (a merged stage is no producer), in
the program and in the profile auto plans alike. Prints one line per instance (an instance the
solver proves infeasible, or cannot settle within the time limit, is reported and skipped) and
exits 1 when auto is more than 5% above a proved optimum, when the lower bound `ooc-plan` prints is
above one, or when fewer than N optima were proved.
Needs python3-scipy (Debian's /usr/bin/python3).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix


def read_tsv(path):
    with open(path) as f:
        return [line.rstrip("\n").split("\t") for line in f][2:]


def fp(nbytes, chunk):
    if nbytes * 8 > chunk:
        return (nbytes + chunk - 1) // chunk * chunk
    return (nbytes + 255) // 256 * 256


def coarsen(src, stages):
    """Returns (meta dict, buffers [(bytes, persistent)], stages [(duration, set of buffers)])."""
    meta = {k: v for k, v in read_tsv(os.path.join(src, "meta.tsv"))}
    bufs = read_tsv(os.path.join(src, "buffers.tsv"))
    ops = read_tsv(os.path.join(src, "ops.tsv"))
    n = len(ops)
    per = (n + stages - 1) // stages
    st = []
    for s in range(0, n, per):
        dur, refs = 0, set()
        for o in ops[s:s + per]:
            dur += int(o[5])
            if o[6] != "-":
                refs.update(int(r.split(":")[0]) for r in o[6].split(","))
        st.append((dur, refs))
    used = sorted(set().union(*(r for _, r in st)))
    new_id = {b: i for i, b in enumerate(used)}
    nb = [(int(bufs[b][1]), bufs[b][4] == "1") for b in used]
    st = [(d, {new_id[b] for b in r}) for d, r in st]
    return meta, nb, st


def write_profile(dst, meta, bufs, st, budget):
    os.makedirs(dst, exist_ok=True)
    first, last = {}, {}
    for s, (_, refs) in enumerate(st):
        for b in refs:
            first.setdefault(b, s)
            last[b] = s
    with open(os.path.join(dst, "meta.tsv"), "w") as f:
        f.write("#ooc-profile\tmeta\t1\nkey\tvalue\n")
        for k, v in meta.items():
            f.write(f"{k}\t{budget if k == 'budget_bytes' else v}\n")
    with open(os.path.join(dst, "buffers.tsv"), "w") as f:
        f.write("#ooc-profile\tbuffers\t1\nid\tbytes\talloc_idx\tfree_idx\tpersistent\tsite\t"
                "producers\n")
        for b, (nbytes, pers) in enumerate(bufs):
            a, e = (-1, -1) if pers else (first[b], last[b])
            f.write(f"{b}\t{nbytes}\t{a}\t{e}\t{int(pers)}\t-\t-\n")
    with open(os.path.join(dst, "ops.tsv"), "w") as f:
        f.write("#ooc-profile\tops\t1\nidx\tstream\tkind\tname\tshape\tduration_ns\trefs\n")
        for s, (dur, refs) in enumerate(st):
            r = ",".join(f"{b}:rw" for b in sorted(refs)) or "-"
            f.write(f"{s}\t0\tkernel\tstage{s}\t-\t{dur}\t{r}\n")


def solve(meta, bufs, st, budget, time_limit):
    """Returns (status, optimum ns or None)."""
    chunk = int(meta["chunk_bytes"])
    bwh, bwd = float(meta["h2d_bps"]) / 1e9, float(meta["d2h_bps"]) / 1e9
    bwb = float(meta["bidir_bps"]) / 1e9
    S = len(st)
    uses = {}
    for s, (_, refs) in enumerate(st):
        for b in refs:
            uses.setdefault(b, set()).add(s)
    pers = sum(fp(nb, chunk) for b, (nb, p) in enumerate(bufs) if p)
    nvar = 0
    var = {}  # (kind, b, s) -> index

    def new(key):
        nonlocal nvar
        var[key] = nvar
        nvar += 1
        return var[key]

    life = {}
    for b, (nb, p) in enumerate(bufs):
        if p:
            continue
        lo, hi = min(uses[b]), max(uses[b])
        life[b] = (lo, hi)
        for s in range(lo, hi + 1):
            for kind in "kvioh":
                new((kind, b, s))
    tvar = [new(("t", -1, s)) for s in range(S)]
    rows, cols, vals, lo_b, hi_b = [], [], [], [], []
    nrow = 0

    def con(terms, lo, hi):
        nonlocal nrow
        for j, c in terms:
            rows.append(nrow)
            cols.append(j)
            vals.append(c)
        lo_b.append(lo)
        hi_b.append(hi)
        nrow += 1

    lb = np.zeros(nvar)
    ub = np.ones(nvar)
    inf = np.inf
    for b, (lo, hi) in life.items():
        for s in range(lo, hi + 1):
            k, v, i, o, h = (var[(c, b, s)] for c in "kvioh")
            if s in uses[b]:
                lb[v] = 1
                ub[o] = 0  # a copy out follows the use, in a later stage
            con([(v, 1), (k, -1)], -inf, 0)
            con([(i, 1), (k, -1)], -inf, 0)
            con([(o, 1), (k, -1)], -inf, 0)
            con([(o, 1), (v, -1)], -inf, 0)
            con([(i, 1), (h, -1)], -inf, 0)
            if s == lo:
                ub[h] = 0
                ub[i] = 0
            else:
                con([(v, 1), (var[("v", b, s - 1)], -1), (var[("i", b, s - 1)], -1)], -inf, 0)
                hp = var[("h", b, s - 1)]
                if s - 1 in uses[b]:
                    ub[h] = 0
                else:
                    con([(h, 1), (hp, -1), (var[("o", b, s - 1)], -1)], -inf, 0)
            ub[i] = min(ub[i], 1)
    for s in range(S):
        mem = [(var[("k", b, s)], float(fp(bufs[b][0], chunk)))
               for b, (lo, hi) in life.items() if lo <= s <= hi]
        con(mem, -inf, float(budget - pers))
        t = tvar[s]
        lb[t] = float(st[s][0])
        ub[t] = inf
        ins = [(var[("i", b, s)], float(bufs[b][0])) for b, (lo, hi) in life.items()
               if lo <= s <= hi]
        outs = [(var[("o", b, s)], float(bufs[b][0])) for b, (lo, hi) in life.items()
                if lo <= s <= hi]
        con([(t, -bwh)] + ins, -inf, 0)
        con([(t, -bwd)] + outs, -inf, 0)
        con([(t, -bwb)] + ins + outs, -inf, 0)
    c = np.zeros(nvar)
    c[tvar] = 1
    integrality = np.ones(nvar)
    integrality[tvar] = 0
    a = coo_matrix((vals, (rows, cols)), shape=(nrow, nvar)).tocsr()
    res = milp(c, constraints=LinearConstraint(a, lo_b, hi_b), integrality=integrality,
               bounds=Bounds(lb, ub), options={"time_limit": time_limit, "disp": False})
    if res.status == 0:
        return "optimal", res.fun
    return res.message, None


def auto_time(ooc_plan, d):
    out = subprocess.run([ooc_plan, "--policy", "auto", "--out", "none", d],
                         capture_output=True, text=True, timeout=600)
    m = re.search(r"^auto\s+([0-9.]+)\s", out.stdout, re.M)
    b = re.search(r"lower bound ([0-9.]+) ms", out.stdout)
    if not m or not b:
        raise RuntimeError(f"ooc-plan on {d}: {out.stdout}{out.stderr}")
    return float(m.group(1)) * 1e6, float(b.group(1)) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stages", type=int, default=24)
    ap.add_argument("--time-limit", type=float, default=60)
    ap.add_argument("--ooc-plan", default=os.path.join(os.environ.get("OOC_BUILD", "build"),
                                                       "ooc-plan"))
    ap.add_argument("--fractions", default="0.5",
                    help="comma-separated budget fractions (each profile at each)")
    ap.add_argument("--min-proved", type=int, default=1,
                    help="fail unless the solver proves at least this many optima")
    ap.add_argument("--keep", help="write the coarsened profiles under this directory")
    ap.add_argument("profiles", nargs="+")
    a = ap.parse_args()
    worst, fails, proved = 0.0, 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        root = a.keep or tmp
        for src, frac in [(p, float(f)) for p in a.profiles for f in a.fractions.split(",")]:
            meta, bufs, st = coarsen(src, a.stages)
            chunk = int(meta["chunk_bytes"])
            pers = sum(fp(nb, chunk) for nb, p in bufs if p)
            own = max(sum(fp(bufs[b][0], chunk) for b in r if not bufs[b][1]) for _, r in st)
            first, last = {}, {}
            for s, (_, refs) in enumerate(st):
                for b in refs:
                    first.setdefault(b, s)
                    last[b] = s
            peak = max(sum(fp(nb, chunk) for b, (nb, p) in enumerate(bufs)
                           if not p and first[b] <= s <= last[b]) for s in range(len(st)))
            budget = pers + own + int(frac * (peak - own))
            d = os.path.join(root, f"{os.path.basename(src.rstrip('/'))}-{frac}")
            write_profile(d, meta, bufs, st, budget)
            t_auto, bound = auto_time(a.ooc_plan, d)
            status, opt = solve(meta, bufs, st, budget, a.time_limit)
            name = os.path.basename(src.rstrip("/"))
            if opt is None:
                print(f"{name:24s} stages {len(st):3d} budget {budget / 2**20:9.1f} MiB "
                      f"auto {t_auto / 1e6:10.3f} ms  optimum: not proved ({status})")
                continue
            r = t_auto / opt
            worst = max(worst, r)
            proved += 1
            ok = t_auto <= 1.05 * opt + 1000
            # the lower bound holds for every plan, the optimum's among them
            bound_ok = bound <= opt * (1 + 1e-6) + 1000
            fails += (not ok) + (not bound_ok)
            print(f"{name:24s} stages {len(st):3d} budget {budget / 2**20:9.1f} MiB "
                  f"auto {t_auto / 1e6:10.3f} ms  optimum {opt / 1e6:10.3f} ms  "
                  f"auto/optimum {r:6.3f}  bound/optimum {bound / opt:6.3f}"
                  f"{'' if ok else '  ABOVE 1.05'}{'' if bound_ok else '  BOUND ABOVE THE OPTIMUM'}")
    print(f"{proved} optima proved; worst auto/optimum {worst:.3f}; {fails} failed (auto above 1.05"
          " or bound above the optimum)")
    return 1 if fails or proved < a.min_proved else 0


if __name__ == "__main__":
    sys.exit(main())
