"""A protocol model of the fused warp-specialized backward's barriers and ordered dQ adds (no GPU,
no triton).

What it models (tileflash/ops/gluon/backward.py, ``_attn_bwd_sm90_ws`` with WITH_DQ, the layout of
the twenty-first session, perf-notes §30). Programs are K blocks n = 0..P-1, each visiting the Q
blocks lo(n)..M-1 (lo non-decreasing in n: causal visits are a suffix, non-causal all), at most R
resident at once and started in K-block order (the grid order the ordered adds rely on). Per
program, step for step as the kernel:

* the producer loads block i into Q/dO ring slot i % STAGES once both consumers released the slot's
  block i - STAGES (``q_empty``, count 2; ``q_full`` count 1);
* consumer C (0, 1), per block it: waits ``q_full``; writes its half of dSᵀ into buffer it % 2 and
  arrives on ``ds_full[it % 2]`` (count 2); waits for that barrier's phase (it // 2) & 1; reads
  both halves (its dQ wgmmas; they retire before the consumer blocks again); releases the Q/dO slot;
  waits for its staging slot (it % DQ_BUFS)·2 + C to be free (``dq_empty``, from block
  it - DQ_BUFS on) and stages its dQ half there (``dq_full``);
* the writer, per block: waits for both halves, waits until the Q block's counter equals n (the
  ordered mode), adds both halves, counts the add (counter + 1) and frees the two slots.

The mbarriers follow PTX's parity rule (as tests/ws_turn_model.py): ``wait(bar, p)`` passes once
the phase of parity p has completed, so a waiter that falls two phases behind hangs or passes too
early. Every read checks what the buffer holds (a dSᵀ half, a staged dQ half, a ring slot), and the
writer records the order of the adds per Q block, which must be 0, 1, 2, ... for the sums to be
the same bits on every run.

With ``lse=True`` it models ``LSE_EARLY=3`` too: after issuing a block's Q/dO copies (the expect,
the first of ``q_full``'s two arrivals) the producer stages the block's LSE/delta rows in the slot's
row of the LSE/delta rings and arrives again; each consumer reads the LSE right after its
``q_full`` wait and delta before its dSᵀ, and both reads must see that block's rows.

With ``late=True`` it models ``DQ_LATE``: a consumer stages block it's dQ half after its
``q_full`` wait of block it + 1 (the last block's after its loop).

With ``alt=True`` it models ``DQ_ALT`` instead of the column halves: block it's dQ is computed and
staged whole by consumer it % 2 (the owner), in staging slot it % DQ_BUFS; only the owner waits for
``ds_full[it % 2]`` and reads both dSᵀ halves. No barrier releases a dSᵀ buffer: the model checks
that the alternation itself keeps a half from being overwritten before its owner read it.

Negative controls (``bug``): "one_ds" (a single dSᵀ buffer), "no_turn" (the writer adds without
waiting for its turn), "no_empty" (consumers stage without waiting for a free slot),
"lse_one_arrival" (``lse``: ``q_full`` with one arrival, the expect, so the rows may be staged
after a consumer passed); with ``alt``, "one_ds" and "no_empty" again. The test suite (tests/test_backward_sm90.py) checks that each is caught. Usage: python tests/fused_writer_model.py
"""
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ws_turn_model import Barrier  # noqa: E402  (PTX's mbarrier: arrivals, phases, the parity wait)


class Failure(Exception):
    pass


