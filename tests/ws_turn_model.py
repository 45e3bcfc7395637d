"""A protocol model of the warp-specialized Gluon forward's barriers (no GPU, no triton).

What it models (tileflash/ops/gluon/forward.py, ``_attn_fwd_sm90_ws``): one program with a
producer that loads K_j and V_j into ring slot j % STAGES once every consumer released that
slot's previous block, and NUM_C consumers that follow ``_ws_consumer`` step for step: per
turn they wait for their turn (``_ws_turn``), wait for the K (and V) they multiply, pass the
turn (``_ws_pass``), and release the K and V slots when their matmuls retire.

The mbarriers follow PTX's parity rule: a barrier counts arrivals; once its count is reached,
its phase completes; ``wait(bar, p)`` returns once the current phase's parity differs from p,
i.e. once the phase of parity p has completed. That rule is why a waiter that falls two phases
behind deadlocks or passes too early: the check in :func:`explore` catches both (no agent can
move, or the matmuls were issued out of round-robin order).

Persistent programs (``PERSISTENT``; pass a list of per-tile block counts as ``n_blocks``): the
producer loads each tile's K_0/V_0, then its Q slices once each consumer released its slice
(``q_empty``, when the consumer's last S matmul of the previous tile retired; O leaves through
buffers of its own), then the other blocks, with the ring
position running on across tiles; the consumers run their tiles in the same order with running
ring positions and turn counts. The model also tracks what each ring slot and Q slice holds and
checks, at every matmul issue, that it is the block and tile the consumer expects (a load that
overwrote a slot or a slice too early fails the run as "data").

``turn_bug=True`` models the first three-consumer version (every consumer but 0 waited on
``pp_bar[1]``), which hung on the H200 (perf-notes §23); the test suite uses it as the negative
control (tests/test_forward_sm90.py). Usage: python tests/ws_turn_model.py
"""
import random


class Barrier:
    def __init__(self, count):
        self.count, self.pending, self.completed = count, 0, 0

    def arrive(self):
        self.pending += 1
        if self.pending == self.count:
            self.pending, self.completed = 0, self.completed + 1

    def ready(self, parity):
        return (self.completed & 1) != parity


