"""Every solver and exact reference computes its products at full precision (issue: TF32 / bf16
passes on accelerators kept the 1e-6 solvers from ever converging).

A CPU cannot show the difference numerically, so these tests are structural: each function (and
its derivative, where the library differentiates it) is traced and every ``dot_general`` in the
jaxpr, sub-jaxprs included, must carry ``Precision.HIGHEST``. Tracing only: nothing compiles.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax import games, lq, problems, tabular
from bchg_jax.core import maxent_lqr, sweep
from bchg_jax.core.precision import (
    full_precision,
    is_highest,
    jaxpr_dot_precisions,
    jaxpr_dots,
    low_precision_dots,
)
from bchg_jax.core.run_last import run_last
from bchg_jax.games.lqr import exact as lqr_exact
from bchg_jax.games.tabular import exact as game_exact
from bchg_jax.lq import critics as lq_critics
from bchg_jax.lq import exact as lq_exact
from bchg_jax.tabular import exact as tab_exact
from bchg_jax.tabular import sparse
from bchg_jax.tabular.follower import continuation, soft_value_iteration


def _full(fn, *args, **kwargs):
    bad = low_precision_dots(fn, *args, **kwargs)
    assert not bad, f"{len(bad)} matmuls below full precision in {getattr(fn, '__name__', fn)}"


def test_the_check_can_fail():
    x = jnp.ones((3, 3))
    assert len(low_precision_dots(lambda a: a @ a, x)) == 1
    assert low_precision_dots(full_precision(lambda a: a @ a), x) == []
    # a user's global setting does not hide a product left at the default
    with jax.default_matmul_precision("highest"):
        assert len(low_precision_dots(lambda a: jnp.linalg.solve(a, a @ a), x)) >= 1
    # sub-jaxprs are searched (a product inside a while loop inside a jit)
    loop = jax.jit(lambda a: jax.lax.fori_loop(0, 3, lambda i, m: m @ a, a))
    assert len(jaxpr_dot_precisions(jax.make_jaxpr(loop)(x))) == 1


@pytest.fixture(scope="module")
def cmdp():
    return problems.random_tabular_cmdp(jax.random.key(0), num_states=6, num_actions=3, dim=4)


def test_tabular_solvers_and_exact_references(cmdp):
    theta, beta = jnp.asarray(cmdp.theta0), 0.1
    P, rF, rL = cmdp.transition(theta), cmdp.follower_reward(theta), cmdp.leader_reward(theta)
    S = cmdp.num_states
    cont = continuation(None, S, jnp.float32)
    pol = jnp.full((S, cmdp.num_actions), 1.0 / cmdp.num_actions)
    _full(soft_value_iteration, P, rF, beta, cmdp.gamma_F, tol=1e-6, max_sweeps=50)
    _full(tab_exact.policy_evaluation, P, rL, pol, cmdp.gamma_L, cont)
    _full(
        tab_exact.policy_evaluation_sweeps,
        P,
        rL,
        pol,
        cmdp.gamma_L,
        cont,
        jnp.zeros(S),
        tol=1e-6,
        max_sweeps=50,
    )
    _full(tab_exact.soft_newton, P, rF, beta, cmdp.gamma_F, cont, jnp.zeros(S), iters=3)
    _full(lambda th: tab_exact.best_response(cmdp, th, beta).V, theta)
    _full(functools.partial(tab_exact.leader_objective, cmdp), theta, beta)
    _full(functools.partial(tab_exact.exact_hypergradient, cmdp), theta, beta)
    # the implicit derivative's linear solves, forward and reverse
    _full(jax.grad(lambda th: tab_exact.best_response(cmdp, th, beta).V.sum()), theta)


def test_tabular_sparse_solvers_one_run_and_vmapped():
    fr = problems.fourrooms()
    theta = jnp.asarray(fr.theta0)
    succ = sparse.problem_successors(fr)
    P, rF, rL = fr.transition(theta), fr.follower_reward(theta), fr.leader_reward(theta)
    S = fr.num_states
    cont = continuation(fr.terminal_mask, S, jnp.float32)
    pol = jnp.full((S, 4), 0.25)

    def soft(r):
        return sparse.sparse_soft_value_iteration(P, r, 1e-3, fr.gamma_F, succ, fr.terminal_mask).V

    def evaluation(r):
        return sparse.sparse_policy_evaluation(
            P, r, pol, fr.gamma_L, cont, jnp.zeros(S), succ, tol=1e-6
        )

    for fn in (soft, evaluation):
        _full(fn, rF if fn is soft else rL)
        _full(jax.vmap(fn), jnp.stack([rF if fn is soft else rL] * 3))  # the run-last rule


@pytest.mark.parametrize("solver", ["dense", "sparse"])
def test_tabular_trainer_follower_and_metric_steps(solver):
    fr = problems.fourrooms()
    trainer = tabular.make_train(fr, "bchg", tabular.TrainConfig(solver=solver, iterations=2))
    theta = jnp.asarray(fr.theta0)
    S = fr.num_states
    _full(trainer.steps["follower"], theta, 1e-3, jnp.zeros(S))
    _full(trainer.steps["evaluate"], theta, jnp.full((S, 4), 0.25), jnp.zeros(S))


def test_tabular_followers_off_their_best_response(cmdp):
    """The learners' solves, the leader's view V^g and the references (issue 30)."""
    from bchg_jax.tabular import follower_models as fm
    from bchg_jax.tabular import follower_references as refs

    theta, beta = jnp.asarray(cmdp.theta0), 0.1
    P, rF = cmdp.transition(theta), cmdp.follower_reward(theta)
    S, B = cmdp.num_states, cmdp.num_actions
    cont, pol, V = continuation(None, S, jnp.float32), jnp.full((S, B), 1.0 / B), jnp.zeros(S)
    _full(lambda r: fm.k_step_response(P, r, beta, cmdp.gamma_F, None, V, 3).policy, rF)
    _full(lambda r: fm.observed_follower(P, r, pol, beta, cmdp.gamma_F, cont, 0).Q, rF)
    _full(lambda t: refs.as_if_optimal_hypergradient(cmdp, t, pol, beta), theta)
    _full(lambda t: refs.k_step_hypergradient(cmdp, t, V, beta, 3), theta)
    _full(lambda t: refs.lag_hypergradient(cmdp, t, pol, beta, 0.5), theta)


def test_lq_k_step_follower():
    th = problems.thermal()
    theta, beta, P0 = jnp.asarray(th.theta0), 0.1, jnp.zeros((4, 4))
    played, _ = lq.k_step_response(th, theta, beta, P0, 3)
    _full(lambda t: lq.k_step_response(th, t, beta, P0, 3)[0].K, theta)
    _full(lambda t: lq.observed_follower(th, t, played, beta).P, theta)
    _full(lambda t: lq.as_if_optimal_hypergradient(th, t, played, beta), theta)
    _full(lambda t: lq.k_step_hypergradient(th, t, P0, beta, 3), theta)


def test_lq_riccati_propositions_exact_and_lstd():
    th = problems.thermal()
    theta, beta = jnp.asarray(th.theta0), 0.1
    A, B = th.A_fn(theta), th.B_fn(theta)
    Q, R, U = (jnp.asarray(x, jnp.float32) for x in (th.Qbar, th.Rbar, th.U))
    g = th.gamma_F
    _full(lambda a: maxent_lqr.riccati(a, B, Q, R, g)[0], A)
    _full(jax.grad(lambda a: maxent_lqr.riccati(a, B, Q, R, g)[0].sum()), A)
    _full(lambda a: maxent_lqr.maxent_lqr(a, B, Q, R, U, g, beta).K, A)
    _full(lambda a: maxent_lqr.maxent_lqr_observable(a, B, Q, R, U, g, beta).K_w, A)
    _full(lambda t: th.best_response(t, beta).P, theta)
    _full(functools.partial(lq_exact.leader_objective, th), theta, beta)
    _full(functools.partial(lq_exact.exact_hypergradient, th), theta, beta)
    br_th = th.best_response(theta, beta)
    _full(lambda t: lq_exact.objective_and_components(th, t, br_th, th.components(t)), theta)
    F = 0.5 * jnp.eye(3)
    _full(lq_exact.discounted_lyapunov, F, jnp.eye(3), 0.9)
    n, m = th.state_dim, B.shape[1]
    s, b = jnp.ones((4, 6, n)), jnp.ones((4, 6, m))
    _full(
        lambda s_, b_: jax.tree.leaves(lq_critics.fit_quadratic_q(s_, b_, jnp.ones((4, 5)), 0.9)),
        s,
        b,
    )
    _full(lambda s_: lq_critics.fit_quadratic_vector_value(s_, jnp.ones((4, 5, 2)), 0.9)(s_), s)
    phi = lq_critics.quadratic_features(jnp.ones((20, 3)) + jnp.arange(20.0)[:, None] / 9)
    _full(lambda p: lq_critics.lstd(p, 0.5 * p, jnp.ones(20), 0.9), phi)  # called on its own
    br = th.best_response(theta, beta)
    # the follower's values whose difference is the Benefit (a cancellation: values ~1e2)
    _full(lambda x: maxent_lqr.soft_q(br, A, B, Q, R, U, g, x, b[:, :, :]), s)
    _full(lambda x: maxent_lqr.soft_value(br, x), s)


def test_lq_trainer_follower_and_metric_steps():
    th = problems.thermal()
    trainer = lq.make_train(th, "bchg", lq.TrainConfig(iterations=2))
    theta = jnp.asarray(th.theta0)
    _full(lambda t: trainer.steps["follower"](t, 0.1, None).P, theta)
    br = th.best_response(theta, 0.1)
    _full(lambda t: trainer.steps["evaluate"](t, 0.1, br)["J"], theta)


def test_tabular_game_follower_and_exact():
    game = problems.toy_game()
    f = jnp.full((game.num_states, game.num_leader_actions), 1.0 / game.num_leader_actions)
    _full(lambda f_: games.tabular.soft_q_iteration(game, f_, 0.05, tol=1e-6, max_sweeps=50).Q, f)
    _full(lambda f_: game_exact.best_response(game, f_, 0.05).Q, f)
    _full(lambda f_: game_exact.leader_objective(game, f_, 0.05), f)
    br0 = game_exact.best_response(game, f, 0.05)
    _full(
        lambda f_: game_exact.leader_return(
            game, f_, game_exact.best_response(game, f_, 0.05).policy
        ),
        f,
    )
    _full(lambda f_: game_exact.leader_returns(game, f_, br0.policy, (1.0, 0.9)), f)
    _full(jax.grad(lambda f_: game_exact.leader_objective(game, f_, 0.05)), f)
    # the references for followers that are not at their best response (issue 30)
    br = game_exact.best_response(game, f, 0.05)
    _full(lambda f_: game_exact.soft_policy_evaluation(game, f_, br.policy, 0.05)[1], f)
    pf, th = (lambda t: jax.nn.softmax(t, -1)), jnp.zeros((3, 2))
    _full(lambda t: game_exact.as_if_optimal_hypergradient(pf, t, game, br.policy, 0.05), th)
    _full(lambda t: game_exact.k_step_hypergradient(pf, t, game, br.Q, 0.05, 2), th)
    _full(
        lambda t: game_exact.lag_hypergradient(pf, t, game, br.policy, 0.05, 0.5, Q_star=br.Q), th
    )
    from bchg_jax.core.follower_model import FollowerModel
    from bchg_jax.games.tabular.follower_models import follower_pieces

    for model in (FollowerModel("k_step", steps=2), FollowerModel("lag")):
        pieces = follower_pieces(game, model, "reference", 1e-6, 50)
        _full(lambda f_: pieces.follower(f_, 0.05, pieces.follower(f, 0.05)).V, f)


def test_lqr_game_follower_and_exact():
    game = problems.lqr_game()
    theta = jnp.asarray([-4.0, 0.5])
    resp = games.lqr.best_response(game, theta, 0.1)
    n = game.state_dim
    s = jnp.ones((3, n))
    a = jnp.ones((3, game.leader_dim))
    b = jnp.ones((3, game.follower_dim))
    _full(lambda t: games.lqr.best_response(game, t, 0.1).P, theta)
    _full(lambda t: lqr_exact.leader_objective(game, t, 0.1), theta)
    _full(lambda t: lqr_exact.leader_returns(game, t, 0.1, (1.0, game.gamma_L)), theta)
    _full(lambda t: lqr_exact.exact_hypergradient(game, t, 0.1), theta)
    _full(lambda t: lqr_exact.hypergradient_split(game, t, 0.1), theta)
    _full(lambda x: games.lqr.follower_value(game, resp, x, a), s)
    _full(lambda x: games.lqr.follower_q(game, resp, theta, x, a, b), s)
    _full(lambda x: resp.log_prob(x, a, b), s)


def test_lqr_game_k_step_follower_and_references():
    from bchg_jax.games.lqr import follower_models as fm
    from bchg_jax.games.lqr import follower_references as refs

    game = problems.lqr_game()
    theta, P0 = jnp.asarray([-4.0, 0.5]), jnp.zeros((2, 2))
    played, _ = fm.k_step_response(game, theta, 0.1, P0, 3)
    _full(lambda t: fm.k_step_response(game, t, 0.1, P0, 3)[0].P, theta)
    _full(lambda t: fm.k_step_response(game, t, 0.1, P0, 3, stochastic=False)[1], theta)
    _full(lambda t: refs.fixed_policy_value(game, t, played), theta)
    _full(lambda t: refs.as_if_optimal_hypergradient(game, t, played, 0.1), theta)
    _full(lambda t: refs.k_step_hypergradient(game, t, P0, 0.1, 3), theta)


def test_custom_derivative_rules_traced_after_the_callers_scope():
    """A custom JVP rule is traced when a jaxpr holding it is differentiated: for ``grad`` of a
    jitted function, of a ``scan`` or of a ``checkpoint``, that is after the exact reference's
    full-precision scope has closed. The LQR game's ``square_factor`` rule ran its QR at the
    default precision there (emulated TF32: its ``grad(jit(leader_objective))`` 1.3e-4 off, bf16
    1.2e-3); every family's exact objective is checked under the three wrappers."""
    lg, theta_g = problems.lqr_game(), jnp.asarray([-4.0, 0.5])
    th = problems.thermal()
    cm = problems.random_tabular_cmdp(jax.random.key(0), num_states=6, num_actions=3, dim=4)
    game = problems.toy_game()
    f = jnp.full((game.num_states, game.num_leader_actions), 1.0 / game.num_leader_actions)
    objectives = [
        (lambda t: lqr_exact.leader_objective(lg, t, 0.1), theta_g),
        (lambda t: lqr_exact.leader_returns(lg, t, 0.1, (1.0, lg.gamma_L))[1], theta_g),
        (lambda t: lq_exact.leader_objective(th, t, 0.1), jnp.asarray(th.theta0)),
        (lambda t: tab_exact.leader_objective(cm, t, 0.1), jnp.asarray(cm.theta0)),
        (lambda f_: game_exact.leader_objective(game, f_, 0.05), f),
    ]
    for obj, x in objectives:

        def scanned(t, obj=obj):
            return jax.lax.scan(lambda c, _: (c + obj(t), None), 0.0, None, length=1)[0]

        for wrapped in (jax.jit(obj), scanned, jax.checkpoint(obj)):
            _full(jax.grad(wrapped), x)
    # the rule itself, called on its own
    X = jnp.arange(12.0).reshape(3, 4) / 7.0 + jnp.eye(3, 4)
    _full(lambda x: jax.jvp(lqr_exact.square_factor, (x,), (jnp.ones_like(x),)), X)


