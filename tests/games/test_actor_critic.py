"""The shared actor-critic skeleton: its minibatch loops, the one state type (and checkpoints of
the two state types it replaced), and the problem metrics the CLIs pass to ``make_train``."""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bchg_jax.core.buffers import EpisodeBuffer, buffer_init
from bchg_jax.core.io import load_state, save_state
from bchg_jax.core.loop import clip_by_global_norm, global_norm, sgd_ascent
from bchg_jax.games import actor_critic as ac
from bchg_jax.games import lqr, tabular
from bchg_jax.games.lqr.config import ActorConfig
from bchg_jax.problems.lqr_game import gain_metrics, lqr_game
from bchg_jax.problems.toy_game import toy_game, toy_game_metrics


def test_actor_steps_ascend_and_respect_step_count_and_active():
    """``actor_steps`` ascends the objective (Adam on its negation), runs exactly the traced
    number of steps, none when inactive, and returns the last gradient's norm."""
    opt = optax.sgd(0.1)
    objective = lambda p, batch, key: -jnp.sum((p - 3.0) ** 2)  # noqa: E731
    p0 = jnp.zeros(2)
    p1, _, g1 = ac.actor_steps(opt, objective, None, jax.random.key(0), p0, opt.init(p0), 1, 5)
    np.testing.assert_allclose(p1, [0.6, 0.6], rtol=1e-6)  # 0 + 0.1 * 2 * 3
    np.testing.assert_allclose(g1, np.linalg.norm([6.0, 6.0]), rtol=1e-6)
    p3, _, _ = ac.actor_steps(opt, objective, None, jax.random.key(0), p0, opt.init(p0), 9, 3)
    np.testing.assert_allclose(p3, 3.0 - 3.0 * 0.8**3, rtol=1e-6)  # cut at max_steps = 3
    p_, _, _ = ac.actor_steps(
        opt, objective, None, jax.random.key(0), p0, opt.init(p0), 2, 5, active=False
    )
    np.testing.assert_array_equal(p_, p0)


def test_critic_steps_draw_a_minibatch_and_a_loss_key_per_step():
    """Step i draws ``draw(fold_in(key, i))`` and hands the loss ``fold_in(key, 10_000 + i)``."""
    seen = []

    def loss(params, batch, key):
        jax.debug.callback(lambda b, k: seen.append((int(b), int(k))), batch, key)
        return jnp.sum(params**2)

    def draw(key):
        return jax.random.randint(key, (), 0, 1000)

    def key_int(key):
        return jax.random.randint(key, (), 0, 1000)

    opt = optax.sgd(0.1)
    key = jax.random.key(7)
    p0 = jnp.ones(2)
    ac.critic_steps(opt, lambda p, b, k: loss(p, b, key_int(k)), draw, key, p0, opt.init(p0), 2, 5)
    want = [
        (int(draw(jax.random.fold_in(key, i))), int(key_int(jax.random.fold_in(key, 10_000 + i))))
        for i in range(2)
    ]
    assert seen == want


class _OldLQRState(NamedTuple):  # games/lqr/train.py's TrainState before the shared skeleton
    theta: Any
    theta_targ: Any
    critic: Any
    critic_targ: Any
    actor_opt: Any
    critic_opt: Any
    P: Any
    buffer: Any
    replay: Any
    key: Any
    step: Any


class _OldTabularState(NamedTuple):  # games/tabular/train.py's GameTrainState before it
    actor: Any
    actor_targ: Any
    critic: Any
    critic_targ: Any
    actor_opt: Any
    critic_opt: Any
    Q_F: Any
    buffer: Any
    key: Any
    step: Any


