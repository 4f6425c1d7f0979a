"""`python -m paddle_dist.doctor`: what this machine offers and whether a job can run on it.
No module here imports paddle at module level (about a second to import): each function
that needs it imports it, and the self-test's checks, Paddle code, are outside
(paddle_dist/doctor/checks.py).

- facts: the report (versions, CPU, memory, GPUs, variables, interfaces, /dev/shm, proxies,
  exposure) and the command line; `--check` runs launch/preflight.py on a job's config;
- buildinfo: which Paddle this is, what it was built for, whether its CUDA libraries load;
- selftest (`--test`): a short real job and its PASS/FAIL table; selftest_plan: the checks
  by name and deadline; selftest_rank: what each rank of that job runs.

Example:
    python -m paddle_dist.doctor --test --nprocs 2
"""

__all__: list = []
