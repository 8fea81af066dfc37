"""chunked_while_loop: several steps per host test, the same iterates as lax.while_loop; the
solvers built on it give bit-identical answers at any number of steps per test."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core import host_tests
from bchg_jax.core.host_tests import ENV_VAR, chunked_while_loop, steps_per_test


def _loop(limit):
    """A loop whose trip count is ``limit`` (0 included), with a float carry that rounds."""
    cond = lambda c: c[0] < limit  # noqa: E731
    body = lambda c: (c[0] + 1, c[1] * 1.1 + jnp.sin(c[1]), c[2] + c[1])  # noqa: E731
    return cond, body, (jnp.int32(0), jnp.float32(0.3), jnp.zeros(3, jnp.float32))


def _same(a, b):
    a, b = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("steps", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("limit", [0, 1, 7, 12])
def test_the_same_carry_as_lax_while_loop(steps, limit):
    cond, body, init = _loop(limit)
    want = jax.jit(lambda c: jax.lax.while_loop(cond, body, c))(init)
    got = jax.jit(lambda c: chunked_while_loop(cond, body, c, steps))(init)
    assert _same(want, got) and int(got[0]) == limit


def test_the_same_lanes_under_vmap():
    """Lanes of 0 to 9 trips: each lane stops where its own test fails, also in the middle of a
    trip of another lane's."""
    limits = jnp.arange(10)

    def run(loop, limit):
        cond, body, init = _loop(limit)
        return loop(cond, body, init)

    want = jax.jit(jax.vmap(lambda n: run(jax.lax.while_loop, n)))(limits)
    for steps in (2, 4):
        got = jax.jit(
            jax.vmap(lambda n, k=steps: run(lambda *a: chunked_while_loop(*a, steps=k), n))
        )(limits)
        assert _same(want, got)


def test_fewer_host_tests():
    """The loop test runs on the host once per trip: 11 times for 10 steps one by one, 4 times
    with 4 steps per trip (3 trips)."""
    from benchmarks.loop_trips import HOST_TEST, counting

    for steps, tests in ((1, 11), (4, 4), (10, 2), (16, 2)):
        with counting() as counts:
            cond, body, init = _loop(10)
            out = jax.jit(lambda c, k=steps: chunked_while_loop(cond, body, c, k))(init)
            jax.block_until_ready(out)
            jax.effects_barrier()
        assert int(out[0]) == 10
        assert [kind for _, kind in counts] == [HOST_TEST] and sum(counts.values()) == tests


@pytest.mark.parametrize("steps", [2, 3, 4])
def test_compacting_stages_give_the_same_lanes(steps):
    """40 lanes of 0 to 39 trips: the stages (40, then at most 20, then 10) end on their lane
    count after a masked step as well, each lane as with a test at every step."""
    from bchg_jax.core.run_last import compacting_while_loop

    limits = jnp.arange(40)

    def run(k):
        # per-lane constants ride in the carry (the stages take their lanes from it)
        carry = {"n": jnp.zeros(40, jnp.int32), "x": jnp.full(40, 0.3), "limit": limits}
        active = lambda c: c["n"] < c["limit"]  # noqa: E731

        def body(c):
            a = active(c)
            x = jnp.where(a, c["x"] * 1.1 + jnp.sin(c["x"]), c["x"])
            return {**c, "n": c["n"] + a.astype(jnp.int32), "x": x}

        return jax.jit(lambda c: compacting_while_loop(active, body, c, steps=k))(carry)

    want = run(1)
    assert np.array_equal(want["n"], limits)
    assert _same(want, run(steps))