def test_neural_critics_keep_the_users_default():
    """The MLP critics are not forced to full precision (TF32 is what makes them fast)."""
    from bchg_jax.core.networks import MLP

    net = MLP((8,), 1)
    params = net.init(jax.random.key(0), jnp.ones((1, 3)))
    assert low_precision_dots(net.apply, params, jnp.ones((5, 3)))


HIDDEN = 13  # a network width no solver, problem or batch of these tests has


def _network_dots(trainer, grid):
    """(precisions of the products that touch a ``HIDDEN``-wide operand, the other products'):
    the program the command lines compile (``core.sweep.grid_functions``: the outer iterations
    vmapped over grid points and seeds) is traced, sub-jaxprs included. Tracing it vmapped
    matters: a ``custom_vmap`` rule inside a loop body is traced only then."""
    init, run = sweep.grid_functions(trainer)
    hp = trainer.hparams(grid)
    state = init(sweep.seed_keys(2), hp)
    net, other = [], []
    with jax.default_matmul_precision(None):
        jaxpr = jax.make_jaxpr(run, static_argnums=2)(state, hp, 2)
    for eqn in jaxpr_dots(jaxpr):
        wide = any(HIDDEN in v.aval.shape for v in eqn.invars)
        (net if wide else other).append(eqn.params.get("precision"))
    return net, other


