"""The parent: plan, meet, start, watch. Imports no paddle (about a second to import): a
launcher's start-up time depends on it; the ranks it starts import paddle themselves.

- jobspec: a job resolved once (JobSpec) and what each attempt's ranks run;
- job: the built-in job (`python -m paddle_dist.train`): check, choose the run, meet the
  other machines, start the ranks and restart them;
- __main__: `python -m paddle_dist.launch script.py`, any Paddle training script;
- launcher: `plan()` (pure: mode, argv, variables) and `launch()`, the one place that starts
  ranks; mpirun: mpirun's part of a plan;
- meeting, rendezvous: the machines' meeting before any rank starts; host: node 0's side;
  wire: the frames and what both sides share;
- preflight: the usual causes of a start that hangs, found first; proxies: httpx's rules;
- supervisor: watch the ranks (jobprocs: their processes; console: rank 0's output on this
  terminal); outcome: explain the end once;
- isolate: dist.isolate, a one-machine job in a network namespace of its own.

The face re-exports nothing: every import of a submodule loads this file first, and each
is imported on its own (isolate.py even runs as a plain script).

Example:
    from paddle_dist.launch import jobspec, launcher
    code = launcher.launch(launcher.plan(jobspec.resolve(cfg, script="my_train.py")))
"""

__all__: list = []