def test_steps_per_test_default_and_environment(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert steps_per_test("cpu") == 1
    assert steps_per_test("gpu") == steps_per_test("tpu") == host_tests.ACCELERATOR_STEPS_PER_TEST
    monkeypatch.setenv(ENV_VAR, "6")
    assert steps_per_test("cpu") == steps_per_test("gpu") == 6
    for bad in ("0", "-2", "2.5", "four", ""):
        monkeypatch.setenv(ENV_VAR, bad)
        with pytest.raises(ValueError, match=ENV_VAR):
            steps_per_test()
    cond, body, init = _loop(3)
    assert int(chunked_while_loop(cond, body, init, np.int64(2))[0]) == 3  # a numpy integer
    for bad in (0, -1, 2.0, True, np.bool_(True)):
        with pytest.raises(ValueError, match="steps must be a positive integer"):
            chunked_while_loop(cond, body, init, bad)


def _solves():
    """Each solver built on chunked_while_loop, as a function of nothing (traced afresh on
    every call, so that the environment's steps per test is read again)."""
    from bchg_jax.core.maxent_lqr import riccati
    from bchg_jax.games.tabular.follower import soft_q_iteration
    from bchg_jax.problems.random_tabular import random_tabular_game
    from bchg_jax.tabular import sparse
    from bchg_jax.tabular.follower import soft_value_iteration

    rng = np.random.default_rng(0)
    S, B, R = 12, 3, 24
    P = rng.dirichlet(np.ones(3), size=(S, B))  # 3 successors per state
    full = np.zeros((S, B, S), np.float32)
    nxt = np.stack([(np.arange(S) + d) % S for d in (0, 1, 5)], 1)
    for s in range(S):
        full[s, :, nxt[s]] = P[s].T
    P, r = jnp.asarray(full), jnp.asarray(rng.normal(size=(S, B)), jnp.float32)
    table = sparse.successors_from_transition(full)
    betas = jnp.asarray(np.geomspace(0.02, 2.0, R), jnp.float32)  # lanes of other lengths
    game = random_tabular_game(seed=1, gamma=0.95)
    f = jnp.full((game.num_states, game.num_leader_actions), 1.0 / game.num_leader_actions)
    A = jnp.asarray([[1.1, 0.2], [0.0, 0.9]], jnp.float32)
    Bm = jnp.asarray([[0.0], [1.0]], jnp.float32)
    gammas = jnp.linspace(0.5, 0.99, 8).astype(jnp.float32)

    def sparse_lanes():
        one = lambda b: sparse.sparse_soft_value_iteration(P, r, b, 0.95, table)  # noqa: E731
        return jax.jit(jax.vmap(one))(betas)

    def evaluation_lanes():
        pol = jax.nn.softmax(r[None] / betas[:, None, None], -1)
        cont = jnp.ones(S, jnp.float32)
        one = lambda g: sparse.sparse_policy_evaluation(  # noqa: E731
            P, r, g, 0.95, cont, jnp.zeros(S), table, 1e-6, return_residual=True
        )
        return jax.jit(jax.vmap(one))(pol)

    return {
        "dense soft VI": lambda: jax.jit(
            jax.vmap(lambda b: soft_value_iteration(P, r, b, 0.95, tol=1e-6))
        )(betas),
        "sparse soft VI": sparse_lanes,
        "sparse policy evaluation": evaluation_lanes,
        "game soft Q-iteration": lambda: jax.jit(lambda b: soft_q_iteration(game, f, b))(
            jnp.float32(0.3)
        ),
        "Riccati": lambda: jax.jit(jax.vmap(lambda g: riccati(A, Bm, jnp.eye(2), jnp.eye(1), g)))(
            gammas
        ),
    }


@pytest.mark.parametrize(
    "name",
    [
        "sparse policy evaluation",
        *(
            pytest.param(n, marks=pytest.mark.slow)
            for n in (
                "dense soft VI",
                "sparse soft VI",
                "game soft Q-iteration",
                "Riccati",
            )
        ),
    ],
)
def test_every_solver_gives_the_same_answer_at_any_steps_per_test(name, monkeypatch):
    """The accelerators' default (4 steps per host test) against one step per test, on the CPU:
    the same sweeps, values and flags, bit for bit (the sparse solvers' 24 lanes run in two
    compacting stages; all but the policy evaluation in the slow tier)."""
    solve = _solves()[name]
    monkeypatch.setenv(ENV_VAR, "1")
    want = solve()
    monkeypatch.setenv(ENV_VAR, str(host_tests.ACCELERATOR_STEPS_PER_TEST))
    assert _same(want, solve())