def _teleport(dtype=jnp.float32):
    """A 4-state chain whose support moves with theta (the sparse trainer's dense fallback)."""
    base = np.zeros((4, 2, 4), np.float32)
    base[np.arange(4), 0, np.maximum(np.arange(4) - 1, 0)] = 1.0
    base[np.arange(4), 1, np.minimum(np.arange(4) + 1, 3)] = 1.0
    tele = base.copy()
    tele[:, 1] *= 0.5
    tele[:, 1, 3] += 0.5
    base, tele = jnp.asarray(base), jnp.asarray(tele)
    return tabular.TabularCMDP(
        transition=lambda th: jnp.where(th[0] > 1.0, tele, base),
        init_dist=lambda th: jnp.zeros(4).at[0].set(1.0),
        follower_reward=lambda th: jnp.zeros((4, 2)).at[:, 1].set(th[1]),
        leader_reward=lambda th: jnp.zeros((4, 2)).at[3].set(1.0),
        gamma_F=0.8,
        gamma_L=0.8,
        theta0=jnp.asarray([0.0, 0.5]),
        time_limit=50,
        name="teleport",
    ).validate()


@pytest.mark.parametrize(
    "case",
    [
        "fourrooms_sparse",
        "fourrooms_dense",
        "fourrooms_exact",
        "random_cmdp_dense",
        "thermal",
        "thermal_hpgd_mc",
        *(
            pytest.param(case, marks=pytest.mark.slow)
            for case in (
                "fourrooms_k_step",
                "fourrooms_q_learning",
                "moving_support_sparse",
                "random_cmdp_sparse_hpgd_oracle",
                "thermal_exact",
                "thermal_k_step",
            )
        ),
    ],
)
def test_whole_vmapped_trainers_without_networks_are_at_full_precision(case):
    """Every product of the grid program the command line compiles, not only of each solver
    alone: the tabular and LQ families (quadratic critics) have no network, so no product may
    be left to the accelerator's default. The sparse solvers inside the vmapped loop failed
    this (their ``custom_vmap`` rule traced the sweeps outside the full-precision scope)."""
    from bchg_jax.core.follower_model import FollowerModel as fm

    if case.startswith("fourrooms"):
        method = "exact" if case == "fourrooms_exact" else "bchg"
        cfg = {
            "fourrooms_dense": dict(solver="dense"),
            "fourrooms_k_step": dict(follower=fm("k_step", steps=3), track_reference=True),
            "fourrooms_q_learning": dict(follower=fm("q_learning", lr=0.1, explore=0.1)),
        }.get(case, {})
        trainer = tabular.make_train(problems.fourrooms(), method, tabular.TrainConfig(**cfg))
        grid = {"lr": [0.1]}
    elif case.startswith("random_cmdp"):
        # tables built with products (softmax(W theta + b)): the trainer's sampler and estimators
        # call them outside any solver, so the problem class wraps them (full_precision_fields)
        solver, method = ("sparse", "hpgd_oracle") if "sparse" in case else ("dense", "bchg")
        cm = problems.random_tabular_cmdp(jax.random.key(0), num_states=6, num_actions=3, dim=4)
        trainer = tabular.make_train(cm, method, tabular.TrainConfig(solver=solver))
        grid = {"lr": [0.1]}
    elif case == "moving_support_sparse":
        cfg = tabular.TrainConfig(solver="sparse", num_steps=50, num_envs=2)
        trainer, grid = tabular.make_train(_teleport(), "bchg", cfg), {"lr": [0.1]}
    else:
        method = {"thermal_hpgd_mc": "hpgd_mc", "thermal_exact": "exact"}.get(case, "bchg")
        cfg = lq.TrainConfig(
            num_episodes=4,
            follower=fm("k_step", steps=3) if case == "thermal_k_step" else fm(),
            track_reference=case == "thermal_k_step",
        )
        trainer, grid = lq.make_train(problems.thermal(), method, cfg), {"lr": [0.1]}
    net, other = _network_dots(trainer, grid)
    assert not net and other
    low = [p for p in other if not is_highest(p)]
    assert not low, f"{len(low)} of {len(other)} products below full precision"


