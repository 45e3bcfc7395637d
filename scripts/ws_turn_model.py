"""A protocol model of the warp-specialized Gluon forward's barriers (no GPU, no triton).

What it models (tileflash/ops/forward_sm90.py, ``_attn_fwd_sm90_ws``): one program with a
producer that loads K_j and V_j into ring slot j % STAGES once every consumer released that
slot's previous block, and NUM_C consumers that follow ``_ws_consumer`` step for step: per
turn they wait for their turn (``_ws_turn``), wait for the K (and V) they multiply, pass the
turn (``_ws_pass``), and release the K and V slots when their matmuls retire.

The mbarriers follow PTX's parity rule: a barrier counts arrivals; once its count is reached,
its phase completes; ``wait(bar, p)`` returns once the current phase's parity differs from p,
i.e. once the phase of parity p has completed. That rule is why a waiter that falls two phases
behind deadlocks or passes too early: the check in :func:`explore` catches both (no agent can
move, or the matmuls were issued out of round-robin order).

``turn_bug=True`` models the first three-consumer version (every consumer but 0 waited on
``pp_bar[1]``), which hung on the H200 (perf-notes §23); the test suite uses it as the negative
control. Usage: python scripts/ws_turn_model.py
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


def _producer(b, n_blocks, stages, num_c):
    for c in range(num_c):
        yield ("arrive", b["q"][c])                      # the Q slice lands (TMA bytes)
    for j in range(n_blocks):
        slot, released = j % stages, ((j // stages) & 1) ^ 1
        if j >= stages:
            yield ("wait", b["k_empty"][slot], released)
        yield ("arrive", b["k_full"][slot])
        if j >= stages:
            yield ("wait", b["v_empty"][slot], released)
        yield ("arrive", b["v_full"][slot])


def _turn(b, turn, c, turn_bug):
    if c == 0:
        if turn > 0:
            yield ("wait", b["pp"][0], (turn - 1) & 1)
    else:
        yield ("wait", b["pp"][1 if turn_bug else c], turn & 1)


def _consumer(b, c, n_blocks, stages, num_c, turn_bug, log):
    nxt = b["pp"][(c + 1) % num_c]
    yield ("wait", b["q"][c], 0)
    yield from _turn(b, 0, c, turn_bug)
    yield ("wait", b["k_full"][0], 0)
    log.append((c, 0))                                   # S_0 issued
    yield ("arrive", nxt)
    yield ("arrive", b["k_empty"][0])                    # S_0 retired
    for j in range(1, n_blocks):
        stage, prev = j % stages, (j - 1) % stages
        yield from _turn(b, j, c, turn_bug)
        yield ("wait", b["k_full"][stage], (j // stages) & 1)
        yield ("wait", b["v_full"][prev], ((j - 1) // stages) & 1)
        log.append((c, j))                               # S_j and P_{j-1}·V_{j-1} issued
        yield ("arrive", nxt)
        yield ("arrive", b["k_empty"][stage])
        yield ("arrive", b["v_empty"][prev])
    last = (n_blocks - 1) % stages
    yield from _turn(b, n_blocks, c, turn_bug)
    yield ("wait", b["v_full"][last], ((n_blocks - 1) // stages) & 1)
    log.append((c, n_blocks))                            # the last P·V issued
    yield ("arrive", nxt)
    yield ("arrive", b["v_empty"][last])


def run(num_c, stages, n_blocks, seed, turn_bug=False, pingpong=True):
    """One random schedule. Returns "ok", "deadlock" or "order" (matmuls issued out of turn)."""
    rng = random.Random(seed)
    b = dict(q=[Barrier(1) for _ in range(num_c)], pp=[Barrier(1) for _ in range(num_c)],
             k_full=[Barrier(1) for _ in range(stages)], v_full=[Barrier(1) for _ in range(stages)],
             k_empty=[Barrier(num_c) for _ in range(stages)], v_empty=[Barrier(num_c) for _ in range(stages)])
    log = []
    agents = [_producer(b, n_blocks, stages, num_c)]
    agents += [_consumer(b, c, n_blocks, stages, num_c, turn_bug, log) for c in range(num_c)]
    heads = [next(a) for a in agents]
    while any(h is not None for h in heads):
        runnable = [i for i, h in enumerate(heads) if h is not None and (h[0] == "arrive" or h[1].ready(h[2]))]
        if not runnable:
            return "deadlock"
        i = rng.choice(runnable)
        if heads[i][0] == "arrive":
            heads[i][1].arrive()
        heads[i] = next(agents[i], None)
    if pingpong and log != [(c, t) for t in range(n_blocks + 1) for c in range(num_c)]:
        return "order"
    return "ok"


def explore(num_c, stages, n_blocks, schedules=300, turn_bug=False):
    """Counts of each outcome over random schedules."""
    out = {}
    for seed in range(schedules):
        r = run(num_c, stages, n_blocks, seed, turn_bug)
        out[r] = out.get(r, 0) + 1
    return out


if __name__ == "__main__":
    for bug in (False, True):
        for num_c in (2, 3):
            for stages in (2, 3, 4):
                for n in (1, 2, 5, 9):
                    print(f"turn_bug={bug!s:<5} consumers={num_c} stages={stages} blocks={n}: "
                          f"{explore(num_c, stages, n, turn_bug=bug)}")