@pytest.mark.slow
def test_checkpoints_of_the_old_state_types_load_into_the_shared_state(tmp_path):
    """Runs saved before the skeleton resume: ``load_state`` reads each leaf of a
    ``LeaderState`` from its old path (``LeaderState.LEGACY_PATHS``)."""
    hp = lqr.HParams()
    tr = lqr.make_train(lqr_game(), "bchg", lqr.TrainConfig(iterations=1))
    new = tr.init(jax.random.key(0), hp)
    old = _OldLQRState(*new)._replace(theta=new.actor + 1.0, P=new.follower * 2.0)
    old = old._replace(step=jnp.int32(5))
    save_state(str(tmp_path / "lqr"), old, 5)
    got = load_state(str(tmp_path / "lqr"), new)
    assert isinstance(got, ac.LeaderState)
    np.testing.assert_array_equal(got.actor, old.theta)
    np.testing.assert_array_equal(got.follower, old.P)
    assert int(got.step) == 5
    for a, b in zip(jax.tree.leaves(got.critic), jax.tree.leaves(old.critic), strict=True):
        np.testing.assert_array_equal(a, b)

    tt = tabular.make_train(toy_game(), "bchg", tabular.TrainConfig(iterations=1))
    new = tt.init(jax.random.key(0), tabular.HParams())
    crit = jax.tree.map(lambda x: x + 1.0, new.critic.params)
    old = _OldTabularState(
        new.actor, new.actor_targ, crit, new.critic_targ, new.actor_opt, new.critic_opt,
        new.follower + 3.0, new.buffer, new.key, jnp.int32(2),
    )  # fmt: skip
    save_state(str(tmp_path / "tab"), old, 2)
    got = load_state(str(tmp_path / "tab"), new)
    np.testing.assert_array_equal(got.follower, old.Q_F)
    for a, b in zip(jax.tree.leaves(got.critic.params), jax.tree.leaves(crit), strict=True):
        np.testing.assert_array_equal(a, b)
    assert got.replay is None and int(got.step) == 2


@pytest.mark.slow
def test_problem_metrics_come_from_the_caller():
    """The trainers add a problem's metrics only when ``metrics_fn`` is given (the CLIs pass
    ``toy_game_metrics`` / ``gain_metrics``); without it they report none of them."""
    tt = tabular.make_train(
        toy_game(), "naive", tabular.TrainConfig(iterations=1), toy_game_metrics
    )
    _, m = tt.train(jax.random.key(0), tabular.HParams())
    assert m["p"].shape == (1,) and m["g_S"].shape == (1, 3)
    _, m = tabular.make_train(toy_game(), "naive", tabular.TrainConfig(iterations=1)).train(
        jax.random.key(0), tabular.HParams()
    )
    assert "p" not in m and "g_S" not in m
    theta = jnp.array([-4.0, 1.5])
    assert {k: float(v) for k, v in gain_metrics(theta, None).items()} == {"K1": -4.0, "K2": 1.5}
    buf = buffer_init(1, 2)
    assert ac.critic_data(ac.LeaderState(*([None] * 7), buf, None, None, None)) is buf


def test_transitions_pair_each_step_with_its_successor():
    """The critics' minibatch (s, a, b, s') at (episode e, step t) is (s_t, a_t, b_t, s_t+1) of
    that episode (a successor taken from s_t passed the TD-loss tests, which build their inputs
    through the same function; only a slow training test saw it)."""
    N, T = 3, 4
    s = jnp.arange(N * (T + 1)).reshape(N, T + 1)
    a, b = 100 + jnp.arange(N * T).reshape(N, T), 200 + jnp.arange(N * T).reshape(N, T)
    buf = EpisodeBuffer(s, a, b, jnp.asarray(N))
    e, t = jnp.array([0, 2, 1, 2]), jnp.array([0, 3, 2, 1])
    got = [np.asarray(x) for x in ac.transitions(buf, e, t)]
    for i in range(4):
        ei, ti = int(e[i]), int(t[i])
        want = (ei * (T + 1) + ti, 100 + ei * T + ti, 200 + ei * T + ti, ei * (T + 1) + ti + 1)
        assert tuple(int(x[i]) for x in got) == want


class _Resp(NamedTuple):  # a follower that always answers
    converged: Any
    P: Any