@pytest.mark.parametrize(
    "family",
    [
        "thermal_faithful",
        "toy_game",
        "toy_game_k_step",
        "lqr_game",
        "lqr_game_det",
        "lqr_explore",
        "lqr_game_k_step",
    ],
)
@pytest.mark.slow
def test_neural_critics_and_actors_keep_the_users_precision_inside_the_trainer(family):
    """Inside a whole trainer (what the CLIs run), every product of a network (an operand
    ``HIDDEN`` wide: the MLP critics' fits, the actors' steps) keeps the default precision, while
    every other product of the same program (solvers, rollouts, linear policies, estimators'
    sums, metrics) is at HIGHEST: a full-precision scope wrapped around a step would make the
    networks several times slower on tensor cores (the faithful thermal critic fit is ~1.8
    TFLOP per iteration), and a linear policy's K s at TF32 is rounded by more than the LQR
    game's Gaussian leader noise (U = 1e-3)."""
    wide = (HIDDEN, HIDDEN)
    if family == "thermal_faithful":
        cfg = lq.TrainConfig(
            critic="mlp",
            follower_grad="score",
            state_baseline=False,
            control_variates=False,
            mlp_steps=3,
            mlp_hidden=wide,
            value_samples=2,
            num_episodes=2,
        )
        trainer, grid = lq.make_train(problems.thermal(), "bchg", cfg), {"lr": [0.1]}
    elif family.startswith("toy_game"):
        from bchg_jax.core.follower_model import FollowerModel

        follower = FollowerModel("k_step", steps=2) if family == "toy_game_k_step" else None
        extra = dict(follower=follower, track_reference=True) if follower else {}
        cfg = games.tabular.TrainConfig(hidden=wide, **extra)
        trainer = games.tabular.make_train(problems.toy_game(), "bchg", cfg)
        grid = {"actor_steps": [1], "critic_steps": [2]}
    elif family == "lqr_explore":  # the command line's default: control variate, replay, ...
        from bchg_jax.games.lqr.presets import PRESETS

        base = PRESETS["explore"]().config
        cfg = dataclasses.replace(
            base,
            critic=dataclasses.replace(base.critic, hidden=wide, precision=None),
            exploration=dataclasses.replace(base.exploration, warmup_steps=0),
        )
        trainer = games.lqr.make_train(problems.lqr_game(), "bchg", cfg)
        grid = {"actor_steps": [1]}
    else:
        cfg = games.lqr.TrainConfig(
            critic=games.lqr.CriticConfig(hidden=wide, precision=None),
            exploration=games.lqr.ExplorationConfig(warmup_steps=0),
        )
        if family == "lqr_game_k_step":
            from bchg_jax.core.follower_model import FollowerModel

            cfg = dataclasses.replace(cfg, follower=FollowerModel("k_step", steps=2))
        method = "bchg_det" if family == "lqr_game_det" else "bchg"
        trainer = games.lqr.make_train(problems.lqr_game(), method, cfg)
        grid = {"actor_steps": [1]}
    net, other = _network_dots(trainer, grid)
    assert net and any(p is None for p in net), "no network product at the default"
    # with track_reference the exact references evaluate the leader's network at HIGHEST too
    if family != "toy_game_k_step":
        assert all(p is None for p in net), f"network products not at the default: {net}"
    low = [p for p in other if not is_highest(p)]
    assert other and not low, f"{len(low)} of {len(other)} other products below full precision"