def _producer(b, tiles, stages, num_c, persistent, bug=None):
    def load(slot_kind, slot, what):
        def effect():
            b["holds"][slot_kind][slot] = what
        return effect

    def kv(tile, j, g):
        slot, released = g % stages, ((g // stages) & 1) ^ 1
        if g >= stages:
            yield ("wait", b["k_empty"][slot], released)
        yield ("arrive", b["k_full"][slot], load("k", slot, (tile, j)))
        if g >= stages:
            yield ("wait", b["v_empty"][slot], released)
        yield ("arrive", b["v_full"][slot], load("v", slot, (tile, j)))

    g = 0
    for i, n_blocks in enumerate(tiles):
        if persistent:
            yield from kv(i, 0, g)
        for c in range(num_c):
            if persistent and i > 0 and bug != "q":
                yield ("wait", b["q_empty"][c], (i - 1) & 1)
            yield ("arrive", b["q"][c], load("q", c, i))   # the Q slice lands (TMA bytes)
        for j in range(1 if persistent else 0, n_blocks):
            yield from kv(i, j, g + j)
        g += n_blocks


def _turn(b, turn, c, turn_bug):
    if c == 0:
        if turn > 0:
            yield ("wait", b["pp"][0], (turn - 1) & 1)
    else:
        yield ("wait", b["pp"][1 if turn_bug else c], turn & 1)


def _consumer(b, c, tiles, stages, num_c, turn_bug, log, persistent, bug=None):
    nxt = b["pp"][(c + 1) % num_c]
    g0 = t0 = 0

    def expect(kind, slot, what):
        return ("check", kind, slot, what)

    for i, n_blocks in enumerate(tiles):
        yield ("wait", b["q"][c], i & 1)
        yield from _turn(b, t0, c, turn_bug)
        yield ("wait", b["k_full"][g0 % stages], (g0 // stages) & 1)
        yield expect("q", c, i)
        yield expect("k", g0 % stages, (i, 0))
        log.append((c, i, 0))                            # S_0 issued
        yield ("arrive", nxt)
        yield ("arrive", b["k_empty"][g0 % stages])      # S_0 retired
        if persistent and n_blocks == 1:
            yield ("arrive", b["q_empty"][c])            # Q's last use retired
        for j in range(1, n_blocks):
            g = g0 + j
            stage, prev = g % stages, (g - 1) % stages
            yield from _turn(b, t0 + j, c, turn_bug)
            yield ("wait", b["k_full"][stage], (g // stages) & 1)
            yield ("wait", b["v_full"][prev], ((g - 1) // stages) & 1)
            yield expect("q", c, i)
            yield expect("k", stage, (i, j))
            yield expect("v", prev, (i, j - 1))
            log.append((c, i, j))                        # S_j and P_{j-1}·V_{j-1} issued
            yield ("arrive", nxt)
            yield ("arrive", b["k_empty"][stage])
            if persistent and j == n_blocks - 1:
                yield ("arrive", b["q_empty"][c])        # Q's last use (S_j) retired
            yield ("arrive", b["v_empty"][prev])
        g_last = g0 + n_blocks - 1
        last = g_last % stages
        yield from _turn(b, t0 + n_blocks, c, turn_bug)
        yield ("wait", b["v_full"][last], (g_last // stages) & 1)
        yield expect("v", last, (i, n_blocks - 1))
        log.append((c, i, n_blocks))                     # the last P·V issued
        yield ("arrive", nxt)
        yield ("arrive", b["v_empty"][last])
        if not persistent:
            yield expect("q", c, i)                      # O goes out through the Q slice
        g0 = 0 if bug == "ring" else g0 + n_blocks       # "ring": restarts its ring position per tile
        t0 = 0 if bug == "turns" else t0 + n_blocks + 1  # "turns": restarts its turn count per tile


def run(num_c, stages, n_blocks, seed, turn_bug=False, pingpong=True, bug=None):
    """One random schedule. ``n_blocks``: an int (one tile per program) or a list of per-tile
    block counts (a persistent program). Returns "ok", "deadlock", "order" (matmuls issued out
    of turn) or "data" (a matmul would read a slot or slice that holds the wrong block).
    ``bug`` (negative controls of the persistent mode): "q", the producer loads a tile's Q without
    waiting for q_empty; "ring", the consumers restart the K/V ring position at every tile;
    "turns", the consumers restart their turn count at every tile."""
    rng = random.Random(seed)
    persistent = isinstance(n_blocks, (list, tuple))
    tiles = list(n_blocks) if persistent else [n_blocks]
    b = dict(q=[Barrier(1) for _ in range(num_c)], pp=[Barrier(1) for _ in range(num_c)],
             q_empty=[Barrier(1) for _ in range(num_c)],
             k_full=[Barrier(1) for _ in range(stages)], v_full=[Barrier(1) for _ in range(stages)],
             k_empty=[Barrier(num_c) for _ in range(stages)], v_empty=[Barrier(num_c) for _ in range(stages)],
             holds=dict(q=[None] * num_c, k=[None] * stages, v=[None] * stages))
    log = []
    agents = [_producer(b, tiles, stages, num_c, persistent, bug)]
    agents += [_consumer(b, c, tiles, stages, num_c, turn_bug, log, persistent, bug) for c in range(num_c)]
    heads = [next(a) for a in agents]
    while any(h is not None for h in heads):
        runnable = [i for i, h in enumerate(heads)
                    if h is not None and (h[0] != "wait" or h[1].ready(h[2]))]
        if not runnable:
            return "deadlock"
        i = rng.choice(runnable)
        h = heads[i]
        if h[0] == "arrive":
            if len(h) > 2:
                h[2]()  # the load's data lands with its arrival
            h[1].arrive()
        elif h[0] == "check" and b["holds"][h[1]][h[2]] != h[3]:
            return "data"
        heads[i] = next(agents[i], None)
    want = [(c, i, t) for i, n in enumerate(tiles) for t in range(n + 1) for c in range(num_c)]
    if pingpong and log != want:
        return "order"
    return "ok"


def explore(num_c, stages, n_blocks, schedules=300, turn_bug=False, bug=None):
    """Counts of each outcome over random schedules."""
    out = {}
    for seed in range(schedules):
        r = run(num_c, stages, n_blocks, seed, turn_bug, bug=bug)
        out[r] = out.get(r, 0) + 1
    return out


if __name__ == "__main__":
    for bug in (False, True):
        for num_c in (2, 3):
            for stages in (2, 3, 4):
                for n in (1, 2, 5, 9):
                    print(f"turn_bug={bug!s:<5} consumers={num_c} stages={stages} blocks={n}: "
                          f"{explore(num_c, stages, n, turn_bug=bug)}")
    for num_c in (2, 3):
        for stages in (2, 3):
            for tiles in ([1, 1, 1], [3, 1, 4, 2], [9, 2, 5]):
                print(f"persistent consumers={num_c} stages={stages} tiles={tiles}: {explore(num_c, stages, tiles)}")