def _toy_trainer(objective, opt, accepted=True, answer=None, follower=None, **extra):
    """The skeleton with trivial pieces: theta [2] float32 ascends ``objective(theta)`` with
    ``opt``; the follower always converges (so only the gradient can undo an update) unless
    ``answer`` (actor -> _Resp) is given; ``accepted`` False: the family has no ``accepted``
    condition."""

    def default_follower(actor, beta, warm):
        if answer is not None:
            return answer(actor)
        return _Resp(jnp.asarray(True), jnp.zeros((), jnp.float32))

    follower = default_follower if follower is None else follower

    def metrics(state, resp, episodes, beta, grad_norm, ok):
        return {"theta": state.actor, "grad_norm": grad_norm, "skipped": (~ok).astype(jnp.int32)}

    leader = ac.Leader(
        init_actor=lambda key: jnp.zeros(2, jnp.float32),
        init_critic=lambda key: ac.Critic(jnp.zeros(1, jnp.float32)),
        buffers=lambda: (jnp.zeros(1, jnp.float32), None),
        follower=follower,
        warm=lambda resp: resp.P,
        respond=lambda state, beta: follower(state.actor, beta, state.follower),
        collect=lambda key, state, resp: (state, None),
        critic=None,
        actor=lambda state, critic, resp, beta: (lambda p, b, k: objective(p), None, True),
        metrics=metrics,
        accepted=(lambda resp: resp.converged) if accepted else None,
        **extra,
    )
    config = lqr.TrainConfig(iterations=1)
    return ac.assemble(None, "toy", config, leader, lqr.HParams, opt, optax.sgd(0.1), {})


def _one_step(objective, opt, accepted=True):
    tr = _toy_trainer(objective, opt, accepted)
    _, m = tr.run(tr.init(jax.random.key(0), lqr.HParams()), lqr.HParams(), 1)
    return {k: np.asarray(v)[0] for k, v in m.items()}


def test_a_finite_gradient_whose_squares_overflow_is_clipped_along_its_direction():
    """float32 gradient (3e20, -4e20): its sum of squares overflows, so optax's global norm was
    inf and clip_by_global_norm scaled the step by 1 / inf = 0. The leader froze, every update
    counted as taken. Now the norm is 5e20 (exact) and the clipped step is 0.1 (0.6, -0.8)."""
    objective = lambda p: 1e20 * (3.0 * p[0] - 4.0 * p[1])  # noqa: E731
    sgd = optax.chain(clip_by_global_norm(1.0), optax.sgd(0.1))
    m = _one_step(objective, sgd)
    np.testing.assert_allclose(m["theta"], [0.06, -0.08], rtol=1e-6)
    np.testing.assert_allclose(m["grad_norm"], 5e20, rtol=1e-6)
    assert m["skipped"] == 0
    # the LQR leader's own optimizer (clip, then Adam: a first step of lr along the sign)
    adam = ActorConfig(lr=0.1, clip=1.0).optimizer(10)
    np.testing.assert_allclose(_one_step(objective, adam)["theta"], [0.1, -0.1], rtol=1e-5)
    # the LQ trainers' step
    step = sgd_ascent(jnp.zeros(2, jnp.float32), jnp.float32([3e19, -4e19]), 0.1, 1.0)
    np.testing.assert_allclose(step, [0.06, -0.08], rtol=1e-6)
    # ordinary gradients: bitwise optax's clip
    for g in (jnp.float32([3.0, 4.0]), jnp.float32([0.3, 0.4]), jnp.float32([1e-30, 0.0])):
        ours = clip_by_global_norm(1.0).update(g, optax.EmptyState())[0]
        theirs = optax.clip_by_global_norm(1.0).update(g, optax.EmptyState())[0]
        np.testing.assert_array_equal(ours, theirs)
        assert float(global_norm(g)) == float(optax.tree.norm(g)) or float(g[1]) == 0.0