@pytest.mark.parametrize("precision", [None, "highest"])
@pytest.mark.slow
def test_lqr_game_critic_precision_option(precision):
    """``CriticConfig.precision``: None keeps the user's setting for the critic's products,
    "highest" (the default, and so both presets') puts them at full precision: the Gaussian
    leader's Q differences over actions U = 1e-3 apart are swamped by TF32's input rounding."""
    wide = (HIDDEN, HIDDEN)
    cfg = games.lqr.TrainConfig(
        critic=games.lqr.CriticConfig(hidden=wide, precision=precision),
        exploration=games.lqr.ExplorationConfig(warmup_steps=0),
    )
    trainer = games.lqr.make_train(problems.lqr_game(), "bchg", cfg)
    net, other = _network_dots(trainer, {"actor_steps": [1]})  # the actor is linear: critic only
    assert net and all(is_highest(p) == (precision == "highest") for p in net)
    assert all(is_highest(p) for p in other)
    from bchg_jax.games.lqr.presets import PRESETS

    assert games.lqr.CriticConfig().precision == "highest"
    assert all(PRESETS[p]().config.critic.precision == "highest" for p in ("explore", "reference"))


def test_control_variate_ridge_fit():
    from bchg_jax.games.control_variate import crossfit_baseline, quadratic_features

    x = jax.random.normal(jax.random.key(1), (40, 3))
    _full(
        lambda x_: crossfit_baseline(
            quadratic_features(x_), jnp.ones((40, 2)), jnp.arange(40) % 4, 4
        ),
        x,
    )


