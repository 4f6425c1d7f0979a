"""Installs tests/gpu_standin.py in every Python process started with this folder on
PYTHONPATH (gpu_standin.environ()), once paddle_dist's trainer/amp.py is imported: the
launcher plans mixed precision there, each rank builds its model with it. A process
that never imports it (a watchdog) never imports paddle for it."""

import importlib.abc
import importlib.util
import sys

WATCHED = "paddle_dist.trainer.amp"


class _InstallAfter(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != WATCHED:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        real = spec.loader

        class Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return real.create_module(spec)

            def exec_module(self, module):
                real.exec_module(module)
                from tests import gpu_standin
                gpu_standin.install()

        spec.loader = Loader()
        return spec


sys.meta_path.insert(0, _InstallAfter())