@pytest.mark.parametrize("accepted", [True, False], ids=["accepted", "no-accepted"])
def test_an_update_from_a_non_finite_gradient_is_undone_and_flagged(accepted):
    """The update was accepted on the follower's convergence alone: an infinite gradient left
    theta NaN with ``update_skipped`` 0. Now it is undone and counted (the make_train
    docstring's "or the gradient was not finite"), also for a family without ``accepted``
    (the tabular game's), which applied every update."""
    objective = lambda p: jnp.sum(p) * jnp.float32(jnp.inf)  # noqa: E731
    m = _one_step(objective, optax.chain(clip_by_global_norm(1.0), optax.adam(0.1)), accepted)
    np.testing.assert_array_equal(m["theta"], [0.0, 0.0])
    assert m["skipped"] == 1 and m["grad_norm"] == np.inf
    finite = _one_step(lambda p: jnp.sum(p), optax.sgd(0.1), accepted)  # a finite one is taken
    np.testing.assert_allclose(finite["theta"], [0.1, 0.1], rtol=1e-6)
    assert finite["skipped"] == 0


def test_an_update_the_follower_cannot_answer_is_undone_with_its_answer():
    """``accepted`` refuses the follower's answer to the update: the leader stays, and the
    follower's warm start is its answer to the leader that stays, not the refused one (a
    skeleton that kept the refused answer passed every other test)."""

    def answer(actor):  # converges only near theta = 0; its P tells the answers apart
        return _Resp(jnp.sum(actor) < 0.05, jnp.sum(actor) + 7.0)

    tr = _toy_trainer(lambda p: jnp.sum(p), optax.sgd(0.1), answer=answer)
    state, m = tr.run(tr.init(jax.random.key(0), lqr.HParams()), lqr.HParams(), 1)
    assert int(np.asarray(m["skipped"])[0]) == 1  # theta 0.1 each: sum 0.2, refused
    np.testing.assert_array_equal(np.asarray(state.actor), [0.0, 0.0])
    np.testing.assert_allclose(float(state.follower), 7.0)  # the answer to theta = 0
    tr = _toy_trainer(lambda p: jnp.sum(p), optax.sgd(0.01), answer=answer)
    state, m = tr.run(tr.init(jax.random.key(0), lqr.HParams()), lqr.HParams(), 1)
    assert int(np.asarray(m["skipped"])[0]) == 0  # sum 0.02: taken, and so is its answer
    np.testing.assert_allclose(float(state.follower), 7.02, rtol=1e-6)


@pytest.mark.parametrize("limit", [5.0, 1.5], ids=["kept-answer-taken", "kept-answer-refused"])
def test_a_learner_keeps_learning_at_the_leader_that_stays(limit):
    """A follower with a clock of its own (``keeps_learning``: a K-step learner) answers the
    leader that stays when its answer to the update is refused: one more step from the same
    memory there, kept if ``accepted`` takes it, else the answer before. Without the flag its
    clock stopped with the refused update (a K-step learner that fell behind a leader at the
    edge of what it could follow stayed behind, and every later update was refused)."""

    def clock(actor, beta, warm):  # P counts the learner's steps; theta 0.1 each is refused,
        steps = jnp.float32(0.0) if warm is None else warm + 1.0  # so is a clock past limit
        return _Resp((jnp.sum(actor) < 0.05) & (steps < limit), steps)

    def follower_after_one_step(**extra):
        tr = _toy_trainer(lambda p: jnp.sum(p), optax.sgd(0.1), follower=clock, **extra)
        state, m = tr.run(tr.init(jax.random.key(0), lqr.HParams()), lqr.HParams(), 1)
        assert int(np.asarray(m["skipped"])[0]) == 1
        np.testing.assert_array_equal(np.asarray(state.actor), [0.0, 0.0])
        stalled = m.get("follower_stalled")
        return float(state.follower), None if stalled is None else int(np.asarray(stalled)[0])

    start = 1.0  # init answers theta0 (0) and respond answers it again from that memory
    assert follower_after_one_step() == (start, None)  # the answer before, no such metric
    moved = limit > start + 1.0  # else its answer at the kept leader is refused too: stalled
    expected = (start + 1.0, 0) if moved else (start, 1)
    assert follower_after_one_step(keeps_learning=True) == expected