def _program(n, q_blocks, stages, dq_bufs, counters, order, bug, lse=False, alt=False, late=False):
    """The four partitions of K block n's program, as generators that yield a wait predicate
    (a callable: True once they may go on) before each blocking step."""
    total = len(q_blocks)
    second = lse and bug != "lse_one_arrival"  # LSE_EARLY=3: q_full's second arrival
    q_full = [Barrier(2 if second else 1) for _ in range(stages)]
    q_empty = [Barrier(2) for _ in range(stages)]
    n_ds = 1 if bug == "one_ds" else 2
    ds_full = [Barrier(2) for _ in range(n_ds)]
    n_slots = dq_bufs if alt else 2 * dq_bufs
    dq_full = [Barrier(1) for _ in range(n_slots)]
    dq_empty = [Barrier(1) for _ in range(n_slots)]
    ring = [None] * stages                       # which block a Q/dO slot holds
    ds = [[None, None] for _ in range(n_ds)]     # which block each dSᵀ half holds
    staged = [None] * n_slots                    # which (block, half) a dQ staging slot holds
    rows = [None] * stages                       # which block's LSE/delta rows a ring slot holds

    def producer():
        for i in range(total):
            slot = i % stages
            if i >= stages:
                yield lambda: q_empty[slot].ready(((i // stages) & 1) ^ 1)
            ring[slot] = i
            q_full[slot].arrive()      # the expect; the copies land with it here
            if lse:
                yield lambda: True     # the producer's LSE/delta loads: anything may run meanwhile
                rows[slot] = i
                if second:
                    q_full[slot].arrive()

    def stage_dq(c, it):
        slot = (it % dq_bufs) * 2 + c
        if it >= dq_bufs and bug != "no_empty":
            yield lambda: dq_empty[slot].ready(((it // dq_bufs) & 1) ^ 1)
        staged[slot] = (it, c)
        dq_full[slot].arrive()

    def consumer(c):
        for it in range(total):
            stage = it % stages
            yield lambda: q_full[stage].ready((it // stages) & 1)
            if ring[stage] != it or (lse and rows[stage] != it):  # Q/dO, and the LSE row (LSE_EARLY=3)
                raise Failure("data")
            if late and it > 0:  # DQ_LATE: block it - 1's half, under this block's first matmuls
                yield from stage_dq(c, it - 1)
            if lse:
                yield lambda: True     # Sᵀ and dPᵀ: anything may run meanwhile
                if rows[stage] != it:  # delta, read before dSᵀ
                    raise Failure("data")
            buf = it % n_ds
            if alt:
                yield from _alt_block(c, it, stage, buf)
                continue
            ds[buf][c] = it
            ds_full[buf].arrive()
            yield lambda: ds_full[buf].ready((it // n_ds) & 1)
            if ds[buf] != [it, it] or ring[stage] != it:  # the dQ wgmmas read both halves, dK reads Q
                raise Failure("data")
            q_empty[stage].arrive()
            if not late:
                yield from stage_dq(c, it)
        if late and total:
            yield from stage_dq(c, total - 1)

    def _alt_block(c, it, stage, buf):
        # DQ_ALT: the rest of block it for consumer c, from its dSᵀ half on (owner: consumer it % 2)
        ds[buf][c] = it
        ds_full[buf].arrive()
        if it % 2 == c:  # the owner: both halves, then the whole part staged
            yield lambda: ds_full[buf].ready((it // n_ds) & 1)
            if ds[buf] != [it, it]:
                raise Failure("data")
            slot = it % dq_bufs
            if it >= dq_bufs and bug != "no_empty":
                yield lambda: dq_empty[slot].ready(((it // dq_bufs) & 1) ^ 1)
            staged[slot] = (it,)
            dq_full[slot].arrive()
        if ring[stage] != it:  # dK reads Q
            raise Failure("data")
        q_empty[stage].arrive()

    def writer():
        if alt:
            for it in range(total):
                slot = it % dq_bufs
                yield lambda: dq_full[slot].ready((it // dq_bufs) & 1)
                m = q_blocks[it]
                if bug != "no_turn":
                    yield lambda: counters[m] == n
                if staged[slot] != (it,):
                    raise Failure("data")
                order[m].append(n)
                counters[m] += 1
                dq_empty[slot].arrive()
            return
        for it in range(total):
            base = (it % dq_bufs) * 2
            phase = (it // dq_bufs) & 1
            yield lambda: dq_full[base].ready(phase)
            yield lambda: dq_full[base + 1].ready(phase)
            m = q_blocks[it]
            if bug != "no_turn":
                yield lambda: counters[m] == n
            if staged[base] != (it, 0) or staged[base + 1] != (it, 1):
                raise Failure("data")
            order[m].append(n)
            counters[m] += 1
            dq_empty[base].arrive()
            dq_empty[base + 1].arrive()

    return [producer(), consumer(0), consumer(1), writer()]


def run(n_k, n_q, resident, stages, dq_bufs, causal, rng, bug=None, lse=False, alt=False, late=False):
    """One random schedule: "ok", "deadlock", "data" (a buffer held the wrong block) or "order"
    (the adds to a Q block did not come in K-block order, or some are missing)."""
    # causal: K block n's first Q block; non-decreasing in n, 0 for n = 0 (bottom-right, Sq = Sk)
    lo = [min(n_q - 1, (n * n_q) // n_k) if causal else 0 for n in range(n_k)]
    counters, order = [0] * n_q, [[] for _ in range(n_q)]
    started, running = 0, []   # running: (program, [agents with their pending wait])

    def start(n):
        agents = [[a, None] for a in _program(n, list(range(lo[n], n_q)), stages, dq_bufs, counters, order, bug,
                                              lse, alt, late)]
        return [n, agents]

    try:
        while True:
            while started < n_k and len(running) < resident:
                running.append(start(started))
                started += 1
            if not running:
                break
            movable = []
            for prog in running:
                for agent in prog[1]:
                    if agent[0] is not None and (agent[1] is None or agent[1]()):
                        movable.append(agent)
            if not movable:
                return "deadlock"
            agent = rng.choice(movable)
            try:
                agent[1] = next(agent[0])
            except StopIteration:
                agent[0] = None
            running = [p for p in running if any(a[0] is not None for a in p[1])]
    except Failure as f:
        return str(f)
    for m in range(n_q):
        want = [n for n in range(n_k) if lo[n] <= m]
        if order[m] != want:
            return "order"
    return "ok"


def explore(n_k, n_q, resident, stages, dq_bufs, causal, schedules=100, bug=None, seed=0, lse=False, alt=False,
            late=False):
    rng = random.Random(seed)
    out = {}
    for _ in range(schedules):
        r = run(n_k, n_q, resident, stages, dq_bufs, causal, rng, bug, lse, alt, late)
        out[r] = out.get(r, 0) + 1
    return out


if __name__ == "__main__":
    for causal in (False, True):
        for stages, dq_bufs in ((2, 2), (3, 1), (2, 1)):
            for n_k, n_q, res in ((4, 8, 2), (6, 5, 3), (3, 9, 1), (8, 8, 8)):
                print(f"causal={causal} stages={stages} dq_bufs={dq_bufs} K blocks={n_k} Q blocks={n_q} "
                      f"resident={res}: {explore(n_k, n_q, res, stages, dq_bufs, causal)}")
    for bug in ("one_ds", "no_turn", "no_empty"):
        print(f"bug={bug}: {explore(6, 8, 3, 2, 2, True, bug=bug)}")
    for stages in (2, 3):
        print(f"LSE_EARLY=3 stages={stages}: {explore(6, 8, 3, stages, 2, True, lse=True)}")
    for stages, dq_bufs in ((2, 2), (3, 2), (3, 1)):
        print(f"DQ_ALT stages={stages} dq_bufs={dq_bufs}: {explore(6, 8, 3, stages, dq_bufs, True, alt=True)}")
    for bug in ("one_ds", "no_empty", "no_turn"):
        print(f"DQ_ALT stages=3 bug={bug}: {explore(6, 8, 3, 3, 2, True, bug=bug, alt=True)}")
    for stages, dq_bufs in ((2, 2), (3, 1)):
        print(f"DQ_LATE stages={stages} dq_bufs={dq_bufs}: {explore(6, 8, 3, stages, dq_bufs, True, late=True)}")
    for bug in ("no_empty", "no_turn"):
        print(f"DQ_LATE bug={bug}: {explore(6, 8, 3, 2, 2, True, bug=bug, late=True)}")
    print(f"LSE_EARLY=3 bug=lse_one_arrival: {explore(6, 8, 3, 2, 2, True, bug='lse_one_arrival', lse=True)}")