def _plain_run_last_impl(has_run, x, w):
    """A run-last implementation that does not decorate itself: x [n(, R)] -> W x [m, R]."""
    x = x if has_run[0] else x[..., None]
    return (w @ x,)


def test_run_last_and_cond_on_any_lane_compute_at_their_callers_precision():
    """The batching rules of ``run_last`` and ``cond_on_any_lane`` are traced when ``vmap``
    reaches them; inside a scanned body that is after the caller's ``full_precision`` scope has
    closed. Both record the caller's precision and re-enter it, so an implementation (or a
    branch) without the decorator still computes at full precision there, and one called at
    the default keeps the default."""
    f = run_last(_plain_run_last_impl)
    w = jnp.ones((3, 4))
    xs = jnp.ones((5, 6, 4))  # 5 runs x 6 scan steps

    def cond_step(x, w):
        return sparse.cond_on_any_lane(x[0] > 0, lambda a, b: b @ a, lambda a, b: -(b @ a), x, w)

    for step in (lambda x, w: f(x, w)[0], cond_step):

        def trainer(xs, w, solve):
            return jax.lax.scan(lambda c, x: (c, solve(x, w)), 0.0, xs)[1]

        scoped = functools.partial(trainer, solve=full_precision(step))
        plain = functools.partial(trainer, solve=step)
        assert not low_precision_dots(jax.vmap(scoped, in_axes=(0, None)), xs, w)
        assert not low_precision_dots(
            jax.vmap(jax.vmap(scoped, in_axes=(0, None)), in_axes=(0, None)), xs[None], w
        )
        assert low_precision_dots(jax.vmap(plain, in_axes=(0, None)), xs, w)
        out = jax.vmap(scoped, in_axes=(0, None))(xs, w)
        np.testing.assert_allclose(out, jnp.full((5, 6, 3), 4.0))