def _nan_critic_step(follower=None):
    """One iteration of the toy game's trainer from a critic whose weights are NaN (a critic
    that diverged): (state before, state after, metrics)."""
    from bchg_jax.core.follower_model import FollowerModel

    kw = {} if follower is None else dict(follower=FollowerModel(**follower))
    config = tabular.TrainConfig(episodes=2, minibatch=8, iterations=1, **kw)
    tr = tabular.make_train(toy_game(), "bchg", config)
    hp = jax.tree.map(lambda x: x[0], tr.hparams({"actor_steps": [1], "beta": [0.05]}))
    state = tr.init(jax.random.key(0), hp)
    nan = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), state.critic.params)
    state = state._replace(critic=state.critic._replace(params=nan))
    new, m = tr.run(state, hp, 1)
    return state, new, {k: np.asarray(v)[0] for k, v in m.items()}


@pytest.mark.slow
def test_the_tabular_game_undoes_an_update_from_a_diverged_critic():
    """The tabular game's trainer applied every actor update: a NaN critic made the leader NaN
    (and so every later iteration) with ``update_skipped`` 0 ("this trainer never drops one").
    Now the update is undone and counted; the leader and its Adam state stay as they were."""
    state, new, m = _nan_critic_step()
    assert m["update_skipped"] == 1
    chex_equal = lambda a, b: jax.tree.map(np.testing.assert_array_equal, a, b)  # noqa: E731
    chex_equal((new.actor, new.actor_opt), (state.actor, state.actor_opt))
    assert np.isfinite(m["J"])
    # a follower that learns from samples keeps what it learnt from the batch, answering the
    # leader that stayed
    state, new, m = _nan_critic_step(dict(kind="q_learning", lr=0.5))
    assert m["update_skipped"] == 1
    chex_equal(new.actor, state.actor)
    learnt = np.asarray(new.follower.own)
    assert np.all(np.isfinite(learnt)) and not np.array_equal(learnt, state.follower.own)


def test_a_leader_with_both_accepted_and_learn_is_refused():
    pieces = dict.fromkeys(ac.Leader._fields, None)  # never called: refused before use
    pieces.update(accepted=lambda r: True, learn=lambda *a: None)
    with pytest.raises(ValueError, match="both accepted and learn"):
        ac.assemble(
            None, "toy", lqr.TrainConfig(), ac.Leader(**pieces), lqr.HParams, None, None, {}
        )


def test_tabular_td_loss_is_the_squared_error_to_the_leaders_discounted_target(backup_game):
    """The critic's TD loss (critic_target "reference": the modes of the target actor and of g)
    written out on a game whose discounts differ (gamma_L 0.9, gamma_F 0.7):
    mean (Q(s, a, b) - r_L(s, a, b) - gamma_L Q_targ(s', a*, b*))^2. No test evaluated the
    target: gamma_F in place of gamma_L passed test_actor_critic.py."""
    game = backup_game()
    tr = tabular.make_train(game, "bchg", tabular.TrainConfig(iterations=1, minibatch=64))
    hp = tabular.HParams(1, 1, 0.1)
    state = tr.init(jax.random.key(0), hp)
    resp = tr.steps["follower"](state.actor, jnp.float32(0.1))
    state, _ = tr.steps["collect"](jax.random.key(1), state, resp)
    critic, loss, draw = tr.steps["critic_task"](state, resp)
    s, a, b, s2 = draw(jax.random.key(2))
    Q = tr.steps["q_table"](critic.params)
    Qt = tr.steps["q_table"](state.critic_targ)
    a_star = jnp.argmax(tr.steps["policy"](state.actor_targ)[s2], -1)
    b_star = jnp.argmax(resp.policy[s2, a_star], -1)
    rL = jnp.asarray(game.leader_reward, Q.dtype)
    y = rL[s, a, b] + game.gamma_L * Qt[s2, a_star, b_star]
    ref = jnp.mean((Q[s, a, b] - y) ** 2)
    got = loss(critic.params, (s, a, b, s2), jax.random.key(3))
    np.testing.assert_allclose(float(got), float(ref), rtol=1e-5)
