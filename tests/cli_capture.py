"""What an experiment CLI's ``run_method`` hands the trainer and the run folder, with training
stubbed out: the flag-wiring tests of ``tests/experiments`` read it (nothing compiles)."""

import importlib


def captured_run(monkeypatch, tmp_path, cli, argv, method, problem, train_module, validate):
    """Runs ``cli.run_method(method, ...)`` after ``cli.<validate>(args)`` with the problem
    constructor ``problem = (module, name)`` spied on, ``<train_module>.make_train`` and
    ``experiments.run_folder.run_method_folder`` stubbed.

    Returns:
      dict: ``problem_args`` (the constructor's args, kwargs), ``method``, ``config`` (as given
      to ``make_train``), ``out``, ``grid`` and the run folder's keywords.
    """
    seen = {}
    problems = importlib.import_module(problem[0])
    train = importlib.import_module(train_module)
    folder = importlib.import_module("experiments.run_folder")
    real = getattr(problems, problem[1])

    def spy(*args, **kw):
        seen["problem_args"] = (args, kw)
        return real(*args, **kw)

    def make_train(problem, method, config, *args, **kw):
        seen["method"], seen["config"] = method, config
        return "trainer"

    def run_method_folder(out, method, trainer, grid, a, **kw):
        seen.update(out=out, grid=grid, **kw)
        return {}

    monkeypatch.setattr(problems, problem[1], spy)
    monkeypatch.setattr(train, "make_train", make_train)
    monkeypatch.setattr(folder, "run_method_folder", run_method_folder)
    a = cli.parse_args(argv)
    getattr(cli, validate)(a)
    cli.run_method(method, a, str(tmp_path))
    return seen
